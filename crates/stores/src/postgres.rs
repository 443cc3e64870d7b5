//! [`PostgresStore`]: remembered ids in the Go SDK's table, claims in a table of
//! their own. The record formats are in `docs/stores.md`.

use bq_dedupe::store::record::Rules;
use bq_dedupe::store::{TransactionalStore, TxRun, each_alone};
use std::collections::HashSet;
use std::time::Duration;

use bq_dedupe::{
    Store, StoreError, StoreResult, store::Capabilities, store::Claim, store::ClaimToken,
    store::Peeked, store::Settled, store::Settlement, store::StoreErrorKind,
};
use postgres::Config;
use postgres::config::Host;
use postgres::types::{ToSql, Type};
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::r2d2::{ManageConnection, Pool, PooledConnection};
use tokio_postgres_rustls::MakeRustlsConnect;

mod blocking;
mod charset;
mod open;
pub(crate) use open::split_table;
use open::{StatementCache, causes};
mod session;
mod transaction;
use blocking::{off_multi_thread_runtime, off_runtime};
use session::{
    Bound, Manager, Params, Prepared, Session, array_literal, first_row, is_stale, literal,
    optional_array_literal, optional_literal,
};
use transaction::on_notice;

use crate::invalid;
use crate::tls::{client_config, postgres_tls};
use crate::{StoreStats, new_token, take_params, ttl_ms};
use charset::Charset;

/// The Go SDK's table name, the default of `?table=`.
pub const DEFAULT_POSTGRES_TABLE: &str = "babelqueue_idempotency";

/// Connect timeout, and how long a call waits for a pooled connection.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Connections per store: a consumer makes one call at a time, a few spare let a
/// shared store (`Arc`) serve several threads.
const POOL_SIZE: u32 = 4;

/// A live remembered row (Go's `seen`): no expiry, or one in the future.
const LIVE: &str = "(expires_at IS NULL OR expires_at > now())";

/// Sets the session's `client_encoding` back to the client's (the driver
/// starts every session in UTF-8), for the session once its transaction commits.
const UTF8_AGAIN: &str = "pg_catalog.set_config('client_encoding', 'UTF8', false)";

/// [`LIVE`] where rows are looked up by key, written so that the `expires_at`
/// index cannot serve it: the key's index always does. With statistics from when
/// the table was small (a new table filling fast, before autovacuum's analyze)
/// the planner read every live row through the `expires_at` index and filtered
/// them by key: 2.5 ms a call for 100 keys in a table of 3,000 rows.
const LIVE_KEY: &str = "coalesce(expires_at, 'infinity') > now()";

/// Go's remember, after an `INSERT INTO table AS cur`: a live row stays as it
/// is, an expired one is written afresh (`created_at` too).
const GO_UPSERT: &str = "ON CONFLICT (message_id) DO UPDATE
    SET created_at = now(), expires_at = EXCLUDED.expires_at
    WHERE cur.expires_at IS NOT NULL AND cur.expires_at <= now()";

/// How a transactional run's mark (its claims row) is told from a claim: its
/// token starts with this.
const MARK_PREFIX: &str = "tx:";

/// A remembered row's expiry from the TTL parameter `param` (ms; `NULL`: never).
fn expiry(param: &str) -> String {
    format!(
        "CASE WHEN {param}::bigint IS NULL THEN NULL ELSE now() + {} END",
        interval_ms(param)
    )
}

/// The interval of `param` milliseconds. pg_catalog's operator is named: it
/// has `float8 * interval`, so a `bigint * interval` another role made in a
/// schema on the `search_path` would be the better match and run as the
/// store's user (the CVE-2018-1058 class). Every operator or function in the
/// store's SQL whose arguments pg_catalog matches only by a cast is named so.
fn interval_ms(param: &str) -> String {
    format!("({param}::bigint OPERATOR(pg_catalog.*) interval '1 millisecond')")
}

/// A [`Store`] on PostgreSQL, sharing its seen-set with the Go SDK's Postgres store.
///
/// - Remembered ids are rows of `TABLE` (default [`DEFAULT_POSTGRES_TABLE`]) in
///   Go's schema (`message_id`, `created_at`, `expires_at`), written with Go's
///   statement, so a Go consumer and this store read and write one set.
/// - In-flight claims (owner token, lease expiry) live in `TABLE_claims`, which
///   the Go store never reads: a Go consumer only ever sees committed rows.
/// - A commit inserts the row and drops the claim in one statement (one
///   transaction). `seen_many`, `settle` and `claim_many` are one round trip
///   each; `claim_many` sends two statements together: the claim, then a
///   re-check of the claimed keys on a fresh snapshot (a commit that landed
///   while the claim was being taken is seen there, and the claim given back:
///   `Seen`).
///
/// Connections come from an `r2d2` pool (up to 4), over TLS as the URL's
/// `sslmode` asks ([`PostgresStore::connect`]); each prepares the store's
/// statements once, unless the URL says `statement_cache=off` (for a pooler
/// that does not keep prepared statements per client; see `docs/stores.md`),
/// and with `statement_cache=generic` plans them once, too.
pub struct PostgresStore {
    /// Taken only by `drop`.
    pool: Option<Pool<Manager>>,
    /// Makes a connection outside the pool ([`PostgresStore::on_another`]).
    direct: std::sync::Arc<PostgresConnectionManager<MakeRustlsConnect>>,
    table: String,
    claims: String,
    notes: Vec<String>,
    /// Which ids the database's encoding holds as text.
    charset: Charset,
    /// Takes a handler's own COMMIT may have kept whose undo failed on every
    /// connection (keys, mark, writer): tried again before this store's next
    /// transactional run, so a redelivery in this process runs rather than
    /// being skipped ([`transaction`](crate::postgres::transaction)).
    pending_undos: std::sync::Mutex<Vec<PendingUndo>>,
}

