//! The Queues consumer: one batch in, one action per message out.

use std::fmt::Display;

use std::time::Duration;

use bq_dedupe::store::StatementStore;
use bq_dedupe::{
    Disposition, Guard, Message, Observer, Outcome, OutcomeKind, Processed, Store, guard::Mode,
    guard::Verdict, lease::NoTimer, lease::Timer,
};
use wasm_bindgen::JsValue;
use worker::{Queue, QueueContentType, RawMessageBuilder};

use crate::batch::{HandlerMessage, QueueBatch, QueueMessage, describe};
use crate::body::is_whole_text;
use crate::dead_letter::{
    DeadDelivery, MAX_DEAD_LETTER_BYTES, NOT_TEXT, TOO_LARGE, wrap, wrap_block_only, wrap_truncated,
};
use crate::spans::BatchSpans;

/// What the handler gets for each delivery it must run.
#[derive(Debug)]
pub struct Delivery<'d, 'm> {
    message: &'d Message<'m>,
    queue_message: &'d QueueMessage,
}

impl<'m> Delivery<'_, 'm> {
    /// The decoded envelope.
    pub fn message(&self) -> &Message<'m> {
        self.message
    }

    /// Failed attempts before this one, BabelQueue style (0 on the first
    /// delivery): the envelope's `attempts` plus Cloudflare's redeliveries
    /// (`Message.attempts` counts from 1).
    pub fn attempts(&self) -> u64 {
        let redeliveries = u64::from(self.queue_message.attempts().saturating_sub(1));
        self.message.attempts().saturating_add(redeliveries)
    }

    /// The queue message (Cloudflare's id, raw body, attempts); not its
    /// `ack` or `retry`: the consumer's, by the outcome.
    pub fn queue_message(&self) -> HandlerMessage<'_> {
        HandlerMessage(self.queue_message)
    }
}

/// What was done with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Acked: it will not be delivered again.
    Ack,
    /// Marked for retry: Cloudflare delivers it again (after the delay, if any).
    Retry,
    /// Sent to the dead-letter producer with a `dead_letter` block, then acked.
    DeadLettered,
}

/// One message's result.
#[derive(Debug, Clone)]
pub struct MessageReport {
    /// Cloudflare's message id.
    pub queue_message_id: String,
    /// The store key of its `meta.id` (`DEDUPE_KEY_PREFIX` + the id); `None`
    /// without a usable id (rejected or fail-open).
    pub key: Option<String>,
    /// What the guard decided (ran, skipped, parked, ...).
    pub kind: OutcomeKind,
    /// What was done with the queue message.
    pub action: Action,
    /// Why it failed, was rejected or could not be recorded.
    pub reason: Option<String>,
    /// Cloudflare's delivery count of this message (`Message.attempts`, from 1).
    pub queue_attempts: u32,
    /// A redelivery: this Cloudflare message was delivered before
    /// (`queue_attempts > 1`), whatever happened to it this time.
    pub redelivery: bool,
    /// A duplicate publish: a new Cloudflare message (first delivery) whose
    /// `meta.id` was already known: remembered or in this batch (skipped), or
    /// claimed by another consumer (parked).
    pub duplicate_publish: bool,
}

impl MessageReport {
    fn new(
        message: &QueueMessage,
        key: Option<&str>,
        kind: OutcomeKind,
        action: Action,
        reason: Option<String>,
    ) -> Self {
        let queue_attempts = message.attempts();
        let redelivery = queue_attempts > 1;
        MessageReport {
            queue_message_id: message.id(),
            key: key.map(str::to_owned),
            kind,
            action,
            reason,
            queue_attempts,
            redelivery,
            duplicate_publish: !redelivery
                && matches!(kind, OutcomeKind::Skipped | OutcomeKind::Parked),
        }
    }
}

/// More than a dead letter's block and structured-clone framing add to its
/// body: a body shorter by this cannot have made the letter too large.
const LETTER_ROOM: usize = 4_096;

/// A message's outcome, how long it parks (if it does) and its store key.
type Ended<'a, E> = (&'a Outcome<E>, Option<Duration>, Option<&'a str>);

