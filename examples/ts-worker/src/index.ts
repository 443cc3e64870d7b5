// The worker: Queues batches in, deduped by meta.id, each message acked, retried
// or dead-lettered by dedupeQueue. Your code is src/handler.ts.
import { DedupeShard, dedupeQueue } from "@babelqueue/dedupe/workers";
import { handle, type Env } from "./handler";

// The Durable Object class the DEDUPE_DO binding names (wrangler.toml).
export { DedupeShard };

export default {
  async queue(batch: MessageBatch, env: Env): Promise<void> {
    const report = await dedupeQueue(batch, env, (envelope, message) => handle(envelope, message, env));
    // Anything but a run or a skip is worth a line: a retry, a park, a dead
    // letter, a delivery without a usable meta.id (fail-open: not deduped).
    if (Object.keys(report.outcomes).some((outcome) => outcome !== "run-ok" && outcome !== "skip")) {
      console.log("bq-dedupe", JSON.stringify(report.outcomes));
    }
  },
} satisfies ExportedHandler<Env>;
