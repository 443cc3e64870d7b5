//! [`HostStore`]: the core's [`Store`] over the imported WIT `store` interface.
//!
//! Every import is a synchronous call, so every future here is ready on its first
//! poll. What the host reports in `capabilities()` decides which imports are used:
//! - `batch` false: the `*-many` methods run the trait's own single-call loops
//!   (through [`PerKey`]), so the host's `*-many` functions are never called;
//! - `claim` false: `claim`, `claim_many` and `release` fail with `unsupported`
//!   without calling the host (the guard then answers `store-unavailable`);
//! - `ttl` false: `remember` always passes no TTL.

use std::cell::OnceCell;
use std::time::Duration;

use bq_dedupe::store::PerKey;
use bq_dedupe::{Capabilities, Claim, ClaimToken, Store, StoreError, StoreResult};

use crate::bindings::babelqueue::idempotency::store as host;
use crate::bindings::babelqueue::idempotency::types as wit;
use crate::convert::millis;

/// The host's store, for the duration of one export call.
#[derive(Default)]
pub struct HostStore {
    /// `store.capabilities()`, asked at most once per export call, and only when
    /// the call reaches the store.
    caps: OnceCell<wit::Capabilities>,
}

impl HostStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn caps(&self) -> wit::Capabilities {
        *self.caps.get_or_init(host::capabilities)
    }

    fn ttl_ms(&self, ttl: Option<Duration>) -> Option<u64> {
        ttl.filter(|_| self.caps().ttl).map(millis)
    }

    /// `Err(unsupported)` unless the host can claim.
    fn check_claim(&self) -> StoreResult<()> {
        if self.caps().claim {
            Ok(())
        } else {
            Err(StoreError::unsupported(
                "the host store does not support claims (capabilities.claim is false)",
            ))
        }
    }
}

impl Store for HostStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        Ok(host::seen(key)?)
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        Ok(host::remember(key, self.ttl_ms(ttl))?)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        Ok(host::forget(key)?)
    }

    fn capabilities(&self) -> Capabilities {
        self.caps().into()
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if !self.caps().batch {
            return PerKey(self).seen_many(keys).await;
        }
        Ok(host::seen_many(keys)?)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if !self.caps().batch {
            return PerKey(self).remember_many(keys, ttl).await;
        }
        Ok(host::remember_many(keys, self.ttl_ms(ttl))?)
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.check_claim()?;
        Ok(host::claim(key, millis(lease))?.into())
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.check_claim()?;
        Ok(host::release(key, &token.0)?)
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.check_claim()?;
        if !self.caps().batch {
            return PerKey(self).claim_many(keys, lease).await;
        }
        let answers = host::claim_many(keys, millis(lease))?;
        Ok(answers.into_iter().map(Into::into).collect())
    }

    async fn commit_many(
        &self,
        done: &[&str],
        ttl: Option<Duration>,
        release: &[(&str, &ClaimToken)],
    ) -> StoreResult<()> {
        let caps = self.caps();
        // The release part of `commit-many` needs `claim` too; without it (only
        // reachable with a forged claim token) the loop's `release` says unsupported.
        if !caps.batch || !(caps.claim || release.is_empty()) {
            return PerKey(self).commit_many(done, ttl, release).await;
        }
        let release: Vec<(&str, &str)> = release
            .iter()
            .map(|(key, token)| (*key, token.0.as_str()))
            .collect();
        Ok(host::commit_many(done, self.ttl_ms(ttl), &release)?)
    }
}
