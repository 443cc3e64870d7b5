//! The reference in-memory store: process-local, optional TTL, optional capacity
//! bound, and compact (about 32 bytes per UUID id instead of ~100 for a
//! `HashSet<String>`).
//!
//! Layout: ids live in insertion order in a dense `Vec<[u8; 16]>` of slots. A
//! canonical lowercase UUID (the usual `meta.id`) is stored as its 16 raw bytes;
//! any other id is stored verbatim in a byte arena and its slot holds
//! `(offset, len)`. A parallel `Vec<u32>` holds a kind bit and the expiry in whole
//! seconds. A `HashTable<u32>` of slot numbers is the index. Forgotten slots become
//! tombstones and are compacted away in bulk; the oldest slot goes first when the
//! capacity bound is reached.

mod table;
mod uuid;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use foldhash::fast::RandomState;

use super::record::{ClaimAnswer, Record, Rules};
use super::{
    Capabilities, Claim, ClaimToken, Peeked, Settled, Settlement, Store, StoreError, StoreResult,
};
use crate::clock::Clock;
use table::{NEVER, Table};

/// One remembered id, as listed by [`InMemoryStore::entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEntry {
    /// The store key.
    pub key: String,
    /// When the entry stops counting as seen (ms since the Unix epoch), if ever.
    pub expires_at_ms: Option<u64>,
}

/// The fewest entries held before a write that can expire sweeps.
const SWEEP_AT_LEAST: usize = 4096;

struct Inner {
    table: Table,
    /// How many entries held (live or expired) make the next TTL'd write sweep.
    sweep_at: usize,
    /// In-flight claims: few at a time, so a plain map.
    claims: hashbrown::HashMap<String, (u64, Option<u64>), RandomState>,
    next_token: u64,
}

/// Process-local reference [`Store`]: for tests and single-process consumers.
///
/// Not shared between processes and not persistent. TTLs need a clock (the system
/// clock natively; on `wasm32-unknown-unknown` pass one with [`Self::with_clock`]);
/// expiry is checked on every read, never left to a sweep, with one-second
/// granularity (never early). With [`Self::with_capacity_limit`] the oldest entry is
/// evicted to make room, which means its redelivery would run again.
pub struct InMemoryStore {
    inner: Mutex<Inner>,
    clock: Option<Arc<dyn Clock>>,
    capacity: Option<usize>,
    /// Set once any entry or claim can expire; until then reads skip the clock.
    timed: AtomicBool,
}

impl std::fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("len", &self.len())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Default for InMemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryStore {
    /// An empty store using the system clock (no clock on `wasm32-unknown-unknown`).
    pub fn new() -> Self {
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        let clock: Option<Arc<dyn Clock>> = Some(Arc::new(crate::clock::SystemClock));
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        let clock: Option<Arc<dyn Clock>> = None;
        Self::build(clock)
    }

