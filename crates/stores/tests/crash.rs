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
    let server = Crashable::from_env();
    let _alone = server.alone();
    let up = || server.up();
    let table = postgres_table("tx-crash");
    let _clean = PgCleanup {
        url: server.url.clone(),
        table: table.clone(),
    };
    if hand_made {
        up().batch_execute(&format!(
            "CREATE TABLE {table} (message_id TEXT PRIMARY KEY, created_at TIMESTAMPTZ, \
             expires_at TIMESTAMPTZ)"
        ))
        .unwrap();
    }
    let guard = Guard::new(PostgresStore::connect(&server.url, &table).unwrap());
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
                server.run(&["stop"]);
            } else {
                server.kill_one(&mut bystander);
            }
            Ok::<(), postgres::Error>(())
        });
        assert_ne!(first.kind(), OutcomeKind::Ran, "{how}: {first:?}");
        if how == "stop" {
            server.run(&["start"]);
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

/// A handler ends the store's transaction with its own ROLLBACK, and the
/// server crashes before the store looks at what it did (an unrelated backend
/// killed, as the OOM killer does). Behind PgBouncer the store's session goes
/// on, on a new server session. PostgreSQL hands out again the ids of the
/// batch's (sub)transactions, whose writes never reached the disk, and other
/// transactions commit under them: asked for the status of its own id (a
/// batch with a delivery without an id) or of a take's writer, the store
/// heard "committed" and acked the deliveries before it, and the culprit,
/// unrun (a trial; directly, the store's session ends with the crash and the
/// batch fails whole). Each delivery said done now has its effect, and each
/// other has none. Tried until the ids are seen handed out again.
#[test]
fn postgres_a_batch_handler_rollback_before_a_crash_behind_pgbouncer_is_never_taken_for_a_commit() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    for without_id in [false, true] {
        let mut reused = 0;
        for attempt in 0..6 {
            reused += usize::from(rollback_then_crash(&server, without_id, attempt));
            if reused == 2 {
                break;
            }
        }
        assert!(
            reused > 0,
            "a delivery without an id: {without_id}: the batch's ids were never handed out again"
        );
    }
}

/// One try of the test above: whether the crashed batch's ids were handed
/// out again.
fn rollback_then_crash(server: &Crashable, without_id: bool, attempt: usize) -> bool {
    let (guard, table, _clean) = server.guard_with_effects(&server.via_bouncer(), "tx-crash-rb");
    let insert = format!("INSERT INTO {table}_effects (id) VALUES ($1)");
    let tag = format!("rb-{without_id}-{attempt}");
    let (first, no_id, culprit) = (format!("{tag}-a"), format!("{tag}-n"), format!("{tag}-b"));
    let mut bodies = vec![envelope(&first)];
    bodies.extend(without_id.then(|| no_id_envelope(&no_id)));
    bodies.push(envelope(&culprit));
    let (mut crashed, mut reused) = (false, false);
    let mut bystander = server.up();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        let this = msg.id().unwrap_or(&no_id);
        tx.execute(&insert, &[&this])?;
        if this != culprit || crashed {
            return Ok(());
        }
        crashed = true;
        let xid: i64 = tx.query_one("SELECT txid_current()", &[])?.get(0);
        tx.batch_execute("ROLLBACK")?;
        server.kill_one(&mut bystander);
        reused = server.will_hand_out_again(xid);
        // Other transactions commit under the batch's ids.
        server.commit_twenty();
        server.wait_for(tx);
        Ok::<(), postgres::Error>(())
    });
    let ids = [first.as_str()]
        .into_iter()
        .chain(without_id.then_some(no_id.as_str()));
    for (outcome, id) in outcomes.iter().zip(ids.chain([culprit.as_str()])) {
        let done = matches!(outcome.kind(), OutcomeKind::Ran | OutcomeKind::FailOpen);
        assert_eq!(
            server.effects(&table, id),
            i64::from(done),
            "{tag} (ids handed out again: {reused}): {id} is {outcome:?}: {outcomes:?}"
        );
    }
    if reused {
        // Not a batch failed whole: the store saw the handler's ROLLBACK.
        let said = format!("{:?}", outcomes.last());
        assert!(said.contains("transaction itself"), "{tag}: {outcomes:?}");
    }
    reused
}

