//! Property test of claiming mode with two consumers: any interleaving of their
//! handlers, leases that run out as a shared clock moves, renewals, handler
//! failures and a store that goes down and comes back. The invariant: an id's
//! effect happens more than once only where an outcome says so
//! (`run-ok-lease-lost`, or `run-ok-unrecorded` when the store could not record
//! the first success).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bq_dedupe::{
    Guard, InMemoryStore, LeasePolicy, Options, Outcome, OutcomeKind, Store, StoreError,
    StoreResult, clock::ManualClock, store::Capabilities, store::Claim, store::Settled,
    store::Settlement,
};
use proptest::prelude::*;

/// The shared store, which fails every call while `down` is set.
struct Outage {
    inner: Arc<InMemoryStore>,
    down: Arc<AtomicBool>,
}

impl Outage {
    fn up(&self) -> StoreResult<()> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(StoreError::unavailable("down")),
            false => Ok(()),
        }
    }
}

impl Store for Outage {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.up()?;
        self.inner.seen_many(keys).await
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.up()?;
        self.inner.remember_many(keys, ttl).await
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.up()?;
        self.inner.forget(key).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.up()?;
        self.inner.claim_many(keys, lease).await
    }
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        self.up()?;
        self.inner.settle(step).await
    }
}

/// Pending once: the point where the other consumer may take its turn.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Let consumer 0 or 1 run to its next handler's midpoint, after the clock
    /// moved on by this many ms.
    Run(usize, u64),
    /// The store goes down, or comes back.
    Toggle,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0usize..2, 0u64..25).prop_map(|(who, ms)| Step::Run(who, ms)),
        1 => Just(Step::Toggle),
    ]
}

fn batch() -> impl Strategy<Value = Vec<(u8, bool)>> {
    prop::collection::vec((1u8..4, prop::bool::weighted(0.25)), 1..6)
}

fn body(id: u8, fail: bool) -> String {
    serde_json::json!({
        "job": "urn:babel:test:lease", "trace_id": "t", "data": {"fail": fail},
        "meta": {"id": format!("id-{id}"), "schema_version": 1}, "attempts": 0
    })
    .to_string()
}

/// One consumer's batch in progress.
type Run<'a> = Pin<Box<dyn Future<Output = Vec<Outcome<String>>> + 'a>>;

