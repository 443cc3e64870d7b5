//! [`SqliteStore`]: the seen-set in one SQLite table.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bq_dedupe::store::Peeked;
use bq_dedupe::store::record::Rules;
use bq_dedupe::store::{TransactionalStore, TxRun};
use bq_dedupe::{
    Store, StoreError, StoreResult, clock::Clock, clock::SystemClock, store::Capabilities,
    store::Claim, store::ClaimToken, store::Settled, store::Settlement, store::StoreErrorKind,
    store::each_alone,
};
use rusqlite::{
    Connection, DropBehavior, ErrorCode, OptionalExtension, TransactionBehavior, params,
};

use bq_dedupe::store::sql::{
    CLAIM, COMMIT_IF_FREE, COMMIT_OWN, EXPIRY_INDEX, FORGET, LIVE_ROW, RELEASE, REMEMBER, RENEW,
    SCHEMA, SEEN, STATE, live_record,
};

use crate::{StoreStats, new_token, ttl_ms};

/// A [`Store`] in a SQLite file: persistent, and shared by every process that
/// opens the same file (claims are atomic across them).
///
/// Opened in WAL mode with `synchronous=NORMAL`: a committed `remember` survives
/// the process being killed (`kill -9`); only a power loss or OS crash can drop the
/// last transactions. [`Self::with_full_sync`] closes that, at a sync per commit
/// (the setting is the connection's: one set on the file by another connection
/// does not reach the store's). Writers wait up to 5 s for each other
/// (`busy_timeout`) before reporting the store unavailable.
///
/// Expired rows read as absent at once; [`Self::purge_expired`] reclaims their
/// space.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    clock: Arc<dyn Clock>,
    /// Read by the connection's commit hook: while set (a transactional
    /// handler runs), every commit is turned into a rollback ([`no_commits`]).
    refuse_commits: Arc<AtomicBool>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// How this store's rows follow the record model: a lapsed claim's row
    /// stays its owner's until another consumer takes it over.
    pub const RULES: Rules = bq_dedupe::store::sql::RULES;

    /// [`Self::RULES`], as every store answers them ([`AnyStore::record_rules`](crate::AnyStore::record_rules)).
    pub fn record_rules(&self) -> Rules {
        Self::RULES
    }

    /// Opens (or creates) the store at `path`, creating missing parent folders.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::unavailable(format!("sqlite: creating {}: {e}", parent.display()))
            })?;
        }
        // A directory is a spec to fix, not a store to try again later (it
        // was "unable to open database file", store-unavailable: a trial).
        if path.is_dir() {
            return Err(StoreError::new(
                StoreErrorKind::Invalid,
                format!(
                    "sqlite: {} is a directory, not a database file",
                    path.display()
                ),
            ));
        }
        let mut conn = Connection::open(path).map_err(error)?;
        // Set first, so the pragmas below also wait for a concurrent opener.
        conn.busy_timeout(Duration::from_secs(5)).map_err(error)?;
        // Switching to WAL and creating the table can still answer "database is
        // locked" at once when other processes open the same new file (SQLite skips
        // the busy handler where waiting could deadlock): retry that, bounded.
        let mut wait = Duration::from_millis(2);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mode = loop {
            match set_up(&conn) {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(50));
                }
                other => break other.map_err(error)?,
            }
        };
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::internal(format!(
                "sqlite: {} cannot use WAL (journal_mode is {mode})",
                path.display()
            )));
        }
        let refuse_commits = Arc::new(AtomicBool::new(false));
        let refuse = refuse_commits.clone();
        conn.commit_hook(Some(move || refuse.load(Ordering::Relaxed)))
            .map_err(error)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            clock: Arc::new(SystemClock),
            refuse_commits,
        })
    }

    /// Commits are on the disk before they return (`synchronous=FULL`), so a
    /// power loss or OS crash drops none the store answered. In the
    /// exactly-once mode a commit dropped after its delivery was acked loses
    /// the effect and the id together, the message gone (a trial): use it there.
    pub fn with_full_sync(self) -> Result<Self, StoreError> {
        (self.lock()?)
            .pragma_update(None, "synchronous", "FULL")
            .map_err(error)?;
        Ok(self)
    }

    /// Reads time (expiry, leases) from `clock` instead of the system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Counts of live remembered ids, live claims and expired rows.
    pub fn stats(&self) -> StoreResult<StoreStats> {
        let now = self.now();
        let conn = self.lock()?;
        let (remembered, claimed, expired): (i64, i64, i64) = conn
            .query_row(
                // An id's fingerprint companions are rows too: not ids.
                "SELECT
                    COALESCE(SUM(state = 1 AND (expires_at IS NULL OR expires_at > ?1)), 0),
                    COALESCE(SUM(state = 0 AND (expires_at IS NULL OR expires_at > ?1)), 0),
                    COALESCE(SUM(expires_at IS NOT NULL AND expires_at <= ?1), 0)
                 FROM bq_dedupe WHERE substr(key, 1, length(?2)) <> ?2",
                rusqlite::params![now, bq_dedupe::fingerprint::COMPANION_PREFIX],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .map_err(error)?;
        Ok(StoreStats {
            remembered: remembered as u64,
            claimed: claimed as u64,
            expired: expired as u64,
        })
    }

    /// Deletes expired rows and says how many went: finished ids past their
    /// TTL, and claims that lapsed over [`crate::STALE_CLAIM`] ago (a crashed
    /// consumer's, whose id never came back). A claim that lapsed more recently
    /// stays: the rules keep it its owner's until another consumer takes it
    /// over. Optional: reads never see either.
    pub fn purge_expired(&self) -> StoreResult<u64> {
        let now = self.now();
        let stale = now.saturating_sub(crate::STALE_CLAIM.as_millis() as i64);
        let conn = self.lock()?;
        let n = conn
            .execute(
                "DELETE FROM bq_dedupe WHERE expires_at IS NOT NULL
                   AND ((state = 1 AND expires_at <= ?1) OR (state = 0 AND expires_at <= ?2))",
                [now, stale],
            )
            .map_err(error)?;
        Ok(n as u64)
    }

    fn now(&self) -> i64 {
        self.clock.now_ms().min(i64::MAX as u64) as i64
    }

    fn until(&self, ttl: Option<Duration>) -> Option<i64> {
        until(self.now(), ttl)
    }

    fn lock(&self) -> StoreResult<MutexGuard<'_, Connection>> {
        self.conn
            .lock()
            .map_err(|_| StoreError::internal("sqlite: connection lock poisoned by a panic"))
    }
}

