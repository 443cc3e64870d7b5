//! The history checker (`bq_dedupe_testkit::check_histories`) on every store
//! here: four clients, each with its own connection, call one backend at once
//! on three shared keys (claims, renewals, fenced commits and settlements,
//! remembers, forgets, peeks, transactions where the store has them), under
//! injected faults, crashes and pauses past their leases; every key's history
//! must be linearizable against the record model. `BQ_HISTORY_RUNS=200` (or
//! `make histories`) for a longer run.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bq_dedupe::store::TransactionalStore;
use bq_dedupe::{clock::Clock, clock::ManualClock};
use bq_dedupe_stores::{AnyStore, Dialect, PostgresStore, RedisStore, SqliteStore};
use bq_dedupe_testkit::{self as testkit, Fleet};
use common::*;

const SQLITE_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS testkit_effects (key TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS testkit_once (id TEXT PRIMARY KEY);
    INSERT OR IGNORE INTO testkit_once VALUES ('taken');";

/// Every other failing work swallows its error and returns `Ok` instead (the
/// "the row is already there" habit): the store must then commit nothing.
fn swallows() -> bool {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed).is_multiple_of(2)
}

/// Four connections to one SQLite file, on a manual clock the clients move.
fn sqlite() -> Fleet<SqliteStore> {
    let db = Arc::new(TempDb::new("histories"));
    let clock = Arc::new(ManualClock::new(1_000_000));
    let (open_db, open_clock) = (db.clone(), clock.clone());
    let (now, step) = (clock.clone(), clock);
    rusqlite::Connection::open(db.path())
        .unwrap()
        .execute_batch(SQLITE_EFFECTS)
        .unwrap();
    let count_db = db.clone();
    Fleet::new(SqliteStore::RULES, move || {
        SqliteStore::open(open_db.path())
            .expect("open the test file")
            .with_clock(open_clock.clone())
    })
    .with_clock(move || now.now_ms(), move |ms| step.advance(ms), 1000)
    .with_transactions(
        |store, key, ttl, ok| {
            store.transaction(Some(key), ttl, |tx| {
                tx.execute("INSERT INTO testkit_effects (key) VALUES (?1)", [key])
                    .expect("the effect row");
                match (ok, swallows()) {
                    (true, _) => Ok(()),
                    (false, true) => {
                        // Rolls the whole transaction back; ignored.
                        let _ =
                            tx.execute("INSERT OR ROLLBACK INTO testkit_once VALUES ('taken')", []);
                        Ok(())
                    }
                    (false, false) => Err(()),
                }
            })
        },
        move |key| {
            let conn = rusqlite::Connection::open(count_db.path()).unwrap();
            let n: i64 = conn
                .query_row(
                    "SELECT count(*) FROM testkit_effects WHERE key = ?1",
                    [key],
                    |r| r.get(0),
                )
                .unwrap();
            n as u64
        },
    )
    .with_cleanup(db)
}

#[test]
fn sqlite_histories_are_linearizable() {
    testkit::check_histories(40, sqlite);
}

fn redis(dialect: Dialect) -> Fleet<RedisStore> {
    let (open, cleanup) = redis_backend("histories", dialect);
    Fleet::new(RedisStore::rules(dialect), open)
        .with_resends(RedisStore::resent_calls)
        .with_cleanup(cleanup)
}

#[test]
fn redis_histories_are_linearizable_in_each_dialect() {
    for dialect in [Dialect::Native, Dialect::Php, Dialect::Go] {
        testkit::check_histories(5, || redis(dialect));
    }
}

