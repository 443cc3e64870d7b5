//! The transactional mode ([`TransactionalStore`]) on PostgreSQL: the
//! handler's writes and the id in the store's transaction, and what a handler
//! may do to that transaction and its session.

use super::*;

/// The transactional mode on PostgreSQL: the handler gets the transaction
/// (`READ COMMITTED` is enough) and writes its own tables in it.
///
/// The run's first statement ([`PostgresStore::take_sql`]) marks the id in
/// `TABLE_claims` (a claim row of its own that never commits) and inserts its
/// row in Go's table: a second transactional run, or a claiming consumer's
/// claim, of the same id waits on the mark until this run ends, then finds the
/// id done (or, rolled back, free). A live claim of a claiming consumer parks
/// the run. After the work, one statement ([`PostgresStore::finish_sql`])
/// removes the mark and sets the id's expiry from that moment; it fails in a
/// transaction a swallowed error aborted, which is then rolled back
/// ([`TxRun::Aborted`]) instead of committed.
impl TransactionalStore for PostgresStore {
    type Tx<'t> = postgres::Transaction<'t>;

    fn transaction<T, E>(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        work: impl FnOnce(&mut postgres::Transaction<'_>) -> Result<T, E>,
    ) -> StoreResult<TxRun<T, E>> {
        self.retry_pending_undos();
        let name = key.map(|key| self.name(key)).transpose()?;
        let key = name.as_deref();
        self.refuse_pending(key.as_slice())?;
        let mark = format!("{MARK_PREFIX}{}", new_token().0);
        let keys: Vec<&str> = key.into_iter().collect();
        self.in_transaction(|mut tx, prepared| {
            // Nothing has run before the take: a stale take starts afresh.
            let mut statements = TxStatements {
                prepared,
                undo: Some(RESTART),
            };
            let writer = match key {
                Some(key) => {
                    let take = self.take_sql();
                    match self.take_in(&mut tx, &mut statements, &take, key, ms(ttl), &mark)? {
                        Ok(writer) => writer,
                        // Dropping the transaction rolls it back.
                        Err(run) => return Ok(run),
                    }
                }
                None => Writer::default(),
            };
            // Without an id no take tells a handler's own ROLLBACK from its
            // COMMIT: the transaction's id does (a round trip more, for a
            // delivery without an id alone).
            let xid = match key {
                None => Some(xid_of(tx.simple_query(XID).map_err(error)?)?),
                Some(_) => None,
            };
            // From here the handler's work is in the transaction: nothing to go back to.
            statements.undo = None;
            let not_committed = match work(&mut tx) {
                Ok(value) => match xid
                    .as_ref()
                    .map(|xid| self.still_ours(&mut tx, xid))
                    .transpose()?
                {
                    // Its own ROLLBACK (a BEGIN after or not), or an error it
                    // swallowed: what it began since is rolled back too.
                    Some(Err(run)) => {
                        // (Its session reset: behind a pooler it goes on.)
                        let _ = tx.batch_execute(RESET);
                        statements.prepared.retire();
                        return Ok(run);
                    }
                    handler_committed => {
                        match self.finish_run(&mut tx, &mut statements, &keys, ttl, &mark) {
                            Ok(Ok(finished_by)) => {
                                // (Its own COMMIT, for a run without an id.)
                                let handler_committed = matches!(handler_committed, Some(Ok(true)));
                                // The finish wrote in another transaction than
                                // the take: the handler ended the take's.
                                let moved = finished_by.is_some() && finished_by != writer.xmin;
                                let run = (keys.as_slice(), mark.as_str(), &writer);
                                return self.commit_run(
                                    tx,
                                    statements.prepared,
                                    run,
                                    (handler_committed, moved),
                                    value,
                                );
                            }
                            Ok(Err(aborted)) => TxRun::Aborted(aborted),
                            // The finish failed (its session ended, a timeout
                            // the handler set): a take its own COMMIT kept is
                            // undone, and then its writes are committed: said,
                            // not "nothing committed" (a review's finding).
                            Err(e) => {
                                let undone = self.roll_back_and_undo(
                                    tx,
                                    &keys,
                                    &mark,
                                    &writer,
                                    xid.as_ref(),
                                );
                                return match undone {
                                    Ok(Some(how)) if how != EndedBy::Rollback => {
                                        statements.prepared.retire();
                                        Ok(TxRun::Aborted(ended_by_handler_error(how)))
                                    }
                                    Ok(_) => Err(e),
                                    // The take may stand: said over the finish's error.
                                    Err(left) => Err(left),
                                };
                            }
                        }
                    }
                },
                Err(e) => TxRun::RolledBack(e),
            };
            // A handler that ended the store's transaction (its own COMMIT,
            // then perhaps a BEGIN) committed the id's take with it: undone,
            // or the redelivery would skip a message that never ran.
            if let Some(how) = self.roll_back_and_undo(tx, &keys, &mark, &writer, xid.as_ref())? {
                statements.prepared.retire();
                return Ok(TxRun::Aborted(ended_by_handler_error(how)));
            }
            Ok(not_committed)
        })
    }

    /// A work that swallowed an error (its transaction aborted) is rolled back
    /// to its own savepoint, which PostgreSQL allows: that entry is
    /// [`TxRun::Aborted`] and the others go on.
    fn transaction_batch<E>(
        &self,
        keys: &[Option<&str>],
        ttl: Option<Duration>,
        mut work: impl FnMut(usize, &mut postgres::Transaction<'_>) -> Result<(), E>,
    ) -> StoreResult<Vec<TxRun<(), E>>> {
        self.retry_pending_undos();
        let names: Vec<Option<std::borrow::Cow<'_, str>>> = keys
            .iter()
            .map(|k| k.map(|k| self.name(k)).transpose())
            .collect::<StoreResult<_>>()?;
        let named: Vec<&str> = names.iter().flatten().map(|n| n.as_ref()).collect();
        self.refuse_pending(&named)?;
        // (`ttl` in ms below; the runs alone take it as given.)
        let given_ttl = ttl;
        let (take, ttl) = (self.take_sql(), ms(ttl));
        let token = new_token();
        let mark = format!("{MARK_PREFIX}{}", token.0);
        let savepoint = crate::savepoint_for(&token);
        // One savepoint open before each delivery: a success releases it and
        // opens the next in the same round trip; anything else rolls back to
        // it, which keeps it open for the next (two round trips a delivery
        // with the take, not four). A success's handler may have moved
        // client_encoding: set back in the same query, before the next take
        // binds its id (a failure's rollback undoes the handler's SET).
        // With the first, where the batch has deliveries without an id, its
        // own transaction id: whether a handler's own COMMIT committed the
        // batch is its status when no take tells. (Only there: it gives the
        // transaction an id, and a batch of duplicates, which wrote nothing,
        // would then wait for its commit to be flushed.)
        let no_ids = names.iter().any(Option::is_none);
        let begin = match no_ids {
            true => format!("SAVEPOINT {savepoint}; {XID}"),
            false => format!("SAVEPOINT {savepoint}"),
        };
        // Before the RELEASE, what a handler may have done to the rest of the
        // transaction is set back: the role the next statements would run as
        // (`SET [LOCAL] ROLE`, `SET SESSION AUTHORIZATION`), the
        // `search_path` they would find functions on (a function of its own
        // before the catalog's would run as the session's user), the
        // timeouts they would run under (a handler's 1 ms failed the batch's
        // next takes). A read-only mode, which cannot be, fails this delivery
        // alone (either failed the whole batch on every redelivery, at the
        // finish: a user's trial).
        let next = format!(
            "SET LOCAL transaction_read_only = off; CLOSE ALL; RESET SESSION AUTHORIZATION; \
             RESET ROLE; RESET search_path; RESET statement_timeout; RESET lock_timeout; \
             RELEASE {savepoint}; \
             SET client_encoding TO 'UTF8'; SAVEPOINT {savepoint}"
        );
        let undo = format!("ROLLBACK TO {savepoint}");
        let batch = self.in_transaction(|mut tx, prepared| {
            let mut statements = TxStatements {
                prepared,
                undo: Some(&undo),
            };
            // The delivery whose handler may have committed its take by
            // itself, if the batch fails before its savepoint is settled.
            let mut at_risk: Option<(&str, Writer)> = None;
            // The batch's transaction id, where it has deliveries without one.
            let mut batch_xid: Option<Xid> = None;
            let mut body = |tx: &mut postgres::Transaction<'_>,
                            statements: &mut TxStatements<'_>| {
                let mut runs = Vec::with_capacity(keys.len());
                // The takes released so far: (id, the row's writer).
                let mut taken: Vec<(&str, Writer)> = Vec::new();
                let began = tx.simple_query(&begin).map_err(error)?;
                let xid = no_ids.then(|| xid_of(began)).transpose()?;
                batch_xid.clone_from(&xid);
                for (i, key) in names.iter().enumerate() {
                    let key = key.as_deref();
                    if let Some(key) = key {
                        match self.take_in(tx, statements, &take, key, ttl, &mark)? {
                            Ok(writer) => at_risk = Some((key, writer)),
                            Err(run) => {
                                // Undone: a mark put after waiting for another run of the id.
                                tx.batch_execute(&undo).map_err(error)?;
                                runs.push(run);
                                continue;
                            }
                        }
                    }
                    let result = work(i, tx);
                    // In a transaction a swallowed error aborted, RELEASE fails
                    // (25P02) and the SAVEPOINT after it is not run.
                    let released = match result.is_ok() {
                        true => match tx.batch_execute(&next) {
                            Ok(()) => Ok(()),
                            Err(e) => match ended_by_handler(&e) {
                                // Its own COMMIT (or ROLLBACK); a BEGIN after
                                // it, if any, the failed RELEASE has aborted
                                // (the rest of its work with it).
                                Some(began_again) => {
                                    return Ok(Batch::Ended(Ended {
                                        result,
                                        kept: !began_again,
                                        runs,
                                        taken,
                                        xid,
                                    }));
                                }
                                None if made_read_only(&e) => Err(read_only_error()),
                                None => aborted_or(e)?.map_err(|()| aborted_error()),
                            },
                        },
                        false => Err(aborted_error()),
                    };
                    match (result, released) {
                        (Ok(()), Ok(())) => {
                            taken.extend(at_risk.take().filter(|(_, w)| w.xmin.is_some()));
                            runs.push(TxRun::Committed(()));
                        }
                        (result, released) => {
                            if let Err(e) = tx.batch_execute(&undo) {
                                return match ended_by_handler(&e) {
                                    Some(_) => Ok(Batch::Ended(Ended {
                                        result,
                                        kept: false,
                                        runs,
                                        taken,
                                        xid,
                                    })),
                                    None => Err(error(e)),
                                };
                            }
                            at_risk = None;
                            runs.push(match (result, released) {
                                (Err(e), _) => TxRun::RolledBack(e),
                                (Ok(()), Err(why)) => TxRun::Aborted(why),
                                (Ok(()), Ok(())) => TxRun::Aborted(aborted_error()),
                            });
                        }
                    }
                }
                // The handlers left the transaction unusable after all: nothing commits.
                let committed: Vec<&str> = taken.iter().map(|(key, _)| *key).collect();
                self.finish_in(tx, statements, &committed, ttl, &mark)??;

                Ok(Batch::Ran(runs))
            };
            let failed = match body(&mut tx, &mut statements) {
                // A failed COMMIT committed nothing (a handler's own COMMIT
                // would have failed the RELEASE before): nothing to undo.
                Ok(Batch::Ran(runs)) => match commit_as_found(tx) {
                    Ok(()) => return Ok(Ok(runs)),
                    // An entry's writes were refused (a deferred constraint
                    // or trigger): each runs again alone, below, that one
                    // refused. (Its session as the handlers left it: not
                    // lent again.)
                    Err(e) if refused_its_writes(&e) => {
                        statements.prepared.retire();
                        return Ok(Err(keys.iter().map(|_| None).collect()));
                    }
                    Err(e) => return Err(error(e)),
                },
                Ok(Batch::Ended(ended)) => {
                    // What it did to the session is unknown: not lent again.
                    statements.prepared.retire();
                    let settled = self.settle_ended(tx, &names, ended, at_risk, ttl, &mark)?;
                    return Ok(Err(settled));
                }
                Err(e) => e,
            };
            // A handler that ended the transaction (its savepoint then gone)
            // may have committed its own take, its later writes rolled back:
            // undone, or the redelivery would skip it. The batch's error stays
            // what is reported (and, an error, it retires the connection:
            // `in_transaction`), with what that COMMIT kept: the session
            // ended (a crash), a bare "connection closed" hid that the
            // deliveries' writes up to it stay and are written again (a trial).
            // (An undo that failed is said instead: the take may stand.)
            let how = match (at_risk, batch_xid) {
                (Some((key, writer)), _) => {
                    self.roll_back_and_undo(tx, &[key], &mark, &writer, None)?
                }
                // Without a take, a session lost (a crash) may have been
                // after a handler's own COMMIT of deliveries without an id:
                // its transaction's status, asked elsewhere (it was a bare
                // "connection closed", their effects committed: a trial).
                (None, Some(xid)) => match tx.batch_execute("ROLLBACK") {
                    Ok(()) => {
                        // (Rolled back: the drop's own ROLLBACK would warn.)
                        std::mem::forget(tx);
                        None
                    }
                    Err(_) => return Err(self.lost_without_an_id(&xid, failed)),
                },
                (None, None) => None,
            };
            if how == Some(EndedBy::Commit) {
                let how = ended_by_handler_error(EndedBy::Commit);
                return Err(StoreError::new(
                    failed.kind,
                    format!("{how}; then: {failed}"),
                ));
            }
            Err(failed)
        })?;
        match batch {
            Ok(runs) => Ok(runs),
            // The entries not settled run again, a transaction each.
            Err(settled) => each_alone(self, keys, given_ttl, settled, work),
        }
    }
}

/// Whether the server refused a COMMIT with an ERROR (a deferred constraint
/// or trigger, a serialization failure, a deadlock): nothing of it
/// committed. Anything else (a lost reply, a FATAL that ended the session)
/// may have landed. (A server before 9.6 sends no unlocalized severity: then
/// the classes known to refuse.)
fn refused(e: &postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        db.parsed_severity().map_or_else(
            || ["23", "40"].iter().any(|c| db.code().code().starts_with(c)),
            |s| s == postgres::error::Severity::Error,
        )
    })
}

