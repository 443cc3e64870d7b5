//! The transactional mode (see [`crate::store::TransactionalStore`]): one
//! delivery decoded and keyed as in `process`, then its handler and the record
//! of its id committed in one database transaction.

use super::*;
use crate::store::{TransactionalStore, TxRun};

/// Why a transactional handler's work did not commit.
enum WorkFailed<E> {
    Handler(E),
    Panicked(String),
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
        let outcome = match (message, &decision.verdict) {
            (_, Verdict::Reject(r)) => Outcome::Rejected(r.clone()),
            (_, Verdict::StoreUnavailable(e)) => Outcome::StoreUnavailable(e.clone()),
            (Some(_), Verdict::Run) if self.options.fingerprint => Outcome::StoreUnavailable(
                StoreError::unsupported("payload fingerprints are not kept in transactional mode"),
            ),
            (Some(message), verdict) => {
                let fail_open = *verdict == Verdict::FailOpen;
                let key = decision.key.as_deref().filter(|_| !fail_open);
                let run = self.store.transaction(key, self.options.ttl, |tx| {
                    let call = std::panic::catch_unwind(AssertUnwindSafe(|| handler(&message, tx)));
                    match call {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(WorkFailed::Handler(e)),
                        Err(payload) => Err(WorkFailed::Panicked(catch::panic_message(&*payload))),
                    }
                });
                self.report_store_error(StoreOp::Remember, &run);
                match (run, fail_open) {
                    (Ok(TxRun::Committed(())), false) => Outcome::Ran,
                    (Ok(TxRun::Committed(())), true) => Outcome::FailOpen(Ok(())),
                    (Ok(TxRun::RolledBack(WorkFailed::Handler(e))), false) => Outcome::Failed(e),
                    (Ok(TxRun::RolledBack(WorkFailed::Handler(e))), true) => {
                        Outcome::FailOpen(Err(e))
                    }
                    (Ok(TxRun::RolledBack(WorkFailed::Panicked(m))), _) => Outcome::Panicked(m),
                    (Ok(TxRun::AlreadyDone), _) => Outcome::Skipped,
                    (Ok(TxRun::Held), _) => Outcome::Parked,
                    // Nothing committed: the effect is undone too, so a retry is safe.
                    (Err(e), _) => Outcome::StoreUnavailable(e),
                }
            }
            (None, _) => Outcome::StoreUnavailable(StoreError::internal("no message decoded")),
        };
        self.observe_outcome(&decision, &outcome);
        outcome
    }
}
