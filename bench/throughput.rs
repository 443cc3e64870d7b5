//! Dedupe throughput over the shared 1,000,000-delivery workload (20% byte-identical
//! redeliveries, see `bench/workload.rs`).
//!
//! Group `dedupe_1m`, one iteration = the whole workload:
//! - `process`: each delivery through `Guard::process` with a no-op handler, a fresh
//!   `InMemoryStore` per iteration;
//! - `process_batch_100`: the same deliveries in chunks of 100 through
//!   `Guard::process_batch`;
//! - `process_presized`: `process` on a store made with
//!   `InMemoryStore::with_reserved(distinct ids)` (no table growth);
//! - `decode_only`: `Message::parse` alone (the floor under both);
//! - `validate_floor`: the UTF-8 check and serde_json's syntax check with nothing
//!   kept, the least a validating decoder does (what `decode_only` is held to);
//! - `store_single` / `store_batch_100`: the in-memory store alone, each line's id
//!   (read beforehand) through `seen` then `remember` on a miss, one delivery at a
//!   time or 100 per `seen_many` + `remember_many`;
//! - `store_claim_single` / `store_claim_batch_100`: the same in claiming mode,
//!   `claim` then `settle` (fenced remember), or `claim_many` + one `settle` per 100.
//!
//! `BQ_BENCH_CLOCK=cpu` measures the benchmark thread's CPU time
//! (`/proc/thread-self/schedstat`, Linux) instead of wall time: on a machine shared
//! with other builds that leaves out the time spent waiting for a core (not the
//! cache and memory traffic of the neighbours). Same group and output files.
//!
//! ```text
//! cargo bench --bench throughput
//! ```
//!
//! Criterion writes `target/criterion/dedupe_1m/<bench>/new/estimates.json`, which
//! `bench/compare.py` reads. Nothing here asserts anything about timings.
//!
//! Before timing, a sanity check panics unless the handler ran exactly once per
//! distinct `meta.id`. Under `cargo test --all-targets` (no `--bench` argument)
//! criterion only runs each routine once, on a 10,000-line workload.

#[path = "workload.rs"]
mod workload;

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use bq_dedupe::{
    Guard, InMemoryStore, Message, OutcomeKind, Store, block_on_ready, envelope::Limits,
    store::Claim, store::ClaimToken, store::Settlement,
};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput};

/// Deliveries per iteration (the criterion throughput unit).
const DELIVERIES: usize = 1_000_000;
/// Workload size when criterion only smoke-tests (see [`workload_size`]).
const SMOKE_DELIVERIES: usize = 10_000;
/// Deliveries per `process_batch` call.
const BATCH: usize = 100;
/// Criterion group name (its directory under `target/criterion`).
const GROUP: &str = "dedupe_1m";

/// What one pass over the workload did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    /// Handler calls.
    effects: u64,
    ran: u64,
    skipped: u64,
    /// Any other outcome (none is expected from this workload).
    other: u64,
}

impl Tally {
    fn count(&mut self, kind: OutcomeKind) {
        match kind {
            OutcomeKind::Ran => self.ran += 1,
            OutcomeKind::Skipped => self.skipped += 1,
            _ => self.other += 1,
        }
    }
}

fn fresh_guard() -> Guard<InMemoryStore> {
    Guard::new(InMemoryStore::new())
}

/// Every delivery through `Guard::process`, one at a time.
fn run_process(guard: &Guard<InMemoryStore>, lines: &[String]) -> Tally {
    let mut tally = Tally::default();
    let mut effects = 0u64;
    for line in lines {
        let outcome = block_on_ready(guard.process(black_box(line.as_bytes()), async |_msg| {
            effects += 1;
            Ok::<(), Infallible>(())
        }))
        .expect("the in-memory store and the no-op handler complete synchronously");
        tally.count(outcome.kind());
    }
    tally.effects = effects;
    tally
}

/// The deliveries in chunks of `BATCH` through `Guard::process_batch`.
fn run_process_batch(guard: &Guard<InMemoryStore>, lines: &[String]) -> Tally {
    let mut tally = Tally::default();
    let mut effects = 0u64;
    for chunk in lines.chunks(BATCH) {
        let outcomes = block_on_ready(guard.process_batch(black_box(chunk), async |_msg| {
            effects += 1;
            Ok::<(), Infallible>(())
        }))
        .expect("the in-memory store and the no-op handler complete synchronously");
        for outcome in &outcomes {
            tally.count(outcome.kind());
        }
    }
    tally.effects = effects;
    tally
}

/// `Message::parse` alone: (accepted, total id bytes), so the parse cannot be dropped.
fn run_decode(lines: &[String]) -> (u64, u64) {
    let limits = Limits::default();
    let (mut accepted, mut id_bytes) = (0u64, 0u64);
    for line in lines {
        if let Ok(msg) = Message::parse(black_box(line.as_bytes()), &limits) {
            accepted += 1;
            id_bytes += msg.id().map_or(0, str::len) as u64;
        }
    }
    (accepted, id_bytes)
}

