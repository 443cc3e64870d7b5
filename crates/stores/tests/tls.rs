//! The network stores over TLS, on servers that speak it with a certificate a
//! CA made by the test scripts signed (`scripts/with-redis-tls.sh`: one Redis
//! server and a cluster, TLS only; `scripts/with-postgres.sh`: TLS offered).
//! Each store trusting that CA passes the store testkit; trusting another CA,
//! it is refused with an error naming the host it tried.

mod common;

use bq_dedupe::Store;
use bq_dedupe::store::StoreErrorKind;
use bq_dedupe_stores::{AnyStore, Dialect, PostgresStore, RedisStore};
use bq_dedupe_testkit::{self as testkit, OnServer};
use common::*;

fn var(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: run under scripts/with-redis-tls.sh and scripts/with-postgres.sh (make test does)"
        ),
    }
}

/// The spec's host:port (after the scheme and any credentials).
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    rest.split(['/', '?', ',']).next().unwrap().to_owned()
}

fn refused(spec: &str) -> bq_dedupe::StoreError {
    match AnyStore::from_spec(spec) {
        Ok(_) => panic!("{spec}: connected, though the CA it trusts signed nothing there"),
        Err(e) => e,
    }
}

/// Trusting the wrong CA: `Unavailable`, saying it is the certificate and which
/// host presented it.
fn assert_refused_naming_the_host(spec: &str, host: &str) {
    let e = refused(spec);
    assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
    assert!(e.message.contains(host), "names {host}: {e}");
    let text = e.message.to_lowercase();
    assert!(
        text.contains("certificate") || text.contains("unknownissuer"),
        "says it is the certificate: {e}"
    );
}

#[test]
fn redis_over_tls_follows_the_record_model_and_refuses_a_wrong_ca() {
    let url = server_spec(server_of("redis", true));
    let (ca, other) = (var("BQ_TEST_REDIS_TLS_CA"), var("BQ_TEST_OTHER_CA"));
    assert_refused_naming_the_host(
        &format!("{url}?ca={other}&prefix={}", redis_prefix("tls-wrong")),
        &host_of(&url),
    );
    let pem = std::fs::read(&ca).unwrap();
    testkit::check(6, || {
        let (url, pem, prefix) = (url.clone(), pem.clone(), redis_prefix("tls-testkit"));
        OnServer::new(RedisStore::rules(Dialect::Native), move || {
            RedisStore::connect_trusting(&url, prefix.clone(), Dialect::Native, &pem)
                .expect("connect over TLS")
        })
    });
    // The spec form, as bq-dedupe and the host take it.
    let spec = format!("{url}?ca={ca}&prefix={}", redis_prefix("tls-spec"));
    check_basics(&AnyStore::from_spec(&spec).expect("connect over TLS"));
}

