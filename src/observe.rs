//! Reporting decisions without tying the core to a logging backend.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::outcome::OutcomeKind;
use crate::store::StoreError;

/// Which store call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// `seen` (or `seen_many`, or the re-check `peek_many`).
    Seen,
    /// A commit: `remember`, or a settle that remembers.
    Remember,
    /// `claim` or `claim_many`.
    Claim,
    /// Giving a claim back.
    Release,
    /// A checkpoint that only renewed claims.
    Renew,
    /// `forget`.
    Forget,
}

/// One thing the guard did or met.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A delivery's final outcome. `key` is its store key when it had a usable id.
    Outcome {
        /// The delivery's store key, when it had a usable id.
        key: Option<&'a str>,
        /// The outcome.
        kind: OutcomeKind,
    },
    /// A store call failed (the outcome event says what that meant).
    StoreError {
        /// Which call.
        op: StoreOp,
        /// What the store said.
        error: &'a StoreError,
    },
    /// A renewal found a running handler's claim gone: its outcome will be
    /// `run-ok-lease-lost` if it succeeds. Reported early for alerting.
    LeaseLost {
        /// The delivery's store key.
        key: Option<&'a str>,
    },
}

/// Receives every [`Event`]. Implemented for `()` (ignore), closures, and [`Counters`].
pub trait Observer {
    /// Called once per event, as it happens.
    fn observe(&self, event: Event<'_>);
}

impl Observer for () {
    fn observe(&self, _: Event<'_>) {}
}

impl<F: Fn(Event<'_>)> Observer for F {
    fn observe(&self, event: Event<'_>) {
        self(event)
    }
}

impl<O: Observer + ?Sized> Observer for std::sync::Arc<O> {
    fn observe(&self, event: Event<'_>) {
        (**self).observe(event)
    }
}

/// Lock-free decision counters, ready to export as metrics.
#[derive(Debug, Default)]
pub struct Counters {
    runs: AtomicU64,
    failures: AtomicU64,
    skips: AtomicU64,
    fail_open: AtomicU64,
    parked: AtomicU64,
    rejected: AtomicU64,
    store_unavailable: AtomicU64,
    store_errors: AtomicU64,
    remember_failed: AtomicU64,
    lease_lost: AtomicU64,
    payload_mismatch: AtomicU64,
}

/// A point-in-time copy of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CounterSnapshot {
    /// Handler runs that succeeded (recorded or not).
    pub runs: u64,
    /// Handler runs that failed or panicked (fail-open failures included).
    pub failures: u64,
    /// Deliveries skipped: already processed.
    pub skips: u64,
    /// Deliveries run without dedupe (no usable id), whatever the handler did.
    pub fail_open: u64,
    /// Deliveries parked: another consumer held the claim.
    pub parked: u64,
    /// Deliveries rejected: not a valid envelope.
    pub rejected: u64,
    /// Deliveries not run because the store could not answer.
    pub store_unavailable: u64,
    /// Failed store calls of any kind.
    pub store_errors: u64,
    /// Successful runs whose id could not be remembered.
    pub remember_failed: u64,
    /// Successful runs whose claim had been lost by their commit
    /// (`run-ok-lease-lost`): possible duplicate effects.
    pub lease_lost: u64,
    /// Deliveries not run because their id was processed with another payload
    /// (`payload-mismatch`, dead-lettered).
    pub payload_mismatch: u64,
}

impl Counters {
    /// All counters at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The counts so far.
    pub fn snapshot(&self) -> CounterSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterSnapshot {
            runs: get(&self.runs),
            failures: get(&self.failures),
            skips: get(&self.skips),
            fail_open: get(&self.fail_open),
            parked: get(&self.parked),
            rejected: get(&self.rejected),
            store_unavailable: get(&self.store_unavailable),
            store_errors: get(&self.store_errors),
            remember_failed: get(&self.remember_failed),
            lease_lost: get(&self.lease_lost),
            payload_mismatch: get(&self.payload_mismatch),
        }
    }
}

impl Observer for Counters {
    fn observe(&self, event: Event<'_>) {
        let bump = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        match event {
            Event::StoreError { .. } => bump(&self.store_errors),
            Event::LeaseLost { .. } => {}
            Event::Outcome { kind, .. } => match kind {
                OutcomeKind::Ran => bump(&self.runs),
                OutcomeKind::RanUnrecorded => {
                    bump(&self.runs);
                    bump(&self.remember_failed);
                }
                OutcomeKind::RanLeaseLost => {
                    bump(&self.runs);
                    bump(&self.lease_lost);
                }
                OutcomeKind::Failed | OutcomeKind::Panicked => bump(&self.failures),
                OutcomeKind::Skipped => bump(&self.skips),
                OutcomeKind::FailOpen => bump(&self.fail_open),
                OutcomeKind::FailOpenFailed => {
                    bump(&self.fail_open);
                    bump(&self.failures);
                }
                OutcomeKind::Parked => bump(&self.parked),
                OutcomeKind::Rejected => bump(&self.rejected),
                OutcomeKind::StoreUnavailable => bump(&self.store_unavailable),
                OutcomeKind::PayloadMismatch => bump(&self.payload_mismatch),
            },
        }
    }
}

/// Every outcome and store error as a [`tracing`] event (feature `tracing`), for
/// native hosts that already collect traces: outcomes that need a look
/// (`run-ok-lease-lost`, `run-ok-unrecorded`, `store-unavailable`,
/// `payload-mismatch`) at WARN, failures
/// and parks at INFO, the rest at DEBUG; store errors at WARN. Fields: `key`,
/// `outcome` (the kebab code), `op`, `error`.
#[cfg(feature = "tracing")]
#[derive(Debug, Default, Clone, Copy)]
pub struct Tracing;

#[cfg(feature = "tracing")]
impl Observer for Tracing {
    fn observe(&self, event: Event<'_>) {
        match event {
            Event::Outcome { key, kind } => {
                let key = key.unwrap_or("");
                let outcome = kind.code();
                match kind {
                    OutcomeKind::RanLeaseLost
                    | OutcomeKind::RanUnrecorded
                    | OutcomeKind::StoreUnavailable
                    | OutcomeKind::PayloadMismatch => {
                        tracing::warn!(key, outcome, "bq-dedupe outcome")
                    }
                    OutcomeKind::Failed
                    | OutcomeKind::Panicked
                    | OutcomeKind::FailOpenFailed
                    | OutcomeKind::Parked
                    | OutcomeKind::Rejected => tracing::info!(key, outcome, "bq-dedupe outcome"),
                    _ => tracing::debug!(key, outcome, "bq-dedupe outcome"),
                }
            }
            Event::StoreError { op, error } => {
                tracing::warn!(op = ?op, error = %error, "bq-dedupe store error")
            }
            Event::LeaseLost { key } => {
                tracing::warn!(
                    key = key.unwrap_or(""),
                    "bq-dedupe claim lost while its handler runs"
                )
            }
        }
    }
}
