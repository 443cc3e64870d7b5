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
use crate::store::{Claim, ClaimToken, Settled, Settlement, Store, StoreError, StoreResult};

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
    /// Already processed with a different `data` ([`Options::fingerprint`]): do
    /// not run; dead-letter.
    PayloadMismatch,
    /// The store could not answer: do not run; retry (fail-closed).
    StoreUnavailable(StoreError),
}

/// A delivery's decision: the verdict plus what completing it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The store key (namespaced `meta.id`), when the message has a usable id.
    pub key: Option<String>,
    /// The claim taken for this delivery in claiming mode.
    pub claim: Option<ClaimToken>,
    /// The payload's fingerprint, with [`Options::fingerprint`] on.
    pub fingerprint: Option<Fingerprint>,
}

impl Decision {
    fn unkeyed(verdict: Verdict) -> Self {
        Decision {
            verdict,
            key: None,
            claim: None,
            fingerprint: None,
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
    Ok,
    Err(E),
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
}

impl<S: Store> Guard<S, ()> {
    /// A guard with the default [`Options`] and no observer.
    pub fn new(store: S) -> Self {
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        let clock: Option<Arc<dyn Clock>> = Some(Arc::new(crate::clock::SystemClock));
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        let clock: Option<Arc<dyn Clock>> = None;
        Guard {
            store,
            options: Options::default(),
            observer: (),
            clock,
            timer: NoTimer,
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

    pub fn with_keyspace(mut self, keyspace: KeySpace) -> Self {
        self.options.keyspace = keyspace;
        self
    }

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
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

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
        let (message, decision) = self.decide_one(body).await;
        let result = run_if_told(&mut handler, message.as_ref(), &decision).await;
        self.complete(decision, result).await
    }

    /// Puts a batch through the guard with one store call to decide and one to
    /// record, running `handler` in order for each delivery that should run.
    /// Deliveries sharing a key run at most once (see [`Verdict::Duplicate`]).
    ///
    /// A slow batch makes more calls: before each handler (and on the timer's
    /// ticks, see [`Guard::with_timer`]) a due checkpoint remembers the successes
    /// so far and renews the claims still held ([`crate::lease`]).
    pub async fn process_batch<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    ) -> Vec<Outcome<E>> {
        self.process_batch_indexed(bodies, async |_, msg| handler(msg).await)
            .await
    }

    /// [`Guard::process_batch`] whose handler also gets the delivery's index in
    /// `bodies`, for transport data that lives beside the body (a queue's own
    /// attempt count, a message handle).
    pub async fn process_batch_indexed<B: Body, E>(
        &self,
        bodies: &[B],
        handler: impl AsyncFnMut(usize, &Message<'_>) -> Result<(), E>,
    ) -> Vec<Outcome<E>> {
        self.run_batch(bodies, handler).await.1
    }

    /// [`Guard::process_batch`] that also hands back each delivery's store key
    /// (`None`: no usable id, or not a valid envelope), so a caller that reports
    /// ids need not decode the bodies again ([`KeySpace::id_of`] turns a key back
    /// into its `meta.id`, [`KeySpace::into_id`] an owned one without copying). Same store calls, same handler calls, same outcomes.
    pub async fn process_batch_keyed<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    ) -> Vec<(Option<String>, Outcome<E>)> {
        let (decisions, outcomes) = self
            .run_batch(bodies, async |_, msg| handler(msg).await)
            .await;
        decisions.into_iter().map(|d| d.key).zip(outcomes).collect()
    }

    async fn run_batch<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl AsyncFnMut(usize, &Message<'_>) -> Result<(), E>,
    ) -> (Vec<Decision>, Vec<Outcome<E>>) {
        let (messages, mut decisions) = self.plan(bodies).await;
        // The renewal clock starts only where there are claims to keep alive.
        let started = self.renewing().and_then(|_| self.now());
        let mut progress = Progress::new(decisions.len(), started);
        for (i, message) in messages.iter().enumerate() {
            let Some(message) = message.as_ref().filter(|_| decisions[i].should_run()) else {
                continue;
            };
            if progress.due(&self.options.leases, self.renewing(), || self.now()) {
                self.checkpoint(&decisions, &mut progress, i, false).await;
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

    /// The lease to keep claims alive for: claiming mode on a store that renews.
    fn renewing(&self) -> Option<Duration> {
        self.options
            .claim_lease
            .filter(|_| self.store.capabilities().lease)
    }

    /// Runs delivery `i`'s handler; with a timer, checkpoints on its ticks until
    /// the handler is done. A checkpoint that has started is finished before the
    /// result is returned, so a store write is never cut off halfway.
    async fn run_kept_alive<E>(
        &self,
        handler: &mut impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
        msg: &Message<'_>,
        decisions: &[Decision],
        progress: &mut Progress<E>,
        i: usize,
    ) -> HandlerResult<E> {
        let lease = self.renewing();
        let mut run = pin!(run_caught(handler, msg));
        if !self.timer.available() || (lease.is_none() && progress.waiting.is_empty()) {
            return run.await;
        }
        let every = Progress::<E>::tick(&self.options.leases, lease);
        loop {
            let started = std::cell::Cell::new(false);
            let mut tick = pin!(async {
                self.timer.sleep(every).await;
                started.set(true);
                if progress.due(&self.options.leases, lease, || self.now()) {
                    self.checkpoint(decisions, progress, i, true).await;
                }
            });
            let mut result = None;
            let ticked = std::future::poll_fn(|cx| {
                if result.is_none() {
                    if let Poll::Ready(r) = run.as_mut().poll(cx) {
                        result = Some(r);
                    }
                }
                match (result.is_some(), started.get()) {
                    // Done before the tick: nothing of the tick has happened.
                    (true, false) => Poll::Ready(false),
                    _ => tick.as_mut().poll(cx).map(|()| true),
                }
            })
            .await;
            if let Some(r) = result {
                return r;
            }
            debug_assert!(ticked);
        }
    }

    /// One store call: remembers the waiting successes (fenced in claiming mode)
    /// and renews every claim from `from` on that is still to run (or, when
    /// `running`, is running: delivery `from`).
    async fn checkpoint<E>(
        &self,
        decisions: &[Decision],
        progress: &mut Progress<E>,
        from: usize,
        running: bool,
    ) {
        let lease = self.renewing();
        let remember = self.remember_list(decisions, &progress.waiting);
        let renew: Vec<(usize, (&str, &ClaimToken))> = match lease {
            None => Vec::new(),
            Some(_) => (from..decisions.len())
                .filter(|&j| decisions[j].should_run() && !progress.lost[j])
                .filter_map(|j| Some((j, (key_at(decisions, j), decisions[j].claim.as_ref()?))))
                .collect(),
        };
        if remember.is_empty() && renew.is_empty() {
            progress.renewed_at = self.now();
            return;
        }
        let renew_keys: Vec<(&str, &ClaimToken)> = renew.iter().map(|(_, c)| *c).collect();
        let step = Settlement {
            remember: &remember,
            ttl: self.options.ttl,
            release: &[],
            renew: &renew_keys,
            lease: lease.unwrap_or_default(),
        };
        let settled = self.settle(&step).await;
        let Ok(settled) = settled else {
            // Unknown: the successes stay waiting and are written at the commit.
            // But once our own clock says a whole lease has passed since the
            // claims were last confirmed, they may have been taken over: they are
            // lost, and nothing more of the batch runs.
            if self.lease_passed(lease, progress.renewed_at) {
                for (j, _) in &renew {
                    match running && *j == from {
                        false => progress.lost[*j] = true,
                        true => self.observe_lease_lost_early(&decisions[*j]),
                    }
                }
            }
            return;
        };
        for (&i, kept) in progress.waiting.iter().zip(&settled.kept) {
            progress.written[i] = Some(*kept);
        }
        progress.waiting.clear();
        progress.waiting_since = None;
        for ((j, _), renewed) in renew.iter().zip(&settled.renewed) {
            // The running delivery's claim is settled by its fenced commit.
            match (renewed, running && *j == from) {
                (true, _) => {}
                (false, false) => progress.lost[*j] = true,
                (false, true) => self.observe_lease_lost_early(&decisions[*j]),
            }
        }
        progress.renewed_at = self.now();
    }

    /// Has a whole `lease` passed, by our clock, since the claims were last
    /// taken or renewed (`since`)? Without a clock nothing can be told: `false`.
    fn lease_passed(&self, lease: Option<Duration>, since: Option<u64>) -> bool {
        match (lease, since, self.now()) {
            (Some(lease), Some(since), Some(now)) => {
                Duration::from_millis(now.saturating_sub(since)) >= lease
            }
            _ => false,
        }
    }

    /// What remembering the successes at `waiting` writes: their keys (fenced in
    /// claiming mode), in order, then their fingerprint records (plain). The
    /// store's `kept` answers line up with `waiting` for that reason.
    fn remember_list<'d>(
        &self,
        decisions: &'d [Decision],
        waiting: &[usize],
    ) -> Vec<(&'d str, Option<&'d ClaimToken>)> {
        let mut remember: Vec<(&str, Option<&ClaimToken>)> = waiting
            .iter()
            .map(|&i| (key_at(decisions, i), self.fence_token(&decisions[i])))
            .collect();
        for &i in waiting {
            if let Some(fp) = &decisions[i].fingerprint {
                remember.push((fp.marker_key.as_str(), None));
                remember.push((fp.record_key.as_str(), None));
            }
        }
        remember
    }

    /// The token a success is committed under: its claim, when the store fences.
    fn fence_token<'d>(&self, decision: &'d Decision) -> Option<&'d ClaimToken> {
        decision
            .claim
            .as_ref()
            .filter(|_| self.store.capabilities().lease)
    }

    /// A renewal found the running handler's claim gone; its commit will say so.
    fn observe_lease_lost_early(&self, decision: &Decision) {
        self.observer.observe(Event::LeaseLost {
            key: decision.key.as_deref(),
        });
    }

    /// Decides one delivery (see [`Guard::decide_batch`]).
    pub async fn decide<B: Body + ?Sized>(&self, body: &B) -> Decision {
        self.decide_one(body).await.1
    }

    /// Classifies one body and, if it has a key, asks the store (single-key calls).
    async fn decide_one<'b, B: Body + ?Sized>(
        &self,
        body: &'b B,
    ) -> (Option<Message<'b>>, Decision) {
        let (message, mut decision) = self.classify(body);
        if decision.verdict == Verdict::Run {
            self.ask_store(std::slice::from_mut(&mut decision), &[0])
                .await;
        }
        (message, decision)
    }

    /// Decides a batch with one store call (plus one re-check if, in claiming mode,
    /// some ids are held by another consumer). The host then runs the handler for
    /// each decision whose [`Decision::should_run`] is true.
    pub async fn decide_batch<B: Body>(&self, bodies: &[B]) -> Vec<Decision> {
        self.plan(bodies).await.1
    }

    /// Completes one decision with its handler's result (`None`: it did not run).
    pub async fn complete<E>(
        &self,
        decision: Decision,
        result: Option<HandlerResult<E>>,
    ) -> Outcome<E> {
        let recorded = match settlement(&decision, &result) {
            Settle::Remember => {
                // A plain remember of one key is the store's own `remember` call.
                let remember = self.remember_list(std::slice::from_ref(&decision), &[0]);
                let step = Settlement {
                    remember: &remember,
                    ttl: self.options.ttl,
                    ..Settlement::default()
                };
                self.settle(&step)
                    .await
                    .map(|s| s.kept.first().copied().unwrap_or(true))
            }
            Settle::Release(key, token) => {
                let release = [(key, token)];
                let step = Settlement {
                    release: &release,
                    ..Settlement::default()
                };
                let _ = self.settle(&step).await;
                Ok(true)
            }
            Settle::Nothing => Ok(true),
        };
        let outcome = resolve(&decision.verdict, result, &recorded, None);
        self.observe_outcome(&decision, &outcome);
        outcome
    }

    /// Records a batch with one store call: remembers the keys whose handler
    /// succeeded (fenced in claiming mode), releases the claims of those that
    /// failed, and resolves every delivery's outcome. `results[i]` is the handler
    /// result for `decisions[i]` (`None` where it did not run).
    pub async fn complete_batch<E>(
        &self,
        decisions: Vec<Decision>,
        results: Vec<Option<HandlerResult<E>>>,
    ) -> Vec<Outcome<E>> {
        let mut progress = Progress::new(decisions.len(), None);
        for (i, result) in results.into_iter().enumerate().take(decisions.len()) {
            if matches!(result, Some(HandlerResult::Ok)) && decisions[i].verdict == Verdict::Run {
                progress.waiting.push(i);
            }
            progress.results[i] = result;
        }
        self.finish(&decisions, progress).await
    }

    /// The commit: writes what is still waiting and releases what did not
    /// succeed (one call), then resolves every outcome.
    async fn finish<E>(&self, decisions: &[Decision], progress: Progress<E>) -> Vec<Outcome<E>> {
        let Progress {
            results,
            mut written,
            lost,
            waiting,
            ..
        } = progress;
        let remember = self.remember_list(decisions, &waiting);
        let release: Vec<(&str, &ClaimToken)> = decisions
            .iter()
            .zip(&results)
            .zip(&lost)
            .filter(|(_, lost)| !**lost)
            .filter_map(
                |((decision, result), _)| match settlement(decision, result) {
                    Settle::Release(key, token) => Some((key, token)),
                    _ => None,
                },
            )
            .collect();
        let step = Settlement {
            remember: &remember,
            ttl: self.options.ttl,
            release: &release,
            ..Settlement::default()
        };
        let committed = match (remember.is_empty(), release.is_empty()) {
            (true, true) => Ok(Settled::default()),
            _ => self.settle(&step).await,
        };
        let mut commit_error = None;
        match committed {
            Ok(settled) => {
                for (&i, kept) in waiting.iter().zip(&settled.kept) {
                    written[i] = Some(*kept);
                }
            }
            Err(e) if !remember.is_empty() => commit_error = Some(e),
            Err(_) => {} // Releases only: the leases run out by themselves.
        }

        let mut outcomes: Vec<Outcome<E>> = Vec::with_capacity(decisions.len());
        for ((decision, result), written) in decisions.iter().zip(results).zip(written) {
            let leader = match decision.verdict {
                Verdict::Duplicate(of) => outcomes.get(of),
                _ => None,
            };
            let recorded = match (written, &commit_error) {
                (Some(kept), _) => Ok(kept),
                (None, Some(e)) => Err(e.clone()),
                (None, None) => Ok(true),
            };
            let outcome = resolve(&decision.verdict, result, &recorded, leader);
            self.observe_outcome(decision, &outcome);
            outcomes.push(outcome);
        }
        outcomes
    }

    fn observe_outcome<E>(&self, decision: &Decision, outcome: &Outcome<E>) {
        self.observer.observe(Event::Outcome {
            key: decision.key.as_deref(),
            kind: outcome.kind(),
        });
    }

    /// Decodes one body and derives its key; the store is not asked yet.
    fn classify<'b, B: Body + ?Sized>(&self, body: &'b B) -> (Option<Message<'b>>, Decision) {
        let message = match body.decode(&self.options.limits) {
            Ok(m) => m,
            Err(r) => return (None, Decision::unkeyed(Verdict::Reject(r))),
        };
        let decision = match message.id() {
            None => Decision::unkeyed(Verdict::FailOpen),
            Some(id) => {
                let key = self.options.keyspace.key(id).into_owned();
                match self.fingerprint_of(&message, &key) {
                    Ok(fingerprint) => Decision {
                        verdict: Verdict::Run,
                        key: Some(key),
                        claim: None,
                        fingerprint,
                    },
                    Err(refused) => Decision::unkeyed(Verdict::StoreUnavailable(refused)),
                }
            }
        };
        (Some(message), decision)
    }

