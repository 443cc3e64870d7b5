//! The guard in the loop (`bq_dedupe_testkit::guard_fleet`, whose docs name
//! the invariants) on every store: four consumers (threads, each with its own
//! store connection) in each mode, handlers that fail, panic, run past their
//! lease, swallow a failed statement (the transactional mode) or die after
//! their effect and before the commit (claiming: the claim is left to lapse;
//! transactional: the transaction, its PostgreSQL connection killed, rolls
//! back), restarted knowing nothing.
//!
//! (The seen-set mode's window, concurrent duplicates both running, is
//! documented, not checked; consumers killed mid-commit are also in
//! `exactly_once.rs`, as real processes.)

mod common;

use std::time::Duration;

use bq_dedupe::{Guard, OutcomeKind};
use bq_dedupe_stores::{PostgresStore, SqliteStore};
use bq_dedupe_testkit::guard_fleet::{
    Act, Inbox, check_claiming_fleet, envelope, plain_delivery, run_on_threads,
};
use common::*;

const CONSUMERS: usize = 4;
const LEASE: Duration = Duration::from_millis(150);

/// A fleet's run checked, on threads: `deliver(consumer, id, act)`.
fn fleet(
    mode: &str,
    deliver: impl Fn(usize, &str, Act) -> (bool, Option<OutcomeKind>) + Sync,
    committed: Option<&dyn Fn(&str) -> i64>,
) -> Inbox {
    let inbox = Inbox::new(&unique(mode), LEASE);
    run_on_threads(&inbox, CONSUMERS, deliver)
        .and_then(|()| inbox.check(mode, committed))
        .unwrap_or_else(|e| panic!("{e}"));
    inbox
}

fn sleep(d: Duration) -> impl Future<Output = ()> {
    std::thread::sleep(d);
    std::future::ready(())
}

#[test]
fn claiming_consumers_on_every_backend_lose_nothing_and_report_every_second_run() {
    // Every second run is reported where commits are fenced (not PHP's format).
    on_backends("fleet", fenced, |subject| {
        let stores: Vec<_> = (0..CONSUMERS).map(|_| subject.open()).collect();
        let mode = format!("claiming {}", subject.name());
        check_claiming_fleet(&mode, &unique("fleet"), &stores, LEASE);
    });
}

#[test]
fn seen_set_consumers_lose_nothing() {
    let memory = bq_dedupe::InMemoryStore::new();
    let guards: Vec<Guard<&bq_dedupe::InMemoryStore>> =
        (0..CONSUMERS).map(|_| Guard::new(&memory)).collect();
    fleet(
        "seen-set",
        |c, id, act| ready(plain_delivery(&guards[c], id, act, LEASE, sleep)),
        None,
    );
}

// ---- the transactional mode, alone and beside claiming consumers ----------------

/// A transactional consumer's delivery on PostgreSQL: the effect row is written
/// in the transaction; `batched`: through the batch path (a batch of one, whose
/// savepoints and marks differ from the single path's).
fn pg_tx_delivery(
    guard: &Guard<PostgresStore>,
    insert: &str,
    id: &str,
    act: Act,
    batched: bool,
) -> (bool, Option<OutcomeKind>) {
    let handler = |msg: &bq_dedupe::Message<'_>, tx: &mut postgres::Transaction<'_>| {
        tx.execute(insert, &[&msg.id().unwrap()])
            .map_err(|e| e.to_string())?;
        match act {
            Act::Fail => Err("declined".to_string()),
            Act::Panic => panic!("handler bug"),
            Act::Slow => {
                std::thread::sleep(LEASE);
                Ok(())
            }
            Act::Swallow => {
                let _ = tx.execute("SELECT 1/0", &[]);
                Ok(())
            }
            Act::Succeed => Ok(()),
            Act::Die => {
                // The consumer's connection dies with it, mid-transaction.
                let _ = tx.execute("SELECT pg_terminate_backend(pg_backend_pid())", &[]);
                Ok(())
            }
        }
    };
    let body = envelope(id);
    let kind = if batched {
        guard.process_batch_in_transaction(&[body.as_str()], handler)[0].kind()
    } else {
        guard.process_in_transaction(body.as_str(), handler).kind()
    };
    if act == Act::Die {
        return (false, None); // nobody is left to see the outcome
    }
    // The effect is the committed row: there only when the outcome says run-ok.
    (kind == OutcomeKind::Ran, Some(kind))
}

