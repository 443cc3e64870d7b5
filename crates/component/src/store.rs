//! [`HostStore`]: the core's [`Store`] over the imported WIT `store` interface.
//!
//! Every import is a synchronous call, so every future here is ready on its first
//! poll. What the host reports in `capabilities()` decides which imports are used:
//! - `batch` false: the `*-many` methods run one call per key (through
//!   [`PerKey`]), so the host's `*-many` functions are never called; a batch of
//!   one key is a single-key call either way;
//! - `claim` false: `claim`, `claim_many` and `release` fail with `unsupported`
//!   without calling the host (the guard then answers `store-unavailable`);
//! - `ttl` false: `remember` always passes no TTL.
//! - `leases.supported()` false (1.1.0): no renewals and unfenced commits, the 1.0
//!   behaviour; true: every batch step goes through `leases.settle`.

use std::cell::OnceCell;
use std::time::Duration;

use bq_dedupe::store::{KeyStore, PerKey, settle_with_batch_remember};
use bq_dedupe::{
    Capabilities, Claim, ClaimToken, Clock, Guard, Settled, Settlement, Store, StoreError,
    StoreResult,
};

use crate::bindings::babelqueue::idempotency::leases;
use crate::bindings::babelqueue::idempotency::store as host;
use crate::bindings::babelqueue::idempotency::types as wit;
use crate::convert::millis;

/// The host's store: for the duration of one export call (the free functions),
/// or for the life of a `consumer.guard` resource.
#[derive(Default)]
pub struct HostStore {
    /// `store.capabilities()`: for a free function asked at most once per export
    /// call, and only when the call reaches the store; for a resource, once.
    caps: OnceCell<wit::Capabilities>,
    /// `leases.supported()`, asked at most once per export call (or resource).
    leases: OnceCell<bool>,
}

/// The host's clock (`leases.now-ms`), read only when a batch has claims to keep
/// alive or work waiting to be written.
pub struct HostClock;

/// A guard over the host's store, reading time from the host's clock.
pub fn with_host_clock(guard: Guard<HostStore>) -> Guard<HostStore> {
    guard.with_clock(std::sync::Arc::new(HostClock))
}

impl Clock for HostClock {
    fn now_ms(&self) -> u64 {
        leases::now_ms()
    }
}

/// The store for one export call: capabilities read when first needed.
pub fn per_call() -> HostStore {
    HostStore::default()
}

/// A store whose capabilities (and `leases.supported`) are read now, once, for
/// the life of a `consumer.guard` resource.
pub fn read_once() -> HostStore {
    HostStore {
        caps: OnceCell::from(host::capabilities()),
        leases: OnceCell::from(leases::supported()),
    }
}

impl HostStore {
    fn caps(&self) -> wit::Capabilities {
        *self.caps.get_or_init(host::capabilities)
    }

    fn leases(&self) -> bool {
        *self.leases.get_or_init(leases::supported)
    }

    fn ttl_ms(&self, ttl: Option<Duration>) -> Option<u64> {
        ttl.filter(|_| self.caps().ttl).map(millis)
    }

    /// The single-key imports answer this call: the host has no batch calls, or
    /// there is one key (one delivery makes the calls a 1.0 guest made, which
    /// hosts have been written and tested against).
    fn one_by_one(&self, keys: &[&str]) -> bool {
        keys.len() == 1 || !self.caps().batch
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

/// The host's single-key imports, for [`PerKey`] when the host has no batch
/// calls (`capabilities.batch` false).
struct OneByOne<'a>(&'a HostStore);

impl KeyStore for OneByOne<'_> {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        Ok(host::seen(key)?)
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        Ok(host::remember(key, self.0.ttl_ms(ttl))?)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        Ok(host::forget(key)?)
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.0.check_claim()?;
        Ok(host::claim(key, millis(lease))?.into())
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.0.check_claim()?;
        Ok(host::release(key, &token.0)?)
    }
}

impl Store for HostStore {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if self.one_by_one(keys) {
            return PerKey(OneByOne(self)).seen_many(keys).await;
        }
        Ok(host::seen_many(keys)?)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if self.one_by_one(keys) {
            return PerKey(OneByOne(self)).remember_many(keys, ttl).await;
        }
        Ok(host::remember_many(keys, self.ttl_ms(ttl))?)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        Ok(host::forget(key)?)
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps: Capabilities = self.caps().into();
        caps.lease = caps.claim && self.leases();
        caps
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.check_claim()?;
        if self.one_by_one(keys) {
            return PerKey(OneByOne(self)).claim_many(keys, lease).await;
        }
        let answers = host::claim_many(keys, millis(lease))?;
        Ok(answers.into_iter().map(Into::into).collect())
    }

    /// `leases.settle` where the host has leases; else (a 1.1.0 host) the
    /// releases one `release` each, then the remembers as one `remember-many`
    /// (the guard asks a host without leases for no renewal or fence).
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        if !self.capabilities().lease {
            return settle_with_batch_remember(self, OneByOne(self), step).await;
        }
        let remember: Vec<(&str, Option<&str>)> = step
            .remember
            .iter()
            .map(|(key, token)| (*key, token.map(|t| t.0.as_str())))
            .collect();
        let settled = leases::settle(
            &remember,
            self.ttl_ms(step.ttl),
            &token_pairs(step.release),
            &token_pairs(step.renew),
            millis(step.lease),
        )?;
        Ok(Settled {
            kept: settled.kept,
            renewed: settled.renewed,
            release_error: settled.release_error.map(Into::into),
        })
    }
}

/// (key, token) pairs as the WIT passes them.
fn token_pairs<'a>(claims: &[(&'a str, &'a ClaimToken)]) -> Vec<(&'a str, &'a str)> {
    claims.iter().map(|(k, t)| (*k, t.0.as_str())).collect()
}
