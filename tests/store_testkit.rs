//! The in-memory store passes the store testkit: random runs from three
//! clients on a manual clock, faults injected, every answer checked against the
//! record model (`bq_dedupe::store::record`).

use std::sync::Arc;

use bq_dedupe::store::record::Rules;
use bq_dedupe::testkit::{self, Fault, Harness, Op};
use bq_dedupe::{Clock, InMemoryStore, ManualClock};

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
    use bq_dedupe::testkit::{Fault, Op, as_rust};
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
