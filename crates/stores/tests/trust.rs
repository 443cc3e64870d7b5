//! Findings of issue #25 that lost or doubled a message, each a test that failed
//! on main at 4936227 before its fix:
//! 1. a transactional handler that swallows a failed statement and returns `Ok`
//!    (SQLite: a statement that rolls the transaction back; PostgreSQL: any
//!    failed statement, which aborts it);
//! 2. PostgreSQL: a claiming consumer beside an open transactional run of the id;
//! 3. PostgreSQL: one id the table cannot hold (U+0000, an incompressible id over
//!    the index row limit) failing its whole batch;
//! 6. transactional expiry counted from before the wait and the handler;
//! 7. the purge deleting lapsed claims whose owner the rules say keeps them.

mod common;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use bq_dedupe::{Guard, OutcomeKind, Store};
use bq_dedupe_stores::{PostgresStore, SqliteStore};
use common::*;
use rusqlite::Connection;

fn sqlite_effects(path: &std::path::Path, id: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM effects WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap()
}

fn sqlite_guard(db: &TempDb) -> Guard<SqliteStore> {
    let store = SqliteStore::open(db.path()).unwrap();
    Connection::open(db.path())
        .unwrap()
        .execute_batch(
            "CREATE TABLE effects (id TEXT NOT NULL);
             CREATE TABLE once (id TEXT PRIMARY KEY);
             INSERT INTO once VALUES ('taken');",
        )
        .unwrap();
    Guard::new(store)
}

/// The "the row is already there" habit: an `INSERT OR ROLLBACK` that fails,
/// its error ignored. SQLite rolled the whole transaction back; before the fix
/// the id was then recorded alone, in autocommit, and the redelivery skipped.
fn sqlite_swallowing(msg: &bq_dedupe::Message<'_>, tx: &mut rusqlite::Transaction<'_>) {
    tx.execute("INSERT INTO effects (id) VALUES (?1)", [msg.id().unwrap()])
        .unwrap();
    let swallowed = tx.execute("INSERT OR ROLLBACK INTO once VALUES ('taken')", []);
    assert!(swallowed.is_err(), "the statement must fail for this test");
}

#[test]
fn sqlite_a_handler_that_swallows_a_rolled_back_transaction_is_run_failed_and_runs_again() {
    let db = TempDb::new("swallow");
    let guard = sqlite_guard(&db);
    let body = envelope("swallow-1");
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        sqlite_swallowing(msg, tx);
        Ok::<(), String>(())
    });
    assert_eq!(outcome.kind(), OutcomeKind::Failed, "{outcome:?}");
    assert!(
        outcome.reason().unwrap().contains("transaction"),
        "{outcome:?}"
    );
    assert!(
        !ready(guard.store().seen("swallow-1")).unwrap(),
        "not recorded"
    );
    assert_eq!(sqlite_effects(db.path(), "swallow-1"), 0);
    // The redelivery runs, and commits once.
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute("INSERT INTO effects (id) VALUES (?1)", [msg.id().unwrap()])
            .map(drop)
    });
    assert_eq!(outcome.kind(), OutcomeKind::Ran, "{outcome:?}");
    assert_eq!(sqlite_effects(db.path(), "swallow-1"), 1);
}

#[test]
fn sqlite_a_batch_whose_handler_swallows_a_rollback_acks_nothing_it_did_not_commit() {
    let db = TempDb::new("swallow-batch");
    let guard = sqlite_guard(&db);
    let bodies: Vec<String> = ["b-1", "b-2", "b-3"].map(envelope).to_vec();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        if msg.id() == Some("b-2") {
            sqlite_swallowing(msg, tx);
            return Ok::<(), String>(());
        }
        tx.execute("INSERT INTO effects (id) VALUES (?1)", [msg.id().unwrap()])
            .map(drop)
            .map_err(|e| e.to_string())
    });
    for (id, outcome) in ["b-1", "b-2", "b-3"].iter().zip(&outcomes) {
        let effects = sqlite_effects(db.path(), id);
        let seen = ready(guard.store().seen(id)).unwrap();
        match outcome.kind() {
            // Acked: the effect and the id are there, once.
            OutcomeKind::Ran => assert_eq!((effects, seen), (1, true), "{id}: {outcome:?}"),
            // Retried: neither is.
            kind => {
                assert_eq!(kind.disposition(), bq_dedupe::Disposition::Retry, "{id}");
                assert_eq!((effects, seen), (0, false), "{id}: {outcome:?}");
            }
        }
    }
    assert_eq!(outcomes[1].kind(), OutcomeKind::Failed, "{outcomes:?}");
    assert_eq!(outcomes[2].kind(), OutcomeKind::Ran, "{outcomes:?}");
}