/// Then again with its clients' connections killed (`CLIENT KILL`) on one
/// node at a time, every 10 to 30 ms: a multi-key call can fail on one node
/// after another node took its part. The store's errors are then the test's
/// own faults (unknown: each key may or may not have taken effect), and a call
/// the store sent again on a fresh connection may have taken effect at its
/// first sending too (`with_resends`: 300 runs x 12 clients met a claim whose
/// first sending held the key, was forgotten, and whose second took it again).
/// One test, so that the kills never meet the first part's clients; and the
/// cluster is this test's alone while it runs ([`CLUSTER`]).
#[test]
fn redis_cluster_histories_are_linearizable() {
    let _cluster = CLUSTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    testkit::check_histories(4, || {
        let (open, cleanup) = cluster_backend("histories-cluster");
        Fleet::new(RedisStore::rules(Dialect::Native), open)
            .with_resends(RedisStore::resent_calls)
            .with_cleanup(cleanup)
    });
    testkit::check_histories(4, || {
        let (open, cleanup) = cluster_backend("histories-cluster-kills");
        let killer = node_killer(cluster_nodes(&redis_cluster_spec()));
        // A client reopened after a crash may meet a kill while it connects.
        Fleet::new(RedisStore::rules(Dialect::Native), retrying(open))
            .with_resends(RedisStore::resent_calls)
            .with_backend_errors()
            .with_cleanup((killer, cleanup))
    });
    // And with the fleet's slot moved from master to master every few
    // milliseconds (a reshard under load): calls meet MOVED, and ASK while
    // the keys move, and are sent again on a new slot map.
    testkit::check_histories(4, || {
        let prefix = format!("{{{}}}:", common::redis_prefix("histories-moves"));
        let (open, cleanup) = common::cluster_backend_under(prefix.clone());
        let mover = slot_mover(format!("{prefix}x"));
        // A client reopened after a crash may read the slot map mid-move.
        Fleet::new(RedisStore::rules(Dialect::Native), retrying(open))
            .with_resends(RedisStore::resent_calls)
            .with_backend_errors()
            .with_cleanup((mover, cleanup))
    });
    // The next tests (here and in later test binaries) start on one map.
    common::heal_the_cluster(&redis_cluster_spec());
}

/// Held by a test while it uses the test cluster: the kills of
/// [`redis_cluster_histories_are_linearizable`] end every client's
/// connections, and another test's clients would fail with no fault of their
/// own.
static CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A fault run in a thread of its own, step `n` after 10 to 30 ms (from 5
/// with `sooner`, which must also strike at least once), until dropped; a
/// step that panics fails the test at the drop.
struct Repeating {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
    sooner: bool,
}

impl Repeating {
    fn start(sooner: bool, mut step: impl FnMut(u64) + Send + 'static) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n: u64 = 0;
            while !running.load(Ordering::Relaxed) {
                n += 1;
                let base = if sooner { 5 } else { 10 };
                std::thread::sleep(Duration::from_millis(base + n * 7 % 21));
                step(n);
            }
            n
        });
        Repeating {
            stop,
            thread: Some(thread),
            sooner,
        }
    }
}

impl Drop for Repeating {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            _ if std::thread::panicking() => {}
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            Some(Ok(steps)) => assert!(steps > 0 || !self.sooner, "the fault never struck"),
            None => {}
        }
    }
}

/// Kills the normal clients of one cluster node at a time.
fn node_killer(nodes: Vec<String>) -> Repeating {
    Repeating::start(false, move |n| {
        let node = &nodes[(n as usize) % nodes.len()];
        if let Ok(mut conn) = redis::Client::open(node.as_str()).and_then(|c| c.get_connection()) {
            let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
                .query(&mut conn);
        }
    })
}

/// Moves the slot of `key` from master to master (a move waits, or is
/// skipped, while the nodes still disagree on its owner after the last).
fn slot_mover(key: String) -> Repeating {
    Repeating::start(true, move |_| {
        if let Err(e) = common::move_slot_of(&redis_cluster_spec(), &key) {
            panic!("moving the slot of {key}: {e}");
        }
    })
}

/// `open`, tried again (up to 10 times) where connecting panics.
fn retrying<S>(
    open: impl Fn() -> S + Send + Sync + 'static,
) -> impl Fn() -> S + Send + Sync + 'static {
    move || {
        let mut tries = 0;
        loop {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&open)) {
                Ok(store) => return store,
                Err(_) if tries < 10 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }
}

