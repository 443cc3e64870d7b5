//! One named test per documented policy of the guard.

mod common;

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::store::PerKey;
use bq_dedupe::{
    Counters, Disposition, Guard, HandlerResult, InMemoryStore, KeySpace, Observer, Outcome,
    OutcomeKind, Store, block_on_ready, clock::Clock, clock::ManualClock, clock::SteadyClock,
    guard::Verdict, store::StoreErrorKind,
};
use common::{FlakyStore, envelope, envelope_with};
use serde_json::json;

/// Delivers `body` once; the handler bumps `effects` and succeeds when `ok`.
fn deliver<S: Store, O: Observer>(
    guard: &Guard<S, O>,
    body: &str,
    ok: bool,
    effects: &Cell<u32>,
) -> Outcome<String> {
    block_on_ready(guard.process(body.as_bytes(), async |_| {
        effects.set(effects.get() + 1);
        if ok { Ok(()) } else { Err("boom".to_string()) }
    }))
    .expect("sync store and handler complete at once")
}

/// Delivers a valid envelope with `meta.id` = `id` to a handler that succeeds.
fn run_ok<S: Store, O: Observer>(
    guard: &Guard<S, O>,
    id: &str,
    effects: &Cell<u32>,
) -> Outcome<String> {
    deliver(guard, &envelope(id), true, effects)
}

#[test]
fn absent_null_empty_or_non_string_id_fails_open() {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    for id in [
        None,
        Some(json!(null)),
        Some(json!("")),
        Some(json!(42)),
        Some(json!({"x": 1})),
    ] {
        let body = envelope_with(id.clone());
        for _ in 0..2 {
            let outcome = deliver(&guard, &body, true, &effects);
            assert_eq!(outcome, Outcome::FailOpen(Ok(())), "id {id:?}");
            assert_eq!(outcome.disposition(), Disposition::Ack);
            // Said in every verdict: a producer sending numbers gets no dedupe.
            let reason = outcome.reason().expect("a fail-open says why");
            assert!(reason.contains("meta.id"), "{reason}");
        }
    }
    assert_eq!(effects.get(), 10, "every fail-open delivery runs");
    assert!(
        guard.store().is_empty(),
        "nothing is remembered for unusable ids"
    );
}

#[test]
fn fail_open_handler_error_is_returned_and_retried() {
    let guard = Guard::new(InMemoryStore::new());
    let outcome = deliver(&guard, &envelope_with(None), false, &Cell::new(0));
    assert_eq!(outcome, Outcome::FailOpen(Err("boom".into())));
    assert_eq!(outcome.disposition(), Disposition::Retry);
}

#[test]
fn whitespace_id_is_a_key_and_is_never_trimmed() {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    let expected = [
        (" ", Outcome::Ran),
        (" ", Outcome::Skipped),
        ("  ", Outcome::Ran),
        (" a", Outcome::Ran),
        ("a", Outcome::Ran),
    ];
    for (id, outcome) in expected {
        assert_eq!(
            deliver(&guard, &envelope(id), true, &effects),
            outcome,
            "id {id:?}"
        );
    }
    assert_eq!(effects.get(), 4);
}

#[test]
fn seen_id_is_skipped_without_running_the_handler() {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    let outcome = run_ok(&guard, "id-A", &effects);
    assert_eq!(outcome, Outcome::Skipped);
    assert_eq!(outcome.disposition(), Disposition::Ack);
    assert_eq!(effects.get(), 1);
}

#[test]
fn failing_handler_leaves_id_unmarked_and_error_unchanged() {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    let outcome = deliver(&guard, &envelope("id-A"), false, &effects);
    assert_eq!(outcome, Outcome::Failed("boom".to_string()));
    assert_eq!(outcome.disposition(), Disposition::Retry);
    assert!(!block_on_ready(guard.store().seen("id-A")).unwrap().unwrap());
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    assert_eq!(effects.get(), 2);
}

#[test]
fn seen_failure_fails_closed_and_does_not_run_the_handler() {
    let store = FlakyStore::new();
    store.faults.seen.set(true);
    let counters = Arc::new(Counters::new());
    let guard = Guard::new(store).with_observer(counters.clone());
    let effects = Cell::new(0);
    let outcome = run_ok(&guard, "id-A", &effects);
    match &outcome {
        Outcome::StoreUnavailable(e) => assert_eq!(e.kind, StoreErrorKind::Unavailable),
        other => panic!("expected StoreUnavailable, got {other:?}"),
    }
    assert_eq!(outcome.disposition(), Disposition::Retry);
    assert_eq!(
        effects.get(),
        0,
        "the handler must not run when seen() fails"
    );
    let snap = counters.snapshot();
    assert_eq!(
        (snap.store_unavailable, snap.store_errors, snap.runs),
        (1, 1, 0)
    );
}