/// A healthy delivery batched with one whose handler swallows a rollback was
/// rolled back with it and `run-failed`, on every redelivery while the two
/// stayed in one batch: its retries ran out beside the poison one (found by a
/// user trial of bc88e4d). It now runs again in a new transaction and commits.
#[test]
fn sqlite_a_healthy_delivery_beside_a_swallowing_one_commits_on_its_first_delivery() {
    let db = TempDb::new("swallow-neighbour");
    let guard = sqlite_guard(&db);
    let ids = ["n-1", "n-2", "n-3", "n-4"];
    let bodies: Vec<String> = ids.map(envelope).to_vec();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        if msg.id() == Some("n-3") {
            sqlite_swallowing(msg, tx);
            return Ok::<(), String>(());
        }
        tx.execute("INSERT INTO effects (id) VALUES (?1)", [msg.id().unwrap()])
            .map(drop)
            .map_err(|e| e.to_string())
    });
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(|o| o.kind()).collect();
    use OutcomeKind::{Failed, Ran};
    assert_eq!(kinds, vec![Ran, Ran, Failed, Ran], "{outcomes:?}");
    for id in ["n-1", "n-2", "n-4"] {
        assert_eq!(sqlite_effects(db.path(), id), 1, "{id}: once");
        assert!(ready(guard.store().seen(id)).unwrap(), "{id}");
    }
    assert_eq!(sqlite_effects(db.path(), "n-3"), 0);
}

/// A handler's own savepoint with the store's name (`bq_delivery`) caught the
/// store's `ROLLBACK TO`: a failed entry's id row (and on PostgreSQL its
/// 'infinity' mark) was committed, so the redelivery was skipped though the
/// handler never succeeded (found by review of bc88e4d).
#[test]
fn a_handlers_own_savepoint_does_not_catch_the_stores_rollback_on_both_databases() {
    let db = TempDb::new("savepoint");
    let sqlite = sqlite_guard(&db);
    let bodies = vec![envelope("sp-1")];
    let failed = sqlite.process_batch_in_transaction(&bodies, |_, tx| {
        tx.execute_batch("SAVEPOINT bq_delivery").unwrap();
        Err::<(), String>("declined".into())
    });
    assert_eq!(failed[0].kind(), OutcomeKind::Failed, "{failed:?}");
    assert!(
        !ready(sqlite.store().seen("sp-1")).unwrap(),
        "sqlite: not done"
    );

    let (store, pg_) = pg_store("savepoint");
    let guard = Guard::new(store);
    let failed = guard.process_batch_in_transaction(&bodies, |_, tx| {
        tx.batch_execute("SAVEPOINT bq_delivery").unwrap();
        Err::<(), String>("declined".into())
    });
    assert_eq!(failed[0].kind(), OutcomeKind::Failed, "{failed:?}");
    assert!(
        !ready(guard.store().seen("sp-1")).unwrap(),
        "postgres: not done"
    );
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let again = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).map(drop)
    });
    assert_eq!(
        again[0].kind(),
        OutcomeKind::Ran,
        "the redelivery runs: {again:?}"
    );
}

// ---- PostgreSQL ------------------------------------------------------------------

struct Pg {
    table: String,
    _cleanup: PgCleanup,
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = pg().batch_execute(&format!("DROP TABLE IF EXISTS {}_effects", self.table));
    }
}

fn pg_store(tag: &str) -> (PostgresStore, Pg) {
    let table = postgres_table(tag);
    let store = PostgresStore::connect(&postgres_url(), &table).unwrap();
    pg().batch_execute(&format!("CREATE TABLE {table}_effects (id TEXT NOT NULL)"))
        .unwrap();
    let cleanup = PgCleanup {
        url: postgres_url(),
        table: table.clone(),
    };
    (
        store,
        Pg {
            table,
            _cleanup: cleanup,
        },
    )
}

