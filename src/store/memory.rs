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

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::record::{ClaimAnswer, Record, Rules};
use super::{Capabilities, Claim, ClaimToken, Settled, Settlement, Store, StoreError, StoreResult};
use crate::clock::Clock;

/// Slot flag: the id is text in the arena (otherwise a UUID's 16 bytes).
const TEXT: u32 = 1 << 31;
/// Slot marker: forgotten, evicted or expired; skipped and later compacted away.
const TOMB: u32 = u32::MAX;
/// Expiry field: no expiry.
const NEVER: u32 = 0;
/// Largest expiry in seconds after the store's epoch (about 68 years).
const MAX_EXPIRY_SECS: u32 = TEXT - 2;

/// How an id is held: a UUID's bytes, or its text.
#[derive(Clone, Copy)]
enum Repr<'a> {
    Uuid([u8; 16]),
    Text(&'a [u8]),
}

impl<'a> Repr<'a> {
    fn of(key: &'a str) -> Self {
        parse_uuid(key.as_bytes()).map_or(Repr::Text(key.as_bytes()), Repr::Uuid)
    }
}

/// Parses exactly the canonical lowercase form `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
/// Anything else (upper case, braces, no hyphens) is kept verbatim as text, so two
/// ids that differ only in spelling stay two ids.
fn parse_uuid(s: &[u8]) -> Option<[u8; 16]> {
    /// Lowercase hex digit -> value; anything else -> 0xff.
    const HEX: [u8; 256] = {
        let mut t = [0xff; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    /// Where each byte's two hex digits start in the 36-character form.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let s: &[u8; 36] = s.try_into().ok()?;
    if s[8] != b'-' || s[13] != b'-' || s[18] != b'-' || s[23] != b'-' {
        return None;
    }
    let mut out = [0u8; 16];
    let mut bad = 0u8;
    for (byte, &at) in out.iter_mut().zip(&AT) {
        let (hi, lo) = (HEX[s[at] as usize], HEX[s[at + 1] as usize]);
        bad |= hi | lo;
        *byte = (hi << 4) | (lo & 0x0f);
    }
    // 0xff marks a non-hex digit; valid digits never set the high bit.
    (bad & 0x80 == 0).then_some(out)
}

fn format_uuid(b: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(HEX[(byte >> 4) as usize] as char);
        s.push(HEX[(byte & 15) as usize] as char);
    }
    s
}

/// One remembered id, as listed by [`InMemoryStore::entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreEntry {
    pub key: String,
    /// When the entry stops counting as seen (ms since the Unix epoch), if ever.
    pub expires_at_ms: Option<u64>,
}

/// The seen-set proper. Every method takes `now_ms` so time is decided by the caller.
struct Table {
    slots: Vec<[u8; 16]>,
    meta: Vec<u32>,
    arena: Vec<u8>,
    index: HashTable<u32>,
    hasher: RandomState,
    live: usize,
    dead: usize,
    /// No live slot sits before this one (where eviction starts looking).
    oldest: usize,
    /// Expiry seconds count from here (ms since the Unix epoch).
    epoch_ms: u64,
    /// The UUID keys the last `seen`/`seen_many` did not find, parsed and hashed,
    /// in call order: the `remember` that usually follows takes them from here
    /// instead of parsing and hashing each key a second time.
    memo: Vec<Parsed>,
    /// Where the next lookup in `memo` starts (remembers come in key order).
    memo_next: usize,
}

/// A UUID key as parsed once: its text (to match a later key exactly), its 16
/// bytes and its hash. Purely a function of the text, so never stale.
#[cfg_attr(target_family = "wasm", allow(dead_code))]
struct Parsed {
    text: [u8; 36],
    uuid: [u8; 16],
    hash: u64,
}

