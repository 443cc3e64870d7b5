//! Cloudflare Workers adapter for bq-dedupe: a Queues consumer that skips
//! redeliveries and duplicate publishes by the envelope's `meta.id`.
//!
//! A thin layer over the core ([`bq_dedupe::Guard`]); each module is one binding:
//! - [`QueueConsumer`]: decode a batch, decide it with one store call, run the
//!   handler, commit with one store call, then `ack()` / `retry()` / dead-letter each
//!   message by its outcome. While a slow batch runs, its claims are renewed
//!   (before each handler, and on a `setTimeout` tick during one long handler),
//!   and a success whose claim was lost anyway is `run-ok-lease-lost` (acked).
//! - [`shard`]: which object holds an id (jump consistent hashing, pinned), so
//!   `DEDUPE_SHARDS` can grow with `DEDUPE_PREVIOUS_SHARDS` set during the change
//!   (see [`config`] for the procedure).
//! - [`durable`]: the strongly consistent store: the [`durable::DedupeShard`]
//!   Durable Object (SQLite-backed, atomic claims, batch RPC, TTL sweep alarm) and
//!   [`durable::DurableObjectStore`], the client that shards ids over N objects.
//! - [`kv`]: the best-effort Workers KV store (eventually consistent, no claims).
//! - [`d1`]: a D1 database (the SQLite store's table, atomic claims), and the
//!   transactional mode: the handler's D1 statements committed with the id in one
//!   `batch()` ([`QueueConsumer::consume_with_statements`]).
//! - [`config`]: everything above, configured from `wrangler.toml` vars (the
//!   default dedupe window is 14 days + 12 hours, every redelivery Cloudflare can
//!   make; `DEDUPE_TTL_SECONDS=forever` keeps ids until forgotten).
//!
//! Cloudflare counts deliveries from 1 (`Message.attempts`); a BabelQueue envelope
//! counts failed attempts from 0. The handler sees
//! `envelope.attempts + (queue attempts - 1)` as [`Delivery::attempts`].
//!
//! A consumer (the quick start of `docs/workers.md`; `examples/user-worker` is
//! the complete worker, built and run on workerd by `make workers-test`):
//!
//! ```no_run
//! use bq_dedupe_workers::bq_dedupe::OutcomeKind;
//! use bq_dedupe_workers::{Delivery, QueueBatch, QueueConsumer};
//! use worker::{Context, Env, Result};
//!
//! // The Durable Object class that wrangler.toml binds as the dedupe store.
//! pub use bq_dedupe_workers::durable::DedupeShard;
//!
//! bq_dedupe_workers::queue_consumer!(consume);
//!
//! async fn consume(batch: QueueBatch, env: Env, _ctx: Context) -> Result<()> {
//!     let consumer = QueueConsumer::from_env(&env)?; // DEDUPE_* vars
//!     let report = consumer
//!         .consume(&batch, async |delivery| charge(&env, delivery).await)
//!         .await?; // Err: the batch could not be read or a retry not recorded
//!     worker::console_log!(
//!         "{} ran, {} skipped ({} duplicate publishes, {} redeliveries)",
//!         report.count(OutcomeKind::Ran),
//!         report.count(OutcomeKind::Skipped),
//!         report.duplicate_publishes(),
//!         report.redeliveries(),
//!     );
//!     Ok(())
//! }
//!
//! async fn charge(env: &Env, delivery: &Delivery<'_, '_>) -> std::result::Result<(), String> {
//!     let order = delivery.message().envelope().map_err(|e| e.to_string())?;
//!     let _ = (env, order.data, delivery.attempts());
//!     Ok(())
//! }
//! ```
//!
//! Producers: [`send_envelope`] / [`send_envelopes`] send any `Serialize` as a
//! plain JSON object (workers-rs `Queue::send` turns a `serde_json::Value` into a
//! JS `Map`, which the `json` content type stores as `{}`).

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod batch;
mod body;
pub mod config;
mod consumer;
pub mod d1;
mod dead_letter;
pub mod durable;
pub mod kv;
mod producer;
mod round_trips;
pub mod shard;
mod spans;
mod store;
mod time;

pub use batch::{HandlerMessage, QueueBatch, QueueMessage};
pub use config::{ConfigError, DedupeConfig, StoreKind};
pub use consumer::{Action, BatchReport, ConsumeError, Delivery, MessageReport, QueueConsumer};
pub use producer::{send_envelope, send_envelopes};
pub use round_trips::{RoundTrips, Rows};
pub use store::WorkersStore;
pub use time::{JsClock, WorkersTimer};

/// Re-exported so a worker needs no direct dependency on the core.
pub use bq_dedupe;

/// What [`queue_consumer!`] expands to names only these paths, so a worker needs no
/// direct dependency on `js-sys`, `wasm-bindgen` or `wasm-bindgen-futures` (and
/// the versions always match the adapter's). Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use ::js_sys;
    pub use ::wasm_bindgen;
    pub use ::worker;
    pub use ::worker::wasm_bindgen_futures;
}

/// Exports `queue` (the Queues consumer entry point) calling
/// `async fn $handler(QueueBatch, worker::Env, worker::Context) -> worker::Result<()>`.
///
/// Use it instead of `#[event(queue)]`: worker 0.8.7's `MessageBatch` does not expose
/// `Message.attempts`, which [`QueueBatch`] reads. An `Err` from the handler throws,
/// so Cloudflare retries every message not yet acked. The expansion names its
/// dependencies through this crate (`js_sys` too, which the `wasm_bindgen` export
/// of an `async fn` needs under worker-build's `WASM_BINDGEN_USE_JS_SYS`), so it
/// builds in a worker that depends only on this crate and `worker`.
#[macro_export]
#[rustfmt::skip] // rustfmt re-indents the attribute on every run
macro_rules! queue_consumer {
    ($handler:path) => {
        #[$crate::__private::wasm_bindgen::prelude::wasm_bindgen(
            js_name = queue,
            wasm_bindgen = $crate::__private::wasm_bindgen,
            wasm_bindgen_futures = $crate::__private::wasm_bindgen_futures,
            js_sys = $crate::__private::js_sys
        )]
        pub async fn __bq_dedupe_queue(
            batch: $crate::__private::worker::worker_sys::MessageBatch,
            env: $crate::__private::worker::Env,
            ctx: $crate::__private::worker::worker_sys::Context,
        ) -> ::std::result::Result<
            $crate::__private::wasm_bindgen::JsValue,
            $crate::__private::wasm_bindgen::JsValue,
        > {
            // Unwind safe for `worker-build --panic-unwind`, whose entry points
            // catch a panic (the handler's own are caught by the guard).
            match ::std::panic::AssertUnwindSafe($handler(
                $crate::QueueBatch::from(batch),
                env,
                $crate::__private::worker::Context::new(ctx),
            ))
            .await
            {
                Ok(()) => Ok($crate::__private::wasm_bindgen::JsValue::UNDEFINED),
                Err(e) => {
                    $crate::__private::worker::console_error!(
                        "bq-dedupe queue consumer failed: {}",
                        e
                    );
                    Err($crate::__private::wasm_bindgen::JsValue::from(e.to_string()))
                }
            }
        }
    };
}
