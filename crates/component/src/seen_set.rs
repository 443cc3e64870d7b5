//! [`HostStore`] for the `dedupe-minimal` world: the core's [`Store`] over the
//! imported `seen-set` interface, which has only `seen`, `remember` and
//! `forget`.
//!
//! Everything else is the `Store` trait's own fallback: batches ask one key at a
//! time, claims answer `unsupported` (so claiming mode is `store-unavailable`
//! and nothing runs), and there is no clock, so no renewals and no time-based
//! checkpoints (the default capabilities: none). The TTL is passed on; a host
//! without expiry may ignore it.

use std::time::Duration;

use bq_dedupe::store::{KeyStore, PerKey};
use bq_dedupe::{Guard, StoreResult};

use crate::bindings::babelqueue::idempotency::seen_set as host;
use crate::convert::millis;

/// The host's seen-set, one import call per key. Nothing to read up front: it
/// offers what it offers.
#[derive(Default)]
pub struct SeenSet;

/// The seen-set as the guard's store.
pub type HostStore = PerKey<SeenSet>;

/// The store for one export call.
pub fn per_call() -> HostStore {
    PerKey(SeenSet)
}

/// The same store: a seen-set has no capabilities to read once.
pub fn read_once() -> HostStore {
    PerKey(SeenSet)
}

/// A guard over the seen-set: no clock to give it (the world imports none).
pub fn with_host_clock(guard: Guard<HostStore>) -> Guard<HostStore> {
    guard
}

impl KeyStore for SeenSet {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        Ok(host::seen(key)?)
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        Ok(host::remember(key, ttl.map(millis))?)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        Ok(host::forget(key)?)
    }
}