/// Through `AnyStore`'s dispatch, on every backend of the table with a server.
#[test]
fn every_backend_from_a_spec_has_linearizable_histories() {
    on_backends("histories-any", on_a_server, |subject| {
        let _cluster = (subject.backend.name == "redis-cluster").then(|| {
            CLUSTER
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        });
        testkit::check_histories(3, || {
            let fresh = subject.fresh("histories-any");
            Fleet::new(fresh.rules(), fresh.opener())
                .with_resends(|store| match &**store {
                    AnyStore::Redis(redis) => redis.resent_calls(),
                    _ => 0,
                })
                .with_cleanup(fresh)
        })
    });
}

/// PostgreSQL with its transactional mode: transactions and claims on the same
/// ids, at once (the mixed fleet of issue #25's finding 2), some transactions'
/// connections killed inside them.
fn postgres() -> Fleet<PostgresStore> {
    postgres_at(PgBackend::new("histories"))
}

/// The same fleet through PgBouncer in transaction mode (`with-postgres.sh`
/// starts it: four server connections shared by every client), configured as
/// docs/stores.md says for such a pooler: statements unnamed, the timeouts the
/// role's.
fn postgres_behind_pgbouncer() -> Fleet<PostgresStore> {
    let mut backend = PgBackend::new("bouncer");
    let bouncer = std::env::var("BQ_TEST_PGBOUNCER_URL")
        .expect("BQ_TEST_PGBOUNCER_URL: run under scripts/with-postgres.sh");
    backend.url =
        format!("{bouncer}?statement_cache=off&lock_timeout=server&statement_timeout=server");
    // A server connection killed after its transaction ended may be another
    // client's by then (the pooler lent it on): that call fails (the server's
    // 57P01, or the pooler closing the client's connection), its outcome
    // unknown, as the killed transaction's own. 300 runs x 8 and x 12 met both.
    postgres_at(backend).with_backend_errors_marked(KILLED_BEHIND_PGBOUNCER)
}

fn postgres_at(backend: PgBackend) -> Fleet<PostgresStore> {
    let insert = backend.insert();
    let counter = Mutex::new(backend.counter());
    Fleet::new(PostgresStore::RULES, backend.opener())
        .with_transactions(
            move |store, key, ttl, ok| {
                let (mut killer, mut lost) = (None, None);
                let run = store.transaction(Some(key), ttl, |tx| {
                    if let Err(e) = write_effect(tx, &insert, key) {
                        lost = Some(e);
                        return Err(());
                    }
                    match (ok, swallows()) {
                        (true, _) => {
                            killer = kill_sometimes(tx);
                            // Open long enough for other clients' calls to meet it.
                            std::thread::sleep(Duration::from_millis(15));
                            Ok(())
                        }
                        (false, true) => {
                            // Aborts the transaction; ignored.
                            let _ = tx.execute("SELECT 1/0", &[]);
                            Ok(())
                        }
                        (false, false) => Err(()),
                    }
                });
                if let Some(e) = lost {
                    return Err(testkit::outcome_unknown(e));
                }
                // The connection killed inside the transaction, before or
                // after its COMMIT: what happened is unknown.
                match killer.map(|k: std::thread::JoinHandle<()>| k.join()) {
                    Some(_) => run.map_err(testkit::outcome_unknown),
                    None => run,
                }
            },
            move |key| (counter.lock().unwrap())(&effect_id(key)),
        )
        .with_cleanup(backend.cleanup)
}

/// One transaction in three has its connection killed (`pg_terminate_backend`)
/// from another connection 0 to 24 ms later: in the handler, in the statement
/// after it, around the `COMMIT`, or just after. Joined before the call
/// returns, so the kill never lands in the client's next call.
fn kill_sometimes(tx: &mut postgres::Transaction<'_>) -> Option<std::thread::JoinHandle<()>> {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    if !n.is_multiple_of(3) {
        return None;
    }
    let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).ok()?.get(0);
    Some(std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(n * 7 % 25));
        let _ = pg().execute("SELECT pg_terminate_backend($1)", &[&pid]);
    }))
}

