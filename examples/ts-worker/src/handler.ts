// Your handler: runs once per meta.id (a redelivery or a duplicate publish is
// skipped). Throw to fail the delivery: it is retried and its id stays unmarked.
// Await (or return) all of its work: work still running when it returns is
// cancelled once the batch ends, while its id is recorded done.
import type { BabelQueueEnvelope } from "@babelqueue/dedupe/workers";

export interface Env {
  DEDUPE_DO: DurableObjectNamespace;
  DEAD_LETTERS: Queue;
  ORDERS: Queue; // the queue src/index.ts's /publish sends to
}

export async function handle(envelope: BabelQueueEnvelope, message: Message, env: Env): Promise<void> {
  console.log(`${JSON.stringify(envelope.job)} ${JSON.stringify(envelope.meta.id)} (attempt ${message.attempts})`, JSON.stringify(envelope.data));
  void env;
}
