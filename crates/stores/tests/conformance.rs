//! The vendored BabelQueue conformance manifest through `Guard<AnyStore>`, for
//! every store, in plain and in claiming mode (the core's `GuardSubject`).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bq_dedupe::conformance::{self, GuardSubject};
use bq_dedupe_stores::AnyStore;
use common::{RedisCleanup, TempDb, redis_prefix, redis_url, unique};

/// Runs the manifest on a fresh guard per mode and prints `NAME: N passed, N failed`.
fn run_manifest(name: &str, open: impl Fn() -> AnyStore) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance");
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    for claiming in [false, true] {
        let label = if claiming {
            format!("{name}-claiming")
        } else {
            name.to_string()
        };
        let mut subject = GuardSubject::new(open()).with_prefix_base(unique("conf") + ":");
        if claiming {
            subject = subject.with_claiming(Duration::from_secs(30));
        }
        let load = |file: &str| std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"));
        let report =
            conformance::run(&manifest, load, &mut subject, |r| println!("{label} {r}")).unwrap();
        println!("{label}: {}", report.summary());
        // 6 envelope cases + dedup_key + 6 sequences.
        assert_eq!(report.results.len(), 13);
        assert_eq!(report.failed(), 0, "{label}: {:#?}", report.results);
    }
}

#[test]
fn conformance_memory() {
    run_manifest("memory", || AnyStore::from_spec("memory").unwrap());
}

#[test]
fn conformance_sqlite() {
    let db = TempDb::new("conformance");
    let spec = format!("sqlite:{}", db.path().display());
    run_manifest("sqlite", || AnyStore::from_spec(&spec).unwrap());
}

#[test]
fn conformance_redis() {
    let Some(url) = redis_url() else {
        return;
    };
    let prefix = redis_prefix("conformance");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    // The spec's own prefix syntax, percent-encoded as a URL query value.
    let sep = if url.contains('?') { '&' } else { '?' };
    let spec = format!("{url}{sep}prefix={}", prefix.replace(':', "%3A"));
    run_manifest("redis", || AnyStore::from_spec(&spec).unwrap());
}
