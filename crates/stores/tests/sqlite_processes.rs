//! The history checker on SQLite with every client in a process of its own,
//! all on one file: the locks between them are the operating system's file
//! locks, not one process's. Each client is this test binary started again
//! (`serve_a_sqlite_store_to_the_parent`, which only serves when the parent
//! names the file), answering the parent's store calls over its stdin and
//! stdout as JSON lines; the parent records and checks the history.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bq_dedupe::store::wire::{self, ms};
use bq_dedupe::store::{Claim, Peeked, Settled, Settlement, TransactionalStore, TxRun};
use bq_dedupe::{Store, StoreError, StoreResult, block_on_ready, store::Capabilities};
use bq_dedupe_stores::SqliteStore;
use bq_dedupe_testkit::{self as testkit, Fleet};
use common::TempDb;
use serde_json::{Value, json};

/// The environment variable that makes this binary a child serving `SQLITE_FILE`.
const SERVE: &str = "BQ_SQLITE_SERVE_FILE";
/// What begins every reply (the test harness prints lines of its own).
const REPLY: &str = "bq-reply ";

const EFFECTS: &str = "CREATE TABLE IF NOT EXISTS testkit_effects (key TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS testkit_once (id TEXT PRIMARY KEY);
    INSERT OR IGNORE INTO testkit_once VALUES ('taken');";

#[test]
fn sqlite_histories_are_linearizable_across_processes() {
    testkit::check_histories(6, || {
        let db = Arc::new(TempDb::new("processes"));
        rusqlite::Connection::open(db.path())
            .unwrap()
            .execute_batch(EFFECTS)
            .unwrap();
        let (path, count) = (db.path().to_path_buf(), db.clone());
        Fleet::new(SqliteStore::RULES, move || Proxy::start(&path))
            .with_transactions(
                |proxy, key, ttl, ok| proxy.transact(key, ttl, ok),
                move |key| {
                    let conn = rusqlite::Connection::open(count.path()).unwrap();
                    conn.query_row(
                        "SELECT count(*) FROM testkit_effects WHERE key = ?1",
                        [key],
                        |r| r.get::<_, i64>(0),
                    )
                    .unwrap() as u64
                },
            )
            .with_cleanup(db)
    });
}

/// A store in a child process.
struct Proxy {
    child: Child,
    pipe: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
}

impl Proxy {
    fn start(path: &std::path::Path) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "serve_a_sqlite_store_to_the_parent",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(SERVE, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a child process");
        let pipe = (
            child.stdin.take().unwrap(),
            BufReader::new(child.stdout.take().unwrap()),
        );
        Proxy {
            child,
            pipe: Mutex::new(pipe),
        }
    }

    /// One call to the child (`args` one of `store::wire`'s shapes): its
    /// answer, or its error.
    fn call(&self, op: &str, args: Value) -> StoreResult<Value> {
        let mut pipe = self.pipe.lock().unwrap();
        let (stdin, stdout) = &mut *pipe;
        writeln!(stdin, "{}", json!({ "op": op, "args": args })).expect("write to the child");
        let mut line = String::new();
        loop {
            line.clear();
            if stdout.read_line(&mut line).expect("read the child") == 0 {
                panic!("the child process ended");
            }
            // The harness may have begun the line ("test ... "): the reply is
            // what follows the marker.
            if let Some(at) = line.find(REPLY) {
                let reply = &line[at + REPLY.len()..];
                let mut reply: Value = serde_json::from_str(reply).expect("a JSON reply");
                return match reply.get_mut("error") {
                    Some(e) => Err(serde_json::from_value(e.take()).expect("a store error")),
                    None => Ok(reply["ok"].take()),
                };
            }
        }
    }

