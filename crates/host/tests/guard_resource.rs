//! The `consumer.guard` resource (1.1.0): constructed once with its options, the
//! store's capabilities read once, batches through the store's batch functions,
//! the same outcomes as the free functions, payload fingerprints, and a guard
//! that survives a guest trap (constructed again in the fresh instance).
//!
//! A recording host (its own bindings, like `examples/embed.rs`) shows which
//! imports each call makes; the `Runtime` of `bq-dedupe` shows the rest.

use std::collections::HashSet;

use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::{Runtime, default_component, guard_options, options};
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::{
    Outcome as RtOutcome, StoreErrorKind as RtKind,
};
use bq_dedupe_stores::AnyStore;
use serde_json::{Value, json};
use wasmtime::component::{Component, HasSelf, Linker, ResourceAny};
use wasmtime::{Engine, Store};

mod recording {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "dedupe",
        additional_derives: [PartialEq],
    });
}
use recording::Dedupe;
use recording::babelqueue::idempotency::{handler, leases, store, types};

/// A `HashSet` store that logs every import the guest calls.
struct Recorder {
    seen: HashSet<String>,
    batch: bool,
    calls: Vec<String>,
}

type R<T> = Result<T, types::StoreError>;

fn unsupported<T>() -> R<T> {
    Err(types::StoreError {
        kind: types::StoreErrorKind::Unsupported,
        message: "not offered by this host".into(),
    })
}

impl types::Host for Recorder {}

impl store::Host for Recorder {
    fn capabilities(&mut self) -> types::Capabilities {
        self.calls.push("capabilities".into());
        types::Capabilities {
            batch: self.batch,
            claim: false,
            ttl: false,
        }
    }
    fn seen(&mut self, key: String) -> R<bool> {
        self.calls.push("seen".into());
        Ok(self.seen.contains(&key))
    }
    fn remember(&mut self, key: String, _: Option<u64>) -> R<()> {
        self.calls.push("remember".into());
        self.seen.insert(key);
        Ok(())
    }
    fn forget(&mut self, key: String) -> R<()> {
        self.calls.push("forget".into());
        self.seen.remove(&key);
        Ok(())
    }
    fn seen_many(&mut self, keys: Vec<String>) -> R<Vec<bool>> {
        self.calls.push(format!("seen-many {}", keys.len()));
        Ok(keys.iter().map(|k| self.seen.contains(k)).collect())
    }
    fn remember_many(&mut self, keys: Vec<String>, _: Option<u64>) -> R<()> {
        self.calls.push(format!("remember-many {}", keys.len()));
        self.seen.extend(keys);
        Ok(())
    }
    fn claim(&mut self, _: String, _: u64) -> R<types::Claim> {
        unsupported()
    }
    fn claim_many(&mut self, _: Vec<String>, _: u64) -> R<Vec<types::Claim>> {
        unsupported()
    }
    fn release(&mut self, _: String, _: String) -> R<()> {
        unsupported()
    }
    fn commit_many(&mut self, _: Vec<String>, _: Option<u64>, _: Vec<(String, String)>) -> R<()> {
        unsupported()
    }
}

impl leases::Host for Recorder {
    fn supported(&mut self) -> bool {
        self.calls.push("leases.supported".into());
        false
    }
    fn now_ms(&mut self) -> u64 {
        0
    }
    fn settle(
        &mut self,
        _: Vec<(String, Option<String>)>,
        _: Option<u64>,
        _: Vec<(String, String)>,
        _: Vec<(String, String)>,
        _: u64,
    ) -> R<leases::Settled> {
        unsupported()
    }
}

impl handler::Host for Recorder {
    fn handle(&mut self, _: String) -> Result<(), String> {
        self.calls.push("handle".into());
        Ok(())
    }
}

struct Host {
    store: Store<Recorder>,
    dedupe: Dedupe,
}