impl PostgresStore {
    /// A single run's COMMIT ([`commit_as_found`]), and what a failed one
    /// was: refused, a handler's own COMMIT before it may have committed the
    /// take (`run`: the keys, the mark and the take's writer), which is then
    /// undone and said; a refusal of the work's writes (a deferred constraint
    /// or trigger: [`refused_its_writes`]) is the work's failure; anything
    /// else is the store's (it may have landed).
    fn commit_run<T, E>(
        &self,
        tx: postgres::Transaction<'_>,
        prepared: &mut Prepared,
        (keys, mark, writer): (&[&str], &str, &Writer),
        (handler_committed, moved): (bool, bool),
        value: T,
    ) -> StoreResult<TxRun<T, E>> {
        let Err(e) = commit_as_found(tx) else {
            // A COMMIT of the handler's own: without an id told by its
            // status, with one by the finish landing in another transaction
            // than the take (`moved`: its finish ran in autocommit, under a
            // `SET synchronous_commit = off` the handler left on the session,
            // and nothing flushed either: a review, h103).
            if handler_committed || moved {
                // On another connection, new ones too (an idle one may be one
                // a restart ended: a review). Failing, it is as durable as the
                // handler made it, maybe not: not said done (it was, and a
                // crash could lose it: a review, h92).
                let flushed = self.on_another(|client: &mut postgres::Client| self.flush(client));
                if let Err(why) = flushed {
                    return Err(not_flushed(why));
                }
            }
            return Ok(TxRun::Committed(value));
        };
        // Its session may still be what the handler left (the resets not
        // reached): not lent again.
        prepared.retire();
        // A take found committed elsewhere: the handler's own COMMIT, its
        // writes before it kept. Looked for after a refused COMMIT (nothing
        // of ours landed), or after any failed one where the finish ran in
        // another transaction than the take (`moved`: ours, landed, wrote a
        // newer row than the take's, which the undo leaves; not landed, the
        // take stood and the redelivery skipped what came after the
        // handler's BEGIN: a review).
        let undone = match (refused(&e) || moved) && !handler_committed {
            true => self.undo_takes_elsewhere(keys, mark, writer)?,
            false => false,
        };
        // (Its own COMMIT told by its status, for a run without an id: what
        // came before it stands, whatever became of ours; a lost one was a
        // bare store error: a review.)
        let own_commit = handler_committed || ((refused(&e) || moved) && undone);
        match (own_commit, refused_its_writes(&e)) {
            // What it wrote before its own COMMIT stays, whatever refused ours.
            (true, _) => Ok(TxRun::Aborted(ended_by_handler_error(EndedBy::Commit))),
            (false, true) => Ok(TxRun::Aborted(crate::refused_at_commit(error(e)))),
            (false, false) => Err(error(e)),
        }
    }
}

/// How the deliveries of a transactional batch went in its transaction.
enum Batch<'k, E> {
    /// Every one ran: the transaction is to commit.
    Ran(Vec<TxRun<(), E>>),
    /// The last one's handler ended the store's transaction itself.
    Ended(Ended<'k, E>),
}

/// A batch delivery whose handler ended the store's transaction itself (its
/// own `ROLLBACK` or `COMMIT`): what its handler returned; whether its own
/// `COMMIT` may have committed it whole (the handler returned Ok and no
/// transaction was open after it); the runs before it, and the ids they took
/// with each take's row writer; the batch's transaction id.
struct Ended<'k, E> {
    result: Result<(), E>,
    kept: bool,
    runs: Vec<TxRun<(), E>>,
    taken: Vec<(&'k str, Writer)>,
    xid: Option<Xid>,
}