/// How far past `memo_next` a lookup looks (deliveries that failed or were not
/// remembered leave gaps).
#[cfg(not(target_family = "wasm"))]
const MEMO_SCAN: usize = 4;
/// The most keys `memo` holds.
#[cfg(not(target_family = "wasm"))]
const MEMO_MAX: usize = 4096;

impl Table {
    fn new(epoch_ms: u64) -> Self {
        Table {
            slots: Vec::new(),
            meta: Vec::new(),
            arena: Vec::new(),
            index: HashTable::new(),
            hasher: RandomState::default(),
            live: 0,
            dead: 0,
            oldest: 0,
            epoch_ms,
            memo: Vec::new(),
            memo_next: 0,
        }
    }

    /// Room for `n` more ids without growing (no rehash, no copy while filling).
    /// On wasm32 only the slot vectors are reserved: a second instance of the
    /// index's rehash code does not fit the JS package's size budget.
    fn reserve(&mut self, n: usize) {
        self.slots.reserve(n);
        self.meta.reserve(n);
        #[cfg(not(target_family = "wasm"))]
        self.grow_index(n);
    }

    /// Room in the index for `n` more ids. When it must grow, the new index is
    /// built from the slots in their (insertion) order: each id is read once,
    /// sequentially, instead of once per index bucket in hash order (a cache miss
    /// each, as a rehash in place does), and the new index is sized to at least
    /// double, so growth stays amortised O(1). Native only (see `reserve`).
    #[cfg(not(target_family = "wasm"))]
    fn grow_index(&mut self, n: usize) {
        let need = self.index.len().saturating_add(n);
        if need <= self.index.capacity() {
            return;
        }
        let mut index = HashTable::with_capacity(need.max(self.index.capacity().saturating_mul(2)));
        let Table {
            slots,
            meta,
            arena,
            hasher,
            ..
        } = &*self;
        for (i, &m) in meta.iter().enumerate() {
            if m != TOMB {
                let hash = Self::hash(hasher, Self::slot_repr(slots, meta, arena, i));
                index.insert_unique(hash, i as u32, |&j| {
                    Self::hash(hasher, Self::slot_repr(slots, meta, arena, j as usize))
                });
            }
        }
        self.index = index;
    }

    /// Starts a new run of lookups whose misses are kept for the remembers.
    fn begin_lookups(&mut self) {
        self.memo.clear();
        self.memo_next = 0;
    }

