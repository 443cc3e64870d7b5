//! No traps at the boundary: the typed `dedupe-key-checked`, the host's recovery
//! from a guest trap (a fresh instance over the same store, the next call served),
//! and `process-batch-ids` handing back the ids it decoded.

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{Runtime, default_component, options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::{
    KeyError, Options, Outcome, StoreErrorKind,
};
use bq_dedupe_stores::AnyStore;
use serde_json::json;

fn runtime() -> Runtime {
    let store = AnyStore::from_spec("memory").expect("memory store");
    Runtime::load(&default_component(), store, Handler::Mark).expect("component loads")
}

fn envelope(id: &str) -> String {
    json!({
        "job": "urn:babel:orders:created", "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"order_id": 1042},
        "meta": {"id": id, "schema_version": 1}
    })
    .to_string()
}

fn bad_scope() -> Options {
    let mut opts = options("p:");
    opts.key_scope = Some("has:colon".into());
    opts
}

#[test]
fn dedupe_key_checked_returns_invalid_options_instead_of_trapping() {
    let mut rt = runtime();
    match rt.dedupe_key_checked(&envelope("a"), &bad_scope()) {
        Ok(Err(KeyError::InvalidOptions(e))) => {
            assert_eq!(e.kind, StoreErrorKind::Invalid);
            assert!(e.message.contains("has:colon"), "{}", e.message);
        }
        other => panic!("expected invalid-options, got {other:?}"),
    }
    let mut scoped = options("p:");
    scoped.key_scope = Some("billing".into());
    assert_eq!(
        rt.dedupe_key_checked(&envelope("a"), &scoped).unwrap(),
        Ok(Some("p:billing:a".into()))
    );
    assert!(matches!(
        rt.dedupe_key_checked("not json", &scoped).unwrap(),
        Err(KeyError::Rejected(_))
    ));
    assert_eq!(
        rt.dedupe_key_checked(&envelope(""), &scoped).unwrap(),
        Ok(None)
    );
}

#[test]
fn a_guest_trap_is_an_error_and_the_next_call_gets_a_fresh_instance() {
    let mut rt = runtime();
    let opts = options("");
    assert_eq!(rt.process(&envelope("x"), &opts).unwrap(), Outcome::RunOk);
    // The 1.0 `dedupe-key` still traps on an invalid scope (its result has no
    // channel for it): the host reports an error, not a crash...
    let trapped = rt.dedupe_key(&envelope("x"), &bad_scope());
    let error = format!("{:#}", trapped.expect_err("the guest traps"));
    assert!(error.contains("trapped"), "{error}");
    // ...and the replacement instance serves the next calls over the same store:
    // what was remembered before the trap is still seen.
    let after = rt
        .process(&envelope("x"), &opts)
        .map_err(|e| format!("{e:#}"));
    assert_eq!(after, Ok(Outcome::Skip));
    assert_eq!(rt.process(&envelope("y"), &opts).unwrap(), Outcome::RunOk);
    for _ in 0..3 {
        assert!(rt.dedupe_key(&envelope("x"), &bad_scope()).is_err());
        assert_eq!(
            rt.dedupe_key(&envelope("x"), &opts).unwrap(),
            Ok(Some("x".into()))
        );
    }
}

#[test]
fn process_batch_ids_hands_back_each_decoded_id_with_its_outcome() {
    let mut rt = runtime();
    let opts = options("bq:idem:");
    let bodies = vec![
        envelope("a"),
        envelope("b\"\u{e9}"),
        envelope("a"),
        "not json".to_string(),
        envelope(""),
        envelope("a"),
    ];
    let got: Vec<(Option<String>, Outcome)> = rt
        .process_batch_ids(&bodies, &opts)
        .unwrap()
        .into_iter()
        .map(|p| (p.id, p.outcome))
        .collect();
    assert_eq!(got[0], (Some("a".into()), Outcome::RunOk));
    assert_eq!(got[1], (Some("b\"\u{e9}".into()), Outcome::RunOk));
    assert_eq!(got[2], (Some("a".into()), Outcome::Skip));
    assert!(
        matches!(got[3], (None, Outcome::Rejected(_))),
        "{:?}",
        got[3]
    );
    assert_eq!(got[4], (None, Outcome::FailOpen));
    assert_eq!(got[5], (Some("a".into()), Outcome::Skip));
    // The same outcomes as `process-batch` gives on a fresh store.
    let mut fresh = runtime();
    let plain = fresh.process_batch(&bodies, &opts).unwrap();
    assert_eq!(plain, got.into_iter().map(|(_, o)| o).collect::<Vec<_>>());
    // Refused options: every delivery store-unavailable, none lost.
    let refused = rt.process_batch_ids(&bodies, &bad_scope()).unwrap();
    assert_eq!(refused.len(), bodies.len());
    assert!(refused.iter().all(
        |p| matches!(&p.outcome, Outcome::StoreUnavailable(e) if e.kind == StoreErrorKind::Invalid)
    ));
}

/// No claim outlives the call that took it. The host renews the claims it
/// lists while a handler runs; one the guest gave up without a settle (found
/// lost by its own clock while the store failed) or one a trap left behind
/// stayed listed, and was renewed during every later handler, its message
/// parked for as long as the run lived (an adversarial review's suspicion).
#[test]
fn no_claim_is_held_across_calls() {
    let mut rt = runtime();
    let opts = options("");
    let token = bq_dedupe::store::ClaimToken("abandoned".into());
    rt.state()
        .claims
        .granted("abandoned-key", &token, std::time::Duration::from_secs(60));
    assert_eq!(rt.process(&envelope("z"), &opts).unwrap(), Outcome::RunOk);
    assert!(rt.state().claims.is_empty(), "{:?}", rt.state().claims);
    // After a trap too.
    rt.state()
        .claims
        .granted("abandoned-key", &token, std::time::Duration::from_secs(60));
    assert!(rt.dedupe_key(&envelope("x"), &bad_scope()).is_err());
    assert!(rt.state().claims.is_empty(), "{:?}", rt.state().claims);
}
