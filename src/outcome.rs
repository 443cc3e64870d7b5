//! What happened to one delivery, and what the transport should do about it.

use crate::envelope::Rejection;
use crate::store::StoreError;

/// The result of putting one delivery through the guard.
///
/// `E` is the handler's error type, returned unchanged in [`Outcome::Failed`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<E> {
    /// run-ok: the handler ran, succeeded, and the id was remembered.
    Ran,
    /// The handler ran and succeeded, but remembering the id failed. The message
    /// is still acked (see the crate docs: re-running a succeeded handler is the
    /// worse duplicate); the error is here and reported to the observer.
    RanUnrecorded(StoreError),
    /// run-ok-lease-lost: the handler ran and succeeded, but its claim had been
    /// lost by then (it expired and another consumer took it, or the id was
    /// forgotten), so another consumer may have run the same id too. Acked: the
    /// effect already happened. Counted and reported: check the effect for a
    /// duplicate, and lengthen the lease (or shorten the handler) so renewals
    /// keep it.
    RanLeaseLost,
    /// run-failed: the handler returned an error, given back unchanged. The id is
    /// left unmarked (and any claim released), so a redelivery runs it again.
    Failed(E),
    /// The handler panicked (native targets only; on wasm a panic aborts). Treated
    /// like `Failed`: the id is left unmarked.
    Panicked(String),
    /// run-failed, in the transactional mode: the handler returned `Ok`, but a
    /// statement in its transaction had failed and the database had aborted or
    /// rolled back the transaction (an error the handler swallowed). Nothing was
    /// committed and the id is left unmarked, so a redelivery runs it again.
    TransactionAborted(StoreError),
    /// skip: the id was already processed; the handler did not run.
    Skipped,
    /// fail-open: no usable `meta.id`, so the handler ran without dedupe. Carries
    /// the handler's own result.
    FailOpen(Result<(), E>),
    /// park: another consumer holds the claim on this id (or, in a batch, a
    /// duplicate of this delivery failed). Redeliver later; not a failure.
    Parked,
    /// rejected: not a valid envelope (a poison message). The handler did not run.
    Rejected(Rejection),
    /// The store could not say whether the id was processed, so the handler did
    /// not run (fail-closed). Retry. In the transactional mode also a store
    /// failing after the handler ran (its batch's record or commit): its
    /// transaction was rolled back, nothing of it committed, but what it did
    /// outside the database (a call it made) was done.
    StoreUnavailable(StoreError),
    /// payload-mismatch: the id was already processed with a different `data`
    /// ([`crate::Options::fingerprint`]). The handler did not run; dead-letter the
    /// message, so the reused id is looked at instead of acked away.
    PayloadMismatch,
}

/// What the transport should do with the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Done: acknowledge so the broker stops redelivering.
    Ack,
    /// Redeliver later.
    Retry,
    /// Can never succeed: dead-letter it (or let the broker's retry limit do so).
    Poison,
}

impl Disposition {
    /// A stable code: `ack`, `retry` or `poison`.
    pub fn code(self) -> &'static str {
        match self {
            Disposition::Ack => "ack",
            Disposition::Retry => "retry",
            Disposition::Poison => "poison",
        }
    }
}

/// The outcome without its payload, for counting and for the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// `run-ok`: the handler ran and succeeded, and the id is remembered.
    Ran,
    /// `run-ok-unrecorded`: it succeeded, but the id could not be remembered.
    RanUnrecorded,
    /// `run-ok-lease-lost`: it succeeded after its claim was lost.
    RanLeaseLost,
    /// `run-failed`: the handler returned an error.
    Failed,
    /// `run-panicked`: the handler panicked.
    Panicked,
    /// `skip`: already processed.
    Skipped,
    /// `fail-open`: no usable id; the handler ran and succeeded, undeduped.
    FailOpen,
    /// `fail-open-failed`: no usable id; the handler ran and failed.
    FailOpenFailed,
    /// `park`: another consumer holds the claim, or an earlier delivery of the
    /// id in the batch failed or did not run.
    Parked,
    /// `rejected`: not a valid envelope.
    Rejected,
    /// `store-unavailable`: the store could not answer.
    StoreUnavailable,
    /// `payload-mismatch`: processed before with another payload.
    PayloadMismatch,
}