/// Takes a claim on `key` inside the caller's write transaction, so the follow-up
/// read that tells `Seen` from `Held` sees the same row the insert did.
fn claim_in(conn: &Connection, key: &str, now: i64, lease_ms: u64) -> rusqlite::Result<Claim> {
    let token = new_token();
    let until = now.saturating_add(lease_ms as i64);
    let changed = conn
        .prepare_cached(CLAIM)?
        .execute(params![key, token.0, until, now])?;
    if changed == 1 {
        return Ok(Claim::Acquired(token));
    }
    // The row is live (an expired one would have been taken over).
    let state: Option<i64> = conn
        .prepare_cached(STATE)?
        .query_row([key], |row| row.get(0))
        .optional()?;
    Ok(match state {
        Some(1) => Claim::Seen,
        _ => Claim::Held,
    })
}

/// The fenced commit inside the caller's transaction: `true` if `token` still
/// owned the claim.
fn remember_fenced_in(
    conn: &Connection,
    key: &str,
    token: &ClaimToken,
    until: Option<i64>,
    now: i64,
) -> rusqlite::Result<bool> {
    let own = conn
        .prepare_cached(COMMIT_OWN)?
        .execute(params![key, token.0, until, now])?;
    if own == 1 {
        return Ok(true);
    }
    conn.prepare_cached(COMMIT_IF_FREE)?
        .execute(params![key, until, now])?;
    Ok(false)
}

fn renew_in(
    conn: &Connection,
    key: &str,
    token: &ClaimToken,
    until: i64,
) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(RENEW)?
        .execute(params![key, token.0, until])?;
    Ok(changed == 1)
}

fn remember_in(conn: &Connection, keys: &[&str], until: Option<i64>) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(REMEMBER)?;
    for key in keys {
        stmt.execute(params![key, until])?;
    }
    Ok(())
}