/// The validating floor: the UTF-8 check and serde_json's syntax check with
/// nothing kept (`IgnoredAny`), the least any validating decoder here does a line.
fn run_validate_floor(lines: &[String]) -> u64 {
    let mut valid = 0u64;
    for line in lines {
        let text = std::str::from_utf8(black_box(line.as_bytes()));
        if text.is_ok_and(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok()) {
            valid += 1;
        }
    }
    valid
}

/// The store alone, one delivery at a time: `seen`, then `remember` on a miss.
/// Returns how many ids were new.
fn run_store_single(store: &InMemoryStore, ids: &[&str], _: &[bool]) -> u64 {
    let mut fresh = 0u64;
    for &id in ids {
        let seen = block_on_ready(store.seen(black_box(id)))
            .expect("sync")
            .expect("seen");
        if !seen {
            block_on_ready(store.remember(id, None))
                .expect("sync")
                .expect("remember");
            fresh += 1;
        }
    }
    fresh
}

/// The store alone, `BATCH` deliveries per `seen_many` + `remember_many` (the
/// batch's new ids, in order and each once, as `Guard::process_batch` hands them
/// over; `first[i]`: `ids[i]` does not occur earlier in its chunk).
fn run_store_batch(store: &InMemoryStore, ids: &[&str], first: &[bool]) -> u64 {
    let mut fresh = 0u64;
    let mut new = Vec::with_capacity(BATCH);
    for (chunk, first) in ids.chunks(BATCH).zip(first.chunks(BATCH)) {
        let seen = block_on_ready(store.seen_many(black_box(chunk)))
            .expect("sync")
            .expect("seen_many");
        new.clear();
        new.extend(
            chunk
                .iter()
                .zip(&seen)
                .zip(first)
                .filter(|((_, seen), first)| !**seen && **first)
                .map(|((k, _), _)| *k),
        );
        block_on_ready(store.remember_many(&new, None))
            .expect("sync")
            .expect("remember_many");
        fresh += new.len() as u64;
    }
    fresh
}

/// Claiming mode, one delivery at a time: `claim`, then a one-key fenced `settle`.
fn run_claim_single(store: &InMemoryStore, ids: &[&str], _: &[bool]) -> u64 {
    let lease = Duration::from_secs(60);
    let mut fresh = 0u64;
    for &id in ids {
        let claim = block_on_ready(store.claim(black_box(id), lease))
            .expect("sync")
            .expect("claim");
        if let Claim::Acquired(token) = claim {
            fresh += settle_fenced(store, &[(id, Some(&token))], lease);
        }
    }
    fresh
}

/// Claiming mode, `BATCH` deliveries per `claim_many` + one fenced `settle`.
fn run_claim_batch(store: &InMemoryStore, ids: &[&str], _: &[bool]) -> u64 {
    let lease = Duration::from_secs(60);
    let mut fresh = 0u64;
    for chunk in ids.chunks(BATCH) {
        let claims = block_on_ready(store.claim_many(black_box(chunk), lease))
            .expect("sync")
            .expect("claim_many");
        let remember: Vec<_> = chunk
            .iter()
            .zip(&claims)
            .filter_map(|(k, c)| match c {
                Claim::Acquired(token) => Some((*k, Some(token))),
                _ => None,
            })
            .collect();
        fresh += settle_fenced(store, &remember, lease);
    }
    fresh
}

/// One fenced `settle` of the successes in `remember`: how many were kept.
fn settle_fenced(
    store: &InMemoryStore,
    remember: &[(&str, Option<&ClaimToken>)],
    lease: Duration,
) -> u64 {
    let step = Settlement {
        remember,
        lease,
        ..Settlement::default()
    };
    let settled = block_on_ready(store.settle(&step))
        .expect("sync")
        .expect("settle");
    settled.kept.iter().filter(|&&k| k).count() as u64
}

/// Outside timing: the guard must run the handler exactly once per distinct id and
/// skip every redelivery, or the numbers below measure the wrong thing.
fn sanity_check(lines: &[String], distinct: usize) {
    let n = lines.len() as u64;
    let distinct = distinct as u64;
    let expected = Tally {
        effects: distinct,
        ran: distinct,
        skipped: n - distinct,
        other: 0,
    };
    for (path, tally) in [
        ("process", run_process(&fresh_guard(), lines)),
        (
            "process_batch_100",
            run_process_batch(&fresh_guard(), lines),
        ),
    ] {
        if tally != expected {
            panic!(
                "benchmark sanity check failed for `{path}`: {} handler effects for {distinct} \
                 distinct meta.ids in {n} deliveries (expected one effect per distinct id); \
                 got {tally:?}, expected {expected:?}. The benchmark would be meaningless.",
                tally.effects
            );
        }
    }
    let ids = workload_ids(lines);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let first = first_in_chunk(&ids);
    for (path, run) in [
        ("store_single", run_store_single as StoreRun),
        ("store_batch_100", run_store_batch),
        ("store_claim_single", run_claim_single),
        ("store_claim_batch_100", run_claim_batch),
    ] {
        let fresh = run(&InMemoryStore::new(), &ids, &first);
        if fresh != distinct {
            panic!(
                "benchmark sanity check failed for `{path}`: {fresh} new ids remembered for \
                 {distinct} distinct meta.ids in {n} deliveries"
            );
        }
    }
    let (accepted, _) = run_decode(lines);
    if accepted != n {
        panic!(
            "benchmark sanity check failed for `decode_only`: Message::parse accepted {accepted} \
             of {n} workload lines (expected all)"
        );
    }
}