    /// The delivery's fingerprint with [`Options::fingerprint`] on; refused (every
    /// keyed delivery fails closed) where fingerprints cannot be kept.
    fn fingerprint_of(&self, message: &Message<'_>, key: &str) -> StoreResult<Option<Fingerprint>> {
        if !self.options.fingerprint {
            return Ok(None);
        }
        if let Some(format) = self.store.shared_format() {
            return Err(StoreError::unsupported(format!(
                "payload fingerprints need our own record format; this store keeps {format} records"
            )));
        }
        #[cfg(feature = "fingerprint")]
        return Ok(Fingerprint::of(message.raw(), key));
        #[cfg(not(feature = "fingerprint"))]
        {
            let _ = (message, key);
            Err(StoreError::unsupported(
                "payload fingerprints: this build leaves out the `fingerprint` feature",
            ))
        }
    }

    /// Classifies every body, collapses in-batch duplicates, and asks the store
    /// about each distinct key once.
    async fn plan<'b, B: Body>(
        &self,
        bodies: &'b [B],
    ) -> (Vec<Option<Message<'b>>>, Vec<Decision>) {
        let (messages, mut decisions): (Vec<_>, Vec<_>) =
            bodies.iter().map(|body| self.classify(body)).unzip();
        // The first delivery of each key leads; later ones follow it. The map
        // borrows the keys, so duplicates are marked after it is dropped.
        let mut unique: Vec<usize> = Vec::new();
        let mut followers: Vec<(usize, usize)> = Vec::new();
        {
            let mut leaders: hashbrown::HashMap<&str, usize, RandomState> =
                hashbrown::HashMap::with_capacity_and_hasher(
                    decisions.len(),
                    RandomState::default(),
                );
            for (i, decision) in decisions.iter().enumerate() {
                if let Some(key) = decision.key.as_deref() {
                    match leaders.entry(key) {
                        hashbrown::hash_map::Entry::Occupied(leader) => {
                            followers.push((i, *leader.get()))
                        }
                        hashbrown::hash_map::Entry::Vacant(slot) => {
                            slot.insert(i);
                            unique.push(i);
                        }
                    }
                }
            }
        }
        for (i, leader) in followers {
            decisions[i].verdict = if same_payload(&decisions[i], &decisions[leader]) {
                Verdict::Duplicate(leader)
            } else {
                // One id, two payloads in one batch: the first one runs.
                Verdict::PayloadMismatch
            };
        }
        self.ask_store(&mut decisions, &unique).await;
        (messages, decisions)
    }

    /// Settles the `Run` verdicts at `unique` (distinct keys) with the store:
    /// `seen` in plain mode, `claim` in claiming mode.
    async fn ask_store(&self, decisions: &mut [Decision], unique: &[usize]) {
        match self.options.claim_lease {
            _ if unique.is_empty() => return,
            Some(lease) => self.claim_all(unique, decisions, lease).await,
            None => self.check_all(unique, decisions).await,
        }
        self.check_fingerprints(unique, decisions).await;
    }

    /// For each skip at `unique` that has a fingerprint: one more call (only when
    /// the batch has skips) reads its marker and record. Marker without record:
    /// the id was processed with another payload.
    async fn check_fingerprints(&self, unique: &[usize], decisions: &mut [Decision]) {
        let skips: Vec<usize> = unique
            .iter()
            .copied()
            .filter(|&i| {
                decisions[i].verdict == Verdict::Skip && decisions[i].fingerprint.is_some()
            })
            .collect();
        if skips.is_empty() {
            return;
        }
        let keys: Vec<&str> = skips
            .iter()
            .filter_map(|&i| decisions[i].fingerprint.as_ref())
            .flat_map(|fp| [fp.marker_key.as_str(), fp.record_key.as_str()])
            .collect();
        let answers = checked_len(self.store.seen_many(&keys).await, keys.len());
        self.report_store_error(StoreOp::Seen, &answers);
        for (n, &i) in skips.iter().enumerate() {
            decisions[i].verdict = match &answers {
                Ok(a) if a[2 * n] && !a[2 * n + 1] => Verdict::PayloadMismatch,
                Ok(_) => Verdict::Skip,
                Err(e) => Verdict::StoreUnavailable(e.clone()),
            };
        }
    }

    /// Plain mode: one `seen` (or `seen_many`) for the distinct keys.
    async fn check_all(&self, unique: &[usize], decisions: &mut [Decision]) {
        if let [i] = *unique {
            let answer = self.store.seen(key_at(decisions, i)).await;
            self.report_store_error(StoreOp::Seen, &answer);
            decisions[i].verdict = after_seen(answer.as_ref().copied());
            return;
        }
        let keys: Vec<&str> = unique.iter().map(|&i| key_at(decisions, i)).collect();
        let answers = checked_len(self.store.seen_many(&keys).await, keys.len());
        self.report_store_error(StoreOp::Seen, &answers);
        for (n, &i) in unique.iter().enumerate() {
            decisions[i].verdict = after_seen(answers.as_ref().map(|a| a[n]));
        }
    }

    /// Claiming mode: claim every distinct key (one call); a key held by another
    /// consumer is re-checked with `seen` (one more call), then skipped or parked.
    async fn claim_all(&self, unique: &[usize], decisions: &mut [Decision], lease: Duration) {
        let claims = match *unique {
            [i] => self
                .store
                .claim(key_at(decisions, i), lease)
                .await
                .map(|c| vec![c]),
            _ => {
                let keys: Vec<&str> = unique.iter().map(|&i| key_at(decisions, i)).collect();
                checked_len(self.store.claim_many(&keys, lease).await, keys.len())
            }
        };
        self.report_store_error(StoreOp::Claim, &claims);
        let claims = match claims {
            Ok(claims) => claims,
            Err(e) => {
                for &i in unique {
                    decisions[i].verdict = Verdict::StoreUnavailable(e.clone());
                }
                return;
            }
        };
        let mut held = Vec::new();
        for (&i, claim) in unique.iter().zip(claims) {
            match claim {
                Claim::Acquired(token) => decisions[i].claim = Some(token),
                Claim::Seen => decisions[i].verdict = Verdict::Skip,
                Claim::Held => held.push(i),
            }
        }
        if held.is_empty() {
            return;
        }
        // The holder may have finished since: skip if so, otherwise park.
        self.check_all(&held, decisions).await;
        for &i in &held {
            if decisions[i].verdict == Verdict::Run {
                decisions[i].verdict = Verdict::Park;
            }
        }
    }

    /// One batch step in as few calls as the store allows; store errors are
    /// reported to the observer (a failed release only there: it changes no
    /// outcome, the lease runs out by itself).
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let ttl = step.ttl;
        let plain = step.renew.is_empty() && step.remember.iter().all(|(_, t)| t.is_none());
        let result = match (step.remember, step.release) {
            ([], []) if step.renew.is_empty() => Ok(Settled::default()),
            ([(key, None)], []) if plain => self.store.remember(key, ttl).await.map(|()| Settled {
                kept: vec![true],
                ..Settled::default()
            }),
            (many, []) if plain => {
                let keys: Vec<&str> = many.iter().map(|(key, _)| *key).collect();
                self.store
                    .remember_many(&keys, ttl)
                    .await
                    .map(|()| Settled {
                        kept: vec![true; keys.len()],
                        ..Settled::default()
                    })
            }
            ([], [(key, token)]) if plain => {
                let released = self.store.release(key, token).await;
                Ok(Settled {
                    release_error: released.err(),
                    ..Settled::default()
                })
            }
            _ => self.store.settle(step).await,
        };
        let op = if step.remember.is_empty() {
            StoreOp::Renew
        } else {
            StoreOp::Remember
        };
        match &result {
            Ok(settled) => {
                if let Some(error) = &settled.release_error {
                    self.observer.observe(Event::StoreError {
                        op: StoreOp::Release,
                        error,
                    });
                }
            }
            Err(error) if step.remember.is_empty() && step.renew.is_empty() => {
                self.observer.observe(Event::StoreError {
                    op: StoreOp::Release,
                    error,
                });
            }
            Err(error) => self.observer.observe(Event::StoreError { op, error }),
        }
        result
    }

    fn report_store_error<R>(&self, op: StoreOp, result: &StoreResult<R>) {
        if let Err(error) = result {
            self.observer.observe(Event::StoreError { op, error });
        }
    }
}