/// A transaction's id (epoch-qualified), with what tells that transaction
/// from another given the same id after a crash: its backend's pid and its
/// start (`now()`, in microseconds since the epoch, as [`Writer::at`]).
#[derive(Clone, PartialEq, Debug)]
struct Xid {
    id: i64,
    pid: i32,
    began: i64,
}

/// `now()` in microseconds since the epoch (whatever the session's time zone).
macro_rules! now_us {
    () => {
        "(extract(epoch FROM pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint"
    };
}

/// [`now_us!`] as a constant, for `format!`.
const NOW_US: &str = now_us!();

/// The current transaction's id (assigned now), its backend's pid and its
/// start: all a role a handler sets may read.
const XID: &str = concat!(
    "SELECT pg_catalog.txid_current(), pg_catalog.pg_backend_pid(), ",
    now_us!()
);

/// [`XID`]'s answer.
fn xid_of(messages: Vec<postgres::SimpleQueryMessage>) -> StoreResult<Xid> {
    let row = first_row(messages);
    let number = |i: usize| row.as_ref().and_then(|row| row.get(i)?.parse::<i64>().ok());
    match (
        number(0),
        number(1).and_then(|pid| i32::try_from(pid).ok()),
        number(2),
    ) {
        (Some(id), Some(pid), Some(began)) => Ok(Xid { id, pid, began }),
        _ => Err(StoreError::internal(
            "postgres: txid_current() gave no number",
        )),
    }
}

/// The status (`committed`, `aborted`, `in progress`) of the transaction
/// whose id `id` (an SQL expression) is, which began at `began` (µs), asked
/// on `client`; `None` where it cannot be trusted.
///
/// After a crash, even one the server recovers from without a restart,
/// PostgreSQL hands out again an id whose writes never reached the disk, and
/// another transaction may commit under it: asked on a session begun since
/// (a new connection, or behind a pooler the same one on a new server
/// session) the status said "committed" for a run its handler had rolled
/// back, and the delivery was acked, unrun (a trial). A crash ends every
/// server session, so a status is trusted on one begun before `began` alone
/// (its start is read as the session's own user, for this query alone:
/// another role, one `ALTER ROLE ... SET role` names too, may not see it).
/// `None` too before PostgreSQL 10 (no `txid_status`), or where the session
/// may not read its start. (The server's clock is trusted not to step back
/// across a crash, and a pooler to lead to one server.)
fn status_since(
    client: &mut impl postgres::GenericClient,
    id: &str,
    began: i64,
) -> StoreResult<Option<String>> {
    use postgres::error::SqlState;
    let query = format!(
        "SET LOCAL SESSION AUTHORIZATION DEFAULT; SET LOCAL ROLE NONE; \
         SELECT pg_catalog.txid_status({id}), \
           (SELECT (extract(epoch FROM a.backend_start) OPERATOR(pg_catalog.*) 1000000)::bigint \
            FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) AS a)"
    );
    // In a transaction a handler began, under a savepoint: its `SET LOCAL`s
    // come back for the rest of it (its deferred triggers fire under them).
    // Out of one, SAVEPOINT fails (25P01) and the query runs alone: its
    // `SET LOCAL`s last for it alone.
    let saved = format!(
        "SAVEPOINT bq_status; {query}; ROLLBACK TO SAVEPOINT bq_status; \
         RELEASE SAVEPOINT bq_status"
    );
    let asked = match client.simple_query(&saved) {
        Err(e) if e.code() == Some(&SqlState::NO_ACTIVE_SQL_TRANSACTION) => {
            client.simple_query(&query)
        }
        asked => asked,
    };
    match asked {
        Ok(messages) => Ok(first_row(messages).and_then(|row| {
            let started = row.get(1).and_then(|s| s.parse::<i64>().ok());
            let status = || row.get(0).unwrap_or_default().to_owned();
            started.is_some_and(|started| started < began).then(status)
        })),
        Err(e)
            if [
                SqlState::UNDEFINED_FUNCTION,
                SqlState::INSUFFICIENT_PRIVILEGE,
            ]
            .iter()
            .any(|c| e.code() == Some(c)) =>
        {
            Ok(None)
        }
        Err(e) => Err(error(e)),
    }
}

/// `Some` when a savepoint statement failed because the handler had ended the
/// store's transaction: no transaction open (25P01: `Some(false)`), or the
/// savepoint gone with the one it ended, another begun (3B001: `Some(true)`).
fn ended_by_handler(e: &postgres::Error) -> Option<bool> {
    use postgres::error::SqlState;
    match e.code() {
        Some(c) if c == &SqlState::NO_ACTIVE_SQL_TRANSACTION => Some(false),
        Some(c) if c == &SqlState::S_E_INVALID_SPECIFICATION => Some(true),
        _ => None,
    }
}

/// An ERROR at COMMIT that refused the transaction's own writes: a deferred
/// constraint they broke (class 23), or a deferred trigger's error on them
/// (a raised exception of any code, a data exception, a denied access...):
/// the work's failure, met again by its retry. Not a transient refusal
/// (class 40: a serialization failure, a deadlock; a lock not available) nor
/// the server's trouble (a connection, resources, a cancel or shutdown, a
/// system or internal error): those stay the store's. (A list of the work's
/// classes missed a trigger's own codes, `45000`, `21000`: a review.)
fn refused_its_writes(e: &postgres::Error) -> bool {
    const THE_STORES: [&str; 7] = ["08", "40", "53", "57", "58", "XX", "55P03"];
    let class = |c: &postgres::error::SqlState| THE_STORES.iter().any(|k| c.code().starts_with(k));
    refused(e) && e.code().is_some_and(|c| !class(c))
}

/// A row's `created_at` in microseconds since the epoch (whatever the
/// session's time zone and date style): with its `xmin`, the name of a take's
/// row version ([`Writer::at`]).
const AT: &str = "(extract(epoch FROM created_at) OPERATOR(pg_catalog.*) 1000000)::bigint";

/// The transaction that wrote a take's row: how the undo of a run whose
/// handler committed the take finds that row version and no other.
#[derive(Default, Clone)]
pub(super) struct Writer {
    /// Its `xmin`, as text (`None`: no take).
    xmin: Option<String>,
    /// Its `created_at` (the take's `now()`), in microseconds since the
    /// epoch: after a crash, even one the server recovers from without a
    /// restart, it hands out again an xid whose writes never reached the disk,
    /// so the `xmin` alone named a row the id's retry had committed under the
    /// reused xid (a trial: the id ran twice); a transaction that began later
    /// has a later `now()`.
    at: Option<i64>,
    /// Its transaction's start (`now()`, in microseconds since the epoch):
    /// `created_at` may be of another type or precision in a table made by
    /// hand (a review).
    began: Option<i64>,
}

/// The store's statements inside one transaction: the connection's prepared
/// statements, and how to go back to just before the next statement, if one
/// can: the savepoint open around a batch's delivery, or [`RESTART`].
struct TxStatements<'a> {
    prepared: &'a mut Prepared,
    undo: Option<&'a str>,
}

/// A transaction in which nothing has run yet (an aborted one included),
/// begun again on the same connection.
const RESTART: &str = "ROLLBACK; BEGIN";

/// A session given back what a handler's `SET` put on it (a role, a
/// read-only mode, a `search_path`, a `client_encoding`, a timeout): the
/// settings as the connection began (its startup `options` too), the ids then
/// bound in UTF-8 (a pooler's server connection may have begun in the
/// database's encoding).
macro_rules! session_as_found {
    () => {
        "RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL; SET client_encoding TO 'UTF8'"
    };
}

/// [`commit_as_found`]'s statements before its COMMIT. The `DO` block keeps
/// a handler's `synchronous_commit` where it is stronger than the session's
/// own (off < local < remote_write < on < remote_apply), never weaker: one
/// delivery's `SET LOCAL synchronous_commit = off` would have made its whole
/// batch's commit asynchronous (a review). Everything in it is named with
/// its schema: it runs as the session's user under the handler's
/// `search_path`, which could otherwise put a function of its own in its
/// place (a review ran `ALTER ROLE ... SUPERUSER` that way). Its statement
/// timeout is lifted for it (a handler's 1 ms failed every commit while
/// PL/pgSQL loaded); `RESET ALL` gives the session's back for the COMMIT.
/// A handler's cursors are closed before its role is reset: the COMMIT reads
/// the rest of a `WITH HOLD` cursor's rows, its functions then run as the
/// session's user (a review).
macro_rules! before_commit {
    () => {
        "SET CONSTRAINTS ALL IMMEDIATE; CLOSE ALL; RESET SESSION AUTHORIZATION; RESET ROLE; \
         SET LOCAL statement_timeout = 0; \
         DO $$ DECLARE \
           levels pg_catalog.text[] := \
             '{off,local,remote_write,on,remote_apply}'::pg_catalog.text[]; \
           handlers pg_catalog.text := pg_catalog.current_setting('synchronous_commit'); \
         BEGIN \
           RESET ALL; \
           IF pg_catalog.array_position(levels, handlers) OPERATOR(pg_catalog.>) \
              pg_catalog.array_position(levels, pg_catalog.current_setting('synchronous_commit')) \
           THEN \
             PERFORM pg_catalog.set_config('synchronous_commit', handlers, true); \
           END IF; \
         END $$; \
         SET client_encoding TO 'UTF8'"
    };
}

