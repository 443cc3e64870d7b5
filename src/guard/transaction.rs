//! The transactional mode (see [`crate::store::TransactionalStore`]): one
//! delivery decoded and keyed as in `process`, then its handler and the record
//! of its id committed in one database transaction.

use super::*;
use crate::store::{Peeked, StatementStore, TransactionalStore, TxRun};

/// Why a transactional handler's work did not commit.
enum WorkFailed<E> {
    Handler(E),
    Panicked(String),
}

/// A keyed delivery with payload fingerprints on: not kept in this mode.
fn fingerprints_refused() -> StoreError {
    StoreError::unsupported("payload fingerprints are not kept in transactional mode")
}

/// Where a transactional run of one classified delivery starts: its message,
/// the key to record (`None`: fail-open, nothing recorded) and whether it is
/// fail-open; or the outcome it ends with before anything runs (rejected, the
/// store refused, fingerprints asked for).
fn start<'a, 'm, 'd, E>(
    message: Option<&'a Message<'m>>,
    decision: &'d Decision,
    fingerprint: bool,
) -> Result<(&'a Message<'m>, Option<&'d str>, bool), Outcome<E>> {
    match (message, &decision.verdict) {
        (_, Verdict::Reject(r)) => Err(Outcome::Rejected(r.clone())),
        (_, Verdict::StoreUnavailable(e)) => Err(Outcome::StoreUnavailable(e.clone())),
        (Some(_), Verdict::Run) if fingerprint => {
            Err(Outcome::StoreUnavailable(fingerprints_refused()))
        }
        (Some(message), verdict) => {
            let fail_open = *verdict == Verdict::FailOpen;
            let key = decision.key.as_deref().filter(|_| !fail_open);
            Ok((message, key, fail_open))
        }
        (None, _) => Err(Outcome::StoreUnavailable(StoreError::internal(
            "no message decoded",
        ))),
    }
}

/// The handler's call, a panic caught as a failure (the store rolls it back).
fn guarded<E>(call: impl FnOnce() -> Result<(), E>) -> Result<(), WorkFailed<E>> {
    match std::panic::catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(WorkFailed::Handler(e)),
        Err(payload) => Err(WorkFailed::Panicked(catch::panic_message(&*payload))),
    }
}

/// A transactional run's outcome.
fn outcome_of_run<E>(run: StoreResult<TxRun<(), WorkFailed<E>>>, fail_open: bool) -> Outcome<E> {
    match (run, fail_open) {
        (Ok(TxRun::Committed(())), false) => Outcome::Ran,
        (Ok(TxRun::Committed(())), true) => Outcome::FailOpen(Ok(())),
        (Ok(TxRun::RolledBack(WorkFailed::Handler(e))), false) => Outcome::Failed(e),
        (Ok(TxRun::RolledBack(WorkFailed::Handler(e))), true) => Outcome::FailOpen(Err(e)),
        (Ok(TxRun::RolledBack(WorkFailed::Panicked(m))), _) => Outcome::Panicked(m),
        (Ok(TxRun::AlreadyDone), _) => Outcome::Skipped,
        (Ok(TxRun::Held), _) => Outcome::Parked,
        (Ok(TxRun::Aborted(e)), _) => Outcome::TransactionAborted(e),
        // Nothing committed: the effect is undone too, so a retry is safe.
        (Err(e), _) => Outcome::StoreUnavailable(e),
    }
}

impl<S: Store + TransactionalStore, O: Observer, T: Timer> Guard<S, O, T> {
    /// Exactly-once effects for database writes: decodes and keys `body` as
    /// [`Guard::process`] does, then runs `handler` with the store's open
    /// transaction and records the id in that same transaction. The handler's
    /// writes and the id commit together, or (it failed or panicked) roll back
    /// together, so a redelivery finds either both or neither: `run-ok` means the
    /// effect happened exactly once. A delivery whose id is already recorded is
    /// `skip` (nothing runs); one held by a claiming-mode consumer is `park`; no
    /// usable id runs the handler in a transaction with nothing recorded
    /// (`fail-open`). Claiming options are not used: the database serializes
    /// duplicates. Payload fingerprints are refused here.
    pub fn process_in_transaction<B: Body + ?Sized, E>(
        &self,
        body: &B,
        handler: impl FnOnce(&Message<'_>, &mut S::Tx<'_>) -> Result<(), E>,
    ) -> Outcome<E> {
        let (message, decision) = self.classify(body);
        let outcome = match start(message.as_ref(), &decision, self.options.fingerprint) {
            Err(outcome) => outcome,
            Ok((message, key, fail_open)) => {
                let run = self
                    .store
                    .transaction(key, self.options.ttl, |tx| guarded(|| handler(message, tx)));
                self.report_store_error(StoreOp::Remember, &run);
                outcome_of_run(run, fail_open)
            }
        };
        self.observe_outcome(&decision, &outcome);
        outcome
    }