#[test]
fn a_redis_cluster_over_tls_follows_the_record_model_and_refuses_a_wrong_ca() {
    let spec = server_spec(server_of("redis-cluster", true));
    let (ca, other) = (var("BQ_TEST_REDIS_TLS_CA"), var("BQ_TEST_OTHER_CA"));
    assert_refused_naming_the_host(&format!("{spec}?ca={other}"), &host_of(&spec));
    let nodes: Vec<String> = spec
        .trim_start_matches("rediss+cluster://")
        .split(',')
        .map(|n| format!("rediss://{n}"))
        .collect();
    let pem = std::fs::read(&ca).unwrap();
    testkit::check(4, || {
        let (nodes, pem, prefix) = (nodes.clone(), pem.clone(), redis_prefix("tls-cluster"));
        OnServer::new(RedisStore::rules(Dialect::Native), move || {
            RedisStore::connect_cluster_trusting(&nodes, prefix.clone(), Dialect::Native, &pem)
                .expect("connect to the cluster over TLS")
        })
    });
    let spec = format!("{spec}?ca={ca}&prefix={}", redis_prefix("tls-cluster-spec"));
    let store = AnyStore::from_spec(&spec).expect("connect over TLS");
    check_batches(&store);
    // `stats` reaches every master on its own connection: over TLS too, with
    // the spec's CA (it once connected in plain TCP, the password in clear).
    let keys: Vec<String> = (0..20).map(|i| format!("stats-{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    ready(store.remember_many(&keys, None)).unwrap();
    let stats = store.stats().expect("stats over TLS on every master");
    assert!(stats.remembered >= 20, "{stats:?}");
}

/// How many of the server's sessions named `app` are encrypted, and how many
/// there are (asked over a plain connection of its own).
fn sessions(url: &str, app: &str) -> (i64, i64) {
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
            &[&app],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn postgres_sslmodes_follow_libpq_and_the_verified_store_follows_the_record_model() {
    let url = postgres_url();
    let (ca, other) = (var("BQ_TEST_POSTGRES_TLS_CA"), var("BQ_TEST_OTHER_CA"));
    let full = format!("{url}?sslmode=verify-full&sslrootcert={ca}");

    // Every connection of a verified store is encrypted.
    let app = unique("tls-app");
    let table = postgres_table("tls");
    let _clean = PgCleanup {
        url: url.clone(),
        table: table.clone(),
    };
    let store = PostgresStore::connect(&format!("{full}&application_name={app}"), &table)
        .expect("verify-full against the test CA");
    check_basics(&store);
    let (encrypted, all) = sessions(&url, &app);
    assert!(
        all >= 1 && encrypted == all,
        "{encrypted} of {all} sessions encrypted"
    );
    drop(store);

    // The wrong CA; a name the certificate does not hold (127.0.0.2 reaches the
    // same server): verify-full refuses it, verify-ca does not check names.
    assert_refused_naming_the_host(
        &format!("{url}?sslmode=verify-full&sslrootcert={other}"),
        &host_of(&url),
    );
    let elsewhere = url.replacen("127.0.0.1", "127.0.0.2", 1);
    assert_refused_naming_the_host(
        &format!("{elsewhere}?sslmode=verify-full&sslrootcert={ca}"),
        &host_of(&elsewhere),
    );
    // Each mode's sessions: encrypted or not, as libpq's mode says.
    for (spec, encrypted) in [
        (
            format!("{elsewhere}?sslmode=verify-ca&sslrootcert={ca}"),
            true,
        ),
        // require without a CA file: encrypted, the server not authenticated (libpq).
        (format!("{url}?sslmode=require"), true),
        // prefer (also the default) and allow: TLS when the server offers it.
        (format!("{url}?sslmode=prefer"), true),
        (format!("{url}?sslmode=allow"), true),
        (url.clone(), true),
        (format!("{url}?sslmode=disable"), false),
    ] {
        let table = postgres_table("tls-mode");
        let _clean = PgCleanup {
            url: url.clone(),
            table: table.clone(),
        };
        let app = unique("tls-mode-app");
        let sep = if spec.contains('?') { '&' } else { '?' };
        let with_app = format!("{spec}{sep}application_name={app}");
        let store =
            PostgresStore::connect(&with_app, &table).unwrap_or_else(|e| panic!("{spec}: {e}"));
        check_basics(&store);
        let (tls, all) = sessions(&url, &app);
        let want = if encrypted { all } else { 0 };
        assert!(
            all >= 1 && tls == want,
            "{spec}: {tls} of {all} sessions encrypted"
        );
    }
    // verify-ca against the platform's roots would take any public certificate
    // for any name: refused before connecting, as libpq does.
    let e = refused(&format!("{url}?sslmode=verify-ca"));
    assert_eq!(e.kind, StoreErrorKind::Invalid, "{e}");
    assert!(e.message.contains("sslrootcert"), "{e}");
    // require with a CA file checks the chain, as libpq does.
    assert_refused_naming_the_host(
        &format!("{url}?sslmode=require&sslrootcert={other}"),
        &host_of(&url),
    );

    testkit::check(6, || {
        let (full, table) = (full.clone(), postgres_table("tls-testkit"));
        let cleanup = PgCleanup {
            url: url.clone(),
            table: table.clone(),
        };
        OnServer::new(PostgresStore::RULES, move || {
            PostgresStore::connect(&full, &table).expect("connect over TLS")
        })
        .with_cleanup(cleanup)
    });
}

/// `sslrootcert=system` is verify-full against the platform's roots, as libpq
/// 16 reads it: a server whose certificate a private CA signed is refused
/// (issue #29: `?sslrootcert=system` and `?sslmode=require&sslrootcert=system`
/// both connected, unverified). A weaker mode beside it is refused before
/// connecting, as libpq does; so is a parameter given twice (libpq's URL
/// parse would take one of them silently).
#[test]
fn postgres_sslrootcert_system_verifies_and_a_repeated_parameter_is_refused() {
    let url = postgres_url();
    assert_refused_naming_the_host(&format!("{url}?sslrootcert=system"), &host_of(&url));
    assert_refused_naming_the_host(
        &format!("{url}?sslmode=verify-full&sslrootcert=system"),
        &host_of(&url),
    );
    for weak in ["require", "prefer", "allow", "disable", "verify-ca"] {
        let e = refused(&format!("{url}?sslmode={weak}&sslrootcert=system"));
        assert_eq!(e.kind, StoreErrorKind::Invalid, "{weak}: {e}");
        assert!(e.message.contains("verify-full"), "{weak}: {e}");
    }
    for twice in [
        format!("{url}?sslmode=verify-full&sslmode=disable"),
        format!("{url}?sslrootcert=system&sslrootcert=/etc/none.pem"),
        format!("{url}?application_name=a&application_name=b"),
    ] {
        let e = refused(&twice);
        assert_eq!(e.kind, StoreErrorKind::Invalid, "{twice}: {e}");
        assert!(e.message.contains("twice"), "{twice}: {e}");
    }
}

/// The modes that do not authenticate the server are named once when the
/// store opens: a note the CLI prints on start-up.
#[test]
fn postgres_unauthenticated_modes_are_named() {
    let url = postgres_url();
    let ca = var("BQ_TEST_POSTGRES_TLS_CA");
    let table = postgres_table("tls-note");
    let _clean = PgCleanup {
        url: url.clone(),
        table: table.clone(),
    };
    for (spec, named) in [
        (url.clone(), Some("prefer")),
        (format!("{url}?sslmode=require"), Some("require")),
        (format!("{url}?sslmode=allow"), Some("allow")),
        (format!("{url}?sslmode=disable"), Some("disable")),
        (format!("{url}?sslmode=require&sslrootcert={ca}"), None),
        (format!("{url}?sslmode=verify-full&sslrootcert={ca}"), None),
    ] {
        let store = PostgresStore::connect(&spec, &table).unwrap_or_else(|e| panic!("{spec}: {e}"));
        match (store.notes(), named) {
            ([note], Some(mode)) => assert!(note.contains(mode), "{spec}: {note}"),
            ([], None) => {}
            (notes, _) => panic!("{spec}: {notes:?}"),
        }
    }
}