/// A failed run's transaction rolled back, and its session given back what a
/// handler's own COMMIT may have kept on it.
const RESET: &str = concat!("ROLLBACK; ", session_as_found!());

/// A run's transaction committed with its session put back first, in one
/// round trip: a successful handler's session-level `SET` outlived its run
/// on the pooled connection, and the next calls ran under it (read-only,
/// they failed). Its deferred triggers and constraints are fired first, under
/// the handler's `SET LOCAL`s, as its COMMIT would have (a review: reset
/// before them, one wrote its audit row elsewhere); the COMMIT last, so an
/// error is never a later statement's after a COMMIT that landed (reset
/// after it, a cancel arriving during its flush failed the reset, and the
/// store undid a committed id: a review's finding).
///
/// `RESET ALL` would also drop a handler's `SET LOCAL synchronous_commit`,
/// which the COMMIT reads (raised above the server's `off`, a crash lost a
/// run reported committed: a review): kept across it. Failing, the session
/// is reset on the way out (behind a transaction-mode pooler a retired
/// connection's server session goes on to other clients as it is).
fn commit_as_found(mut tx: postgres::Transaction<'_>) -> Result<(), postgres::Error> {
    let committed = tx.batch_execute(concat!(before_commit!(), "; COMMIT"));
    if committed.is_err() {
        let _ = tx.batch_execute(RESET);
    }
    std::mem::forget(tx);
    committed
}

impl TxStatements<'_> {
    /// A statement a handler's `DEALLOCATE` dropped (in this delivery or an
    /// earlier one on the connection) is undone and sent again, prepared
    /// afresh: otherwise such a handler would fail the deliveries after it,
    /// a whole batch on every redelivery. Where nothing can be undone (after
    /// a single delivery's work) the call fails: its delivery is retried, and
    /// the cache is emptied.
    fn query(
        &mut self,
        tx: &mut postgres::Transaction<'_>,
        sql: &str,
        params: &Params<'_>,
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        match (self.prepared.query(tx, sql, params), self.undo) {
            (Err(e), Some(undo)) if is_stale(&e) => {
                tx.batch_execute(undo)?;
                self.prepared.query(tx, sql, params)
            }
            (result, _) => result,
        }
    }
}

thread_local! {
    /// Set when PostgreSQL warns that a `COMMIT` or `ROLLBACK` found no
    /// transaction in progress (25P01). The sync client hands a connection's
    /// notices to the thread whose call is waiting on it, so after the store's
    /// own `ROLLBACK` this says whether the handler had ended the transaction.
    static NO_TRANSACTION_WARNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Every connection's notice callback: the client's default (a log line),
/// and [`NO_TRANSACTION_WARNED`].
pub(super) fn on_notice(notice: postgres::error::DbError) {
    if notice.code() == &postgres::error::SqlState::NO_ACTIVE_SQL_TRANSACTION {
        NO_TRANSACTION_WARNED.with(|warned| warned.set(true));
    }
    // The client's default callback logs from its `config` module.
    log::info!(target: "postgres::config", "{}: {}", notice.severity(), notice.message());
}

/// How a handler ended the store's transaction itself, as far as can be told.
#[derive(Clone, Copy, PartialEq, Debug)]
enum EndedBy {
    Commit,
    Rollback,
    /// Its COMMIT cannot be told from its ROLLBACK: without an id (no take to
    /// look for), where its transaction's status cannot be trusted
    /// ([`status_since`]).
    Unknown,
}

/// A transactional run whose handler ended the store's transaction itself and
/// cannot be recorded done, the id's take (if its COMMIT kept it) undone:
/// whether that transaction was committed (its own COMMIT) or rolled back.
fn ended_by_handler_error(how: EndedBy) -> StoreError {
    StoreError::internal(match how {
        EndedBy::Commit => {
            "postgres: the handler ended the store's transaction itself (its own COMMIT), and \
             this run cannot be recorded as done: what it wrote up to that COMMIT (and after \
             it, outside a transaction) is committed and a redelivery writes it again; the id, \
             if any, is left unrecorded, so the delivery is retried (leave the transaction to \
             the store)"
        }
        EndedBy::Rollback => {
            "postgres: the handler rolled back the store's transaction itself (its own \
             ROLLBACK): nothing it wrote in it is committed (what it wrote after, outside a \
             transaction, is, and a redelivery writes that again); the delivery is retried \
             (leave the transaction to the store)"
        }
        EndedBy::Unknown => {
            "postgres: the handler ended the store's transaction itself (its own COMMIT or \
             ROLLBACK), and which cannot be told (the session is a server session begun \
             since, a pooler's or one after a crash, where the transaction's id may be \
             another's): what it wrote may be committed, and a redelivery writes it again; \
             the delivery is retried (leave the transaction to the store)"
        }
    })
}

/// What a delivery of a batch is failed with when a later one's handler ended
/// the store's transaction itself and which way cannot be told.
fn ended_by_a_later_delivery() -> StoreError {
    StoreError::internal(
        "postgres: a later delivery's handler in this batch ended the store's transaction \
         itself (its own COMMIT or ROLLBACK), and which cannot be told (the session is a server \
         session begun since, a pooler's or one after a crash): what this delivery wrote may be \
         committed, and a redelivery writes it again; the delivery is retried",
    )
}

/// A handler's own COMMIT that could not be made durable ([`PostgresStore::flush`]
/// failed with `why`).
fn not_flushed(why: StoreError) -> StoreError {
    let said = format!(
        "postgres: the handler committed the store's transaction itself (its own COMMIT), \
         and that commit could not be made durable ({}): what it wrote may be committed, or \
         lost in a crash; the delivery is retried (a retry finds its id done if it was kept; \
         without an id, it writes it again)",
        why.message
    );
    StoreError::new(why.kind, said)
}

/// `lost` (a session lost after a handler of a delivery without an id ran),
/// saying what cannot be told.
fn may_be_committed(lost: StoreError) -> StoreError {
    let said = format!(
        "{}; whether a handler had committed the store's transaction itself (its own COMMIT) \
         cannot be told (no session begun before it answers): what it wrote may be \
         committed, and a retry writes it again",
        lost.message
    );
    StoreError::new(lost.kind, said)
}

/// The undo of a take a handler's own COMMIT may have committed failed, on
/// its session and on others (a partition, a lock held past every try): said,
/// for the take may stand and skip the redelivery whose later writes never
/// committed (it was a bare store error, or none: a review).
fn take_may_stand(
    (table, claims): (&str, &str),
    keys: &[&str],
    (mark, writer): (&str, &Writer),
    why: StoreError,
) -> StoreError {
    // Only the take's own row version (its `xmin` and `created_at`) is named:
    // a row written since (a redelivery's, or the run's own finish if its
    // COMMIT landed after all) must stay (a review), one a reused xid wrote
    // too (a trial).
    let at = writer.at.map_or("NULL".into(), |at| at.to_string());
    let rows = match &writer.xmin {
        Some(xmin) => format!(
            "the row of {keys:?} in {table} whose xmin is {xmin} and whose created_at is its \
             take's (WHERE xmin::text = '{xmin}' AND {AT} IS NOT DISTINCT FROM {at}; after a crash the xid \
             alone may be another transaction's), and the mark {mark:?} in {claims}"
        ),
        None => format!("nothing: this run took no row of {keys:?}"),
    };
    StoreError::new(
        why.kind,
        format!(
            "postgres: undoing what a handler's own COMMIT may have kept failed ({why}): if \
             the handler committed the store's transaction itself and the take of {keys:?} \
             stands, a redelivery is skipped as done though what the handler wrote after that \
             COMMIT may not have committed; to run it again, delete {rows}, if it is still \
             there (leave the transaction to the store)"
        ),
    )
}

/// A handler made the store's transaction read-only (`SET TRANSACTION READ
/// ONLY`), found by setting it back (25001), or by a write of the store (25006).
fn made_read_only(e: &postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| ["25001", "25006"].contains(&c.code()))
}

fn read_only_error() -> StoreError {
    StoreError::internal(
        "postgres: the handler made the store's transaction read-only (SET TRANSACTION READ \
         ONLY): the id cannot be recorded, so this run is rolled back and retried (leave the \
         transaction's mode to the store)",
    )
}

/// What a transaction a swallowed error aborted is reported with.
fn aborted_error() -> StoreError {
    StoreError::internal(
        "postgres: the handler returned Ok, but a statement in its transaction had failed \
         (an error the handler ignored), so PostgreSQL had aborted the transaction; nothing \
         was committed (to go on after \
         an expected error, run that statement under a SAVEPOINT of your own, or use \
         ON CONFLICT DO NOTHING)",
    )
}

