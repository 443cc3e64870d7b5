//! A probe for the component's batch path, for profiling: the bench workload's
//! first `N` lines (default 200,000) through one `consumer.guard` resource in
//! batches of 100 (`guard.process-batch`, the host's in-memory store, a no-op
//! handler), `PASSES` times (default 5, a fresh instance each), printing the
//! median ns per delivery. Measures, asserts nothing about time; it does check
//! that every distinct id ran once.
//!
//! ```text
//! cargo run --release -p babelqueue-dedupe-host --example component_probe -- [N] [PASSES]
//! BQ_DEDUPE_COMPONENT=other.component.wasm BQ_DEDUPE_PERFMAP=1 perf record ...
//! ```

#[path = "../../../bench/workload.rs"]
mod workload;

use std::time::Instant;

use bq_dedupe::InMemoryStore;
use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{Runtime, default_component, guard_options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::Outcome;
use bq_dedupe_stores::AnyStore;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args
        .first()
        .map_or(200_000, |s| s.replace('_', "").parse().unwrap());
    let passes: usize = args.get(1).map_or(5, |s| s.parse().unwrap());
    let lines = workload::generate(n);
    let distinct = workload::count_distinct_ids(&lines);
    let mut per = Vec::with_capacity(passes);
    for _ in 0..passes {
        let store = AnyStore::Memory(InMemoryStore::new());
        let mut rt = Runtime::load(&default_component(), store, Handler::Mark).expect("loads");
        rt.open_guard(&guard_options(""))
            .unwrap()
            .expect("plain options");
        let started = Instant::now();
        let mut ran = 0;
        for chunk in lines.chunks(100) {
            for outcome in rt.guard_process_batch(chunk).expect("no trap") {
                ran += usize::from(outcome == Outcome::RunOk);
            }
        }
        per.push(started.elapsed().as_nanos() as f64 / n as f64);
        assert_eq!(ran, distinct, "each distinct id runs once");
    }
    per.sort_by(f64::total_cmp);
    println!(
        "guard.process-batch(100): {n} lines, {passes} passes, median {:.1} ns/delivery (min {:.1}, max {:.1})",
        per[passes / 2],
        per[0],
        per[passes - 1]
    );
}
