//! The component's imported `store` and `leases`, served by a real backend
//! (`AnyStore`). Every claim granted and settled is noted in
//! [`crate::keep_alive::HeldClaims`], so a long handler's claims can be renewed.

use std::time::Duration;

use bq_dedupe::{
    Store, block_on_ready, clock::Clock, clock::SteadyClock, store::Claim, store::ClaimToken,
    store::Settlement, store::StoreErrorKind,
};

use crate::runtime::HostState;
use crate::wit::dedupe::babelqueue::idempotency::{leases, store, types};

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

/// (key, token) pairs as the core takes them.
fn pairs<'a>(
    pairs: &'a [(String, String)],
    tokens: &'a [ClaimToken],
) -> Vec<(&'a str, &'a ClaimToken)> {
    pairs.iter().map(|(k, _)| k.as_str()).zip(tokens).collect()
}

fn strs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

/// One store call, traced and timed when the run exports telemetry
/// ([`HostState::spans`]): `op` carrying `keys` keys.
fn traced<T>(
    state: &mut HostState,
    op: &'static str,
    keys: usize,
    call: impl FnOnce(&mut HostState) -> WitResult<T>,
) -> WitResult<T> {
    let Some(spans) = &state.spans else {
        return call(state);
    };
    let span = spans.store_call(op, state.store.kind(), keys);
    let result = call(state);
    if let Some(spans) = &state.spans {
        spans.end_store_call(span, result.as_ref().err().map(|e| &e.message));
    }
    result
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
        traced(self, "seen", 1, |s| ready(s.store.seen(&key)))
    }
    fn remember(&mut self, key: String, ttl_ms: Option<u64>) -> WitResult<()> {
        traced(self, "remember", 1, |s| {
            ready(s.store.remember(&key, ms(ttl_ms)))
        })
    }
    fn seen_many(&mut self, keys: Vec<String>) -> WitResult<Vec<bool>> {
        traced(self, "seen_many", keys.len(), |s| {
            ready(s.store.seen_many(&strs(&keys)))
        })
    }
    fn remember_many(&mut self, keys: Vec<String>, ttl_ms: Option<u64>) -> WitResult<()> {
        traced(self, "remember_many", keys.len(), |s| {
            ready(s.store.remember_many(&strs(&keys), ms(ttl_ms)))
        })
    }
    fn claim(&mut self, key: String, lease_ms: u64) -> WitResult<types::Claim> {
        let mut claims = self.claim_many(vec![key], lease_ms)?;
        claims.pop().ok_or_else(|| types::StoreError {
            kind: types::StoreErrorKind::Internal,
            message: "claim gave no answer".into(),
        })
    }
    fn claim_many(&mut self, keys: Vec<String>, lease_ms: u64) -> WitResult<Vec<types::Claim>> {
        let lease = Duration::from_millis(lease_ms);
        let claims = traced(self, "claim_many", keys.len(), |s| {
            ready(s.store.claim_many(&strs(&keys), lease))
        })?;
        // Only claims the store can prove are ours are kept alive: in a format
        // without owners (PHP's `1`) a renewal could extend another consumer's.
        let renewable = self.store.capabilities().renew;
        for (key, claim) in keys.iter().zip(&claims) {
            if let (Claim::Acquired(token), true) = (claim, renewable) {
                self.claims.granted(key, token, lease);
            }
        }
        Ok(claims.into_iter().map(claim_to_wit).collect())
    }
    fn release(&mut self, key: String, token: String) -> WitResult<()> {
        self.claims.ended(&key);
        traced(self, "release", 1, |s| {
            ready(s.store.release(&key, &ClaimToken(token)))
        })
    }
    fn commit_many(
        &mut self,
        done: Vec<String>,
        ttl_ms: Option<u64>,
        release: Vec<(String, String)>,
    ) -> WitResult<()> {
        let remember: Vec<(String, Option<String>)> = done.into_iter().map(|k| (k, None)).collect();
        let settled = leases::Host::settle(self, remember, ttl_ms, release, Vec::new(), 0)?;
        match settled.release_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    fn forget(&mut self, key: String) -> WitResult<()> {
        self.claims.ended(&key);
        traced(self, "forget", 1, |s| ready(s.store.forget(&key)))
    }
}

impl leases::Host for HostState {
    fn supported(&mut self) -> bool {
        self.store.capabilities().renew
    }
    fn now_ms(&mut self) -> u64 {
        // Never behind the time passed (a wall clock stepped back made a
        // lapsed claim read as in its lease: a review).
        static CLOCK: std::sync::LazyLock<SteadyClock> = std::sync::LazyLock::new(SteadyClock::new);
        CLOCK.now_ms()
    }
    fn settle(
        &mut self,
        remember: Vec<(String, Option<String>)>,
        ttl_ms: Option<u64>,
        release: Vec<(String, String)>,
        renew: Vec<(String, String)>,
        lease_ms: u64,
    ) -> WitResult<leases::Settled> {
        let tokens = |pairs: &[(String, String)]| -> Vec<ClaimToken> {
            pairs.iter().map(|(_, t)| ClaimToken(t.clone())).collect()
        };
        let (release_tokens, renew_tokens) = (tokens(&release), tokens(&renew));
        let remember_tokens: Vec<Option<ClaimToken>> = remember
            .iter()
            .map(|(_, t)| t.clone().map(ClaimToken))
            .collect();
        let remember_pairs: Vec<(&str, Option<&ClaimToken>)> = remember
            .iter()
            .map(|(k, _)| k.as_str())
            .zip(remember_tokens.iter().map(Option::as_ref))
            .collect();
        let step = Settlement {
            remember: &remember_pairs,
            ttl: ms(ttl_ms),
            release: &pairs(&release, &release_tokens),
            renew: &pairs(&renew, &renew_tokens),
            lease: Duration::from_millis(lease_ms),
        };
        let keys = remember.len() + release.len() + renew.len();
        let settled = traced(self, "settle", keys, |s| ready(s.store.settle(&step)));
        // Whatever the answer, the guest is done with these claims: one whose
        // release failed lapses with its lease, renewed no more (a failed
        // settle must not leave it renewed while later handlers run).
        for key in remember
            .iter()
            .map(|(k, _)| k)
            .chain(release.iter().map(|(k, _)| k))
        {
            self.claims.ended(key);
        }
        let settled = settled?;
        for ((key, _), renewed) in renew.iter().zip(&settled.renewed) {
            if !renewed {
                self.claims.ended(key);
            }
        }
        Ok(leases::Settled {
            kept: settled.kept,
            renewed: settled.renewed,
            release_error: settled.release_error.map(to_wit),
        })
    }
}
