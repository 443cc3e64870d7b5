//! The exactly-once commits: a delivery's handler and the record of its id in
//! one database transaction ([`TransactionalStore`]) or one batch of statements
//! ([`StatementStore`]). Deciding, the in-batch leader rule and the outcome
//! rules are the pipeline's own (`decide`, `commit`); only the commit differs.

use super::commit::outcome_of;
use super::decide::mark_followers;
use super::*;
use crate::store::{StatementStore, TransactionalStore, TxRun};

impl<S: Store, O: Observer, T: Timer> Guard<S, O, T> {
    /// [`Guard::classify`] for the exactly-once modes, which keep no payload
    /// fingerprints: with them asked for, every keyed delivery fails closed.
    fn classify_exactly_once<'b, B: Body + ?Sized>(
        &self,
        body: &'b B,
        mode: Mode,
    ) -> (Option<Message<'b>>, Decision) {
        let (message, mut decision) = self.classify(body);
        decision.span.set_mode(mode);
        if decision.verdict == Verdict::Run && self.options.fingerprint {
            let refused =
                StoreError::unsupported("payload fingerprints are not kept in transactional mode");
            let span = std::mem::take(&mut decision.span);
            decision = Decision::unkeyed(Verdict::StoreUnavailable(refused));
            decision.span = span;
        }
        (message, decision)
    }
}

/// The message to run and the key to record with it (`None`: fail-open,
/// nothing recorded); or, for a delivery that runs nothing, its outcome.
fn start<'a, 'm, 'd, E>(
    message: Option<&'a Message<'m>>,
    decision: &'d Decision,
) -> Result<(&'a Message<'m>, Option<&'d str>), Outcome<E>> {
    match (message, &decision.verdict) {
        (Some(message), Verdict::Run) => Ok((message, decision.key.as_deref())),
        (Some(message), Verdict::FailOpen) => Ok((message, None)),
        (_, verdict) => Err(outcome_of(verdict, None, &Ok(true))),
    }
}

/// The handler's call, a panic caught as a failure (the store rolls it back).
fn guarded<E>(call: impl FnOnce() -> Result<(), E>) -> Result<(), HandlerResult<E>> {
    match std::panic::catch_unwind(AssertUnwindSafe(call)) {
        Ok(result) => result.map_err(HandlerResult::Err),
        Err(payload) => Err(HandlerResult::Panicked(catch::panic_message(&*payload))),
    }
}

