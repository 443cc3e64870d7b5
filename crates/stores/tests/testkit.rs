//! Every store of this crate passes the store testkit: random runs from
//! several clients (each its own connection), checked answer by answer against
//! the record model, with faults injected and clients crashing. SQLite runs on a
//! manual clock (a file, a connection per client); Redis (each dialect, and a
//! cluster) and PostgreSQL on their servers' own clocks, in short real ticks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::StoreResult;
use bq_dedupe::store::record::Rules;
use bq_dedupe::store::{ClaimToken, TransactionalStore, TxRun};
use bq_dedupe::{clock::Clock, clock::ManualClock};
use bq_dedupe_stores::{Dialect, PostgresStore, RedisStore, SqliteStore};
use bq_dedupe_testkit::{self as testkit, Harness, OnServer};
use common::*;

struct Sqlite {
    db: TempDb,
    clock: Arc<ManualClock>,
}

impl Harness for Sqlite {
    type Client = SqliteStore;
    fn rules(&self) -> Rules {
        SqliteStore::RULES
    }
    fn open(&mut self) -> SqliteStore {
        SqliteStore::open(self.db.path())
            .expect("open the test file")
            .with_clock(self.clock.clone())
    }
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
    fn advance(&mut self, ms: u64) {
        self.clock.advance(ms);
    }
    fn transactional(&self) -> bool {
        true
    }
    fn transact(
        &mut self,
        client: &SqliteStore,
        key: &str,
        ttl: Option<Duration>,
        _claim: Option<&ClaimToken>,
        ok: bool,
    ) -> StoreResult<TxRun<(), ()>> {
        client.transaction(Some(key), ttl, |tx| {
            tx.execute_batch(SQLITE_EFFECTS).expect("the effect table");
            tx.execute("INSERT INTO testkit_effects (key) VALUES (?1)", [key])
                .expect("the effect row");
            if ok { Ok(()) } else { Err(()) }
        })
    }
    fn effects(&mut self, key: &str) -> u64 {
        let conn = rusqlite::Connection::open(self.db.path()).unwrap();
        conn.execute_batch(SQLITE_EFFECTS).unwrap();
        let n: i64 = conn
            .query_row(
                "SELECT count(*) FROM testkit_effects WHERE key = ?1",
                [key],
                |r| r.get(0),
            )
            .unwrap();
        n as u64
    }
}

/// The transactional runs' effect rows (no unique key: a second write shows).
const SQLITE_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS testkit_effects (key TEXT NOT NULL);";

#[test]
fn sqlite_follows_the_record_model() {
    testkit::check(512, || Sqlite {
        db: TempDb::new("testkit"),
        clock: Arc::new(ManualClock::new(1_000_000)),
    });
}

/// The store `bq-dedupe` and the component's host open from a spec: every call
/// through `AnyStore`'s dispatch (so a method it failed to forward would fall
/// back to a default and be caught here), on every backend of the table with
/// a server, on its own clock.
#[test]
fn every_backend_from_a_spec_follows_the_record_model() {
    on_backends("testkit-any", on_a_server, |subject| {
        testkit::check(8, || {
            let fresh = subject.fresh("testkit-any");
            OnServer::new(fresh.rules(), fresh.opener()).with_cleanup(fresh)
        })
    });
}

/// A fresh-eyes review found the model answering a re-sent commit as ours after
/// its done record had expired (and not after a stranger's release in between):
/// the model now reads an expired record as free here too, and SQLite with it.
#[test]
fn sqlite_a_commit_sent_again_after_its_record_expired_is_not_ours() {
    use bq_dedupe_testkit::Op;
    for stranger in [false, true] {
        let mut run = vec![
            Op::Claim {
                client: 0,
                keys: vec![0],
                lease: 1,
            },
            Op::Commit {
                client: 0,
                key: 0,
                token: 0,
                ttl: Some(1),
            },
            Op::Advance { ticks: 1 },
        ];
        if stranger {
            run.push(Op::Release {
                client: 1,
                key: 0,
                token: 0,
            });
        }
        run.push(Op::Commit {
            client: 0,
            key: 0,
            token: 0,
            ttl: None,
        });
        let mut harness = Sqlite {
            db: TempDb::new("expired-recommit"),
            clock: Arc::new(ManualClock::new(1_000_000)),
        };
        testkit::check_ops(&mut harness, &run).unwrap();
    }
}

/// Time on a server's own clock: real ms since the harness began, in short
/// ticks, with a few ms of slack for the server's view of "now".
fn redis(dialect: Dialect) -> OnServer<RedisStore> {
    let (open, cleanup) = redis_backend("testkit", dialect);
    OnServer::new(RedisStore::rules(dialect), open).with_cleanup(cleanup)
}

