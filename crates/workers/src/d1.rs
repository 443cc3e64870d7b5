//! [`D1Store`]: the seen-set in a Cloudflare D1 database, in the SQLite store's
//! table (`bq_dedupe`, the statements of `bq_dedupe::store::sql`), with atomic
//! claims and the transactional mode ([`StatementStore`]).
//!
//! D1 is one SQLite database behind a network call: every statement is atomic
//! and a `batch()` is one transaction, but no code runs between the statements
//! of a batch. So every call here is one batch of statements, each of which is
//! one atomic step of the record model (the same ones `SqliteStore` runs): a
//! claim is `CLAIM` + `STATE` for each key in one batch, a settle its releases,
//! renewals and fenced commits in one batch. The transactional mode puts the
//! id's insert first in the handler's own batch: a live row (a duplicate that
//! committed first, or a claim) fails it on the primary key and the whole batch,
//! the handler's statements with it, rolls back.

use std::cell::Cell;
use std::time::Duration;

use bq_dedupe::store::record::Record;
use bq_dedupe::store::sql::{
    CLAIM, COMMIT_IF_FREE, COMMIT_OWN, EXPIRY_INDEX, FORGET, LIVE_ROW, PURGE_EXPIRED_DONE, RELEASE,
    REMEMBER, RENEW, SCHEMA, SEEN, STATE, TX_CHECK_RECORDED, TX_CLEAR_EXPIRED,
    TX_DONE_OVER_OWN_CLAIM, TX_INSERT_DONE, TX_REFUSE_OTHERS_ROW, TX_UNRECORDED, live_record,
};
use bq_dedupe::store::{Peeked, StatementStore, TxRun};
use bq_dedupe::{
    Store, StoreError, StoreResult, store::Capabilities, store::Claim, store::ClaimToken,
    store::Settled, store::Settlement,
};
use serde::Deserialize;
use wasm_bindgen::{JsCast, JsValue};
use worker::worker_sys::types::{D1Database as D1DatabaseSys, D1Result as D1ResultSys};
use worker::{D1Database, D1PreparedStatement};

use crate::durable::protocol::{expiry_after, wire_ms};
use crate::round_trips::RoundTrips;

thread_local! {
    /// This isolate has created the table (its first batch creates it if
    /// missing, in the same round trip). Only a fast path: a batch that meets
    /// "no such table" (another database, a table dropped or restored away)
    /// creates it and runs once more.
    static TABLE_READY: Cell<bool> = const { Cell::new(false) };
}

/// How often a write also sweeps expired done rows (1 in this many), and how
/// many at most: the table stays bounded by the dedupe window without a cron.
const SWEEP_EVERY: f64 = 32.0;
const SWEEP_LIMIT: i64 = 200;

/// The seen-set in a D1 database (see the module docs).
#[derive(Debug)]
pub struct D1Store {
    db: D1Database,
    round_trips: RoundTrips,
}

#[derive(Deserialize)]
struct LiveRow {
    state: i64,
    token: Option<String>,
    expires_at: Option<f64>,
}

#[derive(Deserialize)]
struct StateRow {
    state: i64,
}

fn error(e: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(format!("d1: {e}"))
}

/// A D1 call's failure in D1's words (`no such table: t: SQLITE_ERROR`):
/// workers-rs writes it as a debug dump with a JS stack, which went into dead
/// letters and logs.
fn said(e: worker::Error) -> StoreError {
    match e {
        worker::Error::D1(d1) => js_said(JsValue::from(AsRef::<js_sys::Error>::as_ref(&d1))),
        e => error(e),
    }
}