/// Busy, locked or I/O trouble may pass, so it is `Unavailable`; anything else
/// (a corrupt file, a bug) is `Internal`.
/// WAL, `synchronous=NORMAL` and the table: what every connection needs before its
/// first call. Answers the journal mode; a file that cannot use WAL is left
/// untouched. The table is created under `BEGIN IMMEDIATE`, so a concurrent creator
/// is waited for (the busy handler) instead of deadlocking a read-then-write upgrade;
/// found with its index, it is used as it is, without the write lock (another
/// consumer's long transaction would hold a restart up past the busy timeout).
fn set_up(conn: &Connection) -> rusqlite::Result<String> {
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
    if mode.eq_ignore_ascii_case("wal") {
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let made: i64 = conn.query_row(
            "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name = 'bq_dedupe'
                OR type = 'index' AND name = 'bq_dedupe_expires_at'",
            [],
            |row| row.get(0),
        )?;
        if made == 2 {
            return Ok(mode);
        }
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA} {EXPIRY_INDEX}; COMMIT;"
        ))
        .inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })?;
    }
    Ok(mode)
}

/// When a record written at `now` (ms) for `ttl` expires.
fn until(now: i64, ttl: Option<Duration>) -> Option<i64> {
    ttl.map(|d| now.saturating_add(ttl_ms(d) as i64))
}

/// A COMMIT refused for a constraint the transaction's writes broke (a
/// deferred foreign key).
fn broke_a_constraint(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(ErrorCode::ConstraintViolation)
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

fn error(e: rusqlite::Error) -> StoreError {
    let transient = matches!(
        e.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::SystemIoFailure
                | ErrorCode::CannotOpen
                | ErrorCode::DiskFull
                | ErrorCode::ReadOnly
                | ErrorCode::FileLockingProtocolFailed
        )
    );
    StoreError::backend(transient, format!("sqlite: {e}"))
}

impl Store for SqliteStore {
    async fn forget(&self, key: &str) -> StoreResult<()> {
        let conn = self.lock()?;
        let mut stmt = conn.prepare_cached(FORGET).map_err(error)?;
        stmt.execute([key]).map(drop).map_err(error)
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let mut conn = self.lock()?;
        let now = self.now();
        if let [key] = keys {
            // One read is one snapshot: no transaction needed.
            let mut stmt = conn.prepare_cached(SEEN).map_err(error)?;
            return Ok(vec![stmt.exists(params![key, now]).map_err(error)?]);
        }
        // One read transaction: every answer comes from the same snapshot.
        let tx = conn.transaction().map_err(error)?;
        let answers = {
            let mut stmt = tx.prepare_cached(SEEN).map_err(error)?;
            keys.iter()
                .map(|key| stmt.exists(params![key, now]))
                .collect::<rusqlite::Result<Vec<bool>>>()
                .map_err(error)?
        };
        tx.commit().map_err(error)?;
        Ok(answers)
    }

    /// Each key's live row, judged by the record model: done, free, or how
    /// long its claim has left (one snapshot).
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let mut conn = self.lock()?;
        let now = self.now();
        let tx = conn.transaction().map_err(error)?;
        let answers = {
            let mut stmt = tx.prepare_cached(LIVE_ROW).map_err(error)?;
            keys.iter()
                .map(|key| {
                    let row = stmt.query_row(params![key, now], |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, Option<String>>(1)?,
                            r.get::<_, Option<i64>>(2)?,
                        ))
                    });
                    let record = live_record(row.optional()?.map(|(state, token, until)| {
                        (state, token, until.map(|at| at.max(0) as u64))
                    }));
                    Ok(record.peeked(Some(now.max(0) as u64)))
                })
                .collect::<rusqlite::Result<Vec<Peeked>>>()
                .map_err(error)?
        };
        tx.commit().map_err(error)?;
        Ok(answers)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let mut conn = self.lock()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(error)?;
        let until = self.until(ttl);
        remember_in(&tx, keys, until).map_err(error)?;
        tx.commit().map_err(error)
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let lease_ms = ttl_ms(lease);
        let mut conn = self.lock()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(error)?;
        let now = self.now();
        let answers = keys
            .iter()
            .map(|key| claim_in(&tx, key, now, lease_ms))
            .collect::<rusqlite::Result<Vec<Claim>>>()
            .map_err(error)?;
        tx.commit().map_err(error)?;
        Ok(answers)
    }

    /// One write transaction: releases, renewals and (fenced) remembers are
    /// applied together or not at all.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let mut conn = self.lock()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(error)?;
        let now = self.now();
        let until = self.until(step.ttl);
        let lease_until = now.saturating_add(ttl_ms(step.lease) as i64);
        let mut settled = Settled::default();
        {
            let mut release = tx.prepare_cached(RELEASE).map_err(error)?;
            for (key, token) in step.release {
                release.execute(params![key, token.0]).map_err(error)?;
            }
        }
        for (key, token) in step.renew {
            settled
                .renewed
                .push(renew_in(&tx, key, token, lease_until).map_err(error)?);
        }
        for (key, token) in step.remember {
            settled.kept.push(match token {
                Some(token) => remember_fenced_in(&tx, key, token, until, now).map_err(error)?,
                None => remember_in(&tx, &[key], until)
                    .map(|()| true)
                    .map_err(error)?,
            });
        }
        tx.commit().map_err(error)?;
        Ok(settled)
    }
}

