//! `RedisStore` on a real 3-node Redis Cluster at `BQ_TEST_REDIS_CLUSTER_URL`
//! (`make test` starts one; without it these tests fail). Keys of one batch land
//! on different slots and nodes: every batch is per-key commands and scripts,
//! never a cross-slot `MGET`. The record format is Redis (native) in
//! docs/stores.md.

mod common;

use std::time::Duration;

use bq_dedupe::{Guard, Outcome, OutcomeKind, Store, store::Claim};
use bq_dedupe_stores::{AnyStore, Dialect, RedisStore, StoreStats};
use common::{ClusterCleanup, cluster_nodes, deliver, ready, redis_cluster_spec, redis_prefix};

fn store(tag: &str) -> (RedisStore, ClusterCleanup) {
    store_in(tag, Dialect::Native)
}

fn store_in(tag: &str, dialect: Dialect) -> (RedisStore, ClusterCleanup) {
    let spec = redis_cluster_spec();
    let prefix = redis_prefix(tag);
    let store =
        RedisStore::connect_cluster(&cluster_nodes(&spec), prefix.clone(), dialect).unwrap();
    (store, ClusterCleanup { spec, prefix })
}

/// A cluster spec pointed at a server out of cluster mode is refused at the
/// open, said so: it opened without a word, and every call failed "Missing
/// slot coverage", store-unavailable, run after run (a trial).
#[test]
fn a_cluster_spec_on_a_server_out_of_cluster_mode_is_refused_at_the_open() {
    let plain = common::redis_url();
    let e = RedisStore::connect_cluster(
        std::slice::from_ref(&plain),
        redis_prefix("not-a-cluster"),
        Dialect::Native,
    )
    .map(drop)
    .unwrap_err();
    assert_eq!(e.kind, bq_dedupe::store::StoreErrorKind::Invalid, "{e}");
    assert!(e.message.contains("out of cluster mode"), "{e}");
    let spec = plain.replacen("redis://", "redis+cluster://", 1);
    let e = AnyStore::from_spec(&spec).map(drop).unwrap_err();
    assert!(e.message.contains("out of cluster mode"), "{e}");
}