/// A JS error in D1's words: its cause's message where it has one.
fn js_said(e: JsValue) -> StoreError {
    match e.dyn_into::<js_sys::Error>() {
        Ok(err) => {
            let cause = err.cause().dyn_into::<js_sys::Error>();
            error(String::from(
                cause.map_or_else(|_| err.message(), |c| c.message()),
            ))
        }
        Err(other) => error(other.as_string().unwrap_or_else(|| format!("{other:?}"))),
    }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

/// `now + d`, kept within what a JS number (a bound D1 value) holds exactly.
fn after(now: i64, d: Duration) -> i64 {
    expiry_after(now, wire_ms(d))
}

fn until(now: i64, ttl: Option<Duration>) -> JsValue {
    ttl.map_or(JsValue::NULL, |ttl| JsValue::from(after(now, ttl) as f64))
}

fn text(s: &str) -> JsValue {
    JsValue::from_str(s)
}

fn number(n: i64) -> JsValue {
    JsValue::from(n as f64)
}

/// One statement's answer in a batch, read from D1's own object: its rows,
/// and its meta's numbers as JS numbers. (workers-rs reads the meta into
/// `usize`s, 32 bits here, and an `i64`: a database past 4 GiB, or a rowid
/// past 2^53 that any statement on the connection inserted, failed every call
/// after it had committed, a committed run retried for ever: a review.)
struct Answer(D1ResultSys);

impl Answer {
    fn rows<T: serde::de::DeserializeOwned>(&self) -> StoreResult<Vec<T>> {
        let rows = self.0.results().map_err(js_said)?;
        (rows.iter().flat_map(|rows| rows.iter()))
            .map(|row| serde_wasm_bindgen::from_value(row).map_err(error))
            .collect()
    }

    fn has_rows(&self) -> StoreResult<bool> {
        let rows = self.0.results().map_err(js_said)?;
        Ok(rows.is_some_and(|rows| rows.length() > 0))
    }

    /// A number of its meta (`changes`, `rows_read`, ...); 0 when absent.
    fn meta(&self, name: &str) -> u64 {
        let Ok(meta) = self.0.meta() else { return 0 };
        let value = js_sys::Reflect::get(&meta, &JsValue::from_str(name));
        value.ok().and_then(|v| v.as_f64()).map_or(0, |n| n as u64)
    }

    /// Whether the statement changed a row (triggers' own changes counted
    /// beside it: 1 or more).
    fn changed(&self) -> bool {
        self.meta("changes") >= 1
    }
}

impl D1Store {
    /// The seen-set in the database `db`.
    pub fn new(db: D1Database) -> Self {
        D1Store {
            db,
            round_trips: RoundTrips::new(),
        }
    }

    /// Counts this store's requests into `counter`.
    pub fn with_round_trips(mut self, counter: RoundTrips) -> Self {
        self.round_trips = counter;
        self
    }

    /// The database the ids live in: a handler's statements for
    /// [`StatementStore::commit_with`] are prepared on it.
    pub fn database(&self) -> &D1Database {
        &self.db
    }

    /// The counter of this store's requests (see [`Self::with_round_trips`]).
    pub fn round_trips(&self) -> &RoundTrips {
        &self.round_trips
    }

    fn statement(&self, sql: &str, args: &[JsValue]) -> StoreResult<D1PreparedStatement> {
        self.db.prepare(sql).bind(args).map_err(said)
    }

    /// One round trip: `statements` as one transaction, their results in order.
    /// The first batch of an isolate creates the table (and its expiry index)
    /// first, if missing; a batch that finds no table does so and runs again.
    async fn batch(&self, statements: Vec<D1PreparedStatement>) -> StoreResult<Vec<Answer>> {
        if TABLE_READY.with(Cell::get) {
            match self.run(statements.clone(), false).await {
                Err(e) if e.message.contains("no such table: bq_dedupe") => {
                    TABLE_READY.with(|ready| ready.set(false));
                }
                done => return done,
            }
        }
        let results = self.run(statements, true).await?;
        TABLE_READY.with(|ready| ready.set(true));
        Ok(results)
    }

    async fn run(
        &self,
        mut statements: Vec<D1PreparedStatement>,
        create: bool,
    ) -> StoreResult<Vec<Answer>> {
        let n = statements.len();
        if create {
            statements.insert(0, self.statement(SCHEMA, &[])?);
            statements.insert(1, self.statement(EXPIRY_INDEX, &[])?);
        }
        self.round_trips.add(1);
        let statements: js_sys::Array = (statements.iter())
            .map(|s| JsValue::from(s.inner().clone()))
            .collect();
        let db: &D1DatabaseSys = self.db.as_ref().unchecked_ref();
        let batch = db.batch(statements).map_err(js_said)?;
        let answered = wasm_bindgen_futures::JsFuture::from(batch).await;
        let answered = answered.map_err(js_said)?.dyn_into::<js_sys::Array>();
        let answered = answered.map_err(|_| error("batch() answered no array"))?;
        let mut results: Vec<Answer> = (answered.iter())
            .map(|r| Answer(r.unchecked_into()))
            .collect();
        for result in &results {
            (self.round_trips).add_rows(result.meta("rows_read"), result.meta("rows_written"));
        }
        results.drain(..results.len().saturating_sub(n));
        Ok(results)
    }

    /// Sometimes (1 in [`SWEEP_EVERY`] writes) the statement that sweeps
    /// expired done rows, to send at the end of a write's batch.
    fn maybe_sweep(&self, now: i64) -> StoreResult<Option<D1PreparedStatement>> {
        if js_sys::Math::random() * SWEEP_EVERY >= 1.0 {
            return Ok(None);
        }
        self.statement(PURGE_EXPIRED_DONE, &[number(now), number(SWEEP_LIMIT)])
            .map(Some)
    }

    /// Deletes up to `limit` expired done rows now (for a scheduled handler;
    /// writes also do it now and then); answers how many went.
    pub async fn purge_expired(&self, limit: u32) -> StoreResult<u64> {
        let purge = self.statement(
            PURGE_EXPIRED_DONE,
            &[number(now_ms()), number(i64::from(limit))],
        )?;
        let results = self.batch(vec![purge]).await?;
        Ok(results[0].meta("changes"))
    }

    /// The key's live row, if it has one.
    async fn live_row(&self, key: &str, now: i64) -> StoreResult<Option<LiveRow>> {
        let read = self.statement(LIVE_ROW, &[text(key), number(now)])?;
        let results = self.batch(vec![read]).await?;
        let rows: Vec<LiveRow> = results[0].rows()?;
        Ok(rows.into_iter().next())
    }
}

impl Store for D1Store {
    fn kind(&self) -> &'static str {
        "d1"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let now = number(now_ms());
        let reads = keys
            .iter()
            .map(|key| self.statement(SEEN, &[text(key), now.clone()]))
            .collect::<StoreResult<Vec<_>>>()?;
        let results = self.batch(reads).await?;
        results.iter().map(Answer::has_rows).collect()
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let until = until(now, ttl);
        let mut writes = keys
            .iter()
            .map(|key| self.statement(REMEMBER, &[text(key), until.clone()]))
            .collect::<StoreResult<Vec<_>>>()?;
        writes.extend(self.maybe_sweep(now)?);
        self.batch(writes).await.map(drop)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        let delete = self.statement(FORGET, &[text(key)])?;
        self.batch(vec![delete]).await.map(drop)
    }

    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_ms();
        let reads = keys
            .iter()
            .map(|key| self.statement(LIVE_ROW, &[text(key), number(now)]))
            .collect::<StoreResult<Vec<_>>>()?;
        let results = self.batch(reads).await?;
        results
            .iter()
            .map(|r| {
                let rows: Vec<LiveRow> = r.rows()?;
                Ok(record_of(rows.into_iter().next()).peeked(Some(now as u64)))
            })
            .collect()
    }

    /// One batch (one transaction): for each key, the claim and the read that
    /// tells `Seen` from `Held` when it changed nothing.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_ms();
        let until = number(after(now, lease));
        let tokens: Vec<ClaimToken> = keys.iter().map(|_| new_token(now)).collect();
        let mut statements = Vec::with_capacity(keys.len() * 2);
        for (key, token) in keys.iter().zip(&tokens) {
            let args = [text(key), text(&token.0), until.clone(), number(now)];
            statements.push(self.statement(CLAIM, &args)?);
            statements.push(self.statement(STATE, &[text(key)])?);
        }
        let results = self.batch(statements).await?;
        let mut claims = Vec::with_capacity(keys.len());
        for (pair, token) in results.chunks(2).zip(tokens) {
            if pair[0].changed() {
                claims.push(Claim::Acquired(token));
                continue;
            }
            let state: Vec<StateRow> = pair[1].rows()?;
            claims.push(match state.first() {
                Some(row) if row.state == 1 => Claim::Seen,
                _ => Claim::Held,
            });
        }
        Ok(claims)
    }

    /// One batch (one transaction): releases, renewals and (fenced) remembers are
    /// applied together or not at all. A fenced remember is `COMMIT_OWN` then
    /// `COMMIT_IF_FREE`: once the first took the row, the second finds it live
    /// and changes nothing.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let now = now_ms();
        let done_until = until(now, step.ttl);
        let lease_until = number(after(now, step.lease));
        let mut statements = Vec::new();
        for (key, token) in step.release {
            statements.push(self.statement(RELEASE, &[text(key), text(&token.0)])?);
        }
        for (key, token) in step.renew {
            let args = [text(key), text(&token.0), lease_until.clone()];
            statements.push(self.statement(RENEW, &args)?);
        }
        for (key, token) in step.remember {
            match token {
                Some(token) => {
                    let args = [text(key), text(&token.0), done_until.clone(), number(now)];
                    statements.push(self.statement(COMMIT_OWN, &args)?);
                    let args = [text(key), done_until.clone(), number(now)];
                    statements.push(self.statement(COMMIT_IF_FREE, &args)?);
                }
                None => {
                    statements.push(self.statement(REMEMBER, &[text(key), done_until.clone()])?)
                }
            }
        }
        if statements.is_empty() {
            return Ok(Settled::default());
        }
        statements.extend(self.maybe_sweep(now)?);
        let results = self.batch(statements).await?;
        let mut results = results.iter().skip(step.release.len());
        let mut settled = Settled::default();
        for _ in step.renew {
            let renew = results.next().ok_or_else(|| error("a result is missing"))?;
            settled.renewed.push(renew.changed());
        }
        for (_, token) in step.remember {
            let first = results.next().ok_or_else(|| error("a result is missing"))?;
            settled.kept.push(match token {
                Some(_) => {
                    results.next();
                    first.changed()
                }
                None => true,
            });
        }
        Ok(settled)
    }
}

