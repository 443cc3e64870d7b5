//! PostgreSQL's exactly-once mode across a crash of the server (the second
//! cluster of scripts/with-postgres.sh, which this test stops, restarts and
//! resets): a binary of its own, so the crashes and restarts do not slow the
//! timed tests of tests/exactly_once.rs beside them.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use bq_dedupe::{Guard, OutcomeKind};
use bq_dedupe_stores::PostgresStore;
use common::*;

/// The server crashes while a handler runs (the second cluster of
/// scripts/with-postgres.sh: stopped as a crash stops it, or one unrelated
/// backend killed, as the OOM killer does, after which the server resets
/// every session and recovers without a restart): the run's undo, kept while
/// the server is down, is tried before the store's next run. By then
/// PostgreSQL has handed the crashed run's transaction id, whose writes never
/// reached the disk, to the retry of the same id, which committed: the undo,
/// which named the take by that xid alone, deleted the retry's committed row,
/// and a copy of the id ran again, `run-ok` (a trial, 3 of 3; after a reset
/// the server's start time stays, so that could not tell either: a trial).
/// Tried until the id is seen reused.
#[test]
fn postgres_an_undo_kept_over_a_crash_leaves_the_row_a_reused_transaction_id_wrote() {
    // The last on a table made by hand whose created_at has no default (the
    // take wrote NULL there, and the undo matched by xmin alone: a review).
    for (how, hand_made) in [("stop", false), ("kill", false), ("kill", true)] {
        undo_kept_over_a_crash(how, hand_made);
    }
}

fn undo_kept_over_a_crash(how: &str, hand_made: bool) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: run the tests through scripts/with-postgres.sh")
        })
    };
    let (url, crash) = (
        var("BQ_TEST_POSTGRES_CRASHABLE_URL"),
        var("BQ_TEST_POSTGRES_CRASH"),
    );
    let server = |args: &[&str]| {
        let done = Command::new(&crash).args(args).status().unwrap();
        assert!(done.success(), "crash.sh {args:?}");
    };
    let up = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match postgres::Client::connect(&url, postgres::NoTls) {
                Ok(client) => return client,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("the crashable server is not back: {e}"),
            }
        }
    };
    let table = postgres_table("tx-crash");
    let _clean = PgCleanup {
        url: url.clone(),
        table: table.clone(),
    };
    if hand_made {
        up().batch_execute(&format!(
            "CREATE TABLE {table} (message_id TEXT PRIMARY KEY, created_at TIMESTAMPTZ, \
             expires_at TIMESTAMPTZ)"
        ))
        .unwrap();
    }
    let guard = Guard::new(PostgresStore::connect(&url, &table).unwrap());
    let ok = |_: &bq_dedupe::Message<'_>, _: &mut postgres::Transaction<'_>| {
        Ok::<(), postgres::Error>(())
    };
    let mut reused = 0;
    for attempt in 0..6 {
        let x = format!("crash-{how}-x-{attempt}");
        let y = format!("crash-{how}-y-{attempt}");
        let mut crashed_xid = 0_i64;
        let mut bystander = up();
        let first = guard.process_in_transaction(envelope(&x).as_str(), |_, tx| {
            crashed_xid = tx.query_one("SELECT txid_current()", &[])?.get(0);
            if how == "stop" {
                server(&["stop"]);
            } else {
                let pid: i32 = bystander.query_one("SELECT pg_backend_pid()", &[])?.get(0);
                server(&["kill", &pid.to_string()]);
                // The reset comes when the server has seen its backend die: it
                // ends this session too (the store's COMMIT raced it: flaky).
                let deadline = Instant::now() + Duration::from_secs(10);
                while tx.batch_execute("SELECT 1").is_ok() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Ok::<(), postgres::Error>(())
        });
        assert_ne!(first.kind(), OutcomeKind::Ran, "{how}: {first:?}");
        if how == "stop" {
            server(&["start"]);
        }
        let mut client = up();
        // The queue's retry of x: the first transaction after the recovery.
        let retry = guard.process_in_transaction(envelope(&x).as_str(), ok);
        assert_eq!(retry.kind(), OutcomeKind::Ran, "{how}: {retry:?}");
        let xmin: String = client
            .query_one(
                &format!("SELECT xmin::text FROM {table} WHERE message_id = $1"),
                &[&x],
            )
            .unwrap()
            .get(0);
        // The kept undo is tried before this run.
        let other = guard.process_in_transaction(envelope(&y).as_str(), ok);
        assert_eq!(other.kind(), OutcomeKind::Ran, "{how}: {other:?}");
        let copy = guard.process_in_transaction(envelope(&x).as_str(), ok);
        assert_eq!(
            copy.kind(),
            OutcomeKind::Skipped,
            "{how}: x ran twice: {copy:?}"
        );
        if xmin == (crashed_xid & 0xffff_ffff).to_string() {
            reused += 1;
            if reused == 2 {
                break;
            }
        }
    }
    assert!(
        reused > 0,
        "{how}: the crashed run's transaction id was never handed out again"
    );
}
