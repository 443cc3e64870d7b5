//! Live heap bytes per remembered id, for the in-memory store and a
//! `HashSet<String>` baseline.
//!
//! ```text
//! cargo run --release --example memory_per_id
//! ```
//!
//! A counting `#[global_allocator]` (a wrapper around `System`) tracks the bytes
//! requested and not yet freed. For each case, 1,000,000 ids are generated first
//! (outside the measurement), then the live-byte delta across filling a fresh store
//! is divided by the id count. Only requested bytes are counted: the allocator's own
//! per-allocation overhead (about 8-16 bytes per chunk in glibc) is not, which
//! flatters the baseline (one allocation per id) more than the store (a handful of
//! large vectors). The live-allocation column shows that difference.

#[path = "../bench/workload.rs"]
mod workload;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use bq_dedupe::{InMemoryStore, Store, block_on_ready};
use workload::SplitMix64;

/// Ids per case.
const IDS: usize = 1_000_000;
/// Remembered ids checked with `seen` after each case (plus the first and last).
const SAMPLE_STEP: usize = 997;
/// Ids never remembered, checked to be unseen.
const UNSEEN: usize = 1_000;
const TTL: Duration = Duration::from_secs(3600);

/// Counts live bytes and live allocations, and the peak live bytes.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_ALLOCS: AtomicIsize = AtomicIsize::new(0);

fn grew(bytes: usize) {
    let now = LIVE_BYTES.fetch_add(bytes, Relaxed) + bytes;
    PEAK_BYTES.fetch_max(now, Relaxed);
}

fn shrank(bytes: usize) {
    LIVE_BYTES.fetch_sub(bytes, Relaxed);
}

