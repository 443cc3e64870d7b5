//! The compact seen-set: ids in insertion order in dense slots (a UUID as its
//! 16 bytes, other text in an arena), an expiry per slot, and a hash index.

use std::hash::BuildHasher;
use std::time::Duration;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use super::StoreEntry;
use super::uuid::{format_uuid, parse_uuid};
use crate::store::{StoreError, StoreResult};

/// Slot flag: the id is text in the arena (otherwise a UUID's 16 bytes).
pub(super) const TEXT: u32 = 1 << 31;
/// Slot marker: forgotten, evicted or expired; skipped and later compacted away.
pub(super) const TOMB: u32 = u32::MAX;
/// Expiry field: no expiry.
pub(super) const NEVER: u32 = 0;
/// Largest expiry in seconds after the store's epoch (about 68 years).
pub(super) const MAX_EXPIRY_SECS: u32 = TEXT - 2;

/// How an id is held: a UUID's bytes, or its text.
#[derive(Clone, Copy)]
pub(super) enum Repr<'a> {
    Uuid([u8; 16]),
    Text(&'a [u8]),
}

impl<'a> Repr<'a> {
    pub(super) fn of(key: &'a str) -> Self {
        parse_uuid(key.as_bytes()).map_or(Repr::Text(key.as_bytes()), Repr::Uuid)
    }
}

/// The seen-set proper. Every method takes `now_ms` so time is decided by the caller.
pub(super) struct Table {
    pub(super) slots: Vec<[u8; 16]>,
    pub(super) meta: Vec<u32>,
    pub(super) arena: Vec<u8>,
    pub(super) index: HashTable<u32>,
    pub(super) hasher: RandomState,
    pub(super) live: usize,
    pub(super) dead: usize,
    /// No live slot sits before this one (where eviction starts looking).
    pub(super) oldest: usize,
    /// Expiry seconds count from here (ms since the Unix epoch).
    pub(super) epoch_ms: u64,
    /// The UUID keys the last `seen`/`seen_many` did not find, parsed and hashed,
    /// in call order: the `remember` that usually follows takes them from here
    /// instead of parsing and hashing each key a second time.
    pub(super) memo: Vec<Parsed>,
    /// Where the next lookup in `memo` starts (remembers come in key order).
    pub(super) memo_next: usize,
}

/// A UUID key as parsed once: its text (to match a later key exactly), its 16
/// bytes and its hash. Purely a function of the text, so never stale.
#[cfg_attr(target_family = "wasm", allow(dead_code))]
pub(super) struct Parsed {
    text: [u8; 36],
    uuid: [u8; 16],
    hash: u64,
}

/// How far past `memo_next` a lookup looks (deliveries that failed or were not
/// remembered leave gaps).
#[cfg(not(target_family = "wasm"))]
pub(super) const MEMO_SCAN: usize = 4;
/// The most keys `memo` holds.
#[cfg(not(target_family = "wasm"))]
pub(super) const MEMO_MAX: usize = 4096;