/// The same for a single delivery without an id behind PgBouncer: its
/// transaction's status, asked on the server session the pooler gave after
/// the crash, said "committed" (another transaction's, under the reused id),
/// or the store's own query, the first after the crash, was given the
/// transaction's id again and the store took itself to be still in its
/// transaction; either way the delivery was acked, its effect rolled back (a
/// trial; a review).
#[test]
fn postgres_a_rollback_without_an_id_before_a_crash_behind_pgbouncer_is_never_taken_for_a_commit() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    let (guard, table, _clean) = server.guard_with_effects(&server.via_bouncer(), "tx-crash-rb1");
    let insert = format!("INSERT INTO {table}_effects (id) VALUES ($1)");
    // Reused ids seen: with other transactions committing under them first,
    // and with the store's own query the first after the crash.
    let mut reused = [0, 0];
    for attempt in 0..10 {
        let others_first = attempt % 2 == 0;
        let tag = format!("rb1-{attempt}");
        let mut bystander = server.up();
        let mut handed_out = false;
        let outcome = guard.process_in_transaction(&no_id_envelope(&tag), |_, tx| {
            tx.execute(&insert, &[&tag])?;
            let xid: i64 = tx.query_one("SELECT txid_current()", &[])?.get(0);
            tx.batch_execute("ROLLBACK")?;
            server.kill_one(&mut bystander);
            handed_out = server.will_hand_out_again(xid);
            if others_first {
                server.commit_twenty();
            }
            server.wait_for(tx);
            Ok::<(), postgres::Error>(())
        });
        let effects = server.effects(&table, &tag);
        let done = outcome.kind() == OutcomeKind::FailOpen;
        assert_eq!(
            effects,
            i64::from(done),
            "{tag} (handed out again: {handed_out}): {outcome:?}"
        );
        if handed_out {
            let said = format!("{outcome:?}");
            assert!(said.contains("transaction itself"), "{tag}: {outcome:?}");
            reused[usize::from(!others_first)] += 1;
        }
        if reused.iter().all(|n| *n > 0) {
            break;
        }
    }
    assert!(
        reused.iter().all(|n| *n > 0),
        "ids handed out again: {reused:?}"
    );
}

/// A handler commits the store's transaction itself, asynchronously (`SET
/// LOCAL synchronous_commit = off; COMMIT`), in a batch of deliveries without
/// an id and in a single one: the store, reading the transaction committed,
/// said every delivery done, though nothing it ran after wrote to flush that
/// commit, and a crash just after lost them all (a trial: 4 of 4, the WAL
/// writer here waiting 10 s). Each delivery said done keeps its effect.
#[test]
fn postgres_a_handlers_asynchronous_commit_is_flushed_before_its_deliveries_are_said_done() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    let (guard, table, _clean) = server.guard_with_effects(&server.via_bouncer(), "tx-crash-async");
    let insert = format!("INSERT INTO {table}_effects (id) VALUES ($1)");
    for size in [3, 1] {
        let tags: Vec<String> = (0..size).map(|i| format!("async-{size}-{i}")).collect();
        let bodies: Vec<String> = tags.iter().map(|t| no_id_envelope(t)).collect();
        let commit = "SET LOCAL synchronous_commit = off; COMMIT";
        let outcomes = match size {
            1 => vec![guard.process_in_transaction(&bodies[0], |_, tx| {
                tx.execute(&insert, &[&tags[0]])?;
                tx.batch_execute(commit)
            })],
            _ => {
                let mut n = 0;
                guard.process_batch_in_transaction(&bodies, |_, tx| {
                    tx.execute(&insert, &[&tags[n]])?;
                    n += 1;
                    match n == size {
                        true => tx.batch_execute(commit),
                        false => Ok(()),
                    }
                })
            }
        };
        server.kill_one(&mut server.up());
        for (outcome, tag) in outcomes.iter().zip(&tags) {
            let done = outcome.kind() == OutcomeKind::FailOpen;
            assert_eq!(
                server.effects(&table, tag),
                i64::from(done),
                "{tag}: {outcomes:?}"
            );
        }
        assert!(
            outcomes.iter().any(|o| o.kind() == OutcomeKind::FailOpen),
            "the handler's COMMIT committed the batch: {outcomes:?}"
        );
    }
}