/// A run's outcome by the pipeline's rules: a commit is a recorded success, a
/// rollback the handler's failure, an id found done a skip, one held a park.
fn outcome_of_run<E>(
    verdict: &Verdict,
    run: StoreResult<TxRun<(), HandlerResult<E>>>,
) -> Outcome<E> {
    match run {
        Ok(TxRun::Committed(())) => outcome_of(verdict, Some(HandlerResult::Ok), &Ok(true)),
        Ok(TxRun::RolledBack(failed)) => outcome_of(verdict, Some(failed), &Ok(true)),
        Ok(TxRun::AlreadyDone) => Outcome::Skipped,
        Ok(TxRun::Held) => Outcome::Parked,
        Ok(TxRun::Aborted(e)) => Outcome::TransactionAborted(e),
        // Nothing committed, the effect undone too, so a retry is safe; or,
        // where the store's error says so (a delivery without an id whose
        // handler ran its own COMMIT), what it wrote may be committed.
        Err(e) => Outcome::StoreUnavailable(e),
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
        let (message, decision) = self.classify_exactly_once(body, Mode::Transactional);
        let outcome = match start(message.as_ref(), &decision) {
            Err(outcome) => outcome,
            Ok((message, key)) => {
                let span = &decision.span;
                let run = self.store_call_sync("transaction", key.iter().len(), [span], || {
                    self.store.transaction(key, self.options.ttl, |tx| {
                        guarded(|| span::in_span_sync(span, || handler(message, tx)))
                    })
                });
                self.report_store_error(StoreOp::Remember, &run);
                outcome_of_run(&decision.verdict, run)
            }
        };
        self.observe_outcome(&decision, &outcome);
        outcome
    }

    /// [`Guard::process_in_transaction`] for a batch: one transaction, a
    /// savepoint per delivery, so a failing delivery rolls back only its own
    /// writes (and leaves its id unmarked) while the others commit. A COMMIT
    /// refused for one delivery's writes (a deferred constraint) runs the
    /// batch again at once, a transaction per delivery: that one fails alone. Deliveries
    /// sharing an id run at most once: a later one skips after its leader ran,
    /// parks after its leader failed. Invalid ones are rejected and run nothing.
    pub fn process_batch_in_transaction<B: Body, E>(
        &self,
        bodies: &[B],
        mut handler: impl FnMut(&Message<'_>, &mut S::Tx<'_>) -> Result<(), E>,
    ) -> Vec<Outcome<E>> {
        let (messages, mut decisions): (Vec<_>, Vec<_>) = bodies
            .iter()
            .map(|b| self.classify_exactly_once(b, Mode::Transactional))
            .unzip();
        self.observe_batch(decisions.len());
        // Later deliveries of an id follow their leader (resolved below).
        mark_followers(&mut decisions);
        let mut outcomes: Vec<Option<Outcome<E>>> = Vec::with_capacity(bodies.len());
        let mut runs: Vec<(usize, &Message<'_>, Option<&str>)> = Vec::new();
        for (i, decision) in decisions.iter().enumerate() {
            outcomes.push(match start(messages[i].as_ref(), decision) {
                Ok((message, key)) => {
                    runs.push((i, message, key));
                    None
                }
                Err(outcome) => Some(outcome),
            });
        }
        let keys: Vec<Option<&str>> = runs.iter().map(|&(_, _, key)| key).collect();
        let spans = runs.iter().map(|&(i, ..)| &decisions[i].span);
        let run = self.store_call_sync("transaction_batch", keys.len(), spans, || {
            self.store
                .transaction_batch(&keys, self.options.ttl, |n, tx| {
                    guarded(|| {
                        let (i, message, _) = runs[n];
                        span::in_span_sync(&decisions[i].span, || handler(message, tx))
                    })
                })
        });
        self.report_store_error(StoreOp::Remember, &run);
        match run {
            Ok(results) => {
                for (&(i, ..), result) in runs.iter().zip(results) {
                    outcomes[i] = Some(outcome_of_run(&decisions[i].verdict, Ok(result)));
                }
            }
            Err(e) => {
                for &(i, ..) in &runs {
                    outcomes[i] = Some(Outcome::StoreUnavailable(e.clone()));
                }
            }
        }
        self.resolve(&decisions, |i| {
            outcomes[i]
                .take()
                .unwrap_or_else(|| Outcome::StoreUnavailable(StoreError::internal("no outcome")))
        })
    }
}

impl<S: Store + StatementStore, O: Observer, T: Timer> Guard<S, O, T> {
    /// Exactly-once effects on a store whose transactions are batches of
    /// statements (Cloudflare D1): decodes and keys `body` as
    /// [`Guard::process`] does; an id already done is `skip` and one held by a
    /// claiming-mode consumer `park` (nothing runs; [`Decision::park_for`] has
    /// how long its claim has left, where the store can tell); else `handler`
    /// builds the statements of its effect, and the store commits them with the
    /// id's record in one batch ([`StatementStore::commit_with`]). `run-ok`: both
    /// were written, once. A handler that fails or panics writes nothing
    /// (`failed` / `panicked`, the id unmarked). A duplicate that committed
    /// between the check and the batch makes the batch abort whole: `skip`, its
    /// statements never applied. A batch that failed is `store-unavailable`,
    /// nothing written; retried, the handler builds its statements again. No
    /// usable id: the statements are committed alone (`fail-open`). Payload
    /// fingerprints are refused here.
    ///
    /// In claiming mode the id is claimed before its handler runs, as in the
    /// other modes (and renewed while it runs, with a timer:
    /// [`Guard::with_timer`]), and the batch replaces the claim with the id's
    /// record; a handler that fails (or a batch that fails whole) gives it
    /// back. A delivery whose handler ended the process (a panic on wasm, a
    /// CPU limit) leaves its claim, so on its redelivery it parks until the
    /// lease ends and the deliveries after it run: without claiming they ran
    /// after it again, and went with it to the dead-letter queue unrun (a
    /// trial).
    pub async fn process_with_statements<B: Body + ?Sized, E>(
        &self,
        body: &B,
        handler: impl AsyncFnOnce(&Message<'_>) -> Result<Vec<S::Statement>, E>,
    ) -> Processed<E> {
        let (message, mut decision) = self.classify_exactly_once(body, Mode::Statements);
        // A claim's time runs from when the call is sent (fc1e33a).
        let asked_at = self.now();
        if let (Some(lease), Verdict::Run) = (self.options.claim_lease, &decision.verdict) {
            self.claim_all(&[0], std::slice::from_mut(&mut decision), lease)
                .await;
        }
        let (outcome, park_for) = match start(message.as_ref(), &decision) {
            // (A park's time: what the claim it found has left.)
            Err(outcome) => (outcome, decision.park_for),
            Ok((message, key)) => {
                self.run_statements(message, key, &decision, asked_at, handler)
                    .await
            }
        };
        decision.park_for = park_for;
        self.observe_outcome(&decision, &outcome);
        Processed { decision, outcome }
    }

    /// The pre-check (none for an id claimed before), the handler and the
    /// batch of one delivery; a `park` comes with the time its claim has left,
    /// where the store can tell.
    async fn run_statements<E>(
        &self,
        message: &Message<'_>,
        key: Option<&str>,
        decision: &Decision,
        claimed_at: Option<u64>,
        handler: impl AsyncFnOnce(&Message<'_>) -> Result<Vec<S::Statement>, E>,
    ) -> (Outcome<E>, Option<Duration>) {
        let claimed = key.zip(decision.claim.as_ref());
        let (verdict, span) = (&decision.verdict, &decision.span);
        if let (Some(key), None) = (key, claimed) {
            let keys = [key];
            let call = self.store.peek_many(&keys);
            let peeked = self.store_call("peek_many", 1, [span], call).await;
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
        // The handler, its claim renewed on the timer's ticks while it runs
        // (a handler slower than the lease kept the id to itself).
        let mut handler = Some(handler);
        let mut built = None;
        let mut build = async |msg: &Message<'_>| {
            if let Some(handler) = handler.take() {
                built = Some(handler(msg).await?);
            }
            Ok(())
        };
        let started = claimed.and_then(|_| self.renewing()).and(claimed_at);
        let mut progress = Progress::new(1, started);
        let decisions = std::slice::from_ref(decision);
        let result = self
            .run_kept_alive(&mut build, message, decisions, &mut progress, 0)
            .await;
        let statements = match (result, built) {
            (HandlerResult::Ok, Some(statements)) => statements,
            (HandlerResult::Err(e), _) => {
                self.give_back(claimed, span).await;
                return (
                    outcome_of(verdict, Some(HandlerResult::Err(e)), &Ok(true)),
                    None,
                );
            }
            // A panic; or (never) a success whose statements were not kept:
            // nothing written, retried.
            (result, _) => {
                self.give_back(claimed, span).await;
                let why = match result {
                    HandlerResult::Panicked(panic) => panic,
                    _ => "the handler's statements were not kept".to_owned(),
                };
                return (Outcome::Panicked(why), None);
            }
        };
        let claim = claimed.map(|(_, token)| token);
        let call = self
            .store
            .commit_with(key, self.options.ttl, claim, statements);
        let run = self.store_call("commit_with", 1, [span], call).await;
        // Nothing written: the claim given back for the retry.
        if let Ok(TxRun::RolledBack(_) | TxRun::Aborted(_)) = &run {
            self.give_back(claimed, span).await;
        }
        // A batch that failed whole is the store's error, as one that cannot tell.
        let run = run.and_then(|run| match run {
            TxRun::RolledBack(e) => Err(e),
            TxRun::Committed(()) => Ok(TxRun::Committed(())),
            TxRun::AlreadyDone => Ok(TxRun::AlreadyDone),
            TxRun::Held => Ok(TxRun::Held),
            TxRun::Aborted(e) => Ok(TxRun::Aborted(e)),
        });
        self.report_store_error(StoreOp::Remember, &run);
        (outcome_of_run(verdict, run), None)
    }
}
