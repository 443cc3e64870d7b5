//! The Durable Object store (`DurableObjectStore` over `DedupeShard`s, in the
//! fixture worker on workerd) passes the store testkit: random runs from
//! several clients, each answer checked against the record model on workerd's
//! own clock, with faults injected. The worker is started by
//! `scripts/with-worker.sh` (`make workers-test`), which sets
//! `BQ_TEST_WORKER_URL`; without it this test fails rather than skips.

use babelqueue_dedupe_workerd_testkit::{HttpStore, TOKEN, run_prefix, worker_url};
use bq_dedupe_testkit::{self as testkit, Fleet, OnServer, guard_fleet};
use bq_dedupe_workers::durable::DedupeShard;

#[test]
fn the_durable_object_store_follows_the_record_model_on_workerd() {
    let url = worker_url();
    testkit::check(12, || {
        let (url, prefix) = (url.clone(), run_prefix("testkit"));
        // A request crosses a socket and miniflare: longer ticks than Redis's.
        OnServer::new(DedupeShard::RULES, move || {
            HttpStore::new(&url, TOKEN, &prefix)
        })
        .with_timing(80, 20)
    });
}

/// Four clients at once on the same few keys (the hostile one included), each
/// key's history linearizable against the record model, faults injected.
#[test]
fn durable_object_histories_are_linearizable_on_workerd() {
    let url = worker_url();
    testkit::check_histories(4, || {
        let (url, prefix) = (url.clone(), run_prefix("histories"));
        Fleet::new(DedupeShard::RULES, move || {
            HttpStore::new(&url, TOKEN, &prefix)
        })
        .with_timing(80, 20)
    });
}

/// The guard in the loop on the Durable Object store: four claiming consumers
/// (each its own client) on one inbox, handlers that fail, panic, outlive
/// their lease or die before the commit; nothing lost, every second run
/// reported (`bq_dedupe_testkit::guard_fleet`).
#[test]
fn claiming_consumers_on_the_durable_object_store_lose_nothing() {
    let url = worker_url();
    let prefix = run_prefix("fleet");
    let stores: Vec<HttpStore> = (0..4)
        .map(|_| HttpStore::new(&url, TOKEN, &prefix))
        .collect();
    let lease = std::time::Duration::from_millis(300);
    guard_fleet::check_claiming_fleet("claiming durable object", &prefix, &stores, lease);
}