/// What recording one delivery takes.
enum Settle<'d> {
    Remember,
    Release(&'d str, &'d ClaimToken),
    Nothing,
}

/// The rule: a run that succeeded is remembered; a run that failed, panicked or
/// never happened gives back its claim (if it took one); nothing else touches the
/// store.
fn settlement<'d, E>(decision: &'d Decision, result: &Option<HandlerResult<E>>) -> Settle<'d> {
    match (
        &decision.verdict,
        decision.key.as_deref(),
        result,
        &decision.claim,
    ) {
        (Verdict::Run, Some(_), Some(HandlerResult::Ok), _) => Settle::Remember,
        (Verdict::Run, Some(key), _, Some(token)) => Settle::Release(key, token),
        _ => Settle::Nothing,
    }
}

/// Runs the handler if the decision says so; `None` when it must not run.
async fn run_if_told<E>(
    handler: &mut impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    message: Option<&Message<'_>>,
    decision: &Decision,
) -> Option<HandlerResult<E>> {
    match message {
        Some(msg) if decision.should_run() => Some(run_caught(handler, msg).await),
        _ => None,
    }
}

/// Do two deliveries of one key carry the same payload (as far as fingerprints
/// are kept)?
fn same_payload(a: &Decision, b: &Decision) -> bool {
    match (&a.fingerprint, &b.fingerprint) {
        (Some(a), Some(b)) => a.hash == b.hash,
        _ => true,
    }
}