/// The results of a batch, in delivery order.
#[derive(Debug, Clone, Default)]
pub struct BatchReport {
    /// One report per message, in delivery order.
    pub messages: Vec<MessageReport>,
}

impl BatchReport {
    /// How many messages had the outcome `kind`.
    pub fn count(&self, kind: OutcomeKind) -> usize {
        self.messages.iter().filter(|m| m.kind == kind).count()
    }

    /// How many messages were given `action`.
    pub fn count_action(&self, action: Action) -> usize {
        self.messages.iter().filter(|m| m.action == action).count()
    }

    /// Messages Cloudflare delivered again (see [`MessageReport::redelivery`]).
    pub fn redeliveries(&self) -> usize {
        self.messages.iter().filter(|m| m.redelivery).count()
    }

    /// New messages whose `meta.id` was already known (see
    /// [`MessageReport::duplicate_publish`]).
    pub fn duplicate_publishes(&self) -> usize {
        self.messages.iter().filter(|m| m.duplicate_publish).count()
    }
}

/// The batch could not be read, or some messages could not be marked for retry.
/// Return it from the queue handler (it converts into `worker::Error`): the
/// invocation then throws and Cloudflare redelivers every message not acked, so a
/// failed `retry()` never turns into the implicit ack of a normal return. (When
/// nothing was acked yet, a batch that cannot be read or a mode the store
/// cannot run, the messages are marked for retry before it is returned, too:
/// one logged and swallowed loses nothing either.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsumeError {
    /// The batch's messages could not be read (the JS error).
    #[error("bq-dedupe: reading the queue batch: {0}")]
    Batch(String),
    /// The store cannot do what was asked of it (the transactional mode on a
    /// store other than D1): nothing ran, every message is redelivered.
    #[error("bq-dedupe: {0}")]
    Unsupported(String),
    /// Some messages could not be marked for retry.
    #[error("bq-dedupe: {count} message(s) could not be marked for retry (first: {first})")]
    RetryFailed {
        /// How many.
        count: usize,
        /// The first of them: its Cloudflare message id and the error.
        first: String,
    },
}

/// `error`, after marking every message of `batch` not yet acked or retried
/// for retry: a caller that logs the error and returns normally would
/// otherwise have the runtime ack them all, unrun (a trial lost a batch so).
fn retry_rest(batch: &QueueBatch, error: ConsumeError) -> ConsumeError {
    batch.retry_all();
    error
}

impl From<ConsumeError> for worker::Error {
    fn from(e: ConsumeError) -> Self {
        worker::Error::RustError(e.to_string())
    }
}

/// Dedupes Queues batches with a [`Guard`] and acks, retries or dead-letters every message.
///
/// Per message: run-ok (also `run-ok-lease-lost`: the effect happened, but the
/// claim had been lost, so check for a duplicate), skip and fail-open successes
/// are acked; handler failures,
/// parked claims and store errors are retried (after the retry delay, if set);
/// poison (an invalid envelope) goes to the dead-letter producer and is acked, or,
/// with no producer configured, is retried so the queue's own `max_retries` and
/// `dead_letter_queue` take it. Nothing is acked silently.
///
/// Build the guard with a clock and a timer ([`crate::DedupeConfig::guard`] does:
/// `Date.now` and `setTimeout`) so claims are renewed while a slow handler runs;
/// with [`NoTimer`] they are renewed only between handlers, and without a clock
/// not at all.
pub struct QueueConsumer<S, O = (), T = NoTimer> {
    guard: Guard<S, O, T>,
    dead_letter: Option<Queue>,
    retry_delay_seconds: Option<u32>,
    park_delay_seconds: u32,
    max_retries: Option<u32>,
    on_message: Option<MessageObserver>,
}

impl<S, O, T> std::fmt::Debug for QueueConsumer<S, O, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueConsumer")
            .field("guard", &self.guard)
            .field("dead_letter", &self.dead_letter)
            .field("retry_delay_seconds", &self.retry_delay_seconds)
            .field("park_delay_seconds", &self.park_delay_seconds)
            .field("max_retries", &self.max_retries)
            .field("on_message", &self.on_message.is_some())
            .finish()
    }
}

