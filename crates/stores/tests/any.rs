//! `AnyStore` on every backend of the stores' table (`BACKENDS`), through its
//! spec: the semantics every store must have, delegation, stats; bad specs.

mod common;

use std::time::Duration;

use bq_dedupe::{
    Guard, Outcome, OutcomeKind, Store, store::Capabilities, store::Claim, store::StoreErrorKind,
};
use bq_dedupe_stores::{AnyStore, DEFAULT_REDIS_PREFIX, StoreStats};
use common::{
    check_basics, check_batches, check_claims, check_hostile_keys, deliver, on_every_backend,
    ready, redis_url,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn any_store_is_send_and_sync() {
    assert_send_sync::<AnyStore>();
    assert_send_sync::<bq_dedupe_stores::SqliteStore>();
    assert_send_sync::<bq_dedupe_stores::RedisStore>();
}

/// Every trait method, through the enum and its spec, on every backend of the
/// table: the semantics each store must have (tests/common), one test per
/// concern instead of one per backend.
#[test]
fn every_backend_through_its_spec_delegates_every_method() {
    on_every_backend("any", |subject| {
        let store = subject.open();
        // `AnyStore::<Variant>...`: the variant named for the backend.
        let shown = format!("{store:?}").to_lowercase();
        let backend = subject.backend.name.split('-').next().unwrap_or_default();
        assert!(
            shown.starts_with(&format!("anystore::{backend}")),
            "{backend}: {store:?}"
        );
        #[cfg(feature = "redis")]
        if let AnyStore::Redis(redis) = &*store {
            assert_eq!(redis.prefix(), subject.place);
        }
        // Ours are whole; another SDK's format has what its records allow.
        if subject.format.is_none() {
            assert_eq!(store.capabilities(), Capabilities::ALL);
        }
        // Whose records these are (the guard refuses fingerprints on another
        // SDK's): PostgreSQL's table is the Go SDK's; a dialect, its SDK's.
        let shared = store.shared_format();
        match (subject.backend.name, subject.format) {
            ("postgres", None) => assert_eq!(shared, Some("the Go SDK's PostgreSQL")),
            (_, None) => assert_eq!(shared, None, "{}", subject.name()),
            (_, Some(format)) => {
                let sdk = if format.ends_with("php") {
                    "PHP SDK"
                } else {
                    "Go SDK"
                };
                assert!(
                    shared.is_some_and(|s| s.contains(sdk)),
                    "{}: {shared:?}",
                    subject.name()
                );
            }
        }
    });
}

#[test]
fn every_backend_basics() {
    on_every_backend("basics", |subject| check_basics(&subject.open()));
}

#[test]
fn every_backend_claims_and_releases_by_owner_only() {
    on_every_backend("claims", |subject| check_claims(&subject.open()));
}

#[test]
fn every_backend_batches_agree_with_single_calls() {
    on_every_backend("batches", |subject| check_batches(&subject.open()));
}

#[test]
fn every_backend_stores_hostile_keys_exactly() {
    on_every_backend("hostile", |subject| check_hostile_keys(&subject.open()));
}

#[test]
fn any_redis_spec_defaults_to_a_prefix_no_other_sdk_uses() {
    let url = redis_url();
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

/// A guard on the store a spec opens (claiming where it claims): runs, skips
/// a redelivery, retries a failure.
#[test]
fn every_backend_through_its_spec_guards_a_delivery() {
    on_every_backend("spec-guard", |subject| {
        let mut guard = Guard::new(subject.open());
        if subject.caps.claim {
            guard = guard.with_claiming(Duration::from_secs(30));
        }
        assert_eq!(deliver(&guard, "g-1", true), Outcome::Ran);
        assert_eq!(deliver(&guard, "g-1", true).kind(), OutcomeKind::Skipped);
        assert_eq!(deliver(&guard, "g-2", false).kind(), OutcomeKind::Failed);
        assert_eq!(deliver(&guard, "g-2", true), Outcome::Ran);
    });
}

#[test]
fn every_backends_stats_count_ids_and_claims() {
    on_every_backend("any-stats", |subject| {
        let store = subject.open();
        assert_eq!(store.stats().unwrap(), StoreStats::default(), "{store:?}");
        ready(store.remember_many(&["a", "b", "c"], None)).unwrap();
        if subject.caps.claim {
            let Claim::Acquired(_) = ready(store.claim("d", Duration::from_secs(60))).unwrap()
            else {
                panic!("{store:?}");
            };
        }
        assert_eq!(
            store.stats().unwrap(),
            StoreStats {
                remembered: 3,
                claimed: u64::from(subject.caps.claim),
                expired: 0
            },
            "{store:?}"
        );
        assert_eq!(store.purge_expired().unwrap(), 0, "{store:?}");
    });
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

/// The spec tables written for readers (docs/stores.md, docs/cli.md, the
/// crate's docs) list every backend of the table: a new row without its line
/// in one of them fails here, not in a user's hands.
#[test]
fn every_spec_table_lists_every_backend() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for file in ["docs/stores.md", "docs/cli.md", "crates/stores/src/lib.rs"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let rows: Vec<&str> = text
            .lines()
            .map(|line| line.trim_start_matches("//!").trim_start())
            .filter(|line| line.starts_with("| `"))
            .collect();
        for backend in bq_dedupe_stores::BACKENDS {
            let scheme = backend.schemes[0];
            assert!(
                rows.iter().any(|row| row[3..].starts_with(scheme)),
                "{file}: no spec table row for {scheme} (backend {})",
                backend.name
            );
        }
    }
}