    /// `key`'s representation and hash: from `memo` when a lookup just parsed it.
    /// (Native only: on wasm32 the shortcut is left out for the JS package's size
    /// budget, and every key is parsed where it is used.)
    fn parsed<'k>(&mut self, key: &'k str) -> (Repr<'k>, u64) {
        #[cfg(not(target_family = "wasm"))]
        if let Ok(text) = <&[u8; 36]>::try_from(key.as_bytes()) {
            let end = (self.memo_next + MEMO_SCAN).min(self.memo.len());
            if let Some(j) = (self.memo_next..end).find(|&j| self.memo[j].text == *text) {
                self.memo_next = j + 1;
                let p = &self.memo[j];
                return (Repr::Uuid(p.uuid), p.hash);
            }
        }
        let repr = Repr::of(key);
        (repr, Self::hash(&self.hasher, repr))
    }

    /// Keeps a missed UUID key for the remember that usually follows.
    #[cfg_attr(target_family = "wasm", allow(unused_variables))]
    fn keep_parsed(&mut self, key: &str, repr: Repr, hash: u64) {
        #[cfg(not(target_family = "wasm"))]
        if let (Repr::Uuid(uuid), Ok(text)) = (repr, <[u8; 36]>::try_from(key.as_bytes())) {
            if self.memo.len() >= MEMO_MAX {
                self.begin_lookups();
            }
            self.memo.push(Parsed { text, uuid, hash });
        }
    }

    fn hash(hasher: &RandomState, repr: Repr) -> u64 {
        match repr {
            Repr::Uuid(b) => hasher.hash_one(u128::from_le_bytes(b)),
            Repr::Text(t) => hasher.hash_one(t),
        }
    }

    fn slot_repr<'t>(slots: &[[u8; 16]], meta: &[u32], arena: &'t [u8], i: usize) -> Repr<'t> {
        let slot = &slots[i];
        if meta[i] & TEXT == 0 {
            return Repr::Uuid(*slot);
        }
        let (off, len) = text_span(slot);
        Repr::Text(&arena[off..off + len])
    }

    fn matches(&self, i: usize, repr: Repr) -> bool {
        let m = self.meta[i];
        match (repr, m & TEXT != 0) {
            _ if m == TOMB => false,
            (Repr::Uuid(b), false) => self.slots[i] == b,
            (Repr::Text(t), true) => {
                let (off, len) = text_span(&self.slots[i]);
                &self.arena[off..off + len] == t
            }
            _ => false,
        }
    }

    fn find(&self, repr: Repr, hash: u64) -> Option<usize> {
        self.index
            .find(hash, |&i| self.matches(i as usize, repr))
            .map(|&i| i as usize)
    }

    fn expired(&self, i: usize, now_ms: Option<u64>) -> bool {
        let secs = self.meta[i] & !TEXT;
        match now_ms {
            Some(now) if secs != NEVER => now >= self.epoch_ms + u64::from(secs) * 1000,
            _ => false,
        }
    }

    /// The expiry field for a TTL starting now, rounded up to whole seconds so an
    /// id is never forgotten early (at most one second late).
    fn expiry_secs(&self, now_ms: u64, ttl: Duration) -> u32 {
        let until = now_ms.saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64);
        let secs = until.saturating_sub(self.epoch_ms).div_ceil(1000).max(1);
        secs.min(u64::from(MAX_EXPIRY_SECS)) as u32
    }

    fn seen(&mut self, key: &str, now_ms: Option<u64>) -> bool {
        let (repr, hash) = self.parsed(key);
        self.seen_hashed(key, repr, hash, now_ms)
    }

    /// `seen` for a key already parsed and hashed.
    fn seen_hashed(&mut self, key: &str, repr: Repr, hash: u64, now_ms: Option<u64>) -> bool {
        let seen = match self.find(repr, hash) {
            Some(i) if self.expired(i, now_ms) => {
                self.remove(i, hash);
                false
            }
            Some(_) => true,
            None => false,
        };
        if !seen {
            self.keep_parsed(key, repr, hash);
        }
        seen
    }

    /// Each key parsed and hashed, before any of them touches the table: the
    /// probes that follow then run back to back, independent of each other, so
    /// the CPU overlaps their cache misses instead of waiting on one at a time
    /// between two parses.
    fn hash_all<'k>(&self, keys: &[&'k str]) -> Vec<(Repr<'k>, u64)> {
        keys.iter()
            .map(|key| {
                let repr = Repr::of(key);
                (repr, Self::hash(&self.hasher, repr))
            })
            .collect()
    }

    /// `seen` for each key of a batch (a fresh run of lookups).
    fn seen_batch(&mut self, keys: &[&str], now_ms: Option<u64>) -> Vec<bool> {
        self.begin_lookups();
        let hashed = self.hash_all(keys);
        keys.iter()
            .zip(hashed)
            .map(|(key, (repr, hash))| self.seen_hashed(key, repr, hash, now_ms))
            .collect()
    }

    fn remember(&mut self, key: &str, expiry: u32, capacity: Option<usize>) -> StoreResult<()> {
        let (repr, hash) = self.parsed(key);
        if let Some(i) = self.find(repr, hash) {
            // Remembering again renews the entry (and revives an expired one).
            self.meta[i] = (self.meta[i] & TEXT) | expiry;
            return Ok(());
        }
        if capacity.is_some_and(|cap| self.live >= cap) {
            self.evict_oldest();
        }
        if self.slots.len() >= TOMB as usize {
            return Err(StoreError::internal("in-memory store is full (2^32 slots)"));
        }
        #[cfg(not(target_family = "wasm"))]
        self.grow_index(1);
        let i = self.slots.len();
        match repr {
            Repr::Uuid(b) => {
                self.slots.push(b);
                self.meta.push(expiry);
            }
            Repr::Text(t) => {
                let mut slot = [0u8; 16];
                slot[..8].copy_from_slice(&(self.arena.len() as u64).to_le_bytes());
                slot[8..].copy_from_slice(&(t.len() as u64).to_le_bytes());
                self.arena.extend_from_slice(t);
                self.slots.push(slot);
                self.meta.push(TEXT | expiry);
            }
        }
        let Table {
            index,
            slots,
            meta,
            arena,
            hasher,
            ..
        } = self;
        index.insert_unique(hash, i as u32, |&j| {
            Self::hash(hasher, Self::slot_repr(slots, meta, arena, j as usize))
        });
        self.live += 1;
        Ok(())
    }

    fn forget(&mut self, key: &str) {
        let repr = Repr::of(key);
        let hash = Self::hash(&self.hasher, repr);
        if let Some(i) = self.find(repr, hash) {
            self.remove(i, hash);
        }
    }

    fn remove(&mut self, i: usize, hash: u64) {
        if let Ok(entry) = self.index.find_entry(hash, |&j| j as usize == i) {
            entry.remove();
        }
        self.meta[i] = TOMB;
        self.live -= 1;
        self.dead += 1;
        // Bulk compaction keeps removal O(1) amortised.
        if self.dead > 1024 && self.dead > self.live {
            self.compact();
        }
    }

    fn evict_oldest(&mut self) {
        while self.oldest < self.meta.len() && self.meta[self.oldest] == TOMB {
            self.oldest += 1;
        }
        if self.oldest < self.meta.len() {
            let i = self.oldest;
            let repr = Self::slot_repr(&self.slots, &self.meta, &self.arena, i);
            let hash = Self::hash(&self.hasher, repr);
            self.remove(i, hash);
        }
    }

    /// Drops tombstones (and their arena bytes), keeping insertion order.
    fn compact(&mut self) {
        let mut slots = Vec::with_capacity(self.live);
        let mut meta = Vec::with_capacity(self.live);
        let mut arena = Vec::new();
        for i in 0..self.slots.len() {
            let m = self.meta[i];
            if m == TOMB {
                continue;
            }
            let mut slot = self.slots[i];
            if m & TEXT != 0 {
                let (off, len) = text_span(&slot);
                slot[..8].copy_from_slice(&(arena.len() as u64).to_le_bytes());
                arena.extend_from_slice(&self.arena[off..off + len]);
            }
            slots.push(slot);
            meta.push(m);
        }
        self.slots = slots;
        self.meta = meta;
        self.arena = arena;
        self.dead = 0;
        self.oldest = 0;
        let Table {
            index,
            slots,
            meta,
            arena,
            hasher,
            ..
        } = self;
        index.clear();
        for i in 0..slots.len() {
            let hash = Self::hash(hasher, Self::slot_repr(slots, meta, arena, i));
            index.insert_unique(hash, i as u32, |&j| {
                Self::hash(hasher, Self::slot_repr(slots, meta, arena, j as usize))
            });
        }
    }

    fn purge_expired(&mut self, now_ms: u64) -> usize {
        let mut purged = 0;
        for i in 0..self.meta.len() {
            if self.meta[i] != TOMB && self.expired(i, Some(now_ms)) {
                self.meta[i] = TOMB;
                self.live -= 1;
                self.dead += 1;
                purged += 1;
            }
        }
        if purged > 0 {
            self.compact();
        }
        purged
    }

    fn entries(&self, now_ms: Option<u64>) -> Vec<StoreEntry> {
        (0..self.meta.len())
            .filter(|&i| self.meta[i] != TOMB && !self.expired(i, now_ms))
            .map(|i| {
                let key = match Self::slot_repr(&self.slots, &self.meta, &self.arena, i) {
                    Repr::Uuid(b) => format_uuid(&b),
                    // The arena holds only bytes copied from `&str` keys.
                    Repr::Text(t) => String::from_utf8_lossy(t).into_owned(),
                };
                let secs = self.meta[i] & !TEXT;
                let expires_at_ms = (secs != NEVER).then(|| self.epoch_ms + u64::from(secs) * 1000);
                StoreEntry { key, expires_at_ms }
            })
            .collect()
    }
}

