// `@babelqueue/dedupe` in a Cloudflare worker (the "workerd" condition): the web
// build, instantiated here from the module wrangler's bundler imports, so no
// init step is needed and a store may be created at module scope. (The Rust
// DedupeShard and Queues consumer are in `@babelqueue/dedupe/workers`.)
import wasm from "./pkg/web/bq_dedupe_bg.wasm";
import { initSync } from "./pkg/web/bq_dedupe.js";

initSync({ module: wasm });

export * from "./pkg/web/bq_dedupe.js";
