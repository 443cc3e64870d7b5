//! Keeping claims alive while a batch runs, and recording its progress as it goes.
//!
//! A batch takes its claims before its first handler and commits after its last.
//! Between the two the guard keeps a [`Progress`]: which successes are still
//! waiting to be remembered and when the claims were last renewed. Before each
//! handler (and, with a host [`Timer`], while one long handler runs) it asks
//! [`Progress::due`] whether a *checkpoint* is due: one [`crate::Store::settle`]
//! call that remembers the waiting successes (fenced) and renews every claim still
//! held. A fast batch never reaches one, so it keeps its two store calls.
//!
//! The redo bound after a crash follows: a success waits at most
//! [`LeasePolicy::checkpoint_after`] (measured when the next handler starts or the
//! timer ticks) and at most [`LeasePolicy::checkpoint_every`] successes wait at a
//! time, so a consumer killed mid-batch re-runs at most those.

use std::time::Duration;

use crate::guard::HandlerResult;

/// When claims are renewed and finished work is written, in a batch that is
/// slower than "at once". The defaults suit leases of seconds to minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Renew the held claims once this much time has passed since they were
    /// taken or last renewed. `None`: a third of the lease, so two renewals can
    /// be missed before a claim runs out.
    pub renew_after: Option<Duration>,
    /// Remember a success at the latest this long after it finished (checked
    /// before the next handler, and on the timer's ticks). Default 1 s.
    pub checkpoint_after: Duration,
    /// Remember the waiting successes once this many are waiting. Default 100
    /// (a Workers batch at most), so a fast batch is written once, at its end.
    pub checkpoint_every: usize,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            renew_after: None,
            checkpoint_after: Duration::from_secs(1),
            checkpoint_every: 100,
        }
    }
}

impl LeasePolicy {
    /// How long after a claim's last renewal it is renewed again.
    pub fn renew_interval(&self, lease: Duration) -> Duration {
        self.renew_after
            .unwrap_or(lease / 3)
            .max(Duration::from_millis(1))
    }
}

/// A host's timer: lets the guard renew claims while one long handler runs
/// (the handler is raced against [`Timer::sleep`]). Hosts without one (a
/// synchronous wasmtime guest) renew only between handlers, or from a thread.
#[allow(async_fn_in_trait)] // Workers' timers are !Send.
pub trait Timer {
    /// Completes after `duration`.
    async fn sleep(&self, duration: Duration);

    /// Whether [`Timer::sleep`] really waits (`false` for [`NoTimer`]).
    fn available(&self) -> bool {
        true
    }
}

/// No timer: handlers are not raced; claims are renewed between handlers only.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTimer;

impl Timer for NoTimer {
    async fn sleep(&self, _: Duration) {
        std::future::pending::<()>().await
    }
    fn available(&self) -> bool {
        false
    }
}

/// A batch in progress, between its decisions and its commit.
pub(crate) struct Progress<E> {
    /// `results[i]`: what delivery `i`'s handler did, once it ran.
    pub results: Vec<Option<HandlerResult<E>>>,
    /// `written[i]`: `Some(kept)` once delivery `i`'s success was remembered at a
    /// checkpoint (`kept` false: its claim had been lost).
    pub written: Vec<Option<bool>>,
    /// `lost[i]`: delivery `i`'s claim was found lost at a renewal: before its
    /// handler ran, so it must not run; or while it ran, so it is not renewed
    /// again (its commit, fenced, says `run-ok-lease-lost`).
    pub lost: Vec<bool>,
    /// Successes waiting to be remembered, in order.
    pub waiting: Vec<usize>,
    /// When the first waiting success finished (ms), if any is waiting.
    pub waiting_since: Option<u64>,
    /// When the claims were taken or last renewed (ms).
    pub renewed_at: Option<u64>,
    /// Where claims cannot be renewed: when they end by the guard's clock (ms).
    pub claims_end: Option<u64>,
}

impl<E> Progress<E> {
    pub(crate) fn new(n: usize, started_at: Option<u64>) -> Self {
        let mut results = Vec::with_capacity(n);
        results.resize_with(n, || None);
        Progress {
            results,
            written: vec![None; n],
            lost: vec![false; n],
            waiting: Vec::new(),
            waiting_since: None,
            renewed_at: started_at,
            claims_end: None,
        }
    }

    /// Is a checkpoint due at `now()` (ms, if the guard has a clock)?
    /// `renewing`: there are claims to keep alive. The clock is read only when
    /// time can make a checkpoint due: some success is waiting, or claims are
    /// being kept alive (so a batch with nothing to write reads no clock).
    pub(crate) fn due(
        &self,
        policy: &LeasePolicy,
        lease: Option<Duration>,
        now: impl FnOnce() -> Option<u64>,
    ) -> bool {
        if self.waiting.len() >= policy.checkpoint_every.max(1) {
            return true;
        }
        if self.waiting_since.is_none() && (lease.is_none() || self.renewed_at.is_none()) {
            return false;
        }
        let Some(now) = now() else { return false };
        let since = |at: Option<u64>| at.map(|t| Duration::from_millis(now.saturating_sub(t)));
        let write_due = since(self.waiting_since).is_some_and(|d| d >= policy.checkpoint_after);
        let renew_due = lease.is_some_and(|lease| {
            since(self.renewed_at).is_some_and(|d| d >= policy.renew_interval(lease))
        });
        write_due || renew_due
    }

    /// Has a whole `lease` passed by `now` since the claims were last taken or
    /// renewed? Without a clock (or claims) nothing can be told: `false`.
    pub(crate) fn lease_passed(&self, lease: Option<Duration>, now: Option<u64>) -> bool {
        match (lease, self.renewed_at, now) {
            (Some(lease), Some(since), Some(now)) => {
                Duration::from_millis(now.saturating_sub(since)) >= lease
            }
            _ => false,
        }
    }

    /// The interval the timer ticks at while a handler runs.
    pub(crate) fn tick(policy: &LeasePolicy, lease: Option<Duration>) -> Duration {
        let renew = lease.map_or(Duration::MAX, |l| policy.renew_interval(l));
        renew
            .min(policy.checkpoint_after)
            .max(Duration::from_millis(1))
    }
}