/// An undo to try again: the keys, the run's mark, the take's writer.
type PendingUndo = (Vec<String>, String, transaction::Writer);

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("PostgresStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// Closing a connection blocks on the client's runtime: off tokio's, too.
impl Drop for PostgresStore {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            off_runtime(move || drop(pool));
        }
    }
}

/// Names of ids the table cannot hold as they are.
const HASHED_PREFIX: &str = "bq-dedupe:sha256:";

/// Longest id stored as itself: a `text` primary key's index entry must fit
/// PostgreSQL's B-tree row limit (2,704 bytes, after compression, which an
/// incompressible id does not get) with its 12 bytes of headers, so every id
/// up to this length is stored as the Go SDK stores it (measured on 15: an
/// incompressible 2,692-byte id is indexed, 2,693 bytes are refused).
const MAX_KEY_BYTES: usize = 2692;

/// The `message_id` an id is stored under. An id PostgreSQL cannot hold as text
/// (with U+0000, or beyond what the database's encoding holds: `size` is its
/// bytes there, `None` if not held) or index (longer than [`MAX_KEY_BYTES`],
/// in UTF-8 or there), or one that looks like a hashed name, is
/// named by its SHA-256 (as the Workers KV store does), so it is that
/// delivery's own record and never fails a statement holding its neighbours.
/// (A Go consumer stores some of these as themselves: see docs/stores.md.)
fn stored(
    key: &str,
    size: impl FnOnce(&str) -> StoreResult<Option<usize>>,
) -> StoreResult<std::borrow::Cow<'_, str>> {
    let fits = key.len() <= MAX_KEY_BYTES && !key.contains('\0') && !key.starts_with(HASHED_PREFIX);
    if fits && size(key)?.is_some_and(|bytes| bytes <= MAX_KEY_BYTES) {
        return Ok(std::borrow::Cow::Borrowed(key));
    }
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    let mut name = String::with_capacity(HASHED_PREFIX.len() + 64);
    name.push_str(HASHED_PREFIX);
    for byte in Sha256::digest(key.as_bytes()) {
        let _ = write!(name, "{byte:02x}");
    }
    Ok(std::borrow::Cow::Owned(name))
}

/// A settlement's `(id, token)` pairs under their stored names (`names`, made
/// by [`PostgresStore::names`] from the same pairs).
fn renamed<'a, T: Copy>(
    names: &'a [std::borrow::Cow<'_, str>],
    pairs: &[(&str, T)],
) -> Vec<(&'a str, T)> {
    names
        .iter()
        .zip(pairs)
        .map(|(name, (_, token))| (name.as_ref(), *token))
        .collect()
}

/// The connection is gone: closed, or the server ended the session (admin
/// shutdown, crash, a failover: SQLSTATE 57P01..57P03, class 08).
fn connection_lost(e: &postgres::Error) -> bool {
    e.is_closed()
        || e.code()
            .is_some_and(|c| c.code().starts_with("57P") || c.code().starts_with("08"))
}

/// The server ended the call's transaction to break a deadlock (40P01):
/// nothing of that transaction took effect (of the claims' two, sent as one
/// query, the first may have committed: sent again, it takes its own claim
/// again), and a second try usually gets through (a batch
/// that locks rows in one order meets another statement locking them in its
/// plan's order).
fn deadlocked(e: &postgres::Error) -> bool {
    e.code().is_some_and(|c| c.code() == "40P01")
}

/// Connection trouble, a server shutting down, a serialization failure or a
/// deadlock may pass (`Unavailable`); anything else is `Internal`.
fn error(e: postgres::Error) -> StoreError {
    let transient = e.is_closed()
        || e.code().is_some_and(|c| {
            let c = c.code();
            c.starts_with("08")
                || c.starts_with("57P")
                // statement_timeout, lock_timeout: the call did not get through.
                || c == "57014"
                || c == "55P03"
                || c == "40001"
                || c == "40P01"
                || c == "53300"
        })
        || e.as_db_error().is_none();
    // A db error's own text (severity, SQLSTATE, message); never the config.
    let message = match e.as_db_error() {
        Some(db) => format!(
            "postgres: {} {}: {}",
            db.severity(),
            db.code().code(),
            db.message()
        ),
        None => format!("postgres: {e}"),
    };
    // No transaction, or no savepoint, where the store had opened one.
    let ended = e
        .code()
        .is_some_and(|c| matches!(c.code(), "25P01" | "3B001"));
    let message = if ended {
        format!(
            "{message} (did the handler end the store's transaction with its own COMMIT or \
             ROLLBACK? What it committed stays committed; leave the transaction to the store)"
        )
    } else {
        message
    };
    StoreError::backend(transient, message)
}

