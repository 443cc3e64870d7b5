// The test's src/handler.ts for examples/ts-worker
// (crates/workers/tests/ts-worker.test.mjs): every effect is a KV row (EFFECTS)
// the test counts; `data` may tell it to fail its first attempts or to sleep.
import type { BabelQueueEnvelope } from "@babelqueue/dedupe/workers";

export interface Env {
  DEDUPE_DO: DurableObjectNamespace;
  DEAD_LETTERS: Queue;
  ORDERS: Queue;
  EFFECTS: KVNamespace;
}

interface Directives {
  fail_attempts?: number;
  sleep_ms?: number;
  /** Call the message's own `ack()` or `retry()`, then go on (the consumer's to call: refused). */
  settle?: "ack" | "retry";
}

export async function handle(envelope: BabelQueueEnvelope, message: Message, env: Env): Promise<void> {
  const directives = envelope.data as Directives;
  if (directives.sleep_ms) await new Promise((resolve) => setTimeout(resolve, directives.sleep_ms));
  if (directives.settle === "ack") message.ack();
  if (directives.settle === "retry") message.retry();
  if (message.attempts <= (directives.fail_attempts ?? 0)) {
    throw new Error(`told to fail (attempt ${message.attempts})`);
  }
  await env.EFFECTS.put(`effect:${envelope.meta.id}:${message.id}:${message.attempts}`, "1");
  await env.EFFECTS.put(`job:${envelope.meta.id}`, envelope.job);
}
