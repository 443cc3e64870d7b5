//! A Redis that stops answering: a call fails after the client's 5 s timeout,
//! once, with an error that says so. A binary of its own: it pauses the
//! server's writes (`CLIENT PAUSE ... WRITE`), which no other test may meet.

mod common;

use std::time::{Duration, Instant};

use bq_dedupe::Store;
use bq_dedupe::store::StoreErrorKind;
use bq_dedupe_stores::RedisStore;
use common::{RedisCleanup, ready, redis_prefix, redis_url};

/// A stalled server made one call take 10-15 s: the timed-out call was sent
/// again on a new connection and waited as long again (a trial's finding),
/// and its error read "Resource temporarily unavailable (os error 11)".
#[test]
fn a_stalled_server_fails_a_call_after_one_timeout() {
    let url = redis_url();
    let prefix = redis_prefix("stall");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let store = RedisStore::connect(&url, prefix).unwrap();
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let (stalled, took) = paused(&mut admin, || ready(store.remember("stalled", None)));
    let e = stalled.expect_err("no answer: the call fails");
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
    assert!(e.message.contains("no answer within 5 s"), "{e}");
    assert!(
        took < Duration::from_secs(9),
        "one timeout, not two or three: {took:?}"
    );
    // The server answers again: so does the store, on a new connection.
    ready(store.remember("after", None)).unwrap();
    assert!(ready(store.seen("after")).unwrap());

    // A pipeline's replies are waited for 5 s in all, not 5 s each (a trial:
    // a stopped server made a delivery wait 20-30 s).
    let keys = ["p-1", "p-2", "p-3", "p-4"];
    let (stalled, took) = paused(&mut admin, || ready(store.remember_many(&keys, None)));
    let e = stalled.expect_err("no answer: the call fails");
    assert!(e.message.contains("no answer within 5 s"), "{e}");
    assert!(
        took < Duration::from_secs(9),
        "one timeout for the pipeline, not one per reply: {took:?}"
    );
    ready(store.remember_many(&["p-1", "p-2"], None)).unwrap();
    assert_eq!(
        ready(store.seen_many(&["p-1", "p-2"])).unwrap(),
        [true, true]
    );
}

/// `call` while the server holds every write (`CLIENT PAUSE ... WRITE`), and
/// how long it took.
fn paused<T>(admin: &mut redis::Connection, call: impl FnOnce() -> T) -> (T, Duration) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(admin)
        .unwrap();
    let started = Instant::now();
    let answer = call();
    let took = started.elapsed();
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(admin).unwrap();
    (answer, took)
}

/// A port that takes the connection and never answers (not Redis, or a hung
/// one): refused, saying it had no answer, not "Resource temporarily
/// unavailable (os error 11)" (a trial's finding).
#[test]
fn a_server_that_never_answers_is_refused_saying_so() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || silent.accept().map(|(conn, _)| conn));
    let e = RedisStore::connect(&url, "bq-test:silent:").expect_err("no answer");
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
    assert!(e.message.contains("no answer within 5 s"), "{e}");
    drop(held);
}
