//! The dedupe guard: the spec's decision sequence around a handler, for one
//! delivery or a whole batch.
//!
//! The work is split in two so hosts that run the handler themselves (the WIT
//! guard world, a Workers consumer) share the exact logic of [`Guard::process`]:
//! [`Guard::decide_batch`] asks the store (one call), the host runs what it was told
//! to run, and [`Guard::complete_batch`] commits (one call) and resolves every
//! delivery's [`Outcome`].
//!
//! In between, [`Guard::process_batch`] keeps the batch's claims alive and writes
//! finished work as it goes (see [`crate::lease`]); commits in claiming mode are
//! fenced, so a lease lost while a handler ran is reported
//! ([`Outcome::RanLeaseLost`]) instead of read as a plain success.
//!
//! The rooms: this module has the types, the builders and the batch loop;
//! `decide` asks the store, `keep_alive` renews a slow batch's claims,
//! `commit` writes the results and judges each outcome, `catch` runs the
//! handler with its panics caught.

mod catch;
mod commit;
mod decide;
mod keep_alive;
mod span;
mod transaction;

use std::future::Future;
use std::ops::AsyncFnMut;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use foldhash::fast::RandomState;

use crate::clock::Clock;
use crate::envelope::{Body, Limits, Message, Rejection};
use crate::fingerprint::{self, Fingerprint};
use crate::key::KeySpace;
use crate::lease::{LeasePolicy, NoTimer, Progress, Timer};
use crate::observe::{Event, Observer, StoreOp};
use crate::outcome::{Outcome, OutcomeKind};
use crate::store::{
    Claim, ClaimToken, Peeked, Settled, Settlement, Store, StoreError, StoreResult,
};
use catch::{run_caught, run_if_told};
pub use span::DeliverySpan;

/// How the guard behaves. The defaults are the spec's: no TTL, no claiming, ids
/// verbatim, 1 MiB envelopes.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// How long a remembered id counts as seen (`None`: until forgotten).
    pub ttl: Option<Duration>,
    /// `Some(lease)` turns on claiming mode: an in-flight claim is taken before the
    /// handler runs, so concurrent duplicates park instead of running twice.
    pub claim_lease: Option<Duration>,
    /// Where ids live in the store.
    pub keyspace: KeySpace,
    /// Input limits for decoding.
    pub limits: Limits,
    /// When a slow batch renews its claims and writes its finished work.
    pub leases: LeasePolicy,
    /// Remember a fingerprint of each success's `data`, so a later delivery of
    /// the same id with another payload is a [`Outcome::PayloadMismatch`]
    /// (dead-lettered, not run) instead of a skip. Our record format only: a store
    /// that writes another SDK's records refuses it (see [`crate::fingerprint`]).
    pub fingerprint: bool,
}

/// How the guard dedupes (docs/modes.md), as a span reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Remember after the handler.
    SeenSet,
    /// Claim before the handler; commit fenced.
    Claiming,
    /// The id in the handler's own transaction.
    Transactional,
    /// The handler's statements and the id in one transaction.
    Statements,
}

impl Mode {
    /// The mode's code.
    pub fn code(self) -> &'static str {
        match self {
            Mode::SeenSet => "seen-set",
            Mode::Claiming => "claiming",
            Mode::Transactional => "transactional",
            Mode::Statements => "statements",
        }
    }
}

/// What the guard decided for one delivery, before its handler runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Run the handler, then report its result to [`Guard::complete_batch`].
    Run,
    /// No usable `meta.id`: run the handler; nothing will be recorded.
    FailOpen,
    /// Already processed: do not run; ack.
    Skip,
    /// Another consumer holds the claim: do not run; redeliver later.
    Park,
    /// Same key as the earlier delivery at this index of the batch: do not run;
    /// its outcome follows that delivery's (skip if it succeeded, else retry).
    Duplicate(usize),
    /// Not a valid envelope: do not run; dead-letter.
    Reject(Rejection),
    /// Already processed with a different `data` ([`Options::fingerprint`]), or
    /// another `data` than an earlier delivery of the batch: do not run;
    /// dead-letter (the latter only once that delivery is recorded; until then
    /// its outcome is that delivery's wait).
    PayloadMismatch,
    /// The store could not answer: do not run; retry (fail-closed).
    StoreUnavailable(StoreError),
}