#[test]
fn postgres_a_handler_that_swallows_a_failed_statement_is_run_failed_and_runs_again() {
    let (store, pg_) = pg_store("swallow");
    let guard = Guard::new(store);
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let body = envelope("pg-swallow-1");
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).unwrap();
        // Swallowed: PostgreSQL has aborted the transaction, and its COMMIT
        // would be answered with ROLLBACK.
        let _ = tx.execute("SELECT 1/0", &[]);
        Ok::<(), String>(())
    });
    assert_eq!(outcome.kind(), OutcomeKind::Failed, "{outcome:?}");
    assert!(outcome.reason().unwrap().contains("aborted"), "{outcome:?}");
    assert_eq!(pg_effects(&pg_.table, "pg-swallow-1"), 0);
    assert!(!ready(guard.store().seen("pg-swallow-1")).unwrap());
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).map(drop)
    });
    assert_eq!(outcome.kind(), OutcomeKind::Ran, "{outcome:?}");
    assert_eq!(pg_effects(&pg_.table, "pg-swallow-1"), 1);
}

#[test]
fn postgres_a_batch_with_a_swallowing_handler_fails_that_delivery_only() {
    let (store, pg_) = pg_store("swallow-batch");
    let guard = Guard::new(store);
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let ids = ["pb-1", "pb-2", "pb-3"];
    let bodies: Vec<String> = ids.map(envelope).to_vec();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()])?;
        if msg.id() == Some("pb-2") {
            let _ = tx.execute("SELECT 1/0", &[]);
        }
        Ok::<(), postgres::Error>(())
    });
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(|o| o.kind()).collect();
    assert_eq!(
        kinds,
        [OutcomeKind::Ran, OutcomeKind::Failed, OutcomeKind::Ran],
        "{outcomes:?}"
    );
    for (id, effects) in ids.iter().zip([1, 0, 1]) {
        assert_eq!(pg_effects(&pg_.table, id), effects, "{id}");
        assert_eq!(ready(guard.store().seen(id)).unwrap(), effects == 1, "{id}");
    }
}

/// A claiming consumer takes the id while a transactional run of it is open
/// (its insert not yet visible): before the fix both ran and both said `run-ok`.
#[test]
fn postgres_a_claim_beside_an_open_transactional_run_is_not_a_second_plain_run() {
    // Two consumers of one table, each with its own store (its own pool).
    let (store, pg_) = pg_store("mixed");
    let tx_guard = Guard::new(store);
    let other = PostgresStore::connect(&postgres_url(), &pg_.table).unwrap();
    let claiming = Guard::new(other).with_claiming(Duration::from_secs(30));
    let body = envelope("mixed-1");
    let inside = Arc::new(Barrier::new(2));
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let transactional = {
        let (inside, body) = (inside.clone(), body.clone());
        std::thread::spawn(move || {
            tx_guard
                .process_in_transaction(body.as_str(), |msg, tx| {
                    tx.execute(&insert, &[&msg.id().unwrap()])?;
                    inside.wait();
                    std::thread::sleep(Duration::from_millis(400));
                    Ok::<(), postgres::Error>(())
                })
                .kind()
        })
    };
    inside.wait();
    let runs = std::sync::atomic::AtomicU32::new(0);
    let claimed = ready(claiming.process(body.as_str(), async |_| {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok::<(), String>(())
    }))
    .kind();
    let transactional = transactional.join().unwrap();
    let effects = pg_effects(&pg_.table, "mixed-1") as u32 + runs.into_inner();
    let plain_runs = [transactional, claimed]
        .iter()
        .filter(|k| **k == OutcomeKind::Ran)
        .count();
    assert!(
        effects <= 1 || plain_runs <= 1,
        "{effects} runs, both reported run-ok: transactional {transactional:?}, claiming {claimed:?}"
    );
    assert_eq!(transactional, OutcomeKind::Ran);
    assert_eq!(
        claimed,
        OutcomeKind::Skipped,
        "the claim waited for the commit"
    );
}

