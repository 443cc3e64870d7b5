// Serves the fixture worker on workerd for another process: prints
// `BQ_TEST_WORKER_URL=http://127.0.0.1:PORT` once it answers, then runs until
// stdin closes or it is signalled. Used by scripts/with-worker.sh (the store
// testkit's runs). Not a test itself (no `.test.mjs`). `BQ_SERVE_VARS`: a JSON
// object of vars laid over wrangler.toml's (`{"DEDUPE_STORE":"d1"}` serves the
// store routes on D1).
import { startWorker } from "./harness.mjs";

const vars = JSON.parse(process.env.BQ_SERVE_VARS || "{}");
const worker = await startWorker({ port: 0, vars });
process.stdout.write(`BQ_TEST_WORKER_URL=${String(worker.url).replace(/\/$/, "")}\n`);

let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  await worker.dispose();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
process.stdin.on("end", stop);
process.stdin.resume();