#[test]
fn remember_failure_after_success_acks_and_is_observable() {
    let store = FlakyStore::new();
    store.faults.remember.set(true);
    let counters = Arc::new(Counters::new());
    let guard = Guard::new(store).with_observer(counters.clone());
    let effects = Cell::new(0);
    let outcome = run_ok(&guard, "id-A", &effects);
    assert!(matches!(outcome, Outcome::RanUnrecorded(_)), "{outcome:?}");
    // Acked: a retry would certainly re-run the side effect that already happened.
    assert_eq!(outcome.disposition(), Disposition::Ack);
    assert_eq!(effects.get(), 1);
    let snap = counters.snapshot();
    assert_eq!(
        (snap.runs, snap.remember_failed, snap.store_errors),
        (1, 1, 1)
    );
}

#[test]
fn forget_lets_an_id_run_again() {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    run_ok(&guard, "id-A", &effects);
    block_on_ready(guard.forget("id-A")).unwrap().unwrap();
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    assert_eq!(effects.get(), 2);
}

#[test]
fn ttl_expiry_lets_an_id_run_again_but_not_before() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let guard =
        Guard::new(InMemoryStore::with_clock(clock.clone())).with_ttl(Duration::from_secs(60));
    let effects = Cell::new(0);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    clock.advance(59_000);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Skipped);
    clock.advance(1_000);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    assert_eq!(effects.get(), 2);
}

#[test]
fn handler_panic_is_caught_and_leaves_id_unmarked() {
    let guard = Guard::new(InMemoryStore::new());
    let outcome = block_on_ready(guard.process(
        envelope("id-A").as_bytes(),
        async |_| -> Result<(), String> { panic!("handler exploded") },
    ))
    .unwrap();
    assert_eq!(outcome, Outcome::Panicked("handler exploded".into()));
    assert_eq!(outcome.disposition(), Disposition::Retry);
    assert!(!block_on_ready(guard.store().seen("id-A")).unwrap().unwrap());
}

#[test]
fn invalid_envelope_is_rejected_as_poison_without_running() {
    let guard = Guard::new(InMemoryStore::new());
    let effects = Cell::new(0);
    let outcome = deliver(
        &guard,
        r#"{"trace_id":"t","data":{},"meta":{"id":"x","schema_version":1}}"#,
        true,
        &effects,
    );
    assert!(matches!(outcome, Outcome::Rejected(_)), "{outcome:?}");
    assert_eq!(outcome.disposition(), Disposition::Poison);
    assert_eq!(effects.get(), 0);
}

// ---- claiming mode ----

fn claiming(store: InMemoryStore) -> Guard<InMemoryStore> {
    Guard::new(store).with_claiming(Duration::from_secs(60))
}

#[test]
fn claiming_runs_once_and_remembers() {
    let guard = claiming(InMemoryStore::new());
    let effects = Cell::new(0);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Skipped);
    assert!(
        guard.store().claimed().is_empty(),
        "remember ends the claim"
    );
    assert_eq!(effects.get(), 1);
}

#[test]
fn lost_claim_parks_while_the_holder_runs() {
    let guard = claiming(InMemoryStore::new());
    // Another consumer holds the claim (taken directly on the shared store).
    block_on_ready(guard.store().claim("id-A", Duration::from_secs(60)))
        .unwrap()
        .unwrap();
    let effects = Cell::new(0);
    let outcome = run_ok(&guard, "id-A", &effects);
    assert_eq!(outcome, Outcome::Parked);
    assert_eq!(
        outcome.disposition(),
        Disposition::Retry,
        "parked means redeliver later"
    );
    assert_eq!(effects.get(), 0);
}

#[test]
fn lost_claim_rechecks_seen_and_skips_when_the_holder_finished() {
    // The holder remembers between our claim attempt and our re-check: a store
    // that reports Held once and then answers seen=true models that race.
    struct FinishedHolder(InMemoryStore);
    impl bq_dedupe::store::KeyStore for FinishedHolder {
        async fn seen(&self, key: &str) -> bq_dedupe::StoreResult<bool> {
            self.0.seen(key).await
        }
        async fn remember(&self, key: &str, ttl: Option<Duration>) -> bq_dedupe::StoreResult<()> {
            self.0.remember(key, ttl).await
        }
        async fn forget(&self, key: &str) -> bq_dedupe::StoreResult<()> {
            self.0.forget(key).await
        }
        async fn claim(
            &self,
            key: &str,
            _: Duration,
        ) -> bq_dedupe::StoreResult<bq_dedupe::store::Claim> {
            self.0.remember(key, None).await?; // the holder finishes right now
            Ok(bq_dedupe::store::Claim::Held)
        }
    }
    let guard = Guard::new(PerKey(FinishedHolder(InMemoryStore::new())))
        .with_claiming(Duration::from_secs(60));
    let effects = Cell::new(0);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Skipped);
    assert_eq!(effects.get(), 0);
}

