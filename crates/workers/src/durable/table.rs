//! The shard's table: every read and write of the seen-set, synchronous SQL.

use bq_dedupe::store::ClaimToken;
use bq_dedupe::store::record::{Record, Rules};
use bq_dedupe::store::wire::Step;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::cell::Cell;
use std::rc::Rc;
use worker::{Result, SqlStorage, SqlStorageValue};

use crate::Rows;
use crate::store::new_token;

use super::protocol::{
    ClaimRef, Entry, MAX_SAFE_MS, PeekState, Remember, ShardReply, ShardRequest, expiry_after,
};

/// How the table's rows follow the record model: a lapsed claim's row stays its
/// owner's until another consumer takes it over (or the sweep removes it); a
/// done row keeps the token that committed it (`done_by`), so a commit sent
/// again after a lost reply is known as its own, not reported lease-lost.
pub(crate) const RULES: Rules = Rules {
    lapsed_claim_kept: true,
    done_keeps_token: true,
    claims_have_owners: true,
    remember_resets_expiry: true,
    lapsed_claim_swept: true,
    claim_given_back: false,
};

/// `token` NULL: remembered (done; `done_by` the claim token that committed
/// it, NULL for a plain remember); otherwise an in-flight claim owned by that
/// token. `expires_at` NULL: never expires. Rows past `expires_at` count as
/// absent (reads check it themselves; the sweep only reclaims space).
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS ids (
    key TEXT PRIMARY KEY NOT NULL,
    token TEXT,
    expires_at INTEGER,
    done_by TEXT
) WITHOUT ROWID";

/// A table made before `done_by` gains it (its done rows read as plain).
const ADD_DONE_BY: &str = "ALTER TABLE ids ADD COLUMN done_by TEXT";

#[derive(Deserialize)]
struct Row {
    token: Option<String>,
    expires_at: Option<i64>,
    done_by: Option<String>,
}

#[derive(Deserialize)]
struct EntryRow {
    key: String,
    token: Option<String>,
    expires_at: Option<i64>,
}

/// A request's reply and the earliest expiry it wrote.
pub(crate) type Applied = (ShardReply, Option<i64>);

/// The `ids` table of one shard (cheap to clone: a handle).
#[derive(Debug, Clone)]
pub(crate) struct IdTable {
    sql: SqlStorage,
    /// The rows the request being applied has read and written.
    rows: Rc<Cell<Rows>>,
}

impl IdTable {
    pub(crate) fn new(sql: SqlStorage) -> Self {
        IdTable {
            sql,
            rows: Rc::default(),
        }
    }

    /// Runs one statement to its end; its rows (the cursor's `rowsRead` and
    /// `rowsWritten`, what Cloudflare bills) count toward the request's.
    fn exec<T: DeserializeOwned>(
        &self,
        query: &str,
        bindings: Vec<SqlStorageValue>,
    ) -> Result<Vec<T>> {
        let cursor = self.sql.exec(query, bindings)?;
        let rows = cursor.to_array()?;
        let mut counted = self.rows.get();
        counted.add(cursor.rows_read() as u64, cursor.rows_written() as u64);
        self.rows.set(counted);
        Ok(rows)
    }

    pub(crate) fn create(&self) -> Result<()> {
        self.sql.exec(SCHEMA, None)?;
        if self
            .sql
            .exec("SELECT done_by FROM ids LIMIT 0", None)
            .is_err()
        {
            self.sql.exec(ADD_DONE_BY, None)?;
        }
        Ok(())
    }