/// `Ok(Err(()))` for the error of a statement sent in an aborted transaction
/// (SQLSTATE 25P02); `Err` for any other.
fn aborted_or(e: postgres::Error) -> StoreResult<Result<(), ()>> {
    match e.code().map(|c| c.code()) {
        Some("25P02") => Ok(Err(())),
        _ => Err(error(e)),
    }
}

impl PostgresStore {
    /// The first statement of a transactional run, one round trip, for `$1`
    /// (TTL `$2` ms or NULL, the run's mark `$3`): unless the id is done and
    /// live, the mark is put in its claims row (taking over a lapsed claim; a
    /// live one parks the run), then Go's remember of the id (inserting, or
    /// taking over an expired row). A concurrent run of the same id, or a claim
    /// on it, waits on the mark's row until this transaction ends. The mark's
    /// lease has lapsed when it is written: only its lock counts, and a mark a
    /// handler's own `COMMIT` made visible parks nothing. Answers (done,
    /// marked, and the transaction id that wrote the row if it was taken and
    /// its `created_at`: the undo's name for the take; the transaction's
    /// start).
    fn take_sql(&self) -> String {
        let (t, c) = (&self.table, &self.claims);
        let ms2 = interval_ms("$2");
        format!(
            "WITH done AS (SELECT 1 FROM {t} WHERE message_id = $1 AND {LIVE_KEY}),
             mark AS (
               INSERT INTO {c} AS cl (message_id, token, expires_at)
               SELECT $1, $3, now() WHERE NOT EXISTS (SELECT 1 FROM done)
               ON CONFLICT (message_id) DO UPDATE
                 SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
                 WHERE cl.expires_at <= now()
               RETURNING 1),
             taken AS (
               INSERT INTO {t} AS cur (message_id, created_at, expires_at)
               SELECT $1, now(), now() + {ms2}
               WHERE EXISTS (SELECT 1 FROM mark)
               {GO_UPSERT}
               RETURNING xmin::text AS writer, {AT} AS at)
             SELECT EXISTS (SELECT 1 FROM done), EXISTS (SELECT 1 FROM mark),
                    (SELECT writer FROM taken), (SELECT at FROM taken), {NOW_US}"
        )
    }

    /// Makes a commit a handler ran itself durable before it is reported
    /// done: its `SET LOCAL synchronous_commit = off; COMMIT` committed the
    /// batch asynchronously, nothing the store ran after wrote to flush it,
    /// and a crash just after lost every delivery said done (a trial). A write
    /// of the store's own (a row of its claims table, put and taken away)
    /// commits under the session's setting, which flushes the log up to it.
    /// On `client`, out of any transaction.
    fn flush(&self, client: &mut impl postgres::GenericClient) -> StoreResult<()> {
        let (c, key) = (
            &self.claims,
            format!("{MARK_PREFIX}flush:{}", new_token().0),
        );
        let sql = format!(
            "INSERT INTO {c} (message_id, token, expires_at) VALUES ('{key}', '{key}', pg_catalog.now()); \
             DELETE FROM {c} WHERE message_id = '{key}'"
        );
        client.batch_execute(&sql).map_err(error)
    }

    /// [`status_since`] on `client` (a session out of any transaction), and
    /// where it cannot be trusted or asked there, or without one, on another
    /// connection (an idle one of the pool is likely older).
    fn status_anywhere(
        &self,
        client: Option<&mut impl postgres::GenericClient>,
        id: &str,
        began: i64,
    ) -> Option<String> {
        // (A session that fails the query, gone or still the handler's, is
        // passed over too.)
        if let Some(client) = client
            && let Ok(Some(status)) = status_since(client, id, began)
        {
            return Some(status);
        }
        let elsewhere = |client: &mut postgres::Client| status_since(client, id, began);
        self.on_another_once(&elsewhere).ok().flatten()
    }

    /// Whether the transaction `xid` committed, where that can be told
    /// ([`Self::status_anywhere`]; an error, or one still in progress: not
    /// told).
    fn committed(
        &self,
        client: Option<&mut impl postgres::GenericClient>,
        xid: &Xid,
    ) -> Option<bool> {
        let status = self.status_anywhere(client, &xid.id.to_string(), xid.began);
        match status.as_deref() {
            Some("committed") => Some(true),
            Some("aborted") => Some(false),
            _ => None,
        }
    }

    /// Whether a run without an id is still in its transaction `xid` after
    /// its handler: `Ok(Ok(false))` when it is, `Ok(Ok(true))` when the
    /// handler's own `COMMIT` committed it (what it began after is its own,
    /// committed as a single run's is); `Ok(Err(run))` when its own
    /// `ROLLBACK` rolled it back or an error it swallowed aborted it.
    fn still_ours<T, E>(
        &self,
        tx: &mut postgres::Transaction<'_>,
        xid: &Xid,
    ) -> StoreResult<Result<bool, TxRun<T, E>>> {
        let now = match tx.simple_query(XID) {
            Ok(messages) => xid_of(messages)?,
            Err(e) => {
                // An error it swallowed aborted the transaction: ours, or one
                // it began after its own COMMIT, which kept what came before.
                // Else the session is lost (a crash): asked elsewhere.
                let _aborted = match aborted_or(e) {
                    Ok(aborted) => aborted,
                    Err(lost) => return self.lost_after_the_handler(xid, lost),
                };
                let _ = tx.batch_execute(RESET);
                return Ok(Err(TxRun::Aborted(match self.committed(Some(tx), xid) {
                    Some(true) => ended_by_handler_error(EndedBy::Commit),
                    Some(false) => aborted_error(),
                    None => ended_by_handler_error(EndedBy::Unknown),
                })));
            }
        };
        // The same id in a transaction begun since is another's (after a
        // crash, behind a pooler: see [`status_since`]).
        if now == *xid {
            return Ok(Ok(false));
        }
        // In autocommit now, or in a transaction the handler began.
        Ok(match self.committed(Some(tx), xid) {
            Some(true) => Ok(true),
            Some(false) => Err(TxRun::Aborted(ended_by_handler_error(EndedBy::Rollback))),
            None => Err(TxRun::Aborted(ended_by_handler_error(EndedBy::Unknown))),
        })
    }

    /// [`Self::committed`], asked on another session only (the run's is lost).
    fn committed_elsewhere(&self, xid: &Xid) -> Option<bool> {
        self.committed(None::<&mut postgres::Client>, xid)
    }

    /// A run without an id whose session was lost after its handler returned
    /// (a crash, a cut): its transaction is rolled back, unless the handler
    /// committed it itself. Asked on another session; not told, the error
    /// says its writes may be committed (it was a bare "connection closed",
    /// its effect committed: a trial).
    fn lost_after_the_handler<T, E>(
        &self,
        xid: &Xid,
        lost: StoreError,
    ) -> StoreResult<Result<bool, TxRun<T, E>>> {
        match self.committed_elsewhere(xid) {
            Some(true) => Ok(Err(TxRun::Aborted(ended_by_handler_error(EndedBy::Commit)))),
            Some(false) => Err(lost),
            None => Err(may_be_committed(lost)),
        }
    }

    /// The error of a transaction `xid`, of deliveries without an id, whose
    /// session was lost (`lost`): what a handler's own COMMIT kept, if its
    /// status says it committed (the store's own never ran); said to be
    /// possible where that cannot be told; else `lost` itself (rolled back).
    fn lost_without_an_id(&self, xid: &Xid, lost: StoreError) -> StoreError {
        match self.committed_elsewhere(xid) {
            Some(true) => StoreError::new(
                lost.kind,
                format!("{}; then: {lost}", ended_by_handler_error(EndedBy::Commit)),
            ),
            Some(false) => lost,
            None => may_be_committed(lost),
        }
    }

    /// Before the commit of one run: the finish ([`Self::finish_in`]),
    /// `client_encoding` set back first when the id is not ASCII (the handler
    /// may have moved it, and the finish's bound id would be read in it; a
    /// round trip more for those ids only; a batch does it in the query after
    /// each delivery). `Ok(Err(_))`: roll the run back.
    fn finish_run(
        &self,
        tx: &mut postgres::Transaction<'_>,
        statements: &mut TxStatements<'_>,
        keys: &[&str],
        ttl: Option<Duration>,
        mark: &str,
    ) -> StoreResult<Result<Option<String>, StoreError>> {
        // No id, nothing to finish (and nothing on the id tables for a role
        // the handler set to refuse).
        if keys.is_empty() {
            return Ok(Ok(None));
        }
        if !keys.iter().all(|k| k.is_ascii())
            && let Err(e) = tx.batch_execute("SET client_encoding TO 'UTF8'")
        {
            // A transaction a swallowed error aborted (25P02), or an error.
            return Ok(aborted_or(e)?.map(|()| None).map_err(|()| aborted_error()));
        }
        self.finish_in(tx, statements, keys, ms(ttl), mark)
    }