#[test]
fn handler_failure_releases_the_claim() {
    let guard = claiming(InMemoryStore::new());
    let effects = Cell::new(0);
    assert_eq!(
        deliver(&guard, &envelope("id-A"), false, &effects),
        Outcome::Failed("boom".into())
    );
    assert!(guard.store().claimed().is_empty(), "the claim was released");
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    assert_eq!(effects.get(), 2);
}

#[test]
fn expired_lease_of_a_crashed_holder_can_be_reclaimed() {
    let clock = Arc::new(ManualClock::new(0));
    let guard = claiming(InMemoryStore::with_clock(clock.clone()));
    block_on_ready(guard.store().claim("id-A", Duration::from_secs(60)))
        .unwrap()
        .unwrap();
    let effects = Cell::new(0);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Parked);
    clock.advance(60_000);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Ran);
    assert_eq!(effects.get(), 1);
}

#[test]
fn claiming_on_a_store_without_claims_fails_closed() {
    let mut store = FlakyStore::new();
    store.can_claim = false;
    let guard = Guard::new(store).with_claiming(Duration::from_secs(60));
    let effects = Cell::new(0);
    match run_ok(&guard, "id-A", &effects) {
        Outcome::StoreUnavailable(e) => assert_eq!(e.kind, StoreErrorKind::Unsupported),
        other => panic!("expected StoreUnavailable(unsupported), got {other:?}"),
    }
    assert_eq!(effects.get(), 0);
}

#[test]
fn claiming_remember_failure_keeps_the_claim_as_a_fence() {
    let store = FlakyStore::new();
    store.faults.remember.set(true);
    let guard = Guard::new(store).with_claiming(Duration::from_secs(60));
    let effects = Cell::new(0);
    assert!(matches!(
        run_ok(&guard, "id-A", &effects),
        Outcome::RanUnrecorded(_)
    ));
    // Until the lease runs out, a redelivery parks instead of running again.
    guard.store().faults.remember.set(false);
    assert_eq!(run_ok(&guard, "id-A", &effects), Outcome::Parked);
    assert_eq!(effects.get(), 1);
}

#[test]
fn claims_under_sixteen_threads_run_the_handler_once() {
    let guard = Arc::new(claiming(InMemoryStore::new()));
    let effects = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (guard, effects, barrier) = (guard.clone(), effects.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let body = envelope("same-id");
                block_on_ready(guard.process(body.as_bytes(), async |_| {
                    effects.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    Ok::<(), String>(())
                }))
                .unwrap()
                .kind()
            })
        })
        .collect();
    let kinds: Vec<OutcomeKind> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        effects.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| **k == OutcomeKind::Ran).count(), 1);
    assert!(kinds.iter().all(|k| matches!(
        k,
        OutcomeKind::Ran | OutcomeKind::Parked | OutcomeKind::Skipped
    )));
}

// ---- batches ----

fn run_batch<S: Store, O: Observer>(
    guard: &Guard<S, O>,
    bodies: &[String],
    fail: &[&str],
    effects: &Cell<u32>,
) -> Vec<Outcome<String>> {
    block_on_ready(guard.process_batch(bodies, async |m| {
        effects.set(effects.get() + 1);
        if m.id().is_some_and(|id| fail.contains(&id)) {
            Err(format!("{} failed", m.id().unwrap_or("")))
        } else {
            Ok(())
        }
    }))
    .unwrap()
}

#[test]
fn batch_makes_one_seen_many_and_one_settle_call() {
    let guard = Guard::new(FlakyStore::new());
    let bodies: Vec<String> = (0..100).map(|i| envelope(&format!("id-{i}"))).collect();
    let effects = Cell::new(0);
    let outcomes = run_batch(&guard, &bodies, &[], &effects);
    assert!(outcomes.iter().all(|o| *o == Outcome::Ran));
    assert_eq!(guard.store().calls(), vec!["seen_many", "settle"]);
    assert_eq!(effects.get(), 100);
}

#[test]
fn batch_in_claiming_mode_makes_one_claim_and_one_commit_call() {
    let guard = Guard::new(FlakyStore::new()).with_claiming(Duration::from_secs(60));
    let bodies: Vec<String> = (0..100).map(|i| envelope(&format!("id-{i}"))).collect();
    let outcomes = run_batch(&guard, &bodies, &["id-7"], &Cell::new(0));
    assert_eq!(outcomes[7], Outcome::Failed("id-7 failed".into()));
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Ran).count(), 99);
    assert_eq!(guard.store().calls(), vec!["claim_many", "settle"]);
    assert!(
        guard.store().inner.claimed().is_empty(),
        "failure's claim released, successes' ended"
    );
}

#[test]
fn batch_duplicate_of_a_success_is_skipped() {
    let guard = Guard::new(InMemoryStore::new());
    let bodies = vec![envelope("a"), envelope("b"), envelope("a"), envelope("a")];
    let effects = Cell::new(0);
    let outcomes = run_batch(&guard, &bodies, &[], &effects);
    assert_eq!(
        outcomes,
        vec![
            Outcome::Ran,
            Outcome::Ran,
            Outcome::Skipped,
            Outcome::Skipped
        ]
    );
    assert_eq!(effects.get(), 2);
}

