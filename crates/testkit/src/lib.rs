//! A testkit every [`Store`] can pass: random operations from several clients
//! and a clock the test moves, each answer checked against the one statement of
//! the rules ([`bq_dedupe::store::record`]), with faults injected.
//!
//! A backend provides a [`Harness`] (how to open a client, which clock it reads,
//! which of the rules' choices it makes) and calls [`check`]:
//!
//! ```
//! use std::sync::Arc;
//! use bq_dedupe::{InMemoryStore, clock::ManualClock};
//! use bq_dedupe::store::record::Rules;
//! use bq_dedupe_testkit::{self as testkit, Harness};
//!
//! struct Memory(Arc<InMemoryStore>, Arc<ManualClock>);
//!
//! impl Harness for Memory {
//!     type Client = Arc<InMemoryStore>;
//!     fn rules(&self) -> Rules { InMemoryStore::RULES }
//!     fn open(&mut self) -> Arc<InMemoryStore> { self.0.clone() }
//!     fn now_ms(&self) -> u64 { bq_dedupe::clock::Clock::now_ms(&*self.1) }
//!     fn advance(&mut self, ms: u64) { self.1.advance(ms) }
//! }
//!
//! testkit::check(8, || {
//!     let clock = Arc::new(ManualClock::new(0));
//!     Memory(Arc::new(InMemoryStore::with_clock(clock.clone())), clock)
//! });
//! ```
//!
//! What is checked, per call: the answer is the model's (where time is not
//! exact, the model's answer at either end of the call's time window), and the
//! model's record moves as the answer says. The faults ([`Fault`]): a call that
//! fails before it reaches the store must change nothing; one that fails after
//! taking effect, or is sent twice, must leave the store where the model says
//! (the swallowed reply is checked too). A client's crash drops what it knew
//! (its tokens); its claims lapse by themselves. Batch calls are given distinct
//! keys, as the guard sends them.
//!
//! A backend with a transactional mode ([`bq_dedupe::store::TransactionalStore`],
//! [`bq_dedupe::store::StatementStore`]) says so ([`Harness::transactional`]) and
//! runs are given one more operation: a transaction on one key whose work writes
//! one effect row and then succeeds or fails. Its answer is checked against the
//! model as any call's (done: nothing runs; held by a live claim: nothing runs;
//! else committed, or rolled back leaving the record as it was), and after each
//! one the key's effect rows must number its committed transactions.
//!
//! A store's crate takes this one as a dev-dependency, as a service takes
//! tower-test. The modules, one job each:
//! - `operations`: a run's steps ([`Op`]: calls, clock steps, crashes, faults)
//!   and their random generation ([`ops`]; [`as_rust`] prints a run);
//! - `model`: what the record model ([`bq_dedupe::store::record`]) answers to one
//!   key's part of a call, at either end of its time window, and the records
//!   the key may be in after it: the judge of both checkers below;
//! - `runner`: [`check`], [`check_seeded`] and [`check_ops`] on a [`Harness`]
//!   (below: how to open a client, the clock, the rules; [`OnServer`] for a
//!   store on a server's own clock), every call made and checked in turn;
//! - `history`: the history checker ([`check_histories`], [`Fleet`], [`Plan`]):
//!   clients at once, each key's history linearizable against the model;
//! - `fault`: [`Faulty`], the store wrapper that fails a chosen call before or
//!   after it takes effect, or sends it twice;
//! - [`guard_fleet`]: the guard in the loop: consumers on one inbox, handlers
//!   that fail, outlive their lease or die before the commit; nothing lost.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod fault;
pub mod guard_fleet;
mod history;
mod model;
mod operations;
mod runner;

pub use fault::{Fault, Faulty, outcome_unknown};
pub use history::{
    Client, ClientCalls, Fleet, FleetTransact, Plan, Setting, check_histories, check_history,
    incompressible,
};
pub use operations::{Op, as_rust, ops};
pub use runner::{check, check_ops, check_seeded};