fn text_span(slot: &[u8; 16]) -> (usize, usize) {
    let off = u64::from_le_bytes(slot[..8].try_into().unwrap_or_default());
    let len = u64::from_le_bytes(slot[8..].try_into().unwrap_or_default());
    (off as usize, len as usize)
}

struct Inner {
    table: Table,
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

    /// The expiry field for `ttl`; the clock is read only for a TTL.
    fn expiry(&self, table: &Table, ttl: Option<Duration>) -> StoreResult<u32> {
        let Some(ttl) = ttl else { return Ok(NEVER) };
        match self.now() {
            Some(now) => {
                self.timed.store(true, Ordering::Relaxed);
                Ok(table.expiry_secs(now, ttl))
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

impl Store for InMemoryStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        let now = self.now_if_timed();
        let mut inner = self.lock()?;
        inner.table.begin_lookups();
        Ok(inner.table.seen(key, now))
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        let mut inner = self.lock()?;
        let expiry = self.expiry(&inner.table, ttl)?;
        end_claim(&mut inner, key);
        inner.table.remember(key, expiry, self.capacity)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        let mut inner = self.lock()?;
        inner.claims.remove(key);
        inner.table.forget(key);
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: true,
            ttl: self.clock.is_some(),
            lease: true,
        }
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let now = self.now_if_timed();
        let mut inner = self.lock()?;
        Ok(inner.table.seen_batch(keys, now))
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let mut inner = self.lock()?;
        let expiry = self.expiry(&inner.table, ttl)?;
        inner.table.reserve(keys.len());
        for key in keys {
            end_claim(&mut inner, key);
            inner.table.remember(key, expiry, self.capacity)?;
        }
        Ok(())
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        let now = self.now();
        let mut inner = self.lock()?;
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
        let now = self.now();
        let mut inner = self.lock()?;
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
        let now = self.now();
        Ok(self.renew_locked(&mut *self.lock()?, key, token, now, lease))
    }

    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        let now = self.now();
        let mut inner = self.lock()?;
        let expiry = self.expiry(&inner.table, ttl)?;
        self.remember_fenced_locked(&mut inner, key, Some(token), expiry, now)
    }

    /// Under one lock, so a batch step is all-or-nothing for other consumers.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        // Time matters to renewals and fenced remembers only.
        let fenced = step.remember.iter().any(|(_, token)| token.is_some());
        let now = match step.renew.is_empty() && !fenced {
            true => None,
            false => self.now(),
        };
        let mut inner = self.lock()?;
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
            _ => self.expiry(&inner.table, step.ttl)?,
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
        let before = match inner.claims.get(key) {
            Some(&(token, until)) => Record::Claimed { token, until },
            // A done record here is live (`seen` drops an expired one).
            None if !unseen && inner.table.seen(key, now) => Record::Done {
                until: None,
                by: None,
            },
            None => Record::Free,
        };
        let mut after = before.clone();
        let answer = op(&mut after);
        if after != before {
            match after {
                Record::Free => {
                    inner.claims.remove(key);
                }
                Record::Claimed { token, until } => {
                    self.timed.store(true, Ordering::Relaxed);
                    match inner.claims.get_mut(key) {
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
        }
        Ok(answer)
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
