//! `SqliteStore` on real files under `target/`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::{Guard, Outcome, Store, clock::ManualClock, store::Claim, store::StoreErrorKind};
use bq_dedupe_stores::{SqliteStore, StoreStats};
use common::{TempDb, deliver, ready};

fn with_clock(db: &TempDb, start_ms: u64) -> (SqliteStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(start_ms));
    let store = SqliteStore::open(db.path())
        .unwrap()
        .with_clock(clock.clone());
    (store, clock)
}

/// Beyond the hostile keys every backend stores (any.rs): the SQL-looking id
/// did not touch the table.
#[test]
fn sqlite_an_sql_looking_id_is_a_value() {
    let db = TempDb::new("hostile");
    let store = SqliteStore::open(db.path()).unwrap();
    ready(store.remember("'); DROP TABLE bq_dedupe; --", None)).unwrap();
    ready(store.remember("after", None)).unwrap();
    assert!(ready(store.seen("after")).unwrap());
}

/// Sixteen connections opening one new file at the same instant (as sixteen
/// consumers starting together would) all open it: creating the file, switching it
/// to WAL and creating the table answer "database is locked" at once for some of
/// them, which `open` waits out. 20 fresh files.
#[test]
fn sqlite_sixteen_simultaneous_opens_of_a_new_file_all_succeed() {
    for round in 0..20 {
        let db = TempDb::new(&format!("open-race-{round}"));
        let barrier = std::sync::Barrier::new(16);
        let opened: Vec<Result<(), String>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let store = SqliteStore::open(db.path()).map_err(|e| e.to_string())?;
                        common::ready(store.remember("k", None)).map_err(|e| e.to_string())
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let failed: Vec<&String> = opened.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(failed.is_empty(), "round {round}: {failed:?}");
    }
}

#[test]
fn sqlite_open_creates_folders_and_uses_wal_normal() {
    let db = TempDb::new("nested");
    let nested = db.path().with_extension("d").join("a/b/dedupe.db");
    let store = SqliteStore::open(&nested).unwrap();
    ready(store.remember("x", None)).unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&nested).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM bq_dedupe", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    drop(conn);
    std::fs::remove_dir_all(db.path().with_extension("d")).unwrap();
}

#[test]
fn sqlite_remembered_id_survives_reopening() {
    let db = TempDb::new("reopen");
    {
        let store = SqliteStore::open(db.path()).unwrap();
        ready(store.remember("kept", None)).unwrap();
        ready(store.remember_many(&["kept-2", "kept-3"], None)).unwrap();
    }
    let store = SqliteStore::open(db.path()).unwrap();
    assert_eq!(
        ready(store.seen_many(&["kept", "kept-2", "kept-3", "other"])).unwrap(),
        vec![true, true, true, false]
    );
    // And through a fresh guard: the redelivery after a restart is skipped.
    assert_eq!(deliver(&Guard::new(store), "kept", true), Outcome::Skipped);
}

