//! The guard in the loop: four consumers (threads, each with its own store
//! connection) take deliveries from one shared inbox (30 ids, some delivered up
//! to three times), run `Guard` in each mode, and redeliver whatever the outcome
//! says to retry, until the inbox is empty. Handlers log every run outside the
//! store; some fail, some panic, some run past their lease, some (in the
//! transactional mode) swallow a failed statement and return `Ok`. Checked
//! after every run of the fleet:
//! - nothing lost: every id was acked, and acked only after a handler of it
//!   succeeded (in the transactional mode, its effect row is there);
//! - in the transactional mode, exactly one committed effect per id;
//! - in the claiming and transactional modes, and claiming beside
//!   transactional on one PostgreSQL table, at most one plain `run-ok` per id:
//!   every successful run beyond the first was reported (`run-ok-lease-lost`).
//!
//! Consumers also die: after their handler's effect and before the commit
//! (claiming: the claim is left to lapse; transactional: the transaction, its
//! PostgreSQL connection killed, rolls back), and are restarted knowing
//! nothing; the queue redelivers after its visibility timeout. A run repeated
//! after such a death is the window docs/modes.md names (a crash between the
//! effect and the commit runs once more), so it is allowed, once per death.
//!
//! (The seen-set mode's window, concurrent duplicates both running, is
//! documented, not checked; consumers killed mid-commit are also in
//! `exactly_once.rs`, as real processes.)

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bq_dedupe::{Disposition, Guard, OutcomeKind, Store};
use bq_dedupe_stores::{PostgresStore, RedisStore, SqliteStore};
use common::*;

const IDS: usize = 30;
const CONSUMERS: usize = 4;
const LEASE: Duration = Duration::from_millis(150);

/// What a handler does with one delivery (decided by the id and the attempt,
/// so every mode meets the same mix).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Act {
    Succeed,
    Fail,
    Panic,
    /// Sleeps past the claim's lease, then succeeds.
    Slow,
    /// Transactional: a failed statement, ignored, then `Ok`.
    Swallow,
    /// The consumer dies after the handler's effect, before the commit.
    Die,
}

fn act(id: usize, attempt: u32) -> Act {
    if attempt >= 3 {
        return Act::Succeed; // every id gets through in the end
    }
    match (id * 7 + attempt as usize * 13) % 10 {
        0 | 1 => Act::Fail,
        2 => Act::Panic,
        3 => Act::Slow,
        4 => Act::Swallow,
        5 => Act::Die,
        _ => Act::Succeed,
    }
}

/// One delivery's record: the id, whether its handler (or transaction) did
/// its effect, and the outcome (`None`: the consumer died first).
#[derive(Debug, Clone)]
struct Delivery {
    id: usize,
    effect: bool,
    kind: Option<OutcomeKind>,
}

/// Runs the fleet: `deliver(consumer, id, act)` processes one delivery and
/// answers (did the effect happen, the outcome). Answers every delivery made.
fn run_fleet(
    tag: &str,
    deliver: impl Fn(usize, &str, Act) -> (bool, Option<OutcomeKind>) + Sync,
) -> (Vec<String>, Vec<Delivery>) {
    let ids: Vec<String> = (0..IDS).map(|i| unique(&format!("{tag}-{i}"))).collect();
    let mut inbox: VecDeque<(usize, u32)> = VecDeque::new();
    for copies in 1..=3 {
        for id in 0..IDS {
            if id % 3 < copies {
                inbox.push_back((id, 0));
            }
        }
    }
    let inbox = Mutex::new(inbox);
    let log: Mutex<Vec<Delivery>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for consumer in 0..CONSUMERS {
            let (inbox, log, ids, deliver) = (&inbox, &log, &ids, &deliver);
            scope.spawn(move || {
                let mut idle = 0;
                while idle < 40 {
                    let Some((id, attempt)) = inbox.lock().unwrap().pop_front() else {
                        // Others may still put retries back.
                        idle += 1;
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    idle = 0;
                    let (effect, kind) = deliver(consumer, &ids[id], act(id, attempt));
                    log.lock().unwrap().push(Delivery { id, effect, kind });
                    let Some(kind) = kind else {
                        // Died: redelivered once the queue's visibility timeout
                        // (here, the lease) has passed.
                        std::thread::sleep(LEASE + Duration::from_millis(50));
                        inbox.lock().unwrap().push_back((id, attempt + 1));
                        continue;
                    };
                    match kind.disposition() {
                        Disposition::Ack => {}
                        Disposition::Retry => {
                            if kind == OutcomeKind::Parked {
                                std::thread::sleep(Duration::from_millis(30));
                            }
                            inbox.lock().unwrap().push_back((id, attempt + 1));
                        }
                        Disposition::Poison => panic!("{kind:?} for a valid envelope"),
                    }
                }
            });
        }
    });
    (ids, log.into_inner().unwrap())
}