    /// An empty store reading time from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::build(Some(clock))
    }

    fn build(clock: Option<Arc<dyn Clock>>) -> Self {
        let epoch_ms = clock.as_ref().map_or(0, |c| c.now_ms());
        InMemoryStore {
            inner: Mutex::new(Inner {
                table: Table::new(epoch_ms),
                sweep_at: SWEEP_AT_LEAST,
                claims: hashbrown::HashMap::with_hasher(RandomState::default()),
                next_token: 0,
            }),
            clock,
            capacity: None,
            timed: AtomicBool::new(false),
        }
    }

    /// Makes room for `ids` ids up front, so filling the store to that size never
    /// grows (rehashes, copies) its table. A hint: more ids still fit.
    pub fn with_reserved(self, ids: usize) -> Self {
        if let Ok(mut inner) = self.inner.lock() {
            inner.table.reserve(ids);
        }
        self
    }

    /// Keeps at most `max_entries` ids, evicting the oldest first.
    pub fn with_capacity_limit(mut self, max_entries: usize) -> Self {
        self.capacity = Some(max_entries.max(1));
        self
    }

    fn now(&self) -> Option<u64> {
        self.clock.as_ref().map(|c| c.now_ms())
    }

    /// The time for checking expiry: `None` while nothing can have expired.
    fn now_if_timed(&self) -> Option<u64> {
        if self.timed.load(Ordering::Relaxed) {
            self.now()
        } else {
            None
        }
    }

    fn lock(&self) -> StoreResult<MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| StoreError::internal("in-memory store lock poisoned by a panic"))
    }

    /// The expiry field for `ttl`; the clock is read only for a TTL. A write
    /// that can expire also sweeps the expired entries out once the table has
    /// doubled since the last sweep (amortised, so memory follows the ids live
    /// within a TTL, not every id ever seen).
    fn expiry(&self, inner: &mut Inner, ttl: Option<Duration>) -> StoreResult<u32> {
        let Some(ttl) = ttl else { return Ok(NEVER) };
        match self.now() {
            Some(now) => {
                self.timed.store(true, Ordering::Relaxed);
                if inner.table.held() >= inner.sweep_at {
                    inner.table.purge_expired(now);
                    inner.sweep_at = SWEEP_AT_LEAST.max(2 * inner.table.held());
                }
                Ok(inner.table.expiry_secs(now, ttl))
            }
            None => Err(StoreError::unsupported(
                "a TTL needs a clock: build the store with InMemoryStore::with_clock",
            )),
        }
    }

    /// Ids currently remembered (expired ones are not counted once read or purged).
    pub fn len(&self) -> usize {
        self.lock().map_or(0, |inner| inner.table.live)
    }

    /// Entries held in memory: the live ids and the expired ones not swept yet
    /// (a write with a TTL sweeps them once the table has doubled).
    pub fn held(&self) -> usize {
        self.lock().map_or(0, |inner| inner.table.held())
    }

    /// No id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live entries in insertion order (for inspection, e.g. the playground).
    pub fn entries(&self) -> Vec<StoreEntry> {
        let now = self.now();
        self.lock()
            .map(|inner| inner.table.entries(now))
            .unwrap_or_default()
    }

    /// Removes every expired entry now, returning how many went. Optional: reads
    /// never return an expired entry whether or not this runs.
    pub fn purge_expired(&self) -> usize {
        match (self.now(), self.lock()) {
            (Some(now), Ok(mut inner)) => inner.table.purge_expired(now),
            _ => 0,
        }
    }

    /// Keys with a live claim, for inspection.
    pub fn claimed(&self) -> Vec<String> {
        let now = self.now();
        self.lock()
            .map(|inner| {
                inner
                    .claims
                    .iter()
                    .filter(|(_, (_, until))| lease_live(*until, now))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Remembering or forgetting ends any claim on the key (no hashing when there
/// are no claims, as in plain mode).
fn end_claim(inner: &mut Inner, key: &str) {
    if !inner.claims.is_empty() {
        inner.claims.remove(key);
    }
}

fn lease_live(until: Option<u64>, now: Option<u64>) -> bool {
    match (until, now) {
        (Some(until), Some(now)) => now < until,
        _ => true,
    }
}

// Every call reads the clock once it holds the lock: a time read before it
// could be older than a call that went first and swept the key (a claim then
// granted over a done record, with a lease counted from before it waited).
impl Store for InMemoryStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        let now = self.now_if_timed();
        inner.table.begin_lookups();
        Ok(inner.table.seen(key, now))
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        let mut inner = self.lock()?;
        let expiry = self.expiry(&mut inner, ttl)?;
        end_claim(&mut inner, key);
        inner.table.remember(key, expiry, self.capacity)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        let mut inner = self.lock()?;
        inner.claims.remove(key);
        inner.table.forget(key);
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: true,
            ttl: self.clock.is_some(),
            renew: true,
        }
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let mut inner = self.lock()?;
        let now = self.now_if_timed();
        Ok(inner.table.seen_batch(keys, now))
    }

    /// Done, or how long the live claim has left (`ZERO`: free; a claim without
    /// a clock never runs out: `None`).
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let mut inner = self.lock()?;
        let now = self.now();
        let seen = inner.table.seen_batch(keys, now);
        Ok(keys
            .iter()
            .zip(seen)
            .map(|(key, seen)| match seen {
                true => Peeked::Done,
                false => read_record(&mut inner, key, now, true).peeked(now),
            })
            .collect())
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let mut inner = self.lock()?;
        let expiry = self.expiry(&mut inner, ttl)?;
        inner.table.reserve(keys.len());
        for key in keys {
            end_claim(&mut inner, key);
            inner.table.remember(key, expiry, self.capacity)?;
        }
        Ok(())
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        let mut inner = self.lock()?;
        let now = self.now();
        inner.table.begin_lookups();
        Ok(self.claim_locked(&mut inner, key, (now, false), lease))
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        let mut inner = self.lock()?;
        // Time does not matter: a lapsed claim of this token goes as a live one does.
        self.release_locked(&mut inner, key, token, None);
        Ok(())
    }

    /// Under one lock: the whole batch is claimed atomically, and nothing can fail
    /// halfway.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let mut inner = self.lock()?;
        let now = self.now();
        // The seen-set first, for the whole batch (hashed, then probed back to
        // back); the claims only for the keys it has not seen.
        let seen = inner.table.seen_batch(keys, now);
        Ok(keys
            .iter()
            .zip(seen)
            .map(|(key, seen)| match seen {
                true => Claim::Seen,
                false => self.claim_locked(&mut inner, key, (now, true), lease),
            })
            .collect())
    }

    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        let now = self.now();
        Ok(self.renew_locked(&mut inner, key, token, now, lease))
    }

    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        let mut inner = self.lock()?;
        let now = self.now();
        let expiry = self.expiry(&mut inner, ttl)?;
        self.remember_fenced_locked(&mut inner, key, Some(token), expiry, now)
    }

    /// Under one lock, so a batch step is all-or-nothing for other consumers.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        // Time matters to renewals and fenced remembers only.
        let fenced = step.remember.iter().any(|(_, token)| token.is_some());
        let mut inner = self.lock()?;
        let now = match step.renew.is_empty() && !fenced {
            true => None,
            false => self.now(),
        };
        inner.table.reserve(step.remember.len());
        // Releases first: they cannot fail, and a failed remember must not skip them.
        for (key, token) in step.release {
            self.release_locked(&mut inner, key, token, now);
        }
        let renewed = step
            .renew
            .iter()
            .map(|(key, token)| self.renew_locked(&mut inner, key, token, now, step.lease))
            .collect();
        let expiry = match step.remember {
            [] => NEVER,
            _ => self.expiry(&mut inner, step.ttl)?,
        };
        let kept = step
            .remember
            .iter()
            .map(|(key, token)| self.remember_fenced_locked(&mut inner, key, *token, expiry, now))
            .collect::<StoreResult<Vec<bool>>>()?;
        Ok(Settled {
            kept,
            renewed,
            release_error: None,
        })
    }
}