/// The child half of the kill test: remember, say so, then wait to be killed.
#[test]
fn sqlite_kill_child() {
    let Ok(path) = std::env::var("BQ_KILL_CHILD_DB") else {
        return; // only runs as the child of the test below
    };
    let store = SqliteStore::open(&path).unwrap();
    ready(store.remember("before-kill", None)).unwrap();
    println!("remembered");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn sqlite_remembered_id_survives_kill_9() {
    let db = TempDb::new("kill");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sqlite_kill_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BQ_KILL_CHILD_DB", db.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let said = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains("remembered"));
    child.kill().unwrap(); // SIGKILL: no destructor, no checkpoint, no close
    child.wait().unwrap();
    assert!(said, "the child never remembered");
    let store = SqliteStore::open(db.path()).unwrap();
    assert!(ready(store.seen("before-kill")).unwrap());
}

#[test]
fn sqlite_ttl_expiry_follows_the_clock() {
    let db = TempDb::new("ttl");
    let (store, clock) = with_clock(&db, 1_000_000);
    ready(store.remember("t", Some(Duration::from_secs(60)))).unwrap();
    ready(store.remember_many(&["t-2"], Some(Duration::from_secs(60)))).unwrap();
    clock.advance(59_999);
    assert!(ready(store.seen("t")).unwrap(), "not forgotten early");
    assert_eq!(
        ready(store.claim("t", Duration::from_secs(5))).unwrap(),
        Claim::Seen
    );
    clock.advance(1);
    assert_eq!(
        ready(store.seen_many(&["t", "t-2"])).unwrap(),
        vec![false, false]
    );
    assert_eq!(
        store.stats().unwrap(),
        StoreStats {
            remembered: 0,
            claimed: 0,
            expired: 2
        }
    );
    // An expired id can be claimed and run again.
    assert!(matches!(
        ready(store.claim("t", Duration::from_secs(5))).unwrap(),
        Claim::Acquired(_)
    ));
    assert_eq!(
        store.purge_expired().unwrap(),
        1,
        "t-2 only: t is a claim now"
    );
    // Remembering without a TTL keeps the id for good.
    ready(store.remember("t", None)).unwrap();
    clock.advance(100 * 365 * 24 * 3_600_000);
    assert!(ready(store.seen("t")).unwrap());
}

#[test]
fn sqlite_ttl_expiry_lets_the_guard_run_again() {
    let db = TempDb::new("ttl-guard");
    let (store, clock) = with_clock(&db, 0);
    let guard = Guard::new(store).with_ttl(Duration::from_secs(10));
    assert_eq!(deliver(&guard, "g", true), Outcome::Ran);
    clock.advance(9_999);
    assert_eq!(deliver(&guard, "g", true), Outcome::Skipped);
    clock.advance(1);
    assert_eq!(deliver(&guard, "g", true), Outcome::Ran);
}

#[test]
fn sqlite_lease_expiry_makes_a_claim_reclaimable() {
    let db = TempDb::new("lease");
    let (store, clock) = with_clock(&db, 5_000);
    let lease = Duration::from_secs(30);
    let Claim::Acquired(crashed) = ready(store.claim("l", lease)).unwrap() else {
        panic!("free key");
    };
    clock.advance(29_999);
    assert_eq!(ready(store.claim("l", lease)).unwrap(), Claim::Held);
    assert_eq!(store.stats().unwrap().claimed, 1);
    clock.advance(1);
    assert_eq!(store.stats().unwrap().expired, 1);
    let Claim::Acquired(second) = ready(store.claim("l", lease)).unwrap() else {
        panic!("a lapsed lease must be reclaimable");
    };
    // The crashed holder comes back: its stale token releases nothing.
    ready(store.release("l", &crashed)).unwrap();
    assert_eq!(ready(store.claim("l", lease)).unwrap(), Claim::Held);
    ready(store.release("l", &second)).unwrap();
    assert!(matches!(
        ready(store.claim("l", lease)).unwrap(),
        Claim::Acquired(_)
    ));

    // Through the guard: a crashed holder parks others until its lease ends.
    let guard = Guard::new(store).with_claiming(lease);
    ready(guard.store().claim("g", lease)).unwrap();
    assert_eq!(deliver(&guard, "g", true), Outcome::Parked);
    clock.advance(30_000);
    assert_eq!(deliver(&guard, "g", true), Outcome::Ran);
    assert_eq!(deliver(&guard, "g", true), Outcome::Skipped);
}

#[test]
fn sqlite_stats_and_purge() {
    let db = TempDb::new("stats");
    let (store, clock) = with_clock(&db, 0);
    ready(store.remember_many(&["a", "b"], None)).unwrap();
    ready(store.remember("c", Some(Duration::from_secs(1)))).unwrap();
    ready(store.claim_many(&["d", "e"], Duration::from_secs(2))).unwrap();
    assert_eq!(
        store.stats().unwrap(),
        StoreStats {
            remembered: 3,
            claimed: 2,
            expired: 0
        }
    );
    clock.advance(2_000);
    assert_eq!(
        store.stats().unwrap(),
        StoreStats {
            remembered: 2,
            claimed: 0,
            expired: 3
        }
    );
    // The expired done row; the lapsed claims stay their owners' for an hour.
    assert_eq!(store.purge_expired().unwrap(), 1);
    assert_eq!(store.purge_expired().unwrap(), 0);
    assert_eq!(store.stats().unwrap().expired, 2);
    clock.advance(bq_dedupe_stores::STALE_CLAIM.as_millis() as u64);
    assert_eq!(store.purge_expired().unwrap(), 2);
    assert_eq!(store.stats().unwrap().expired, 0);
    assert_eq!(store.stats().unwrap().remembered, 2);
}

#[test]
fn sqlite_failures_are_typed_errors_not_panics() {
    let db = TempDb::new("bad");
    // A directory where the file should be: a spec to fix (it was
    // `Unavailable`, "unable to open database file": the CLI's "run it again
    // later", exit 6, a trial).
    let dir = db.path().with_extension("dir");
    std::fs::create_dir_all(&dir).unwrap();
    let e = SqliteStore::open(&dir).unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Invalid, "{e}");
    assert!(e.message.contains("is a directory"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    // A file that is not a database.
    std::fs::create_dir_all(db.path().parent().unwrap()).unwrap();
    std::fs::write(db.path(), vec![b'x'; 4096]).unwrap();
    let e = SqliteStore::open(db.path()).unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Internal, "{e}");
}

#[test]
fn sqlite_table_dropped_under_the_store_is_an_error() {
    let db = TempDb::new("dropped");
    let store = SqliteStore::open(db.path()).unwrap();
    let other = rusqlite::Connection::open(db.path()).unwrap();
    other.execute_batch("DROP TABLE bq_dedupe").unwrap();
    let e = ready(store.seen("x")).unwrap_err();
    assert_eq!(e.kind, StoreErrorKind::Internal, "{e}");
    assert!(ready(store.claim("x", Duration::from_secs(1))).is_err());
    // A guard turns it into a retry, never a run.
    let guard = Guard::new(&store);
    assert!(matches!(
        deliver(&guard, "x", true),
        Outcome::StoreUnavailable(_)
    ));
}

/// A consumer (re)starting while another holds a write transaction longer than
/// the busy timeout (a slow transactional batch): its store opens, reading
/// that the table is there, and answers reads (`open` took the write lock to
/// make the table even when it existed, and failed "database is locked"
/// after 5 s: a trial's finding; failed first).
#[test]
fn a_store_opens_beside_a_long_write_transaction() {
    let db = TempDb::new("open-beside-writer");
    let first = SqliteStore::open(db.path()).unwrap();
    ready(first.remember("before", None)).unwrap();
    let writer = rusqlite::Connection::open(db.path()).unwrap();
    writer
        .execute_batch("BEGIN IMMEDIATE; INSERT INTO bq_dedupe (key, state) VALUES ('held', 1);")
        .unwrap();
    let started = std::time::Instant::now();
    let second = SqliteStore::open(db.path())
        .unwrap_or_else(|e| panic!("opened after {:?}: {e}", started.elapsed()));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(ready(second.seen("before")).unwrap());
    writer.execute_batch("ROLLBACK").unwrap();
}

/// A clock that moves a second on every read (another client advancing a
/// shared manual clock, or a real clock read twice across a TTL).
struct Ticking(std::sync::atomic::AtomicU64);

impl bq_dedupe::clock::Clock for Ticking {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(1000, std::sync::atomic::Ordering::SeqCst)
    }
}

