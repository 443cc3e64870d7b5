//! Edge-native BabelQueue idempotency: dedupe at-least-once deliveries by the
//! envelope's `meta.id`, so a redelivery is skipped instead of run twice.
//!
//! The pieces, each in its own module:
//! - [`envelope`]: decode and validate the wire envelope (`schema_version` 1).
//! - [`KeySpace`]: the dedupe key (`meta.id` verbatim, optionally namespaced).
//! - [`Store`]: the seen-set (`seen` / `remember` / `forget` plus optional batch,
//!   TTL and claim extensions), and [`InMemoryStore`], the reference store.
//! - [`Guard`]: the decision sequence around a handler, for one delivery or a batch.
//! - [`lease`]: keeping a slow batch's claims alive and writing its progress.
//! - [`observe`]: counters and hooks for every decision.
//! - [`conformance`]: the BabelQueue conformance manifest runner.
//!
//! The policies (see the README for the reasoning):
//! - no usable id (absent, null, empty, non-string) -> the handler runs (fail-open);
//! - `seen` fails -> the handler does not run, the delivery is retried (fail-closed);
//! - `remember` fails after the handler succeeded -> the delivery is still acked and
//!   the failure is reported ([`Outcome::RanUnrecorded`]), because retrying it would
//!   certainly run the side effect a second time.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod clock;
pub mod conformance;
pub mod envelope;
pub mod fingerprint;
pub mod guard;
pub mod key;
pub mod lease;
pub mod observe;
pub mod outcome;
pub mod store;
#[cfg(feature = "telemetry")]
pub mod telemetry;

// The names most programs need; the rest live in their modules
// (`store::Claim`, `envelope::Limits`, `clock::ManualClock`, ...).
pub use envelope::Message;
pub use guard::{Decision, Guard, HandlerResult, Options, Processed};
pub use key::KeySpace;
pub use lease::LeasePolicy;
pub use observe::{Counters, Observer};
pub use outcome::{Disposition, Outcome, OutcomeKind};
pub use store::{InMemoryStore, Store, StoreError, StoreResult};

use std::future::Future;
use std::task::{Context, Poll, Waker};

/// The future was still pending after one poll: a store or handler that really
/// awaits was driven from a synchronous host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "an async store or handler did not complete synchronously; drive it with an async executor"
)]
pub struct NotReady;

/// Drives a future that completes without waiting, as every call does when the
/// store and handler are synchronous (a wasmtime import, SQLite, the in-memory
/// store). Sync hosts use this instead of an executor.
pub fn block_on_ready<F: Future>(future: F) -> Result<F::Output, NotReady> {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => Err(NotReady),
    }
}
