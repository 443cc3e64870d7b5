//! `AnyStore`: specs, delegation of every method, stats.

mod common;

use std::time::Duration;

use bq_dedupe::{Capabilities, Claim, Store, StoreErrorKind};
use bq_dedupe_stores::{AnyStore, DEFAULT_REDIS_PREFIX, StoreStats};
use common::{
    RedisCleanup, TempDb, check_basics, check_batches, check_claims, check_hostile_keys, ready,
    redis_prefix, redis_url,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn any_store_is_send_and_sync() {
    assert_send_sync::<AnyStore>();
    assert_send_sync::<bq_dedupe_stores::SqliteStore>();
    assert_send_sync::<bq_dedupe_stores::RedisStore>();
}

/// Every trait method, through the enum, on one store.
fn check_all(store: &AnyStore) {
    assert_eq!(
        store.capabilities(),
        Capabilities {
            claim: true,
            ttl: true,
            lease: true,
        }
    );
    check_basics(store);
    check_claims(store);
    check_batches(store);
    check_hostile_keys(store);
}

#[test]
fn any_memory_delegates_every_method() {
    let store = AnyStore::from_spec("memory").unwrap();
    assert!(matches!(store, AnyStore::Memory(_)));
    check_all(&store);
}

#[test]
fn any_sqlite_delegates_every_method() {
    let db = TempDb::new("any");
    let store = AnyStore::from_spec(&format!("sqlite:{}", db.path().display())).unwrap();
    assert!(matches!(store, AnyStore::Sqlite(_)));
    check_all(&store);
}

#[test]
fn any_redis_delegates_every_method() {
    let Some(url) = redis_url() else {
        return;
    };
    let prefix = redis_prefix("any");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let store = AnyStore::from_spec(&format!("{url}{sep}prefix={prefix}")).unwrap();
    let AnyStore::Redis(redis) = &store else {
        panic!("{store:?}");
    };
    assert_eq!(redis.prefix(), prefix);
    check_all(&store);
}

#[test]
fn any_redis_spec_defaults_to_a_prefix_no_other_sdk_uses() {
    let Some(url) = redis_url() else {
        return;
    };
    let store = AnyStore::from_spec(&url).unwrap();
    let AnyStore::Redis(redis) = &store else {
        panic!("{store:?}");
    };
    assert_eq!(redis.prefix(), DEFAULT_REDIS_PREFIX);
    // Not the PHP SDK's `bq:idem:` nor the Go SDK's `bq:idemp:` (docs/stores.md).
    assert_eq!(DEFAULT_REDIS_PREFIX, "bq:dedupe:");
    assert_eq!(redis.dialect(), bq_dedupe_stores::Dialect::Native);
    // Only reads: the default prefix may be shared with real consumers.
    assert!(store.stats().is_ok());
}

#[test]
fn any_stats_for_each_store() {
    let db = TempDb::new("any-stats");
    let mut stores = vec![
        AnyStore::from_spec("memory").unwrap(),
        AnyStore::from_spec(&format!("sqlite:{}", db.path().display())).unwrap(),
    ];
    let mut _clean = None;
    if let Some(url) = redis_url() {
        let prefix = redis_prefix("any-stats");
        stores.push(AnyStore::from_spec(&format!("{url}?prefix={prefix}")).unwrap());
        _clean = Some(RedisCleanup { url, prefix });
    }
    for store in &stores {
        assert_eq!(store.stats().unwrap(), StoreStats::default(), "{store:?}");
        ready(store.remember_many(&["a", "b", "c"], None)).unwrap();
        let Claim::Acquired(_) = ready(store.claim("d", Duration::from_secs(60))).unwrap() else {
            panic!("{store:?}");
        };
        assert_eq!(
            store.stats().unwrap(),
            StoreStats {
                remembered: 3,
                claimed: 1,
                expired: 0
            },
            "{store:?}"
        );
        assert_eq!(store.purge_expired().unwrap(), 0, "{store:?}");
    }
}

#[test]
fn any_bad_specs_are_invalid_and_unreachable_ones_unavailable() {
    for spec in [
        "",
        "memory:",
        "sqlite:",
        "file:/tmp/x",
        "redis:/x",
        "mysql://u:pw@h/db",
    ] {
        let e = AnyStore::from_spec(spec).unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec:?}: {e}");
        assert!(!e.message.contains("pw"), "{e}");
    }
    let e = AnyStore::from_spec("redis://:secret@127.0.0.1:1/0?prefix=x:").unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
    assert!(!e.message.contains("secret"), "no password in errors: {e}");
}