    /// Rolls a run's transaction back, then, on the same connection (in
    /// autocommit), undoes the takes of `keys` that a handler's own `COMMIT`
    /// committed: their marks, and their rows while still the versions the
    /// takes wrote (a row a later writer made, a Go consumer's remember after
    /// the TTL, stays; see [`Self::undo_takes`]). `Some` when the handler
    /// had ended the store's transaction (whatever it `SET` is then committed
    /// on the session): `Commit` when its COMMIT had kept a take (undone
    /// now), or for a run without an id when its transaction `xid` committed;
    /// `Rollback` when its ROLLBACK left none; `Unknown` when, without an id,
    /// that cannot be told ([`status_since`]). Two round trips, on failures only;
    /// `client_encoding` is set back first, so the ids are read as sent.
    fn roll_back_and_undo(
        &self,
        mut tx: postgres::Transaction<'_>,
        keys: &[&str],
        mark: &str,
        writer: &Writer,
        xid: Option<&Xid>,
    ) -> StoreResult<Option<EndedBy>> {
        // PostgreSQL warns when the ROLLBACK finds no transaction: the
        // handler ended it (a ROLLBACK, or a COMMIT without a BEGIN after it).
        NO_TRANSACTION_WARNED.with(|warned| warned.set(false));
        let rolled_back = tx.batch_execute(RESET);
        let ended = NO_TRANSACTION_WARNED.with(std::cell::Cell::take);
        // Whether it committed: `None`, not told.
        let committed = match (rolled_back, xid) {
            // Without an id, no take tells its COMMIT from its ROLLBACK: the
            // transaction's status does, where it can be told.
            // (Asked whether warned or not: a `client_min_messages` above
            // WARNING silences the warning, a review.)
            (Ok(()), Some(xid)) => Ok(self.committed(Some(&mut tx), xid)),
            (Ok(()), None) => self.undo_takes(&mut tx, keys, mark, writer).map(Some),
            // The session lost (a crash) after the handler: asked elsewhere,
            // and where that cannot tell, said: its own COMMIT may have kept
            // what it wrote (it was its error alone, "rolled back": a review).
            (Err(e), Some(xid)) => match self.committed_elsewhere(xid) {
                Some(told) => Ok(Some(told)),
                None => {
                    std::mem::forget(tx);
                    return Err(may_be_committed(error(e)));
                }
            },
            (Err(e), None) => Err(error(e)),
        };
        // Its transaction has ended: the drop's own ROLLBACK would cost a
        // round trip more and log "there is no transaction in progress" on
        // the server for every failed run. (Forgotten, it holds nothing:
        // a borrow of the connection and no savepoint.)
        std::mem::forget(tx);
        // This session may be gone, or the handler's (a read-only mode or a
        // role its COMMIT kept, which refuses the undo): on another, or the
        // take its COMMIT kept would skip the redelivery.
        let committed = match committed {
            Ok(committed) => committed,
            Err(_) => Some(self.undo_takes_elsewhere(keys, mark, writer)?),
        };
        Ok(match (committed, ended) {
            (Some(true), _) => Some(EndedBy::Commit),
            (Some(false), true) => Some(EndedBy::Rollback),
            (None, true) => Some(EndedBy::Unknown),
            (_, false) => None,
        })
    }