/// A batch of 100 ids spread over every node: one `seen_many`, `claim_many` and
/// `settle` each, where an `MGET` of the same keys is refused as cross-slot.
#[test]
fn cluster_batch_of_100_spans_every_node() {
    let (store, clean) = store("wide");
    let ids: Vec<String> = (0..100).map(|i| format!("wide-{i}")).collect();
    let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
    // What a batch would meet as one MGET on a node (the cluster client
    // splits one by slot itself; the server refuses it).
    let mut conn = redis::Client::open(cluster_nodes(&clean.spec)[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut mget = redis::cmd("MGET");
    for id in &ids {
        mget.arg(format!("{}{id}", clean.prefix));
    }
    let e = mget.query::<Vec<Option<String>>>(&mut conn).unwrap_err();
    assert!(e.to_string().to_uppercase().contains("CROSSSLOT"), "{e}");

    let lease = Duration::from_secs(60);
    let claims = ready(store.claim_many(&keys, lease)).unwrap();
    assert!(claims.iter().all(|c| matches!(c, Claim::Acquired(_))));
    let guard = Guard::new(&store).with_claiming(lease);
    let bodies: Vec<String> = ids.iter().map(|id| common::envelope(id)).collect();
    let other = ready(guard.process_batch(&bodies, async |_| Ok::<(), String>(())));
    assert!(
        other.iter().all(|o| o.kind() == OutcomeKind::Parked),
        "held by the first claims: {other:?}"
    );
    let remember: Vec<_> = keys
        .iter()
        .zip(&claims)
        .map(|(k, c)| match c {
            Claim::Acquired(t) => (*k, Some(t)),
            _ => unreachable!(),
        })
        .collect();
    let settled = ready(store.settle(&bq_dedupe::store::Settlement {
        remember: &remember,
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(settled.kept, vec![true; 100]);
    assert_eq!(ready(store.seen_many(&keys)).unwrap(), vec![true; 100]);
    let again = ready(guard.process_batch(&bodies, async |_| Ok::<(), String>(())));
    assert!(again.iter().all(|o| o.kind() == OutcomeKind::Skipped));
}

#[test]
fn cluster_spec_opens_every_dialect() {
    let spec = redis_cluster_spec();
    let prefix = redis_prefix("spec");
    let _clean = ClusterCleanup {
        spec: spec.clone(),
        prefix: prefix.clone(),
    };
    for dialect in ["native", "php", "go"] {
        let full = format!(
            "{spec}?dialect={dialect}&prefix={}",
            prefix.replace(':', "%3A")
        );
        let store = AnyStore::from_spec(&full).unwrap();
        let AnyStore::Redis(redis) = &store else {
            panic!("{store:?}");
        };
        assert_eq!(redis.dialect().name(), dialect);
        let guard = Guard::new(&store);
        let id = format!("{dialect}-1");
        assert_eq!(deliver(&guard, &id, true), Outcome::Ran);
        assert_eq!(deliver(&guard, &id, true).kind(), OutcomeKind::Skipped);
    }
}

/// `stats` scans every master: ids and claims spread over the nodes all count.
#[test]
fn cluster_stats_count_every_node() {
    for dialect in [Dialect::Native, Dialect::Php] {
        let (store, _clean) = store_in("stats", dialect);
        let ids: Vec<String> = (0..30).map(|i| format!("s-{i}")).collect();
        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        ready(store.remember_many(&keys, None)).unwrap();
        let claims: Vec<String> = (0..5).map(|i| format!("c-{i}")).collect();
        let claim_keys: Vec<&str> = claims.iter().map(String::as_str).collect();
        ready(store.claim_many(&claim_keys, Duration::from_secs(60))).unwrap();
        assert_eq!(
            store.stats().unwrap(),
            StoreStats {
                remembered: 30,
                claimed: 5,
                expired: 0
            },
            "{dialect:?}"
        );
    }
}

/// Every node forgets the scripts (as after a failover to a fresh replica): the
/// next batch loads them again and goes through.
#[test]
fn cluster_scripts_are_reloaded_after_script_flush() {
    let (store, clean) = store("flush");
    let flush = || {
        for node in cluster_nodes(&clean.spec) {
            let mut conn = redis::Client::open(node.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        }
    };
    let ids: Vec<String> = (0..20).map(|i| format!("f-{i}")).collect();
    let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
    let claims = ready(store.claim_many(&keys, Duration::from_secs(60))).unwrap();
    flush();
    let remember: Vec<_> = keys
        .iter()
        .zip(&claims)
        .map(|(k, c)| match c {
            Claim::Acquired(t) => (*k, Some(t)),
            other => panic!("{other:?}"),
        })
        .collect();
    let settled = ready(store.settle(&bq_dedupe::store::Settlement {
        remember: &remember,
        ..Default::default()
    }))
    .unwrap();
    assert_eq!(settled.kept, vec![true; 20]);
}

/// A slot moved to another master while a consumer runs (a reshard; a
/// failover moves slots the same way): the cluster client follows a MOVED
/// for one command but not in a pipeline's replies, and the store kept its
/// stale slot map, so every later call on the moved slot failed "Moved"
/// until the process ended, and a running handler's renewals failed until
/// its claim lapsed and another consumer ran the id beside it (a trial).
/// The store now reads the map again and sends the call once more.
#[test]
fn a_slot_moved_to_another_master_is_followed() {
    let spec = redis_cluster_spec();
    // One hash tag: every key of this test in one slot, moved below.
    let prefix = format!("{{{}}}:", redis_prefix("moved"));
    let clean = ClusterCleanup {
        spec: spec.clone(),
        prefix: prefix.clone(),
    };
    let store = RedisStore::connect_cluster(&cluster_nodes(&spec), prefix.clone(), Dialect::Native)
        .unwrap();
    let lease = Duration::from_secs(60);
    let guard = Guard::new(&store).with_claiming(lease);
    let ids = ["moved-1", "moved-2", "moved-3"];
    let bodies: Vec<String> = ids.iter().map(|id| common::envelope(id)).collect();
    let first = ready(guard.process_batch(&bodies[..2], async |_| Ok::<(), String>(())));
    assert!(
        first.iter().all(|o| o.kind() == OutcomeKind::Ran),
        "{first:?}"
    );
    let held = ready(store.claim_many(&["moved-held"], lease)).unwrap();
    let Claim::Acquired(token) = &held[0] else {
        panic!("{held:?}")
    };

    assert!(
        common::move_slot_of(&clean.spec, &format!("{prefix}x")).unwrap(),
        "moved"
    );

    // The store's connection still holds the old map: each kind of call.
    let again = ready(guard.process_batch(&bodies, async |_| Ok::<(), String>(())));
    let kinds: Vec<_> = again.iter().map(|o| o.kind()).collect();
    assert_eq!(
        kinds,
        [OutcomeKind::Skipped, OutcomeKind::Skipped, OutcomeKind::Ran],
        "{again:?}"
    );
    assert!(
        ready(store.renew("moved-held", token, lease)).unwrap(),
        "the claim is still ours"
    );
    assert_eq!(
        deliver(&guard, "moved-held", true).kind(),
        OutcomeKind::Parked
    );
}