/// The invariants (see the module docs); `committed(id)` counts the id's
/// committed effect rows where the mode has them.
fn check(mode: &str, ids: &[String], log: &[Delivery], committed: Option<&dyn Fn(&str) -> i64>) {
    let mut by_id: HashMap<usize, Vec<&Delivery>> = HashMap::new();
    for d in log {
        by_id.entry(d.id).or_default().push(d);
    }
    for (i, id) in ids.iter().enumerate() {
        let deliveries = by_id.get(&i).map(Vec::as_slice).unwrap_or(&[]);
        let acked = deliveries
            .iter()
            .any(|d| d.kind.map(|k| k.disposition()) == Some(Disposition::Ack));
        let effects = deliveries.iter().filter(|d| d.effect).count();
        assert!(acked, "{mode}: {id} never acked: {deliveries:?}");
        assert!(
            effects >= 1,
            "{mode}: {id} acked, never run: {deliveries:?}"
        );
        let plain = deliveries
            .iter()
            .filter(|d| d.effect && d.kind == Some(OutcomeKind::Ran))
            .count();
        let reported = deliveries
            .iter()
            .filter(|d| {
                d.effect
                    && matches!(
                        d.kind,
                        Some(OutcomeKind::RanLeaseLost | OutcomeKind::RanUnrecorded)
                    )
            })
            .count();
        let died = deliveries
            .iter()
            .filter(|d| d.effect && d.kind.is_none())
            .count();
        if mode != "seen-set" {
            assert!(
                plain <= 1,
                "{mode}: {id} ran {plain} times as plain run-ok: {deliveries:?}"
            );
            assert!(
                effects <= 1 + reported + died,
                "{mode}: {id}: {effects} effects, {reported} reported, {died} died after \
                 theirs: {deliveries:?}"
            );
        }
        if let Some(committed) = committed {
            assert_eq!(
                committed(id),
                1,
                "{mode}: {id}'s committed effects: {deliveries:?}"
            );
        }
    }
}

/// A claiming or seen-set consumer's delivery: the handler's effect is its
/// successful run.
fn plain_delivery<S: Store>(guard: &Guard<S>, id: &str, act: Act) -> (bool, Option<OutcomeKind>) {
    if act == Act::Die {
        // Decided (claimed, in the claiming mode), the handler's effect done,
        // then the consumer is gone: nothing is committed or released.
        let decision = ready(guard.decide(envelope(id).as_str()));
        return (decision.verdict == bq_dedupe::Verdict::Run, None);
    }
    let mut effect = false;
    let outcome = ready(guard.process(envelope(id).as_str(), async |_| {
        match act {
            Act::Fail => return Err("declined".to_string()),
            Act::Panic => panic!("handler bug"),
            Act::Slow => std::thread::sleep(LEASE + Duration::from_millis(100)),
            Act::Succeed | Act::Swallow => {}
            Act::Die => unreachable!("handled above"),
        }
        effect = true;
        Ok(())
    }));
    (effect, Some(outcome.kind()))
}

fn claiming_fleet<S: Store + Sync>(mode: &str, stores: &[S]) {
    let guards: Vec<Guard<&S>> = stores
        .iter()
        .map(|s| Guard::new(s).with_claiming(LEASE))
        .collect();
    let (ids, log) = run_fleet(mode, |c, id, act| plain_delivery(&guards[c], id, act));
    check(mode, &ids, &log, None);
}

#[test]
fn claiming_consumers_on_every_store_lose_nothing_and_report_every_second_run() {
    let db = TempDb::new("fleet");
    let sqlite: Vec<SqliteStore> = (0..CONSUMERS)
        .map(|_| SqliteStore::open(db.path()).unwrap())
        .collect();
    claiming_fleet("claiming sqlite", &sqlite);
    let url = redis_url().unwrap();
    let prefix = redis_prefix("fleet");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    let redis: Vec<RedisStore> = (0..CONSUMERS)
        .map(|_| RedisStore::connect(&url, prefix.clone()).unwrap())
        .collect();
    claiming_fleet("claiming redis", &redis);
    let table = postgres_table("fleet");
    let _pg = PgCleanup {
        url: postgres_url(),
        table: table.clone(),
    };
    let postgres: Vec<PostgresStore> = (0..CONSUMERS)
        .map(|_| PostgresStore::connect(&postgres_url(), &table).unwrap())
        .collect();
    claiming_fleet("claiming postgres", &postgres);
    let memory = bq_dedupe::InMemoryStore::new();
    claiming_fleet("claiming memory", &[&memory, &memory, &memory, &memory]);
}

#[test]
fn seen_set_consumers_lose_nothing() {
    let memory = bq_dedupe::InMemoryStore::new();
    let guards: Vec<Guard<&bq_dedupe::InMemoryStore>> =
        (0..CONSUMERS).map(|_| Guard::new(&memory)).collect();
    let (ids, log) = run_fleet("seen-set", |c, id, act| plain_delivery(&guards[c], id, act));
    check("seen-set", &ids, &log, None);
}

// ---- the transactional mode, alone and beside claiming consumers ----------------

/// A transactional consumer's delivery on PostgreSQL: the effect row is written
/// in the transaction.
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
        let (ids, log) = run_fleet(mode, |c, id, act| {
            if mixed && c >= 2 {
                let (effect, kind) = plain_delivery(&claiming, id, act);
                if effect {
                    pg().execute(&insert, &[&id]).unwrap();
                }
                (effect, kind)
            } else {
                pg_tx_delivery(&tx_guards[c], &insert, id, act, c == 1)
            }
        });
        let count = format!("SELECT count(*) FROM {table}_fx WHERE id = $1");
        let committed = |id: &str| -> i64 { pg().query_one(&count, &[&id]).unwrap().get(0) };
        // Mixed: a claiming run reported lease-lost may add a second row.
        let exact: Option<&dyn Fn(&str) -> i64> = if mixed { None } else { Some(&committed) };
        check(mode, &ids, &log, exact);
        if mixed {
            for id in &ids {
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
    let (ids, log) = run_fleet("transactional sqlite", |c, id, act| {
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
    });
    let committed = |id: &str| -> i64 {
        rusqlite::Connection::open(db.path())
            .unwrap()
            .query_row("SELECT count(*) FROM fx WHERE id = ?1", [id], |r| r.get(0))
            .unwrap()
    };
    check("transactional sqlite", &ids, &log, Some(&committed));
}
