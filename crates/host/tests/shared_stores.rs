//! `bq-dedupe` (the real binary and component) on the shared stores of issue 10:
//! PostgreSQL, a Redis Cluster, and Redis in the PHP and Go SDKs' record formats
//! (docs/stores.md). The servers are real (`BQ_TEST_POSTGRES_URL`,
//! `BQ_TEST_REDIS_CLUSTER_URL`, `BQ_TEST_REDIS_URL`, started by `make test`);
//! without them these tests fail. Raw records are written with the servers' own
//! clients (`psql`, `redis-cli`), the way the other SDKs write them.

use std::io::Write;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::json;

mod common;

use common::{bq, decisions, scratch};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run these tests through make test (it starts the servers)")
    })
}

/// A name no other test or run uses.
fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn with_query(url: &str, query: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{query}")
}

fn postgres_spec(tag: &str) -> String {
    with_query(
        &var("BQ_TEST_POSTGRES_URL"),
        &format!("table=bqh_{}", unique(tag)),
    )
}

fn cluster_spec(tag: &str) -> String {
    with_query(
        &var("BQ_TEST_REDIS_CLUSTER_URL"),
        &format!("prefix=bq-test%3A{}%3A", unique(tag)),
    )
}

fn redis_spec(tag: &str, dialect: &str) -> (String, String) {
    let prefix = format!("bq-test:{}:", unique(tag));
    let spec = with_query(
        &var("BQ_TEST_REDIS_URL"),
        &format!("dialect={dialect}&prefix={}", prefix.replace(':', "%3A")),
    );
    (spec, prefix)
}

fn envelope(id: &str) -> String {
    json!({
        "job": "urn:babel:orders:created", "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"order_id": 1042}, "attempts": 0,
        "meta": {"id": id, "queue": "orders", "lang": "php", "schema_version": 1}
    })
    .to_string()
}

fn stream(ids: &[String]) -> String {
    ids.iter().map(|id| envelope(id) + "\n").collect()
}