impl Host {
    fn new(batch: bool) -> Self {
        let engine = Engine::default();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/component/bq_dedupe.component.wasm"
        );
        let component = Component::from_file(&engine, path)
            .expect("the component (scripts/build-component.sh) loads");
        let mut linker = Linker::new(&engine);
        Dedupe::add_to_linker::<Recorder, HasSelf<Recorder>>(&mut linker, |r| r).unwrap();
        let mut store = Store::new(
            &engine,
            Recorder {
                seen: HashSet::new(),
                batch,
                calls: Vec::new(),
            },
        );
        let dedupe = Dedupe::instantiate(&mut store, &component, &linker).unwrap();
        Host { store, dedupe }
    }

    /// The imports called since the last look.
    fn calls(&mut self) -> Vec<String> {
        std::mem::take(&mut self.store.data_mut().calls)
    }

    fn construct(
        &mut self,
        options: &types::GuardOptions,
    ) -> Result<ResourceAny, types::StoreError> {
        self.dedupe
            .babelqueue_idempotency_consumer()
            .guard()
            .call_constructor(&mut self.store, options)
            .unwrap()
    }

    fn batch(&mut self, guard: ResourceAny, bodies: &[String]) -> Vec<types::Outcome> {
        self.dedupe
            .babelqueue_idempotency_consumer()
            .guard()
            .call_process_batch(&mut self.store, guard, bodies)
            .unwrap()
    }

    fn one(&mut self, guard: ResourceAny, body: &str) -> types::Outcome {
        self.dedupe
            .babelqueue_idempotency_consumer()
            .guard()
            .call_process(&mut self.store, guard, body)
            .unwrap()
    }
}

fn plain(prefix: &str) -> types::GuardOptions {
    types::GuardOptions {
        ttl_ms: None,
        claim_lease_ms: None,
        key_prefix: prefix.into(),
        key_scope: None,
        max_bytes: None,
        fingerprint: false,
    }
}

fn envelope(id: &str, data: Value) -> String {
    json!({
        "job": "urn:babel:orders:created", "trace_id": "t-1", "data": data,
        "meta": {"id": id, "schema_version": 1}
    })
    .to_string()
}

fn env(id: &str) -> String {
    envelope(id, json!({"order_id": 1042}))
}

#[test]
fn the_guard_reads_capabilities_once_and_batches_with_the_batch_functions() {
    let mut host = Host::new(true);
    let guard = host.construct(&plain("bq:")).expect("plain options");
    assert_eq!(host.calls(), ["capabilities", "leases.supported"]);

    let bodies = vec![env("a"), env("b"), env("a"), "not json".into(), env("c")];
    use types::Outcome::*;
    let outcomes = host.batch(guard, &bodies);
    assert!(matches!(outcomes[3], Rejected(_)), "{outcomes:?}");
    assert_eq!(
        [&outcomes[..3], &outcomes[4..]].concat(),
        [RunOk, RunOk, Skip, RunOk]
    );
    // One store call to decide, one to record; no capabilities asked again.
    assert_eq!(
        host.calls(),
        [
            "seen-many 3",
            "handle",
            "handle",
            "handle",
            "remember-many 3"
        ]
    );
    assert_eq!(host.one(guard, &env("b")), Skip);
    assert_eq!(host.one(guard, &env("d")), RunOk);
    assert_eq!(host.calls(), ["seen", "seen", "handle", "remember"]);
    assert_eq!(host.batch(guard, &[env("a"), env("e")]), [Skip, RunOk]);
    assert_eq!(host.calls(), ["seen-many 2", "handle", "remember"]);

    // The 1.0 free function asks for the capabilities on every call.
    let free = host
        .dedupe
        .babelqueue_idempotency_consumer()
        .call_process_batch(
            &mut host.store,
            &[env("f"), env("g")],
            &types::Options {
                ttl_ms: None,
                claim_lease_ms: None,
                key_prefix: "bq:".into(),
                key_scope: None,
                max_bytes: None,
            },
        )
        .unwrap();
    assert_eq!(free, [RunOk, RunOk]);
    assert_eq!(host.calls()[0], "capabilities");
    guard.resource_drop(&mut host.store).unwrap();
}

/// A host that offers only `seen` / `remember` / `forget` (batch false) gets
/// only those from a guard, batches included.
#[test]
fn a_host_without_batches_gets_single_key_calls_only() {
    let mut host = Host::new(false);
    let guard = host.construct(&plain("")).unwrap();
    host.calls();
    let bodies = vec![env("a"), env("b"), env("a")];
    use types::Outcome::*;
    assert_eq!(host.batch(guard, &bodies), [RunOk, RunOk, Skip]);
    assert_eq!(
        host.calls(),
        ["seen", "seen", "handle", "handle", "remember", "remember"]
    );
    let forgot = host
        .dedupe
        .babelqueue_idempotency_consumer()
        .guard()
        .call_forget(&mut host.store, guard, "a")
        .unwrap();
    assert_eq!(forgot, Ok(()));
    assert_eq!(host.calls(), ["forget"]);
    assert_eq!(host.one(guard, &env("a")), RunOk);
}

#[test]
fn invalid_options_fail_the_constructor_with_a_typed_error_and_no_store_call() {
    let mut host = Host::new(true);
    let mut bad = plain("p:");
    bad.key_scope = Some("has:colon".into());
    let refused = host.construct(&bad).expect_err("an invalid key-scope");
    assert_eq!(refused.kind, types::StoreErrorKind::Invalid);
    assert!(refused.message.contains("has:colon"), "{}", refused.message);
    assert!(host.calls().is_empty(), "nothing reached the store");
    // Not a trap: the instance goes on serving.
    let guard = host.construct(&plain("p:")).unwrap();
    assert_eq!(host.one(guard, &env("a")), types::Outcome::RunOk);
}