impl StatementStore for D1Store {
    type Statement = D1PreparedStatement;

    /// One batch: the key's expired row cleared, the key inserted as done by a
    /// fresh token (a live row fails the insert, so the batch), then the
    /// handler's statements. When the batch fails, the key's row says what
    /// happened: done by this token (the reply was lost after the commit:
    /// committed), done by another (a duplicate committed first: nothing of this
    /// run was written), claimed (held), or none (nothing was written; if our
    /// insert was what failed, the key is free now and the batch goes again).
    async fn commit_with(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        statements: Vec<D1PreparedStatement>,
    ) -> StoreResult<TxRun<(), StoreError>> {
        let Some(key) = key else {
            // D1 refuses an empty batch: nothing to write is written.
            if statements.is_empty() {
                return Ok(TxRun::Committed(()));
            }
            return Ok(match self.batch(statements).await {
                Ok(_) => TxRun::Committed(()),
                Err(e) => TxRun::RolledBack(e),
            });
        };
        let mut tries = 1;
        loop {
            let now = now_ms();
            let token = new_token(now);
            let mut batch = Vec::with_capacity(statements.len() + 5);
            batch.push(self.statement(TX_CLEAR_EXPIRED, &[text(key), number(now)])?);
            let (key_text, done_by, until) = (text(key), text(&token.0), until(now, ttl));
            match claim {
                Some(claim) => {
                    let over = [key_text.clone(), done_by.clone(), until, text(&claim.0)];
                    batch.push(self.statement(TX_DONE_OVER_OWN_CLAIM, &over)?);
                    batch.push(self.statement(TX_REFUSE_OTHERS_ROW, &[key_text, done_by])?);
                }
                None => batch.push(self.statement(TX_INSERT_DONE, &[key_text, done_by, until])?),
            }
            batch.extend(statements.iter().cloned());
            batch.push(
                self.statement(TX_CHECK_RECORDED, &[text(key), text(&token.0), number(now)])?,
            );
            batch.extend(self.maybe_sweep(now)?);
            let failed = match self.batch(batch).await {
                Ok(_) => return Ok(TxRun::Committed(())),
                Err(e) => e,
            };
            // What the failed batch left: read on a fresh round trip. If this read
            // fails too, nobody can tell yet: `Err`, saying it may have
            // committed (it read as nothing committed: a review), and the
            // redelivery finds out (a skip if it did).
            let left = self.live_row(key, now_ms()).await.map_err(|unread| {
                error(format!(
                    "the batch failed ({}) and what it left could not be read ({}): it may \
                     have committed; a redelivery finds out, and skips it if it did",
                    failed.message, unread.message
                ))
            })?;
            let row = not_our_claim(left, claim);
            // Our insert refused by a row that expired or was forgotten before
            // the read: nothing was written and the key is free now, so the
            // batch is sent again (the history checker found the race).
            let raced = row.is_none() && failed.message.contains(OWN_KEY_CONSTRAINT);
            if raced && tries < RACED_BATCH_TRIES {
                tries += 1;
                continue;
            }
            return Ok(after_failed_batch(row.as_ref(), &token, failed));
        }
    }
}

