//! Claims that hold: renewals and fenced commits on every store, and two
//! consumers racing over a batch slower than its lease (threads, real time).

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bq_dedupe::{Counters, Guard, Outcome, OutcomeKind, Store, store::Claim};
use common::{check_leases, envelope, fenced, on_backends, ready};

/// A lease that runs out within a test, and the sleep that outlasts it. (At
/// 200 ms, a call delayed that long on a loaded machine found a Redis claim
/// expired before its renewal or its "held" check: a review.)
const SHORT: Duration = Duration::from_millis(1000);
const PAST_SHORT: Duration = Duration::from_millis(1200);

/// Renewals and fenced commits, leases run out in real time.
#[test]
fn every_backend_renews_and_fences_only_for_the_owner() {
    on_backends("leases", fenced, |subject| {
        check_leases(&*subject.open(), SHORT, || std::thread::sleep(PAST_SHORT))
    });
}

/// A crashed holder's claim lapses with its lease: the key is claimed again,
/// and the stale token releases nothing.
#[test]
fn every_backend_reclaims_a_lapsed_claim() {
    on_backends("lease", fenced, |subject| {
        let store = subject.open();
        let Claim::Acquired(crashed) = ready(store.claim("l", SHORT)).unwrap() else {
            panic!("free key");
        };
        assert_eq!(ready(store.claim("l", SHORT)).unwrap(), Claim::Held);
        std::thread::sleep(PAST_SHORT);
        let long = Duration::from_secs(60);
        let Claim::Acquired(second) = ready(store.claim("l", long)).unwrap() else {
            panic!("a lapsed lease must be reclaimable");
        };
        ready(store.release("l", &crashed)).unwrap();
        assert_eq!(
            ready(store.claim("l", SHORT)).unwrap(),
            Claim::Held,
            "the crashed holder's stale token released the new claim"
        );
        ready(store.release("l", &second)).unwrap();
        assert!(matches!(
            ready(store.claim("l", SHORT)).unwrap(),
            Claim::Acquired(_)
        ));
    });
}

/// Effects per id, shared by the two consumers.
#[derive(Default)]
struct Effects(Mutex<std::collections::BTreeMap<String, u32>>);

impl Effects {
    fn bump(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_string()).or_default() += 1;
    }
    fn each_once(&self, ids: &[String]) {
        let effects = self.0.lock().unwrap();
        for id in ids {
            assert_eq!(effects.get(id), Some(&1), "effects per id: {effects:?}");
        }
    }
}

/// Consumer A takes a batch of 8 ids whose handlers take `work` each (8 x work is
/// well over the lease); consumer B, on its own connection, delivers the same 8
/// ids `b_after` later. Exactly one effect per id; B skips or parks.
fn two_consumers_over_a_slow_batch<S: Store + Send + Sync>(
    open: impl Fn() -> S + Sync,
    tag: &str,
    lease: Duration,
    work: Duration,
    b_after: Duration,
) {
    let ids: Vec<String> = (0..8)
        .map(|i| common::unique(&format!("{tag}-{i}")))
        .collect();
    let bodies: Vec<String> = ids.iter().map(|id| envelope(id)).collect();
    let effects = Effects::default();
    let run = |delay: Duration| {
        std::thread::sleep(delay);
        let counters = Arc::new(Counters::new());
        let guard = Guard::new(open())
            .with_claiming(lease)
            .with_observer(counters.clone());
        let outcomes = ready(guard.process_batch(&bodies, async |msg| {
            std::thread::sleep(work);
            effects.bump(msg.id().unwrap_or_default());
            Ok::<(), String>(())
        }));
        (outcomes, counters.snapshot())
    };
    let ((a, a_counts), (b, _)) = std::thread::scope(|s| {
        let a = s.spawn(|| run(Duration::ZERO));
        let b = s.spawn(|| run(b_after));
        (a.join().unwrap(), b.join().unwrap())
    });
    effects.each_once(&ids);
    assert!(a.iter().all(|o| *o == Outcome::Ran), "A: {a:?}");
    assert_eq!(a_counts.lease_lost, 0);
    assert!(
        b.iter()
            .all(|o| matches!(o.kind(), OutcomeKind::Skipped | OutcomeKind::Parked)),
        "B: {b:?}"
    );
}

/// A's only handler outlives its lease with no timer to renew it; B takes the
/// lapsed claim and runs too. A's commit is fenced: `run-ok-lease-lost`, counted,
/// and B's own commit is the one that records the id. (B starts a lease and a
/// margin after A's handler began, and A's handler returns after B's run: a
/// fixed start for B raced the opening of A's store on a loaded machine.)
fn lost_lease_is_reported<S: Store + Send + Sync>(open: impl Fn() -> S + Sync, tag: &str) {
    let id = common::unique(tag);
    let body = envelope(&id);
    let runs = AtomicU32::new(0);
    let lease = Duration::from_millis(300);
    let counters = Arc::new(Counters::new());
    let (claimed, is_claimed) = std::sync::mpsc::channel::<()>();
    let (b_done, is_b_done) = std::sync::mpsc::channel::<()>();
    let (open, body, runs, counters) = (&open, &body, &runs, &counters);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(move || {
            let guard = Guard::new(open())
                .with_claiming(lease)
                .with_observer(counters.clone());
            ready(guard.process(body.as_bytes(), async |_| {
                claimed.send(()).unwrap();
                is_b_done.recv().unwrap();
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }))
        });
        let b = s.spawn(move || {
            let guard = Guard::new(open()).with_claiming(Duration::from_secs(30));
            is_claimed.recv().unwrap();
            std::thread::sleep(lease + Duration::from_millis(200));
            let b = ready(guard.process(body.as_bytes(), async |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            }));
            b_done.send(()).unwrap();
            b
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "both ran: the lease was lost"
    );
    assert_eq!(b, Outcome::Ran);
    assert_eq!(a, Outcome::RanLeaseLost, "never a silent run-ok");
    assert_eq!(a.kind().code(), "run-ok-lease-lost");
    assert_eq!(counters.snapshot().lease_lost, 1);
    assert!(ready(open().seen(&id)).unwrap());
}

#[test]
fn two_consumers_over_a_batch_slower_than_its_lease_run_each_id_once_on_every_backend() {
    on_backends("slow-batch", fenced, |subject| {
        // (Renewed every other handler, 600 ms before the lease would lapse:
        // at 600 ms and 300 ms handlers a stall of 300 ms lost it.)
        two_consumers_over_a_slow_batch(
            || subject.open(),
            subject.name(),
            Duration::from_millis(1000),
            Duration::from_millis(200),
            Duration::from_millis(800),
        )
    });
}

#[test]
fn a_lost_lease_is_run_ok_lease_lost_on_every_backend() {
    on_backends("lost-lease", fenced, |subject| {
        lost_lease_is_reported(|| subject.open(), subject.name())
    });
}

/// A forget while the handler runs also loses the claim: reported, and the id
/// is remembered (the effect did happen).
#[test]
fn a_forget_during_the_handler_is_run_ok_lease_lost_on_every_backend() {
    on_backends("forget-lease", fenced, |subject| {
        let id = common::unique("forget");
        let guard = Guard::new(subject.open()).with_claiming(Duration::from_secs(30));
        let other = subject.open();
        let outcome = ready(guard.process(envelope(&id).as_bytes(), async |_| {
            ready(other.forget(&id)).unwrap();
            Ok::<(), String>(())
        }));
        assert_eq!(outcome, Outcome::RanLeaseLost);
        assert!(ready(other.seen(&id)).unwrap());
    });
}