/// A commit that lost its claim decided "no other live claim holds the key" on
/// its statement's snapshot: a claim another consumer committed while the
/// commit waited on the row was not in it, so the key ended both done and
/// claimed (found by the history checker, BQ_TESTKIT_SEED=14467629832397442632;
/// this test failed on 78431e6).
#[test]
fn postgres_a_commit_that_lost_its_claim_leaves_a_claim_taken_meanwhile_alone() {
    let (store, pg_) = pg_store("lost");
    let key = "lost-1";
    let token = match &ready(store.claim_many(&[key], Duration::from_millis(50))).unwrap()[0] {
        bq_dedupe::store::Claim::Acquired(token) => token.clone(),
        other => panic!("a fresh key: {other:?}"),
    };
    std::thread::sleep(Duration::from_millis(120)); // our claim lapses
    // Another consumer takes the lapsed claim over; its statement is still open.
    let mut theirs = pg();
    let mut tx = theirs.transaction().unwrap();
    tx.execute(
        &format!(
            "UPDATE {}_claims SET token = 'theirs', expires_at = now() + interval '1 hour' \
             WHERE message_id = $1",
            pg_.table
        ),
        &[&key],
    )
    .unwrap();
    let store = Arc::new(store);
    let commit = {
        let (store, token) = (store.clone(), token.clone());
        std::thread::spawn(move || {
            ready(store.settle(&bq_dedupe::store::Settlement {
                remember: &[(key, Some(&token))],
                ..Default::default()
            }))
        })
    };
    std::thread::sleep(Duration::from_millis(300)); // our commit waits on their row
    tx.commit().unwrap();
    let settled = commit.join().unwrap().unwrap();
    assert_eq!(settled.kept, vec![false], "the claim was theirs by then");
    assert_eq!(
        ready(store.seen_many(&[key])).unwrap(),
        vec![false],
        "a live claim of another consumer holds the key: a lost commit must not mark it done"
    );
}

/// An id PostgreSQL cannot hold as text (U+0000), or cannot index (an
/// incompressible id over the 2,704-byte index row limit), failed the whole
/// batch's statement: none of the ordinary ids ran.
#[test]
fn postgres_an_id_the_table_cannot_hold_is_its_own_deliverys_verdict() {
    let (store, pg_) = pg_store("hostile");
    let store = Arc::new(store);
    let nul = "nul\u{0}id".to_string();
    let long = bq_dedupe_testkit::incompressible(0x9e37_79b9_7f4a_7c15, 500);
    assert!(long.len() > 2704);
    let mut ids: Vec<String> = (0..10).map(|i| format!("ordinary-{i}")).collect();
    ids.insert(3, nul.clone());
    ids.insert(7, long.clone());
    let bodies: Vec<String> = ids.iter().map(|id| envelope(id)).collect();
    let guards = [
        ("seen-set", Guard::new(store.clone())),
        (
            "claiming",
            Guard::new(store.clone()).with_claiming(Duration::from_secs(30)),
        ),
    ];
    for (mode, guard) in &guards {
        for id in &ids {
            ready(store.forget(id)).unwrap();
        }
        let outcomes = ready(guard.process_batch(&bodies, async |_| Ok::<(), String>(())));
        for (id, outcome) in ids.iter().zip(&outcomes) {
            if id.starts_with("ordinary") {
                assert_eq!(outcome.kind(), OutcomeKind::Ran, "{mode} {id}: {outcome:?}");
            } else {
                assert!(
                    matches!(outcome.kind(), OutcomeKind::Ran | OutcomeKind::Rejected),
                    "{mode}: a hostile id is deduped or rejected, {outcome:?}"
                );
            }
        }
        // And a redelivery of the hostile ones is a skip where they ran.
        let again = ready(guard.process_batch(&bodies, async |_| Ok::<(), String>(())));
        for (id, (first, second)) in ids.iter().zip(outcomes.iter().zip(&again)) {
            if first.kind() == OutcomeKind::Ran {
                assert_eq!(second.kind(), OutcomeKind::Skipped, "{mode} {}", id.len());
            }
        }
    }
    // The transactional batch too.
    drop(guards);
    let guard = Guard::new(Arc::into_inner(store).unwrap());
    let mut fresh = ids.clone();
    for id in fresh.iter_mut() {
        id.push_str("-tx");
    }
    let bodies: Vec<String> = fresh.iter().map(|id| envelope(id)).collect();
    let insert = format!("INSERT INTO {}_effects (id) VALUES ('x')", pg_.table);
    let outcomes =
        guard.process_batch_in_transaction(&bodies, |_, tx| tx.execute(&insert, &[]).map(drop));
    for (id, outcome) in fresh.iter().zip(&outcomes) {
        if id.starts_with("ordinary") {
            assert_eq!(outcome.kind(), OutcomeKind::Ran, "tx {id}: {outcome:?}");
        } else {
            assert!(
                matches!(outcome.kind(), OutcomeKind::Ran | OutcomeKind::Rejected),
                "tx: {outcome:?}"
            );
        }
    }
}