#[test]
fn transactional_and_mixed_fleets_on_postgres_commit_each_effect_once() {
    for mixed in [false, true] {
        let mode = if mixed {
            "claiming beside transactional"
        } else {
            "transactional"
        };
        let table = postgres_table("txfleet");
        let stores: Vec<PostgresStore> = (0..CONSUMERS)
            .map(|_| PostgresStore::connect(&postgres_url(), &table).unwrap())
            .collect();
        let _clean = PgCleanup {
            url: postgres_url(),
            table: table.clone(),
        };
        pg().batch_execute(&format!("CREATE TABLE {table}_fx (id TEXT NOT NULL)"))
            .unwrap();
        let _fx = PgCleanup {
            url: postgres_url(),
            table: format!("{table}_fx"),
        };
        let insert = format!("INSERT INTO {table}_fx (id) VALUES ($1)");
        // Consumers 0 and 1 transactional (1 through the batch path); in the mixed
        // fleet 2 and 3 claim, and write their effect row after the handler,
        // outside the guard.
        let tx_guards: Vec<Guard<PostgresStore>> = stores.into_iter().map(Guard::new).collect();
        let claiming_store = PostgresStore::connect(&postgres_url(), &table).unwrap();
        let claiming = Guard::new(&claiming_store).with_claiming(LEASE);
        let count = format!("SELECT count(*) FROM {table}_fx WHERE id = $1");
        let committed = |id: &str| -> i64 { pg().query_one(&count, &[&id]).unwrap().get(0) };
        // Mixed: a claiming run reported lease-lost may add a second row.
        let exact: Option<&dyn Fn(&str) -> i64> = if mixed { None } else { Some(&committed) };
        let deliver = |c: usize, id: &str, act: Act| {
            if mixed && c >= 2 {
                let (effect, kind) = ready(plain_delivery(&claiming, id, act, LEASE, sleep));
                if effect {
                    pg().execute(&insert, &[&id]).unwrap();
                }
                (effect, kind)
            } else {
                pg_tx_delivery(&tx_guards[c], &insert, id, act, c == 1)
            }
        };
        let inbox = fleet(mode, deliver, exact);
        let (ids, log) = (inbox.ids(), inbox.log());
        if mixed {
            for id in ids {
                let lost = log
                    .iter()
                    .filter(|d| &ids[d.id] == id && d.kind == Some(OutcomeKind::RanLeaseLost))
                    .count() as i64;
                let died = log
                    .iter()
                    .filter(|d| &ids[d.id] == id && d.effect && d.kind.is_none())
                    .count() as i64;
                assert!(
                    committed(id) >= 1 && committed(id) <= 1 + lost + died,
                    "{mode}: {id}"
                );
            }
        }
        // The transactional store's own rows: nothing left marked.
        let marks: i64 = pg()
            .query_one(
                &format!("SELECT count(*) FROM {table}_claims WHERE token LIKE 'tx:%'"),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(marks, 0, "{mode}: a transaction's mark outlived it");
    }
}

/// SQLite's transactional consumers (four connections to one file), with the
/// swallowing handler's `INSERT OR ROLLBACK`.
#[test]
fn transactional_fleet_on_sqlite_commits_each_effect_once() {
    let db = TempDb::new("txfleet");
    let guards: Vec<Guard<SqliteStore>> = (0..CONSUMERS)
        .map(|_| Guard::new(SqliteStore::open(db.path()).unwrap()))
        .collect();
    rusqlite::Connection::open(db.path())
        .unwrap()
        .execute_batch(
            "CREATE TABLE fx (id TEXT NOT NULL);
             CREATE TABLE once (id TEXT PRIMARY KEY); INSERT INTO once VALUES ('taken');",
        )
        .unwrap();
    let committed = |id: &str| -> i64 {
        rusqlite::Connection::open(db.path())
            .unwrap()
            .query_row("SELECT count(*) FROM fx WHERE id = ?1", [id], |r| r.get(0))
            .unwrap()
    };
    let deliver = |c: usize, id: &str, act: Act| {
        let outcome = guards[c].process_in_transaction(envelope(id).as_str(), |msg, tx| {
            tx.execute("INSERT INTO fx (id) VALUES (?1)", [msg.id().unwrap()])
                .map_err(|e| e.to_string())?;
            match act {
                Act::Fail => Err("declined".to_string()),
                Act::Panic => panic!("handler bug"),
                Act::Swallow => {
                    let _ = tx.execute("INSERT OR ROLLBACK INTO once VALUES ('taken')", []);
                    Ok(())
                }
                Act::Slow | Act::Succeed => Ok(()),
                // Gone mid-transaction: SQLite rolls it back.
                Act::Die => Err("the consumer died".to_string()),
            }
        });
        if act == Act::Die {
            return (false, None);
        }
        (outcome.kind() == OutcomeKind::Ran, Some(outcome.kind()))
    };
    fleet("transactional sqlite", deliver, Some(&committed));
}