#[test]
fn batch_duplicate_of_a_failure_is_retried_without_running() {
    let guard = Guard::new(InMemoryStore::new());
    let bodies = vec![envelope("a"), envelope("a")];
    let effects = Cell::new(0);
    let outcomes = run_batch(&guard, &bodies, &["a"], &effects);
    assert_eq!(
        outcomes,
        vec![Outcome::Failed("a failed".into()), Outcome::Parked]
    );
    assert_eq!(outcomes[1].disposition(), Disposition::Retry);
    // Its reason names the batch, not only another consumer's claim (there is
    // none in the seen-set mode: a trial's finding).
    let reason = outcomes[1].reason().unwrap();
    assert!(
        reason.contains("earlier delivery of it in this batch"),
        "{reason}"
    );
    assert_eq!(effects.get(), 1);
}

#[test]
fn batch_mixes_rejected_fail_open_seen_and_new() {
    let guard = Guard::new(InMemoryStore::new());
    block_on_ready(guard.store().remember("old", None))
        .unwrap()
        .unwrap();
    let bodies = vec![
        "not json".to_string(),
        envelope_with(None),
        envelope("old"),
        envelope("new"),
    ];
    let effects = Cell::new(0);
    let kinds: Vec<_> = run_batch(&guard, &bodies, &[], &effects)
        .iter()
        .map(Outcome::kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            OutcomeKind::Rejected,
            OutcomeKind::FailOpen,
            OutcomeKind::Skipped,
            OutcomeKind::Ran
        ]
    );
    assert_eq!(effects.get(), 2);
}

#[test]
fn batch_seen_failure_fails_closed_for_keyed_deliveries_only() {
    let store = FlakyStore::new();
    store.faults.seen.set(true);
    let guard = Guard::new(store);
    let bodies = vec![envelope("a"), envelope_with(None), envelope("a")];
    let effects = Cell::new(0);
    let kinds: Vec<_> = run_batch(&guard, &bodies, &[], &effects)
        .iter()
        .map(Outcome::kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            OutcomeKind::StoreUnavailable,
            OutcomeKind::FailOpen,
            OutcomeKind::StoreUnavailable
        ]
    );
    assert_eq!(effects.get(), 1, "only the fail-open delivery ran");
}

#[test]
fn batch_remember_failure_marks_successes_unrecorded() {
    let store = FlakyStore::new();
    store.faults.remember.set(true);
    let guard = Guard::new(store);
    let bodies = vec![envelope("a"), envelope("b"), envelope("a")];
    let kinds: Vec<_> = run_batch(&guard, &bodies, &["b"], &Cell::new(0))
        .iter()
        .map(Outcome::kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            OutcomeKind::RanUnrecorded,
            OutcomeKind::Failed,
            OutcomeKind::Skipped
        ]
    );
}

#[test]
fn split_decide_and_complete_match_process() {
    let guard = Guard::new(InMemoryStore::new());
    let bodies = vec![envelope("a"), envelope("a"), envelope("b")];
    let decisions = block_on_ready(guard.decide_batch(&bodies)).unwrap();
    let verdicts: Vec<_> = decisions.iter().map(|d| d.verdict.clone()).collect();
    assert_eq!(
        verdicts,
        vec![Verdict::Run, Verdict::Duplicate(0), Verdict::Run]
    );
    let results = decisions
        .iter()
        .map(|d| d.should_run().then_some(HandlerResult::<String>::Ok))
        .collect();
    let outcomes = block_on_ready(guard.complete_batch(decisions, results)).unwrap();
    assert_eq!(outcomes, vec![Outcome::Ran, Outcome::Skipped, Outcome::Ran]);
    assert_eq!(
        block_on_ready(guard.decide_batch(&[envelope("b").as_bytes()])).unwrap()[0].verdict,
        Verdict::Skip
    );
}

// ---- key namespacing ----

