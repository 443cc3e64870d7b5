//! The vendored BabelQueue conformance manifest through `Guard<AnyStore>`, for
//! every store, in plain and in claiming mode (the core's `GuardSubject`).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bq_dedupe::conformance::{self, GuardSubject};
use bq_dedupe_stores::AnyStore;
use common::{
    ClusterCleanup, PgCleanup, RedisCleanup, TempDb, postgres_table, postgres_url,
    redis_cluster_spec, redis_prefix, redis_url, unique,
};

/// Runs the manifest on a fresh guard per mode and prints `NAME: N passed, N failed`.
fn run_manifest(name: &str, open: impl Fn() -> AnyStore) {
    run_manifest_modes(name, &[false, true], open);
}

/// [`run_manifest`] in the given modes (`true`: claiming).
fn run_manifest_modes(name: &str, modes: &[bool], open: impl Fn() -> AnyStore) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance");
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    for &claiming in modes {
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

/// The Redis spec of `url` with our query parameters added.
fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

#[test]
fn conformance_redis_php_and_go_dialects() {
    let url = redis_url().expect("conformance runs with a real Redis (make test starts one)");
    for (dialect, modes) in [("php", &[false, true][..]), ("go", &[false][..])] {
        let prefix = redis_prefix(&format!("conformance-{dialect}"));
        let _clean = RedisCleanup {
            url: url.clone(),
            prefix: prefix.clone(),
        };
        let spec = with_query(
            &url,
            &format!("dialect={dialect}&prefix={}", prefix.replace(':', "%3A")),
        );
        run_manifest_modes(&format!("redis-{dialect}"), modes, || {
            AnyStore::from_spec(&spec).unwrap()
        });
    }
}

#[test]
fn conformance_redis_cluster() {
    let spec = redis_cluster_spec();
    let prefix = redis_prefix("conformance");
    let _clean = ClusterCleanup {
        spec: spec.clone(),
        prefix: prefix.clone(),
    };
    let full = with_query(&spec, &format!("prefix={}", prefix.replace(':', "%3A")));
    run_manifest("redis-cluster", || AnyStore::from_spec(&full).unwrap());
}

#[test]
fn conformance_postgres() {
    let url = postgres_url();
    let table = postgres_table("conformance");
    let _clean = PgCleanup {
        url: url.clone(),
        table: table.clone(),
    };
    let spec = with_query(&url, &format!("table={table}"));
    run_manifest("postgres", || AnyStore::from_spec(&spec).unwrap());
}
