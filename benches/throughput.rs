//! Dedupe throughput over the shared 1,000,000-delivery workload (20% byte-identical
//! redeliveries, see `benches/workload.rs`).
//!
//! Group `dedupe_1m`, one iteration = the whole workload:
//! - `process`: each delivery through `Guard::process` with a no-op handler, a fresh
//!   `InMemoryStore` per iteration;
//! - `process_batch_100`: the same deliveries in chunks of 100 through
//!   `Guard::process_batch`;
//! - `process_presized`: `process` on a store made with
//!   `InMemoryStore::with_reserved(distinct ids)` (no table growth);
//! - `decode_only`: `Message::parse` alone (the floor under both).
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

use bq_dedupe::{Guard, InMemoryStore, Limits, Message, OutcomeKind, block_on_ready};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

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
    let (accepted, _) = run_decode(lines);
    if accepted != n {
        panic!(
            "benchmark sanity check failed for `decode_only`: Message::parse accepted {accepted} \
             of {n} workload lines (expected all)"
        );
    }
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

fn dedupe_throughput(c: &mut Criterion) {
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

    group.finish();
}

criterion_group!(benches, dedupe_throughput);
criterion_main!(benches);
