//! The `DedupeShard` Durable Object: one shard of the seen-set, on SQLite.

use std::cell::Cell;

use serde::Deserialize;
use worker::{
    DurableObject, Env, Request, Response, Result, ScheduledTime, SqlStorage, SqlStorageValue,
    State, durable_object,
};

use super::protocol::{ClaimReply, Entry, Release, ShardReply, ShardRequest};

/// `token` NULL: remembered (done); otherwise an in-flight claim owned by that
/// token. `expires_at` NULL: never expires. Rows past `expires_at` count as absent
/// (reads check it themselves; the alarm only reclaims space).
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS ids (
    key TEXT PRIMARY KEY NOT NULL,
    token TEXT,
    expires_at INTEGER
) WITHOUT ROWID";

/// One shard of the seen-set. Bind it with `new_sqlite_classes` (see the README).
#[durable_object]
pub struct DedupeShard {
    state: State,
    sql: SqlStorage,
    schema_ready: Cell<bool>,
    /// The sweep alarm this instance knows is set (absolute ms).
    alarm_at: Cell<Option<i64>>,
}

#[derive(Deserialize)]
struct Row {
    token: Option<String>,
    expires_at: Option<i64>,
}

#[derive(Deserialize)]
struct EntryRow {
    key: String,
    token: Option<String>,
    expires_at: Option<i64>,
}

impl DurableObject for DedupeShard {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        DedupeShard {
            state,
            sql,
            schema_ready: Cell::new(false),
            alarm_at: Cell::new(None),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let request: ShardRequest = match req.json().await {
            Ok(request) => request,
            Err(e) => return Response::error(format!("dedupe shard: bad request: {e}"), 400),
        };
        // Applied without an await in between: no other request interleaves, so a
        // batch's check-and-claim is atomic.
        match self.apply(request, now_ms()) {
            Ok((reply, expiry)) => {
                // The writes are done; a sweep that cannot be scheduled only delays
                // reclaiming space (reads check expiry themselves), so it must not
                // fail a request whose claims were taken.
                if let Some(at) = expiry
                    && let Err(e) = self.schedule_sweep(at).await
                {
                    worker::console_error!("dedupe shard: scheduling the sweep: {e}");
                }
                Response::from_json(&reply)
            }
            Err(e) => Response::error(format!("dedupe shard: {e}"), 500),
        }
    }

    async fn alarm(&self) -> Result<Response> {
        self.ensure_schema()?;
        self.sql.exec(
            "DELETE FROM ids WHERE expires_at IS NOT NULL AND expires_at <= ?",
            vec![SqlStorageValue::from(now_ms())],
        )?;
        self.alarm_at.set(None);
        #[derive(Deserialize)]
        struct Next {
            next: Option<i64>,
        }
        let next: Next = self
            .sql
            .exec("SELECT MIN(expires_at) AS next FROM ids", None)?
            .one()?;
        if let Some(at) = next.next {
            self.schedule_sweep(at).await?;
        }
        Response::ok("swept")
    }
}

impl DedupeShard {
    fn ensure_schema(&self) -> Result<()> {
        if !self.schema_ready.get() {
            self.sql.exec(SCHEMA, None)?;
            self.schema_ready.set(true);
        }
        Ok(())
    }

