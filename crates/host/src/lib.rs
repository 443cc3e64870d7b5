//! The reference wasmtime host of the dedupe component: the runtime (loading and
//! calling the component), the store behind its `store` import, and the handlers
//! behind its `handler` import. The `bq-dedupe` binary (`main.rs`) is the CLI on top.

pub mod handler;
mod host_store;
pub mod keep_alive;
pub mod runtime;
pub mod wit;

/// The embedded default store when `--store` is absent.
pub const DEFAULT_STORE: &str = "sqlite:.bq-dedupe/seen.db";