/// What [`QueueConsumer::on_message`] keeps.
type MessageObserver = Box<dyn Fn(&MessageReport)>;

/// How long a parked message waits before its redelivery when the store cannot
/// tell how long the claim it parked behind has left (the Durable Object store
/// can: it parks just past that claim's end, see [`park_delay`]).
pub(crate) const DEFAULT_PARK_DELAY_SECONDS: u32 = 45;

impl<S: Store, O: Observer, T: Timer> QueueConsumer<S, O, T> {
    /// A consumer deciding with `guard`: no dead-letter producer, no retry delay,
    /// the default park delay.
    pub fn new(guard: Guard<S, O, T>) -> Self {
        QueueConsumer {
            guard,
            dead_letter: None,
            retry_delay_seconds: None,
            park_delay_seconds: DEFAULT_PARK_DELAY_SECONDS,
            max_retries: None,
            on_message: None,
        }
    }

    /// Reports every decision and store error of the guard to `observer` (a
    /// closure, `Arc<bq_dedupe::Counters>`, your metrics): the same as
    /// `Guard::with_observer`, for a consumer built by
    /// [`QueueConsumer::from_env`] or [`crate::DedupeConfig::consumer`].
    pub fn with_observer<O2: Observer>(self, observer: O2) -> QueueConsumer<S, O2, T> {
        QueueConsumer {
            guard: self.guard.with_observer(observer),
            dead_letter: self.dead_letter,
            retry_delay_seconds: self.retry_delay_seconds,
            park_delay_seconds: self.park_delay_seconds,
            max_retries: self.max_retries,
            on_message: self.on_message,
        }
    }

    /// Calls `f` with each message's report once its action is taken: what the queue
    /// adds to the guard's events (the action taken, redelivery or duplicate
    /// publish, Cloudflare's attempts).
    pub fn on_message(mut self, f: impl Fn(&MessageReport) + 'static) -> Self {
        self.on_message = Some(Box::new(f));
        self
    }

    /// Poison messages are sent here (wrapped with a `dead_letter` block), then acked.
    pub fn with_dead_letter(mut self, producer: Queue) -> Self {
        self.dead_letter = Some(producer);
        self
    }

    /// Retried messages come back after this delay.
    pub fn with_retry_delay(mut self, seconds: u32) -> Self {
        self.retry_delay_seconds = Some(seconds);
        self
    }

    /// Parked messages (another consumer holds the claim) come back after this
    /// delay (default 45 seconds) where the store cannot tell how long the claim
    /// has left.
    pub fn with_park_delay(mut self, seconds: u32) -> Self {
        self.park_delay_seconds = seconds;
        self
    }

    /// The queue's `max_retries`. With a dead-letter producer, a handler failure
    /// on the last attempt is sent there with a `dead_letter` block (`reason:
    /// "failed"`, the handler's error) and acked, instead of reaching Cloudflare's
    /// dead-letter queue without one.
    pub fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// The guard that decides each message.
    pub fn guard(&self) -> &Guard<S, O, T> {
        &self.guard
    }

