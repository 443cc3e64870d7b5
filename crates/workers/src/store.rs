//! `WorkersStore`: whichever store the configuration chose, as one type.

use std::time::Duration;

use bq_dedupe::{Capabilities, Claim, ClaimToken, Store, StoreResult};

use crate::durable::DurableObjectStore;
use crate::kv::KvStore;
use crate::round_trips::RoundTrips;

pub enum WorkersStore {
    DurableObject(DurableObjectStore),
    Kv(KvStore),
}

impl WorkersStore {
    /// Requests made to the backend so far.
    pub fn round_trips(&self) -> &RoundTrips {
        match self {
            WorkersStore::DurableObject(s) => s.round_trips(),
            WorkersStore::Kv(s) => s.round_trips(),
        }
    }
}

/// Forwards a call to the chosen store.
macro_rules! each {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            WorkersStore::DurableObject($s) => $call,
            WorkersStore::Kv($s) => $call,
        }
    };
}

impl Store for WorkersStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        each!(self, s => s.seen(key).await)
    }
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        each!(self, s => s.remember(key, ttl).await)
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        each!(self, s => s.forget(key).await)
    }
    fn capabilities(&self) -> Capabilities {
        each!(self, s => s.capabilities())
    }
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        each!(self, s => s.seen_many(keys).await)
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        each!(self, s => s.remember_many(keys, ttl).await)
    }
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        each!(self, s => s.claim(key, lease).await)
    }
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        each!(self, s => s.release(key, token).await)
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        each!(self, s => s.claim_many(keys, lease).await)
    }
    async fn commit_many(
        &self,
        done: &[&str],
        ttl: Option<Duration>,
        release: &[(&str, &ClaimToken)],
    ) -> StoreResult<()> {
        each!(self, s => s.commit_many(done, ttl, release).await)
    }
}
