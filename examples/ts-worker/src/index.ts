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
    // The key and reason as JSON: an id is the producer's text (a reason may
    // hold it, or your handler's error), and could forge a line.
    for (const m of report.messages.filter((m) => m.outcome !== "run-ok" && m.outcome !== "skip")) {
      console.log(`bq-dedupe ${m.outcome} -> ${m.action}: ${m.key === null ? "no dedupe key" : JSON.stringify(m.key)} (message ${m.id})${m.reason ? `: ${JSON.stringify(m.reason)}` : ""}`);
    }
  },

  // A producer to try it with: POST /publish with an envelope, or a JSON array
  // of them, puts them on the orders queue. Guard it (or drop it) before you
  // deploy: anyone who can reach the worker could publish.
  async fetch(request: Request, env: Env): Promise<Response> {
    if (request.method !== "POST" || new URL(request.url).pathname !== "/publish") {
      return new Response("POST /publish with an envelope, or a JSON array of them\n", { status: 404 });
    }
    const body: unknown = await request.json().catch(() => undefined);
    if (body === undefined) return new Response("the body is not JSON\n", { status: 400 });
    const envelopes = Array.isArray(body) ? body : [body];
    for (let i = 0; i < envelopes.length; i += 100) { // sendBatch takes up to 100
      await env.ORDERS.sendBatch(envelopes.slice(i, i + 100).map((envelope) => ({ body: envelope })));
    }
    return Response.json({ sent: envelopes.length });
  },
} satisfies ExportedHandler<Env>;