fn check(batches: [Vec<(u8, bool)>; 2], steps: Vec<Step>) -> Result<(), TestCaseError> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let inner = Arc::new(InMemoryStore::with_clock(clock.clone()));
    let down = Arc::new(AtomicBool::new(false));
    let options = Options {
        claim_lease: Some(Duration::from_millis(30)),
        leases: LeasePolicy {
            renew_after: None,
            checkpoint_after: Duration::from_millis(10),
            checkpoint_every: 3,
        },
        ..Options::default()
    };
    let guards: Vec<Guard<Outage>> = (0..2)
        .map(|_| {
            Guard::new(Outage {
                inner: inner.clone(),
                down: down.clone(),
            })
            .with_options(options.clone())
            .with_clock(clock.clone())
        })
        .collect();
    let effects: RefCell<BTreeMap<String, u32>> = RefCell::default();
    let bodies: Vec<Vec<String>> = batches
        .iter()
        .map(|b| b.iter().map(|(id, fail)| body(*id, *fail)).collect())
        .collect();
    let handler = async |m: &bq_dedupe::Message<'_>| {
        YieldOnce(false).await;
        if m.raw().contains("\"fail\":true") {
            return Err("fail".to_string());
        }
        *effects
            .borrow_mut()
            .entry(m.id().unwrap_or_default().to_string())
            .or_default() += 1;
        Ok(())
    };
    let mut runs: Vec<Run<'_>> = guards
        .iter()
        .zip(&bodies)
        .map(|(g, b)| Box::pin(g.process_batch(b, handler)) as Run<'_>)
        .collect();
    let mut done: [Option<Vec<Outcome<String>>>; 2] = [None, None];
    let mut cx = Context::from_waker(Waker::noop());
    let mut poll = |who: usize, done: &mut [Option<Vec<Outcome<String>>>; 2]| {
        if done[who].is_none() {
            if let Poll::Ready(out) = runs[who].as_mut().poll(&mut cx) {
                done[who] = Some(out);
            }
        }
    };
    for step in steps {
        match step {
            Step::Toggle => down.store(!down.load(Ordering::SeqCst), Ordering::SeqCst),
            Step::Run(who, ms) => {
                clock.advance(ms);
                poll(who, &mut done);
            }
        }
    }
    // Then both run to the end, the store back up.
    down.store(false, Ordering::SeqCst);
    while done.iter().any(Option::is_none) {
        clock.advance(5);
        poll(0, &mut done);
        poll(1, &mut done);
    }
    let outcomes: Vec<(String, OutcomeKind)> = done
        .iter()
        .zip(&bodies)
        .flat_map(|(out, bodies)| {
            let out = out.as_ref().unwrap();
            assert_eq!(out.len(), bodies.len(), "one outcome per delivery");
            bodies.iter().zip(out).map(|(b, o)| {
                let id = bq_dedupe::Message::parse_str(b, &Default::default())
                    .unwrap()
                    .id()
                    .unwrap()
                    .to_string();
                (id, o.kind())
            })
        })
        .collect();
    for (id, n) in effects.borrow().iter() {
        let reported = outcomes
            .iter()
            .filter(|(i, k)| {
                i == id && matches!(k, OutcomeKind::RanLeaseLost | OutcomeKind::RanUnrecorded)
            })
            .count() as u32;
        prop_assert!(
            *n <= 1 + reported,
            "{id} ran {n} times with {reported} reported: {outcomes:?}"
        );
        let ran = outcomes
            .iter()
            .filter(|(i, k)| i == id && k.handler_ran() && *k != OutcomeKind::Failed)
            .count() as u32;
        prop_assert_eq!(
            ran,
            *n,
            "every success has a success outcome: {:?}",
            outcomes
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    #[test]
    fn two_claiming_consumers_duplicate_an_effect_only_where_an_outcome_says_so(
        a in batch(),
        b in batch(),
        steps in prop::collection::vec(step(), 0..30),
    ) {
        check([a, b], steps)?;
    }
}

/// The case the property is about, spelled out: A's claim lapses while its
/// handler is paused, B takes the id over and runs it, then both finish.
#[test]
fn a_claim_taken_over_mid_handler_is_reported_not_silent() {
    check(
        [vec![(1, false)], vec![(1, false)]],
        vec![
            Step::Run(0, 0),
            Step::Run(1, 40),
            Step::Run(0, 0),
            Step::Run(1, 0),
        ],
    )
    .unwrap();
}

/// Hole 2 of the store-contract issue (failed on 6ddd708): a consumer cut off
/// from its store for longer than its lease must not run the rest of its batch.
/// A's renewal before its second handler fails and its own clock says the lease
/// has run out; meanwhile B took the lapsed claim on id-2 and ran it. A must
/// park id-2 (its claim is lost), not run it a second time.
#[test]
fn a_consumer_cut_off_past_its_lease_runs_nothing_more() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let inner = Arc::new(InMemoryStore::with_clock(clock.clone()));
    let (down_a, down_b) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let options = Options {
        claim_lease: Some(Duration::from_millis(30)),
        ..Options::default()
    };
    let guard = |down: &Arc<AtomicBool>| {
        Guard::new(Outage {
            inner: inner.clone(),
            down: down.clone(),
        })
        .with_options(options.clone())
        .with_clock(clock.clone())
    };
    let (a, b) = (guard(&down_a), guard(&down_b));
    let effects: RefCell<BTreeMap<String, u32>> = RefCell::default();
    let count = |m: &bq_dedupe::Message<'_>| {
        *effects
            .borrow_mut()
            .entry(m.id().unwrap_or_default().to_string())
            .or_default() += 1;
    };
    let batch = [body(1, false), body(2, false)];
    let outcomes = bq_dedupe::block_on_ready(a.process_batch(&batch, async |m| {
        count(m);
        if m.id() == Some("id-1") {
            // A's first handler is slow, and A loses its store meanwhile.
            clock.advance(40);
            down_a.store(true, Ordering::SeqCst);
            let by_b = bq_dedupe::block_on_ready(b.process(&body(2, false), async |m| {
                count(m);
                Ok::<(), String>(())
            }))
            .unwrap();
            assert_eq!(by_b.kind(), OutcomeKind::Ran, "B takes the lapsed claim");
        }
        Ok::<(), String>(())
    }))
    .unwrap();
    assert_eq!(effects.borrow()["id-2"], 1, "id-2 ran twice: {outcomes:?}");
    assert_eq!(outcomes[1].kind(), OutcomeKind::Parked, "{outcomes:?}");
}