/// The store key of a keyed decision (only keyed decisions reach the store).
fn key_at(decisions: &[Decision], i: usize) -> &str {
    decisions[i].key.as_deref().unwrap_or_default()
}

/// The verdict once the store has said whether the key was seen.
fn after_seen(answer: Result<bool, &StoreError>) -> Verdict {
    match answer {
        Ok(true) => Verdict::Skip,
        Ok(false) => Verdict::Run,
        Err(e) => Verdict::StoreUnavailable(e.clone()),
    }
}

/// A delivery's outcome from its verdict, its handler's result, whether its
/// success was recorded (`Ok(false)`: recorded after its claim was lost), and (for an in-batch duplicate) the leader's outcome.
fn resolve<E>(
    verdict: &Verdict,
    result: Option<HandlerResult<E>>,
    recorded: &StoreResult<bool>,
    leader: Option<&Outcome<E>>,
) -> Outcome<E> {
    match (verdict, result) {
        (Verdict::Run, Some(HandlerResult::Ok)) => match recorded {
            Ok(true) => Outcome::Ran,
            Ok(false) => Outcome::RanLeaseLost,
            Err(e) => Outcome::RanUnrecorded(e.clone()),
        },
        (Verdict::FailOpen, Some(HandlerResult::Ok)) => Outcome::FailOpen(Ok(())),
        (Verdict::FailOpen, Some(HandlerResult::Err(e))) => Outcome::FailOpen(Err(e)),
        (Verdict::Run, Some(HandlerResult::Err(e))) => Outcome::Failed(e),
        (Verdict::Run | Verdict::FailOpen, Some(HandlerResult::Panicked(msg))) => {
            Outcome::Panicked(msg)
        }
        // Told to run but it did not: nothing happened, so redeliver.
        (Verdict::Run | Verdict::FailOpen, None) => Outcome::Parked,
        (Verdict::Skip, _) => Outcome::Skipped,
        (Verdict::Park, _) => Outcome::Parked,
        (Verdict::Reject(r), _) => Outcome::Rejected(r.clone()),
        (Verdict::PayloadMismatch, _) => Outcome::PayloadMismatch,
        (Verdict::StoreUnavailable(e), _) => Outcome::StoreUnavailable(e.clone()),
        (Verdict::Duplicate(_), _) => follow(leader),
    }
}

