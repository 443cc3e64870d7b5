//! The dedupe component under wasmtime, on the same 1,000,000-delivery workload as
//! the native benchmark (`bench/throughput.rs` at the root), with the host's
//! in-memory store behind the `store` import and a no-op handler.
//!
//! Group `component_1m`: `process` (one component call per delivery: decode, key,
//! `seen` and `remember` crossing back into the host) and `process_batch_100` (one
//! call per 100, whose store calls are batched too), each through the 1.0 free
//! functions (options on every call) and through one `consumer.guard` resource
//! (`guard_process`, `guard_process_batch_100`). Group `native_1m`: the same
//! two paths through the core natively (`Guard::process` / `process_batch` over an
//! `InMemoryStore`, a no-op handler), measured in the same run so the ratios
//! compare like with like. Group `crossing`: one tiny
//! call (`dedupe-key` of a small envelope) through the component and the same work
//! natively, whose difference is the cost of a call into the component.
//!
//! `cargo bench -p babelqueue-dedupe-host --bench component` (needs the component:
//! `scripts/build-component.sh`). Nothing here asserts anything about timings.

#[path = "../../../bench/workload.rs"]
mod workload;

use std::hint::black_box;
use std::time::Duration;

use bq_dedupe::{Guard, InMemoryStore, Message, block_on_ready, envelope::Limits};
use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{Runtime, default_component, guard_options, options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::Outcome;
use bq_dedupe_stores::AnyStore;
use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

fn deliveries() -> usize {
    // Under `cargo test --all-targets` criterion runs each routine once: keep it small.
    if std::env::args().any(|a| a == "--bench") {
        1_000_000
    } else {
        10_000
    }
}

fn runtime() -> Runtime {
    let store = AnyStore::Memory(InMemoryStore::new());
    Runtime::load(&default_component(), store, Handler::Mark).expect("the component loads")
}

/// Counts runs and skips, and checks the handler ran once per distinct id.
fn tally(outcomes: impl Iterator<Item = Outcome>, distinct: usize) {
    let (mut ran, mut other) = (0, 0);
    for o in outcomes {
        match o {
            Outcome::RunOk => ran += 1,
            Outcome::Skip => {}
            _ => other += 1,
        }
    }
    assert_eq!(
        (ran, other),
        (distinct, 0),
        "the component must run each distinct id once"
    );
}

fn bench(c: &mut Criterion) {
    let lines = workload::generate(deliveries());
    let distinct = workload::count_distinct_ids(&lines);
    let opts = options("");

    // Outside timing: the component dedupes this workload correctly on both paths.
    let mut rt = runtime();
    tally(
        lines.iter().map(|l| rt.process(l, &opts).unwrap()),
        distinct,
    );
    let mut rt = runtime();
    tally(
        lines
            .chunks(100)
            .flat_map(|c| rt.process_batch(c, &opts).unwrap()),
        distinct,
    );

    let mut group = c.benchmark_group("component_1m");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(30));
    group.throughput(Throughput::Elements(lines.len() as u64));
    group.bench_function("process", |b| {
        b.iter_batched_ref(
            runtime,
            |rt| {
                for line in &lines {
                    black_box(rt.process(black_box(line), &opts).unwrap());
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("process_batch_100", |b| {
        b.iter_batched_ref(
            runtime,
            |rt| {
                for chunk in lines.chunks(100) {
                    black_box(rt.process_batch(black_box(chunk), &opts).unwrap());
                }
            },
            BatchSize::PerIteration,
        )
    });
    guard_rows(&mut group, &lines, distinct);
    group.finish();

    let mut group = c.benchmark_group("native_1m");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(lines.len() as u64));
    group.bench_function("process", |b| {
        b.iter_batched_ref(
            || Guard::new(InMemoryStore::new()),
            |guard| {
                for line in &lines {
                    black_box(
                        block_on_ready(
                            guard.process(black_box(line.as_bytes()), async |_| {
                                Ok::<(), String>(())
                            }),
                        )
                        .unwrap(),
                    );
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("process_batch_100", |b| {
        b.iter_batched_ref(
            || Guard::new(InMemoryStore::new()),
            |guard| {
                for chunk in lines.chunks(100) {
                    black_box(
                        block_on_ready(
                            guard.process_batch(black_box(chunk), async |_| Ok::<(), String>(())),
                        )
                        .unwrap(),
                    );
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();

    let small = r#"{"job":"urn:x","trace_id":"t","data":{},"meta":{"id":"a","schema_version":1}}"#;
    let mut rt = runtime();
    let mut group = c.benchmark_group("crossing");
    group.bench_function("component_dedupe_key", |b| {
        b.iter(|| black_box(rt.dedupe_key(black_box(small), &opts).unwrap()))
    });
    group.bench_function("native_dedupe_key", |b| {
        b.iter(|| {
            black_box(
                Message::parse_str(black_box(small), &Limits::default())
                    .map(|m| m.id().map(str::len)),
            )
        })
    });
    group.finish();
}

/// `guard_process` / `guard_process_batch_100`: the same two paths through one
/// `consumer.guard` resource per iteration (options and capabilities once).
fn guard_rows(group: &mut BenchmarkGroup<'_, WallTime>, lines: &[String], distinct: usize) {
    let guarded = || {
        let mut rt = runtime();
        rt.open_guard(&guard_options(""))
            .unwrap()
            .expect("plain options");
        rt
    };
    // Outside timing: the guard dedupes this workload correctly on both paths.
    let mut rt = guarded();
    tally(lines.iter().map(|l| rt.guard_process(l).unwrap()), distinct);
    let mut rt = guarded();
    tally(
        lines
            .chunks(100)
            .flat_map(|c| rt.guard_process_batch(c).unwrap()),
        distinct,
    );
    group.bench_function("guard_process", |b| {
        b.iter_batched_ref(
            guarded,
            |rt| {
                for line in lines {
                    black_box(rt.guard_process(black_box(line)).unwrap());
                }
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("guard_process_batch_100", |b| {
        b.iter_batched_ref(
            guarded,
            |rt| {
                for chunk in lines.chunks(100) {
                    black_box(rt.guard_process_batch(black_box(chunk)).unwrap());
                }
            },
            BatchSize::PerIteration,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