/// Ids up to the longest PostgreSQL indexes are stored as themselves, as the
/// Go SDK stores them (from 2,049 bytes they were digested, so an id a Go
/// consumer recorded was not found and ran again: review of bc88e4d).
#[test]
fn postgres_stores_every_id_it_can_index_as_itself_like_the_go_sdk() {
    let (store, pg_) = pg_store("as-itself");
    let longest = bq_dedupe_testkit::incompressible(7, 169)[..2692].to_string();
    let longer = bq_dedupe_testkit::incompressible(7, 169)[..2693].to_string();
    // A Go consumer recorded the longest one, as itself.
    pg().execute(
        &format!("INSERT INTO {} (message_id) VALUES ($1)", pg_.table),
        &[&longest],
    )
    .unwrap();
    assert_eq!(
        ready(store.seen_many(&[longest.as_str(), longer.as_str()])).unwrap(),
        vec![true, false]
    );
    ready(store.remember_many(&[longer.as_str()], None)).unwrap();
    let named: i64 = pg()
        .query_one(
            &format!(
                "SELECT count(*) FROM {} WHERE message_id LIKE 'bq-dedupe:sha256:%'",
                pg_.table
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(named, 1, "the one it cannot index is digested");
}

/// A transaction began on a pooled connection the server had dropped while it
/// sat idle (a restart, an idle timeout): `store-unavailable`, where every
/// other call retries on a fresh connection (found by the history checker
/// killing connections, on b939b41). Its `BEGIN` did nothing, so it is retried.
#[test]
fn postgres_a_transaction_after_the_server_dropped_an_idle_connection_runs() {
    let table = postgres_table("idle-drop");
    let _clean = PgCleanup {
        url: postgres_url(),
        table: table.clone(),
    };
    let app = format!("bq-idle-{}", std::process::id());
    let url = format!("{}?application_name={app}", postgres_url());
    let guard = Guard::new(PostgresStore::connect(&url, &table).unwrap());
    assert!(!ready(guard.store().seen("idle-1")).unwrap());
    let killed: i64 = pg()
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = $1) k",
            &[&app],
        )
        .unwrap()
        .get(0);
    assert!(killed >= 1, "the pool's idle connections");
    std::thread::sleep(Duration::from_millis(100));
    let outcome =
        guard.process_in_transaction(envelope("idle-1").as_str(), |_, _| Ok::<(), String>(()));
    assert_eq!(outcome.kind(), OutcomeKind::Ran, "{outcome:?}");
}

// ---- expiry and the purge ---------------------------------------------------------

/// The TTL of a transactional run counts from its commit: a handler slower than
/// the TTL left a row that had already expired, so the redelivery ran again.
#[test]
fn a_transactional_ttl_counts_from_the_commit_on_both_databases() {
    let ttl = Duration::from_millis(600);
    let slow = Duration::from_millis(800);
    // A handler slower than the TTL, then the id must still be live.
    fn slow_run_is_live<S: bq_dedupe::store::TransactionalStore + Store>(
        guard: Guard<S>,
        slow: Duration,
    ) {
        let outcome = guard.process_in_transaction(envelope("ttl-1").as_str(), |_, _| {
            std::thread::sleep(slow);
            Ok::<(), String>(())
        });
        assert_eq!(outcome.kind(), OutcomeKind::Ran);
        assert!(
            ready(guard.store().seen("ttl-1")).unwrap(),
            "{}: live after the commit",
            std::any::type_name::<S>()
        );
    }
    let db = TempDb::new("tx-ttl");
    slow_run_is_live(sqlite_guard(&db).with_ttl(ttl), slow);
    let (store, _pg) = pg_store("tx-ttl");
    slow_run_is_live(Guard::new(store).with_ttl(ttl), slow);
}

