//! The benchmark's baseline: the same store, but only its per-message calls
//! (`seen`, `remember`, `claim`, `release`), as a naive adapter would make them.
//! The batch forms fall back to the `Store` trait's loops over single calls.

use std::time::Duration;

use bq_dedupe_workers::bq_dedupe::{Capabilities, Claim, ClaimToken, Store, StoreResult};

pub struct PerMessage<S>(pub S);

impl<S: Store> Store for PerMessage<S> {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        self.0.seen(key).await
    }
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.0.remember(key, ttl).await
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.0.forget(key).await
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.0.claim(key, lease).await
    }
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.0.release(key, token).await
    }
}
