//! `Guard::process_with_statements` (the transactional mode of a store whose
//! transactions are batches of statements, D1's shape) against a store that
//! applies a batch atomically: every outcome, and the effect written exactly
//! once or not at all. D1 itself runs the same paths on workerd
//! (`crates/workers/tests/d1.test.mjs`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use bq_dedupe::store::{ClaimToken, StatementStore, TxRun};
use bq_dedupe::{
    Guard, InMemoryStore, OutcomeKind, Store, StoreError, StoreResult, block_on_ready,
};

/// The effect: a row per id, as a handler's `INSERT` would write.
type Effects = RefCell<HashMap<String, u32>>;

enum Batched {
    Memory(InMemoryStore),
}
bq_dedupe::delegate_store!(Batched { Memory });

thread_local! {
    static EFFECTS: Effects = RefCell::new(HashMap::new());
    /// The next batch fails whole (a statement the database refused).
    static FAIL_NEXT: RefCell<bool> = const { RefCell::new(false) };
}

fn effects_of(id: &str) -> u32 {
    EFFECTS.with(|e| e.borrow().get(id).copied().unwrap_or(0))
}

/// Writes the effects and the key in one step, or neither, as a D1 batch does.
impl StatementStore for Batched {
    type Statement = String;

    async fn commit_with(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        statements: Vec<String>,
    ) -> StoreResult<TxRun<(), StoreError>> {
        if let Some(key) = key {
            if self.seen(key).await? {
                return Ok(TxRun::AlreadyDone);
            }
            // The caller's own claim is replaced (given back here: the
            // memory store's claims carry no record to replace).
            if let Some(token) = claim {
                self.release(key, token).await?;
            }
            let Batched::Memory(memory) = self;
            if memory.claimed().iter().any(|k| k == key) {
                return Ok(TxRun::Held);
            }
        }
        if FAIL_NEXT.with(|f| f.replace(false)) {
            return Ok(TxRun::RolledBack(StoreError::internal(
                "no such table: typo",
            )));
        }
        EFFECTS.with(|e| {
            for id in statements {
                *e.borrow_mut().entry(id).or_default() += 1;
            }
        });
        if let Some(key) = key {
            self.remember(key, ttl).await?;
        }
        Ok(TxRun::Committed(()))
    }
}

fn envelope(id: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{{}},"meta":{{"id":"{id}","queue":"orders","schema_version":1}},"attempts":0}}"#
    )
}

fn guard() -> Guard<Batched> {
    Guard::new(Batched::Memory(InMemoryStore::new()))
}

fn deliver(guard: &Guard<Batched>, id: &str) -> OutcomeKind {
    block_on_ready(
        guard.process_with_statements(envelope(id).as_str(), async |m| {
            Ok::<_, String>(vec![m.id().unwrap().to_owned()])
        }),
    )
    .unwrap()
    .outcome
    .kind()
}

#[test]
fn a_fresh_id_commits_its_statements_once_and_a_redelivery_runs_nothing() {
    let guard = guard();
    assert_eq!(deliver(&guard, "s-1"), OutcomeKind::Ran);
    let mut called = false;
    let again = block_on_ready(guard.process_with_statements(
        envelope("s-1").as_str(),
        async |_| {
            called = true;
            Ok::<Vec<String>, String>(vec!["s-1".into()])
        },
    ))
    .unwrap();
    assert_eq!(again.outcome.kind(), OutcomeKind::Skipped);
    assert!(!called, "a done id builds no statements");
    assert_eq!(effects_of("s-1"), 1);
}

#[test]
fn a_failing_or_panicking_handler_writes_nothing_and_leaves_the_id_unmarked() {
    let guard = guard();
    let failed = block_on_ready(
        guard.process_with_statements(envelope("s-2").as_str(), async |_| {
            Err::<Vec<String>, _>("payment declined")
        }),
    )
    .unwrap();
    assert_eq!(failed.outcome.kind(), OutcomeKind::Failed);
    let panicked = block_on_ready(guard.process_with_statements(
        envelope("s-2").as_str(),
        async |_| -> Result<Vec<String>, String> { panic!("handler bug") },
    ))
    .unwrap();
    assert_eq!(panicked.outcome.kind(), OutcomeKind::Panicked);
    assert_eq!(effects_of("s-2"), 0);
    assert!(!block_on_ready(guard.store().seen("s-2")).unwrap().unwrap());
    assert_eq!(deliver(&guard, "s-2"), OutcomeKind::Ran, "the retry runs");
    assert_eq!(effects_of("s-2"), 1);
}