impl InMemoryStore {
    /// The in-memory store's rules: a lapsed claim is kept until taken over (the
    /// map keeps it); a done record keeps no token (the compact table has no
    /// room, and no call here is ever re-sent after a lost reply).
    pub const RULES: Rules = Rules {
        lapsed_claim_kept: true,
        done_keeps_token: false,
        claims_have_owners: true,
        remember_resets_expiry: true,
        lapsed_claim_swept: false,
        claim_given_back: false,
    };

    /// Applies `op` (one of [`Record`]'s rules) to `key`'s record and writes back
    /// what changed: the claim in the map, a done record in the table (with
    /// `expiry`). `unseen`: the caller has just looked the key up and not found
    /// it done, so it is not looked up again.
    fn apply<R>(
        &self,
        inner: &mut Inner,
        key: &str,
        (now, unseen): (Option<u64>, bool),
        expiry: u32,
        op: impl FnOnce(&mut Record<u64>) -> R,
    ) -> StoreResult<R> {
        let before = read_record(inner, key, now, unseen);
        let mut after = before.clone();
        let answer = op(&mut after);
        self.write_back(inner, key, &before, after, expiry)?;
        Ok(answer)
    }

    /// Stores `after` where it differs from `before`: the claim in the map, a
    /// done record in the table (with `expiry`). Not generic, so the wasm
    /// builds keep one copy of it.
    fn write_back(
        &self,
        inner: &mut Inner,
        key: &str,
        before: &Record<u64>,
        after: Record<u64>,
        expiry: u32,
    ) -> StoreResult<()> {
        if after == *before {
            return Ok(());
        }
        match after {
            Record::Free => {
                inner.claims.remove(key);
            }
            Record::Claimed { token, until } => {
                self.timed.store(true, Ordering::Relaxed);
                // A claim that was there is updated in place; a new one is
                // inserted without looking the key up a second time.
                let there = match before {
                    Record::Claimed { .. } => inner.claims.get_mut(key),
                    _ => None,
                };
                match there {
                    Some(claim) => *claim = (token, until),
                    None => {
                        inner.claims.insert(key.to_owned(), (token, until));
                    }
                }
            }
            Record::Done { .. } => {
                end_claim(inner, key);
                inner.table.remember(key, expiry, self.capacity)?;
            }
        }
        Ok(())
    }

