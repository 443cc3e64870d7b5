//! Claim races: 16 threads, each with its own connection, go for one id at once.

mod common;

use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bq_dedupe::{Guard, OutcomeKind, Store, store::Claim};
use common::{claiming, envelope, on_a_server, on_backends, ready};

const THREADS: usize = 16;
const ROUNDS: usize = 5;

/// Each thread opens its own store, then all claim the same ids in lockstep.
/// Exactly one claim per id may be acquired.
fn claim_race<S: Store>(open: impl Fn() -> S + Sync) {
    let barrier = Barrier::new(THREADS);
    let answers: Vec<Vec<Claim>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    // A thread whose open or claim fails still meets every barrier, so
                    // the others are not left waiting: the failure is raised after.
                    let store = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&open));
                    let answers: Vec<Result<Claim, String>> = (0..ROUNDS)
                        .map(|round| {
                            barrier.wait();
                            let store = store.as_ref().map_err(|_| "open panicked".to_string())?;
                            ready(store.claim(&format!("race-{round}"), Duration::from_secs(60)))
                                .map_err(|e| e.to_string())
                        })
                        .collect();
                    answers
                        .into_iter()
                        .collect::<Result<Vec<Claim>, String>>()
                        .unwrap()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for round in 0..ROUNDS {
        let claims: Vec<&Claim> = answers.iter().map(|a| &a[round]).collect();
        let acquired = claims
            .iter()
            .filter(|c| matches!(c, Claim::Acquired(_)))
            .count();
        assert_eq!(acquired, 1, "round {round}: {claims:?}");
        assert!(
            claims
                .iter()
                .all(|c| matches!(c, Claim::Acquired(_) | Claim::Held)),
            "{claims:?}"
        );
    }
}

/// Each thread opens its own store behind a claiming guard, and all deliver the
/// same id at once; the handler (20 ms) must run exactly once.
fn guard_race<S: Store>(open: impl Fn() -> S + Sync) {
    let barrier = Barrier::new(THREADS);
    let runs = AtomicU32::new(0);
    let body = envelope("guarded-id");
    let kinds: Vec<OutcomeKind> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    // Meet the barrier even if opening fails, so no thread waits forever.
                    let store = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&open));
                    barrier.wait();
                    let store = store.unwrap_or_else(|_| panic!("opening the store panicked"));
                    let guard = Guard::new(store).with_claiming(Duration::from_secs(60));
                    ready(guard.process(body.as_bytes(), async |_| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        Ok::<(), String>(())
                    }))
                    .kind()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == OutcomeKind::Ran).count(), 1);
    assert!(
        kinds.iter().all(|k| matches!(
            k,
            OutcomeKind::Ran | OutcomeKind::Parked | OutcomeKind::Skipped
        )),
        "{kinds:?}"
    );
}

#[test]
fn claim_race_16_connections_one_acquired_on_every_backend() {
    on_backends("race", claiming, |subject| claim_race(|| subject.open()));
}

#[test]
fn guard_race_16_connections_runs_handler_once_on_every_backend() {
    on_backends("guard-race", claiming, |subject| {
        guard_race(|| subject.open())
    });
}

/// 16 consumers each deliver the same batch of 20 ids at once; each id runs
/// exactly once (claims and commits of overlapping batches: one consumer
/// claims it, the others skip or park).
#[test]
fn batch_race_16_connections_runs_each_id_once_on_every_backend() {
    on_backends("batch-race", claiming, |subject| {
        batch_race(|| subject.open())
    });
}

fn batch_race<S: Store>(open: impl Fn() -> S + Sync) {
    let barrier = Barrier::new(THREADS);
    let ids: Vec<String> = (0..20).map(|i| common::unique(&format!("b{i}"))).collect();
    let bodies: Vec<String> = ids.iter().map(|id| envelope(id)).collect();
    let runs = std::sync::Mutex::new(std::collections::BTreeMap::<String, u32>::new());
    std::thread::scope(|s| {
        for n in 0..THREADS {
            let (barrier, bodies, runs, open) = (&barrier, &bodies, &runs, &open);
            s.spawn(move || {
                // A failed open still meets the barrier (the others would wait
                // forever), then fails this thread, and so the test.
                let store = std::panic::catch_unwind(std::panic::AssertUnwindSafe(open));
                // Half the consumers see the batch reversed: overlapping locks in
                // both orders.
                let mut mine = bodies.clone();
                if n % 2 == 1 {
                    mine.reverse();
                }
                barrier.wait();
                let store = store.unwrap_or_else(|_| panic!("opening the store panicked"));
                let guard = Guard::new(store).with_claiming(Duration::from_secs(60));
                ready(guard.process_batch(&mine, async |msg| {
                    *runs
                        .lock()
                        .unwrap()
                        .entry(msg.id().unwrap().to_string())
                        .or_default() += 1;
                    Ok::<(), String>(())
                }));
            });
        }
    });
    let runs = runs.into_inner().unwrap();
    for id in &ids {
        assert_eq!(runs.get(id), Some(&1), "{id}: {runs:?}");
    }
}

#[test]
fn shared_any_store_guard_race_runs_handler_once() {
    // One store shared across threads (so AnyStore must be Send + Sync).
    on_backends(
        "shared",
        |b| !on_a_server(b),
        |subject| {
            let store = subject.open();
            guard_race(|| store.clone());
            claim_race(|| store.clone());
        },
    );
}