/// The row a failed batch left, unless it is our own claim (`claim`), which
/// the batch would have replaced: as no row, since the batch wrote nothing.
fn not_our_claim(row: Option<LiveRow>, claim: Option<&ClaimToken>) -> Option<LiveRow> {
    let ours = |r: &LiveRow| r.state == 0 && claim.is_some_and(|c| r.token.as_ref() == Some(&c.0));
    row.filter(|r| !ours(r))
}

/// A key's live row as the record model's record (no row: free).
fn record_of(row: Option<LiveRow>) -> Record {
    live_record(row.map(|r| (r.state, r.token, r.expires_at.map(|at| at as u64))))
}

/// What a transactional batch that answered an error left, read from the key's
/// live row afterwards: done by this run's token (the commit landed, its reply
/// was lost), done by another (a duplicate committed first), claimed (held), or
/// none (nothing was written).
fn after_failed_batch(
    row: Option<&LiveRow>,
    token: &ClaimToken,
    failed: StoreError,
) -> TxRun<(), StoreError> {
    match row {
        Some(row) if row.state == 1 && row.token.as_deref() == Some(token.0.as_str()) => {
            TxRun::Committed(())
        }
        Some(row) if row.state == 1 => TxRun::AlreadyDone,
        Some(_) => TxRun::Held,
        // Our own insert was refused by a live row that expired or was
        // forgotten before the read, on every try: done or claimed then, which
        // is unknown now. Nothing was written: the store's error, for a retry.
        None if failed.message.contains(OWN_KEY_CONSTRAINT) => {
            TxRun::RolledBack(StoreError::unavailable(format!(
                "{}: the key's row refused this run's batch and was gone when read \
                 (expired or forgotten meanwhile); nothing of this run was written",
                failed.message
            )))
        }
        // The handler's statements deleted or changed the id's row.
        None if failed.message.contains(TX_UNRECORDED) => TxRun::Aborted(StoreError::internal(
            "d1: a statement of the handler's deleted or changed this id's row in \
                 bq_dedupe, so its effects would have been committed with the id unrecorded; \
                 D1 rolled the whole batch back, so nothing of this run was written",
        )),
        // D1 ran the batch and SQLite refused one of its statements (the
        // handler's, in practice: a missing table, a constraint): the run's
        // own failure, told with D1's words, not the store's.
        None if refused_by_sqlite(&failed.message) => {
            TxRun::Aborted(StoreError::internal(format!(
                "{}; D1 rolled the whole batch back, so nothing of this run was written",
                failed.message
            )))
        }
        None => TxRun::RolledBack(failed),
    }
}