#[test]
fn scopes_keep_separate_seen_sets_and_never_change_the_id() {
    let store = Arc::new(InMemoryStore::new());
    let billing = Guard::new(store.clone()).with_keyspace(
        KeySpace::new()
            .with_prefix("bq:idem:")
            .with_scope("billing")
            .unwrap(),
    );
    let email = Guard::new(store.clone()).with_keyspace(
        KeySpace::new()
            .with_prefix("bq:idem:")
            .with_scope("email")
            .unwrap(),
    );
    let effects = Cell::new(0);
    assert_eq!(run_ok(&billing, "id-A", &effects), Outcome::Ran);
    assert_eq!(run_ok(&email, "id-A", &effects), Outcome::Ran);
    assert_eq!(run_ok(&billing, "id-A", &effects), Outcome::Skipped);
    let mut keys: Vec<_> = store.entries().into_iter().map(|e| e.key).collect();
    keys.sort();
    assert_eq!(keys, vec!["bq:idem:billing:id-A", "bq:idem:email:id-A"]);
    let ks = billing.options().keyspace.clone();
    assert_eq!(ks.id_of("bq:idem:billing:id-A"), Some("id-A"));
    assert_eq!(
        ks.into_id("bq:idem:billing:id-A".into()).as_deref(),
        Some("id-A")
    );
    assert_eq!(ks.into_id("bq:idem:email:id-A".into()), None);
    assert_eq!(
        KeySpace::new().into_id("id-A".into()).as_deref(),
        Some("id-A")
    );
    assert!(KeySpace::new().with_scope("a:b").is_err());
    assert!(KeySpace::new().with_scope("").is_err());
}

#[test]
fn observer_sees_every_decision() {
    let counters = Arc::new(Counters::new());
    let guard = Guard::new(InMemoryStore::new()).with_observer(counters.clone());
    let bodies = vec![
        envelope("a"),
        envelope("a"),
        envelope_with(None),
        "{".to_string(),
        envelope("b"),
    ];
    run_batch(&guard, &bodies, &["b"], &Cell::new(0));
    let snap = counters.snapshot();
    assert_eq!(
        (
            snap.runs,
            snap.skips,
            snap.fail_open,
            snap.rejected,
            snap.failures,
            snap.parked
        ),
        (1, 1, 1, 1, 1, 0)
    );
}

#[test]
fn indexed_batch_handler_sees_each_running_delivery_s_position() {
    let guard = Guard::new(InMemoryStore::new());
    run_ok(&guard, "seen-before", &Cell::new(0));
    let bodies = vec![
        envelope("a"),
        envelope("seen-before"),
        "not json".to_string(),
        envelope("a"),
        envelope("b"),
    ];
    let mut ran = Vec::new();
    let processed = block_on_ready(guard.process_each(&bodies, async |i, m| {
        ran.push((i, m.id().unwrap_or_default().to_string()));
        Ok::<(), String>(())
    }))
    .unwrap();
    let outcomes: Vec<_> = processed.into_iter().map(|p| p.outcome).collect();
    assert_eq!(ran, vec![(0, "a".to_string()), (4, "b".to_string())]);
    assert_eq!(
        outcomes[3],
        Outcome::Skipped,
        "in-batch duplicate follows index 0"
    );
}

/// Only the three spec calls plus single claims, used through `PerKey` (the
/// batch forms as one call per key). Claiming "bad" and remembering fail.
struct SingleCallStore(InMemoryStore);

impl bq_dedupe::store::KeyStore for SingleCallStore {
    async fn seen(&self, key: &str) -> bq_dedupe::StoreResult<bool> {
        self.0.seen(key).await
    }
    async fn remember(&self, _: &str, _: Option<Duration>) -> bq_dedupe::StoreResult<()> {
        Err(bq_dedupe::StoreError::unavailable("remember: backend down"))
    }
    async fn forget(&self, key: &str) -> bq_dedupe::StoreResult<()> {
        self.0.forget(key).await
    }
    async fn claim(
        &self,
        key: &str,
        lease: Duration,
    ) -> bq_dedupe::StoreResult<bq_dedupe::store::Claim> {
        match key {
            "bad" => Err(bq_dedupe::StoreError::unavailable("claim: backend down")),
            _ => self.0.claim(key, lease).await,
        }
    }
    async fn release(
        &self,
        key: &str,
        token: &bq_dedupe::store::ClaimToken,
    ) -> bq_dedupe::StoreResult<()> {
        self.0.release(key, token).await
    }
}

#[test]
fn a_failed_claim_in_a_batch_gives_back_the_claims_already_taken() {
    let store = PerKey(SingleCallStore(InMemoryStore::new()));
    let lease = Duration::from_secs(60);
    let result = block_on_ready(store.claim_many(&["a", "b", "bad", "c"], lease)).unwrap();
    assert!(result.is_err());
    assert!(store.0.0.claimed().is_empty(), "{:?}", store.0.0.claimed());
}

#[test]
fn a_failed_remember_in_a_commit_still_releases_the_failed_runs_claims() {
    let store = PerKey(SingleCallStore(InMemoryStore::new()));
    let claims = block_on_ready(store.claim_many(&["ok", "failed"], Duration::from_secs(60)))
        .unwrap()
        .unwrap();
    let bq_dedupe::store::Claim::Acquired(token) = &claims[1] else {
        panic!("{claims:?}")
    };
    let step = bq_dedupe::store::Settlement {
        remember: &[("ok", None)],
        release: &[("failed", token)],
        ..Default::default()
    };
    let result = block_on_ready(store.settle(&step)).unwrap();
    assert!(result.is_err(), "the remember failure is reported");
    assert_eq!(
        store.0.0.claimed(),
        vec!["ok".to_string()],
        "the failed run's claim is gone"
    );
}