#[test]
fn fingerprints_catch_an_id_reused_with_other_data() {
    let mut host = Host::new(true);
    let mut opts = plain("");
    opts.fingerprint = true;
    let guard = host
        .construct(&opts)
        .expect("this component keeps fingerprints");
    use types::Outcome::*;
    let first = envelope("p", json!({"order_id": 1, "sku": "a"}));
    let again = envelope("p", json!({"sku": "a", "order_id": 1}));
    let other = envelope("p", json!({"order_id": 1, "sku": "b"}));
    assert_eq!(host.one(guard, &first), RunOk);
    assert_eq!(
        host.one(guard, &again),
        Skip,
        "a redelivery, keys reordered"
    );
    assert_eq!(host.one(guard, &other), PayloadMismatch);
    // In one batch: the redelivery leads (a skip), the other payload follows.
    assert_eq!(
        host.batch(guard, &[again, other.clone()]),
        [Skip, PayloadMismatch]
    );
    // The companion records are plain keys beside the id.
    let keys = &host.store.data().seen;
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(keys.contains("\u{1f}fp:=p"), "{keys:?}");
    // A guard without fingerprints takes the reused id for a redelivery.
    let plain_guard = host.construct(&plain("")).unwrap();
    assert_eq!(host.one(plain_guard, &other), Skip);
}

fn runtime() -> Runtime {
    let store = AnyStore::from_spec("memory").expect("memory store");
    Runtime::load(&default_component(), store, Handler::Mark).expect("component loads")
}

/// Deliveries of every kind: fresh ids, redeliveries, in-batch duplicates,
/// garbage, no id.
fn mixed() -> Vec<String> {
    (0..300)
        .map(|i| match i % 10 {
            7 => "not json".to_string(),
            8 => envelope("", json!({})),
            _ => env(&format!("id-{}", (i * 7) % 113)),
        })
        .collect()
}

#[test]
fn the_guard_gives_the_outcomes_and_ids_of_the_free_functions() {
    let bodies = mixed();
    let (mut free, mut guarded) = (runtime(), runtime());
    guarded
        .open_guard(&guard_options("bq:"))
        .unwrap()
        .expect("plain options");
    for chunk in bodies.chunks(37) {
        let a = free.process_batch_ids(chunk, &options("bq:")).unwrap();
        let b = guarded.guard_process_batch_ids(chunk).unwrap();
        assert_eq!(a, b);
    }
    let (mut free, mut guarded) = (runtime(), runtime());
    guarded.open_guard(&guard_options("")).unwrap().unwrap();
    for body in &bodies {
        assert_eq!(
            free.process(body, &options("")).unwrap(),
            guarded.guard_process(body).unwrap()
        );
    }
    assert_eq!(
        free.process_batch(&bodies[..50], &options("")).unwrap(),
        guarded.guard_process_batch(&bodies[..50]).unwrap()
    );
}

#[test]
fn the_open_guard_survives_a_guest_trap() {
    let mut rt = runtime();
    let err = rt.guard_process(&env("x")).expect_err("no guard open yet");
    assert!(format!("{err:#}").contains("open_guard"), "{err:#}");
    let mut opts = guard_options("p:");
    opts.key_scope = Some("billing".into());
    rt.open_guard(&opts).unwrap().unwrap();
    assert_eq!(rt.guard_process(&env("x")).unwrap(), RtOutcome::RunOk);
    // The 1.0 `dedupe-key` traps on an invalid scope: the instance is replaced...
    let mut bad = options("p:");
    bad.key_scope = Some("has:colon".into());
    assert!(rt.dedupe_key(&env("x"), &bad).is_err());
    // ...and the guard with it, with the same options over the same store.
    assert_eq!(rt.guard_process(&env("x")).unwrap(), RtOutcome::Skip);
    assert_eq!(rt.guard_process(&env("y")).unwrap(), RtOutcome::RunOk);
    assert_eq!(
        rt.dedupe_key_checked(&env("y"), &{
            let mut o = options("p:");
            o.key_scope = Some("billing".into());
            o
        })
        .unwrap(),
        Ok(Some("p:billing:y".into()))
    );
    // Refused options replace nothing silently: a typed error.
    let mut refused = guard_options("");
    refused.key_scope = Some(String::new());
    match rt.open_guard(&refused).unwrap() {
        Err(e) => assert_eq!(e.kind, RtKind::Invalid),
        Ok(()) => panic!("an empty key-scope is invalid"),
    }
    assert!(
        rt.guard_process(&env("z")).is_err(),
        "no guard open after a refusal"
    );
}

