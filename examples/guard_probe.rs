//! A probe for the part of `Guard::process` that is not decoding: the bench
//! workload (first `N` lines, default 200,000) through one path, `PASSES` times
//! (default 7, a fresh store each), printing the median ns per delivery. Meant for
//! A/B runs of two builds back to back, and for `perf stat -e instructions`
//! (instruction counts are far steadier than time on a shared machine).
//!
//! ```text
//! cargo run --release --example guard_probe -- MODE [N] [PASSES]
//! ```
//!
//! `MODE`: `decode` (`Message::parse` only), `process` (`Guard::process`, no-op
//! handler), `batch` (`Guard::process_batch`, chunks of 100), `store` (the store
//! alone: `seen`, then `remember` on a miss, for each line's id, the ids read
//! beforehand). `process - decode` is the guard + store share. Measures, asserts
//! nothing about time; it does check the effects count.

#[path = "../bench/workload.rs"]
mod workload;

use std::time::Instant;

use bq_dedupe::{
    Guard, InMemoryStore, Message, OutcomeKind, Store, block_on_ready, envelope::Limits,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("process", String::as_str).to_owned();
    let n: usize = args
        .get(1)
        .map_or(200_000, |s| s.replace('_', "").parse().unwrap());
    let passes: usize = args.get(2).map_or(7, |s| s.parse().unwrap());
    let lines = workload::generate(n);
    let distinct = workload::count_distinct_ids(&lines) as u64;
    let ids: Vec<String> = lines
        .iter()
        .map(|l| {
            let m = Message::parse(l.as_bytes(), &Limits::default()).unwrap();
            m.id().unwrap().to_owned()
        })
        .collect();
    let mut per = Vec::with_capacity(passes);
    for _ in 0..passes {
        let guard = Guard::new(InMemoryStore::new());
        let started = Instant::now();
        let effects = match mode.as_str() {
            "decode" => {
                lines
                    .iter()
                    .filter(|l| Message::parse(l.as_bytes(), &Limits::default()).is_ok())
                    .count() as u64
                    - (n as u64 - distinct)
            }
            "process" => {
                let mut ran = 0u64;
                for l in &lines {
                    let o = block_on_ready(guard.process(l.as_bytes(), async |_m| {
                        Ok::<(), std::convert::Infallible>(())
                    }))
                    .unwrap();
                    ran += u64::from(o.kind() == OutcomeKind::Ran);
                }
                ran
            }
            "batch" => {
                let mut ran = 0u64;
                for chunk in lines.chunks(100) {
                    let os =
                        block_on_ready(guard.process_batch(chunk, async |_m| {
                            Ok::<(), std::convert::Infallible>(())
                        }))
                        .unwrap();
                    ran += os.iter().filter(|o| o.kind() == OutcomeKind::Ran).count() as u64;
                }
                ran
            }
            "store" => {
                let store = guard.store();
                let mut ran = 0u64;
                for id in &ids {
                    if !block_on_ready(store.seen(id)).unwrap().unwrap() {
                        block_on_ready(store.remember(id, None)).unwrap().unwrap();
                        ran += 1;
                    }
                }
                ran
            }
            other => panic!("unknown mode {other:?} (decode, process, batch, store)"),
        };
        let ns = started.elapsed().as_nanos() as f64 / n as f64;
        assert_eq!(effects, distinct, "{mode}: wrong effects count");
        per.push(ns);
        drop(guard);
    }
    per.sort_by(f64::total_cmp);
    let median = per[per.len() / 2];
    println!(
        "{mode}: {n} lines, {passes} passes, median {median:.1} ns/delivery (min {:.1}, max {:.1})",
        per[0],
        per[per.len() - 1]
    );
}
