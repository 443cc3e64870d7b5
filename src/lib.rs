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
mod guard;
mod key;
pub mod lease;
pub mod observe;
mod outcome;
pub mod store;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use clock::{Clock, ManualClock};
pub use envelope::{Body, Envelope, Limits, Message, Rejection};
pub use guard::{Decision, Guard, HandlerResult, Options, Processed, Verdict};
pub use key::{InvalidScope, KeySpace};
pub use lease::{LeasePolicy, NoTimer, Timer};
pub use observe::{CounterSnapshot, Counters, Event, Observer};
pub use outcome::{Disposition, Outcome, OutcomeKind};
pub use store::{
    Capabilities, Claim, ClaimToken, InMemoryStore, Peeked, Settled, Settlement, Store, StoreError,
    StoreErrorKind, StoreResult,
};

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub use clock::SystemClock;

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