    /// Remembers `key`: plainly without a token; with one, fenced (see
    /// [`Store::remember_fenced`]). Answers whether the claim was still ours.
    fn remember_fenced_locked(
        &self,
        inner: &mut Inner,
        key: &str,
        token: Option<&ClaimToken>,
        expiry: u32,
        now: Option<u64>,
    ) -> StoreResult<bool> {
        let Some(token) = token else {
            end_claim(inner, key);
            inner.table.remember(key, expiry, self.capacity)?;
            return Ok(true);
        };
        let token = token_number(token);
        self.apply(inner, key, (now, false), expiry, |r| {
            r.remember_fenced(Self::RULES, now, &token, None)
        })
    }

    /// Claims `key` (see [`Record::claim`]); `unseen` as in [`Self::apply`].
    fn claim_locked(
        &self,
        inner: &mut Inner,
        key: &str,
        (now, unseen): (Option<u64>, bool),
        lease: Duration,
    ) -> Claim {
        let token = inner.next_token + 1;
        let until = now.map(|n| n.saturating_add(lease.as_millis() as u64));
        let answer = self
            .apply(inner, key, (now, unseen), NEVER, |r| {
                r.claim(Self::RULES, now, token, until)
            })
            .unwrap_or(ClaimAnswer::Held); // a claim writes no done record: no error
        if answer != ClaimAnswer::Acquired {
            return answer.with_token(ClaimToken(String::new()));
        }
        inner.next_token = token;
        answer.with_token(ClaimToken(token.to_string()))
    }

    /// Extends the claim if `token` still owns it (see [`Record::renew`]).
    fn renew_locked(
        &self,
        inner: &mut Inner,
        key: &str,
        token: &ClaimToken,
        now: Option<u64>,
        lease: Duration,
    ) -> bool {
        let token = token_number(token);
        let until = now.map(|n| n.saturating_add(lease.as_millis() as u64));
        self.apply(inner, key, (now, false), NEVER, |r| {
            r.renew(Self::RULES, now, &token, until)
        })
        .unwrap_or(false)
    }

    /// Only the owner's token releases (see [`Record::release`]).
    fn release_locked(&self, inner: &mut Inner, key: &str, token: &ClaimToken, now: Option<u64>) {
        let token = token_number(token);
        let _ = self.apply(inner, key, (now, true), NEVER, |r| {
            r.release(Self::RULES, now, &token)
        });
    }
}

/// The key's record as the model sees it: its claim, else done or free.
/// `unseen`: the caller has just looked the key up and not found it done.
fn read_record(inner: &mut Inner, key: &str, now: Option<u64>, unseen: bool) -> Record<u64> {
    match inner.claims.get(key) {
        Some(&(token, until)) => Record::Claimed { token, until },
        // A done record here is live (`seen` drops an expired one).
        None if !unseen && inner.table.seen(key, now) => Record::Done {
            until: None,
            by: None,
        },
        None => Record::Free,
    }
}

