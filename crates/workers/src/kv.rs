//! `KvStore`: a best-effort seen-set in Workers KV.
//!
//! KV is eventually consistent (another location may not see a write for 60 s or
//! more, and negative lookups are cached) and has no atomic operations, so it
//! cannot claim: two consumers can both see an id as new and both run it. Use it
//! where an occasional second run is acceptable; use the Durable Object store
//! where it is not.

use std::time::Duration;

use bq_dedupe::{Store, StoreError, StoreResult, store::Capabilities, store::StoreErrorKind};
use futures_util::future::try_join_all;
use worker::kv::KvStore as KvNamespace;

use crate::round_trips::RoundTrips;
use crate::shard::sha256_hex;

/// KV refuses an `expirationTtl` under 60 seconds.
pub const MIN_TTL: Duration = Duration::from_secs(60);
/// KV's longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// KV's bulk get takes at most this many keys.
const BULK_GET_MAX: usize = 100;

/// The seen-set in a KV namespace: `seen` is a (bulk) get, `remember` a put with
/// `expiration_ttl`, `forget` a delete.
#[derive(Debug)]
pub struct KvStore {
    kv: KvNamespace,
    round_trips: RoundTrips,
}

impl KvStore {
    /// The seen-set in the namespace `kv`.
    pub fn new(kv: KvNamespace) -> Self {
        KvStore {
            kv,
            round_trips: RoundTrips::new(),
        }
    }

    /// Counts this store's requests into `counter`.
    pub fn with_round_trips(mut self, counter: RoundTrips) -> Self {
        self.round_trips = counter;
        self
    }

    /// The counter of this store's requests (see [`Self::with_round_trips`]).
    pub fn round_trips(&self) -> &RoundTrips {
        &self.round_trips
    }
}

/// Checks a TTL against KV's minimum, with an error that says what to change.
pub fn check_ttl(ttl: Option<Duration>) -> StoreResult<()> {
    match ttl {
        Some(ttl) if ttl < MIN_TTL => Err(StoreError::new(
            StoreErrorKind::Invalid,
            format!(
                "Workers KV cannot expire a key sooner than {} s (expirationTtl minimum); \
                 the dedupe TTL is {} s: raise it or use the Durable Object store",
                MIN_TTL.as_secs(),
                ttl.as_secs_f64()
            ),
        )),
        _ => Ok(()),
    }
}

/// Names of keys KV cannot hold as they are.
const HASHED_PREFIX: &str = "bq-dedupe:sha256:";

/// The KV name and stored value of a store key. A key KV would refuse (over 512
/// bytes, empty, `.` or `..`) or one that looks like a hashed name is named by its
/// SHA-256 and stored as its value, so a read compares the exact key.
fn kv_entry(key: &str) -> (String, &str) {
    let refused = key.len() > MAX_KEY_BYTES || matches!(key, "" | "." | "..");
    if refused || key.starts_with(HASHED_PREFIX) {
        (format!("{HASHED_PREFIX}{}", sha256_hex(key)), key)
    } else {
        (key.to_string(), "1")
    }
}

fn kv_error(op: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(format!("Workers KV {op}: {e}"))
}

impl KvStore {
    /// Whether the entry `name` holds `expected` (one get).
    async fn holds(&self, name: &str, expected: &str) -> StoreResult<bool> {
        self.round_trips.add(1);
        self.round_trips.add_rows(1, 0);
        let value = self.kv.get(name).text().await;
        Ok(value.map_err(|e| kv_error("get", e))?.as_deref() == Some(expected))
    }

    async fn put(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        let (name, value) = kv_entry(key);
        let mut put = self.kv.put(&name, value).map_err(|e| kv_error("put", e))?;
        if let Some(ttl) = ttl {
            put = put.expiration_ttl(ttl.as_secs());
        }
        self.round_trips.add(1);
        self.round_trips.add_rows(0, 1);
        put.execute().await.map_err(|e| kv_error("put", e))
    }
}