/// A delivery's decision: the verdict plus what completing it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What to do with the delivery.
    pub verdict: Verdict,
    /// The store key (namespaced `meta.id`), when the message has a usable id.
    pub key: Option<String>,
    /// The claim taken for this delivery in claiming mode.
    pub claim: Option<ClaimToken>,
    /// The payload's fingerprint, with [`Options::fingerprint`] on.
    pub fingerprint: Option<Fingerprint>,
    /// A [`Verdict::Park`] behind another consumer's claim: how long that claim
    /// has left, where the store can tell (see [`crate::Store::peek_many`]), so
    /// the host can redeliver the message just after it ends.
    pub park_for: Option<Duration>,
    /// The delivery's span, from decode to outcome (feature `otel`, with
    /// [`Guard::with_telemetry`]; empty otherwise).
    pub span: DeliverySpan,
}

impl Decision {
    fn unkeyed(verdict: Verdict) -> Self {
        Decision {
            verdict,
            key: None,
            claim: None,
            fingerprint: None,
            park_for: None,
            span: DeliverySpan::default(),
        }
    }

    /// Should the host run the handler for this delivery?
    pub fn should_run(&self) -> bool {
        matches!(self.verdict, Verdict::Run | Verdict::FailOpen)
    }
}

/// What a handler did, as reported back to [`Guard::complete_batch`].
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerResult<E> {
    /// It succeeded.
    Ok,
    /// It returned this error.
    Err(E),
    /// It panicked with this message.
    Panicked(String),
}

impl<E> From<Result<(), E>> for HandlerResult<E> {
    fn from(r: Result<(), E>) -> Self {
        match r {
            Ok(()) => HandlerResult::Ok,
            Err(e) => HandlerResult::Err(e),
        }
    }
}

/// One delivery put through the guard: what was decided before its handler
/// ran, and how it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Processed<E> {
    /// The decision: the delivery's store key, its claim, how long to park it.
    pub decision: Decision,
    /// How it ended.
    pub outcome: Outcome<E>,
}

impl<E> Processed<E> {
    /// The delivery's store key (`None`: no usable id, or not a valid
    /// envelope); [`KeySpace::id_of`] turns it back into its `meta.id`.
    pub fn key(&self) -> Option<&str> {
        self.decision.key.as_deref()
    }

    /// Was it a duplicate: its handler did not run because its id was done
    /// (`skip`), or because an earlier delivery of its batch had it? What
    /// every target's span reports as `dedupe.duplicate`.
    pub fn duplicate(&self) -> bool {
        matches!(self.decision.verdict, Verdict::Duplicate(_))
            || self.outcome.kind() == crate::OutcomeKind::Skipped
    }

    /// Did it hold a claim on its key (claiming mode)? `dedupe.claimed`.
    pub fn claimed(&self) -> bool {
        self.decision.claim.is_some()
    }
}

/// Wraps a handler with seen-set dedupe over a [`Store`].
///
/// ```
/// use bq_dedupe::{block_on_ready, Guard, InMemoryStore, Outcome};
///
/// let guard = Guard::new(InMemoryStore::new());
/// let body = br#"{"job":"urn:babel:orders:created","trace_id":"t-1","data":{},
///                 "meta":{"id":"id-1","schema_version":1},"attempts":0}"#;
/// let mut effects = 0;
/// for _ in 0..2 {
///     let _ = block_on_ready(guard.process(body, async |_msg| {
///         effects += 1;
///         Ok::<(), String>(())
///     }));
/// }
/// assert_eq!(effects, 1);
/// ```
pub struct Guard<S, O = (), T = NoTimer> {
    store: S,
    options: Options,
    observer: O,
    /// Time for leases and checkpoints (the system clock natively; none on
    /// `wasm32-unknown-unknown` unless the host gives one).
    clock: Option<Arc<dyn Clock>>,
    timer: T,
    #[cfg(feature = "otel")]
    telemetry: Option<Arc<crate::telemetry::otel::Telemetry>>,
}

