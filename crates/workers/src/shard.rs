//! Stable hashing: which Durable Object holds a key, and a KV-safe name for a
//! long key.
//!
//! A key's hash is the first 8 bytes of its SHA-256 (big-endian), so the choice
//! never changes between builds, processes or versions (a seeded hasher would
//! move ids between shards and forget them).
//!
//! The shard of a key is **jump consistent hashing** (Lamping & Veach, 2014) of
//! that hash over N shards: when N grows to M, only the ids that must move
//! (about `1 - N/M` of them) change shard, and they move only to the new shards
//! N..M. Shard `i`'s object name does not contain N, so an object keeps its ids
//! across a change of N: shard 0 is `bq-dedupe/1/0` (the name the one-shard
//! layout always had, so a one-shard deployment upgrades in place), shard `i >
//! 0` is `bq-dedupe/jump/<i>`.
//!
//! Before jump hashing the shard was `hash % N` over objects named
//! `bq-dedupe/<N>/<i>` ([`Layout::Sha256Mod`]); those objects keep that meaning
//! and stay reachable as a previous layout (`DEDUPE_PREVIOUS_SHARDS=sha256-mod:N`).

use sha2::{Digest, Sha256};

/// How ids are spread over Durable Objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Jump consistent hashing over this many shards (the current layout).
    Jump(u32),
    /// `hash % N` over objects named `bq-dedupe/<N>/<i>` (before jump hashing).
    Sha256Mod(u32),
}

impl Layout {
    /// How many shards the layout has (at least 1).
    pub fn shards(self) -> u32 {
        match self {
            Layout::Jump(n) | Layout::Sha256Mod(n) => n.max(1),
        }
    }

    /// The shard (0..shards) that holds the key with this [`key_hash`].
    pub fn shard_of_hash(self, hash: u64) -> u32 {
        match self {
            Layout::Jump(n) => jump(hash, n.max(1)),
            Layout::Sha256Mod(n) => (hash % u64::from(n.max(1))) as u32,
        }
    }

    /// The shard that holds `key`.
    pub fn shard_of(self, key: &str) -> u32 {
        self.shard_of_hash(placement_hash(key))
    }

    /// The Durable Object name of shard `index`.
    pub fn object_name(self, index: u32) -> String {
        match self {
            Layout::Jump(_) if index == 0 => "bq-dedupe/1/0".into(),
            Layout::Jump(_) => format!("bq-dedupe/jump/{index}"),
            Layout::Sha256Mod(n) => format!("bq-dedupe/{}/{index}", n.max(1)),
        }
    }

    /// The layout as the settings name it: `N` (`DEDUPE_SHARDS`), or
    /// `sha256-mod:N` (`DEDUPE_PREVIOUS_SHARDS` for objects before jump hashing).
    pub fn setting(self) -> String {
        match self {
            Layout::Jump(n) => n.max(1).to_string(),
            Layout::Sha256Mod(n) => format!("sha256-mod:{}", n.max(1)),
        }
    }

    /// The object holding the key with this hash.
    pub fn object_of_hash(self, hash: u64) -> String {
        self.object_name(self.shard_of_hash(hash))
    }
}

/// The hash that places `key`: its own, or for a payload fingerprint's
/// marker and record their id's ([`bq_dedupe::fingerprint::owner_key`]), so
/// a success and its companions are written in one object's transaction.
/// (Before 2026-12-07 each went by its own hash: a record written then is
/// also looked for there before a mismatch is said, see
/// `DurableObjectStore::find_records_in_their_old_place`.)
pub fn placement_hash(key: &str) -> u64 {
    key_hash(bq_dedupe::fingerprint::owner_key(key))
}