/// A handler commits the store's transaction itself and the server goes
/// down before the store can undo the take that COMMIT kept: the undo is kept
/// and tried again before the store's next run, where the docs say a
/// redelivery to the same process runs. Its one try took an idle connection of
/// the pool that the restart had ended, failed, and the redelivery was
/// skipped; a later run's try landed, and a later copy of the id ran: its
/// effect twice, after a skip (a trial, about half the tries). A redelivery
/// while the server is still down is retried.
#[test]
fn postgres_an_undo_kept_over_a_restart_lands_before_the_redelivery() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    let (guard, _table, _clean) = server.guard(&server.url, "tx-crash-kept");
    for attempt in 0..3 {
        let id = format!("kept-{attempt}");
        // Connections in the pool, idle: the restart ends them.
        std::thread::scope(|s| {
            for n in 0..3 {
                let (guard, body) = (&guard, envelope(&format!("{id}-warm-{n}")));
                s.spawn(move || {
                    guard.process_in_transaction(body.as_str(), |_, _| {
                        std::thread::sleep(Duration::from_millis(100));
                        Ok::<(), postgres::Error>(())
                    })
                });
            }
        });
        let first = guard.process_in_transaction(envelope(&id).as_str(), |_, tx| {
            tx.batch_execute("COMMIT")?;
            server.run(&["stop"]);
            Ok::<(), postgres::Error>(())
        });
        let said = format!("{first:?}");
        assert!(said.contains("may have kept failed"), "{id}: {said}");
        // A redelivery while the server is still down: retried, never
        // skipped (the pool waited, the server came back, the take it found
        // skipped the id, and the undo landed after: a review).
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                server.run(&["start"]);
            });
            let early = guard.process_in_transaction(envelope(&id).as_str(), |_, _| {
                Ok::<(), postgres::Error>(())
            });
            assert_ne!(
                early.kind(),
                OutcomeKind::Skipped,
                "{id}: while down: {early:?}"
            );
        });
        let again = guard
            .process_in_transaction(envelope(&id).as_str(), |_, _| Ok::<(), postgres::Error>(()));
        assert_eq!(
            again.kind(),
            OutcomeKind::Ran,
            "{id}: the redelivery: {again:?}"
        );
    }
}

/// A batch delivery's handler commits the store's transaction itself, then
/// the server crashes and ends the store's session: the store undid the
/// take that COMMIT kept, but said only "connection closed", though what the
/// deliveries wrote up to that COMMIT stays and their redeliveries write it
/// again (a trial). Their failure now says so.
#[test]
fn postgres_a_batch_whose_handler_commits_before_a_crash_says_what_its_commit_kept() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    let (guard, _table, _clean) = server.guard(&server.url, "tx-crash-cm");
    let bodies = [envelope("cm-a"), envelope("cm-b")];
    let mut bystander = server.up();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        if msg.id() == Some("cm-b") {
            tx.batch_execute("COMMIT")?;
            server.kill_one(&mut bystander);
            drop(server.up());
        }
        Ok::<(), postgres::Error>(())
    });
    for outcome in &outcomes {
        let said = format!("{outcome:?}");
        assert_eq!(outcome.kind(), OutcomeKind::StoreUnavailable, "{said}");
        assert!(said.contains("its own COMMIT"), "{said}");
    }
}