/// A transaction's effect row for `key`. It fails only where another
/// client's kill ended this server connection under the handler (behind
/// PgBouncer): its outcome is then unknown.
fn write_effect(
    tx: &mut postgres::Transaction<'_>,
    insert: &str,
    key: &str,
) -> Result<(), postgres::Error> {
    let written = tx.execute(insert, &[&effect_id(key)]).map(drop);
    if let Err(e) = &written {
        let killed = e.code() == Some(&postgres::error::SqlState::ADMIN_SHUTDOWN) || e.is_closed();
        assert!(killed, "the effect row: {e}");
    }
    written
}

/// The effect table's name for a key (`text` cannot hold U+0000).
fn effect_id(key: &str) -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    format!("{}:{:016x}", key.len(), h.finish())
}

#[test]
fn postgres_histories_are_linearizable() {
    testkit::check_histories(30, postgres);
}

/// The transactions as batches of one (`transaction_batch`), whose handlers
/// now and then end the store's transaction themselves: a success by its
/// own `COMMIT` (committed whole, kept), a failure by its own `ROLLBACK`
/// (returning Err, or Ok), or by making the transaction read-only. Such a
/// delivery is settled after its transaction ended, in autocommit, beside
/// the other clients' claims and runs.
fn postgres_batches() -> Fleet<PostgresStore> {
    let backend = PgBackend::new("histories-batch");
    let insert = backend.insert();
    let counter = Mutex::new(backend.counter());
    static N: AtomicU64 = AtomicU64::new(0);
    Fleet::new(PostgresStore::RULES, backend.opener())
        .with_transactions(
            move |store, key, ttl, ok| {
                let n = N.fetch_add(1, Ordering::Relaxed);
                let (mut killer, mut lost) = (None, None);
                let mut runs = store.transaction_batch(&[Some(key)], ttl, |_, tx| {
                    if let Err(e) = write_effect(tx, &insert, key) {
                        lost = Some(e);
                        return Err(());
                    }
                    let mut ended = |sql: &str, tx: &mut postgres::Transaction<'_>| {
                        if let Err(e) = tx.batch_execute(sql) {
                            lost = Some(e);
                        }
                    };
                    match (ok, n % 5) {
                        (true, 0) => {
                            ended("COMMIT", tx);
                            Ok(())
                        }
                        (true, _) => {
                            killer = kill_sometimes(tx);
                            std::thread::sleep(Duration::from_millis(15));
                            Ok(())
                        }
                        (false, 0) => {
                            ended("ROLLBACK", tx);
                            Err(())
                        }
                        (false, 1) => {
                            ended("ROLLBACK", tx);
                            Ok(())
                        }
                        (false, 2) => {
                            let _ = tx.execute("SELECT 1/0", &[]);
                            Ok(())
                        }
                        (false, 3) => {
                            ended("SET TRANSACTION READ ONLY", tx);
                            Ok(())
                        }
                        (false, _) => Err(()),
                    }
                });
                if let Some(e) = lost {
                    return Err(testkit::outcome_unknown(e));
                }
                if let Some(killer) = killer {
                    let _ = killer.join();
                    runs = runs.map_err(testkit::outcome_unknown);
                }
                runs.map(|mut runs| runs.pop().expect("one run"))
            },
            move |key| (counter.lock().unwrap())(&effect_id(key)),
        )
        // The server may pick a batch's transaction as a deadlock's victim
        // against the claims of several keys (150 runs x 14 clients met one):
        // it is rolled back and the batch is store-unavailable, retried; a
        // claim's own call the store runs again, a handler's it cannot.
        .with_backend_errors_marked(&["40P01"])
        .with_cleanup(backend.cleanup)
}

#[test]
fn postgres_batch_histories_are_linearizable() {
    testkit::check_histories(20, postgres_batches);
}

#[test]
fn postgres_behind_pgbouncer_histories_are_linearizable() {
    testkit::check_histories(30, postgres_behind_pgbouncer);
}