/// What keeps a transactional run from starting: the key is done and live, or
/// a live claim holds it; `None`: free.
fn taken<T, E>(conn: &Connection, key: &str, now: i64) -> rusqlite::Result<Option<TxRun<T, E>>> {
    let state: Option<i64> = conn
        .query_row(LIVE_ROW, params![key, now], |row| row.get(0))
        .optional()?;
    Ok(state.map(|state| match state {
        1 => TxRun::AlreadyDone,
        _ => TxRun::Held,
    }))
}

/// Whether the work left its transaction alive. An error SQLite answers by
/// rolling the whole transaction back (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`, a
/// full disk) leaves the connection in autocommit; a work that swallowed it and
/// returned `Ok` must not have the key recorded (it would be written alone, in
/// autocommit, and the redelivery skipped).
fn still_open(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    if tx.is_autocommit() {
        return Err(StoreError::internal(
            "sqlite: the handler returned Ok, but a statement in its transaction had failed \
             and rolled the transaction back (an error the handler ignored); nothing was \
             committed (to go on after an expected error, use INSERT OR IGNORE or ON \
             CONFLICT DO NOTHING, or a SAVEPOINT of your own, not OR ROLLBACK)",
        ));
    }
    Ok(())
}

/// The connection writable again after a handler, which may have set
/// `PRAGMA query_only` for its own reads: the store's record, and every later
/// call of the store's one connection, failed "attempt to write a readonly
/// database" (`store-unavailable`) until the process restarted (a user's
/// trial).
fn writable_again(tx: &rusqlite::Transaction<'_>) -> StoreResult<()> {
    tx.pragma_update(None, "query_only", false).map_err(error)
}

/// Whether the work made something on its connection that changes what the
/// store's statements do to its id table: a TEMP table or view named as it
/// (names match without case), which hides `bq_dedupe` from every statement
/// of the connection, or a TEMP trigger on it. The run is refused; its
/// rollback takes them with it. (A lasting trigger of the file's own, a
/// counting one, is left alone: an id one deletes is found by [`recorded`].)
fn no_shadow(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    let shadowed = tx
        .query_row(
            "SELECT 1 FROM temp.sqlite_master
               WHERE name = 'bq_dedupe' COLLATE NOCASE OR tbl_name = 'bq_dedupe' COLLATE NOCASE
             LIMIT 1",
            [],
            |_| Ok(()),
        )
        .optional()
        .map_err(error)?;
    match shadowed {
        None => Ok(()),
        Some(()) => Err(StoreError::internal(
            "sqlite: the handler made a TEMP table or view named bq_dedupe, or a TEMP trigger \
             on it, which changes the store's id table; nothing of this run is committed \
             (leave the id table to the store)",
        )),
    }
}

/// Whether `key` is recorded done and live at `now` (the store just wrote it;
/// a handler's own writes to the id table may have deleted or expired it).
fn recorded(tx: &rusqlite::Transaction<'_>, key: &str, now: i64) -> StoreResult<bool> {
    (tx.prepare_cached(SEEN)
        .and_then(|mut seen| seen.exists(params![key, now])))
    .map_err(error)
}

/// An id the store recorded and then found gone before the commit.
fn unrecorded() -> StoreError {
    StoreError::internal(
        "sqlite: an id the store had recorded in bq_dedupe was gone before the commit (a \
         handler's write, or a trigger's); nothing was committed (leave the id table to the \
         store)",
    )
}

/// A work that ended the store's transaction and began another.
fn began_another() -> StoreError {
    StoreError::internal(
        "sqlite: the handler ended the store's transaction (its own ROLLBACK, or a COMMIT, \
         which is refused) and began another: the id's check was undone with it, and the \
         write lock was free in between, so another consumer may have run it; nothing of \
         this run is committed (leave the transaction to the store)",
    )
}