/// `Rules::lapsed_claim_swept` is false for SQL rows: a lapsed claim nobody took
/// over is still its owner's, so the purge must leave it (it deleted it).
#[test]
fn the_purge_leaves_a_lapsed_claim_its_owner_still_holds() {
    let db = TempDb::new("purge");
    let sqlite = SqliteStore::open(db.path()).unwrap();
    let (postgres, _pg) = pg_store("purge");
    let purge_sqlite = || sqlite.purge_expired().unwrap();
    let purge_postgres = || postgres.purge_expired().unwrap();
    let cases: [(&str, &dyn DynStore, &dyn Fn() -> u64); 2] = [
        ("sqlite", &sqlite, &purge_sqlite),
        ("postgres", &postgres, &purge_postgres),
    ];
    for (name, store, purge) in cases {
        let token = match store.claim_("lapsed-1", Duration::from_millis(50)) {
            bq_dedupe::store::Claim::Acquired(t) => t,
            other => panic!("{name}: {other:?}"),
        };
        store.remember_("expired-1", Some(Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(purge(), 1, "{name}: the expired done row only");
        assert!(
            store.commit_("lapsed-1", &token),
            "{name}: the owner's commit of its lapsed, untaken claim is its own"
        );
    }
}

/// The few calls the purge test makes, on either store.
trait DynStore {
    fn claim_(&self, key: &str, lease: Duration) -> bq_dedupe::store::Claim;
    fn remember_(&self, key: &str, ttl: Option<Duration>);
    fn commit_(&self, key: &str, token: &bq_dedupe::store::ClaimToken) -> bool;
}

impl<S: Store> DynStore for S {
    fn claim_(&self, key: &str, lease: Duration) -> bq_dedupe::store::Claim {
        ready(self.claim(key, lease)).unwrap()
    }
    fn remember_(&self, key: &str, ttl: Option<Duration>) {
        ready(self.remember(key, ttl)).unwrap()
    }
    fn commit_(&self, key: &str, token: &bq_dedupe::store::ClaimToken) -> bool {
        ready(self.remember_fenced(key, token, None)).unwrap()
    }
}

// ---- from the adversarial review of the fixes above ----------------------------

/// A batch entry that waited on another run's mark and then found the id done
/// released its savepoint, keeping its own mark: an 'infinity' claim row that
/// parked every later delivery of the id (found by review of 9590666).
#[test]
fn postgres_a_batch_that_finds_the_id_done_after_waiting_leaves_no_mark() {
    use bq_dedupe::store::{TransactionalStore, TxRun};
    let (store, pg_) = pg_store("batch-mark");
    let other = PostgresStore::connect(&postgres_url(), &pg_.table).unwrap();
    let ttl = Some(Duration::from_millis(500));
    let inside = Arc::new(Barrier::new(2));
    let first = {
        let inside = inside.clone();
        std::thread::spawn(move || {
            store
                .transaction(Some("bm-1"), ttl, |_tx| {
                    inside.wait();
                    std::thread::sleep(Duration::from_millis(300));
                    Ok::<(), ()>(())
                })
                .unwrap()
        })
    };
    inside.wait();
    let runs = other
        .transaction_batch(&[Some("bm-1")], ttl, |_, _| Ok::<(), ()>(()))
        .unwrap();
    assert_eq!(first.join().unwrap(), TxRun::Committed(()));
    assert_eq!(runs, [TxRun::AlreadyDone]);
    let marks: i64 = pg()
        .query_one(&format!("SELECT count(*) FROM {}_claims", pg_.table), &[])
        .unwrap()
        .get(0);
    assert_eq!(marks, 0, "the batch's mark outlived it");
    std::thread::sleep(Duration::from_millis(700)); // the id's TTL is over
    assert!(matches!(
        ready(other.claim("bm-1", Duration::from_secs(5))).unwrap(),
        bq_dedupe::store::Claim::Acquired(_)
    ));
}

/// After a statement that rolled the whole SQLite transaction back, the
/// handler's next writes ran in autocommit and committed alone; the delivery
/// was retried and they committed again (found by review of 9590666).
#[test]
fn sqlite_writes_after_a_swallowed_rollback_are_never_committed() {
    let db = TempDb::new("swallow-then-write");
    let guard = sqlite_guard(&db);
    let body = envelope("sw-2");
    let handler = |msg: &bq_dedupe::Message<'_>, tx: &mut rusqlite::Transaction<'_>| {
        let _ = tx.execute("INSERT OR ROLLBACK INTO once VALUES ('taken')", []);
        tx.execute("INSERT INTO effects (id) VALUES (?1)", [msg.id().unwrap()])
            .map(drop)
            .map_err(|e| e.to_string())
    };
    for _ in 0..2 {
        let outcome = guard.process_in_transaction(body.as_str(), handler);
        assert_eq!(outcome.kind(), OutcomeKind::Failed, "{outcome:?}");
        assert_eq!(
            sqlite_effects(db.path(), "sw-2"),
            0,
            "run-failed, yet a write committed"
        );
    }
    // The same in a batch, with a good neighbour after it.
    let bodies = [envelope("sw-3"), envelope("sw-4")];
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        if msg.id() == Some("sw-3") {
            return handler(msg, tx);
        }
        tx.execute("INSERT INTO effects (id) VALUES (?1)", [msg.id().unwrap()])
            .map(drop)
            .map_err(|e| e.to_string())
    });
    assert_eq!(outcomes[0].kind(), OutcomeKind::Failed, "{outcomes:?}");
    assert_eq!(sqlite_effects(db.path(), "sw-3"), 0);
    assert_eq!(outcomes[1].kind(), OutcomeKind::Ran, "{outcomes:?}");
    assert_eq!(sqlite_effects(db.path(), "sw-4"), 1);
}

