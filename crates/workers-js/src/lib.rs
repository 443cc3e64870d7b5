//! `@babelqueue/dedupe/workers`: what a TypeScript (or JavaScript) Cloudflare
//! worker imports. One wasm module with
//! - `DedupeShard`: the Rust adapter's Durable Object (the same table, requests
//!   and rules as a Rust worker's, so both dedupe together on one namespace);
//! - `dedupeQueue(batch, env, handler, options?)`: the Rust adapter's Queues
//!   consumer (`bq_dedupe_workers::QueueConsumer`), configured by the same
//!   `DEDUPE_*` vars, calling a JS handler;
//! - `DurableObjectStore` and `KvStore`: the adapter's stores as JS store
//!   objects, for `dedupe` / `dedupeBatch` / `wrap`;
//! - the package's API (`dedupe`, `dedupeBatch`, `InMemoryStore`, ...), linked
//!   from `babelqueue-dedupe-js`.
//!
//! No decision is made here: this crate only converts between JS values and the
//! adapter's types. `js/workers.js` (the package's glue) instantiates the
//! module, which wrangler's bundler imports as a `WebAssembly.Module`.

mod keyed;
mod queue;
mod stores;

/// Links the package's API into this module (its `#[wasm_bindgen]` exports).
pub use bq_dedupe_js as package;
pub use bq_dedupe_workers::durable::DedupeShard;
pub use queue::dedupe_queue;
pub use stores::{DurableObjectStore, KvStore};
