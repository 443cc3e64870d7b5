//! Property tests: the guard against a plain model of the spec, over any
//! interleaving of deliveries, handler failures, forgets and batches.

mod common;

use std::cell::Cell;
use std::collections::HashSet;
use std::time::Duration;

use bq_dedupe::{Guard, InMemoryStore, OutcomeKind, Store, block_on_ready};
use proptest::prelude::*;

/// Ids 1..=4 are real; 0 means "no usable id" (fail-open).
#[derive(Debug, Clone)]
enum Op {
    Deliver { id: u8, fail: bool },
    Forget(u8),
    Batch(Vec<(u8, bool)>),
}

fn op() -> impl Strategy<Value = Op> {
    let delivery = (0u8..5, prop::bool::weighted(0.3));
    prop_oneof![
        6 => delivery.clone().prop_map(|(id, fail)| Op::Deliver { id, fail }),
        1 => (1u8..5).prop_map(Op::Forget),
        2 => prop::collection::vec(delivery, 1..8).prop_map(Op::Batch),
    ]
}

fn body(id: u8, fail: bool) -> String {
    let meta_id = if id == 0 {
        serde_json::Value::Null
    } else {
        format!("id-{id}").into()
    };
    serde_json::json!({
        "job": "urn:babel:test:prop", "trace_id": "t", "data": {"fail": fail},
        "meta": {"id": meta_id, "schema_version": 1}, "attempts": 0
    })
    .to_string()
}

/// What the spec says happens, delivery by delivery.
#[derive(Default)]
struct Model {
    seen: HashSet<u8>,
    effects: u32,
}

impl Model {
    fn deliver(&mut self, id: u8, fail: bool) -> OutcomeKind {
        if id == 0 {
            self.effects += 1;
            return if fail {
                OutcomeKind::FailOpenFailed
            } else {
                OutcomeKind::FailOpen
            };
        }
        if self.seen.contains(&id) {
            return OutcomeKind::Skipped;
        }
        self.effects += 1;
        if fail {
            OutcomeKind::Failed
        } else {
            self.seen.insert(id);
            OutcomeKind::Ran
        }
    }

    /// A batch: each id's first delivery decides; later ones in the batch follow it
    /// (skip if it ran or was skipped, retry if it failed) without running.
    fn batch(&mut self, deliveries: &[(u8, bool)]) -> Vec<OutcomeKind> {
        let before = self.seen.clone();
        let mut leader: Vec<(u8, OutcomeKind)> = Vec::new();
        let mut out = Vec::new();
        for &(id, fail) in deliveries {
            if id != 0 {
                if let Some((_, first)) = leader.iter().find(|(l, _)| *l == id) {
                    out.push(match first {
                        OutcomeKind::Failed => OutcomeKind::Parked,
                        _ => OutcomeKind::Skipped,
                    });
                    continue;
                }
            }
            let kind = if id != 0 && before.contains(&id) {
                OutcomeKind::Skipped
            } else {
                self.deliver(id, fail)
            };
            if id != 0 {
                leader.push((id, kind));
            }
            out.push(kind);
        }
        out
    }
}

fn check(ops: &[Op], claiming: bool) -> Result<(), TestCaseError> {
    let mut guard = Guard::new(InMemoryStore::new());
    if claiming {
        guard = guard.with_claiming(Duration::from_secs(60));
    }
    let mut model = Model::default();
    let effects = Cell::new(0u32);
    let handler = async |m: &bq_dedupe::Message<'_>| {
        effects.set(effects.get() + 1);
        if m.raw().contains("\"fail\":true") {
            Err("fail")
        } else {
            Ok(())
        }
    };
    for op in ops {
        match op {
            Op::Deliver { id, fail } => {
                let got =
                    block_on_ready(guard.process(body(*id, *fail).as_bytes(), handler)).unwrap();
                prop_assert_eq!(got.kind(), model.deliver(*id, *fail), "{:?}", op);
            }
            Op::Forget(id) => {
                block_on_ready(guard.forget(&format!("id-{id}")))
                    .unwrap()
                    .unwrap();
                model.seen.remove(id);
            }
            Op::Batch(ds) => {
                let bodies: Vec<String> = ds.iter().map(|(id, fail)| body(*id, *fail)).collect();
                let got: Vec<_> = block_on_ready(guard.process_batch(&bodies, handler))
                    .unwrap()
                    .iter()
                    .map(|o| o.kind())
                    .collect();
                prop_assert_eq!(got, model.batch(ds), "{:?}", op);
            }
        }
    }
    prop_assert_eq!(effects.get(), model.effects);
    for id in 1..5u8 {
        let seen = block_on_ready(guard.store().seen(&format!("id-{id}")))
            .unwrap()
            .unwrap();
        prop_assert_eq!(
            seen,
            model.seen.contains(&id),
            "store vs model for id-{}",
            id
        );
    }
    prop_assert!(
        guard.store().claimed().is_empty(),
        "no claim outlives its delivery"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn guard_matches_the_model(ops in prop::collection::vec(op(), 0..40)) {
        check(&ops, false)?;
    }

    #[test]
    fn claiming_guard_matches_the_model(ops in prop::collection::vec(op(), 0..40)) {
        check(&ops, true)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// The compact store behaves as a set, for UUID-shaped and other ids alike.
    #[test]
    fn in_memory_store_is_a_set(ops in prop::collection::vec((0u8..3, 0usize..40), 0..400)) {
        let store = InMemoryStore::new();
        let mut model = HashSet::new();
        let key = |k: usize| match k % 3 {
            0 => format!("{k:08x}-0000-4000-8000-000000000000"),
            1 => format!("{k:08X}-0000-4000-8000-000000000000"),
            _ => format!("id-{k}-☕"),
        };
        for (op, k) in ops {
            let k = key(k);
            match op {
                0 => { block_on_ready(store.remember(&k, None)).unwrap().unwrap(); model.insert(k); }
                1 => { block_on_ready(store.forget(&k)).unwrap().unwrap(); model.remove(&k); }
                _ => prop_assert_eq!(block_on_ready(store.seen(&k)).unwrap().unwrap(), model.contains(&k)),
            }
        }
        let mut listed: Vec<_> = store.entries().into_iter().map(|e| e.key).collect();
        let mut expected: Vec<_> = model.into_iter().collect();
        listed.sort();
        expected.sort();
        prop_assert_eq!(listed, expected);
    }
}