/// A transactional handler that ends the store's transaction itself (its own
/// `COMMIT`) and then fails: its write and the id's take were committed by it.
/// Before, the redelivery was a skip (the failed run acked as a duplicate) and,
/// once the TTL was over, the take's mark (committed with an endless lease)
/// parked every later delivery of the id for good. Now the run is reported,
/// the id left unrecorded: the redelivery runs (its write twice, as reported).
#[test]
fn postgres_a_handler_that_commits_the_stores_transaction_then_fails_is_reported_and_runs_again() {
    let (store, pg_) = pg_store("handler-commit");
    let ttl = Duration::from_millis(1000);
    let guard = Guard::new(store).with_ttl(ttl);
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let body = envelope("hc-1");
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).unwrap();
        tx.batch_execute("COMMIT").unwrap();
        Err::<(), _>("failed after its own COMMIT")
    });
    assert_eq!(outcome.kind(), OutcomeKind::Failed, "{outcome:?}");
    let reason = outcome.reason().unwrap();
    assert!(reason.contains("its own COMMIT"), "{reason}");
    assert!(reason.contains("writes it again"), "{reason}");
    assert_eq!(pg_effects(&pg_.table, "hc-1"), 1);
    let plain = |msg: &bq_dedupe::Message<'_>, tx: &mut postgres::Transaction<'_>| {
        tx.execute(&insert, &[&msg.id().unwrap()]).map(drop)
    };
    let again = guard.process_in_transaction(body.as_str(), plain);
    assert_eq!(again.kind(), OutcomeKind::Ran, "{again:?}");
    assert_eq!(pg_effects(&pg_.table, "hc-1"), 2);
    let skipped = guard.process_in_transaction(body.as_str(), plain);
    assert_eq!(skipped.kind(), OutcomeKind::Skipped, "{skipped:?}");
    std::thread::sleep(ttl + Duration::from_millis(300));
    let after_ttl = guard.process_in_transaction(body.as_str(), plain);
    assert_eq!(after_ttl.kind(), OutcomeKind::Ran, "{after_ttl:?}");
    assert_eq!(pg_effects(&pg_.table, "hc-1"), 3);
}

/// The same handler, but `ROLLBACK` instead: its write after it was committed
/// alone; reported the same way, and the redelivery runs.
#[test]
fn postgres_a_handler_that_rolls_back_the_stores_transaction_then_fails_is_reported() {
    let (store, pg_) = pg_store("handler-rollback");
    let guard = Guard::new(store).with_ttl(Duration::from_secs(60));
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let body = envelope("hr-1");
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.batch_execute("ROLLBACK").unwrap();
        tx.execute(&insert, &[&msg.id().unwrap()]).unwrap();
        Err::<(), _>("failed after its own ROLLBACK")
    });
    assert_eq!(outcome.kind(), OutcomeKind::Failed, "{outcome:?}");
    assert!(
        outcome.reason().unwrap().contains("its own ROLLBACK"),
        "{outcome:?}"
    );
    let again = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).map(drop)
    });
    assert_eq!(again.kind(), OutcomeKind::Ran, "{again:?}");
    assert_eq!(pg_effects(&pg_.table, "hr-1"), 2);
}

