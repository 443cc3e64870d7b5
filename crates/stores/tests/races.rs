//! Claim races: 16 threads, each with its own connection, go for one id at once.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use bq_dedupe::{Claim, Guard, OutcomeKind, Store};
use bq_dedupe_stores::{AnyStore, RedisStore, SqliteStore};
use common::{RedisCleanup, TempDb, envelope, ready, redis_prefix, redis_url};

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
                    let store = open();
                    (0..ROUNDS)
                        .map(|round| {
                            barrier.wait();
                            ready(store.claim(&format!("race-{round}"), Duration::from_secs(60)))
                                .unwrap()
                        })
                        .collect::<Vec<Claim>>()
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
                    let guard = Guard::new(open()).with_claiming(Duration::from_secs(60));
                    barrier.wait();
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
fn sqlite_claim_race_16_connections_one_acquired() {
    let db = TempDb::new("race");
    claim_race(|| AnyStore::from(SqliteStore::open(db.path()).unwrap()));
}

#[test]
fn sqlite_guard_race_16_connections_runs_handler_once() {
    let db = TempDb::new("guard-race");
    guard_race(|| AnyStore::from(SqliteStore::open(db.path()).unwrap()));
}

#[test]
fn redis_claim_race_16_connections_one_acquired() {
    let Some(url) = redis_url() else {
        return;
    };
    let prefix = redis_prefix("race");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    claim_race(|| AnyStore::from(RedisStore::connect(&url, prefix.clone()).unwrap()));
}

#[test]
fn redis_guard_race_16_connections_runs_handler_once() {
    let Some(url) = redis_url() else {
        return;
    };
    let prefix = redis_prefix("guard-race");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    guard_race(|| AnyStore::from(RedisStore::connect(&url, prefix.clone()).unwrap()));
}

#[test]
fn shared_any_store_guard_race_runs_handler_once() {
    // One store shared across threads (so AnyStore must be Send + Sync).
    let db = TempDb::new("shared");
    for spec in [
        "memory".to_string(),
        format!("sqlite:{}", db.path().display()),
    ] {
        let store = Arc::new(AnyStore::from_spec(&spec).unwrap());
        guard_race(|| store.clone());
        claim_race(|| store.clone());
    }
}