#[test]
fn redis_follows_the_record_model_in_each_dialect() {
    for dialect in [Dialect::Native, Dialect::Php, Dialect::Go] {
        testkit::check(16, || redis(dialect));
    }
}

/// PostgreSQL on its own clock, with its transactional mode: each run's
/// effect rows in a table of their own.
fn postgres() -> OnServer<PostgresStore> {
    let backend = PgBackend::new("testkit");
    let insert = backend.insert();
    OnServer::new(PostgresStore::RULES, backend.opener())
        .with_transactions(
            move |store, key, ttl, ok| {
                store.transaction(Some(key), ttl, |tx| {
                    tx.execute(&insert, &[&key]).expect("the effect row");
                    if ok { Ok(()) } else { Err(()) }
                })
            },
            backend.counter(),
        )
        .with_cleanup(backend.cleanup)
}

#[test]
fn postgres_follows_the_record_model() {
    testkit::check(12, postgres);
}

/// Found by the testkit (BQ_TESTKIT_SEED=1796196674075783189): a transaction
/// over a claim that had lapsed recorded the id but left the claim's row in
/// `T_claims`, so the claim's owner then committed it as its own (`true`, so
/// `run-ok`): its effect ran a second time, unreported. The transaction now
/// ends the lapsed claim with the commit, as every other store's record does.
#[test]
fn postgres_a_transaction_over_a_lapsed_claim_ends_that_claim() {
    use bq_dedupe_testkit::Op;
    let run = vec![
        Op::Claim {
            client: 1,
            keys: vec![2],
            lease: 1,
        },
        Op::Advance { ticks: 1 },
        Op::Transact {
            client: 1,
            key: 2,
            claim: None,
            ttl: Some(1),
            ok: true,
        },
        Op::Commit {
            client: 1,
            key: 2,
            token: 1,
            ttl: Some(2),
        },
    ];
    testkit::check_ops(&mut postgres(), &run).unwrap();
}

/// Hole 6 of the store-contract issue (failed on 6ddd708 with
/// `run-ok-lease-lost`): a commit whose reply was lost and which the client
/// sent again (as the Redis client re-runs a pipeline after an I/O error) finds
/// the id done by its own token, and the delivery is `run-ok`.
fn a_resent_commit_is_run_ok<S: bq_dedupe::Store>(store: S) {
    use bq_dedupe::{Guard, OutcomeKind};
    use bq_dedupe_testkit::{Fault, Faulty};
    let store = Faulty::new(store);
    let guard = Guard::new(&store).with_claiming(Duration::from_secs(30));
    let outcome = ready(guard.process(&envelope(&unique("resent")), async |_| {
        store.arm(Fault::Resend); // the commit that follows is sent twice
        Ok::<(), String>(())
    }));
    assert!(!store.armed(), "the commit met the fault");
    assert_eq!(outcome.kind(), OutcomeKind::Ran, "{outcome:?}");
}

#[test]
fn a_resent_commit_is_run_ok_on_sqlite_and_redis() {
    let db = TempDb::new("resent");
    a_resent_commit_is_run_ok(SqliteStore::open(db.path()).unwrap());
    let url = redis_url();
    let prefix = redis_prefix("resent");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    a_resent_commit_is_run_ok(RedisStore::connect(&url, prefix).unwrap());
}

/// The transactional mode over a claim that lapsed: the transaction runs and
/// records the id, and the lapsed claim's owner can no longer renew or commit
/// it as its own (its effect would then run a second time unreported).
#[test]
fn sqlite_a_transaction_over_a_lapsed_claim_ends_that_claim() {
    use bq_dedupe_testkit::Op;
    let run = vec![
        Op::Claim {
            client: 0,
            keys: vec![0],
            lease: 1,
        },
        Op::Advance { ticks: 2 },
        Op::Transact {
            client: 1,
            key: 0,
            claim: None,
            ttl: None,
            ok: true,
        },
        Op::Renew {
            client: 0,
            key: 0,
            token: 0,
            lease: 5,
        },
        Op::Commit {
            client: 0,
            key: 0,
            token: 0,
            ttl: None,
        },
        Op::Transact {
            client: 2,
            key: 0,
            claim: None,
            ttl: None,
            ok: true,
        },
    ];
    let mut harness = Sqlite {
        db: TempDb::new("tx-lapsed"),
        clock: Arc::new(ManualClock::new(1_000_000)),
    };
    testkit::check_ops(&mut harness, &run).unwrap();
}
