//! Payload fingerprints on real backends (docs/stores.md, "Payload
//! fingerprints"): one consumer remembers an id with its payload's fingerprint,
//! another consumer (its own connection, as another process would have) gets
//! `payload-mismatch` for the same id with other data and `skip` for a
//! redelivery; the companion records are where the table says; the stores that
//! keep another SDK's records refuse the option.
//! Needs the servers of the stores' table (`scripts/with-stores.sh`, as
//! `make test` runs it).

mod common;

use std::time::Duration;

use bq_dedupe::{Guard, Message, Outcome, OutcomeKind, Store, store::StoreErrorKind};
use bq_dedupe_stores::{RedisStore, TestPlace};
use common::{
    RedisCleanup, Subject, on_backends, on_every_backend, ready, redis_prefix, redis_url,
};

fn order(id: &str, data: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"t-1","data":{data},"meta":{{"id":"{id}","schema_version":1,"queue":"orders"}},"attempts":0}}"#
    )
}

/// One delivery through `guard`; returns its outcome and whether the handler ran.
fn deliver<S: Store>(guard: &Guard<S>, body: &str) -> (OutcomeKind, bool) {
    let mut ran = false;
    let outcome = ready(guard.process(body.as_bytes(), async |_: &Message<'_>| {
        ran = true;
        Ok::<(), String>(())
    }));
    (outcome.kind(), ran)
}

/// The scenario every store of our format passes: `first` writes, `second`
/// (another connection to the same data) reads.
fn two_consumers<S: Store>(first: S, second: S, claiming: bool) {
    let guard = |store| {
        let g = Guard::new(store)
            .with_ttl(Duration::from_secs(600))
            .with_fingerprint();
        if claiming {
            g.with_claiming(Duration::from_secs(30))
        } else {
            g
        }
    };
    let (a, b) = (guard(first), guard(second));
    let paid = order("order-7", r#"{"total":10,"items":["x"]}"#);
    assert_eq!(deliver(&a, &paid), (OutcomeKind::Ran, true));
    // A redelivery, re-encoded by another producer library: a skip.
    let same = order("order-7", r#"{ "items" : [ "x" ], "total" : 10 }"#);
    assert_eq!(deliver(&b, &same), (OutcomeKind::Skipped, false));
    // The id reused for other data: caught, not run, dead-lettered.
    let other = order("order-7", r#"{"total":99,"items":["x"]}"#);
    assert_eq!(deliver(&b, &other), (OutcomeKind::PayloadMismatch, false));
    assert_eq!(deliver(&a, &other), (OutcomeKind::PayloadMismatch, false));
    // A batch mixing all three, and a fresh id: still one decide call.
    let fresh = order("order-8", r#"{"total":1}"#);
    let bodies = [paid.clone(), other.clone(), fresh.clone(), fresh];
    let outcomes = ready(b.process_batch(&bodies, async |_: &Message<'_>| Ok::<(), String>(())));
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(Outcome::kind).collect();
    assert_eq!(
        kinds,
        [
            OutcomeKind::Skipped,
            OutcomeKind::PayloadMismatch,
            OutcomeKind::Ran,
            OutcomeKind::Skipped
        ]
    );
}

/// Two connections share fingerprints on every backend of our formats, in
/// both modes (a cluster's records span slots); PostgreSQL's table is Go's
/// and refuses them.
#[test]
fn every_backend_shares_fingerprints_or_refuses_them() {
    on_every_backend("fp", |subject| {
        let store = subject.open();
        if let Some(format) = store.shared_format() {
            return refused(store, format);
        }
        two_consumers(subject.open(), subject.open(), false);
        let claiming = subject.fresh("fp-claim");
        two_consumers(claiming.open(), claiming.open(), true);
    });
}

/// `stats` counts ids: an id's fingerprint marker and record are rows or keys
/// of the store too, not counted (a docs trial read 8 for two ids).
#[test]
fn stats_count_ids_not_their_fingerprint_companions() {
    // Formats of other SDKs refuse fingerprints; a memory store lives per process.
    let counted = |subject: &Subject| {
        subject.open().shared_format().is_none()
            && !matches!(subject.backend.test, TestPlace::Fresh)
    };
    on_backends("fp-stats", counted, |subject| {
        let store = subject.open();
        let guard = Guard::new(std::sync::Arc::clone(&store)).with_fingerprint();
        for id in ["stats-a", "stats-b"] {
            assert_eq!(
                deliver(&guard, &order(id, r#"{"n":1}"#)).0,
                OutcomeKind::Ran
            );
        }
        let stats = store.stats().unwrap();
        assert_eq!(
            (stats.remembered, stats.claimed),
            (2, 0),
            "{}",
            subject.name()
        );
    });
}

#[test]
fn redis_two_connections_share_fingerprints_under_our_prefix() {
    let url = redis_url();
    let prefix = redis_prefix("fp");
    let clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let open = || RedisStore::connect(&url, prefix.clone()).unwrap();
    two_consumers(open(), open(), true);

    // The records of docs/stores.md: the id, its marker and its record, all `d`.
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", clean.prefix))
        .query(&mut conn)
        .unwrap();
    let ours: Vec<String> = keys
        .iter()
        .map(|k| k.strip_prefix(&clean.prefix).unwrap().to_string())
        .filter(|k| k.ends_with("order-7"))
        .collect();
    assert_eq!(ours.len(), 3, "the id, its marker, its record: {ours:?}");
    assert!(ours.contains(&"order-7".to_string()), "{ours:?}");
    assert!(ours.contains(&"\u{1f}fp:=order-7".to_string()), "{ours:?}");
    let record = ours
        .iter()
        .find(|k| k.len() > "\u{1f}fp:=order-7".len())
        .unwrap();
    let hash = record
        .strip_prefix("\u{1f}fp:")
        .and_then(|r| r.strip_suffix(":order-7"))
        .unwrap_or_else(|| panic!("{record:?}"));
    assert!(
        hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{record:?}"
    );
    for key in &ours {
        let value: String = redis::cmd("GET")
            .arg(format!("{}{key}", clean.prefix))
            .query(&mut conn)
            .unwrap();
        // The id was committed under its claim (`d:<token>`); its fingerprint
        // records beside it are plain remembers (`d`).
        match key.as_str() {
            "order-7" => assert!(value.starts_with("d:"), "{key:?}: {value}"),
            _ => assert_eq!(value, "d", "{key:?}"),
        }
        let ttl: i64 = redis::cmd("TTL")
            .arg(format!("{}{key}", clean.prefix))
            .query(&mut conn)
            .unwrap();
        assert!(
            (1..=600).contains(&ttl),
            "{key:?} expires with the id: {ttl}"
        );
    }
}

fn refused<S: Store>(store: S, names: &str) {
    let guard = Guard::new(store).with_fingerprint();
    let mut ran = false;
    let outcome = ready(
        guard.process(order("o-1", "{}").as_bytes(), async |_: &Message<'_>| {
            ran = true;
            Ok::<(), String>(())
        }),
    );
    assert!(!ran);
    match outcome {
        Outcome::StoreUnavailable(e) => {
            assert_eq!(e.kind, StoreErrorKind::Unsupported);
            assert!(e.message.contains(names), "{}", e.message);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        !ready(guard.store().seen("o-1")).unwrap(),
        "nothing written"
    );
}