/// A store whose `settle` writes and answers only its first `answered`
/// remembers, and, from its `honest_from`-th call on, the whole step (a
/// foreign store or a WIT host that answers short).
struct ShortSettle {
    inner: InMemoryStore,
    answered: usize,
    honest_from: usize,
    calls: Cell<usize>,
}

impl Store for ShortSettle {
    async fn seen_many(&self, keys: &[&str]) -> bq_dedupe::StoreResult<Vec<bool>> {
        self.inner.seen_many(keys).await
    }
    async fn remember_many(
        &self,
        keys: &[&str],
        ttl: Option<Duration>,
    ) -> bq_dedupe::StoreResult<()> {
        self.inner.remember_many(keys, ttl).await
    }
    async fn forget(&self, key: &str) -> bq_dedupe::StoreResult<()> {
        self.inner.forget(key).await
    }
    fn capabilities(&self) -> bq_dedupe::store::Capabilities {
        self.inner.capabilities()
    }
    async fn claim_many(
        &self,
        keys: &[&str],
        lease: Duration,
    ) -> bq_dedupe::StoreResult<Vec<bq_dedupe::store::Claim>> {
        self.inner.claim_many(keys, lease).await
    }
    async fn settle(
        &self,
        step: &bq_dedupe::store::Settlement<'_>,
    ) -> bq_dedupe::StoreResult<bq_dedupe::store::Settled> {
        self.calls.set(self.calls.get() + 1);
        if self.calls.get() >= self.honest_from {
            return self.inner.settle(step).await;
        }
        let n = self.answered.min(step.remember.len());
        let part = bq_dedupe::store::Settlement {
            remember: &step.remember[..n],
            ..*step
        };
        self.inner.settle(&part).await
    }
}