impl Store for KvStore {
    async fn forget(&self, key: &str) -> StoreResult<()> {
        let (name, _) = kv_entry(key);
        self.round_trips.add(1);
        self.round_trips.add_rows(0, 1);
        self.kv
            .delete(&name)
            .await
            .map_err(|e| kv_error("delete", e))
    }

    fn kind(&self) -> &'static str {
        "kv"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: false,
            ttl: true,
            renew: false,
        }
    }

    /// One get for one key, else one bulk get per 100 keys.
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if let [key] = keys {
            let (name, expected) = kv_entry(key);
            return Ok(vec![self.holds(&name, expected).await?]);
        }
        let entries: Vec<(String, &str)> = keys.iter().map(|key| kv_entry(key)).collect();
        let mut seen = Vec::with_capacity(keys.len());
        for chunk in entries.chunks(BULK_GET_MAX) {
            let names: Vec<&str> = chunk.iter().map(|(name, _)| name.as_str()).collect();
            self.round_trips.add(1);
            self.round_trips.add_rows(chunk.len() as u64, 0);
            let values = self
                .kv
                .get_bulk(&names)
                .text()
                .await
                .map_err(|e| kv_error("bulk get", e))?;
            for (name, expected) in chunk {
                seen.push(match values.get(name) {
                    Some(value) => value.as_deref() == Some(*expected),
                    // Left out of the answer (workerd's bulk get drops
                    // `__proto__`: a trial's id ran twice): asked alone.
                    None => self.holds(name, expected).await?,
                });
            }
        }
        Ok(seen)
    }

    /// KV has no bulk write in the Workers binding: the puts go out
    /// concurrently, fingerprint companions first (a put that fails part-way
    /// never leaves an id recorded without them, which read as another
    /// payload: `Guard::remember_list`'s order, kept here).
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        check_ttl(ttl)?;
        let (companions, ids): (Vec<&str>, Vec<&str>) = (keys.iter())
            .partition(|key| key.starts_with(bq_dedupe::fingerprint::COMPANION_PREFIX));
        for keys in [companions, ids].iter().filter(|keys| !keys.is_empty()) {
            try_join_all(keys.iter().map(|key| self.put(key, ttl))).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_stored_as_is_and_long_ones_by_hash() {
        assert_eq!(kv_entry("id-1"), ("id-1".to_string(), "1"));
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        let (name, value) = kv_entry(&long);
        assert!(name.len() <= MAX_KEY_BYTES && name.starts_with("bq-dedupe:sha256:"));
        assert_eq!(value, long, "the exact key is kept for comparison");
        let edge = "é".repeat(MAX_KEY_BYTES / 2); // 512 bytes exactly
        assert_eq!(kv_entry(&edge).0, edge);
    }

    #[test]
    fn names_kv_refuses_or_that_mimic_a_hash_are_hashed() {
        for key in ["", ".", ".."] {
            let (name, value) = kv_entry(key);
            assert!(name.starts_with(HASHED_PREFIX), "{key:?}");
            assert_eq!(value, key);
        }
        let mimic = format!("{HASHED_PREFIX}{}", sha256_hex(&"x".repeat(600)));
        assert_ne!(
            kv_entry(&mimic).0,
            mimic,
            "a crafted id cannot take a hashed slot"
        );
        assert_eq!(kv_entry("...").0, "...");
    }

    #[test]
    fn ttl_under_sixty_seconds_is_a_clear_invalid_error() {
        let err = check_ttl(Some(Duration::from_secs(5))).unwrap_err();
        assert_eq!(err.kind, StoreErrorKind::Invalid);
        assert!(err.message.contains("60 s"), "{}", err.message);
        assert!(check_ttl(Some(MIN_TTL)).is_ok());
        assert!(check_ttl(None).is_ok());
    }
}
