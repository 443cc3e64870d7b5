//! Interop with the other SDKs' stores, by their own records: the test writes
//! and reads them the way the PHP and Go stores do (raw Redis commands and SQL
//! through the servers' own clients), following the table in docs/stores.md.
//! Needs `BQ_TEST_REDIS_URL` and `BQ_TEST_POSTGRES_URL` (`make test` starts both).

mod common;

use std::time::Duration;

use bq_dedupe::{Guard, OutcomeKind, Store, store::StoreErrorKind};
use bq_dedupe_stores::{AnyStore, Dialect, PostgresStore, RedisStore};
use common::{
    PgCleanup, RedisCleanup, deliver, postgres_table, postgres_url, ready, redis_prefix, redis_url,
};

fn redis_store(tag: &str, dialect: Dialect) -> (RedisStore, RedisCleanup, redis::Connection) {
    let url = redis_url();
    let prefix = redis_prefix(tag);
    let store = RedisStore::connect_dialect(&url, prefix.clone(), dialect).unwrap();
    let conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    (store, RedisCleanup { url, prefix }, conn)
}

fn get(conn: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(conn).unwrap()
}

/// PHP's `RedisStore`: a committed id (`2`) is skipped by our claiming consumer
/// (never parked), a PHP claim in flight (`1`) parks it, and what we write PHP
/// reads by its rules (`2` = seen; our claim makes its `SET NX` fail).
#[test]
fn php_records_are_read_right_and_ours_read_right_by_php() {
    let (store, clean, mut php) = redis_store("php", Dialect::Php);
    let key = |id: &str| format!("{}{id}", clean.prefix);
    // PHP committed "done-by-php" and is working on "busy-in-php".
    let _: () = redis::cmd("SET")
        .arg(key("done-by-php"))
        .arg("2")
        .query(&mut php)
        .unwrap();
    let set: Option<String> = redis::cmd("SET")
        .arg(key("busy-in-php"))
        .arg("1")
        .arg("NX")
        .arg("PX")
        .arg(3_600_000)
        .query(&mut php)
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));

    let guard = Guard::new(&store).with_claiming(Duration::from_secs(60));
    assert_eq!(
        deliver(&guard, "done-by-php", true).kind(),
        OutcomeKind::Skipped
    );
    assert_eq!(
        deliver(&guard, "busy-in-php", true).kind(),
        OutcomeKind::Parked
    );
    assert_eq!(deliver(&guard, "ours", true).kind(), OutcomeKind::Ran);

    // PHP's seen: the value is "2".
    assert_eq!(get(&mut php, &key("ours")).as_deref(), Some("2"));
    // PHP's claim on an id we hold: its SET NX fails (held).
    let bq_dedupe::store::Claim::Acquired(_t) =
        ready(store.claim("ours-in-flight", Duration::from_secs(60))).unwrap()
    else {
        panic!("free key");
    };
    let set: Option<String> = redis::cmd("SET")
        .arg(key("ours-in-flight"))
        .arg("1")
        .arg("NX")
        .arg("PX")
        .arg(3_600_000)
        .query(&mut php)
        .unwrap();
    assert_eq!(set, None, "PHP sees our claim as held");
    // PHP's release (compare-and-delete on "1") and commit ("2") are understood.
    let _: () = redis::cmd("SET")
        .arg(key("busy-in-php"))
        .arg("2")
        .query(&mut php)
        .unwrap();
    assert_eq!(
        deliver(&guard, "busy-in-php", true).kind(),
        OutcomeKind::Skipped
    );
}

/// Go's Redis store: a remembered id (`1`) is skipped, and Go's `EXISTS` sees ours.
#[test]
fn go_redis_records_are_read_right_and_ours_read_right_by_go() {
    let (store, clean, mut go) = redis_store("go", Dialect::Go);
    let key = |id: &str| format!("{}{id}", clean.prefix);
    let set: Option<String> = redis::cmd("SET")
        .arg(key("done-by-go"))
        .arg("1")
        .arg("NX")
        .query(&mut go)
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let guard = Guard::new(&store);
    assert_eq!(
        deliver(&guard, "done-by-go", true).kind(),
        OutcomeKind::Skipped
    );
    assert_eq!(deliver(&guard, "ours", true).kind(), OutcomeKind::Ran);
    let exists: i64 = redis::cmd("EXISTS")
        .arg(key("ours"))
        .query(&mut go)
        .unwrap();
    assert_eq!(exists, 1, "Go's seen is EXISTS");
    assert_eq!(get(&mut go, &key("ours")).as_deref(), Some("1"));
    // Go's forget is DEL: the id runs again here.
    let _: () = redis::cmd("DEL").arg(key("ours")).query(&mut go).unwrap();
    assert_eq!(deliver(&guard, "ours", true).kind(), OutcomeKind::Ran);
}

