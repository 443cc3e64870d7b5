//! The Durable Object store (`DurableObjectStore` over `DedupeShard`s, in the
//! example worker on workerd) passes the core's store testkit: random runs from
//! several clients, each answer checked against the record model on workerd's
//! own clock, with faults injected. The worker is started by
//! `scripts/with-worker.sh` (`make workers-test`), which sets
//! `BQ_TEST_WORKER_URL`; without it this test fails rather than skips.

use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue_dedupe_workerd_testkit::HttpStore;
use bq_dedupe::testkit::{self, Fleet, OnServer};
use bq_dedupe_workers::durable::DedupeShard;

/// The admin token `scripts/with-worker.sh` configures.
const TOKEN: &str = "test-admin-token-0123456789";

fn worker_url() -> String {
    std::env::var("BQ_TEST_WORKER_URL")
        .expect("BQ_TEST_WORKER_URL: run this test through scripts/with-worker.sh")
}

#[test]
fn the_durable_object_store_follows_the_record_model_on_workerd() {
    let url = worker_url();
    static RUN: AtomicU32 = AtomicU32::new(0);
    testkit::check(12, || {
        // A fresh key space per run: the shard keeps every earlier run's rows.
        let prefix = format!(
            "testkit-{}-{}:",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        );
        let url = url.clone();
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
    static RUN: AtomicU32 = AtomicU32::new(0);
    testkit::check_histories(4, || {
        let prefix = format!(
            "histories-{}-{}:",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        );
        let url = url.clone();
        Fleet::new(DedupeShard::RULES, move || {
            HttpStore::new(&url, TOKEN, &prefix)
        })
        .with_timing(80, 20)
    });
}