/// Outcome codes of one `run`, in order.
fn outcomes(out: &Output) -> Vec<String> {
    decisions(out)
        .iter()
        .map(|d| d["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn conformance_passes(store: &str) {
    let out = bq(&["conformance", "--store", store], "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "13 passed, 0 failed"),
        "{store}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A batch of 100 runs, then the same stream redelivered is all skipped, in
/// plain and in claiming mode.
fn run_twice_in_batches(store: &str, claim: bool) {
    let ids: Vec<String> = (0..150).map(|i| unique(&format!("id{i}"))).collect();
    let input = stream(&ids);
    let mut args = vec!["run", "--store", store, "--batch", "100"];
    if claim {
        args.push("--claim");
    }
    let first = bq(&args, &input);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(outcomes(&first), vec!["run-ok"; 150]);
    let again = bq(&args, &input);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(outcomes(&again), vec!["skip"; 150]);
}

/// 16 `bq-dedupe run --claim` processes deliver one id at once: it runs once.
fn claim_race(store: &str) {
    let dir = scratch("race");
    let effects = dir.join("effects");
    let cmd = format!("sleep 0.3; echo ran >> {}", effects.display());
    let children: Vec<_> = (0..16)
        .map(|_| common::spawn(&["run", "--store", store, "--claim", "--exec", &cmd]))
        .collect();
    let body = envelope(&unique("contended")) + "\n";
    let children: Vec<_> = children
        .into_iter()
        .map(|mut c| {
            c.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
            c
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "run-ok or park, never an error: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ran = std::fs::read_to_string(&effects).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "{store}: the handler ran {ran:?}");
}

fn psql(args: &[&str]) -> String {
    let out = Command::new("psql")
        .arg(var("BQ_TEST_POSTGRES_URL"))
        .args(["-v", "ON_ERROR_STOP=1", "-tA"])
        .args(args)
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn redis_cli(args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-u", &var("BQ_TEST_REDIS_URL")])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn cli_conformance_through_the_component_on_postgres_cluster_and_php() {
    conformance_passes(&postgres_spec("conf"));
    conformance_passes(&cluster_spec("conf"));
    conformance_passes(&redis_spec("conf", "php").0);
}

#[test]
fn cli_batches_of_100_on_postgres_run_then_skip() {
    run_twice_in_batches(&postgres_spec("batch"), false);
    run_twice_in_batches(&postgres_spec("batch_claim"), true);
}

#[test]
fn cli_batches_of_100_on_the_cluster_run_then_skip() {
    run_twice_in_batches(&cluster_spec("batch"), false);
    run_twice_in_batches(&cluster_spec("batch-claim"), true);
}

#[test]
fn cli_batches_of_100_in_the_php_and_go_dialects_run_then_skip() {
    run_twice_in_batches(&redis_spec("php", "php").0, true);
    run_twice_in_batches(&redis_spec("go", "go").0, false);
}

#[test]
fn sixteen_processes_claiming_one_id_on_postgres_and_the_cluster_run_it_once() {
    claim_race(&postgres_spec("race"));
    claim_race(&cluster_spec("race"));
}

#[test]
fn cli_go_dialect_refuses_claiming_mode() {
    let (spec, _) = redis_spec("go-claim", "go");
    let out = bq(
        &["run", "--store", &spec, "--claim"],
        &stream(&["x".into()]),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot claim"), "{stderr}");
}

/// `--store` over TLS (scripts/with-redis-tls.sh and with-postgres.sh make the
/// CA): verified against the given CA, the CLI runs then skips; against
/// another CA it refuses to start, naming the host, never the password.
#[test]
fn cli_dedupes_over_tls_and_refuses_a_wrong_ca_naming_the_host() {
    let (pg_ca, other) = (var("BQ_TEST_POSTGRES_TLS_CA"), var("BQ_TEST_OTHER_CA"));
    let redis = format!(
        "{}?ca={}&prefix=bq-test%3A{}%3A",
        var("BQ_TEST_REDIS_TLS_URL"),
        var("BQ_TEST_REDIS_TLS_CA"),
        unique("tls")
    );
    let pg = with_query(
        &postgres_spec("tls"),
        &format!("sslmode=verify-full&sslrootcert={pg_ca}"),
    );
    for spec in [&redis, &pg] {
        let ids = [unique("tls-id")];
        assert_eq!(
            outcomes(&bq(&["run", "--store", spec], &stream(&ids))),
            vec!["run-ok"]
        );
        assert_eq!(
            outcomes(&bq(&["run", "--store", spec], &stream(&ids))),
            vec!["skip"]
        );
    }
    let url = var("BQ_TEST_POSTGRES_URL").replacen("postgres@", "postgres:secret-pw@", 1);
    let wrong = format!("{url}?sslmode=verify-full&sslrootcert={other}");
    let out = bq(&["run", "--store", &wrong], &stream(&["x".into()]));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let host = url.rsplit_once('@').unwrap().1.split('/').next().unwrap();
    assert!(
        stderr.contains(host) && stderr.contains("certificate"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("secret-pw"),
        "no secrets in errors: {stderr}"
    );
    // A certificate refused is for a person to fix (exit 2), not a store to
    // try again later (exit 6): a supervisor retried it for ever (a trial).
    let untrusted = format!(
        "{}?prefix=bq-test%3Auntrusted%3A",
        var("BQ_TEST_REDIS_TLS_URL")
    );
    for spec in [&wrong, &untrusted] {
        let out = bq(&["run", "--store", spec], &stream(&["x".into()]));
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }
}

/// Ids a PHP consumer committed and a Go consumer remembered (written with
/// `redis-cli` and `psql` as their stores write them) are skipped by the CLI.
#[test]
fn cli_skips_ids_the_php_and_go_sdks_recorded() {
    let (php, prefix) = redis_spec("php-interop", "php");
    redis_cli(&["SET", &format!("{prefix}from-php"), "2"]);
    let out = bq(
        &["run", "--store", &php, "--claim"],
        &stream(&["from-php".into(), "fresh".into()]),
    );
    assert_eq!(outcomes(&out), vec!["skip", "run-ok"]);
    assert_eq!(redis_cli(&["GET", &format!("{prefix}fresh")]), "2");

    let (go, prefix) = redis_spec("go-interop", "go");
    redis_cli(&["SET", &format!("{prefix}from-go"), "1", "NX"]);
    let out = bq(
        &["run", "--store", &go],
        &stream(&["from-go".into(), "fresh".into()]),
    );
    assert_eq!(outcomes(&out), vec!["skip", "run-ok"]);
    assert_eq!(redis_cli(&["EXISTS", &format!("{prefix}fresh")]), "1");

    let table = format!("bqh_{}", unique("go_pg"));
    let spec = with_query(&var("BQ_TEST_POSTGRES_URL"), &format!("table={table}"));
    // The store creates Go's table; Go's own remember statement fills it.
    succeeded(&bq(&["run", "--store", &spec], ""));
    psql(&[
        "-c",
        &format!(
            "INSERT INTO {table} (message_id, created_at, expires_at) VALUES ('from-go', now(), NULL) \
             ON CONFLICT (message_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at \
             WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= now()"
        ),
    ]);
    let out = bq(
        &["run", "--store", &spec, "--claim"],
        &stream(&["from-go".into(), "fresh".into()]),
    );
    assert_eq!(outcomes(&out), vec!["skip", "run-ok"]);
    assert_eq!(
        psql(&[
            "-c",
            &format!(
                "SELECT count(*) FROM {table} WHERE message_id = 'fresh' \
                 AND (expires_at IS NULL OR expires_at > now())"
            )
        ]),
        "1",
        "Go's seen query finds our commit"
    );
    drop_tables(&table);
}

/// A mistyped `?table=` is not an empty store for the commands that only read
/// or delete: `show`, `stats`, `forget` and `purge` said `free`, zeros and
/// "nothing to forget", and created the two tables (a first user's trial).
/// They now fail (exit 2) naming the table, and create nothing; `run` still
/// creates its tables, saying so.
#[test]
fn a_mistyped_postgres_table_is_not_an_empty_store() {
    let table = format!("bqh_{}", unique("typo_tabel"));
    let spec = with_query(&var("BQ_TEST_POSTGRES_URL"), &format!("table={table}"));
    let exists = || {
        psql(&[
            "-c",
            &format!(
                "SELECT count(*) FROM pg_class WHERE relkind = 'r' AND relname LIKE '{table}%'"
            ),
        ])
    };
    for args in [
        vec!["show", "--store", &spec, "x"],
        vec!["stats", "--store", &spec],
        vec!["forget", "--store", &spec, "x"],
        vec!["purge", "--store", &spec],
    ] {
        let out = bq(&args, "");
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains(&format!("no table {table}")), "{said}");
        assert_eq!(exists(), "0", "{args:?} created a table");
    }
    // `run` creates them, and says so (as for a new SQLite file): with a
    // mistyped table every id of the input runs again.
    let first = bq(&["run", "--store", &spec], "");
    succeeded(&first);
    assert_eq!(exists(), "2", "run creates its two tables");
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(said.contains("a new, empty one is made"), "{said}");
    assert!(said.contains(&table), "{said}");
    let again = bq(&["run", "--store", &spec], "");
    succeeded(&again);
    assert!(!String::from_utf8_lossy(&again.stderr).contains("a new, empty one"));
    succeeded(&bq(&["stats", "--store", &spec], ""));
    drop_tables(&table);
}

fn succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test's PostgreSQL table and its claims table, dropped.
fn drop_tables(table: &str) {
    psql(&[
        "-c",
        &format!("DROP TABLE {table}; DROP TABLE {table}_claims"),
    ]);
}

/// A login or a database the server refuses is the spec's to fix: exit 2,
/// not the 6 of a server that cannot be reached, on which a supervisor would
/// wait for ever (both were "unavailable").
#[test]
fn postgres_refusing_the_login_or_database_exits_2() {
    let url = var("BQ_TEST_POSTGRES_URL");
    let (server, _database) = url.rsplit_once('/').unwrap();
    let no_database = format!("{server}/no_such_database");
    let no_role = url.replacen("postgres@", "no_such_role@", 1);
    // PgBouncer says so in its own words.
    let bouncer = var("BQ_TEST_PGBOUNCER_URL");
    let (bouncer_server, _) = bouncer.rsplit_once('/').unwrap();
    let no_bouncer_database = format!(
        "{bouncer_server}/no_such_database?statement_cache=off&lock_timeout=server&statement_timeout=server"
    );
    for spec in [no_database, no_role, no_bouncer_database] {
        let out = bq(&["stats", "--store", &spec], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{spec}: {stderr}");
        assert!(
            stderr.contains("refused the connection"),
            "{spec}: {stderr}"
        );
    }
}
