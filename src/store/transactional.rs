//! [`TransactionalStore`]: a store that records an id in the same database
//! transaction as the handler's own writes, for effects that are writes to that
//! database: both happen, or neither does (exactly-once effects), with no lease.

use std::time::Duration;

use super::{ClaimToken, StoreError, StoreResult};

/// What a transactional run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxRun<T, E> {
    /// The key was already done (and live): nothing ran, nothing was written.
    AlreadyDone,
    /// A live claim of a consumer in claiming mode holds the key: nothing ran.
    Held,
    /// The work succeeded and its writes committed together with the key.
    Committed(T),
    /// The work failed: its writes were rolled back and the key stays unmarked.
    RolledBack(E),
    /// The work returned `Ok`, but its transaction was no longer alive: a
    /// statement in it failed and the database aborted it (PostgreSQL) or rolled
    /// it back (SQLite's `OR ROLLBACK`, `RAISE(ROLLBACK)`, a full disk; on D1,
    /// a statement of the batch refused), and the work carried on as if it had
    /// not. Nothing of it is committed and the key stays unmarked; the error
    /// says what was found. Also a work that ended the transaction itself
    /// (its own `COMMIT` or `ROLLBACK`, where the database cannot refuse them)
    /// and then failed, or rolled it back, or (in a batch) began another: the
    /// key is left unmarked, and the error says that what it wrote outside the
    /// store's transaction stays. Also a commit the
    /// database refused for the work's writes (a deferred constraint): a
    /// batch's entries then run again alone ([`each_alone`]).
    Aborted(StoreError),
}

/// A store whose records live in a database the handler can write to, in one
/// transaction with the record of the id.
///
/// `transaction` begins a write transaction, reads the key's record (done and
/// live: [`TxRun::AlreadyDone`]; claimed and live: [`TxRun::Held`]), else runs
/// `work` with the transaction and, if it succeeds, records the key as done (for
/// `ttl`, or forever) and commits both; if it fails, rolls both back. Two
/// transactions for one key serialize on it (the second waits for the first, then
/// finds the key done), so concurrent duplicates need no claim. `key` `None` (no
/// usable id): the work runs in a transaction and nothing is recorded.
pub trait TransactionalStore {
    /// The open transaction the handler writes through.
    type Tx<'t>;

