//! The D1 store (`D1Store`, in the fixture worker on workerd with
//! `DEDUPE_STORE = "d1"`, Miniflare's local D1) passes the store testkit:
//! random runs from several clients, each answer checked against the record
//! model on workerd's own clock, with faults injected. It runs the SQLite
//! store's statements (`bq_dedupe::store::sql`), so it follows the same rules.
//! Runs include the transactional mode (`StatementStore::commit_with`, through
//! the worker's `/store/transact`), half of them with one of the client's
//! claims as the run's own (the batch clears it): each committed run leaves
//! one effect row.
//! `make workers-test` serves the worker with `BQ_SERVE_VARS` naming D1 and
//! sets `BQ_TEST_WORKER_URL`; without it this test fails rather than skips.

use babelqueue_dedupe_workerd_testkit::{HttpStore, TOKEN, run_prefix, worker_url};
use bq_dedupe::store::sql::RULES;
use bq_dedupe_testkit::{self as testkit, Fleet, OnServer, guard_fleet};

#[test]
fn the_d1_store_follows_the_record_model_on_workerd() {
    let url = worker_url();
    testkit::check(12, || {
        let (url, prefix) = (url.clone(), run_prefix("testkit-d1"));
        let effects = HttpStore::new(&url, TOKEN, &prefix);
        OnServer::new(RULES, move || HttpStore::new(&url, TOKEN, &prefix))
            .with_timing(80, 20)
            // The transactional mode: the handler's statements with the id in one batch.
            .with_claimed_transactions(
                |store, key, ttl, claim, ok| store.transact(key, ttl, claim, ok),
                move |key| effects.effects(key).expect("count the effect rows"),
            )
    });
}

/// Four clients at once on the same few keys, transactional runs (the
/// statement batch) among the calls: each key's history linearizable against
/// the record model, and one effect row per committed run.
#[test]
fn d1_histories_are_linearizable_on_workerd() {
    let url = worker_url();
    testkit::check_histories(4, || {
        let (url, prefix) = (url.clone(), run_prefix("histories-d1"));
        let effects = HttpStore::new(&url, TOKEN, &prefix);
        Fleet::new(RULES, move || HttpStore::new(&url, TOKEN, &prefix))
            .with_timing(80, 20)
            .with_claimed_transactions(
                |store, key, ttl, claim, ok| store.transact(key, ttl, claim, ok),
                move |key| effects.effects(key).expect("count the effect rows"),
            )
    });
}

/// The guard in the loop on the D1 store: four claiming consumers (each its
/// own client) on one inbox, handlers that fail, panic, outlive their lease or
/// die before the commit; nothing lost, every second run reported
/// (`bq_dedupe_testkit::guard_fleet`).
#[test]
fn claiming_consumers_on_the_d1_store_lose_nothing() {
    let url = worker_url();
    let prefix = run_prefix("fleet-d1");
    let stores: Vec<HttpStore> = (0..4)
        .map(|_| HttpStore::new(&url, TOKEN, &prefix))
        .collect();
    let lease = std::time::Duration::from_millis(300);
    guard_fleet::check_claiming_fleet("claiming d1", &prefix, &stores, lease);
}