/// A batch of deliveries without an id behind PgBouncer: the last one's
/// handler commits the store's transaction itself and the server crashes
/// before it returns. Whether that COMMIT held cannot be told (no take, and
/// no session begun before it), and the deliveries before it were run again
/// alone and said done: their effects twice, unsaid (a trial, h88 F2). Each
/// delivery said done has its effect once; one failed says its writes may be
/// committed.
#[test]
fn postgres_a_batch_without_ids_whose_commit_cannot_be_told_runs_nothing_twice_unsaid() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    batch_without_ids_commit_then_crash(&server, &server.via_bouncer());
    batch_without_ids_commit_then_crash(&server, &server.url);
}

fn batch_without_ids_commit_then_crash(server: &Crashable, url: &str) {
    let (guard, table, _clean) = server.guard_with_effects(url, "tx-crash-nid");
    let insert = format!("INSERT INTO {table}_effects (id) VALUES ($1)");
    let tags = ["nid-a", "nid-b", "nid-c"];
    let bodies: Vec<String> = tags.iter().map(|t| no_id_envelope(t)).collect();
    let mut bystander = server.up();
    let outcomes = guard.process_batch_in_transaction(&bodies, |msg, tx| {
        tx.execute(&insert, &[&msg.trace_id()])?;
        if msg.trace_id() == "nid-c" {
            tx.batch_execute("COMMIT")?;
            server.kill_one(&mut bystander);
            server.wait_for(tx);
        }
        Ok::<(), postgres::Error>(())
    });
    for (outcome, tag) in outcomes.iter().zip(tags) {
        let (effects, said) = (server.effects(&table, tag), format!("{outcome:?}"));
        match outcome.kind() {
            OutcomeKind::FailOpen => assert_eq!(effects, 1, "{tag}: {outcomes:?}"),
            _ => assert!(said.contains("may be committed"), "{tag}: {outcomes:?}"),
        }
    }
}

/// A delivery without an id whose handler commits the store's transaction
/// itself, and the server crashes before it returns: the run was a bare
/// "connection closed", though its effect was committed and its retry writes
/// it again (a trial, h88 F3). It says its writes may be committed.
#[test]
fn postgres_a_single_run_without_an_id_lost_after_its_own_commit_says_so() {
    let server = Crashable::from_env();
    let _alone = server.alone();
    let (guard, table, _clean) = server.guard_with_effects(&server.url, "tx-crash-nid1");
    let insert = format!("INSERT INTO {table}_effects (id) VALUES ($1)");
    // Its handler returning Ok, or the error of its next statement (it was
    // that error alone, read as "rolled back": a review).
    for fails_after in [false, true] {
        let tag = format!("nid1-{fails_after}");
        let mut bystander = server.up();
        let outcome = guard.process_in_transaction(&no_id_envelope(&tag), |_, tx| {
            tx.execute(&insert, &[&tag])?;
            tx.batch_execute("COMMIT")?;
            server.kill_one(&mut bystander);
            if fails_after {
                tx.execute(&insert, &[&"after"])?;
            }
            Ok::<(), postgres::Error>(())
        });
        assert_eq!(server.effects(&table, &tag), 1, "{outcome:?}");
        let said = format!("{outcome:?}");
        assert_ne!(outcome.kind(), OutcomeKind::FailOpen, "{said}");
        assert!(said.contains("may be committed"), "{tag}: {said}");
    }
}

/// The second cluster of scripts/with-postgres.sh, which these tests crash.
struct Crashable {
    url: String,
    /// PgBouncer in transaction mode in front of it.
    bouncer: String,
    /// scripts/with-postgres.sh's crash.sh: `stop`, `start`, `kill PID`.
    crash: String,
}

