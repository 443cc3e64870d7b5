//! A store object's Rust store seen as the queue consumer on the same settings
//! sees it: keys under `DEDUPE_KEY_PREFIX`, and writes that give no window kept
//! for `DEDUPE_TTL_SECONDS`. Without it `dedupe(.., new DurableObjectStore(env))`
//! ran again the ids `dedupeQueue` had run under a prefix (and the other way
//! round), `forget` missed them, and its ids were kept for ever (a trial).

use std::time::Duration;

use bq_dedupe_workers::WorkersStore;
use bq_dedupe_workers::bq_dedupe::KeySpace;
use bq_dedupe_workers::bq_dedupe::store::{
    Capabilities, Claim, Peeked, Settled, Settlement, Store, StoreResult,
};

pub(crate) struct Keyed {
    pub(crate) store: WorkersStore,
    /// The consumer's key space: `DEDUPE_KEY_PREFIX`.
    pub(crate) space: KeySpace,
    /// `DEDUPE_TTL_SECONDS` (`None`: forever).
    pub(crate) ttl: Option<Duration>,
}

impl Keyed {
    /// The key the consumer keeps for the id behind `key`, the caller's
    /// guard's key for it (the id, escaped if it starts with U+001F).
    fn key(&self, key: &str) -> String {
        let id = KeySpace::new().id_of(key).unwrap_or(key);
        self.space.key(id).into_owned()
    }

    fn keys(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|key| self.key(key)).collect()
    }

    fn keys_of<T>(&self, pairs: &[(&str, T)]) -> Vec<String> {
        pairs.iter().map(|(key, _)| self.key(key)).collect()
    }

    fn ttl(&self, ttl: Option<Duration>) -> Option<Duration> {
        ttl.or(self.ttl)
    }
}

fn refs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

/// `(key, value)` pairs with their keys mapped.
fn mapped<'a, T: Copy>(pairs: &[(&str, T)], keys: &'a [String]) -> Vec<(&'a str, T)> {
    keys.iter()
        .map(String::as_str)
        .zip(pairs.iter().map(|(_, value)| *value))
        .collect()
}

impl Store for Keyed {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.store.seen_many(&refs(&self.keys(keys))).await
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let keys = self.keys(keys);
        self.store.remember_many(&refs(&keys), self.ttl(ttl)).await
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.store.forget(&self.key(key)).await
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    fn kind(&self) -> &'static str {
        self.store.kind()
    }

    fn shared_format(&self) -> Option<&'static str> {
        self.store.shared_format()
    }

    fn fences_commits(&self) -> bool {
        self.store.fences_commits()
    }

    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        self.store.peek_many(&refs(&self.keys(keys))).await
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.store.claim_many(&refs(&self.keys(keys)), lease).await
    }

    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let remember = self.keys_of(step.remember);
        let release = self.keys_of(step.release);
        let renew = self.keys_of(step.renew);
        self.store
            .settle(&Settlement {
                remember: &mapped(step.remember, &remember),
                release: &mapped(step.release, &release),
                renew: &mapped(step.renew, &renew),
                ttl: self.ttl(step.ttl),
                lease: step.lease,
            })
            .await
    }
}