impl Table {
    pub(super) fn new(epoch_ms: u64) -> Self {
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
    pub(super) fn reserve(&mut self, n: usize) {
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
    pub(super) fn grow_index(&mut self, n: usize) {
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
    pub(super) fn begin_lookups(&mut self) {
        self.memo.clear();
        self.memo_next = 0;
    }

    /// `key`'s representation and hash: from `memo` when a lookup just parsed it.
    /// (Native only: on wasm32 the shortcut is left out for the JS package's size
    /// budget, and every key is parsed where it is used.)
    pub(super) fn parsed<'k>(&mut self, key: &'k str) -> (Repr<'k>, u64) {
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
    pub(super) fn keep_parsed(&mut self, key: &str, repr: Repr, hash: u64) {
        #[cfg(not(target_family = "wasm"))]
        if let (Repr::Uuid(uuid), Ok(text)) = (repr, <[u8; 36]>::try_from(key.as_bytes())) {
            if self.memo.len() >= MEMO_MAX {
                self.begin_lookups();
            }
            self.memo.push(Parsed { text, uuid, hash });
        }
    }

    pub(super) fn hash(hasher: &RandomState, repr: Repr) -> u64 {
        match repr {
            Repr::Uuid(b) => hasher.hash_one(u128::from_le_bytes(b)),
            Repr::Text(t) => hasher.hash_one(t),
        }
    }

    pub(super) fn slot_repr<'t>(
        slots: &[[u8; 16]],
        meta: &[u32],
        arena: &'t [u8],
        i: usize,
    ) -> Repr<'t> {
        let slot = &slots[i];
        if meta[i] & TEXT == 0 {
            return Repr::Uuid(*slot);
        }
        let (off, len) = text_span(slot);
        Repr::Text(&arena[off..off + len])
    }

    pub(super) fn matches(&self, i: usize, repr: Repr) -> bool {
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

    pub(super) fn find(&self, repr: Repr, hash: u64) -> Option<usize> {
        self.index
            .find(hash, |&i| self.matches(i as usize, repr))
            .map(|&i| i as usize)
    }

    pub(super) fn expired(&self, i: usize, now_ms: Option<u64>) -> bool {
        let secs = self.meta[i] & !TEXT;
        match now_ms {
            Some(now) if secs != NEVER => now >= self.epoch_ms + u64::from(secs) * 1000,
            _ => false,
        }
    }

    /// The expiry field for a TTL starting now, rounded up to whole seconds so an
    /// id is never forgotten early (at most one second late).
    pub(super) fn expiry_secs(&self, now_ms: u64, ttl: Duration) -> u32 {
        let until = now_ms.saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64);
        let secs = until.saturating_sub(self.epoch_ms).div_ceil(1000).max(1);
        secs.min(u64::from(MAX_EXPIRY_SECS)) as u32
    }

    pub(super) fn seen(&mut self, key: &str, now_ms: Option<u64>) -> bool {
        let (repr, hash) = self.parsed(key);
        self.seen_hashed(key, repr, hash, now_ms)
    }

    /// `seen` for a key already parsed and hashed.
    pub(super) fn seen_hashed(
        &mut self,
        key: &str,
        repr: Repr,
        hash: u64,
        now_ms: Option<u64>,
    ) -> bool {
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
    pub(super) fn hash_all<'k>(&self, keys: &[&'k str]) -> Vec<(Repr<'k>, u64)> {
        keys.iter()
            .map(|key| {
                let repr = Repr::of(key);
                (repr, Self::hash(&self.hasher, repr))
            })
            .collect()
    }

    /// `seen` for each key of a batch (a fresh run of lookups).
    pub(super) fn seen_batch(&mut self, keys: &[&str], now_ms: Option<u64>) -> Vec<bool> {
        self.begin_lookups();
        let hashed = self.hash_all(keys);
        keys.iter()
            .zip(hashed)
            .map(|(key, (repr, hash))| self.seen_hashed(key, repr, hash, now_ms))
            .collect()
    }

    pub(super) fn remember(
        &mut self,
        key: &str,
        expiry: u32,
        capacity: Option<usize>,
    ) -> StoreResult<()> {
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

    pub(super) fn forget(&mut self, key: &str) {
        let repr = Repr::of(key);
        let hash = Self::hash(&self.hasher, repr);
        if let Some(i) = self.find(repr, hash) {
            self.remove(i, hash);
        }
    }

    pub(super) fn remove(&mut self, i: usize, hash: u64) {
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

    pub(super) fn evict_oldest(&mut self) {
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
    pub(super) fn compact(&mut self) {
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

    /// Entries held: live, expired, and removed ones not compacted yet.
    pub(super) fn held(&self) -> usize {
        self.meta.len()
    }

    pub(super) fn purge_expired(&mut self, now_ms: u64) -> usize {
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

    pub(super) fn entries(&self, now_ms: Option<u64>) -> Vec<StoreEntry> {
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

pub(super) fn text_span(slot: &[u8; 16]) -> (usize, usize) {
    let off = u64::from_le_bytes(slot[..8].try_into().unwrap_or_default());
    let len = u64::from_le_bytes(slot[8..].try_into().unwrap_or_default());
    (off as usize, len as usize)
}