use std::time::Duration;

use bq_dedupe::StoreResult;
use bq_dedupe::store::record::Rules;
use bq_dedupe::store::{ClaimToken, Store, TxRun};

/// A backend under test: how to reach it and how its time moves.
pub trait Harness {
    /// One client of the shared backend.
    type Client: Store;

    /// The choices this backend's encoding makes (see [`Rules`]).
    fn rules(&self) -> Rules;

    /// A new client of the same backend (a new connection, or a handle on the
    /// one in-process store). Called for each of the run's clients, and again
    /// for a client that crashed.
    fn open(&mut self) -> Self::Client;

    /// The backend's clock, in ms (for a store on a [`bq_dedupe::clock::ManualClock`], that
    /// clock; for a server's own clock, the real time elapsed).
    fn now_ms(&self) -> u64;

    /// Moves the backend's clock on by `ms` (or waits that long).
    fn advance(&mut self, ms: u64);

    /// How far the backend's clock may be from [`Harness::now_ms`], in ms: an
    /// answer about a deadline that close to now may go either way. 0 for a
    /// manual clock.
    fn slack_ms(&self) -> u64 {
        0
    }

    /// The unit of every lease, TTL and clock step the run makes, in ms. 1000
    /// by default (the in-memory store keeps TTLs in whole seconds); a store on
    /// a server's real clock uses tens of ms to keep a run short.
    fn tick_ms(&self) -> u64 {
        1000
    }

    /// How many clients take part.
    fn clients(&self) -> usize {
        3
    }

    /// The backend has a transactional mode: runs include
    /// [`Harness::transact`] calls. `false` by default.
    fn transactional(&self) -> bool {
        false
    }

    /// The transactional mode takes the run's own claim on its key
    /// ([`bq_dedupe::store::StatementStore::commit_with`]): runs then pass
    /// [`Harness::transact`] a token of the client's claims. `false` by default.
    fn transactions_take_claims(&self) -> bool {
        false
    }

    /// One transaction on `client` for `key` (the transactional mode, where
    /// [`Harness::transactional`]): its work writes one effect row for `key` in
    /// the transaction, then succeeds (`ok`) or fails; `claim`, the run's own
    /// claim (only where [`Harness::transactions_take_claims`]). Answers the
    /// store's [`TxRun`] (its work's error as `()`). Never called otherwise.
    fn transact(
        &mut self,
        client: &Self::Client,
        key: &str,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        ok: bool,
    ) -> StoreResult<TxRun<(), ()>> {
        let _ = (client, key, ttl, claim, ok);
        Err(bq_dedupe::StoreError::unsupported(
            "this harness has no transactional mode",
        ))
    }

    /// How many effect rows the committed transactions left for `key`.
    fn effects(&mut self, key: &str) -> u64 {
        let _ = key;
        0
    }
}

/// [`Harness::transact`] for an [`OnServer`] harness.
type Transact<C> = Box<
    dyn FnMut(&C, &str, Option<Duration>, Option<&ClaimToken>, bool) -> StoreResult<TxRun<(), ()>>,
>;
/// [`Harness::effects`] for an [`OnServer`] harness.
type Effects = Box<dyn FnMut(&str) -> u64>;

/// A [`Harness`] for a store on a server that keeps its own time (Redis,
/// PostgreSQL, a Durable Object on workerd): a new client per `open`, the real
/// time elapsed as the clock (steps are sleeps), short ticks, and whatever
/// must be dropped with the run's keys held until the harness goes.
pub struct OnServer<C> {
    open: Box<dyn FnMut() -> C>,
    rules: Rules,
    started: std::time::Instant,
    tick_ms: u64,
    slack_ms: u64,
    transactions: Option<(Transact<C>, Effects)>,
    transactions_take_claims: bool,
    _cleanup: Box<dyn std::any::Any>,
}

