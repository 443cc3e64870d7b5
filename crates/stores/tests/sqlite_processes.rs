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

use bq_dedupe::store::{Claim, ClaimToken, Peeked, Settled, Settlement, TransactionalStore, TxRun};
use bq_dedupe::testkit::{self, Fleet};
use bq_dedupe::{Capabilities, Store, StoreError, StoreResult, block_on_ready};
use bq_dedupe_stores::SqliteStore;
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

    /// One call to the child: its answer, or its error.
    fn call(&self, request: Value) -> StoreResult<Value> {
        let mut pipe = self.pipe.lock().unwrap();
        let (stdin, stdout) = &mut *pipe;
        writeln!(stdin, "{request}").expect("write to the child");
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
                let reply: Value = serde_json::from_str(reply).expect("a JSON reply");
                return match reply.get("error") {
                    Some(e) => Err(StoreError::internal(e.as_str().unwrap_or_default())),
                    None => Ok(reply["ok"].clone()),
                };
            }
        }
    }

    fn transact(&self, key: &str, ttl: Option<Duration>, ok: bool) -> StoreResult<TxRun<(), ()>> {
        let run = self.call(json!({"op": "transact", "key": key, "ttl": ms(ttl), "ok": ok}))?;
        Ok(match run.as_str() {
            Some("committed") => TxRun::Committed(()),
            Some("already-done") => TxRun::AlreadyDone,
            Some("held") => TxRun::Held,
            Some("rolled-back") => TxRun::RolledBack(()),
            _ => TxRun::Aborted(StoreError::internal(run.to_string())),
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ms(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_millis() as u64)
}

fn bools(v: Value) -> Vec<bool> {
    serde_json::from_value(v).expect("booleans")
}

impl Store for Proxy {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.call(json!({"op": "seen", "keys": keys})).map(bools)
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.call(json!({"op": "remember", "keys": keys, "ttl": ms(ttl)}))
            .map(drop)
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.call(json!({"op": "forget", "key": key})).map(drop)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: true,
            ttl: true,
            lease: true,
        }
    }
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let peeks = self.call(json!({"op": "peek", "keys": keys}))?;
        let peeks: Vec<Value> = serde_json::from_value(peeks).expect("peeks");
        Ok(peeks
            .into_iter()
            .map(|p| match p.get("left") {
                None => Peeked::Done,
                Some(left) => Peeked::NotDone {
                    claim_ends_in: left.as_u64().map(Duration::from_millis),
                },
            })
            .collect())
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let lease = lease.as_millis() as u64;
        let claims = self.call(json!({"op": "claim", "keys": keys, "lease": lease}))?;
        let claims: Vec<String> = serde_json::from_value(claims).expect("claims");
        Ok(claims
            .into_iter()
            .map(|c| match c.as_str() {
                "seen" => Claim::Seen,
                "held" => Claim::Held,
                token => Claim::Acquired(ClaimToken(token.to_string())),
            })
            .collect())
    }
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let pairs = |v: &[(&str, &ClaimToken)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, t)| (k.to_string(), t.0.clone()))
                .collect()
        };
        let remember: Vec<(&str, Option<&str>)> = step
            .remember
            .iter()
            .map(|(k, t)| (*k, t.map(|t| t.0.as_str())))
            .collect();
        let settled = self.call(json!({
            "op": "settle",
            "remember": remember,
            "ttl": ms(step.ttl),
            "release": pairs(step.release),
            "renew": pairs(step.renew),
            "lease": step.lease.as_millis() as u64,
        }))?;
        Ok(Settled {
            kept: bools(settled["kept"].clone()),
            renewed: bools(settled["renewed"].clone()),
            release_error: settled["release_error"].as_str().map(StoreError::internal),
        })
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
        let reply = match answer(&store, &request) {
            Ok(ok) => json!({ "ok": ok }),
            Err(e) => json!({ "error": e.to_string() }),
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
fn answer(store: &SqliteStore, r: &Value) -> StoreResult<Value> {
    let keys: Vec<String> = serde_json::from_value(r["keys"].clone()).unwrap_or_default();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let key = r["key"].as_str().unwrap_or_default();
    let dur = |v: &Value| v.as_u64().map(Duration::from_millis);
    Ok(match r["op"].as_str().unwrap_or_default() {
        "seen" => json!(wait(store.seen_many(&keys))?),
        "remember" => json!(wait(store.remember_many(&keys, dur(&r["ttl"])))?),
        "forget" => json!(wait(store.forget(key))?),
        "peek" => {
            let peeks = wait(store.peek_many(&keys))?;
            json!(
                peeks
                    .into_iter()
                    .map(|p| match p {
                        Peeked::Done => json!("done"),
                        Peeked::NotDone { claim_ends_in } => {
                            json!({ "left": claim_ends_in.map(|d| d.as_millis() as u64) })
                        }
                    })
                    .collect::<Vec<_>>()
            )
        }
        "claim" => {
            let lease = dur(&r["lease"]).unwrap_or_default();
            let claims = wait(store.claim_many(&keys, lease))?;
            json!(
                claims
                    .into_iter()
                    .map(|c| match c {
                        Claim::Seen => "seen".to_string(),
                        Claim::Held => "held".to_string(),
                        Claim::Acquired(token) => token.0,
                    })
                    .collect::<Vec<_>>()
            )
        }
        "settle" => {
            let tokens = |v: &Value| -> Vec<(String, Option<ClaimToken>)> {
                serde_json::from_value::<Vec<(String, Option<String>)>>(v.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, t)| (k, t.map(ClaimToken)))
                    .collect()
            };
            let (remember, release, renew) = (
                tokens(&r["remember"]),
                tokens(&r["release"]),
                tokens(&r["renew"]),
            );
            let remember: Vec<(&str, Option<&ClaimToken>)> = remember
                .iter()
                .map(|(k, t)| (k.as_str(), t.as_ref()))
                .collect();
            let owned = |v: &[(String, Option<ClaimToken>)]| -> Vec<(String, ClaimToken)> {
                v.iter()
                    .map(|(k, t)| (k.clone(), t.clone().unwrap_or(ClaimToken(String::new()))))
                    .collect()
            };
            let (release, renew) = (owned(&release), owned(&renew));
            let release: Vec<(&str, &ClaimToken)> =
                release.iter().map(|(k, t)| (k.as_str(), t)).collect();
            let renew: Vec<(&str, &ClaimToken)> =
                renew.iter().map(|(k, t)| (k.as_str(), t)).collect();
            let step = Settlement {
                remember: &remember,
                ttl: dur(&r["ttl"]),
                release: &release,
                renew: &renew,
                lease: dur(&r["lease"]).unwrap_or_default(),
            };
            let settled = wait(store.settle(&step))?;
            json!({
                "kept": settled.kept,
                "renewed": settled.renewed,
                "release_error": settled.release_error.map(|e| e.to_string()),
            })
        }
        "transact" => {
            let ok = r["ok"].as_bool().unwrap_or(false);
            let run = store.transaction(Some(key), dur(&r["ttl"]), |tx| {
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
            json!(match run {
                TxRun::Committed(()) => "committed".to_string(),
                TxRun::AlreadyDone => "already-done".to_string(),
                TxRun::Held => "held".to_string(),
                TxRun::RolledBack(()) => "rolled-back".to_string(),
                TxRun::Aborted(e) => e.to_string(),
            })
        }
        other => return Err(StoreError::internal(format!("unknown op {other:?}"))),
    })
}