/// A settle answered for fewer ids than it was given is a store error, never
/// a write: the ids without an answer were reported `run-ok` though nothing
/// recorded them, and their redeliveries ran again, reported `run-ok` too (a
/// review's finding). Now they are `run-ok-unrecorded`; a checkpoint answered
/// short leaves its successes waiting for the commit, which writes them.
#[test]
fn a_settle_answered_short_is_a_store_error_not_a_write() {
    let short = |answered, honest_from| ShortSettle {
        inner: InMemoryStore::new(),
        answered,
        honest_from,
        calls: Cell::new(0),
    };
    let ok = async |_: &bq_dedupe::Message<'_>| Ok::<(), String>(());
    let kinds = |outcomes: Vec<Outcome<String>>| -> Vec<OutcomeKind> {
        outcomes.iter().map(Outcome::kind).collect()
    };
    let seen = |guard: &Guard<ShortSettle>, ids: &[&str]| -> Vec<bool> {
        let ids = ids
            .iter()
            .map(|id| block_on_ready(guard.store().inner.seen(id)));
        ids.map(|seen| seen.unwrap().unwrap()).collect()
    };

    let one = Guard::new(short(0, usize::MAX));
    let outcome = block_on_ready(one.process(envelope("s-1").as_bytes(), ok)).unwrap();
    assert_eq!(outcome.kind(), OutcomeKind::RanUnrecorded, "{outcome:?}");

    let batch = Guard::new(short(1, usize::MAX));
    let bodies = [envelope("b-1"), envelope("b-2"), envelope("b-3")];
    let outcomes = kinds(block_on_ready(batch.process_batch(&bodies, ok)).unwrap());
    assert_eq!(outcomes, [OutcomeKind::RanUnrecorded; 3]);
    assert_eq!(seen(&batch, &["b-1", "b-2", "b-3"]), [true, false, false]);

    let options = bq_dedupe::Options {
        claim_lease: Some(Duration::from_secs(60)),
        leases: bq_dedupe::lease::LeasePolicy {
            checkpoint_every: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let checkpointed = Guard::new(short(0, 2)).with_options(options);
    let bodies = [envelope("c-1"), envelope("c-2")];
    let outcomes = kinds(block_on_ready(checkpointed.process_batch(&bodies, ok)).unwrap());
    assert_eq!(outcomes, [OutcomeKind::Ran; 2]);
    assert_eq!(seen(&checkpointed, &["c-1", "c-2"]), [true, true]);
}

/// A claiming store that cannot renew (PHP's format, a WIT host without
/// leases): claims are held by the guard's own clock only.
struct Unrenewed(Arc<InMemoryStore>);

impl Store for Unrenewed {
    async fn seen_many(&self, keys: &[&str]) -> bq_dedupe::StoreResult<Vec<bool>> {
        self.0.seen_many(keys).await
    }
    async fn remember_many(
        &self,
        keys: &[&str],
        ttl: Option<Duration>,
    ) -> bq_dedupe::StoreResult<()> {
        self.0.remember_many(keys, ttl).await
    }
    async fn forget(&self, key: &str) -> bq_dedupe::StoreResult<()> {
        self.0.forget(key).await
    }
    fn capabilities(&self) -> bq_dedupe::store::Capabilities {
        bq_dedupe::store::Capabilities {
            renew: false,
            ..self.0.capabilities()
        }
    }
    async fn claim_many(
        &self,
        keys: &[&str],
        lease: Duration,
    ) -> bq_dedupe::StoreResult<Vec<bq_dedupe::store::Claim>> {
        self.0.claim_many(keys, lease).await
    }
    async fn release(
        &self,
        key: &str,
        token: &bq_dedupe::store::ClaimToken,
    ) -> bq_dedupe::StoreResult<()> {
        self.0.release(key, token).await
    }
}

/// On a store that cannot renew, a success written a lease after its claim
/// is `run-ok-lease-lost` by the guard's clock, the wall clock stepped back
/// while the handler ran (NTP, an operator's `date`) or not: the steady clock
/// counts the time passed. Over the wall clock alone it was `run-ok` (a
/// review).
#[test]
fn a_wall_clock_stepped_back_hides_no_lost_lease() {
    let wall = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemoryStore::new());
    let steady = Arc::new(SteadyClock::over(wall.clone()));
    for (clock, late) in [(wall.clone() as Arc<dyn Clock>, false), (steady, true)] {
        let guard = Guard::new(Unrenewed(store.clone()))
            .with_claiming(Duration::from_millis(100))
            .with_clock(clock);
        let id = format!("stepped-{late}");
        let outcome = block_on_ready(guard.process(envelope(&id).as_bytes(), async |_| {
            std::thread::sleep(Duration::from_millis(150));
            wall.set(wall.now_ms() - 10_000);
            Ok::<(), String>(())
        }))
        .unwrap();
        let expected = match late {
            true => Outcome::RanLeaseLost,
            false => Outcome::Ran, // the wall clock alone cannot tell
        };
        assert_eq!(outcome, expected);
    }
}

/// On a store that cannot renew, a delivery whose claim the guard's own clock
/// says has run out by the time its handler would start parks instead: the
/// claim may be another consumer's by then, and the store cannot tell. It ran,
/// `run-ok`, beside the other consumer's run (a trial of the component).
#[test]
fn a_claim_that_ran_out_before_its_handler_parks_where_claims_cannot_be_renewed() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemoryStore::with_clock(clock.clone()));
    let guard = Guard::new(Unrenewed(store.clone()))
        .with_claiming(Duration::from_secs(30))
        .with_clock(clock.clone());
    let no_id = r#"{"job":"urn:babel:orders:created","trace_id":"t","data":{},"meta":{"schema_version":1}}"#;
    let bodies = [
        envelope("slow-1"),
        envelope("slow-2"),
        no_id.to_owned(),
        envelope("slow-3"),
    ];
    let mut ran = Vec::new();
    let outcomes = block_on_ready(guard.process_batch(&bodies, async |m| {
        ran.push(m.id().unwrap_or_default().to_owned());
        clock.advance(40_000); // past the lease
        Ok::<(), String>(())
    }))
    .unwrap();
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(Outcome::kind).collect();
    assert_eq!(
        ran,
        ["slow-1", ""],
        "a delivery without an id holds no claim: it runs"
    );
    assert_eq!(
        kinds[1..],
        [
            OutcomeKind::Parked,
            OutcomeKind::FailOpen,
            OutcomeKind::Parked
        ]
    );
}

/// A host clock pinned at its end (a broken `now-ms`) parks nothing: a claim's
/// end past u64 is no end the guard can tell.
#[test]
fn a_clock_at_its_end_parks_no_claim_where_claims_cannot_be_renewed() {
    let store = Arc::new(InMemoryStore::new());
    let guard = Guard::new(Unrenewed(store))
        .with_claiming(Duration::from_secs(30))
        .with_clock(Arc::new(ManualClock::new(u64::MAX)));
    let bodies = [envelope("end-1"), envelope("end-2")];
    let outcomes =
        block_on_ready(guard.process_batch(&bodies, async |_| Ok::<(), String>(()))).unwrap();
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(Outcome::kind).collect();
    assert_eq!(kinds, [OutcomeKind::Ran, OutcomeKind::Ran]);
}