impl OutcomeKind {
    /// A stable kebab-case code, shared with the WIT contract and the JS package.
    pub fn code(self) -> &'static str {
        match self {
            OutcomeKind::Ran => "run-ok",
            OutcomeKind::RanUnrecorded => "run-ok-unrecorded",
            OutcomeKind::RanLeaseLost => "run-ok-lease-lost",
            OutcomeKind::Failed => "run-failed",
            OutcomeKind::Panicked => "run-panicked",
            OutcomeKind::Skipped => "skip",
            OutcomeKind::FailOpen => "fail-open",
            OutcomeKind::FailOpenFailed => "fail-open-failed",
            OutcomeKind::Parked => "park",
            OutcomeKind::Rejected => "rejected",
            OutcomeKind::StoreUnavailable => "store-unavailable",
            OutcomeKind::PayloadMismatch => "payload-mismatch",
        }
    }

    /// Why, for the kinds whose reason carries nothing of the delivery's own
    /// (an error's or a rejection's text): the one wording every target
    /// prints. [`Outcome::reason`] gives these and the rest.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            OutcomeKind::Parked => Some(
                "its id is held: by another consumer's claim, or by an earlier delivery of it \
                 in this batch that failed or did not run; redeliver later",
            ),
            OutcomeKind::RanLeaseLost => Some(
                "ran, but lost its claim before it was recorded: the id may have run elsewhere too",
            ),
            OutcomeKind::PayloadMismatch => {
                Some("the id was already processed with a different payload")
            }
            OutcomeKind::FailOpen => {
                Some("no usable meta.id (absent, null, empty or not a string): ran without dedupe")
            }
            _ => None,
        }
    }

    /// What the queue should do with the message.
    pub fn disposition(self) -> Disposition {
        match self {
            OutcomeKind::Ran
            | OutcomeKind::RanUnrecorded
            | OutcomeKind::RanLeaseLost
            | OutcomeKind::Skipped => Disposition::Ack,
            OutcomeKind::FailOpen => Disposition::Ack,
            OutcomeKind::Failed
            | OutcomeKind::Panicked
            | OutcomeKind::FailOpenFailed
            | OutcomeKind::Parked
            | OutcomeKind::StoreUnavailable => Disposition::Retry,
            OutcomeKind::Rejected | OutcomeKind::PayloadMismatch => Disposition::Poison,
        }
    }

    /// Is it a failure as telemetry reports one (a span's status ERROR): the
    /// delivery was not done, and not because another consumer holds it.
    pub fn is_failure(self) -> bool {
        !matches!(
            self,
            OutcomeKind::Ran
                | OutcomeKind::RanUnrecorded
                | OutcomeKind::RanLeaseLost
                | OutcomeKind::Skipped
                | OutcomeKind::FailOpen
                | OutcomeKind::Parked
        )
    }

    /// Did the handler itself fail (return an error, panic or throw)? Such a
    /// delivery's span carries the SDKs' `exception` event.
    pub fn handler_failed(self) -> bool {
        matches!(
            self,
            OutcomeKind::Failed | OutcomeKind::Panicked | OutcomeKind::FailOpenFailed
        )
    }

    /// Did the handler run (its side effect fire) for this delivery?
    /// `StoreUnavailable` says no, though in the transactional mode the
    /// handler may have run with its transaction rolled back
    /// ([`Outcome::StoreUnavailable`]).
    pub fn handler_ran(self) -> bool {
        matches!(
            self,
            OutcomeKind::Ran
                | OutcomeKind::RanUnrecorded
                | OutcomeKind::RanLeaseLost
                | OutcomeKind::Failed
                | OutcomeKind::Panicked
                | OutcomeKind::FailOpen
                | OutcomeKind::FailOpenFailed
        )
    }
}

impl<E> Outcome<E> {
    /// The outcome without its payload.
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Ran => OutcomeKind::Ran,
            Outcome::RanUnrecorded(_) => OutcomeKind::RanUnrecorded,
            Outcome::RanLeaseLost => OutcomeKind::RanLeaseLost,
            Outcome::Failed(_) => OutcomeKind::Failed,
            Outcome::Panicked(_) => OutcomeKind::Panicked,
            Outcome::TransactionAborted(_) => OutcomeKind::Failed,
            Outcome::Skipped => OutcomeKind::Skipped,
            Outcome::FailOpen(Ok(())) => OutcomeKind::FailOpen,
            Outcome::FailOpen(Err(_)) => OutcomeKind::FailOpenFailed,
            Outcome::Parked => OutcomeKind::Parked,
            Outcome::Rejected(_) => OutcomeKind::Rejected,
            Outcome::StoreUnavailable(_) => OutcomeKind::StoreUnavailable,
            Outcome::PayloadMismatch => OutcomeKind::PayloadMismatch,
        }
    }

    /// What the queue should do with the message.
    pub fn disposition(&self) -> Disposition {
        self.kind().disposition()
    }

    /// A human-readable reason for anything but a plain run or skip.
    pub fn reason(&self) -> Option<String>
    where
        E: std::fmt::Display,
    {
        self.reason_by(|e| Some(e.to_string()))
    }

    /// [`Outcome::reason`], the handler's error told by `describe` (for an `E`
    /// that is not `Display`).
    pub fn reason_by(&self, describe: impl FnOnce(&E) -> Option<String>) -> Option<String> {
        match self {
            Outcome::RanUnrecorded(e) | Outcome::StoreUnavailable(e) => Some(e.to_string()),
            // The store's message says what it found (the handler's own
            // swallowed error, or a batch neighbour's).
            Outcome::TransactionAborted(e) => Some(e.message.clone()),
            Outcome::Failed(e) | Outcome::FailOpen(Err(e)) => describe(e),
            Outcome::Panicked(msg) => Some(format!("handler panicked: {msg}")),
            Outcome::Rejected(r) => Some(r.to_string()),
            Outcome::RanLeaseLost
            | Outcome::PayloadMismatch
            | Outcome::Parked
            | Outcome::FailOpen(Ok(())) => self.kind().reason().map(str::to_string),
            _ => None,
        }
    }
}