impl<C> OnServer<C> {
    /// Clients from `open`, checked against `rules`; 40 ms ticks, 8 ms slack.
    pub fn new(rules: Rules, open: impl FnMut() -> C + 'static) -> Self {
        OnServer {
            open: Box::new(open),
            rules,
            started: std::time::Instant::now(),
            tick_ms: 40,
            slack_ms: 8,
            transactions: None,
            transactions_take_claims: false,
            _cleanup: Box::new(()),
        }
    }

    /// Keeps `cleanup` (a value whose `Drop` removes the run's records) until
    /// the harness is dropped.
    pub fn with_cleanup(mut self, cleanup: impl std::any::Any) -> Self {
        self._cleanup = Box::new(cleanup);
        self
    }

    /// The backend's transactional mode: `transact` as [`Harness::transact`],
    /// `effects` as [`Harness::effects`].
    pub fn with_transactions(
        self,
        mut transact: impl FnMut(&C, &str, Option<Duration>, bool) -> StoreResult<TxRun<(), ()>>
        + 'static,
        effects: impl FnMut(&str) -> u64 + 'static,
    ) -> Self {
        let mut on = self.with_claimed_transactions(
            move |client, key, ttl, _, ok| transact(client, key, ttl, ok),
            effects,
        );
        on.transactions_take_claims = false;
        on
    }

    /// As [`Self::with_transactions`], for a transactional mode that takes the
    /// run's own claim ([`Harness::transactions_take_claims`]).
    pub fn with_claimed_transactions(
        mut self,
        transact: impl FnMut(
            &C,
            &str,
            Option<Duration>,
            Option<&ClaimToken>,
            bool,
        ) -> StoreResult<TxRun<(), ()>>
        + 'static,
        effects: impl FnMut(&str) -> u64 + 'static,
    ) -> Self {
        self.transactions = Some((Box::new(transact), Box::new(effects)));
        self.transactions_take_claims = true;
        self
    }

    /// Other timing: a longer tick for a server a round trip away, and how far
    /// its clock may be from ours.
    pub fn with_timing(mut self, tick_ms: u64, slack_ms: u64) -> Self {
        (self.tick_ms, self.slack_ms) = (tick_ms, slack_ms);
        self
    }
}

impl<C> std::fmt::Debug for OnServer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnServer")
            .field("rules", &self.rules)
            .field("tick_ms", &self.tick_ms)
            .field("slack_ms", &self.slack_ms)
            .field("transactional", &self.transactions.is_some())
            .finish_non_exhaustive()
    }
}

impl<C: Store> Harness for OnServer<C> {
    type Client = C;
    fn rules(&self) -> Rules {
        self.rules
    }
    fn open(&mut self) -> C {
        (self.open)()
    }
    /// Real ms since the harness began, from an offset: a window's lower end
    /// (`now - slack`) must not stop at 0 and lose its slack.
    fn now_ms(&self) -> u64 {
        1_000_000 + self.started.elapsed().as_millis() as u64
    }
    fn advance(&mut self, ms: u64) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    fn slack_ms(&self) -> u64 {
        self.slack_ms
    }
    fn tick_ms(&self) -> u64 {
        self.tick_ms
    }
    fn transactional(&self) -> bool {
        self.transactions.is_some()
    }
    fn transactions_take_claims(&self) -> bool {
        self.transactions_take_claims
    }
    fn transact(
        &mut self,
        client: &C,
        key: &str,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        ok: bool,
    ) -> StoreResult<TxRun<(), ()>> {
        match &mut self.transactions {
            Some((transact, _)) => transact(client, key, ttl, claim, ok),
            None => Err(bq_dedupe::StoreError::unsupported(
                "no transactional mode given",
            )),
        }
    }
    fn effects(&mut self, key: &str) -> u64 {
        self.transactions
            .as_mut()
            .map_or(0, |(_, effects)| effects(key))
    }
}