#[test]
fn a_failed_batch_writes_nothing_and_its_retry_writes_once() {
    let guard = guard();
    FAIL_NEXT.with(|f| *f.borrow_mut() = true);
    assert_eq!(deliver(&guard, "s-3"), OutcomeKind::StoreUnavailable);
    assert_eq!(effects_of("s-3"), 0);
    assert!(!block_on_ready(guard.store().seen("s-3")).unwrap().unwrap());
    assert_eq!(deliver(&guard, "s-3"), OutcomeKind::Ran);
    assert_eq!(deliver(&guard, "s-3"), OutcomeKind::Skipped);
    assert_eq!(effects_of("s-3"), 1);
}

#[test]
fn a_duplicate_that_commits_first_aborts_the_batch_whole() {
    let guard = guard();
    // Another consumer's run of the same id commits while this handler runs.
    let outcome = block_on_ready(guard.process_with_statements(
        envelope("s-4").as_str(),
        async |m| {
            assert_eq!(deliver(&guard, "s-4"), OutcomeKind::Ran);
            Ok::<_, String>(vec![m.id().unwrap().to_owned()])
        },
    ))
    .unwrap();
    assert_eq!(outcome.outcome.kind(), OutcomeKind::Skipped);
    assert_eq!(effects_of("s-4"), 1, "the other run's effect only");
}

#[test]
fn an_id_held_by_a_claiming_consumer_parks_and_runs_nothing() {
    let guard = guard();
    let claim = block_on_ready(guard.store().claim("s-5", Duration::from_secs(30)))
        .unwrap()
        .unwrap();
    assert!(matches!(claim, bq_dedupe::store::Claim::Acquired(_)));
    assert_eq!(deliver(&guard, "s-5"), OutcomeKind::Parked);
    assert_eq!(effects_of("s-5"), 0);
}

#[test]
fn an_envelope_without_an_id_commits_its_statements_fail_open_and_poison_runs_nothing() {
    let guard = guard();
    let body = r#"{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{},"meta":{"queue":"orders","schema_version":1},"attempts":0}"#;
    let outcome = block_on_ready(
        guard.process_with_statements(body, async |_| Ok::<_, String>(vec!["no-id".to_owned()])),
    )
    .unwrap();
    assert_eq!(outcome.outcome.kind(), OutcomeKind::FailOpen);
    assert_eq!(effects_of("no-id"), 1);
    let poison = block_on_ready(guard.process_with_statements("{not json", async |_| {
        Ok::<_, String>(vec!["poison".to_owned()])
    }))
    .unwrap();
    assert_eq!(poison.outcome.kind(), OutcomeKind::Rejected);
    assert_eq!(effects_of("poison"), 0);
}

#[test]
fn a_handler_with_nothing_to_write_still_records_its_id_once() {
    let guard = guard();
    for expected in [OutcomeKind::Ran, OutcomeKind::Skipped] {
        let outcome = block_on_ready(
            guard.process_with_statements(envelope("s-6").as_str(), async |_| {
                Ok::<Vec<String>, String>(Vec::new())
            }),
        )
        .unwrap();
        assert_eq!(outcome.outcome.kind(), expected);
    }
    assert!(block_on_ready(guard.store().seen("s-6")).unwrap().unwrap());
}