/// `process-batch-reports`: the outcomes and ids of `process-batch-ids`, with
/// what each delivery's span reports beside its outcome, as the core decided it:
/// an in-batch duplicate is one whatever its leader's outcome (a parked follower
/// of a failed leader included, which no host can tell from `park`), and a
/// claim is reported where one was taken.
#[test]
fn reports_say_which_deliveries_were_duplicates_and_which_held_a_claim() {
    let claiming = |succeed| {
        let store = AnyStore::from_spec("memory").expect("memory store");
        let handler = Handler::Scripted { succeed, calls: 0 };
        let mut rt = Runtime::load(&default_component(), store, handler).expect("component loads");
        let options = types_options(Some(30_000));
        rt.open_guard(&options).unwrap().expect("claiming options");
        rt
    };
    let mut rt = claiming(true);
    let bodies = [
        env("a"),
        env("b"),
        env("a"),
        "not json".into(),
        envelope("", json!({})),
    ];
    let reports = rt.guard_process_batch_reports(&bodies).unwrap();
    let seen: Vec<(RtOutcome, bool, bool)> = reports
        .iter()
        .map(|r| (r.outcome.clone(), r.duplicate, r.claimed))
        .collect();
    assert!(matches!(seen[3].0, RtOutcome::Rejected(_)), "{seen:?}");
    assert_eq!(
        [&seen[..3], &seen[4..]].concat(),
        [
            (RtOutcome::RunOk, false, true),
            (RtOutcome::RunOk, false, true),
            (RtOutcome::Skip, true, false),
            (RtOutcome::FailOpen, false, false),
        ]
    );
    assert_eq!((seen[3].1, seen[3].2), (false, false));
    let ids: Vec<Option<&str>> = reports.iter().map(|r| r.id.as_deref()).collect();
    assert_eq!(ids, [Some("a"), Some("b"), Some("a"), None, None]);
    let again = rt.guard_process_batch_reports(&[env("a")]).unwrap();
    assert_eq!(
        (
            again[0].outcome.clone(),
            again[0].duplicate,
            again[0].claimed
        ),
        (RtOutcome::Skip, true, false)
    );

    // A leader that fails: its follower parks, and is still a duplicate.
    let mut failing = claiming(false);
    let reports = failing
        .guard_process_batch_reports(&[env("x"), env("x")])
        .unwrap();
    assert!(
        matches!(reports[0].outcome, RtOutcome::RunFailed(_)),
        "{reports:?}"
    );
    assert_eq!((reports[0].duplicate, reports[0].claimed), (false, true));
    assert_eq!(
        (
            reports[1].outcome.clone(),
            reports[1].duplicate,
            reports[1].claimed
        ),
        (RtOutcome::Park, true, false)
    );

    // The same outcomes and ids as process-batch-ids, over every kind of delivery.
    let (mut ids, mut reported) = (runtime(), runtime());
    ids.open_guard(&guard_options("bq:")).unwrap().unwrap();
    reported.open_guard(&guard_options("bq:")).unwrap().unwrap();
    for chunk in mixed().chunks(37) {
        let a = ids.guard_process_batch_ids(chunk).unwrap();
        let b = reported.guard_process_batch_reports(chunk).unwrap();
        let b: Vec<_> = b.into_iter().map(|r| (r.id, r.outcome)).collect();
        let a: Vec<_> = a.into_iter().map(|p| (p.id, p.outcome)).collect();
        assert_eq!(a, b);
    }
}

fn types_options(
    claim_lease_ms: Option<u64>,
) -> bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::GuardOptions {
    bq_dedupe_host::wit::dedupe::babelqueue::idempotency::types::GuardOptions {
        claim_lease_ms,
        ..guard_options("")
    }
}

/// A component without the exports this host calls (an older build, another
/// world) fails to load with why and what to do, before anything is decided.
#[test]
fn a_component_without_this_hosts_exports_fails_to_load_saying_why() {
    let dir = std::env::temp_dir().join(format!("bq-old-component-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("empty.wasm");
    std::fs::write(&path, wat::parse_str("(component)").unwrap()).unwrap();
    let store = AnyStore::from_spec("memory").expect("memory store");
    let source = bq_dedupe_host::runtime::ComponentSource::File(path);
    let err = Runtime::load(&source, store, Handler::Mark).expect_err("no exports");
    let text = format!("{err:#}");
    assert!(text.contains("at least as new as itself"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}
