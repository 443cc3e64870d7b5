//! [`HostStore`]: the core's [`Store`] over the imported WIT `store` interface.
//!
//! Every import is a synchronous call, so every future here is ready on its first
//! poll. What the host reports in `capabilities()` decides which imports are used:
//! - `batch` false: the `*-many` methods run one call per key (through
//!   [`Foreign`]), so the host's `*-many` functions are never called; a batch of
//!   one key is a single-key call either way;
//! - `claim` false: `claim`, `claim_many` and `release` fail with `unsupported`
//!   without calling the host (the guard then answers `store-unavailable`);
//! - `ttl` false: `remember` always passes no TTL.
//! - `leases.supported()` false (1.1.0): no renewals and unfenced commits, the 1.0
//!   behaviour; true: every batch step goes through `leases.settle`.

use std::cell::OnceCell;
use std::time::Duration;

use bq_dedupe::store::{Batch, Foreign, ForeignStore, KeyStore};
use bq_dedupe::{
    Guard, StoreError, StoreResult, clock::Clock, store::Capabilities, store::Claim,
    store::ClaimToken, store::Settled, store::Settlement,
};

use crate::bindings::babelqueue::idempotency::leases;
use crate::bindings::babelqueue::idempotency::store as host;
use crate::bindings::babelqueue::idempotency::types as wit;
use crate::convert::millis;

/// The host's store: for the duration of one export call (the free functions),
/// or for the life of a `consumer.guard` resource.
pub type HostStore = Foreign<HostCalls>;

/// The host's imports, with its capabilities read at most once.
#[derive(Default)]
pub struct HostCalls {
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
    Foreign::default()
}

/// A store whose capabilities (and `leases.supported`) are read now, once, for
/// the life of a `consumer.guard` resource.
pub fn read_once() -> HostStore {
    Foreign::new(HostCalls {
        caps: OnceCell::from(host::capabilities()),
        leases: OnceCell::from(leases::supported()),
    })
}

impl HostCalls {
    fn caps(&self) -> wit::Capabilities {
        *self.caps.get_or_init(host::capabilities)
    }

    fn leases(&self) -> bool {
        *self.leases.get_or_init(leases::supported)
    }

    fn ttl_ms(&self, ttl: Option<Duration>) -> Option<u64> {
        ttl.filter(|_| self.caps().ttl).map(millis)
    }
}

/// The single-key imports always; the `*-many` ones when the host has batch
/// calls and there is more than one key (one delivery makes the calls a 1.0
/// guest made, which hosts have been written and tested against).
impl KeyStore for HostCalls {
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
        let mut caps: Capabilities = self.caps().into();
        caps.renew = caps.claim && self.leases();
        caps
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        Ok(host::claim(key, millis(lease))?.into())
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.can_claim()?;
        Ok(host::release(key, &token.0)?)
    }
}

impl ForeignStore for HostCalls {
    /// `leases.settle` where the host has leases (else, a 1.1.0 host, the
    /// guard asks for no renewal or fence).
    fn has(&self, call: Batch, keys: usize) -> bool {
        match call {
            Batch::Settle => self.capabilities().renew,
            _ => keys != 1 && self.caps().batch,
        }
    }

    fn can_claim(&self) -> StoreResult<()> {
        if self.caps().claim {
            Ok(())
        } else {
            Err(StoreError::unsupported(
                "the host store does not support claims (capabilities.claim is false)",
            ))
        }
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        Ok(host::seen_many(keys)?)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        Ok(host::remember_many(keys, self.ttl_ms(ttl))?)
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let answers = host::claim_many(keys, millis(lease))?;
        Ok(answers.into_iter().map(Into::into).collect())
    }

    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
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