/// The stable 64-bit hash of a key: the first 8 bytes of its SHA-256.
pub fn key_hash(key: &str) -> u64 {
    let digest = Sha256::digest(key.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Jump consistent hash: a bucket in `0..buckets` for `key`, moving only
/// `1/buckets` of the keys (to the new bucket) when `buckets` grows by one.
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as u32
}

/// Lowercase hex SHA-256 of `key` (64 characters).
pub fn sha256_hex(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from_digit(u32::from(byte >> 4), 16).expect("nibble"));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).expect("nibble"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload fingerprint's marker and record sit in their id's object, so
    /// a success and both are written by one request, in one transaction:
    /// split across objects, a failed part (or a reader between the parts)
    /// left the marker without the record, and a same-payload duplicate was
    /// dead-lettered as a payload mismatch (a review).
    #[test]
    fn fingerprint_companions_sit_in_their_ids_object() {
        for layout in [Layout::Jump(4), Layout::Jump(16), Layout::Sha256Mod(8)] {
            for n in 0..64 {
                let key = format!("orders:id-{n}");
                let record = format!("\u{1f}fp:{:032x}:{key}", n * 7919);
                for companion in [bq_dedupe::fingerprint::marker_key(&key), record] {
                    assert_eq!(
                        layout.shard_of(&companion),
                        layout.shard_of(&key),
                        "{companion:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_shard_takes_everything() {
        assert_eq!(Layout::Jump(1).shard_of("anything"), 0);
        assert_eq!(Layout::Jump(0).shard_of("anything"), 0);
        assert_eq!(Layout::Sha256Mod(1).shard_of("anything"), 0);
    }

    /// Pinned: known ids land on known shards. A change of hash or shard function
    /// would move remembered ids to objects that do not know them, so it must
    /// fail here first.
    #[test]
    fn shard_choice_is_pinned_for_known_ids() {
        let ids = [
            "id-A",
            "order-1",
            "00000001-b5a6-4789-90ab-cdef01234567",
            "",
        ];
        let pinned: [(u32, [u32; 4]); 5] = [
            (2, [0, 1, 0, 1]),
            (4, [0, 2, 2, 2]),
            (8, [0, 5, 2, 5]),
            (16, [14, 10, 2, 5]),
            (1024, [400, 214, 418, 22]),
        ];
        for (n, want) in pinned {
            let got: Vec<u32> = ids.iter().map(|id| Layout::Jump(n).shard_of(id)).collect();
            assert_eq!(got, want, "jump layout, {n} shards");
        }
        // The key hash: SHA-256's first 8 bytes, big-endian.
        assert_eq!(key_hash("id-A"), 0xb628_4402_132d_b723);
    }

    #[test]
    fn growing_the_count_moves_only_the_ids_that_must_move() {
        let ids: Vec<String> = (0..4000).map(|i| format!("id-{i}")).collect();
        for (from, to) in [(1, 4), (4, 5), (8, 16)] {
            let moved = ids
                .iter()
                .filter(|id| Layout::Jump(from).shard_of(id) != Layout::Jump(to).shard_of(id))
                .count();
            let expected = ids.len() as f64 * (1.0 - f64::from(from) / f64::from(to));
            assert!(
                (moved as f64 - expected).abs() < expected * 0.1 + 40.0,
                "{from} -> {to}: {moved} moved, about {expected} expected"
            );
            // A moved id goes to a new shard, never between old ones.
            assert!(ids.iter().all(|id| {
                let (a, b) = (
                    Layout::Jump(from).shard_of(id),
                    Layout::Jump(to).shard_of(id),
                );
                a == b || b >= from
            }));
        }
    }

    #[test]
    fn shards_are_evenly_used() {
        let mut used = [0u32; 8];
        for i in 0..800 {
            used[Layout::Jump(8).shard_of(&format!("id-{i}")) as usize] += 1;
        }
        assert!(used.iter().all(|&n| n > 50), "{used:?}");
    }

    #[test]
    fn object_names_keep_their_meaning() {
        // The one-shard object is the same in both layouts (both hold every id).
        assert_eq!(Layout::Jump(4).object_name(0), "bq-dedupe/1/0");
        assert_eq!(Layout::Sha256Mod(1).object_name(0), "bq-dedupe/1/0");
        // Jump names do not depend on the count: an object keeps its ids as N grows.
        assert_eq!(Layout::Jump(4).object_name(3), "bq-dedupe/jump/3");
        assert_eq!(Layout::Jump(64).object_name(3), "bq-dedupe/jump/3");
        // The old layout's objects keep their old names.
        assert_eq!(Layout::Sha256Mod(4).object_name(3), "bq-dedupe/4/3");
    }

    #[test]
    fn the_old_modulo_layout_is_unchanged() {
        // What `sha256 % N` chose before jump hashing, pinned so old objects stay
        // reachable for a migration.
        assert_eq!(Layout::Sha256Mod(8).shard_of("id-A"), 3);
        assert_eq!(Layout::Sha256Mod(8).object_name(3), "bq-dedupe/8/3");
    }

    #[test]
    fn sha256_hex_matches_the_standard_vector() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
