//! The in-memory store's memory follows the ids live within their TTL, not
//! every id it ever saw (issue #29: a million ids with `--ttl 1s` over 8 s
//! ended at ~110 bytes each, as without a TTL: nothing swept them).

use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::{InMemoryStore, Store, block_on_ready, clock::ManualClock};

#[test]
fn expired_ids_are_swept_as_new_ones_come() {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = InMemoryStore::with_clock(clock.clone());
    let ttl = Some(Duration::from_secs(1));
    // 200,000 ids over 20 s, 10,000 a second, each kept for 1 s.
    for second in 0..20 {
        if second > 0 {
            clock.advance(1_000);
        }
        let ids: Vec<String> = (0..10_000).map(|i| format!("order-{second}-{i}")).collect();
        let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
        block_on_ready(store.remember_many(&keys, ttl))
            .unwrap()
            .unwrap();
    }
    // At most a few seconds' ids are held: the live ones and those expired
    // since the last sweep (the table at most doubles between sweeps).
    assert!(
        store.held() <= 60_000,
        "{} entries held for 10,000 live",
        store.held()
    );
    // What is held is still right: the last second's ids are live, older ones
    // are not, and nothing expired is reported seen.
    assert!(!block_on_ready(store.seen("order-0-0")).unwrap().unwrap());
    assert!(
        block_on_ready(store.seen("order-19-9999"))
            .unwrap()
            .unwrap()
    );
}

#[test]
fn ids_without_a_ttl_are_all_kept() {
    let store = InMemoryStore::new();
    let ids: Vec<String> = (0..20_000).map(|i| format!("kept-{i}")).collect();
    let keys: Vec<&str> = ids.iter().map(String::as_str).collect();
    block_on_ready(store.remember_many(&keys, None))
        .unwrap()
        .unwrap();
    block_on_ready(store.remember_many(&["one-more"], Some(Duration::from_secs(1))))
        .unwrap()
        .unwrap();
    assert_eq!(store.len(), 20_001);
}