    /// See the trait's docs. `Err`: the store failed; nothing was committed.
    fn transaction<T, E>(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        work: impl FnOnce(&mut Self::Tx<'_>) -> Result<T, E>,
    ) -> StoreResult<TxRun<T, E>>;

    /// A batch in one transaction, a savepoint per entry: for each `keys[i]` in
    /// order, as [`TransactionalStore::transaction`] does for one, with
    /// `work(i, tx)`; a failed entry rolls back to its savepoint (its own writes
    /// and its key only). One commit at the end; `Err`: the store failed and
    /// nothing was committed. A key repeated in `keys` finds the first entry's
    /// record (`AlreadyDone`) once that one committed to its savepoint.
    fn transaction_batch<E>(
        &self,
        keys: &[Option<&str>],
        ttl: Option<Duration>,
        work: impl FnMut(usize, &mut Self::Tx<'_>) -> Result<(), E>,
    ) -> StoreResult<Vec<TxRun<(), E>>>;
}

/// For a [`TransactionalStore::transaction_batch`] whose one COMMIT the
/// database refused for an entry's writes (a deferred constraint: nothing
/// committed): the entries not yet `settled` run again, a transaction each,
/// so that entry fails alone (its own commit refused: [`TxRun::Aborted`]) and
/// the others commit. The store failing before a rerun committed (or was
/// aborted: a handler's own COMMIT may have kept its writes), and with no such
/// run among the `settled`, fails the batch (`Err`, nothing of it committed);
/// after, the runs it fails are `Aborted` (nothing of them committed, or their
/// redelivery finds them done; but a lost reply to a COMMIT that landed
/// leaves a delivery without an id to run again, as every redelivery of one
/// may), and the settled keep their reports.
pub fn each_alone<S: TransactionalStore + ?Sized, E>(
    store: &S,
    keys: &[Option<&str>],
    ttl: Option<Duration>,
    settled: Vec<Option<TxRun<(), E>>>,
    mut work: impl FnMut(usize, &mut S::Tx<'_>) -> Result<(), E>,
) -> StoreResult<Vec<TxRun<(), E>>> {
    let mut runs = Vec::with_capacity(settled.len());
    // A settled run that may have committed (a handler's own COMMIT, before)
    // keeps its report: the batch does not fail as one.
    let mut committed = (settled.iter().flatten())
        .any(|run| matches!(run, TxRun::Committed(()) | TxRun::Aborted(_)));
    // Once the store failed, the rest are not tried (each could wait out a
    // connect): aborted with its error, retried.
    let mut down: Option<StoreError> = None;
    for (i, settled) in settled.into_iter().enumerate() {
        runs.push(match (settled, &down) {
            (Some(run), _) => run,
            (None, Some(e)) => TxRun::Aborted(e.clone()),
            (None, None) => match store.transaction(keys[i], ttl, |tx| work(i, tx)) {
                Ok(run) => {
                    // Aborted may have committed what a handler's own COMMIT did.
                    committed |= matches!(run, TxRun::Committed(()) | TxRun::Aborted(_));
                    run
                }
                Err(e) if !committed => return Err(e),
                Err(e) => {
                    down = Some(e.clone());
                    TxRun::Aborted(e)
                }
            },
        });
    }
    Ok(runs)
}

/// A store whose transactions are batches of statements rather than an open
/// connection: Cloudflare D1, where a `batch()` runs in one transaction and no
/// statement in it can be decided on by code. The handler hands back its
/// effect as statements, and the store commits them with the id's record in
/// one batch (the id's insert first, so a concurrent run of the same id aborts
/// the whole batch on the id's unique key).
#[allow(async_fn_in_trait)] // Workers' futures are !Send; no Send bound is wanted.
pub trait StatementStore {
    /// One statement of the handler's effect (D1's prepared statement).
    type Statement;

    /// Whether this store, as configured, can commit statements at all (a
    /// store of several backends may not, for some): checked before any
    /// handler runs. `Ok` by default.
    fn check_statements(&self) -> StoreResult<()> {
        Ok(())
    }

    /// Commits `statements` and `key` as done (for `ttl`, or forever) in one
    /// atomic batch; `claim`, the caller's claim on `key` (claiming mode), is
    /// replaced by the done record in it. `Committed(())`: both are written.
    /// `AlreadyDone` / `Held`: the key was done, or another's live claim held
    /// it, when the batch ran; nothing was written. `RolledBack(e)`: the batch failed (a statement of the
    /// handler, or the store) and nothing was written, the key stays unmarked.
    /// `Err`: the store cannot tell whether the batch was written (a redelivery
    /// finds out: the effect and the key are one write). `key` `None` (no usable
    /// id): the statements alone.
    async fn commit_with(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        statements: Vec<Self::Statement>,
    ) -> StoreResult<TxRun<(), StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Runs each work at once and commits, until its `fails_from`-th
    /// transaction, from which the store fails.
    struct Failing {
        fails_from: usize,
        calls: Cell<usize>,
        /// A work that succeeds is aborted (its handler's own COMMIT).
        aborts: bool,
    }

    impl TransactionalStore for Failing {
        type Tx<'t> = ();

        fn transaction<T, E>(
            &self,
            _key: Option<&str>,
            _ttl: Option<Duration>,
            work: impl FnOnce(&mut ()) -> Result<T, E>,
        ) -> StoreResult<TxRun<T, E>> {
            self.calls.set(self.calls.get() + 1);
            if self.calls.get() > self.fails_from {
                return Err(StoreError::unavailable("down"));
            }
            Ok(match work(&mut ()) {
                Ok(_) if self.aborts => TxRun::Aborted(StoreError::internal("its own COMMIT")),
                Ok(value) => TxRun::Committed(value),
                Err(e) => TxRun::RolledBack(e),
            })
        }

        fn transaction_batch<E>(
            &self,
            _keys: &[Option<&str>],
            _ttl: Option<Duration>,
            _work: impl FnMut(usize, &mut ()) -> Result<(), E>,
        ) -> StoreResult<Vec<TxRun<(), E>>> {
            unreachable!("each_alone runs entries one by one")
        }
    }

    fn rerun(fails_from: usize, aborts: bool) -> StoreResult<Vec<TxRun<(), ()>>> {
        rerun_after(fails_from, aborts, TxRun::Held)
    }

    fn rerun_after(
        fails_from: usize,
        aborts: bool,
        second: TxRun<(), ()>,
    ) -> StoreResult<Vec<TxRun<(), ()>>> {
        let store = Failing {
            fails_from,
            calls: Cell::new(0),
            aborts,
        };
        let keys = [Some("a"), Some("b"), Some("c")];
        let settled = vec![None, Some(second), None];
        each_alone(&store, &keys, None, settled, |_, _| Ok(()))
    }

    /// A store down before any rerun committed fails the batch as one (the
    /// guard says store-unavailable); after one committed, the rest are
    /// aborted runs; settled entries are kept and not run.
    #[test]
    fn the_store_failing_during_the_reruns() {
        assert!(rerun(0, false).is_err());
        let runs = rerun(1, false).unwrap();
        assert!(
            matches!(
                runs.as_slice(),
                [TxRun::Committed(()), TxRun::Held, TxRun::Aborted(_)]
            ),
            "{runs:?}"
        );
        assert!(matches!(
            rerun(5, false).unwrap().as_slice(),
            [TxRun::Committed(()), TxRun::Held, TxRun::Committed(())]
        ));
        // An aborted rerun may have kept what its handler committed itself:
        // the batch is not failed as one after it (its report would be lost).
        let runs = rerun(1, true).unwrap();
        assert!(
            matches!(
                runs.as_slice(),
                [TxRun::Aborted(_), TxRun::Held, TxRun::Aborted(_)]
            ),
            "{runs:?}"
        );
        // So may a settled one (a batch delivery whose handler committed
        // itself): the store down for every rerun keeps its report, which
        // says what it committed (a review's finding: the batch failed as
        // one, and the redelivery wrote it again unreported).
        for settled in [
            TxRun::Aborted(StoreError::internal("its own COMMIT")),
            TxRun::Committed(()),
        ] {
            let runs = rerun_after(0, false, settled).unwrap();
            assert!(
                matches!(
                    runs.as_slice(),
                    [
                        TxRun::Aborted(_),
                        TxRun::Aborted(_) | TxRun::Committed(()),
                        TxRun::Aborted(_)
                    ]
                ),
                "{runs:?}"
            );
        }
    }
}