/// A transactional run reads the time once for its id's expiry and for the
/// check that the id is recorded: read twice, a TTL the clock passed in
/// between made the check find the id expired, and a run that succeeded was
/// aborted, nothing committed (the history checker's find, 150 runs x 14
/// clients on a shared manual clock; failed first).
#[test]
fn a_transactional_run_reads_its_time_once() {
    use bq_dedupe::store::{TransactionalStore, TxRun};
    let db = TempDb::new("tx-ticking");
    let store = SqliteStore::open(db.path())
        .unwrap()
        .with_clock(Arc::new(Ticking(1_000_000.into())));
    let run = store.transaction(Some("tick"), Some(Duration::from_secs(1)), |_| {
        Ok::<(), ()>(())
    });
    assert!(matches!(run, Ok(TxRun::Committed(()))), "{run:?}");
    let runs = store.transaction_batch(
        &[Some("tick-a"), Some("tick-b")],
        Some(Duration::from_secs(1)),
        |_, _| Ok::<(), ()>(()),
    );
    assert!(
        matches!(
            runs.as_deref(),
            Ok([TxRun::Committed(()), TxRun::Committed(())])
        ),
        "{runs:?}"
    );
}

/// D1's exactly-once batch with a claim (crates/workers/src/d1.rs), run as D1
/// runs it (SQLite, the statements of src/store/sql.rs in one transaction):
/// the run's own claim becomes its done row in place; a free key is inserted;
/// another's live claim or done row, or a claim that took over our lapsed
/// one, fails the batch whole on the key's constraint (as D1 is told apart
/// from the handler's failures) and stays.
#[test]
fn d1s_exactly_once_batch_replaces_its_own_claim_and_no_other() {
    use bq_dedupe::store::sql::{
        CLAIM, REMEMBER, SCHEMA, TX_CHECK_RECORDED, TX_CLEAR_EXPIRED, TX_DONE_OVER_OWN_CLAIM,
        TX_REFUSE_OTHERS_ROW,
    };
    use rusqlite::params;
    let mut db = rusqlite::Connection::open_in_memory().unwrap();
    db.execute_batch(SCHEMA).unwrap();
    db.execute_batch("CREATE TABLE effects (key TEXT)").unwrap();
    let claim = |db: &rusqlite::Connection, key: &str, token: &str, now: i64| {
        db.execute(CLAIM, params![key, token, now + 10, now])
            .unwrap()
    };
    // The batch of a run holding `own` at `now`: committed, or the error that
    // rolled it back.
    let batch = |db: &mut rusqlite::Connection, key: &str, own: &str, now: i64| {
        let tx = db.transaction().unwrap();
        let done_by = format!("tx-{own}");
        let over = params![key, done_by, None::<i64>, own];
        let ran = tx
            .execute(TX_CLEAR_EXPIRED, params![key, now])
            .and_then(|_| tx.execute(TX_DONE_OVER_OWN_CLAIM, over))
            .and_then(|_| tx.execute(TX_REFUSE_OTHERS_ROW, params![key, done_by]))
            .and_then(|_| tx.execute("INSERT INTO effects VALUES (?1)", [key]))
            .and_then(|_| tx.execute(TX_CHECK_RECORDED, params![key, done_by, now]));
        ran.map(|_| tx.commit().unwrap()).map_err(|e| e.to_string())
    };
    let refused = |ran: Result<(), String>| match ran {
        Err(e) => assert!(e.contains("UNIQUE constraint failed: bq_dedupe.key"), "{e}"),
        Ok(()) => panic!("the batch committed"),
    };
    let row = |db: &rusqlite::Connection, key: &str| -> (i64, String) {
        db.query_row(
            "SELECT state, token FROM bq_dedupe WHERE key = ?1",
            [key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    let effects = |db: &rusqlite::Connection, key: &str| -> i64 {
        db.query_row("SELECT count(*) FROM effects WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .unwrap()
    };
    assert_eq!(claim(&db, "mine", "c-1", 0), 1);
    batch(&mut db, "mine", "c-1", 5).expect("our own claim is replaced");
    assert_eq!(
        (row(&db, "mine"), effects(&db, "mine")),
        ((1, "tx-c-1".into()), 1)
    );

    assert_eq!(claim(&db, "theirs", "c-2", 0), 1);
    refused(batch(&mut db, "theirs", "c-1", 5)); // another's live claim
    assert_eq!(
        (row(&db, "theirs"), effects(&db, "theirs")),
        ((0, "c-2".into()), 0)
    );

    assert_eq!(claim(&db, "taken", "c-1", 0), 1);
    assert_eq!(
        claim(&db, "taken", "c-3", 20),
        1,
        "our lapsed claim taken over"
    );
    refused(batch(&mut db, "taken", "c-1", 25)); // the taker's claim
    assert_eq!(
        (row(&db, "taken"), effects(&db, "taken")),
        ((0, "c-3".into()), 0)
    );

    assert_eq!(claim(&db, "lapsed", "c-1", 0), 1);
    batch(&mut db, "lapsed", "c-1", 30).expect("our lapsed claim nobody took");
    assert_eq!(row(&db, "lapsed"), (1, "tx-c-1".into()));

    batch(&mut db, "free", "c-1", 5).expect("a free key (our claim released)");
    assert_eq!(
        (row(&db, "free"), effects(&db, "free")),
        ((1, "tx-c-1".into()), 1)
    );
    refused(batch(&mut db, "free", "c-4", 6)); // done by another run
    assert_eq!(
        (row(&db, "free"), effects(&db, "free")),
        ((1, "tx-c-1".into()), 1)
    );
    // Done by a plain remember (no token): refused on the key too, not let by
    // to fail at the last statement (read as the handler's doing once the row
    // expired before the read: a review).
    db.execute(REMEMBER, params!["remembered", None::<i64>])
        .unwrap();
    refused(batch(&mut db, "remembered", "c-1", 6));
    let rows: i64 = db
        .query_row("SELECT count(*) FROM bq_dedupe", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 6, "no row but the keys' own");
}