    /// Applies one request; returns the reply and the earliest expiry it wrote.
    /// Every rule of a key's record is the core's (`bq_dedupe::store::record`),
    /// applied to the row as read: this table only stores the result.
    pub(crate) fn apply(&self, request: ShardRequest, now: i64) -> Result<Applied> {
        let mut reply = ShardReply::default();
        let mut expiry = None;
        let at = Some(now.max(0) as u64);
        self.rows.set(Rows::default());
        match request {
            ShardRequest::Seen { keys } => {
                let mut seen = Vec::with_capacity(keys.len());
                for key in &keys {
                    seen.push(self.record(key)?.seen(at));
                }
                reply.seen = Some(seen);
            }
            ShardRequest::Claim { keys, lease_ms } => {
                let until = Some(expiry_after(now, lease_ms) as u64);
                let mut claims = Vec::with_capacity(keys.len());
                for key in &keys {
                    let token = new_token(now);
                    let answer = self.update(key, &mut expiry, |r| {
                        r.claim(RULES, at, token.clone(), until)
                    })?;
                    claims.push(answer.with_token(ClaimToken(token)));
                }
                reply.claims = Some(claims);
            }
            ShardRequest::Commit {
                done,
                ttl_ms,
                release,
            } => {
                let until = ttl_ms.map(|ttl| expiry_after(now, ttl) as u64);
                for key in &done {
                    self.update(key, &mut expiry, |r| r.remember(RULES, at, until))?;
                }
                for ClaimRef { key, token } in release {
                    self.update(&key, &mut expiry, |r| r.release(RULES, at, &token.0))?;
                }
            }
            ShardRequest::Settle(Step {
                remember,
                ttl_ms,
                release,
                renew,
                lease_ms,
            }) => {
                // Releases first: a release must never be skipped by a later step.
                for ClaimRef { key, token } in release {
                    self.update(&key, &mut expiry, |r| r.release(RULES, at, &token.0))?;
                }
                let until = Some(expiry_after(now, lease_ms.unwrap_or_default()) as u64);
                let mut renewed = Vec::with_capacity(renew.len());
                for ClaimRef { key, token } in &renew {
                    let renew = |r: &mut Record<String>| r.renew(RULES, at, &token.0, until);
                    renewed.push(self.update(key, &mut expiry, renew)?);
                }
                let done_until = ttl_ms.map(|ttl| expiry_after(now, ttl) as u64);
                let mut kept = Vec::with_capacity(remember.len());
                for Remember { key, token } in &remember {
                    kept.push(self.update(key, &mut expiry, |r| match token {
                        None => {
                            r.remember(RULES, at, done_until);
                            true
                        }
                        Some(token) => r.remember_fenced(RULES, at, &token.0, done_until),
                    })?);
                }
                reply.kept = Some(kept);
                reply.renewed = Some(renewed);
            }
            ShardRequest::Peek { keys } => {
                let mut states = Vec::with_capacity(keys.len());
                let mut held_ms = Vec::with_capacity(keys.len());
                for key in &keys {
                    let (state, left) = PeekState::of(self.record(key)?.peeked(at));
                    states.push(state);
                    held_ms.push(left);
                }
                reply.peek = Some(states);
                reply.held_ms = Some(held_ms);
            }
            ShardRequest::Forget { keys } => {
                let mut forgotten = 0;
                for key in keys {
                    let written = self.rows.get().written;
                    self.exec::<serde_json::Value>(
                        "DELETE FROM ids WHERE key = ?",
                        vec![key.into()],
                    )?;
                    forgotten += self.rows.get().written - written;
                }
                reply.forgotten = Some(forgotten);
            }
            ShardRequest::Layouts {
                current,
                previous,
                window_ms,
            } => {
                reply.refused = super::layouts::check(
                    &self.sql,
                    &current,
                    previous.as_deref(),
                    window_ms,
                    now,
                )?;
            }
            ShardRequest::Entries { limit, expired } => {
                // With `expired`, every row: `now` then excludes nothing.
                let after = if expired { i64::MIN } else { now };
                let rows: Vec<EntryRow> = self.exec(
                    "SELECT key, token, expires_at FROM ids
                     WHERE expires_at IS NULL OR expires_at > ? ORDER BY key LIMIT ?",
                    vec![after.into(), i64::from(limit).into()],
                )?;
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
        reply.rows = Some(self.rows.get());
        Ok((reply, expiry))
    }

    /// The key's record as stored (expired rows included: the rules judge them).
    fn record(&self, key: &str) -> Result<Record<String>> {
        let rows: Vec<Row> = self.exec(
            "SELECT token, expires_at, done_by FROM ids WHERE key = ?",
            vec![key.into()],
        )?;
        let until = |at: Option<i64>| at.map(|at| at.max(0) as u64);
        Ok(match rows.into_iter().next() {
            None => Record::Free,
            Some(Row {
                token: Some(token),
                expires_at,
                ..
            }) => Record::Claimed {
                token,
                until: until(expires_at),
            },
            Some(Row {
                token: None,
                expires_at,
                done_by,
            }) => Record::Done {
                until: until(expires_at),
                by: done_by,
            },
        })
    }

    /// Applies `op` to the key's record and stores what changed; `expiry`
    /// becomes the earliest expiry written.
    fn update<R>(
        &self,
        key: &str,
        expiry: &mut Option<i64>,
        op: impl FnOnce(&mut Record<String>) -> R,
    ) -> Result<R> {
        let before = self.record(key)?;
        let mut after = before.clone();
        let answer = op(&mut after);
        if after != before {
            let written = self.write(key, &after)?;
            *expiry = earliest(*expiry, written);
        }
        Ok(answer)
    }

    /// Stores a record (free: no row); returns its expiry.
    fn write(&self, key: &str, record: &Record<String>) -> Result<Option<i64>> {
        let (token, until, done_by) = match record {
            Record::Free => {
                self.exec::<serde_json::Value>("DELETE FROM ids WHERE key = ?", vec![key.into()])?;
                return Ok(None);
            }
            Record::Claimed { token, until } => (Some(token), *until, None),
            Record::Done { until, by } => (None, *until, by.as_ref()),
        };
        let until = until.map(|u| u.min(MAX_SAFE_MS) as i64);
        let text = |t: Option<&String>| t.map_or(SqlStorageValue::Null, |t| t.as_str().into());
        let expires_at = until.map_or(SqlStorageValue::Null, SqlStorageValue::from);
        self.exec::<serde_json::Value>(
            "INSERT INTO ids (key, token, expires_at, done_by) VALUES (?, ?, ?, ?)
             ON CONFLICT (key) DO UPDATE SET token = excluded.token,
                 expires_at = excluded.expires_at, done_by = excluded.done_by",
            vec![key.into(), text(token), expires_at, text(done_by)],
        )?;
        Ok(until)
    }

    /// Deletes the rows expired at `now`; returns the next expiry, if any.
    pub(crate) fn sweep(&self, now: i64) -> Result<Option<i64>> {
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
