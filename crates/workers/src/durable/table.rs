//! The shard's table: every read and write of the seen-set, synchronous SQL.

use serde::Deserialize;
use worker::{Result, SqlStorage, SqlStorageValue};

use super::protocol::{
    ClaimReply, Entry, MAX_SAFE_MS, PeekState, Release, Remember, ShardReply, ShardRequest,
};

/// `token` NULL: remembered (done); otherwise an in-flight claim owned by that
/// token. `expires_at` NULL: never expires. Rows past `expires_at` count as absent
/// (reads check it themselves; the sweep only reclaims space).
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS ids (
    key TEXT PRIMARY KEY NOT NULL,
    token TEXT,
    expires_at INTEGER
) WITHOUT ROWID";

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

/// A request's reply and the earliest expiry it wrote.
pub type Applied = (ShardReply, Option<i64>);

/// The `ids` table of one shard (cheap to clone: a handle).
#[derive(Clone)]
pub struct IdTable {
    sql: SqlStorage,
}

impl IdTable {
    pub fn new(sql: SqlStorage) -> Self {
        IdTable { sql }
    }

    pub fn create(&self) -> Result<()> {
        self.sql.exec(SCHEMA, None)?;
        Ok(())
    }

    /// Applies one request; returns the reply and the earliest expiry it wrote.
    pub fn apply(&self, request: ShardRequest, now: i64) -> Result<Applied> {
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
                    self.release(&key, &token)?;
                }
            }
            ShardRequest::Settle {
                remember,
                ttl_ms,
                release,
                renew,
                lease_ms,
            } => {
                // Releases first: a release must never be skipped by a later step.
                for Release { key, token } in release {
                    self.release(&key, &token)?;
                }
                let until = expiry_after(now, lease_ms);
                let mut renewed = Vec::with_capacity(renew.len());
                for Release { key, token } in &renew {
                    let ours = self.owns(key, token)?;
                    if ours {
                        self.upsert(key, Some(token), Some(until))?;
                        expiry = earliest(expiry, Some(until));
                    }
                    renewed.push(ours);
                }
                let done_until = ttl_ms.map(|ttl| expiry_after(now, ttl));
                let mut kept = Vec::with_capacity(remember.len());
                for Remember { key, token } in &remember {
                    let (write, ours) = match token {
                        None => (true, true),
                        Some(token) if self.owns(key, token)? => (true, true),
                        // Lost: remembered only if free (never over another
                        // consumer's live claim, nor an id already remembered).
                        Some(_) => (self.live_row(key, now)?.is_none(), false),
                    };
                    if write {
                        self.upsert(key, None, done_until)?;
                        expiry = earliest(expiry, done_until);
                    }
                    kept.push(ours);
                }
                reply.kept = Some(kept);
                reply.renewed = Some(renewed);
            }
            ShardRequest::Peek { keys } => {
                let mut states = Vec::with_capacity(keys.len());
                for key in &keys {
                    states.push(match self.live_row(key, now)? {
                        None => PeekState::Free,
                        Some(Row { token: None, .. }) => PeekState::Seen,
                        Some(_) => PeekState::Held,
                    });
                }
                reply.peek = Some(states);
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

    /// Does `token` still own the key's claim? Live or lapsed, as long as no one
    /// took it over (and the sweep has not removed it).
    fn owns(&self, key: &str, token: &str) -> Result<bool> {
        let rows: Vec<Row> = self
            .sql
            .exec(
                "SELECT token, expires_at FROM ids WHERE key = ? AND token = ?",
                vec![key.into(), token.into()],
            )?
            .to_array()?;
        Ok(!rows.is_empty())
    }

    /// Drops the key's claim if `token` still owns it.
    fn release(&self, key: &str, token: &str) -> Result<()> {
        self.sql.exec(
            "DELETE FROM ids WHERE key = ? AND token = ?",
            vec![key.into(), token.into()],
        )?;
        Ok(())
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

    /// Deletes the rows expired at `now`; returns the next expiry, if any.
    pub fn sweep(&self, now: i64) -> Result<Option<i64>> {
        self.sql.exec(
            "DELETE FROM ids WHERE expires_at IS NOT NULL AND expires_at <= ?",
            vec![SqlStorageValue::from(now)],
        )?;
        #[derive(Deserialize)]
        struct Next {
            next: Option<i64>,
        }
        let next: Next = self
            .sql
            .exec("SELECT MIN(expires_at) AS next FROM ids", None)?
            .one()?;
        Ok(next.next)
    }
}

/// The earlier of two optional expiries (`None`: nothing to sweep).
fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A claim token: unique per claim (time plus 52 random bits), so only the
/// claimer can release it.
fn new_token(now: i64) -> String {
    let random = (js_sys::Math::random() * 4_503_599_627_370_496.0) as u64;
    format!("{now:x}-{random:013x}")
}

/// `now + ms`, kept within what a JS number (and so a row read back) holds exactly.
fn expiry_after(now: i64, ms: u64) -> i64 {
    now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX))
        .min(MAX_SAFE_MS as i64)
}