    fn transact(&self, key: &str, ttl: Option<Duration>, ok: bool) -> StoreResult<TxRun<(), ()>> {
        let key = key.to_string();
        let run = self.call(
            "transact",
            json!(wire::Transact {
                key,
                ttl_ms: ttl.map(ms),
                claim: None,
                ok
            }),
        )?;
        let run: wire::Run = serde_json::from_value(run).expect("a run");
        Ok(run.into())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A batch call's keys, as the child reads them.
fn keys(keys: &[&str], ttl: Option<Duration>, lease: Option<Duration>) -> Value {
    json!(wire::Keys {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        ttl_ms: ttl.map(ms),
        lease_ms: lease.map(ms),
    })
}

impl Store for Proxy {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let seen = self.call("seen", self::keys(keys, None, None))?;
        Ok(serde_json::from_value(seen).expect("booleans"))
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.call("remember", self::keys(keys, ttl, None)).map(drop)
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.call("forget", keys(&[key], None, None)).map(drop)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let peeks = self.call("peek", self::keys(keys, None, None))?;
        Ok(serde_json::from_value(peeks).expect("peeks"))
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let claims = self.call("claim", self::keys(keys, None, Some(lease)))?;
        Ok(serde_json::from_value(claims).expect("claims"))
    }
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let settled = self.call("settle", json!(wire::Step::from(step)))?;
        let settled: wire::Settled = serde_json::from_value(settled).expect("settled");
        settled.answering(step)
    }
}

/// Not a test of its own: the child side of the test above. Without the
/// parent's file it has nothing to serve and returns at once.
#[test]
fn serve_a_sqlite_store_to_the_parent() {
    let Some(path) = std::env::var_os(SERVE) else {
        return;
    };
    let store = SqliteStore::open(std::path::Path::new(&path)).expect("open the parent's file");
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let request: Value = serde_json::from_str(&line.expect("a request")).expect("JSON");
        let reply = match answer(&store, request["op"].as_str(), request["args"].clone()) {
            Ok(ok) => json!({ "ok": ok }),
            Err(e) => json!({ "error": e }),
        };
        let mut out = stdout.lock();
        writeln!(out, "{REPLY}{reply}").unwrap();
        out.flush().unwrap();
    }
}

/// A SQLite call's result: it never waits on anything but the file.
fn wait<T>(f: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
    block_on_ready(f).expect("SQLite answers synchronously")
}

/// The child's answer to one request.
fn answer(store: &SqliteStore, op: Option<&str>, args: Value) -> StoreResult<Value> {
    let keys = || serde_json::from_value::<wire::Keys>(args.clone()).expect("keys");
    let dur = |ms: Option<u64>| ms.map(Duration::from_millis);
    Ok(match op.unwrap_or_default() {
        "seen" => json!(wait(store.seen_many(&keys().refs()))?),
        "remember" => {
            let keys = keys();
            json!(wait(store.remember_many(&keys.refs(), dur(keys.ttl_ms)))?)
        }
        "forget" => json!(wait(store.forget(&keys().keys[0]))?),
        "peek" => json!(wait(store.peek_many(&keys().refs()))?),
        "claim" => {
            let keys = keys();
            let lease = dur(keys.lease_ms).unwrap_or_default();
            json!(wait(store.claim_many(&keys.refs(), lease))?)
        }
        "settle" => {
            let step: wire::Step = serde_json::from_value(args).expect("a step");
            let settled = wait(step.apply(store, Duration::ZERO))?;
            json!(wire::Settled::from(settled))
        }
        "transact" => {
            let tx: wire::Transact = serde_json::from_value(args).expect("a transaction");
            let (key, ok) = (tx.key.as_str(), tx.ok);
            let run = store.transaction(Some(key), dur(tx.ttl_ms), |tx| {
                tx.execute("INSERT INTO testkit_effects (key) VALUES (?1)", [key])
                    .expect("the effect row");
                if ok {
                    return Ok(());
                }
                // Every other failing work swallows a rollback, as in histories.rs.
                static FAILED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                if FAILED
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    .is_multiple_of(2)
                {
                    let _ = tx.execute("INSERT OR ROLLBACK INTO testkit_once VALUES ('taken')", []);
                    return Ok(());
                }
                Err(())
            })?;
            json!(wire::Run::from(run))
        }
        other => return Err(StoreError::internal(format!("unknown op {other:?}"))),
    })
}