// SAFETY: every call is forwarded to `System` with the same arguments; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
            LIVE_ALLOCS.fetch_add(1, Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
            LIVE_ALLOCS.fetch_add(1, Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
        LIVE_ALLOCS.fetch_sub(1, Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Count the new block before dropping the old one: a moving realloc
            // briefly holds both.
            grew(new_size);
            shrank(layout.size());
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What filling one store left on the heap.
struct Measured {
    live_bytes: usize,
    peak_bytes: usize,
    live_allocs: isize,
}

/// Runs `fill` and reports the live heap it added (what the returned value holds)
/// and the peak above the starting point while it ran.
fn measure<T>(fill: impl FnOnce() -> T) -> (T, Measured) {
    let bytes_before = LIVE_BYTES.load(Relaxed);
    let allocs_before = LIVE_ALLOCS.load(Relaxed);
    PEAK_BYTES.store(bytes_before, Relaxed);
    let value = fill();
    let measured = Measured {
        live_bytes: LIVE_BYTES.load(Relaxed).saturating_sub(bytes_before),
        peak_bytes: PEAK_BYTES.load(Relaxed).saturating_sub(bytes_before),
        live_allocs: LIVE_ALLOCS.load(Relaxed) - allocs_before,
    };
    (value, measured)
}

fn remember_all(ids: &[String], ttl: Option<Duration>) -> InMemoryStore {
    let store = InMemoryStore::new();
    for id in ids {
        block_on_ready(store.remember(id, ttl))
            .expect("the in-memory store completes synchronously")
            .unwrap_or_else(|e| panic!("remember({id:?}) failed: {e}"));
    }
    store
}

/// The ids `seen` must report: a spread sample plus the first and last.
fn sample(ids: &[String]) -> impl Iterator<Item = &String> {
    ids.iter()
        .step_by(SAMPLE_STEP)
        .chain(ids.first())
        .chain(ids.last())
}

fn check_store(case: &str, store: &InMemoryStore, ids: &[String], unseen: &[String]) {
    assert_eq!(
        store.len(),
        ids.len(),
        "{case}: store holds the wrong number of ids"
    );
    let seen = |id: &str| {
        block_on_ready(store.seen(id))
            .expect("the in-memory store completes synchronously")
            .unwrap_or_else(|e| panic!("{case}: seen({id:?}) failed: {e}"))
    };
    for id in sample(ids) {
        assert!(seen(id), "{case}: remembered id {id} is not seen");
    }
    for id in unseen {
        assert!(!seen(id), "{case}: never-remembered id {id} is seen");
    }
}

fn check_set(set: &HashSet<String>, ids: &[String], unseen: &[String]) {
    assert_eq!(set.len(), ids.len(), "HashSet<String>: wrong number of ids");
    for id in sample(ids) {
        assert!(set.contains(id), "HashSet<String>: id {id} missing");
    }
    for id in unseen {
        assert!(
            !set.contains(id),
            "HashSet<String>: never-inserted id {id} present"
        );
    }
}

fn main() {
    // All ids exist before anything is measured.
    let mut rng = SplitMix64::new(workload::SEED ^ 0x4D45_4D4F_5259);
    let uuid_bytes: Vec<[u8; 16]> = (0..IDS).map(|_| rng.uuid_v4_bytes()).collect();
    let lower: Vec<String> = uuid_bytes
        .iter()
        .map(|b| workload::format_uuid(b, false))
        .collect();
    let upper: Vec<String> = uuid_bytes
        .iter()
        .map(|b| workload::format_uuid(b, true))
        .collect();
    let unseen_bytes: Vec<[u8; 16]> = (0..UNSEEN).map(|_| rng.uuid_v4_bytes()).collect();
    let unseen_lower: Vec<String> = unseen_bytes
        .iter()
        .map(|b| workload::format_uuid(b, false))
        .collect();
    let unseen_upper: Vec<String> = unseen_bytes
        .iter()
        .map(|b| workload::format_uuid(b, true))
        .collect();
    assert_eq!(
        lower.iter().collect::<HashSet<_>>().len(),
        IDS,
        "generated ids are not distinct"
    );
    assert!(
        upper
            .iter()
            .all(|id| id.len() == 36 && id.chars().any(|c| c.is_ascii_uppercase()))
    );

    let mut rows: Vec<(&str, Measured)> = Vec::new();

    let (store, m) = measure(|| remember_all(&lower, None));
    check_store("InMemoryStore, no TTL", &store, &lower, &unseen_lower);
    drop(store);
    rows.push(("`InMemoryStore`, lowercase UUIDs, no TTL", m));

    let (store, m) = measure(|| remember_all(&lower, Some(TTL)));
    check_store("InMemoryStore, TTL 1 h", &store, &lower, &unseen_lower);
    drop(store);
    rows.push(("`InMemoryStore`, lowercase UUIDs, TTL 1 h", m));

    let (set, m) = measure(|| {
        let mut set = HashSet::new();
        for id in &lower {
            set.insert(id.clone());
        }
        set
    });
    check_set(&set, &lower, &unseen_lower);
    drop(set);
    rows.push(("`HashSet<String>` baseline, lowercase UUIDs", m));

    let (store, m) = measure(|| remember_all(&upper, None));
    check_store(
        "InMemoryStore, uppercase ids",
        &store,
        &upper,
        &unseen_upper,
    );
    drop(store);
    rows.push((
        "`InMemoryStore`, 36-char non-UUID ids (uppercase UUIDs), no TTL",
        m,
    ));

    println!(
        "Live heap after remembering {IDS} distinct ids (requested bytes; allocator overhead not counted):"
    );
    println!();
    println!("| store | bytes/id | live MB | peak bytes/id while filling | live allocations |");
    println!("|---|---:|---:|---:|---:|");
    for (name, m) in &rows {
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {} |",
            m.live_bytes as f64 / IDS as f64,
            m.live_bytes as f64 / 1e6,
            m.peak_bytes as f64 / IDS as f64,
            m.live_allocs,
        );
    }
    println!();
    println!(
        "Checked: every store holds {IDS} ids, `seen` is true for {} sampled ids and false for {UNSEEN} unseen ids.",
        sample(&lower).count()
    );
}