/// Under our own prefix a value we never write (a PHP `2`, a Go `1`, anything)
/// is a typed store error: never read as a claim (park) nor as seen (skip).
/// A fenced commit or renewal that meets one finds its claim gone (false),
/// and writes nothing.
#[test]
fn a_foreign_value_under_our_prefix_is_a_store_error() {
    let (store, clean, mut raw) = redis_store("foreign", Dialect::Native);
    let key = |id: &str| format!("{}{id}", clean.prefix);
    for (id, value) in [("php", "2"), ("go", "1"), ("junk", "hello")] {
        let _: () = redis::cmd("SET")
            .arg(key(id))
            .arg(value)
            .query(&mut raw)
            .unwrap();
        let e = ready(store.seen(id)).unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Internal, "{id}: {e}");
        assert!(e.message.contains("not a native record"), "{e}");
        assert!(ready(store.seen_many(&["fine", id])).is_err());
        assert!(ready(store.claim(id, Duration::from_secs(5))).is_err());
        let token = bq_dedupe::store::ClaimToken("t".into());
        assert!(!ready(store.remember_fenced(id, &token, None)).unwrap());
        assert!(!ready(store.renew(id, &token, Duration::from_secs(5))).unwrap());
        assert_eq!(
            get(&mut raw, &key(id)).as_deref(),
            Some(value),
            "left as it was"
        );

        for claiming in [false, true] {
            let mut guard = Guard::new(&store);
            if claiming {
                guard = guard.with_claiming(Duration::from_secs(5));
            }
            let kind = deliver(&guard, id, true).kind();
            assert_eq!(
                kind,
                OutcomeKind::StoreUnavailable,
                "{id}: never a park or a skip"
            );
        }
    }
    // The PHP dialect rejects values PHP never writes, too.
    let php = RedisStore::connect_dialect(&clean.url, clean.prefix.clone(), Dialect::Php).unwrap();
    let _: () = redis::cmd("SET")
        .arg(key("ours"))
        .arg("d")
        .query(&mut raw)
        .unwrap();
    assert_eq!(
        ready(php.seen("ours")).unwrap_err().kind,
        StoreErrorKind::Internal
    );
}

/// Go's Postgres store: rows it inserts (with its own statement) are skipped by
/// ours, an expired one runs again, and Go's `seen` query finds our commits but
/// never our claims.
#[test]
fn go_postgres_rows_are_read_right_and_ours_read_right_by_go() {
    let url = postgres_url();
    let table = postgres_table("interop");
    let _clean = PgCleanup {
        url: url.clone(),
        table: table.clone(),
    };
    let store = PostgresStore::connect(&url, &table).unwrap();
    let mut go = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let go_remember = format!(
        "INSERT INTO {table} (message_id, created_at, expires_at) VALUES ($1, now(), $2)
         ON CONFLICT (message_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at
         WHERE {table}.expires_at IS NOT NULL AND {table}.expires_at <= now()"
    );
    let go_seen = format!(
        "SELECT 1 FROM {table} WHERE message_id = $1 AND (expires_at IS NULL OR expires_at > now())"
    );
    let at = |secs: f64| std::time::SystemTime::now() + Duration::from_secs_f64(secs.max(0.0));
    let past = std::time::SystemTime::now() - Duration::from_secs(5);
    go.execute(
        &go_remember,
        &[&"done-by-go", &None::<std::time::SystemTime>],
    )
    .unwrap();
    go.execute(&go_remember, &[&"go-with-ttl", &Some(at(3600.0))])
        .unwrap();
    go.execute(&go_remember, &[&"go-expired", &Some(past)])
        .unwrap();

    for claiming in [false, true] {
        let mut guard = Guard::new(&store);
        if claiming {
            guard = guard.with_claiming(Duration::from_secs(60));
        }
        assert_eq!(
            deliver(&guard, "done-by-go", true).kind(),
            OutcomeKind::Skipped
        );
        assert_eq!(
            deliver(&guard, "go-with-ttl", true).kind(),
            OutcomeKind::Skipped
        );
    }
    let guard = Guard::new(&store).with_claiming(Duration::from_secs(60));
    assert_eq!(deliver(&guard, "go-expired", true).kind(), OutcomeKind::Ran);
    assert_eq!(go.query(&go_seen, &[&"go-expired"]).unwrap().len(), 1);

    assert_eq!(deliver(&guard, "ours", true).kind(), OutcomeKind::Ran);
    assert_eq!(
        go.query(&go_seen, &[&"ours"]).unwrap().len(),
        1,
        "Go sees our commit"
    );
    let bq_dedupe::store::Claim::Acquired(token) =
        ready(store.claim("ours-in-flight", Duration::from_secs(60))).unwrap()
    else {
        panic!("free key");
    };
    assert!(
        go.query(&go_seen, &[&"ours-in-flight"]).unwrap().is_empty(),
        "a claim is not a row Go reads"
    );
    // Go remembers the id meanwhile (its consumer ran it too: Go does not
    // claim): our commit answers lost, so the second run is reported
    // (`run-ok-lease-lost`), and the row stays one.
    go.execute(
        &go_remember,
        &[&"ours-in-flight", &None::<std::time::SystemTime>],
    )
    .unwrap();
    assert!(!ready(store.remember_fenced("ours-in-flight", &token, None)).unwrap());
    assert_eq!(go.query(&go_seen, &[&"ours-in-flight"]).unwrap().len(), 1);
    // Go's forget (DELETE) makes the id run again here.
    go.execute(
        &format!("DELETE FROM {table} WHERE message_id = $1"),
        &[&"ours"],
    )
    .unwrap();
    assert_eq!(deliver(&guard, "ours", true).kind(), OutcomeKind::Ran);
    let _ = AnyStore::from(store);
}