/// How many times a transactional batch is sent while a row that refused it
/// is gone by the time it is read.
const RACED_BATCH_TRIES: u32 = 3;

/// How SQLite names our own key's constraint in its message (a table of the
/// handler's named `x_bq_dedupe` is not ours).
const OWN_KEY_CONSTRAINT: &str = "UNIQUE constraint failed: bq_dedupe.";

/// Whether a failed batch's error is SQLite refusing a statement (D1 ends such
/// messages with its result code: `no such table: t: SQLITE_ERROR`), not D1
/// failing to run the batch (a network error, an overloaded or busy database).
/// Our own insert's constraint is told apart before it is asked.
fn refused_by_sqlite(message: &str) -> bool {
    const REFUSED: [&str; 7] = [
        "SQLITE_ERROR",
        "SQLITE_CONSTRAINT",
        "SQLITE_MISMATCH",
        "SQLITE_TOOBIG",
        "SQLITE_RANGE",
        "SQLITE_AUTH",
        // A handler's COMMIT, ROLLBACK or SAVEPOINT, refused without a code
        // (it was blamed on the store: a trial).
        "To execute a transaction, please use",
    ];
    REFUSED.iter().any(|code| message.contains(code))
}

fn new_token(now: i64) -> ClaimToken {
    ClaimToken(crate::store::new_token(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_sqlite_refuses_is_the_handlers_a_batch_d1_cannot_run_the_stores() {
        for refused in [
            "D1_ERROR: no such table: orders: SQLITE_ERROR",
            "D1_ERROR: To execute a transaction, please use the state.storage.transaction() \
             or state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION or \
             SAVEPOINT statements.",
        ] {
            assert!(refused_by_sqlite(refused), "{refused}");
        }
        for unavailable in ["D1_ERROR: Network connection lost.", "D1 DB is overloaded."] {
            assert!(!refused_by_sqlite(unavailable), "{unavailable}");
        }
    }

    fn row(state: i64, token: Option<&str>) -> LiveRow {
        LiveRow {
            state,
            token: token.map(str::to_owned),
            expires_at: None,
        }
    }

    /// A batch that failed with our claim in place left that claim (it
    /// wrote nothing): no row, so the failure is told by its error, not taken
    /// for another run's claim (`Held`: a retry parked behind itself).
    #[test]
    fn our_own_claim_is_no_row_after_a_failed_batch() {
        let claim = ClaimToken("claim-1".into());
        let token = |row: Option<LiveRow>| row.map(|r| (r.state, r.token));
        assert_eq!(
            token(not_our_claim(Some(row(0, Some("claim-1"))), Some(&claim))),
            None
        );
        let theirs = Some((0, Some("claim-2".to_owned())));
        assert_eq!(
            token(not_our_claim(Some(row(0, Some("claim-2"))), Some(&claim))),
            theirs
        );
        let done = Some((1, Some("claim-1".to_owned())));
        assert_eq!(
            token(not_our_claim(Some(row(1, Some("claim-1"))), Some(&claim))),
            done
        );
        let unclaimed = Some((0, Some("claim-1".to_owned())));
        assert_eq!(
            token(not_our_claim(Some(row(0, Some("claim-1"))), None)),
            unclaimed
        );
    }

    #[test]
    fn a_failed_batch_is_told_apart_by_the_row_it_left() {
        let ours = ClaimToken("run-1".into());
        let failed = || StoreError::unavailable("d1: network");
        // The commit landed and only its reply was lost: ours, exactly once.
        let lost_reply = after_failed_batch(Some(&row(1, Some("run-1"))), &ours, failed());
        assert_eq!(lost_reply, TxRun::Committed(()));
        // Another run committed first (its token, or a plain remember's NULL).
        for other in [Some("run-2"), None] {
            let done = after_failed_batch(Some(&row(1, other)), &ours, failed());
            assert_eq!(done, TxRun::AlreadyDone);
        }
        // A claiming consumer's live claim, even one carrying our token's text.
        for token in [Some("claim-9"), Some("run-1")] {
            assert_eq!(
                after_failed_batch(Some(&row(0, token)), &ours, failed()),
                TxRun::Held
            );
        }
        // Nothing written: the error, for a retry.
        match after_failed_batch(None, &ours, failed()) {
            TxRun::RolledBack(e) => assert!(e.message.contains("network")),
            other => panic!("{other:?}"),
        }
        // Issue #25, finding 4: a statement SQLite refused was reported as the
        // store being unavailable; it is the run's own failure, D1's words kept.
        let refused = StoreError::unavailable("d1: D1_ERROR: no such table: nope: SQLITE_ERROR");
        match after_failed_batch(None, &ours, refused) {
            TxRun::Aborted(e) => {
                assert!(e.message.contains("no such table: nope"), "{e}");
                assert!(e.message.contains("nothing of this run was written"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // Our own insert refused (a live row, gone before the read): not the
        // handler's failure (found by review).
        let ours_refused = StoreError::unavailable(
            "d1: D1_ERROR: UNIQUE constraint failed: bq_dedupe.key: SQLITE_CONSTRAINT",
        );
        // A handler's table whose name ends in ours is the handler's (review).
        let theirs = StoreError::unavailable(
            "d1: D1_ERROR: UNIQUE constraint failed: old_bq_dedupe.id: SQLITE_CONSTRAINT",
        );
        assert!(matches!(
            after_failed_batch(None, &ours, theirs),
            TxRun::Aborted(_)
        ));
        match after_failed_batch(None, &ours, ours_refused) {
            TxRun::RolledBack(e) => {
                assert_eq!(e.kind, bq_dedupe::store::StoreErrorKind::Unavailable, "{e}");
                assert!(e.message.contains("gone when read"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        // The last statement's check: the handler's statements deleted the id's
        // row. The run's failure, not our insert raced (its batch was sent again).
        let unrecorded = StoreError::unavailable(format!(
            "d1: {TX_UNRECORDED}: SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_NOTNULL)"
        ));
        assert!(!unrecorded.message.contains(OWN_KEY_CONSTRAINT));
        match after_failed_batch(None, &ours, unrecorded) {
            TxRun::Aborted(e) => assert!(e.message.contains("deleted or changed"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
