//! The component's imported `store`, served by a real backend (`AnyStore`).

use std::time::Duration;

use bq_dedupe::{Claim, ClaimToken, Store, StoreErrorKind, block_on_ready};

use crate::runtime::HostState;
use crate::wit::dedupe::babelqueue::idempotency::{store, types};

type WitResult<T> = Result<T, types::StoreError>;

fn to_wit(e: bq_dedupe::StoreError) -> types::StoreError {
    let kind = match e.kind {
        StoreErrorKind::Unavailable => types::StoreErrorKind::Unavailable,
        StoreErrorKind::Unsupported => types::StoreErrorKind::Unsupported,
        StoreErrorKind::Invalid => types::StoreErrorKind::Invalid,
        StoreErrorKind::Internal => types::StoreErrorKind::Internal,
    };
    types::StoreError {
        kind,
        message: e.message,
    }
}

fn claim_to_wit(c: Claim) -> types::Claim {
    match c {
        Claim::Acquired(ClaimToken(token)) => types::Claim::Acquired(token),
        Claim::Seen => types::Claim::Seen,
        Claim::Held => types::Claim::Held,
    }
}

/// Runs a store future (ready at once: the backends are synchronous).
fn ready<T>(f: impl Future<Output = bq_dedupe::StoreResult<T>>) -> WitResult<T> {
    match block_on_ready(f) {
        Ok(r) => r.map_err(to_wit),
        Err(e) => Err(types::StoreError {
            kind: types::StoreErrorKind::Internal,
            message: e.to_string(),
        }),
    }
}

fn ms(v: Option<u64>) -> Option<Duration> {
    v.map(Duration::from_millis)
}

fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

impl types::Host for HostState {}

impl store::Host for HostState {
    fn capabilities(&mut self) -> types::Capabilities {
        let caps = self.store.capabilities();
        types::Capabilities {
            batch: true,
            claim: caps.claim,
            ttl: caps.ttl,
        }
    }
    fn seen(&mut self, key: String) -> WitResult<bool> {
        ready(self.store.seen(&key))
    }
    fn remember(&mut self, key: String, ttl_ms: Option<u64>) -> WitResult<()> {
        ready(self.store.remember(&key, ms(ttl_ms)))
    }
    fn forget(&mut self, key: String) -> WitResult<()> {
        ready(self.store.forget(&key))
    }
    fn seen_many(&mut self, keys: Vec<String>) -> WitResult<Vec<bool>> {
        ready(self.store.seen_many(&strs(&keys)))
    }
    fn remember_many(&mut self, keys: Vec<String>, ttl_ms: Option<u64>) -> WitResult<()> {
        ready(self.store.remember_many(&strs(&keys), ms(ttl_ms)))
    }
    fn claim(&mut self, key: String, lease_ms: u64) -> WitResult<types::Claim> {
        ready(self.store.claim(&key, Duration::from_millis(lease_ms))).map(claim_to_wit)
    }
    fn claim_many(&mut self, keys: Vec<String>, lease_ms: u64) -> WitResult<Vec<types::Claim>> {
        let claims = ready(
            self.store
                .claim_many(&strs(&keys), Duration::from_millis(lease_ms)),
        )?;
        Ok(claims.into_iter().map(claim_to_wit).collect())
    }
    fn release(&mut self, key: String, token: String) -> WitResult<()> {
        ready(self.store.release(&key, &ClaimToken(token)))
    }
    fn commit_many(
        &mut self,
        done: Vec<String>,
        ttl_ms: Option<u64>,
        release: Vec<(String, String)>,
    ) -> WitResult<()> {
        let tokens: Vec<ClaimToken> = release.iter().map(|(_, t)| ClaimToken(t.clone())).collect();
        let release: Vec<(&str, &ClaimToken)> = release
            .iter()
            .map(|(k, _)| k.as_str())
            .zip(&tokens)
            .collect();
        ready(self.store.commit_many(&strs(&done), ms(ttl_ms), &release))
    }
}
