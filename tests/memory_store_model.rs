//! `InMemoryStore` against a `HashSet` model, over random runs of single and
//! batch calls on a small pool of keys (UUIDs, near-UUIDs, other text), so its
//! shortcuts (the parsed keys a lookup keeps for the remember that follows,
//! pre-sizing) can never change an answer: repeated keys in one batch, remembers
//! out of lookup order, forgets in between.

use std::collections::HashSet;

use bq_dedupe::{InMemoryStore, Store, block_on_ready};
use proptest::prelude::*;

const POOL: [&str; 8] = [
    "60a7c782-d326-426c-876e-7fc44dd0bb78",
    "60a7c782-d326-426c-876e-7fc44dd0bb79",
    "f10f5e1a-01ba-4956-9582-8a4511ed9ff8",
    "F10F5E1A-01BA-4956-9582-8A4511ED9FF8",
    "f10f5e1a-01ba-4956-9582-8a4511ed9ffg",
    "60a7c782-d326-426c-876e-7fc44dd0bb7",
    "order-1042",
    "",
];

#[derive(Debug, Clone)]
enum Op {
    Seen(usize),
    SeenMany(Vec<usize>),
    Remember(usize),
    RememberMany(Vec<usize>),
    Forget(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..POOL.len();
    let keys = prop::collection::vec(0..POOL.len(), 0..12);
    prop_oneof![
        key.clone().prop_map(Op::Seen),
        keys.clone().prop_map(Op::SeenMany),
        key.clone().prop_map(Op::Remember),
        keys.prop_map(Op::RememberMany),
        key.prop_map(Op::Forget),
    ]
}

fn check(ops: &[Op], reserved: usize) -> Result<(), TestCaseError> {
    let store = InMemoryStore::new().with_reserved(reserved);
    let mut model: HashSet<&str> = HashSet::new();
    let keys = |ix: &[usize]| ix.iter().map(|&i| POOL[i]).collect::<Vec<_>>();
    for op in ops {
        match op {
            Op::Seen(i) => {
                let got = block_on_ready(store.seen(POOL[*i])).unwrap().unwrap();
                prop_assert_eq!(got, model.contains(POOL[*i]), "{:?}", op);
            }
            Op::SeenMany(ix) => {
                let ks = keys(ix);
                let got = block_on_ready(store.seen_many(&ks)).unwrap().unwrap();
                let want: Vec<bool> = ks.iter().map(|k| model.contains(k)).collect();
                prop_assert_eq!(got, want, "{:?}", op);
            }
            Op::Remember(i) => {
                block_on_ready(store.remember(POOL[*i], None))
                    .unwrap()
                    .unwrap();
                model.insert(POOL[*i]);
            }
            Op::RememberMany(ix) => {
                let ks = keys(ix);
                block_on_ready(store.remember_many(&ks, None))
                    .unwrap()
                    .unwrap();
                model.extend(ks);
            }
            Op::Forget(i) => {
                block_on_ready(store.forget(POOL[*i])).unwrap().unwrap();
                model.remove(POOL[*i]);
            }
        }
        prop_assert_eq!(store.len(), model.len(), "after {:?}", op);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_memory_store_answers_like_a_set(ops in prop::collection::vec(op(), 0..60)) {
        check(&ops, 0)?;
    }

    #[test]
    fn a_presized_memory_store_answers_like_a_set(ops in prop::collection::vec(op(), 0..60)) {
        check(&ops, 3)?;
    }
}