    /// After a batch delivery whose handler ended the store's transaction
    /// itself ([`Ended`]; `culprit`: its id and take, if it has one): which
    /// entries are settled; the others run again alone.
    ///
    /// What the handler ended is rolled back (and what it began after), and
    /// the session reset (a role or a read-only mode it committed would fail
    /// what follows). Then, in autocommit, its take is undone unless its own
    /// `COMMIT` (no `BEGIN` after, Ok) may have committed it whole, and the
    /// takes of the deliveries before it, and its own if kept, are finished.
    /// A take found standing proves the batch's transaction committed (its
    /// `COMMIT`): the deliveries before it ran, kept (with an id or not), and
    /// so did it if kept. Else (its `ROLLBACK`, or no id to tell by) they run
    /// again, which for a delivery without an id may run it twice, as its
    /// every redelivery does. It is failed unless kept, a take undone.
    fn settle_ended<E>(
        &self,
        mut tx: postgres::Transaction<'_>,
        names: &[Option<std::borrow::Cow<'_, str>>],
        ended: Ended<'_, E>,
        culprit: Option<(&str, Writer)>,
        ttl: Option<i64>,
        mark: &str,
    ) -> StoreResult<Vec<Option<TxRun<(), E>>>> {
        let Ended {
            result,
            kept,
            runs,
            taken,
            xid,
        } = ended;
        let at = runs.len();
        let kept = kept && result.is_ok();
        let undo = culprit.as_ref().filter(|_| !kept);
        let mut taken: Vec<(&str, &Writer)> = (taken.iter()).map(|(k, w)| (*k, w)).collect();
        // The takes to finish: those released, and its own if kept.
        let mut ran: Vec<&str> = taken.iter().map(|(key, _)| *key).collect();
        if let Some((key, writer)) = culprit.as_ref().filter(|(_, w)| w.xmin.is_some()) {
            taken.push((*key, writer));
            ran.extend(kept.then_some(*key));
        }
        let reset = tx.batch_execute(RESET);
        let here = match reset {
            Ok(()) => self.follow_up(&mut tx, undo, &ran, (xid.as_ref(), &taken), ttl, mark),
            Err(e) => Err(error(e)),
        };
        // Its transaction has ended (as in `roll_back_and_undo`).
        std::mem::forget(tx);
        // Where this session cannot (gone, or still the handler's), on
        // another, as `run` tries them (an idle one may be one the server
        // dropped): both statements find only what is still to do. Failing,
        // the batch fails as one, the take its COMMIT kept standing.
        let committed = match here {
            Ok(committed) => committed,
            Err(_) => {
                let follow_up = |client: &mut postgres::Client| {
                    self.follow_up(client, undo, &ran, (xid.as_ref(), &taken), ttl, mark)
                };
                self.on_another(follow_up)?
            }
        };
        // Not told (no take, asked on another backend): run again, as its
        // every redelivery may.
        let how = match committed {
            Some(true) => EndedBy::Commit,
            Some(false) => EndedBy::Rollback,
            None => EndedBy::Unknown,
        };
        let committed = committed == Some(true);
        let own = match kept && committed {
            true => TxRun::Committed(()),
            false => TxRun::Aborted(ended_by_handler_error(how)),
        };
        // Rolled back, a repeat of an id this batch had run is no longer
        // done: it runs again too.
        let ran_before = |j: usize| {
            (0..j).any(|k| names[k] == names[j] && matches!(runs[k], TxRun::Committed(())))
        };
        let repeats: Vec<bool> = (0..at)
            .map(|j| !committed && matches!(runs[j], TxRun::AlreadyDone) && ran_before(j))
            .collect();
        // Not told, a delivery before it without an id may be committed:
        // failed, said, not run again alone and said done (its effect twice,
        // unsaid: a trial). (One with an id runs again: its redelivery, or
        // its take, tells.)
        let before = |j: usize, run| match how {
            EndedBy::Unknown if names[j].is_none() => {
                Some(TxRun::Aborted(ended_by_a_later_delivery()))
            }
            _ => committed.then_some(run),
        };
        let mut settled: Vec<Option<TxRun<(), E>>> = (runs.into_iter().zip(repeats))
            .enumerate()
            .map(|(j, (run, repeat))| match run {
                TxRun::Committed(()) => before(j, TxRun::Committed(())),
                _ if repeat => None,
                other => Some(other),
            })
            .collect();
        settled.push(Some(own));
        settled.resize_with(names.len(), || None);
        Ok(settled)
    }

    /// [`Self::settle_ended`]'s statements, in autocommit on `client`: the
    /// culprit's take undone (`undo`), the takes of `ran` finished. Whether
    /// the batch's transaction committed: a take found standing, or else the
    /// status of the batch's transaction (`xid`, read where it has
    /// deliveries without an id) or of a take's writer, where it can be
    /// trusted ([`status_since`]), or else whether the row version a take in
    /// `taken` wrote ([`Writer`]) is there; not told (`None`) without. (The status was trusted anywhere: after a crash its id may be
    /// another's, which committed, and the deliveries before were acked,
    /// unrun: a trial.)
    fn follow_up(
        &self,
        client: &mut impl postgres::GenericClient,
        undo: Option<&(&str, Writer)>,
        ran: &[&str],
        (xid, taken): (Option<&Xid>, &[(&str, &Writer)]),
        ttl: Option<i64>,
        mark: &str,
    ) -> StoreResult<Option<bool>> {
        let undone = match undo {
            Some((key, writer)) => self.undo_takes(client, &[*key], mark, writer)?,
            None => false,
        };
        let params: &Params<'_> = &[
            (&ran, Type::TEXT_ARRAY),
            (&ttl, Type::INT8),
            (&mark, Type::TEXT),
        ];
        let finished = match ran.is_empty() {
            true => false,
            false => !(client.query_typed(&self.finish_sql(), params))
                .map_err(error)?
                .is_empty(),
        };
        if undone || finished {
            return Ok(Some(true));
        }
        // The batch's transaction's status, where it can be trusted
        // ([`status_since`]): by its id, or else by the id of the
        // (sub)transaction that wrote a take (its row's `created_at` is the
        // transaction's start), whose epoch is the current one's, or the one
        // before if it is past the current xid's low bits (the current one
        // assigned now: a snapshot's xmax may be at or below a writer still
        // in progress, which put it an epoch back, "in the future" before the
        // first wraparound: a review).
        let writer = taken.first().and_then(|(_, w)| {
            let xmin = w.xmin.as_deref()?.parse::<u32>().ok()?;
            Some((xmin, w.began?))
        });
        let asked = match (xid, writer) {
            (Some(xid), _) => Some((xid.id.to_string(), xid.began)),
            (None, Some((xmin, began))) => Some((
                // (Every operator named with its schema, the number typed:
                // `bigint | integer` has no exact match in pg_catalog, and
                // an operator of that shape in public would run: a review.)
                format!(
                    "(SELECT (s.x OPERATOR(pg_catalog.>>) 32 OPERATOR(pg_catalog.<<) 32 \
                              OPERATOR(pg_catalog.|) w) \
                             OPERATOR(pg_catalog.-) CASE WHEN w OPERATOR(pg_catalog.>) \
                               (s.x OPERATOR(pg_catalog.&) 4294967295::pg_catalog.int8) \
                             THEN 4294967296::pg_catalog.int8 ELSE 0::pg_catalog.int8 END \
                     FROM (SELECT pg_catalog.txid_current() AS x, \
                                  {xmin}::pg_catalog.int8 AS w) s)"
                ),
                began,
            )),
            (None, None) => None,
        };
        if let Some((id, began)) = asked {
            match self
                .status_anywhere(Some(&mut *client), &id, began)
                .as_deref()
            {
                Some("committed") => return self.flush(client).map(|()| Some(true)),
                Some("aborted") => return Ok(Some(false)),
                // Still in progress (a handler's PREPARE TRANSACTION): not
                // known; the batch fails as one, and its redeliveries wait
                // on the prepared transaction's rows until it ends.
                Some(other) => {
                    return Err(StoreError::unavailable(format!(
                        "postgres: the batch's transaction is {} (did the handler run PREPARE \
                         TRANSACTION? its rows stay locked until COMMIT PREPARED or ROLLBACK \
                         PREPARED)",
                        if other.is_empty() {
                            "of unknown status"
                        } else {
                            other
                        }
                    )));
                }
                // Not to be trusted here (or before PostgreSQL 10).
                None => {}
            }
        }
        if taken.is_empty() {
            // Nothing written before it (nothing of the batch to keep), or
            // nothing to tell by.
            return Ok(xid.is_none().then_some(false));
        }
        // The take's own row version (its `xmin` and `created_at`, as the
        // undo names it): there, the batch committed; gone, it rolled back,
        // or a forget or a later writer took it (not told).
        let ids: Vec<&str> = taken.iter().map(|(id, _)| *id).collect();
        let xmins: Vec<Option<&str>> = taken.iter().map(|(_, w)| w.xmin.as_deref()).collect();
        let ats: Vec<Option<i64>> = taken.iter().map(|(_, w)| w.at).collect();
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM {} AS t,
                                   unnest($1::text[], $2::text[], $3::bigint[]) AS w(id, x, at)
                            WHERE t.message_id = w.id AND t.xmin::text = w.x
                              AND {AT} IS NOT DISTINCT FROM w.at)",
            self.table
        );
        let params: &Params<'_> = &[
            (&ids, Type::TEXT_ARRAY),
            (&xmins, Type::TEXT_ARRAY),
            (&ats, Type::INT8_ARRAY),
        ];
        let row = client.query_typed_one(&sql, params).map_err(error)?;
        match row.get::<_, bool>(0) {
            true => self.flush(client).map(|()| Some(true)),
            false => Ok(None),
        }
    }

    /// [`Self::roll_back_and_undo`]'s undo on a connection of its own, for a
    /// run whose transaction is gone (its COMMIT refused), or whose session
    /// cannot run it.
    fn undo_takes_elsewhere(
        &self,
        keys: &[&str],
        mark: &str,
        writer: &Writer,
    ) -> StoreResult<bool> {
        self.on_another(|client| self.undo_takes(client, keys, mark, writer))
            .map_err(|why| {
                // Kept, to be tried again before this store's next run.
                let keys_owned = keys.iter().map(|k| k.to_string()).collect();
                (self.pending()).push((keys_owned, mark.to_owned(), writer.clone()));
                take_may_stand((&self.table, &self.claims), keys, (mark, writer), why)
            })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<PendingUndo>> {
        (self.pending_undos.lock()).unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The undos that failed before ([`Self::undo_takes_elsewhere`]), tried
    /// once more each on another connection, and on a new one if that fails
    /// (not the pool's round: while the trouble lasts a run pays two failed
    /// tries, no more); those that fail again are kept. (A redelivery in this process then runs: the
    /// take its handler's COMMIT kept no longer skips it.)
    fn retry_pending_undos(&self) {
        // A copy: the undos stay listed while they are tried, so another
        // thread's run of their ids is refused meanwhile (taken out of the
        // list, they let it by, to be skipped: a review).
        let pending = self.pending().clone();
        let landed: Vec<String> = pending
            .into_iter()
            .filter(|(keys, mark, writer)| {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let undo =
                    |client: &mut postgres::Client| self.undo_takes(client, &keys, mark, writer);
                // Failing on an idle one of the pool (one a restart ended, as
                // the one that kept the undo was), once more on one of its
                // own: the redelivery was skipped (a trial).
                (self.on_another_once(&undo))
                    .or_else(|_| self.on_a_new_one(&undo))
                    .is_ok()
            })
            .map(|(_, mark, _)| mark)
            .collect();
        // Each run's mark is its own.
        self.pending().retain(|(_, mark, _)| !landed.contains(mark));
    }

    /// Refuses a run of an id whose take's undo is still kept
    /// ([`Self::retry_pending_undos`] failed again: the server down, or
    /// refusing connections): its take may stand and skip the run, and the
    /// undo landing later let a copy after that skip run again, twice (a
    /// review). Retried, it runs once the undo lands.
    fn refuse_pending(&self, names: &[&str]) -> StoreResult<()> {
        let pending = self.pending();
        let kept = |name: &&&str| {
            pending
                .iter()
                .any(|(keys, ..)| keys.iter().any(|k| k == **name))
        };
        match names.iter().find(kept) {
            Some(name) => Err(StoreError::unavailable(format!(
                "postgres: undoing what a handler's own COMMIT kept of {name:?} could not be \
                 done yet (the server is down or refuses connections): this run is retried \
                 until it is"
            ))),
            None => Ok(()),
        }
    }

    /// `op` on another connection than the one a handler had: an idle one of
    /// the pool, else one of its own (never waiting on the pool, which other
    /// runs in the same plight may hold); tried again while it fails (an
    /// idle one may be one the server dropped), as [`Self::run`] tries them.
    /// For the undo of what a handler's own COMMIT kept, which must not be
    /// left undone for want of a session.
    fn on_another<T>(
        &self,
        op: impl Fn(&mut postgres::Client) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut tried = self.on_another_once(&op);
        // After a failure, one of its own: a pooled one that failed without
        // breaking (a session a handler left read-only) would come back.
        for _ in 0..POOL_SIZE {
            match tried {
                Err(e) if e.kind != StoreErrorKind::Invalid => tried = self.on_a_new_one(&op),
                _ => break,
            }
        }
        tried
    }

    /// `op` on a connection of its own, opened for it.
    fn on_a_new_one<T>(
        &self,
        op: &impl Fn(&mut postgres::Client) -> StoreResult<T>,
    ) -> StoreResult<T> {
        match self.direct.connect() {
            Ok(mut client) => op(&mut client),
            Err(e) => Err(error(e)),
        }
    }

    /// [`Self::on_another`]'s first try alone: an idle connection of the
    /// pool, else one of its own.
    fn on_another_once<T>(
        &self,
        op: &impl Fn(&mut postgres::Client) -> StoreResult<T>,
    ) -> StoreResult<T> {
        match self.pool.as_ref().and_then(Pool::try_get) {
            Some(mut conn) => op(conn.client()),
            None => self.on_a_new_one(op),
        }
    }

    /// Deletes the marks this run (`mark`) put on `keys`, if a COMMIT made
    /// them stand, and the ids' rows while they are still the takes' (the
    /// row version `writer` wrote: a row a later writer made stays); true
    /// when there were some. The row is found by its writer, not through the
    /// mark: a claim that waited on the mark takes it over once a handler's
    /// own COMMIT made it visible (it is written lapsed), and the take's row
    /// then stayed, the failed run's id recorded.
    ///
    /// The row version is named by its `xmin` and its `created_at` together:
    /// after a crash, even one the server recovers from without a restart, an
    /// xid whose writes never reached the disk is handed out again, and by its
    /// `xmin` alone the undo deleted the row the id's retry had committed
    /// under it, on any session (a pooler's too), and the id ran twice (a
    /// trial; the run's mark, or the server's start time, could not tell: a
    /// claim takes a mark over, a purge removes it, a recovery keeps the start).
    fn undo_takes(
        &self,
        client: &mut impl postgres::GenericClient,
        keys: &[&str],
        mark: &str,
        writer: &Writer,
    ) -> StoreResult<bool> {
        if keys.is_empty() {
            return Ok(false);
        }
        let (t, c) = (&self.table, &self.claims);
        let sql = format!(
            "WITH unmark AS (DELETE FROM {c} WHERE message_id = ANY($1::text[]) AND token = $2
                             RETURNING 1),
                  undone AS (DELETE FROM {t} WHERE message_id = ANY($1::text[])
                               AND xmin::text = $3 AND {AT} IS NOT DISTINCT FROM $4
                             RETURNING 1)
             SELECT (SELECT count(*) FROM unmark) + (SELECT count(*) FROM undone)"
        );
        let params: &Params<'_> = &[
            (&keys, Type::TEXT_ARRAY),
            (&mark, Type::TEXT),
            (&writer.xmin, Type::TEXT),
            (&writer.at, Type::INT8),
        ];
        let rows = client.query_typed(&sql, params).map_err(error)?;
        Ok(rows.first().is_some_and(|row| row.get::<_, i64>(0) > 0))
    }

    /// Runs [`Self::take_sql`] in `tx`: `Ok` when the id is now this run's
    /// (the work goes on), with the take's [`Writer`]; else why nothing runs.
    fn take_in<T, E>(
        &self,
        tx: &mut postgres::Transaction<'_>,
        statements: &mut TxStatements<'_>,
        take: &str,
        key: &str,
        ttl: Option<i64>,
        mark: &str,
    ) -> StoreResult<Result<Writer, TxRun<T, E>>> {
        let params: &Params<'_> = &[(&key, Type::TEXT), (&ttl, Type::INT8), (&mark, Type::TEXT)];
        let rows = statements.query(tx, take, params).map_err(error)?;
        // One row, always (`SELECT EXISTS ...`).
        let row = rows
            .first()
            .ok_or_else(|| StoreError::internal("postgres: the take statement answered no row"))?;
        let (done, marked, writer): (bool, bool, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        Ok(match (done, marked, writer) {
            (true, ..) => Err(TxRun::AlreadyDone),
            (false, false, _) => Err(TxRun::Held),
            (false, true, Some(writer)) => Ok(Writer {
                xmin: Some(writer),
                at: row.get(3),
                began: row.get(4),
            }),
            // Done by a run that committed while this one waited on the mark.
            (false, true, None) => Err(TxRun::AlreadyDone),
        })
    }

    /// The last statement before the commit, for the ids `$1` this run took
    /// (TTL `$2` ms, its mark `$3`): their marks removed and their expiry
    /// counted from now (`clock_timestamp()`, not the transaction's start).
    /// Answers how many it found.
    ///
    /// It also gives the session back its `client_encoding` (a one-time
    /// filter, run once whatever the rows): a handler's `SET client_encoding`,
    /// committed with its run, would have the bound ids of the later calls on
    /// this pooled connection read in that encoding.
    fn finish_sql(&self) -> String {
        let (t, c) = (&self.table, &self.claims);
        let ms2 = interval_ms("$2");
        format!(
            "WITH unmark AS (DELETE FROM {c} WHERE message_id = ANY($1::text[]) AND token = $3
                             RETURNING message_id)
             UPDATE {t} SET expires_at = CASE WHEN $2::bigint IS NULL THEN NULL
                 ELSE clock_timestamp() + {ms2} END
             WHERE message_id IN (SELECT message_id FROM unmark)
               AND (SELECT {UTF8_AGAIN}) IS NOT NULL
             RETURNING xmin::text"
        )
    }

    /// Runs [`Self::finish_sql`] (even for no ids: it is what finds a
    /// transaction a swallowed error aborted). `Ok(Err(_))`: the transaction
    /// cannot commit this run, roll it back. `Ok(Ok(xmin))`: the transaction
    /// that wrote the finished rows (`None` for no ids).
    fn finish_in(
        &self,
        tx: &mut postgres::Transaction<'_>,
        statements: &mut TxStatements<'_>,
        keys: &[&str],
        ttl: Option<i64>,
        mark: &str,
    ) -> StoreResult<Result<Option<String>, StoreError>> {
        let params: &Params<'_> = &[
            (&keys, Type::TEXT_ARRAY),
            (&ttl, Type::INT8),
            (&mark, Type::TEXT),
        ];
        let mut found = statements.query(tx, &self.finish_sql(), params);
        // After a handler's own COMMIT the finish runs in autocommit, under
        // what it left on the session (a read-only mode, a role): set back,
        // once more (it failed, a single run's COMMIT kept, every redelivery
        // wrote that again). In a transaction the failure aborted it: as found.
        if let Err(e) = &found
            && (made_read_only(e) || denied(e))
            && tx.batch_execute(session_as_found!()).is_ok()
        {
            found = statements.query(tx, &self.finish_sql(), params);
        }
        Ok(match found {
            Ok(rows) if rows.len() == keys.len() => Ok(rows.first().map(|row| row.get(0))),
            Ok(rows) => Err(StoreError::internal(format!(
                "postgres: {} of the {} ids this transaction took were no longer in it (did \
                 the handler end the transaction, or delete them?); this transaction commits \
                 nothing, but what a COMMIT of the handler's own wrote stays committed",
                keys.len() - rows.len(),
                keys.len()
            ))),
            // The take wrote these rows in this transaction: refused now,
            // the handler changed what it may do.
            Err(e) if made_read_only(&e) => Err(read_only_error()),
            Err(e) if denied(&e) => Err(StoreError::internal(format!(
                "postgres: the handler set a role that may not write the store's tables (SET \
                     ROLE, SET SESSION AUTHORIZATION), and the id cannot be recorded: this run is rolled back and retried \
                     (set the role back before returning): {}",
                causes(&e)
            ))),
            Err(e) if e.code() == Some(&postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME) => {
                Err(StoreError::internal(
                    "postgres: the handler dropped the store's prepared statements on its \
                     connection (DEALLOCATE), and the id cannot be recorded: this run is rolled \
                     back and retried (leave them to the store, or add statement_cache=off to \
                     the URL)",
                ))
            }
            Err(e) => aborted_or(e)?.map(|()| None).map_err(|()| aborted_error()),
        })
    }
}