/// The same in a batch: the second delivery's handler commits the batch's
/// transaction. Its savepoint is gone, so the batch cannot go on in it: what
/// the `COMMIT` took (the first two, whole) stays done and is `run-ok`, and
/// the third runs alone (the whole batch was store-unavailable, then a
/// redelivery ran the rest). Each effect once, and after the TTL every id
/// runs again.
#[test]
fn postgres_a_batch_whose_handler_commits_the_transaction_says_so_and_loses_nothing() {
    let (store, pg_) = pg_store("handler-commit-batch");
    let ttl = Duration::from_millis(1000);
    let guard = Guard::new(store).with_ttl(ttl);
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    let ids = ["hcb-1", "hcb-2", "hcb-3"];
    let bodies: Vec<String> = ids.map(envelope).to_vec();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()])?;
        if msg.id() == Some("hcb-2") {
            tx.batch_execute("COMMIT")?;
        }
        Ok::<(), postgres::Error>(())
    });
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(|o| o.kind()).collect();
    assert_eq!(kinds, [OutcomeKind::Ran; 3], "{outcomes:?}");
    let plain = |msg: &bq_dedupe::Message<'_>, tx: &mut postgres::Transaction<'_>| {
        tx.execute(&insert, &[&msg.id().unwrap()]).map(drop)
    };
    let again = guard.process_batch_in_transaction(&bodies, plain);
    let kinds: Vec<OutcomeKind> = again.iter().map(|o| o.kind()).collect();
    assert_eq!(kinds, [OutcomeKind::Skipped; 3], "{again:?}");
    for id in ids {
        assert_eq!(pg_effects(&pg_.table, id), 1, "{id}");
    }
    std::thread::sleep(ttl + Duration::from_millis(300));
    let after_ttl = guard.process_batch_in_transaction(&bodies, plain);
    let kinds: Vec<OutcomeKind> = after_ttl.iter().map(|o| o.kind()).collect();
    assert_eq!(kinds, [OutcomeKind::Ran; 3], "{after_ttl:?}");
}

/// The undo of a take a handler's `COMMIT` committed leaves a row another
/// writer made since: here a Go consumer that found the row expired (the
/// handler still running past the TTL), ran, and remembered the id with Go's
/// upsert. The reviewer's finding: the undo deleted it, and the id ran a third
/// time.
#[test]
fn postgres_the_undo_of_a_handlers_commit_leaves_a_go_consumers_row() {
    let (store, pg_) = pg_store("handler-commit-go");
    let ttl = Duration::from_millis(500);
    let guard = Guard::new(store).with_ttl(ttl);
    let insert = format!("INSERT INTO {}_effects (id) VALUES ($1)", pg_.table);
    // The Go SDK's remember (its upsert: an expired row is written afresh).
    let go_upsert = format!(
        "INSERT INTO {} AS cur (message_id, expires_at) VALUES ($1, now() + interval '1 hour')
         ON CONFLICT (message_id) DO UPDATE SET created_at = now(), expires_at = EXCLUDED.expires_at
         WHERE cur.expires_at IS NOT NULL AND cur.expires_at <= now()",
        pg_.table
    );
    let body = envelope("hcg-1");
    let outcome = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).unwrap();
        tx.batch_execute("COMMIT").unwrap();
        std::thread::sleep(ttl + Duration::from_millis(300));
        let mut go = pg();
        go.execute(&insert, &[&msg.id().unwrap()]).unwrap();
        let taken = go.execute(&go_upsert, &[&msg.id().unwrap()]).unwrap();
        assert_eq!(taken, 1, "Go's upsert must take the expired row over");
        Err::<(), _>("failed after its own COMMIT")
    });
    assert_eq!(outcome.kind(), OutcomeKind::Failed, "{outcome:?}");
    assert_eq!(pg_effects(&pg_.table, "hcg-1"), 2);
    let again = guard.process_in_transaction(body.as_str(), |msg, tx| {
        tx.execute(&insert, &[&msg.id().unwrap()]).map(drop)
    });
    assert_eq!(again.kind(), OutcomeKind::Skipped, "{again:?}");
    assert_eq!(pg_effects(&pg_.table, "hcg-1"), 2);
}
