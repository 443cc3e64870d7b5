//! The in-memory store passes the store testkit: random runs from three
//! clients on a manual clock, faults injected, every answer checked against the
//! record model (`bq_dedupe::store::record`).

use std::sync::Arc;

use bq_dedupe::store::record::Rules;
use bq_dedupe::{InMemoryStore, clock::Clock, clock::ManualClock};
use bq_dedupe_testkit::{self as testkit, Fault, Harness, Op};

struct Memory {
    store: Arc<InMemoryStore>,
    clock: Arc<ManualClock>,
}

impl Memory {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new(0));
        Memory {
            store: Arc::new(InMemoryStore::with_clock(clock.clone())),
            clock,
        }
    }
}

impl Harness for Memory {
    type Client = Arc<InMemoryStore>;
    fn rules(&self) -> Rules {
        InMemoryStore::RULES
    }
    fn open(&mut self) -> Arc<InMemoryStore> {
        self.store.clone()
    }
    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }
    fn advance(&mut self, ms: u64) {
        self.clock.advance(ms);
    }
}

#[test]
fn the_in_memory_store_follows_the_record_model() {
    testkit::check(400, Memory::new);
}

/// The checker itself can fail: a store that answers a lost claim's commit as
/// kept is caught.
#[test]
fn the_testkit_catches_a_store_that_breaks_a_rule() {
    struct Lenient(Memory);
    impl Harness for Lenient {
        type Client = Arc<InMemoryStore>;
        fn rules(&self) -> Rules {
            // Claims the memory store keeps done tokens: a resent commit must
            // then answer `true`, which this store does not.
            Rules {
                done_keeps_token: true,
                ..InMemoryStore::RULES
            }
        }
        fn open(&mut self) -> Arc<InMemoryStore> {
            self.0.open()
        }
        fn now_ms(&self) -> u64 {
            self.0.now_ms()
        }
        fn advance(&mut self, ms: u64) {
            self.0.advance(ms)
        }
    }
    let run = [
        Op::Claim {
            client: 0,
            keys: vec![0],
            lease: 5,
        },
        Op::Arm {
            client: 0,
            fault: Fault::Resend,
        },
        Op::Commit {
            client: 0,
            key: 0,
            token: 0,
            ttl: None,
        },
    ];
    let err = testkit::check_ops(&mut Lenient(Memory::new()), &run).unwrap_err();
    assert!(err.contains("Commit"), "{err}");
}

/// A failing run is printed as Rust that `check_ops` takes back.
#[test]
fn a_failing_run_is_printed_as_rust_to_replay() {
    use bq_dedupe_testkit::{Fault, Op, as_rust};
    let run = vec![
        Op::Claim {
            client: 0,
            keys: vec![0, 1],
            lease: 1,
        },
        Op::Arm {
            client: 1,
            fault: Fault::Resend,
        },
        Op::Settle {
            client: 0,
            release: vec![(0, 0)],
            renew: vec![],
            remember: vec![(1, Some(0))],
            ttl: None,
            lease: 2,
        },
    ];
    assert_eq!(
        as_rust(&run),
        "vec![Op::Claim { client: 0, keys: vec![0, 1], lease: 1 }, \
         Op::Arm { client: 1, fault: Fault::Resend }, \
         Op::Settle { client: 0, release: vec![(0, 0)], renew: vec![], \
         remember: vec![(1, Some(0))], ttl: None, lease: 2 }]"
    );
}

/// A fleet of four clients on one in-memory store, calling at once on a
/// manual clock each of them moves: every key's history linearizable.
fn memory_fleet() -> testkit::Fleet<Arc<InMemoryStore>> {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = Arc::new(InMemoryStore::with_clock(clock.clone()));
    let (now, step) = (clock.clone(), clock);
    testkit::Fleet::new(InMemoryStore::RULES, move || store.clone())
        .with_clock(move || now.now_ms(), move |ms| step.advance(ms), 1000)
        .with_clients(4, 24)
}

#[test]
fn the_in_memory_store_histories_are_linearizable_under_four_concurrent_clients() {
    testkit::check_histories(60, memory_fleet);
}

/// A store with one bug of a kind the checkers must catch, over the in-memory
/// store.
#[derive(Clone, Copy)]
enum Bug {
    /// The claim is a check, then a write (not one atomic step).
    CheckThenClaim,
    /// A fenced commit records the id whoever holds the claim, and says it
    /// was kept.
    Unfenced,
}

