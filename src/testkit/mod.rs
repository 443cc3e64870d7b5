//! A testkit every [`Store`] can pass: random operations from several clients
//! and a clock the test moves, each answer checked against the one statement of
//! the rules ([`crate::store::record`]), with faults injected.
//!
//! A backend provides a [`Harness`] (how to open a client, which clock it reads,
//! which of the rules' choices it makes) and calls [`check`]:
//!
//! ```
//! use std::sync::Arc;
//! use bq_dedupe::{InMemoryStore, ManualClock};
//! use bq_dedupe::store::record::Rules;
//! use bq_dedupe::testkit::{self, Harness};
//!
//! struct Memory(Arc<InMemoryStore>, Arc<ManualClock>);
//!
//! impl Harness for Memory {
//!     type Client = Arc<InMemoryStore>;
//!     fn rules(&self) -> Rules { InMemoryStore::RULES }
//!     fn open(&mut self) -> Arc<InMemoryStore> { self.0.clone() }
//!     fn now_ms(&self) -> u64 { bq_dedupe::Clock::now_ms(&*self.1) }
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

mod fault;
mod run;

pub use fault::{Fault, Faulty};
pub use run::{Op, check, check_ops, ops};

use crate::store::Store;
use crate::store::record::Rules;

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

    /// The backend's clock, in ms (for a store on a [`crate::ManualClock`], that
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
}