/// The number this store issued as `token`, or 0 (never issued, so it owns
/// nothing) for anything but a canonical decimal.
fn token_number(token: &ClaimToken) -> u64 {
    let s = token.0.as_bytes();
    // Exactly the canonical decimal form: digits only, no sign, no leading zero.
    let canonical = !s.is_empty()
        && s.len() <= 20
        && s.iter().all(u8::is_ascii_digit)
        && (s[0] != b'0' || s.len() == 1);
    match canonical {
        true => token.0.parse().unwrap_or(0),
        false => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::{InMemoryStore, token_number};
    use crate::block_on_ready;
    use crate::store::{Claim, ClaimToken, Settlement, Store};
    use std::time::Duration;

    fn id(n: u64) -> String {
        // Canonical UUIDs (held as 16 bytes) and, every third, plain text.
        match n % 3 {
            0 => format!("order-{n}"),
            _ => format!("{:08x}-0000-4000-8000-{:012x}", n >> 16, n),
        }
    }

    #[test]
    fn every_id_stays_findable_across_index_growth_and_forgets() {
        let store = InMemoryStore::new();
        let ids: Vec<String> = (0..60_000).map(id).collect();
        for (i, chunk) in ids.chunks(100).enumerate() {
            let keys: Vec<&str> = chunk.iter().map(String::as_str).collect();
            if i % 2 == 0 {
                block_on_ready(store.remember_many(&keys, None))
                    .unwrap()
                    .unwrap();
            } else {
                for key in keys {
                    block_on_ready(store.remember(key, None)).unwrap().unwrap();
                }
            }
        }
        for key in ids.iter().step_by(7) {
            block_on_ready(store.forget(key)).unwrap().unwrap();
        }
        let forgotten = ids.len().div_ceil(7);
        assert_eq!(store.len(), ids.len() - forgotten);
        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        let seen = block_on_ready(store.seen_many(&keys)).unwrap().unwrap();
        for (n, (key, seen)) in keys.iter().zip(&seen).enumerate() {
            assert_eq!(*seen, n % 7 != 0, "{key}");
            let one = block_on_ready(store.seen(key)).unwrap().unwrap();
            assert_eq!(one, n % 7 != 0, "{key}");
        }
        let never = id(1_000_001);
        assert!(!block_on_ready(store.seen(&never)).unwrap().unwrap());
    }

    #[test]
    fn a_batch_claim_answers_as_single_claims_would() {
        let lease = Duration::from_secs(60);
        let keys = ["a", "b", "a", "seen", "held", "c", "b", &id(1), &id(1)];
        let prepare = || {
            let store = InMemoryStore::new();
            block_on_ready(store.remember("seen", None))
                .unwrap()
                .unwrap();
            let held = block_on_ready(store.claim("held", lease)).unwrap().unwrap();
            assert!(matches!(held, Claim::Acquired(_)));
            store
        };
        let (batch, single) = (prepare(), prepare());
        let many = block_on_ready(batch.claim_many(&keys, lease))
            .unwrap()
            .unwrap();
        let each: Vec<Claim> = keys
            .iter()
            .map(|k| block_on_ready(single.claim(k, lease)).unwrap().unwrap())
            .collect();
        assert_eq!(many, each);
        assert!(matches!(many[0], Claim::Acquired(_)));
        assert_eq!(many[2], Claim::Held);
        assert_eq!(many[3], Claim::Seen);
        assert_eq!(many[4], Claim::Held);
        // The batch's claims settle fenced, as single ones do.
        let remember: Vec<(&str, Option<&ClaimToken>)> = keys
            .iter()
            .zip(&many)
            .filter_map(|(k, c)| match c {
                Claim::Acquired(t) => Some((*k, Some(t))),
                _ => None,
            })
            .collect();
        let step = Settlement {
            remember: &remember,
            ttl: None,
            release: &[],
            renew: &[],
            lease,
        };
        let settled = block_on_ready(batch.settle(&step)).unwrap().unwrap();
        assert_eq!(settled.kept, vec![true; remember.len()]);
        for (key, _) in &remember {
            assert!(block_on_ready(batch.seen(key)).unwrap().unwrap(), "{key}");
        }
    }

    #[test]
    fn a_token_matches_only_its_own_canonical_digits() {
        let token = |s: &str| ClaimToken(s.to_owned());
        assert_eq!(token_number(&token("7")), 7);
        assert_eq!(token_number(&token(&u64::MAX.to_string())), u64::MAX);
        for other in [
            "",
            "07",
            "+7",
            "7 ",
            " 7",
            "-7",
            "8",
            "7a",
            "00",
            "18446744073709551616",
        ] {
            assert_ne!(token_number(&token(other)), 7, "{other:?}");
        }
        // 0 is never issued: every non-canonical token maps to it, owning nothing.
        assert_eq!(token_number(&token("00")), 0);
    }
}