impl<S, O, T> std::fmt::Debug for Guard<S, O, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("options", &self.options)
            .field("clock", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store> Guard<S, ()> {
    /// A guard with the default [`Options`] and no observer.
    pub fn new(store: S) -> Self {
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        let clock: Option<Arc<dyn Clock>> = Some(Arc::new(crate::clock::SteadyClock::new()));
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        let clock: Option<Arc<dyn Clock>> = None;
        Guard {
            store,
            options: Options::default(),
            observer: (),
            clock,
            timer: NoTimer,
            #[cfg(feature = "otel")]
            telemetry: None,
        }
    }
}

impl<S: Store, O: Observer, T: Timer> Guard<S, O, T> {
    /// Remembered ids expire after `ttl`.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// Claiming mode with the given lease (see [`Options::claim_lease`]).
    pub fn with_claiming(mut self, lease: Duration) -> Self {
        self.options.claim_lease = Some(lease);
        self
    }

    /// Payload fingerprints (see [`Options::fingerprint`]).
    pub fn with_fingerprint(mut self) -> Self {
        self.options.fingerprint = true;
        self
    }

    /// Where ids live in the store (see [`Options::keyspace`]).
    pub fn with_keyspace(mut self, keyspace: KeySpace) -> Self {
        self.options.keyspace = keyspace;
        self
    }

    /// Every option at once.
    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// Reports every decision and store error to `observer`.
    pub fn with_observer<O2: Observer>(self, observer: O2) -> Guard<S, O2, T> {
        Guard {
            store: self.store,
            options: self.options,
            observer,
            clock: self.clock,
            timer: self.timer,
            #[cfg(feature = "otel")]
            telemetry: self.telemetry,
        }
    }

    /// Reads time (lease renewals, checkpoints) from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Races every handler against `timer`, so claims are renewed (and finished
    /// work written) while one long handler runs, not only between handlers.
    pub fn with_timer<T2: Timer>(self, timer: T2) -> Guard<S, O, T2> {
        Guard {
            store: self.store,
            options: self.options,
            observer: self.observer,
            clock: self.clock,
            timer,
            #[cfg(feature = "otel")]
            telemetry: self.telemetry,
        }
    }

    /// Traces every delivery (a CONSUMER span `process <job>` by BabelQueue's
    /// convention, with the dedupe outcome on it and each store call as a
    /// child) and counts them (feature `otel`; see `docs/observability.md`).
    #[cfg(feature = "otel")]
    pub fn with_telemetry(
        mut self,
        telemetry: impl Into<Arc<crate::telemetry::otel::Telemetry>>,
    ) -> Self {
        self.telemetry = Some(telemetry.into());
        self
    }

    /// The store the guard dedupes against.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The guard's options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The observer events go to.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// Forgets `id` (a `meta.id`, namespaced like every other key) so its next
    /// delivery runs again.
    pub async fn forget(&self, id: &str) -> StoreResult<()> {
        let key = self.options.keyspace.key(id);
        let mut result = self.store.forget(&key).await;
        if result.is_ok() && self.options.fingerprint {
            // Its next success records a fingerprint afresh.
            result = self.store.forget(&fingerprint::marker_key(&key)).await;
        }
        self.report_store_error(StoreOp::Forget, &result);
        result
    }

    /// Puts one delivery through the guard: decode, decide, run `handler` if
    /// needed, record the result. The steps of a batch of one, minus the batch's
    /// bookkeeping.
    pub async fn process<B: Body + ?Sized, E>(
        &self,
        body: &B,
        mut handler: impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    ) -> Outcome<E> {
        if self.options.claim_lease.is_some() && self.timer.available() {
            // A claim to keep alive while the handler runs: the batch path does it.
            let mut outcomes = self.process_batch(&[body], handler).await;
            return outcomes.pop().unwrap_or(Outcome::Parked);
        }
        let claims_end = self.unrenewed_claims_end();
        let (message, decision) = self.decide_one(body).await;
        let result = run_if_told(&mut handler, message.as_ref(), &decision).await;
        self.complete(decision, result, claims_end).await
    }

    /// Puts a batch through the guard with one store call to decide and one to
    /// record, running `handler` in order for each delivery that should run.
    /// Deliveries sharing a key run at most once (see [`Verdict::Duplicate`]).
    /// [`Guard::process_each`] with only the outcomes.
    ///
    /// A slow batch makes more calls: before each handler (and on the timer's
    /// ticks, see [`Guard::with_timer`]) a due checkpoint remembers the successes
    /// so far and renews the claims still held ([`crate::lease`]).
    pub async fn process_batch<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    ) -> Vec<Outcome<E>> {
        self.run_batch(bodies, async |_, msg| handler(msg).await)
            .await
            .1
    }

    /// [`Guard::process_batch`] for a host that needs more than the outcomes:
    /// `handler` also gets the delivery's index in `bodies` (for transport data
    /// beside the body: a queue's attempt count, a message handle), and each
    /// delivery comes back [`Processed`], with its [`Decision`] (its key, how
    /// long to park it). Same store calls, same handler calls, same outcomes.
    pub async fn process_each<B: Body, E>(
        &self,
        bodies: &[B],
        handler: impl AsyncFnMut(usize, &Message<'_>) -> Result<(), E>,
    ) -> Vec<Processed<E>> {
        let (decisions, outcomes) = self.run_batch(bodies, handler).await;
        decisions
            .into_iter()
            .zip(outcomes)
            .map(|(decision, outcome)| Processed { decision, outcome })
            .collect()
    }

    async fn run_batch<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl AsyncFnMut(usize, &Message<'_>) -> Result<(), E>,
    ) -> (Vec<Decision>, Vec<Outcome<E>>) {
        let claims_end = self.unrenewed_claims_end();
        // The renewal clock starts only where there are claims to keep alive,
        // when the claim call is sent: the store's lease runs from about then,
        // not from its answer (a slow answer made renewals late, and a handler
        // start on a claim that had run out: a trial).
        let started = self.renewing().and_then(|_| self.now());
        let (messages, mut decisions) = self.plan(bodies).await;
        let mut progress = Progress::new(decisions.len(), started);
        progress.claims_end = claims_end;
        for (i, message) in messages.iter().enumerate() {
            let Some(message) = message.as_ref().filter(|_| decisions[i].should_run()) else {
                continue;
            };
            if progress.due(&self.options.leases, self.renewing(), || self.now()) {
                self.checkpoint(&decisions, &mut progress, i, false).await;
            }
            // A claim that ran out before its handler started may be another
            // consumer's now, and the store cannot tell: it ran beside it.
            if decisions[i].claim.is_some() && self.ran_out(claims_end) {
                progress.lost[i] = true;
            }
            if progress.lost[i] {
                // Its claim went (expired and taken, or forgotten) before it ran.
                decisions[i].verdict = Verdict::Park;
                decisions[i].claim = None;
                continue;
            }
            let mut at_i = async |msg: &Message<'_>| handler(i, msg).await;
            let result = self
                .run_kept_alive(&mut at_i, message, &decisions, &mut progress, i)
                .await;
            if matches!(result, HandlerResult::Ok) && decisions[i].verdict == Verdict::Run {
                progress.waiting.push(i);
                progress
                    .waiting_since
                    .get_or_insert_with(|| self.now().unwrap_or(0));
            }
            progress.results[i] = Some(result);
        }
        let outcomes = self.finish(&decisions, progress).await;
        (decisions, outcomes)
    }

    fn now(&self) -> Option<u64> {
        self.clock.as_ref().map(|c| c.now_ms())
    }

    /// Where claims cannot be renewed: when, by our own clock, the claims a
    /// batch asks for now end (a lease from now).
    #[inline(never)] // one copy, not one per handler type (the wasm budgets)
    fn unrenewed_claims_end(&self) -> Option<u64> {
        let unrenewed = self
            .options
            .claim_lease
            .filter(|_| self.renewing().is_none());
        // (None past u64: a clock pinned at its end would park every claim.)
        let lease = unrenewed?;
        self.now()?.checked_add(lease.as_millis() as u64)
    }

    /// Whether `claims_end` has passed.
    #[inline(never)]
    fn ran_out(&self, claims_end: Option<u64>) -> bool {
        claims_end.is_some_and(|end| self.now().is_some_and(|now| now >= end))
    }

    /// Whether the successes of claimed deliveries just written were written
    /// in time, read after the write: past `claims_end` the id may have been
    /// another consumer's, which may have run it too, and a store that cannot
    /// renew cannot fence the write by owner (`run-ok-lease-lost`, not `run-ok`).
    pub(super) fn written_in_time(
        &self,
        claims_end: Option<u64>,
    ) -> impl Fn(&Decision, bool) -> bool {
        let late = self.ran_out(claims_end);
        move |decision, kept| kept && !(late && decision.claim.is_some())
    }

    /// The lease to keep claims alive for: claiming mode on a store that renews.
    fn renewing(&self) -> Option<Duration> {
        self.options
            .claim_lease
            .filter(|_| self.store.capabilities().renew)
    }

    fn observe_outcome<E>(&self, decision: &Decision, outcome: &Outcome<E>) {
        self.observer.observe(Event::Outcome {
            key: decision.key.as_deref(),
            kind: outcome.kind(),
        });
        self.end_span(decision, outcome);
    }

    fn report_store_error<R>(&self, op: StoreOp, result: &StoreResult<R>) {
        if let Err(error) = result {
            self.observer.observe(Event::StoreError { op, error });
        }
    }
}

/// The store key of a keyed decision (only keyed decisions reach the store).
pub(super) fn key_at(decisions: &[Decision], i: usize) -> &str {
    decisions[i].key.as_deref().unwrap_or_default()
}

/// A store that answers a batch call with the wrong number of answers is broken;
/// treat it as an error rather than guess.
pub(super) fn checked_len<T>(answers: StoreResult<Vec<T>>, expected: usize) -> StoreResult<Vec<T>> {
    match answers {
        Ok(a) if a.len() != expected => Err(StoreError::internal(format!(
            "store answered {} of {expected} keys",
            a.len()
        ))),
        other => other,
    }
}