/// In claiming mode the id is claimed before its handler runs and the batch
/// replaces the claim: a run whose process ended inside its handler (a panic
/// on wasm, a CPU limit: here a claim taken and never settled) leaves its
/// claim, so the redelivery parks for the rest of the lease instead of
/// running it again first; and on Workers the messages after it in the batch
/// run (without a claim they went with it to the dead-letter queue unrun: a
/// trial's finding). A failed handler gives its claim back: its retry runs.
#[test]
fn in_claiming_mode_the_id_is_claimed_first_and_a_crashed_run_parks_its_redelivery() {
    let lease = Duration::from_secs(60);
    let guard = guard().with_claiming(lease);
    assert_eq!(deliver(&guard, "c-1"), OutcomeKind::Ran);
    assert_eq!(effects_of("c-1"), 1);
    let Batched::Memory(memory) = guard.store();
    assert!(memory.claimed().is_empty(), "the batch replaced the claim");
    assert_eq!(deliver(&guard, "c-1"), OutcomeKind::Skipped);

    // A run whose process dies inside its handler: polled once, then dropped.
    let body = envelope("c-2");
    let crashed = guard.process_with_statements(body.as_str(), async |_| {
        std::future::pending::<()>().await;
        Ok::<Vec<String>, String>(Vec::new())
    });
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::pin::pin!(crashed).poll(&mut cx).is_pending());
    let mut called = false;
    let again = block_on_ready(guard.process_with_statements(
        envelope("c-2").as_str(),
        async |_| {
            called = true;
            Ok::<Vec<String>, String>(vec!["c-2".into()])
        },
    ))
    .unwrap();
    assert_eq!(again.outcome.kind(), OutcomeKind::Parked);
    assert!(!called, "a claimed id builds no statements");
    assert!(again.decision.park_for.is_some_and(|left| left <= lease));
    assert_eq!(effects_of("c-2"), 0);

    let failed = block_on_ready(
        guard.process_with_statements(envelope("c-3").as_str(), async |_| {
            Err::<Vec<String>, _>("payment declined")
        }),
    )
    .unwrap();
    assert_eq!(failed.outcome.kind(), OutcomeKind::Failed);
    assert_eq!(
        deliver(&guard, "c-3"),
        OutcomeKind::Ran,
        "its claim was given back"
    );
    assert_eq!(effects_of("c-3"), 1);
}

/// A timer whose sleep ends when the test says (`tick`).
struct Ticks(std::rc::Rc<std::cell::Cell<bool>>);

impl bq_dedupe::lease::Timer for Ticks {
    async fn sleep(&self, _: Duration) {
        std::future::poll_fn(|_| match self.0.replace(false) {
            true => std::task::Poll::Ready(()),
            false => std::task::Poll::Pending,
        })
        .await
    }
}

/// A handler slower than the lease keeps its claim: it is renewed on the
/// timer's ticks while the handler builds its statements, so a redelivery
/// meanwhile parks and builds none. The claim was not renewed there: it
/// lapsed under the handler and the redelivery ran its handler beside it (its
/// effects outside the database twice, unreported; its statements once).
#[test]
fn in_claiming_mode_a_slow_handlers_claim_is_renewed_while_it_runs() {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    let clock = Arc::new(bq_dedupe::clock::ManualClock::new(1_000));
    let store = Batched::Memory(InMemoryStore::with_clock(clock.clone()));
    let tick = Rc::new(Cell::new(false));
    let guard = Guard::new(store)
        .with_claiming(Duration::from_secs(3))
        .with_clock(clock.clone())
        .with_timer(Ticks(tick.clone()));
    let done = Cell::new(false);
    let body = envelope("slow-1");
    let slow = guard.process_with_statements(body.as_str(), async |_| {
        std::future::poll_fn(|_| match done.get() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await;
        Ok::<Vec<String>, String>(vec!["slow-1".into()])
    });
    let mut slow = std::pin::pin!(slow);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(slow.as_mut().poll(&mut cx).is_pending());
    clock.advance(2_500);
    tick.set(true);
    assert!(slow.as_mut().poll(&mut cx).is_pending(), "still running");
    clock.advance(1_000); // past the lease it was claimed with
    let mut called = false;
    let again = block_on_ready(guard.process_with_statements(body.as_str(), async |_| {
        called = true;
        Ok::<Vec<String>, String>(vec!["slow-1".into()])
    }))
    .unwrap();
    assert_eq!(again.outcome.kind(), OutcomeKind::Parked);
    assert!(
        !called,
        "a redelivery beside the slow handler built nothing"
    );
    done.set(true);
    let Poll::Ready(first) = slow.as_mut().poll(&mut cx) else {
        panic!("the handler is done, and so is its batch");
    };
    assert_eq!(first.outcome.kind(), OutcomeKind::Ran);
    assert_eq!(effects_of("slow-1"), 1);
}
