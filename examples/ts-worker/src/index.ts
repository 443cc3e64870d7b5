// The worker: Queues batches in, deduped by meta.id, each message acked, retried
// or dead-lettered by dedupeQueue. Your code is src/handler.ts.
import { DedupeShard, dedupeQueue } from "@babelqueue/dedupe/workers";
import { handle, type Env } from "./handler";

// The Durable Object class the DEDUPE_DO binding names (wrangler.toml).
export { DedupeShard };

export default {
  async queue(batch: MessageBatch, env: Env): Promise<void> {
    const report = await dedupeQueue(batch, env, (envelope, message) => handle(envelope, message, env));
    if (report.actions.retry > 0 || report.actions["dead-letter"] > 0) {
      console.log("bq-dedupe", JSON.stringify(report.outcomes));
    }
  },
} satisfies ExportedHandler<Env>;