/// One of the store-alone runs: (store, ids, first in chunk) -> new ids.
type StoreRun = fn(&InMemoryStore, &[&str], &[bool]) -> u64;

/// For each id: whether it is the first of its value in its `BATCH` chunk.
fn first_in_chunk(ids: &[&str]) -> Vec<bool> {
    let mut first = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(BATCH) {
        let mut met = std::collections::HashSet::with_capacity(BATCH);
        first.extend(chunk.iter().map(|id| met.insert(*id)));
    }
    first
}

/// Each line's `meta.id`.
fn workload_ids(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            Message::parse(line.as_bytes(), &Limits::default())
                .ok()
                .and_then(|m| m.id().map(str::to_owned))
                .expect("every workload line has a meta.id")
        })
        .collect()
}

/// `cargo bench` passes `--bench`. Without it (`cargo test --all-targets`, an
/// unoptimised build) criterion runs each routine once as a smoke test: a small
/// workload keeps that quick, and the sanity check still runs on it.
fn workload_size() -> usize {
    if std::env::args().any(|arg| arg == "--bench") {
        DELIVERIES
    } else {
        SMOKE_DELIVERIES
    }
}

fn dedupe_throughput<M: Measurement>(c: &mut Criterion<M>) {
    let size = workload_size();
    let lines = workload::generate(size);
    assert_eq!(
        lines.len(),
        size,
        "workload generator returned the wrong line count"
    );
    let distinct = workload::count_distinct_ids(&lines);
    sanity_check(&lines, distinct);
    let expected_effects = distinct as u64;

    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Elements(lines.len() as u64));
    group.sample_size(10);
    // One iteration takes a good fraction of a second: flat sampling keeps the run
    // to a few dozen iterations per benchmark instead of 55+.
    group.sampling_mode(SamplingMode::Flat);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(15));

    group.bench_function("process", |b| {
        b.iter_batched(
            fresh_guard,
            |guard| {
                let tally = run_process(&guard, &lines);
                assert_eq!(tally.effects, expected_effects);
                // Returned so the 800k-entry store is dropped outside the timing.
                (guard, tally)
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("process_batch_100", |b| {
        b.iter_batched(
            fresh_guard,
            |guard| {
                let tally = run_process_batch(&guard, &lines);
                assert_eq!(tally.effects, expected_effects);
                (guard, tally)
            },
            BatchSize::PerIteration,
        )
    });

    // The same, on a store told up front how many ids to expect
    // (`InMemoryStore::with_reserved`): no table growth while filling.
    let distinct_ids = distinct;
    group.bench_function("process_presized", |b| {
        b.iter_batched(
            || Guard::new(InMemoryStore::new().with_reserved(distinct_ids)),
            |guard| {
                let tally = run_process(&guard, &lines);
                assert_eq!(tally.effects, expected_effects);
                (guard, tally)
            },
            BatchSize::PerIteration,
        )
    });

    group.bench_function("decode_only", |b| b.iter(|| black_box(run_decode(&lines))));
    group.bench_function("validate_floor", |b| {
        b.iter(|| black_box(run_validate_floor(&lines)))
    });

    let ids = workload_ids(&lines);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let first = first_in_chunk(&ids);
    for (name, run) in [
        ("store_single", run_store_single as StoreRun),
        ("store_batch_100", run_store_batch),
        ("store_claim_single", run_claim_single),
        ("store_claim_batch_100", run_claim_batch),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                InMemoryStore::new,
                |store| {
                    let fresh = run(&store, &ids, &first);
                    assert_eq!(fresh, expected_effects);
                    store
                },
                BatchSize::PerIteration,
            )
        });
    }

    group.finish();
}

/// The benchmark thread's time on a CPU, in ns (Linux: the first field of
/// `/proc/thread-self/schedstat`).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("BQ_BENCH_CLOCK=cpu needs /proc/thread-self/schedstat (Linux)")
}

/// Thread CPU time as a criterion measurement, formatted like wall time.
struct CpuTime;

static WALL: WallTime = WallTime;

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = Duration;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, started: u64) -> Duration {
        Duration::from_nanos(thread_cpu_ns().saturating_sub(started))
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}

fn main() {
    if std::env::var("BQ_BENCH_CLOCK").is_ok_and(|v| v == "cpu") {
        let mut c = Criterion::default()
            .with_measurement(CpuTime)
            .configure_from_args();
        dedupe_throughput(&mut c);
        c.final_summary();
    } else {
        let mut c = Criterion::default().configure_from_args();
        dedupe_throughput(&mut c);
        c.final_summary();
    }
}