/// Runs `work` with every commit on the connection refused (its commit hook
/// turns them into rollbacks): a handler whose transaction an error rolled
/// back, and that carries on, would otherwise have its later writes committed
/// one by one in autocommit, and again on the redelivery. [`still_open`] then
/// finds the transaction gone.
fn no_commits<T, R>(refuse: &AtomicBool, tx: &mut T, work: impl FnOnce(&mut T) -> R) -> R {
    refuse.store(true, Ordering::Relaxed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(tx)));
    refuse.store(false, Ordering::Relaxed);
    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The transactional mode on SQLite: the handler gets the write transaction
/// (`BEGIN IMMEDIATE`, so the read of the key and the commit cannot interleave
/// with another writer's) and writes its own tables in the same file; the key is
/// recorded in `bq_dedupe` before the commit. The handler must not use this
/// store itself (its connection is the transaction's). Time is read once the
/// write lock is held, and the key's expiry counted from the end of the work.
impl TransactionalStore for SqliteStore {
    type Tx<'t> = rusqlite::Transaction<'t>;

    fn transaction<T, E>(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        work: impl FnOnce(&mut rusqlite::Transaction<'_>) -> Result<T, E>,
    ) -> StoreResult<TxRun<T, E>> {
        let mut conn = self.lock()?;
        let mut tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(error)?;
        if let Some(key) = key
            && let Some(taken) = taken(&tx, key, self.now()).map_err(error)?
        {
            return Ok(taken);
        }
        // Gone after the work if the handler ended the transaction and began
        // one of its own: still open, but not the one the key was read in.
        let savepoint = crate::savepoint_for(&new_token());
        tx.execute_batch(&format!("SAVEPOINT {savepoint}"))
            .map_err(error)?;
        let result = no_commits(&self.refuse_commits, &mut tx, work);
        // Whatever the handler set: a run not committed below is rolled back.
        tx.set_drop_behavior(DropBehavior::Rollback);
        writable_again(&tx)?;
        match result {
            Ok(value) => {
                if let Err(e) = still_open(&tx).and_then(|()| no_shadow(&tx)) {
                    return Ok(TxRun::Aborted(e));
                }
                if tx.execute_batch(&format!("RELEASE {savepoint}")).is_err() {
                    return Ok(TxRun::Aborted(began_another()));
                }
                if let Some(key) = key {
                    // One reading of the time for its expiry and the check.
                    let now = self.now();
                    remember_in(&tx, &[key], until(now, ttl)).map_err(error)?;
                    if !recorded(&tx, key, now)? {
                        return Ok(TxRun::Aborted(unrecorded()));
                    }
                }
                match tx.commit() {
                    Ok(()) => Ok(TxRun::Committed(value)),
                    // A deferred constraint the work's writes broke: refused,
                    // rolled back (on drop), the work's failure.
                    Err(e) if broke_a_constraint(&e) => {
                        Ok(TxRun::Aborted(crate::refused_at_commit(error(e))))
                    }
                    Err(e) => Err(error(e)),
                }
            }
            // Dropping the transaction rolls it back.
            Err(e) => Ok(TxRun::RolledBack(e)),
        }
    }

    /// A work that ends the transaction (see [`still_open`]), or ends it and
    /// begins another (its savepoint then gone), takes the earlier entries'
    /// uncommitted writes with it: it is that entry's failure, and the
    /// batch starts again in a new transaction without it, so the entries
    /// before it run again (their first writes were rolled back) instead of
    /// failing beside it on every redelivery. Each new start leaves out one
    /// more entry, so a batch runs at most once per entry that ended it, plus
    /// one.
    fn transaction_batch<E>(
        &self,
        keys: &[Option<&str>],
        ttl: Option<Duration>,
        mut work: impl FnMut(usize, &mut rusqlite::Transaction<'_>) -> Result<(), E>,
    ) -> StoreResult<Vec<TxRun<(), E>>> {
        let mut conn = self.lock()?;
        // The entries that ended a transaction, with how they ended.
        let mut ended: Vec<Option<TxRun<(), E>>> = keys.iter().map(|_| None).collect();
        let savepoint = crate::savepoint_for(&new_token());
        'batch: loop {
            let mut tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(error)?;
            let mut runs = Vec::with_capacity(keys.len());
            // The ids whose runs succeeded, recorded after the last handler.
            let mut succeeded: Vec<&str> = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                if ended[i].is_some() {
                    continue;
                }
                if let Some(key) = key {
                    // A repeat of an id this batch ran: done, its record to come.
                    let found = match succeeded.contains(key) {
                        true => Some(TxRun::AlreadyDone),
                        false => taken(&tx, key, self.now()).map_err(error)?,
                    };
                    if let Some(found) = found {
                        runs.push((i, found));
                        continue;
                    }
                }
                tx.execute_batch(&format!("SAVEPOINT {savepoint}"))
                    .map_err(error)?;
                let result = no_commits(&self.refuse_commits, &mut tx, |tx| work(i, tx));
                // Whatever the handler set: a batch not committed below is rolled back.
                tx.set_drop_behavior(DropBehavior::Rollback);
                writable_again(&tx)?;
                let ended_with = |result: Result<(), E>, why: StoreError| match result {
                    Ok(()) => TxRun::Aborted(why),
                    Err(e) => TxRun::RolledBack(e),
                };
                if let Err(aborted) = still_open(&tx).and_then(|()| no_shadow(&tx)) {
                    ended[i] = Some(ended_with(result, aborted));
                    continue 'batch; // `tx` is dropped: rolled back
                }
                let close = match result {
                    Ok(()) => format!("RELEASE {savepoint}"),
                    Err(_) => format!("ROLLBACK TO {savepoint}; RELEASE {savepoint}"),
                };
                if tx.execute_batch(&close).is_err() {
                    // Its savepoint is gone: the handler ended the transaction
                    // and began another (the single run's `began_another`).
                    ended[i] = Some(ended_with(result, began_another()));
                    continue 'batch;
                }
                match result {
                    Ok(()) => {
                        succeeded.extend(key);
                        runs.push((i, TxRun::Committed(())));
                    }
                    Err(e) => runs.push((i, TxRun::RolledBack(e))),
                }
            }
            // Recorded after the last handler, as PostgreSQL counts its
            // expiry: no handler can delete or expire one before the commit,
            // and each TTL counts from the commit (a batch slower than its
            // TTL would commit its first ids expired, to run again). A
            // trigger's undoing is still found.
            let now = self.now();
            remember_in(&tx, &succeeded, until(now, ttl)).map_err(error)?;
            for key in &succeeded {
                if !recorded(&tx, key, now)? {
                    return Err(unrecorded());
                }
            }
            match tx.commit() {
                Ok(()) => {}
                // An entry's writes broke a deferred constraint: nothing
                // committed; each runs again alone, that one refused.
                Err(e) if broke_a_constraint(&e) => {
                    drop(conn);
                    return each_alone(self, keys, ttl, ended, work);
                }
                Err(e) => return Err(error(e)),
            }
            for (i, run) in runs {
                ended[i] = Some(run);
            }
            return Ok(ended
                .into_iter()
                .map(|run| run.unwrap_or_else(|| TxRun::Aborted(StoreError::internal("no run"))))
                .collect());
        }
    }
}

/// Opens `sqlite:PATH` (for a command that only reads or deletes, `existing`:
/// a missing file is an error, not a new empty store). A URL form
/// (`sqlite://...`, or SQLite's own `file:` URI, whose file was not the one
/// checked for) is refused: other tools read it otherwise
/// (`sqlite:///a.db` is relative to SQLAlchemy, `sqlite://data/a.db` was
/// `/data/a.db` here), and another file is another store, whose ids run again.
pub(crate) fn open_spec(spec: &str, existing: bool) -> Result<SqliteStore, StoreError> {
    match &spec["sqlite:".len()..] {
        "" => Err(crate::invalid("store spec sqlite:PATH needs a path")),
        path if path.starts_with("//") || path.starts_with("file:") => {
            Err(crate::invalid(format!(
                "store spec {spec:?}: write sqlite:PATH (sqlite:/abs/seen.db or \
             sqlite:rel/seen.db), not a URL: sqlite:// and file: forms are read \
             differently by other tools"
            )))
        }
        path if existing && !Path::new(path).exists() => Err(crate::invalid(format!(
            "no store at {path}: no such SQLite file (`bq-dedupe run` creates one)"
        ))),
        path => SqliteStore::open(path),
    }
}