/// On a store that cannot renew, a success written after its claim ran out by
/// the guard's clock is `run-ok-lease-lost`: the id may have been another
/// consumer's by then, which may have run it too, and such a store cannot fence
/// the write. A success waiting while a later handler runs past the lease was
/// written at the batch's end as `run-ok` (a review).
#[test]
fn a_success_written_after_its_claim_ran_out_is_lease_lost_where_claims_cannot_be_renewed() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemoryStore::with_clock(clock.clone()));
    let guard = Guard::new(Unrenewed(store.clone()))
        .with_claiming(Duration::from_secs(30))
        .with_clock(clock.clone());
    let bodies = [envelope("wait-1"), envelope("wait-2")];
    let outcomes = block_on_ready(guard.process_batch(&bodies, async |m| {
        if m.id() == Some("wait-2") {
            clock.advance(40_000); // past the lease, while wait-1's success waits
        }
        Ok::<(), String>(())
    }))
    .unwrap();
    let kinds = |outcomes: Vec<Outcome<String>>| -> Vec<OutcomeKind> {
        outcomes.iter().map(Outcome::kind).collect()
    };
    assert_eq!(kinds(outcomes), [OutcomeKind::RanLeaseLost; 2]);
    for id in ["wait-1", "wait-2"] {
        assert!(
            block_on_ready(store.seen(id)).unwrap().unwrap(),
            "{id} written"
        );
    }

    // One delivery alone: its handler ran past the lease.
    let outcome = block_on_ready(guard.process(envelope("alone-1").as_bytes(), async |_| {
        clock.advance(40_000);
        Ok::<(), String>(())
    }))
    .unwrap();
    assert_eq!(outcome.kind(), OutcomeKind::RanLeaseLost);

    // Inside the lease: plain successes.
    let bodies = [envelope("quick-1"), envelope("quick-2")];
    let outcomes = block_on_ready(guard.process_batch(&bodies, async |_| {
        clock.advance(10_000);
        Ok::<(), String>(())
    }))
    .unwrap();
    assert_eq!(kinds(outcomes), [OutcomeKind::Ran; 2]);
}

/// A store whose answers come `late` ms after it acted (a slow network), by
/// the shared manual clock.
struct LateAnswers {
    inner: Arc<InMemoryStore>,
    clock: Arc<ManualClock>,
    late: u64,
}

impl LateAnswers {
    fn answer<T>(&self, answer: T) -> T {
        self.clock.advance(self.late);
        answer
    }
}

impl Store for LateAnswers {
    async fn seen_many(&self, keys: &[&str]) -> bq_dedupe::StoreResult<Vec<bool>> {
        self.answer(self.inner.seen_many(keys).await)
    }
    async fn remember_many(
        &self,
        keys: &[&str],
        ttl: Option<Duration>,
    ) -> bq_dedupe::StoreResult<()> {
        self.answer(self.inner.remember_many(keys, ttl).await)
    }
    async fn forget(&self, key: &str) -> bq_dedupe::StoreResult<()> {
        self.answer(self.inner.forget(key).await)
    }
    fn capabilities(&self) -> bq_dedupe::store::Capabilities {
        self.inner.capabilities()
    }
    async fn claim_many(
        &self,
        keys: &[&str],
        lease: Duration,
    ) -> bq_dedupe::StoreResult<Vec<bq_dedupe::store::Claim>> {
        self.answer(self.inner.claim_many(keys, lease).await)
    }
    async fn settle(
        &self,
        step: &bq_dedupe::store::Settlement<'_>,
    ) -> bq_dedupe::StoreResult<bq_dedupe::store::Settled> {
        self.answer(self.inner.settle(step).await)
    }
}

/// Claims run from when the store took them, not from its answer: with
/// answers 300 ms late on a 400 ms lease (renewed every 200 ms), the second
/// delivery's claim runs out while the first handler runs (150 ms), and
/// another consumer takes it. Timed from the answers, no renewal was ever
/// due: it ran beside the other consumer, `run-ok-lease-lost` (a trial).
/// Timed from the calls, the renewal before it is due, finds the claim gone,
/// and it parks.
#[test]
fn a_slow_store_answer_does_not_stretch_the_lease() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let inner = Arc::new(InMemoryStore::with_clock(clock.clone()));
    let store = LateAnswers {
        inner: inner.clone(),
        clock: clock.clone(),
        late: 300,
    };
    let options = bq_dedupe::Options {
        claim_lease: Some(Duration::from_millis(400)),
        leases: bq_dedupe::LeasePolicy {
            renew_after: Some(Duration::from_millis(200)),
            ..bq_dedupe::LeasePolicy::default()
        },
        ..bq_dedupe::Options::default()
    };
    let guard = Guard::new(store)
        .with_options(options)
        .with_clock(clock.clone());
    let bodies = [envelope("late-a"), envelope("late-b")];
    let mut ran = Vec::new();
    let outcomes = block_on_ready(guard.process_batch(&bodies, async |m| {
        ran.push(m.id().unwrap().to_owned());
        if m.id() == Some("late-a") {
            clock.advance(150);
            let taken = block_on_ready(inner.claim("late-b", Duration::from_secs(60)));
            assert!(
                matches!(taken, Ok(Ok(bq_dedupe::store::Claim::Acquired(_)))),
                "another consumer takes the lapsed claim: {taken:?}"
            );
        }
        Ok::<(), String>(())
    }))
    .unwrap();
    assert_eq!(ran, ["late-a"], "{outcomes:?}");
    assert_eq!(outcomes[1], Outcome::Parked);
}