    /// Dedupes `batch`, runs `handler` for every delivery that should run (in
    /// order; an in-batch duplicate runs once), records the results with one store
    /// call, then acks, retries or dead-letters each message. A slow batch also
    /// renews its claims and writes its finished work as it goes (one more store
    /// call per checkpoint, see `bq_dedupe::lease`).
    ///
    /// A handler error affects only its own message. `Err` when the batch cannot
    /// be read or a retry cannot be recorded (see [`ConsumeError`]): return it.
    ///
    /// A Rust panic aborts the instance (without `worker-build --panic-unwind`),
    /// as do a CPU or memory limit and a trap, and the batch comes again: so the
    /// messages of a first attempt run first, as above, and those delivered
    /// again one at a time (with the copies of their id), each recorded before
    /// the next runs (two store calls each), so a handler that aborts every time
    /// re-runs a success at most once more (docs/workers.md).
    pub async fn consume<E: Display>(
        &self,
        batch: &QueueBatch,
        mut handler: impl AsyncFnMut(&Delivery<'_, '_>) -> Result<(), E>,
    ) -> Result<BatchReport, ConsumeError> {
        let messages = batch
            .messages()
            .map_err(|e| retry_rest(batch, ConsumeError::Batch(e)))?;
        let bodies: Vec<Vec<u8>> = messages.iter().map(QueueMessage::body_bytes).collect();
        let mode = match self.guard.options().claim_lease {
            Some(_) => Mode::Claiming,
            None => Mode::SeenSet,
        };
        let mut spans = BatchSpans::open(&bodies, mode);
        // In parts, so that a handler aborting the instance re-runs little (see
        // the doc above and `parts`).
        let mut processed: Vec<Option<Processed<E>>> = Vec::new();
        processed.resize_with(messages.len(), || None);
        let parts = self.parts(&messages, &bodies);
        for part in parts.iter().filter(|p| !p.is_empty()) {
            let part_bodies: Vec<&[u8]> = part.iter().map(|&i| bodies[i].as_slice()).collect();
            let done = self
                .guard
                .process_each(&part_bodies, async |j, message| {
                    let delivery = Delivery {
                        message,
                        queue_message: &messages[part[j]],
                    };
                    handler(&delivery).await
                })
                .await;
            for (j, mut one) in done.into_iter().enumerate() {
                // An in-batch duplicate names its leader by its place in `part`.
                if let Verdict::Duplicate(of) = one.decision.verdict {
                    one.decision.verdict = Verdict::Duplicate(part[of]);
                }
                processed[part[j]] = Some(one);
            }
        }
        let processed: Vec<Processed<E>> = processed.into_iter().flatten().collect();
        // How long each parked message waits: the claim it parked behind (an
        // in-batch duplicate, its leader's), else the configured park delay. A
        // duplicate whose leader failed waits a second where claims keep the
        // two copies apart (the id is free again); without claiming, the park
        // delay, so that it does not run beside its leader's retry.
        let claiming = self.guard.options().claim_lease.is_some();
        let outcomes: Vec<Ended<'_, E>> = processed
            .iter()
            .map(|p| {
                let park_for = match p.decision.verdict {
                    Verdict::Duplicate(of) => {
                        processed.get(of).and_then(|l| match l.outcome.kind() {
                            OutcomeKind::Parked => l.decision.park_for,
                            _ if claiming => Some(Duration::ZERO),
                            _ => None,
                        })
                    }
                    _ => p.decision.park_for,
                };
                (&p.outcome, park_for, p.decision.key.as_deref())
            })
            .collect();
        let report = self
            .apply_actions(batch, &messages, &bodies, &outcomes)
            .await;
        spans.close(&processed, &told(&report));
        report
    }

    /// The batch's parts, run in turn: the first attempts whose id no message
    /// delivered again shares, as one batch; then each message delivered again
    /// with the copies of its id, in batch order. Copies stay in one part, so
    /// one runs and the others follow it as in any batch (alone, a copy would
    /// ask the store, which a failed record leaves saying the id is free: run
    /// twice), and a crasher's copy does not run before the others.
    fn parts(&self, messages: &[QueueMessage], bodies: &[Vec<u8>]) -> Vec<Vec<usize>> {
        let n = messages.len();
        let again = |i: usize| messages[i].attempts() > 1;
        if !(0..n).any(again) {
            return vec![(0..n).collect()];
        }
        let limits = &self.guard.options().limits;
        let ids: Vec<Option<String>> = bodies
            .iter()
            .map(|b| Message::parse(b, limits).ok()?.id().map(str::to_owned))
            .collect();
        let id_again = |i: usize| {
            again(i)
                || ids[i]
                    .as_ref()
                    .is_some_and(|id| (0..n).any(|j| again(j) && ids[j].as_ref() == Some(id)))
        };
        let mut parts = vec![(0..n).filter(|&i| !id_again(i)).collect::<Vec<_>>()];
        for i in (0..n).filter(|&i| id_again(i)) {
            let id = ids[i].as_ref();
            match parts[1..]
                .iter_mut()
                .find(|p| id.is_some() && ids[p[0]].as_ref() == id)
            {
                Some(part) => part.push(i),
                None => parts.push(vec![i]),
            }
        }
        parts
    }