    /// [`Guard::process_in_transaction`] for a batch: one transaction, a
    /// savepoint per delivery, so a failing delivery rolls back only its own
    /// writes (and leaves its id unmarked) while the others commit. Deliveries
    /// sharing an id run at most once: a later one skips after its leader ran,
    /// parks after its leader failed. Invalid ones are rejected and run nothing.
    pub fn process_batch_in_transaction<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl FnMut(&Message<'_>, &mut S::Tx<'_>) -> Result<(), E>,
    ) -> Vec<Outcome<E>> {
        let classified: Vec<(Option<Message<'_>>, Decision)> =
            bodies.iter().map(|body| self.classify(body)).collect();
        // Each delivery ends before anything runs, follows the first of its id
        // (its leader), or runs: with its message, its key and whether fail-open.
        let mut outcomes: Vec<Option<Outcome<E>>> = (0..bodies.len()).map(|_| None).collect();
        let mut leaders: Vec<Option<usize>> = vec![None; bodies.len()];
        let mut first_of: hashbrown::HashMap<&str, usize, RandomState> =
            hashbrown::HashMap::with_hasher(RandomState::default());
        let mut runs: Vec<(usize, &Message<'_>, Option<&str>, bool)> = Vec::new();
        for (i, (message, decision)) in classified.iter().enumerate() {
            match start(message.as_ref(), decision, self.options.fingerprint) {
                Err(outcome) => outcomes[i] = Some(outcome),
                Ok((message, key, fail_open)) => match key.map(|k| (k, first_of.get(k))) {
                    Some((_, Some(&leader))) => leaders[i] = Some(leader),
                    Some((key, None)) => {
                        first_of.insert(key, i);
                        runs.push((i, message, Some(key), fail_open));
                    }
                    None => runs.push((i, message, None, fail_open)),
                },
            }
        }
        let keys: Vec<Option<&str>> = runs.iter().map(|&(_, _, key, _)| key).collect();
        let run = self
            .store
            .transaction_batch(&keys, self.options.ttl, |n, tx| {
                guarded(|| handler(runs[n].1, tx))
            });
        self.report_store_error(StoreOp::Remember, &run);
        match run {
            Ok(results) => {
                for (&(i, _, _, fail_open), result) in runs.iter().zip(results) {
                    outcomes[i] = Some(outcome_of_run(Ok(result), fail_open));
                }
            }
            Err(e) => {
                for &(i, ..) in &runs {
                    outcomes[i] = Some(Outcome::StoreUnavailable(e.clone()));
                }
            }
        }
        let mut done: Vec<Outcome<E>> = Vec::with_capacity(bodies.len());
        for (i, (_, decision)) in classified.iter().enumerate() {
            let outcome = match (outcomes[i].take(), leaders[i]) {
                (Some(outcome), _) => outcome,
                (None, Some(leader)) => match &done[leader] {
                    Outcome::Ran | Outcome::Skipped => Outcome::Skipped,
                    Outcome::StoreUnavailable(e) => Outcome::StoreUnavailable(e.clone()),
                    _ => Outcome::Parked,
                },
                // Every delivery ended, follows a leader or ran: not reached.
                (None, None) => Outcome::StoreUnavailable(StoreError::internal("no outcome")),
            };
            self.observe_outcome(decision, &outcome);
            done.push(outcome);
        }
        done
    }
}

impl<S: Store + StatementStore, O: Observer, T: Timer> Guard<S, O, T> {
    /// Exactly-once effects on a store whose transactions are batches of
    /// statements (Cloudflare D1): decodes and keys `body` as
    /// [`Guard::process`] does; an id already done is `skip` and one held by a
    /// claiming-mode consumer `park` (nothing runs); else `handler` builds the
    /// statements of its effect, and the store commits them with the id's
    /// record in one batch ([`StatementStore::commit_with`]). `run-ok`: both
    /// were written, once. A handler that fails or panics writes nothing
    /// (`failed` / `panicked`, the id unmarked). A duplicate that committed
    /// between the check and the batch makes the batch abort whole: `skip`, its
    /// statements never applied. A batch that failed is `store-unavailable`,
    /// nothing written; retried, the handler builds its statements again. No
    /// usable id: the statements are committed alone (`fail-open`). Payload
    /// fingerprints are refused here.
    pub async fn process_with_statements<B: Body + ?Sized, E>(
        &self,
        body: &B,
        handler: impl AsyncFnOnce(&Message<'_>) -> Result<Vec<S::Statement>, E>,
    ) -> Outcome<E> {
        self.process_with_statements_decided(body, handler).await.1
    }

    /// [`Guard::process_with_statements`], with the delivery's decision: a
    /// delivery that parked on a claim the store could time has that claim's
    /// time left in `park_for` (a queue redelivers it just after).
    pub async fn process_with_statements_decided<B: Body + ?Sized, E>(
        &self,
        body: &B,
        handler: impl AsyncFnOnce(&Message<'_>) -> Result<Vec<S::Statement>, E>,
    ) -> (Decision, Outcome<E>) {
        let (message, mut decision) = self.classify(body);
        let (outcome, park_for) = match start(message.as_ref(), &decision, self.options.fingerprint)
        {
            Err(outcome) => (outcome, None),
            Ok((message, key, fail_open)) => {
                self.run_statements(message, key, fail_open, handler).await
            }
        };
        decision.park_for = park_for;
        self.observe_outcome(&decision, &outcome);
        (decision, outcome)
    }

    /// The pre-check, the handler and the batch of one delivery; a `park`
    /// comes with the time its claim has left, where the store can tell.
    async fn run_statements<E>(
        &self,
        message: &Message<'_>,
        key: Option<&str>,
        fail_open: bool,
        handler: impl AsyncFnOnce(&Message<'_>) -> Result<Vec<S::Statement>, E>,
    ) -> (Outcome<E>, Option<Duration>) {
        if let Some(key) = key {
            let peeked = self.store.peek_many(&[key]).await;
            self.report_store_error(StoreOp::Seen, &peeked);
            match peeked.map(|p| p.into_iter().next()) {
                Err(e) => return (Outcome::StoreUnavailable(e), None),
                Ok(Some(Peeked::Done)) => return (Outcome::Skipped, None),
                Ok(Some(Peeked::NotDone {
                    claim_ends_in: Some(left),
                })) if !left.is_zero() => return (Outcome::Parked, Some(left)),
                // Free, or a store that cannot tell: the batch's insert decides.
                Ok(_) => {}
            }
        }
        let statements = match catch::caught(async { handler(message).await }).await {
            Ok(Ok(statements)) => statements,
            Ok(Err(e)) if fail_open => return (Outcome::FailOpen(Err(e)), None),
            Ok(Err(e)) => return (Outcome::Failed(e), None),
            Err(panic) => return (Outcome::Panicked(panic), None),
        };
        // A batch that failed whole is the store's error, as one that cannot tell.
        let run = match self
            .store
            .commit_with(key, self.options.ttl, statements)
            .await
        {
            Ok(TxRun::RolledBack(e)) => Err(e),
            run => run,
        };
        self.report_store_error(StoreOp::Remember, &run);
        let outcome = match run {
            Ok(TxRun::Committed(())) if fail_open => Outcome::FailOpen(Ok(())),
            Ok(TxRun::Committed(())) => Outcome::Ran,
            Ok(TxRun::AlreadyDone) => Outcome::Skipped,
            // A claim taken since the pre-check: how long it has left is not known.
            Ok(TxRun::Held) => Outcome::Parked,
            Ok(TxRun::Aborted(e)) => Outcome::TransactionAborted(e),
            Ok(TxRun::RolledBack(e)) | Err(e) => Outcome::StoreUnavailable(e),
        };
        (outcome, None)
    }
}