/// A TTL or lease as a `bigint` of milliseconds (`None`: no expiry).
fn ms(d: Option<Duration>) -> Option<i64> {
    d.map(|d| ttl_ms(d) as i64)
}

impl PostgresStore {
    /// How this store's rows follow the record model: a lapsed claim's row in
    /// `TABLE_claims` stays its owner's until another consumer takes it over.
    pub const RULES: Rules = Rules {
        lapsed_claim_kept: true,
        done_keeps_token: false,
        claims_have_owners: true,
        remember_resets_expiry: false,
        lapsed_claim_swept: false,
        claim_given_back: true,
    };

    /// [`Self::RULES`], as every store answers them ([`AnyStore::record_rules`](crate::AnyStore::record_rules)).
    pub fn record_rules(&self) -> Rules {
        Self::RULES
    }

    /// The name `key` is stored under ([`stored`]). In a database neither
    /// UTF8 nor LATIN1, a character beyond ASCII not seen before is bound
    /// alone to see whether the server takes it, once (a round trip each).
    fn name<'k>(&self, key: &'k str) -> StoreResult<std::borrow::Cow<'k, str>> {
        stored(key, |key| {
            if let Err(unknown) = self.charset.holds(key) {
                for c in unknown {
                    self.charset
                        .learn(c, self.takes(c.encode_utf8(&mut [0; 4]))?);
                }
            }
            Ok(self.charset.holds(key).ok().flatten())
        })
    }

    /// [`Self::name`] for each of `keys`, in order.
    fn names<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> StoreResult<Vec<std::borrow::Cow<'k, str>>> {
        keys.into_iter().map(|key| self.name(key)).collect()
    }

    /// Whether the database holds `text` as itself: taken in, and given back
    /// the same (refused either way: 22P05, or 22021), and in how many bytes.
    fn takes(&self, text: &str) -> StoreResult<Option<usize>> {
        use postgres::error::SqlState;
        self.run(|conn| {
            let sql = "SELECT $1::text, octet_length($1::text)";
            match (conn.client()).query_typed_one(sql, &[(&text, Type::TEXT)]) {
                Ok(row) => Ok((row.get::<_, String>(0) == text)
                    .then(|| usize::try_from(row.get::<_, i32>(1)).unwrap_or(usize::MAX))),
                Err(e)
                    if e.code() == Some(&SqlState::UNTRANSLATABLE_CHARACTER)
                        || e.code() == Some(&SqlState::CHARACTER_NOT_IN_REPERTOIRE) =>
                {
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        })
    }

    /// What a host should say once on start-up: what the connection's TLS
    /// mode leaves unchecked, when it does not authenticate the server
    /// (`prefer`, the default; `allow`; `require` without `sslrootcert`;
    /// `disable`), and a timeout left to a server that sets none.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The table of remembered ids (Go's), with its schema; claims are in
    /// `TABLE_claims`.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn conn(&self) -> StoreResult<PooledConnection<Manager>> {
        (self.pool.as_ref())
            .ok_or_else(|| StoreError::internal("postgres: the store is closed"))?
            .get()
            .map_err(|e| StoreError::unavailable(format!("postgres: no connection: {e}")))
    }

    /// Runs `op` on a pooled connection; a connection found closed (the server
    /// restarted, the network dropped it) is discarded and `op` retried once on a
    /// fresh one, and so is a call whose prepared statement the server no longer
    /// has, or that a deadlock ended. Every operation sent through here is safe
    /// to repeat: a repeated claim carries the same tokens, so it takes its own
    /// first claim again, and a repeated commit answers `false` (lost), on the
    /// safe side. `forget` is not: it has its own loop.
    fn run<T: Send>(
        &self,
        op: impl Fn(&mut Session) -> Result<T, postgres::Error> + Send,
    ) -> StoreResult<T> {
        off_runtime(|| self.run_here(op))
    }

    fn run_here<T>(
        &self,
        op: impl Fn(&mut Session) -> Result<T, postgres::Error>,
    ) -> StoreResult<T> {
        // Each idle connection in the pool may be one the server dropped.
        let mut attempts = POOL_SIZE + 1;
        loop {
            let mut conn = self.conn()?;
            match op(&mut conn) {
                Err(e)
                    if attempts > 1
                        && (connection_lost(&e)
                            || conn.client().is_closed()
                            || is_stale(&e)
                            || deadlocked(&e)) =>
                {
                    attempts -= 1;
                }
                result => return result.map_err(error),
            }
        }
    }

    /// Runs `body` in a transaction on a pooled connection; one the server
    /// dropped while it was idle fails its `BEGIN` (nothing done yet), and is
    /// discarded for another, as [`Self::run`] does.
    fn in_transaction<R>(
        &self,
        body: impl FnOnce(postgres::Transaction<'_>, &mut Prepared) -> StoreResult<R>,
    ) -> StoreResult<R> {
        off_multi_thread_runtime(|| {
            let mut attempts = POOL_SIZE + 1;
            loop {
                let mut conn = self.conn()?;
                let e = match conn.transaction() {
                    Ok((tx, prepared)) => {
                        let run = body(tx, &mut *prepared);
                        if run.is_err() {
                            // What the handler did to the session is unknown
                            // (its own COMMIT of a SET, say): not lent again.
                            prepared.retire();
                        }
                        return run;
                    }
                    Err(e) => e,
                };
                if attempts > 1 && (connection_lost(&e) || conn.client().is_closed()) {
                    attempts -= 1;
                } else {
                    return Err(error(e));
                }
            }
        })
    }

    /// [`Store::forget`]'s transaction, tried again only where nothing of it
    /// took effect.
    fn forget_here(&self, claim: &str, row: &str, key: &str) -> StoreResult<()> {
        let mut attempts = POOL_SIZE + 1;
        loop {
            let mut conn = self.conn()?;
            let begun = (conn.client().build_transaction())
                .isolation_level(postgres::IsolationLevel::ReadCommitted);
            let (e, at_begin) = match begun.start() {
                Ok(mut tx) => {
                    match (tx.execute(claim, &[&key])).and_then(|_| tx.execute(row, &[&key])) {
                        Ok(_) => return tx.commit().map_err(error),
                        Err(e) => (e, false),
                    }
                }
                Err(e) => (e, true),
            };
            // A deadlock's transaction the server ended: nothing of it is left.
            let undone =
                deadlocked(&e) || (at_begin && (connection_lost(&e) || conn.client().is_closed()));
            attempts -= 1;
            if !undone || attempts == 0 {
                return Err(error(e));
            }
        }
    }

    /// Live remembered ids and claims, and the expired rows still stored.
    pub fn stats(&self) -> StoreResult<StoreStats> {
        let (t, c) = (&self.table, &self.claims);
        let sql = format!(
            "SELECT (SELECT count(*) FROM {t} WHERE {LIVE}),
                    (SELECT count(*) FROM {c} WHERE expires_at > now()),
                    (SELECT count(*) FROM {t} WHERE NOT {LIVE})
                  + (SELECT count(*) FROM {c} WHERE expires_at <= now())"
        );
        // Unnamed: safe behind a transaction-mode pooler, whatever the cache.
        let row = self.run(|c| c.client().query_typed_one(&sql, &[]))?;
        let n = |i: usize| row.get::<_, i64>(i).max(0) as u64;
        Ok(StoreStats {
            remembered: n(0),
            claimed: n(1),
            expired: n(2),
        })
    }

    /// Deletes expired rows (Go's optional GC) and claims that lapsed over
    /// [`crate::STALE_CLAIM`] ago; how many went. A claim that lapsed more
    /// recently stays its owner's, as the rules of SQL rows say.
    pub fn purge_expired(&self) -> StoreResult<u64> {
        let (t, c) = (&self.table, &self.claims);
        let ms1 = interval_ms("$1");
        let sql = format!(
            "WITH a AS (DELETE FROM {t} WHERE NOT {LIVE} RETURNING 1),
                  b AS (DELETE FROM {c} WHERE expires_at <= now() - {ms1}
                        RETURNING 1)
             SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b)"
        );
        let stale = crate::STALE_CLAIM.as_millis() as i64;
        // A large backlog may take longer than the session's statement_timeout:
        // the purge alone runs without one (it takes no lock a call waits on
        // for long: rows, not the table).
        off_runtime(|| self.purge_here(&sql, stale))
    }

    fn purge_here(&self, sql: &str, stale: i64) -> StoreResult<u64> {
        self.in_transaction(|mut tx, _| {
            let row = tx
                .batch_execute("SET LOCAL statement_timeout = 0")
                .and_then(|()| tx.query_typed_one(sql, &[(&stale, Type::INT8)]))
                .map_err(error)?;
            tx.commit().map_err(error)?;
            Ok(row.get::<_, i64>(0).max(0) as u64)
        })
    }

    /// Go's remember, for every key given (deduplicated: one `INSERT` may not
    /// touch a row twice), ending any claim on them; one statement.
    fn remember_keys(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let step = Settlement {
            remember: &keys.iter().map(|k| (*k, None)).collect::<Vec<_>>(),
            ttl,
            ..Settlement::default()
        };
        self.settle_now(&step).map(|_| ())
    }

    /// One plain remember (a seen-set delivery's commit): the statement below
    /// for one key, as the Go SDK's upsert is (prepared, so the server plans
    /// it once per connection), then [`Self::end_claims_sql`], in one round
    /// trip. Any claim on the key ends first (claims, then the id: the lock
    /// order of every other statement here; `own` is read before the insert
    /// so it is).
    fn remember_one(&self, key: &str, ttl: Option<Duration>) -> StoreResult<Settled> {
        let key = literal(&self.name(key)?);
        let ttl = ms(ttl).map_or_else(|| "NULL".to_string(), |ms| ms.to_string());
        let (t, c) = (&self.table, &self.claims);
        let remember = format!(
            "WITH own AS (DELETE FROM {c} WHERE message_id = $1 RETURNING 1)
             INSERT INTO {t} AS cur (message_id, expires_at)
             SELECT $1, {} FROM (SELECT count(*) FROM own) o
             {GO_UPSERT}",
            expiry("$2")
        );
        let end_claims = self.end_claims_sql("= $1::text");
        self.run(|conn| {
            conn.query_together(&[
                Bound {
                    sql: &remember,
                    types: "text, bigint",
                    values: &[&key, &ttl],
                },
                Bound {
                    sql: &end_claims,
                    types: "text",
                    values: &[&key],
                },
            ])
        })?;
        Ok(Settled {
            kept: vec![true],
            ..Settled::default()
        })
    }

    /// After a remember of the ids `$1` (`is_key`: `= $1::text` or
    /// `= ANY($1::text[])`), on a snapshot of its own: the claims on them that
    /// stand beside their live rows end. The remember's own delete of claims
    /// read the snapshot it started with, so a claim committed while it ran
    /// (waiting on another session's insert of the id) stood beside the row,
    /// and once the row expired or was forgotten that claim renewed and
    /// committed as kept: a second run reported clean. A claim committed
    /// after this statement began found the row (its second statement gives
    /// it back). A transactional run's mark is left to its run.
    ///
    /// The row is judged live at `clock_timestamp()`, read after the
    /// statement's snapshot, not at `now()` (its transaction's start): a claim
    /// taken, once the row had expired, between the two would be in the
    /// snapshot beside a row still live at `now()`, and ended with no remember
    /// after it (the history checker, seed 14260565842589684616). Live at a
    /// later instant, the row was written after any claim the snapshot holds,
    /// so a remember did end it.
    fn end_claims_sql(&self, is_key: &str) -> String {
        let (t, c) = (&self.table, &self.claims);
        format!(
            "DELETE FROM {c} WHERE message_id {is_key} AND token NOT LIKE '{MARK_PREFIX}%'
               AND EXISTS (SELECT 1 FROM {t} WHERE {t}.message_id = {c}.message_id
                             AND coalesce(expires_at, 'infinity') > clock_timestamp())"
        )
    }

    /// The whole settlement in one statement (an implicit transaction):
    /// releases, renewals, and the remembers (own claims dropped and their rows
    /// inserted; a lost claim's row inserted only if no other live claim holds
    /// the key; Go's `ON CONFLICT` keeps a live row as it is).
    ///
    /// "No other live claim" is decided on locked rows, never on the
    /// statement's snapshot: a claim committed after the snapshot was taken
    /// would not be in it, and the key would end both done and claimed. A
    /// lost claim's key whose claims row is gone or lapsed gets a lapsed row
    /// (`free`, a token no claim has) and is remembered; a claim racing it
    /// waits on that row and then finds the key done (its second statement).
    /// (Not a key this settlement also releases or renews: one statement
    /// cannot change a row twice. Such a lost commit is not remembered.)
    ///
    /// A fenced remember is kept only if its row was written here: a live row
    /// already there was remembered by someone else while the claim was held
    /// (a plain remember that waited on another session's insert misses a
    /// claim taken meanwhile), so this run was a second one, reported lost.
    fn settle_now(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        if step.remember.is_empty() && step.release.is_empty() && step.renew.is_empty() {
            return Ok(Settled::default());
        }
        // One plain key, however often given, and nothing else: the statement
        // whose lock order (claim, then id) is written, not left to a plan.
        if let ([(key, None), rest @ ..], [], []) = (step.remember, step.release, step.renew)
            && rest.iter().all(|(k, t)| k == key && t.is_none())
        {
            let settled = self.remember_one(key, step.ttl)?;
            return Ok(Settled {
                kept: vec![true; step.remember.len()],
                ..settled
            });
        }
        let rem_names = self.names(step.remember.iter().map(|(k, _)| *k))?;
        let rel_names = self.names(step.release.iter().map(|(k, _)| *k))?;
        let ren_names = self.names(step.renew.iter().map(|(k, _)| *k))?;
        let step = &Settlement {
            remember: &renamed(&rem_names, step.remember),
            release: &renamed(&rel_names, step.release),
            renew: &renamed(&ren_names, step.renew),
            ttl: step.ttl,
            lease: step.lease,
        };
        // One row per remembered key (a fenced entry wins over a plain one of the
        // same key: it carries the token the answer is about).
        let mut seen_keys = HashSet::new();
        let mut rem: Vec<(&str, Option<&str>)> = Vec::new();
        for (key, token) in step.remember.iter().filter(|(_, t)| t.is_some()) {
            if seen_keys.insert(*key) {
                rem.push((key, token.map(|t| t.0.as_str())));
            }
        }
        for (key, _) in step.remember.iter().filter(|(_, t)| t.is_none()) {
            if seen_keys.insert(*key) {
                rem.push((key, None));
            }
        }
        rem.sort_unstable(); // a stable lock order across consumers
        let rem_keys: Vec<&str> = rem.iter().map(|(k, _)| *k).collect();
        let rem_tokens: Vec<Option<&str>> = rem.iter().map(|(_, t)| *t).collect();
        let rel_keys: Vec<&str> = step.release.iter().map(|(k, _)| *k).collect();
        let rel_tokens: Vec<&str> = step.release.iter().map(|(_, t)| t.0.as_str()).collect();
        let ren_keys: Vec<&str> = step.renew.iter().map(|(k, _)| *k).collect();
        let ren_tokens: Vec<&str> = step.renew.iter().map(|(_, t)| t.0.as_str()).collect();
        let ttl = ms(step.ttl);
        let lease = ttl_ms(step.lease) as i64;
        let (t, c) = (&self.table, &self.claims);
        // One remembered key and nothing else (a claiming delivery's commit)
        // takes scalars: the server then keeps the statement's plan (arrays
        // are planned again on every call, for the arrays given).
        let one = rem.len() == 1 && rel_keys.is_empty() && ren_keys.is_empty();
        let none = "(VALUES (NULL::text, NULL::text))";
        let (rem_src, rel_src, ren_src, rel_all, ren_all) = match one {
            true => (
                "(VALUES ($1::text, $2::text))",
                none,
                none,
                "ARRAY[]::text[]",
                "ARRAY[]::text[]",
            ),
            false => (
                "unnest($1::text[], $2::text[])",
                "unnest($4::text[], $5::text[])",
                "unnest($6::text[], $7::text[])",
                "$4::text[]",
                "$6::text[]",
            ),
        };
        let ms8 = interval_ms("$8");
        let sql = format!(
            "WITH
             rel AS (DELETE FROM {c} USING {rel_src} r(k, tok)
                     WHERE {c}.message_id = r.k AND {c}.token = r.tok),
             ren AS (UPDATE {c} SET expires_at = now() + {ms8}
                     FROM {ren_src} n(k, tok)
                     WHERE {c}.message_id = n.k AND {c}.token = n.tok
                       AND NOT EXISTS (SELECT 1 FROM {t}
                                       WHERE message_id = n.k AND {LIVE_KEY})
                     RETURNING n.k, n.tok),
             own AS (DELETE FROM {c} USING {rem_src} m(k, tok)
                     WHERE {c}.message_id = m.k
                       AND (m.tok IS NULL OR {c}.token = m.tok OR {c}.expires_at <= now())
                     RETURNING m.k, ({c}.token = m.tok) AS mine),
             free AS (INSERT INTO {c} AS x (message_id, token, expires_at)
                     SELECT m.k, 'free', '-infinity' FROM {rem_src} m(k, tok)
                     WHERE m.tok IS NOT NULL AND m.k NOT IN (SELECT k FROM own)
                       AND m.k <> ALL({rel_all}) AND m.k <> ALL({ren_all})
                     ON CONFLICT (message_id) DO UPDATE
                       SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
                       WHERE x.expires_at <= now()
                     RETURNING message_id),
             ins AS (INSERT INTO {t} AS cur (message_id, expires_at)
                     SELECT m.k, {} FROM {rem_src} m(k, tok)
                     WHERE m.tok IS NULL OR m.k IN (SELECT k FROM own)
                        OR m.k IN (SELECT message_id FROM free)
                     {GO_UPSERT}
                     RETURNING message_id)
             SELECT 0 AS part, k, NULL::text AS tok FROM own
               WHERE mine AND k IN (SELECT message_id FROM ins)
             UNION ALL SELECT 1, k, tok FROM ren",
            expiry("$3")
        );
        // A plain remember is followed by the end of the claims beside its
        // rows ([`Self::end_claims_sql`]): both in one round trip, their
        // values written in. Fenced commits, renewals and releases alone are
        // one statement, its parameters bound (their claims rows are there,
        // so a racing claim meets them under a lock).
        let plain = rem_tokens.iter().any(Option::is_none);
        let rows: Vec<(bool, String, String)> = if plain {
            let types = match one {
                true => "text, text, bigint, text[], text[], text[], text[], bigint",
                false => "text[], text[], bigint, text[], text[], text[], text[], bigint",
            };
            let (rem_keys_in, rem_tokens_in) = match one {
                true => (literal(rem_keys[0]), optional_literal(rem_tokens[0])),
                false => (
                    array_literal(rem_keys.iter().copied()),
                    optional_array_literal(&rem_tokens),
                ),
            };
            let ttl_in = ttl.map_or_else(|| "NULL".to_string(), |ms| ms.to_string());
            let values = [
                rem_keys_in,
                rem_tokens_in,
                ttl_in,
                array_literal(rel_keys.iter().copied()),
                array_literal(rel_tokens.iter().copied()),
                array_literal(ren_keys.iter().copied()),
                array_literal(ren_tokens.iter().copied()),
                lease.to_string(),
            ];
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            let all_rem_in = array_literal(rem_keys.iter().copied());
            let end_claims = self.end_claims_sql("= ANY($1::text[])");
            let statements = [
                Bound {
                    sql: &sql,
                    types,
                    values: &values,
                },
                Bound {
                    sql: &end_claims,
                    types: "text[]",
                    values: &[&all_rem_in],
                },
            ];
            // Both statements are safe to send again whole (see [`Self::run`]).
            let answers = self.run(|conn| conn.query_together(&statements))?;
            let rows = answers.first().ok_or_else(|| {
                StoreError::backend(false, "postgres: a settlement answered nothing")
            })?;
            rows.iter()
                .map(
                    |row| match (row.try_get(0), row.try_get(1), row.try_get(2)) {
                        (Ok(Some(part)), Ok(Some(key)), Ok(token)) => Ok((
                            part == "0",
                            key.to_owned(),
                            token.unwrap_or_default().to_owned(),
                        )),
                        _ => Err(StoreError::backend(
                            false,
                            "postgres: a settlement's answer is not (part, key, token)",
                        )),
                    },
                )
                .collect::<StoreResult<_>>()?
        } else {
            let (rem_params, rem_type): ([&(dyn ToSql + Sync); 2], Type) = match (one, &rem[..]) {
                (true, [(key, token)]) => ([key, token], Type::TEXT),
                _ => ([&rem_keys, &rem_tokens], Type::TEXT_ARRAY),
            };
            let params: [(&(dyn ToSql + Sync), Type); 8] = [
                (rem_params[0], rem_type.clone()),
                (rem_params[1], rem_type),
                (&ttl, Type::INT8),
                (&rel_keys, Type::TEXT_ARRAY),
                (&rel_tokens, Type::TEXT_ARRAY),
                (&ren_keys, Type::TEXT_ARRAY),
                (&ren_tokens, Type::TEXT_ARRAY),
                (&lease, Type::INT8),
            ];
            let rows = self.run(|c| c.query(&sql, &params))?;
            (rows.iter())
                .map(|row| {
                    let part: i32 = row.get(0);
                    let token: Option<String> = row.get(2);
                    (part == 0, row.get(1), token.unwrap_or_default())
                })
                .collect()
        };
        let mut kept_keys = HashSet::new();
        let mut renewed = HashSet::new();
        for (remembered, key, token) in rows {
            if remembered {
                kept_keys.insert(key);
            } else {
                renewed.insert((key, token));
            }
        }
        Ok(Settled {
            kept: step
                .remember
                .iter()
                .map(|(key, token)| token.is_none() || kept_keys.contains(*key))
                .collect(),
            renewed: step
                .renew
                .iter()
                .map(|(key, token)| renewed.contains(&(key.to_string(), token.0.clone())))
                .collect(),
            release_error: None,
        })
    }
}

