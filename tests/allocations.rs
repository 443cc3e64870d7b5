//! Allocations on the hot path (issue #19): what one delivery costs the
//! allocator through `Guard::process` and `Guard::process_batch` over the
//! in-memory store, counted by a counting global allocator on this thread.
//!
//! The bounds are today's counts, so a change that adds an allocation per
//! delivery fails here and says so. What is left, and why:
//! - the decision's store key (`Decision::key` is an owned `String`, a public
//!   field): one per delivery with an id, fresh or not;
//! - the store's answer to a commit (`Settled::kept`, a public `Vec`): one per
//!   commit, so one per fresh single delivery and one per batch;
//! - a batch's own lists (decisions, messages, results: a handful per batch).
//!
//! The store keeps a UUID id in 16 bytes of its table (no allocation of its own).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;

use bq_dedupe::{Guard, InMemoryStore, Message, OutcomeKind, block_on_ready};

struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations per delivery made by `f` over `n` deliveries.
fn per_delivery(n: usize, f: impl FnOnce()) -> f64 {
    let before = COUNT.with(Cell::get);
    f();
    (COUNT.with(Cell::get) - before) as f64 / n as f64
}

fn envelope(id: usize) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:shipped","trace_id":"t-{id}","data":{{"order_id":{id},"amount":143.18}},"meta":{{"id":"{id:08x}-d326-426c-876e-7fc44dd0bb78","schema_version":1}},"attempts":0}}"#
    )
}

const WARM: usize = 2000;
const N: usize = 1000;

fn bodies() -> Vec<String> {
    (0..WARM + N).map(envelope).collect()
}

async fn ok(_: &Message<'_>) -> Result<(), Infallible> {
    Ok(())
}

#[test]
fn one_delivery_allocates_its_key_and_the_commit_answer_nothing_else() {
    let bodies = bodies();
    let guard = Guard::new(InMemoryStore::new());
    // The table grown first, so its growth is not counted per delivery.
    for b in &bodies[..WARM] {
        let _ = block_on_ready(guard.process(b.as_bytes(), ok));
    }
    let fresh = per_delivery(N, || {
        for b in &bodies[WARM..] {
            let o = block_on_ready(guard.process(b.as_bytes(), ok)).unwrap();
            assert_eq!(o.kind(), OutcomeKind::Ran);
        }
    });
    let again = per_delivery(N, || {
        for b in &bodies[WARM..] {
            let o = block_on_ready(guard.process(b.as_bytes(), ok)).unwrap();
            assert_eq!(o.kind(), OutcomeKind::Skipped);
        }
    });
    eprintln!("Guard::process: {fresh} allocations per fresh delivery, {again} per redelivery");
    assert!(
        fresh <= 2.05,
        "a fresh delivery made {fresh} allocations (was 2)"
    );
    assert!(
        again <= 1.0,
        "a redelivery made {again} allocations (was 1)"
    );
}

#[test]
fn a_batch_allocates_per_delivery_only_its_keys() {
    let bodies = bodies();
    let guard = Guard::new(InMemoryStore::new());
    for chunk in bodies[..WARM].chunks(100) {
        let _ = block_on_ready(guard.process_batch(chunk, ok));
    }
    let fresh = per_delivery(N, || {
        for chunk in bodies[WARM..].chunks(100) {
            let outcomes = block_on_ready(guard.process_batch(chunk, ok)).unwrap();
            assert!(outcomes.iter().all(|o| o.kind() == OutcomeKind::Ran));
        }
    });
    let again = per_delivery(N, || {
        for chunk in bodies[WARM..].chunks(100) {
            let outcomes = block_on_ready(guard.process_batch(chunk, ok)).unwrap();
            assert!(outcomes.iter().all(|o| o.kind() == OutcomeKind::Skipped));
        }
    });
    eprintln!(
        "Guard::process_batch(100): {fresh} allocations per fresh delivery, {again} per redelivery"
    );
    assert!(
        fresh <= 2.2,
        "a fresh delivery in a batch made {fresh} allocations"
    );
    assert!(
        again <= 1.2,
        "a redelivery in a batch made {again} allocations"
    );
}