/// A store that answers a batch call with the wrong number of answers is broken;
/// treat it as an error rather than guess.
fn checked_len<T>(answers: StoreResult<Vec<T>>, expected: usize) -> StoreResult<Vec<T>> {
    match answers {
        Ok(a) if a.len() != expected => Err(StoreError::internal(format!(
            "store answered {} of {expected} keys",
            a.len()
        ))),
        other => other,
    }
}

/// A duplicate inside a batch follows the delivery it duplicates: done there means
/// skip here; anything else means retry here, without running.
fn follow<E>(leader: Option<&Outcome<E>>) -> Outcome<E> {
    match leader.map(Outcome::kind) {
        Some(
            OutcomeKind::Ran
            | OutcomeKind::RanUnrecorded
            | OutcomeKind::RanLeaseLost
            | OutcomeKind::Skipped,
        ) => Outcome::Skipped,
        Some(OutcomeKind::StoreUnavailable) => match leader {
            Some(Outcome::StoreUnavailable(e)) => Outcome::StoreUnavailable(e.clone()),
            _ => Outcome::Parked,
        },
        _ => Outcome::Parked,
    }
}

/// Runs the handler, turning a panic (where unwinding exists) into a result so it
/// never crosses the guard.
async fn run_caught<E>(
    handler: &mut impl AsyncFnMut(&Message<'_>) -> Result<(), E>,
    msg: &Message<'_>,
) -> HandlerResult<E> {
    // The async block defers the call itself into the first poll, so a panic in
    // the synchronous part of the handler is caught too.
    let mut call = pin!(async { handler(msg).await });
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx))) {
            Ok(Poll::Ready(r)) => Poll::Ready(r.into()),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(HandlerResult::Panicked(panic_message(&*payload))),
        }
    })
    .await
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}