impl Store for PostgresStore {
    /// The id's claim, then its row, in one transaction (so no call sees the
    /// one gone and the other still there), as two statements, each on a
    /// snapshot of its own: a commit in flight has ended the claim and is
    /// writing the row, so the first waits for that commit and the second sees
    /// what it wrote. In one statement the row's delete read a snapshot from
    /// before the commit: the forget answered, and the id stayed remembered.
    ///
    /// Tried again only where nothing took effect (a `BEGIN` on a connection
    /// the server dropped, a deadlock): a `COMMIT` whose reply was lost may
    /// have landed, and sent again it would also delete a claim another
    /// consumer took in between.
    async fn forget(&self, key: &str) -> StoreResult<()> {
        let key = self.name(key)?;
        let key = key.as_ref();
        let (t, c) = (&self.table, &self.claims);
        let (claim, row) = (
            format!("DELETE FROM {c} WHERE message_id = $1"),
            format!("DELETE FROM {t} WHERE message_id = $1"),
        );
        off_runtime(|| self.forget_here(&claim, &row, key))
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    /// Remembered ids are rows of the Go SDK's table, which holds nothing else.
    fn shared_format(&self) -> Option<&'static str> {
        Some("the Go SDK's PostgreSQL")
    }

    /// One key, one scalar parameter: the server plans `= $1` once and keeps
    /// the plan, where an array of one it plans again on every call.
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        let key = self.name(key)?;
        let key = key.as_ref();
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE message_id = $1 AND {LIVE_KEY})",
            self.table
        );
        let rows = self.run(|c| c.query(&sql, &[(&key, Type::TEXT)]))?;
        Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// One statement: the keys with a live row.
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let names = self.names(keys.iter().copied())?;
        let keys: Vec<&str> = names.iter().map(|k| k.as_ref()).collect();
        let sql = format!(
            "SELECT message_id FROM {} WHERE message_id = ANY($1::text[]) AND {LIVE_KEY}",
            self.table
        );
        let rows = self.run(|c| c.query_replanned(&sql, &[(&keys, Type::TEXT_ARRAY)]))?;
        let live: HashSet<String> = rows.iter().map(|r| r.get(0)).collect();
        Ok(keys.iter().map(|k| live.contains(*k)).collect())
    }

    /// One statement, one snapshot: per key, done (a live row), or the time
    /// its live claim has left in whole milliseconds, rounded up (`ZERO`: free;
    /// a transactional run's mark is written lapsed, so it reads free).
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let names = self.names(keys.iter().copied())?;
        let names: Vec<&str> = names.iter().map(|k| k.as_ref()).collect();
        let (t, c) = (&self.table, &self.claims);
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE message_id = k.id AND {LIVE_KEY}),
                    (SELECT greatest(1, pg_catalog.ceil(extract(epoch FROM expires_at - now())
                                 OPERATOR(pg_catalog.*) 1000))::bigint
                     FROM {c} WHERE message_id = k.id AND expires_at > now())
             FROM unnest($1::text[]) WITH ORDINALITY k(id, n) ORDER BY k.n"
        );
        let rows = self.run(|c| c.query_replanned(&sql, &[(&names, Type::TEXT_ARRAY)]))?;
        if rows.len() != keys.len() {
            return Err(StoreError::backend(
                false,
                format!(
                    "postgres: {} answers to a peek of {} keys",
                    rows.len(),
                    keys.len()
                ),
            ));
        }
        Ok(rows
            .iter()
            .map(
                |row| match (row.get::<_, bool>(0), row.get::<_, Option<i64>>(1)) {
                    (true, _) => Peeked::Done,
                    (false, left) => Peeked::NotDone {
                        claim_ends_in: Some(Duration::from_millis(left.unwrap_or(0).max(0) as u64)),
                    },
                },
            )
            .collect())
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        self.remember_keys(keys, ttl)
    }

    /// Two statements in one round trip (one simple query): find the
    /// remembered keys and claim every free one (no live row, no live claim: a
    /// lapsed claim is taken over, our own token's is ours again), then, on a
    /// fresh snapshot, find the keys remembered meanwhile and give their new
    /// claims back; a claim no longer standing (a forget removed it) is `Held`.
    /// Each statement commits before the next (a transaction each), as when
    /// they were sent one after the other.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let names = self.names(keys.iter().copied())?;
        let keys: &[&str] = &names.iter().map(|k| k.as_ref()).collect::<Vec<_>>();
        // A key repeated in one batch is claimed once; its repeats find the claim.
        let mut firsts: Vec<&str> = Vec::new();
        let mut unique = HashSet::new();
        for key in keys {
            if unique.insert(*key) {
                firsts.push(key);
            }
        }
        firsts.sort_unstable(); // a stable lock order across consumers
        let tokens: Vec<ClaimToken> = firsts.iter().map(|_| new_token()).collect();
        let token_strs: Vec<&str> = tokens.iter().map(|t| t.0.as_str()).collect();
        let (t, c) = (&self.table, &self.claims);
        // One key's statements take scalars: the server then keeps their plan
        // (arrays are planned again on every call, for the array given).
        let one = firsts.len() == 1;
        let (is_key, is_token, pairs, types) = match one {
            true => (
                "= $1::text",
                "= $2::text",
                "(VALUES ($1::text, $2::text))",
                "text, text",
            ),
            false => (
                "= ANY($1::text[])",
                "= ANY($2::text[])",
                "unnest($1::text[], $2::text[])",
                "text[], text[]",
            ),
        };
        // Statement one: the keys already remembered, and a claim on every other
        // free key, answered as (seen?, key).
        let ms3 = interval_ms("$3");
        let claim = format!(
            "WITH done AS (SELECT message_id FROM {t}
                           WHERE message_id {is_key} AND {LIVE_KEY}),
                  ins AS (INSERT INTO {c} (message_id, token, expires_at)
                          SELECT u.k, u.tok, now() + {ms3}
                          FROM {pairs} u(k, tok)
                          WHERE u.k NOT IN (SELECT message_id FROM done)
                          ON CONFLICT (message_id) DO UPDATE
                            SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
                            WHERE {c}.expires_at <= now() OR {c}.token = EXCLUDED.token
                          RETURNING message_id)
             SELECT true, message_id FROM done UNION ALL SELECT false, message_id FROM ins"
        );
        // Statement two, on a snapshot of its own: the keys remembered
        // meanwhile (their new claims are given back), and our claims still
        // standing (a forget may have removed one).
        let recheck = format!(
            "WITH done AS (SELECT message_id FROM {t}
                           WHERE message_id {is_key} AND {LIVE_KEY}),
                  back AS (DELETE FROM {c} USING done
                           WHERE {c}.message_id = done.message_id AND {c}.token {is_token}),
                  kept AS (SELECT message_id FROM {c}
                           WHERE message_id {is_key} AND token {is_token}
                             AND message_id NOT IN (SELECT message_id FROM done))
             SELECT true, message_id FROM done UNION ALL SELECT false, message_id FROM kept"
        );
        let (keys_in, tokens_in) = match one {
            true => (literal(firsts[0]), literal(token_strs[0])),
            false => (
                array_literal(firsts.iter().copied()),
                array_literal(token_strs.iter().copied()),
            ),
        };
        let lease = ttl_ms(lease).to_string();
        let claim_types = format!("{types}, bigint");
        let statements = [
            Bound {
                sql: &claim,
                types: &claim_types,
                values: &[&keys_in, &tokens_in, &lease],
            },
            Bound {
                sql: &recheck,
                types,
                values: &[&keys_in, &tokens_in],
            },
        ];
        // One round trip. Repeated whole after a broken connection: the tokens
        // are the same, so a claim that landed the first time is ours again.
        let answers = self.run(|conn| conn.query_together(&statements))?;
        let [claimed, rechecked] = answers.as_slice() else {
            return Err(StoreError::backend(
                false,
                format!("postgres: {} answers to 2 statements", answers.len()),
            ));
        };
        let (mut done, mut acquired) = (HashSet::new(), HashSet::new());
        // Seen by either statement; claimed if the second found our claim.
        for (row, recheck) in
            (claimed.iter().map(|r| (r, false))).chain(rechecked.iter().map(|r| (r, true)))
        {
            let (Ok(Some(seen)), Ok(Some(key))) = (row.try_get(0), row.try_get(1)) else {
                return Err(StoreError::backend(
                    false,
                    "postgres: a claim's answer is not (seen, key)",
                ));
            };
            if seen == "t" {
                done.insert(key.to_owned());
            } else if recheck {
                acquired.insert(key.to_owned());
            }
        }
        let mut token_of: std::collections::HashMap<&str, ClaimToken> =
            firsts.iter().copied().zip(tokens).collect();
        Ok(keys
            .iter()
            .map(|key| {
                if done.contains(*key) {
                    Claim::Seen
                } else if acquired.contains(*key) {
                    match token_of.remove(key) {
                        Some(token) => Claim::Acquired(token),
                        None => Claim::Held, // a repeat of a key claimed just now
                    }
                } else {
                    Claim::Held
                }
            })
            .collect())
    }

    /// One statement, one round trip (see [`PostgresStore`]).
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        self.settle_now(step)
    }
}