struct Broken(Arc<InMemoryStore>, Bug);

mod broken {
    use super::{Broken, Bug};
    use bq_dedupe::store::{Claim, Peeked, Settled, Settlement, StoreResult};
    use bq_dedupe::{Store, store::Capabilities, store::ClaimToken};
    use std::time::Duration;

    impl Store for Broken {
        async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
            self.0.seen_many(keys).await
        }
        async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
            self.0.remember_many(keys, ttl).await
        }
        async fn forget(&self, key: &str) -> StoreResult<()> {
            self.0.forget(key).await
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
            self.0.peek_many(keys).await
        }
        async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
            if let Bug::Unfenced = self.1 {
                return self.0.claim_many(keys, lease).await;
            }
            let mut claims = Vec::new();
            for (key, peeked) in keys.iter().zip(self.0.peek_many(keys).await?) {
                claims.push(match peeked {
                    Peeked::Done => Claim::Seen,
                    Peeked::NotDone { claim_ends_in } if claim_ends_in != Some(Duration::ZERO) => {
                        Claim::Held
                    }
                    Peeked::NotDone { .. } => {
                        // The race: another client may claim it now.
                        std::thread::sleep(Duration::from_millis(3));
                        self.0.forget(key).await?;
                        self.0.claim(key, lease).await?
                    }
                });
            }
            Ok(claims)
        }
        async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
            if let Bug::CheckThenClaim = self.1 {
                return self.0.settle(step).await;
            }
            // Every remember as if its claim still stood.
            let plain: Vec<(&str, Option<&ClaimToken>)> =
                step.remember.iter().map(|(key, _)| (*key, None)).collect();
            let step = Settlement {
                remember: &plain,
                ..*step
            };
            self.0.settle(&step).await
        }
        async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
            self.0.release(key, token).await
        }
        async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
            self.0.renew(key, token, lease).await
        }
        async fn remember_fenced(
            &self,
            key: &str,
            token: &ClaimToken,
            ttl: Option<Duration>,
        ) -> StoreResult<bool> {
            match self.1 {
                Bug::CheckThenClaim => self.0.remember_fenced(key, token, ttl).await,
                Bug::Unfenced => self.0.remember_many(&[key], ttl).await.map(|()| true),
            }
        }
    }
}

/// The history checker can fail: a store whose claim is a check, then a write
/// (not one atomic step) grants one key to two clients at once, and that
/// history has no order.
#[test]
fn the_history_checker_catches_a_claim_that_is_not_atomic() {
    let caught = (0..40u64).find_map(|seed| {
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = Arc::new(InMemoryStore::with_clock(clock.clone()));
        let now = clock.clone();
        let fleet = testkit::Fleet::new(InMemoryStore::RULES, move || {
            Broken(store.clone(), Bug::CheckThenClaim)
        })
        .with_clock(move || now.now_ms(), move |ms| clock.advance(ms), 1000)
        .with_clients(4, 24);
        testkit::check_history(&fleet, seed).err()
    });
    let err = caught.expect("40 runs and the race never caught");
    assert!(err.contains("not linearizable"), "{err}");
    if std::env::var_os("BQ_SHOW").is_some() {
        println!("{err}");
    }
}

/// The guard in the loop can fail: a store whose fenced commit records the id
/// whoever holds the claim (and says it was kept) lets a slow handler whose
/// claim another consumer took report a plain `run-ok`, so the id runs twice
/// unreported.
#[test]
fn the_guard_in_the_loop_catches_a_fenced_commit_that_ignores_a_lost_claim() {
    use bq_dedupe::{Guard, block_on_ready};
    use bq_dedupe_testkit::guard_fleet::{Inbox, plain_delivery, run_on_threads};
    use std::time::Duration;

    let memory = Arc::new(InMemoryStore::new());
    let lease = Duration::from_millis(150);
    let guards: Vec<Guard<Broken>> = (0..4)
        .map(|_| Guard::new(Broken(memory.clone(), Bug::Unfenced)).with_claiming(lease))
        .collect();
    let inbox = Inbox::new("unfenced", lease);
    let sleep = async |d: Duration| std::thread::sleep(d);
    run_on_threads(&inbox, 4, |c, id, act| {
        block_on_ready(plain_delivery(&guards[c], id, act, lease, sleep)).unwrap()
    })
    .unwrap();
    let err = inbox
        .check("claiming", None)
        .expect_err("an id ran twice, unreported");
    assert!(err.contains("times as plain run-ok"), "{err}");
}