    /// Acks, retries or dead-letters each message by its outcome (and the park
    /// delay of a parked one), reporting each; `Err` if some retry could not be
    /// recorded.
    async fn apply_actions<E: Display>(
        &self,
        batch: &QueueBatch,
        messages: &[QueueMessage],
        bodies: &[Vec<u8>],
        outcomes: &[Ended<'_, E>],
    ) -> Result<BatchReport, ConsumeError> {
        let mut report = BatchReport::default();
        let mut retry_failed: Vec<String> = Vec::new();
        for ((message, body), &(outcome, park_for, key)) in
            messages.iter().zip(bodies).zip(outcomes)
        {
            let (action, reason) = self.action_for(batch, message, body, outcome).await;
            if let Err(e) = self.apply_action(message, action, outcome.kind(), park_for) {
                worker::console_error!("bq-dedupe: retry of message {} failed: {e}", message.id());
                retry_failed.push(format!("{}: {e}", message.id()));
            }
            let reason = match (outcome, body.as_slice()) {
                // What workers-rs `Queue::send(&serde_json::Value)` delivers.
                (Outcome::Rejected(_), b"{}") => Some(empty_body_hint(message, reason)),
                _ => reason,
            };
            let entry = MessageReport::new(message, key, outcome.kind(), action, reason);
            if let Some(f) = &self.on_message {
                f(&entry);
            }
            report.messages.push(entry);
        }
        match retry_failed.first() {
            None => Ok(report),
            // Not `retry_rest`: others are acked by now, and a retryAll after
            // acks redelivers them too on Miniflare (a review).
            Some(first) => Err(ConsumeError::RetryFailed {
                count: retry_failed.len(),
                first: first.clone(),
            }),
        }
    }

    /// What to do with a message given its outcome (dead-lettering it here when
    /// that is the answer), and the reason to report.
    async fn action_for<E: Display>(
        &self,
        batch: &QueueBatch,
        message: &QueueMessage,
        body: &[u8],
        outcome: &Outcome<E>,
    ) -> (Action, Option<String>) {
        let reason = outcome.reason();
        match outcome.disposition() {
            Disposition::Ack => (Action::Ack, reason),
            Disposition::Retry if !self.is_last_failure(message, outcome) => {
                (Action::Retry, reason)
            }
            Disposition::Retry | Disposition::Poison => {
                match self.dead_letter(batch, message, body, outcome).await {
                    Ok(true) => (Action::DeadLettered, reason),
                    Ok(false) => (Action::Retry, reason),
                    Err(e) => {
                        // On its last attempt a retry redelivers nothing: said
                        // (it read as a plain retry, a review).
                        let last = match self.is_last_attempt(message) {
                            true => {
                                "; this was its last attempt: the queue moves it to its own \
                                 dead-letter queue, if it has one, or deletes it"
                            }
                            false => "",
                        };
                        let why = format!(
                            "{}; dead-letter send failed: {e}{last}",
                            reason.unwrap_or_default()
                        );
                        (Action::Retry, Some(why))
                    }
                }
            }
        }
    }

    /// Acks or retries the message. Only a failed retry is an error: a failed ack
    /// is harmless (a normal return acks every message not yet acked or retried).
    fn apply_action(
        &self,
        message: &QueueMessage,
        action: Action,
        kind: OutcomeKind,
        park_for: Option<Duration>,
    ) -> Result<(), String> {
        match action {
            Action::Ack | Action::DeadLettered => {
                if let Err(e) = message.ack() {
                    worker::console_error!("bq-dedupe: ack of {} failed: {e}", message.id());
                }
                Ok(())
            }
            Action::Retry => {
                let delay = match kind {
                    OutcomeKind::Parked => Some(park_delay(park_for, self.park_delay_seconds)),
                    _ => self.retry_delay_seconds,
                };
                // Refused with a delay (out of range, say): retry without one.
                message.retry(delay).or_else(|_| message.retry(None))
            }
        }
    }

    /// Any retried outcome (a handler failure or panic, a park, an unavailable
    /// store, an aborted transaction) on the queue's last attempt (known only
    /// with [`QueueConsumer::with_max_retries`]): retried, Cloudflare would drop
    /// it or move it to its dead-letter queue without a `dead_letter` block.
    fn is_last_failure<E>(&self, message: &QueueMessage, outcome: &Outcome<E>) -> bool {
        // Every retried outcome: on the last attempt, a retry is a silent drop.
        outcome.disposition() == Disposition::Retry && self.is_last_attempt(message)
    }

    /// Whether a retry of `message` redelivers nothing: its last attempt.
    fn is_last_attempt(&self, message: &QueueMessage) -> bool {
        self.max_retries.is_some_and(|max| message.attempts() > max)
    }

    /// Sends a poison message, or a last-attempt failure, to the dead-letter
    /// producer. `Ok(false)`: none is configured, so the message is retried.
    async fn dead_letter<E: Display>(
        &self,
        batch: &QueueBatch,
        message: &QueueMessage,
        body: &[u8],
        outcome: &Outcome<E>,
    ) -> Result<bool, String> {
        let Some(producer) = &self.dead_letter else {
            return Ok(false);
        };
        // A letter sent round again and again: DEDUPE_DEAD_LETTER naming the
        // queue read here, or a dead-letter queue's consumer running this one,
        // sent one round 14,456 times in 15 s, a new message each lap, which
        // no max_retries stops (a trial). Each letter counts its laps (a
        // redrive of a whole letter keeps the count; the SDKs' redrive drops
        // the block): past MAX_LAPS it is retried instead, and the queue's own
        // max_retries ends it (its dead_letter_queue, or deletion).
        let laps = laps_of(body)
            .max(laps_of_value(&message.body()))
            .saturating_add(1);
        if laps > MAX_LAPS {
            let queue = batch.queue();
            worker::console_error!(
                "bq-dedupe: message {} on queue {queue} was dead-lettered {MAX_LAPS} times in a \
                 row: not sent again; does DEDUPE_DEAD_LETTER name the queue this consumer \
                 reads, or does a dead-letter queue's consumer run it?",
                message.id()
            );
            return Err(format!(
                "it was dead-lettered {MAX_LAPS} times in a row (its dead_letter block counts \
                 them) and is not sent again (to the queue {queue} reads?): retried"
            ));
        }
        let (reason, error, exception) = match outcome {
            Outcome::Rejected(rejection) => ("poison", rejection.to_string(), rejection.code()),
            Outcome::PayloadMismatch => (
                "poison",
                outcome.reason().unwrap_or_default(),
                "payload-mismatch",
            ),
            Outcome::Failed(e) | Outcome::FailOpen(Err(e)) => {
                ("failed", e.to_string(), "handler-error")
            }
            Outcome::TransactionAborted(_) => (
                "failed",
                outcome.reason().unwrap_or_default(),
                "transaction-aborted",
            ),
            Outcome::Panicked(_) => (
                "failed",
                outcome.reason().unwrap_or_default(),
                "handler-panicked",
            ),
            Outcome::StoreUnavailable(e) => ("failed", e.to_string(), "store-unavailable"),
            // The schema's reasons are failed / unknown_urn / poison: a delivery
            // that parked on its last attempt failed, and `exception` says how.
            Outcome::Parked => (
                "failed",
                format!(
                    "parked on its last attempt ({}): its id was held, by a claim (another \
                     consumer's, or an invocation of this worker that died, where this delivery \
                     may have run or crashed it) or by a copy of it earlier in its batch that \
                     failed; check whether the id was done before sending it again",
                    message.attempts()
                ),
                "claim-held",
            ),
            _ => return Ok(false),
        };
        let queue = batch.queue();
        let delivery = DeadDelivery {
            body,
            reason,
            error,
            exception,
            original_queue: &queue,
            attempts: message.attempts(),
            failed_at_ms: js_sys::Date::now() as u64,
            laps,
        };
        // A plain JS object (not a serde Map), so the JSON content type accepts it.
        let as_js =
            |letter: serde_json::Value| js_sys::JSON::parse(&letter.to_string()).map_err(describe);
        // Measured as the runtime encodes it: JS writes some numbers longer
        // than serde_json does (`1e20` as 21 digits).
        let js_len = |value: &JsValue| {
            js_sys::JSON::stringify(value)
                .ok()
                .and_then(|s| s.as_string())
                .map_or(usize::MAX, |s| s.len())
        };
        let fits_as_js = |letter: &serde_json::Value| {
            as_js(letter.clone()).is_ok_and(|v| js_len(&v) <= MAX_DEAD_LETTER_BYTES)
        };
        let original = message.body();
        let value = if is_whole_text(&original, body) {
            let mut value: JsValue = as_js(wrap(&delivery))?;
            if js_len(&value) > MAX_DEAD_LETTER_BYTES {
                value = as_js(wrap_truncated(&delivery, TOO_LARGE, &fits_as_js))?;
            }
            value
        } else {
            // Text would lose this body (the empty text of a BigInt, a lone
            // surrogate's U+FFFD): the value itself, as a structured clone.
            let letter = as_js(wrap_block_only(&delivery))?;
            js_sys::Reflect::set(&letter, &JsValue::from_str("body"), &original)
                .map_err(describe)?;
            let v8 = RawMessageBuilder::new(letter).build_with_content_type(QueueContentType::V8);
            match producer.send_raw(v8).await {
                Ok(()) => return Ok(true),
                // A value JSON cannot write has no bytes to keep, and bytes
                // too few for a refusal by size failed by chance: retried.
                Err(e) if body.len() < MAX_DEAD_LETTER_BYTES - LETTER_ROOM => {
                    return Err(e.to_string());
                }
                // Refused (over the queue's size limit: its size is not known
                // before) or failed: bytes of its own (binary, a lone
                // surrogate's) take a JSON letter with their digest, never
                // their text (it would not be the body), rather than a retry
                // on every attempt.
                Err(_) => as_js(wrap_truncated(&delivery, NOT_TEXT, &fits_as_js))?,
            }
        };
        producer
            .send_raw(RawMessageBuilder::new(value).build_with_content_type(QueueContentType::Json))
            .await
            .map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// How many times in a row a letter may be dead-lettered (its block's
/// `laps`) before it is retried instead.
const MAX_LAPS: u64 = 5;

/// How many times `body` was dead-lettered in a row: its `dead_letter` block's
/// `laps` (1 for a block without it), 0 for a body that is no letter.
fn laps_of(body: &[u8]) -> u64 {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice(body) else {
        return 0;
    };
    match top.get("dead_letter") {
        Some(serde_json::Value::Object(block)) => block
            .get("laps")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1),
        _ => 0,
    }
}

/// [`laps_of`] read from the body's value, for a letter JSON cannot write (a
/// structured clone holding a BigInt, whose text is empty): its laps read 0
/// every time, and it went round until the queue refused its size (a review).
fn laps_of_value(body: &JsValue) -> u64 {
    let get = |value: &JsValue, key: &str| {
        js_sys::Reflect::get(value, &JsValue::from_str(key))
            .ok()
            .filter(|v| !v.is_undefined() && !v.is_null())
    };
    let Some(block) = get(body, "dead_letter").filter(JsValue::is_object) else {
        return 0;
    };
    get(&block, "laps")
        .and_then(|laps| laps.as_f64())
        .filter(|laps| *laps >= 0.0)
        .map_or(1, |laps| laps as u64) // saturates, as the JSON count
}

impl<S: Store + StatementStore, O: Observer, T: Timer> QueueConsumer<S, O, T> {
    /// Exactly-once effects on D1: for each message in order, `handler` builds
    /// the D1 statements of its effect, and they commit with the message's id
    /// in one `batch()` (see `bq_dedupe::Guard::process_with_statements`). An id
    /// already done is skipped and runs nothing (an in-batch duplicate too, once
    /// its first committed); a handler error, a panic or a failed batch writes
    /// nothing and the message is retried; a duplicate that committed first
    /// aborts this one's batch whole (skipped). Messages are then acked or retried as
    /// [`QueueConsumer::consume`] does. Needs `DEDUPE_STORE = "d1"`
    /// and fingerprints off: otherwise [`ConsumeError::Unsupported`] before any
    /// handler runs.
    ///
    /// The example of `docs/modes.md` (`DEDUPE_D1_BINDING = "DB"`, your
    /// database, where your `orders` table is):
    ///
    /// ```no_run
    /// # use bq_dedupe_workers::{QueueBatch, QueueConsumer};
    /// # async fn consume(batch: QueueBatch, env: worker::Env) -> worker::Result<()> {
    /// let consumer = QueueConsumer::from_env(&env)?;
    /// let db = env.d1("DB")?;
    /// consumer
    ///     .consume_with_statements(&batch, async |delivery| {
    ///         let id = delivery.message().id().unwrap_or_default();
    ///         Ok::<_, String>(vec![db
    ///             .prepare("INSERT INTO orders (id, total) VALUES (?1, ?2)")
    ///             .bind(&[id.into(), 42.into()])
    ///             .map_err(|e| e.to_string())?])
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn consume_with_statements<E: Display>(
        &self,
        batch: &QueueBatch,
        mut handler: impl AsyncFnMut(&Delivery<'_, '_>) -> Result<Vec<S::Statement>, E>,
    ) -> Result<BatchReport, ConsumeError> {
        // A store that cannot take statements fails the batch before any
        // handler runs (not each message after its handler ran).
        self.guard
            .store()
            .check_statements()
            .map_err(|e| retry_rest(batch, ConsumeError::Unsupported(e.message)))?;
        // So are payload fingerprints, which this mode does not keep: refused
        // here, not by failing every keyed message after its handler ran.
        if self.guard.options().fingerprint {
            return Err(retry_rest(
                batch,
                ConsumeError::Unsupported(
                    "DEDUPE_FINGERPRINT = \"on\" with the D1 statement path: payload fingerprints \
                     are not kept in the exactly-once mode; set it to \"off\""
                        .into(),
                ),
            ));
        }
        let messages = batch
            .messages()
            .map_err(|e| retry_rest(batch, ConsumeError::Batch(e)))?;
        let bodies: Vec<Vec<u8>> = messages.iter().map(QueueMessage::body_bytes).collect();
        let mut spans = BatchSpans::open(&bodies, Mode::Statements);
        let mut processed = Vec::with_capacity(messages.len());
        for (queue_message, body) in messages.iter().zip(&bodies) {
            let one = self
                .guard
                .process_with_statements(body.as_slice(), async |message| {
                    handler(&Delivery {
                        message,
                        queue_message,
                    })
                    .await
                })
                .await;
            processed.push(one);
        }
        // A parked message waits just past the claim it parked behind.
        let outcomes: Vec<Ended<'_, E>> = processed
            .iter()
            .map(|p| (&p.outcome, p.decision.park_for, p.decision.key.as_deref()))
            .collect();
        let report = self
            .apply_actions(batch, &messages, &bodies, &outcomes)
            .await;
        spans.close(&processed, &told(&report));
        report
    }
}

/// What each message was told, in order (none known when a retry failed: the
/// spans then say the outcomes' own dispositions).
fn told(report: &Result<BatchReport, ConsumeError>) -> Vec<Action> {
    let messages = report
        .as_ref()
        .map(|r| r.messages.as_slice())
        .unwrap_or_default();
    messages.iter().map(|m| m.action).collect()
}

/// The delay for a parked message: just past the end of the claim it parked
/// behind (whole seconds, rounded up, plus one, within Cloudflare's 12 h), or
/// `fallback` where the store could not tell how long that claim has left.
pub(crate) fn park_delay(claim_ends_in: Option<Duration>, fallback: u32) -> u32 {
    match claim_ends_in {
        Some(left) => {
            let secs = left.as_millis().div_ceil(1000) + 1;
            secs.min(u128::from(crate::config::MAX_DELAY_SECONDS)) as u32
        }
        None => fallback,
    }
}

/// The reason for a `{}` body, which is what workers-rs `Queue::send` of a serde
/// map (a `serde_json::Value`) delivers: said in the log and the report.
fn empty_body_hint(message: &QueueMessage, reason: Option<String>) -> String {
    let hint = format!(
        "{}; the body is {{}}: a serde map (e.g. serde_json::Value) published with \
         workers-rs Queue::send arrives empty, publish it with bq_dedupe_workers::send_envelope",
        reason.unwrap_or_default()
    );
    worker::console_warn!("bq-dedupe: message {}: {hint}", message.id());
    hint
}