impl Crashable {
    fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} is not set: run the tests through scripts/with-postgres.sh")
            })
        };
        Crashable {
            url: var("BQ_TEST_POSTGRES_CRASHABLE_URL"),
            bouncer: var("BQ_TEST_PGBOUNCER_CRASHABLE_URL"),
            crash: var("BQ_TEST_POSTGRES_CRASH"),
        }
    }

    /// The store's URL through PgBouncer (no statement cache, the timeouts
    /// left to the server, as the docs say for it).
    fn via_bouncer(&self) -> String {
        format!(
            "{}?statement_cache=off&lock_timeout=server&statement_timeout=server",
            self.bouncer
        )
    }

    /// A store at `url` on a table of its own: the guard, the table, its
    /// cleanup.
    fn guard(&self, url: &str, tag: &str) -> (Guard<PostgresStore>, String, PgCleanup) {
        let table = postgres_table(tag);
        let clean = PgCleanup {
            url: self.url.clone(),
            table: table.clone(),
        };
        let store = PostgresStore::connect(url, &table).unwrap();
        (Guard::new(store), table, clean)
    }

    /// [`Self::guard`], and `TABLE_effects` beside its table
    /// for the handlers' writes.
    fn guard_with_effects(
        &self,
        url: &str,
        tag: &str,
    ) -> (Guard<PostgresStore>, String, PgCleanup) {
        let (guard, table, clean) = self.guard(url, tag);
        let create = format!("CREATE TABLE {table}_effects (id TEXT NOT NULL)");
        self.up().batch_execute(&create).unwrap();
        (guard, table, clean)
    }

    /// How many times `id`'s effect is in `table`'s effects.
    fn effects(&self, table: &str, id: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}_effects WHERE id = $1");
        self.up().query_one(&sql, &[&id]).unwrap().get(0)
    }

    /// Held while a test crashes the server: the tests of this binary run
    /// side by side, and one's crash ended the other's sessions (a review).
    fn alone(&self) -> std::sync::MutexGuard<'static, ()> {
        static CRASHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        CRASHING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn run(&self, args: &[&str]) {
        let done = Command::new(&self.crash).args(args).status().unwrap();
        assert!(done.success(), "crash.sh {args:?}");
    }

    /// A session of its own, once the server takes them (30 s at most).
    fn up(&self) -> postgres::Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match postgres::Client::connect(&self.url, postgres::NoTls) {
                Ok(client) => return client,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("the crashable server is not back: {e}"),
            }
        }
    }

    /// Kills `bystander`'s backend, as the OOM killer does, and returns once
    /// the reset that follows has ended every session (one of its own seen
    /// ended: the store's COMMIT raced it, flaky).
    fn kill_one(&self, bystander: &mut postgres::Client) {
        let mut watch = self.up();
        let pid: i32 = bystander
            .query_one("SELECT pg_backend_pid()", &[])
            .unwrap()
            .get(0);
        self.run(&["kill", &pid.to_string()]);
        // The reset comes when the server has seen its backend die.
        let deadline = Instant::now() + Duration::from_secs(10);
        while watch.batch_execute("SELECT 1").is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the server will hand out `xid` again (its next id is not past
    /// it, after a crash that lost the WAL of `xid`'s writes).
    fn will_hand_out_again(&self, xid: i64) -> bool {
        let sql = "SELECT txid_snapshot_xmax(txid_current_snapshot())";
        let next: i64 = self.up().query_one(sql, &[]).unwrap().get(0);
        next <= xid
    }

    /// Commits twenty transactions, each given an id.
    fn commit_twenty(&self) {
        let mut client = self.up();
        for _ in 0..20 {
            client.query_one("SELECT txid_current()", &[]).unwrap();
        }
    }

    /// Returns once `session` answers again (behind PgBouncer, on a new
    /// server session), or at once if it is gone (10 s at most).
    fn wait_for(&self, session: &mut impl postgres::GenericClient) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = session.batch_execute("SELECT 1") {
            if e.is_closed() || Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
