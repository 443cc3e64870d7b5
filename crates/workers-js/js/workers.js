// @babelqueue/dedupe/workers: the package for Cloudflare Workers (workerd).
// wrangler's bundler imports a `.wasm` file as a WebAssembly.Module; the module
// is instantiated here, once, when the worker's code loads, so nothing needs an
// init step and a store may be created at module scope.
import wasm from "./bq_dedupe_workers_bg.wasm";
import { initSync } from "./bq_dedupe_workers.js";

initSync({ module: wasm });

export {
  DedupeShard,
  dedupeQueue,
  dedupeQueueD1,
  DurableObjectStore,
  KvStore,
  dedupe,
  dedupeBatch,
  dedupeKey,
  forget,
  validate,
  wrap,
  InMemoryStore,
} from "./bq_dedupe_workers.js";