    /// Applies one request; returns the reply and the earliest expiry it wrote.
    fn apply(&self, request: ShardRequest, now: i64) -> Result<(ShardReply, Option<i64>)> {
        self.ensure_schema()?;
        let mut reply = ShardReply::default();
        let mut expiry = None;
        match request {
            ShardRequest::Seen { keys } => {
                let mut seen = Vec::with_capacity(keys.len());
                for key in &keys {
                    seen.push(matches!(
                        self.live_row(key, now)?,
                        Some(Row { token: None, .. })
                    ));
                }
                reply.seen = Some(seen);
            }
            ShardRequest::Claim { keys, lease_ms } => {
                let until = expiry_after(now, lease_ms);
                let mut claims = Vec::with_capacity(keys.len());
                for key in &keys {
                    claims.push(match self.live_row(key, now)? {
                        Some(Row { token: None, .. }) => ClaimReply::Seen,
                        Some(_) => ClaimReply::Held,
                        None => {
                            let token = new_token(now);
                            self.upsert(key, Some(&token), Some(until))?;
                            expiry = Some(until);
                            ClaimReply::Acquired { token }
                        }
                    });
                }
                reply.claims = Some(claims);
            }
            ShardRequest::Commit {
                done,
                ttl_ms,
                release,
            } => {
                let until = ttl_ms.map(|ttl| expiry_after(now, ttl));
                for key in &done {
                    self.upsert(key, None, until)?;
                }
                if !done.is_empty() {
                    expiry = until;
                }
                for Release { key, token } in release {
                    self.sql.exec(
                        "DELETE FROM ids WHERE key = ? AND token = ?",
                        vec![key.into(), token.into()],
                    )?;
                }
            }
            ShardRequest::Forget { keys } => {
                let mut forgotten = 0;
                for key in keys {
                    let cursor = self
                        .sql
                        .exec("DELETE FROM ids WHERE key = ?", vec![key.into()])?;
                    // Drain the cursor so the count is final.
                    cursor.to_array::<serde_json::Value>()?;
                    forgotten += cursor.rows_written() as u64;
                }
                reply.forgotten = Some(forgotten);
            }
            ShardRequest::Entries { limit, expired } => {
                // With `expired`, every row: `now` then excludes nothing.
                let after = if expired { i64::MIN } else { now };
                let rows: Vec<EntryRow> = self
                    .sql
                    .exec(
                        "SELECT key, token, expires_at FROM ids
                         WHERE expires_at IS NULL OR expires_at > ? ORDER BY key LIMIT ?",
                        vec![after.into(), i64::from(limit).into()],
                    )?
                    .to_array()?;
                reply.entries = Some(
                    rows.into_iter()
                        .map(|row| Entry {
                            key: row.key,
                            state: if row.token.is_some() {
                                "claimed"
                            } else {
                                "done"
                            }
                            .into(),
                            expires_at: row.expires_at.map(|at| at as u64),
                        })
                        .collect(),
                );
            }
        }
        Ok((reply, expiry))
    }

    /// The key's row, if it has one that has not expired.
    fn live_row(&self, key: &str, now: i64) -> Result<Option<Row>> {
        let rows: Vec<Row> = self
            .sql
            .exec(
                "SELECT token, expires_at FROM ids WHERE key = ?",
                vec![key.into()],
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .filter(|row| row.expires_at.is_none_or(|at| at > now)))
    }

    fn upsert(&self, key: &str, token: Option<&str>, expires_at: Option<i64>) -> Result<()> {
        let token = token.map_or(SqlStorageValue::Null, SqlStorageValue::from);
        let expires_at = expires_at.map_or(SqlStorageValue::Null, SqlStorageValue::from);
        self.sql.exec(
            "INSERT INTO ids (key, token, expires_at) VALUES (?, ?, ?)
             ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at",
            vec![key.into(), token, expires_at],
        )?;
        Ok(())
    }

    /// Makes sure an alarm fires no later than `at` to sweep expired rows.
    async fn schedule_sweep(&self, at: i64) -> Result<()> {
        if self.alarm_at.get().is_some_and(|set| set <= at) {
            return Ok(());
        }
        let storage = self.state.storage();
        match storage.get_alarm().await? {
            Some(set) if set <= at => self.alarm_at.set(Some(set)),
            _ => {
                let when = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(at as f64));
                storage.set_alarm(ScheduledTime::new(when)).await?;
                self.alarm_at.set(Some(at));
            }
        }
        Ok(())
    }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// `now + ms`, kept within what a JS number (and so a row read back) holds exactly.
fn expiry_after(now: i64, ms: u64) -> i64 {
    const MAX_SAFE: i64 = (1 << 53) - 1;
    now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
        .min(MAX_SAFE)
}

/// A claim token: unique per claim (time plus 52 random bits), so only the
/// claimer can release it.
fn new_token(now: i64) -> String {
    let random = (js_sys::Math::random() * 4_503_599_627_370_496.0) as u64;
    format!("{now:x}-{random:013x}")
}