/// A statement of the store's refused for the role the handler set.
fn denied(e: &postgres::Error) -> bool {
    e.code() == Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
}

#[cfg(test)]
mod tests {
    /// The reset before a run's COMMIT keeps a handler's `SET LOCAL
    /// synchronous_commit` stronger than the session's, which the COMMIT
    /// reads (a review: `RESET ALL` dropped it, and a crash lost a run
    /// reported committed), never a weaker one, and drops the rest of what it
    /// set; a function of the handler's search_path does not stand in for
    /// the catalog's, and its 1 ms statement timeout does not fail it.
    /// (A server: `make test` starts one.)
    #[test]
    fn the_reset_before_a_commit_keeps_only_a_stronger_synchronous_commit() {
        let url = std::env::var("BQ_TEST_POSTGRES_URL")
            .expect("BQ_TEST_POSTGRES_URL: run under scripts/with-postgres.sh");
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let schema = format!("bq_hijack_{}", std::process::id());
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; \
                 CREATE FUNCTION {schema}.current_setting(pg_catalog.text) RETURNS pg_catalog.text \
                   LANGUAGE plpgsql AS $$ BEGIN RAISE 'hijacked'; END $$"
            ))
            .unwrap();
        for (given, at_commit) in [
            ("remote_apply", "remote_apply"),
            ("off", "on"),
            ("local", "on"),
        ] {
            let mut tx = client.transaction().unwrap();
            let set = format!(
                "SET LOCAL synchronous_commit = {given}; SET search_path = {schema}, pg_catalog; \
                 SET default_transaction_read_only = on; SET LOCAL statement_timeout = 1; \
                 DECLARE held CURSOR WITH HOLD FOR SELECT 1"
            );
            tx.batch_execute(&set).unwrap();
            tx.batch_execute(before_commit!()).unwrap();
            let cursors: i64 = tx
                .query_one("SELECT count(*) FROM pg_cursors WHERE name = 'held'", &[])
                .unwrap()
                .get(0);
            assert_eq!(cursors, 0, "a cursor left to the COMMIT");
            let show = |tx: &mut postgres::Transaction<'_>, name: &str| -> String {
                tx.query_one(&format!("SHOW {name}"), &[]).unwrap().get(0)
            };
            assert_eq!(show(&mut tx, "synchronous_commit"), at_commit, "{given}");
            assert_eq!(show(&mut tx, "search_path"), "\"$user\", public");
            assert_eq!(show(&mut tx, "default_transaction_read_only"), "off");
        }
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }
}
