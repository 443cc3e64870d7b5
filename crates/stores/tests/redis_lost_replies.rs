//! A Redis claim pipeline whose replies are lost, through a proxy that passes
//! the requests on and drops the replies. A binary of its own, beside
//! `redis_reconnect.rs`, which counts the server's connections.

mod common;

use bq_dedupe::Store;
use bq_dedupe_stores::RedisStore;
use common::{RedisCleanup, lossy_proxy, ready, redis_prefix, redis_url};

/// A store under a fresh prefix, through a [`lossy_proxy`] to the test server
/// that loses `drops` replies to requests carrying `needle`; and the prefix's
/// cleanup.
fn through_lossy_proxy(
    tag: &str,
    needle: &'static [u8],
    drops: usize,
) -> (RedisStore, RedisCleanup) {
    let url = redis_url();
    let prefix = redis_prefix(tag);
    let upstream = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let proxy = lossy_proxy(upstream, needle, drops).address;
    let store = RedisStore::connect(&format!("redis://{proxy}/0"), prefix.clone()).unwrap();
    (store, RedisCleanup { url, prefix })
}

/// Hole 3 of the store-contract issue (failed on 6ddd708): a claim pipeline
/// whose replies are lost (the first send and the store's one retry) fails, but
/// its `SET NX`s landed. Those claims are given back, so the ids are not held
/// for a whole lease by a call that answered an error.
#[test]
fn redis_claims_of_a_failed_pipeline_are_released() {
    let (store, clean) = through_lossy_proxy("lost-claims", b"NX", 2);
    let (url, prefix) = (&clean.url, &clean.prefix);
    let keys = ["a", "b", "c"];
    let claimed = ready(store.claim_many(&keys, std::time::Duration::from_secs(600)));
    assert!(
        claimed.is_err(),
        "both sends lost their replies: {claimed:?}"
    );
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    for key in keys {
        let value: Option<String> = redis::cmd("GET")
            .arg(format!("{prefix}{key}"))
            .query(&mut admin)
            .unwrap();
        assert_eq!(
            value, None,
            "{key}: a claim of the failed call stayed behind"
        );
    }
}

/// A claim whose reply was lost once is sent again on a fresh connection and
/// answers its own claim; the store counts the call as sent again, since its
/// first sending took effect too (the history checker holds both sendings).
#[test]
fn redis_a_claim_sent_again_is_counted_and_answers_its_own_claim() {
    let (store, _clean) = through_lossy_proxy("resent-claim", b"NX", 1);
    assert_eq!(store.resent_calls(), 0);
    let claimed = ready(store.claim_many(&["a"], std::time::Duration::from_secs(600))).unwrap();
    assert!(
        matches!(claimed[..], [bq_dedupe::store::Claim::Acquired(_)]),
        "the first sending's claim is ours: {claimed:?}"
    );
    assert_eq!(store.resent_calls(), 1);
}

/// A forget whose reply was lost is not sent again: a second `DEL` would also
/// delete a claim another consumer took between the two sendings. It fails,
/// and its first sending took effect.
#[test]
fn redis_a_forget_whose_reply_was_lost_is_not_sent_again() {
    let (store, clean) = through_lossy_proxy("lost-forget", b"DEL", 1);
    ready(store.remember("a", None)).unwrap();
    let forgot = ready(store.forget("a"));
    assert!(forgot.is_err(), "its reply was lost: {forgot:?}");
    assert_eq!(store.resent_calls(), 0);
    let mut admin = redis::Client::open(clean.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let value: Option<String> = redis::cmd("GET")
        .arg(format!("{}a", clean.prefix))
        .query(&mut admin)
        .unwrap();
    assert_eq!(value, None, "the first sending reached the server");
}
