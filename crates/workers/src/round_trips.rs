//! Counts the requests a store client makes (to a Durable Object or to KV).

use std::cell::Cell;
use std::rc::Rc;

/// A shared request counter: clone it into a store, read it after a batch.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips(Rc<Cell<u64>>);

impl RoundTrips {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The requests counted so far.
    pub fn get(&self) -> u64 {
        self.0.get()
    }

    pub(crate) fn add(&self, n: u64) {
        self.0.set(self.0.get() + n);
    }
}
