//! The store testkit (`bq_dedupe_testkit`) over the JS store adapter
//! ([`JsObjectStore`]), in a test build of the module (cargo feature `testkit`,
//! `scripts/build-js.sh test` -> `pkg/conformance-node/`). Not in the published
//! module.
//!
//! - `TestkitBackend`: the core's in-memory store on a manual clock, answering
//!   every method a JS store may have through `call(method, args)`
//!   ([`crate::protocol`]). A test builds plain objects from a subset of them,
//!   as a user's store would look.
//! - `runStoreTestkit(make, cases, seed)`: `make()` returns `{ store, backend }`
//!   (a fresh plain-object store and the backend whose clock it reads); every
//!   client is the adapter over `store`, every answer is checked against the
//!   record model. Throws an `Error` naming the smallest failing run and its
//!   seed.
//! - `runStoreHistory(make, clients, seed)`: the testkit's history checker over
//!   the adapter: `clients` clients, each its own adapter over one `store`
//!   from `make()`, run at once on the event loop (a promise-returning store
//!   interleaves them); every key's history must be linearizable against the
//!   record model. The store's errors whose message says "injected by the
//!   test store" are recorded as unknown (a fault the test injects); any other
//!   error fails the run. Resolves, or rejects with an `Error` naming the seed.
//! - `runGuardFleet(store, prefix, mode, leaseMs, renewing)`: the testkit's guard
//!   in the loop (`bq_dedupe_testkit::guard_fleet`) over the package's own guard (as
//!   `dedupe` builds it: the adapter over `store`, the JS clock, and with
//!   `renewing` its timer, which renews claims while a handler runs): four
//!   consumers, `mode` "claiming" (leases of `leaseMs`) or "seen-set", on one
//!   inbox of ids `{prefix}-N` joined on the event loop; handlers fail, outlive
//!   their lease, die before the commit. Rejects with what broke.

use std::sync::Arc;

use bq_dedupe::store::record::Rules;
use bq_dedupe::{Guard, lease::NoTimer, lease::Timer};
use bq_dedupe::{InMemoryStore, block_on_ready, clock::Clock, clock::ManualClock};
use bq_dedupe_testkit::guard_fleet::{Inbox, plain_delivery};
use bq_dedupe_testkit::{self as testkit, Harness, Plan, Setting};
use js_sys::{Array, Function};
use wasm_bindgen::prelude::*;

use crate::prop;
use crate::store::GivenStore;

/// The backend a test's JS store forwards to.
#[wasm_bindgen]
pub struct TestkitBackend {
    store: InMemoryStore,
    clock: Arc<ManualClock>,
}

#[wasm_bindgen]
impl TestkitBackend {
    /// A fresh store on a manual clock.
    #[wasm_bindgen(constructor)]
    pub fn new() -> TestkitBackend {
        let clock = Arc::new(ManualClock::new(1_000_000));
        TestkitBackend {
            store: InMemoryStore::with_clock(clock.clone()),
            clock,
        }
    }
    pub fn now(&self) -> f64 {
        self.clock.now_ms() as f64
    }
    pub fn advance(&self, ms: f64) {
        self.clock.advance(ms as u64);
    }
    /// One method of the JS store protocol, answered at once (the store is
    /// synchronous), e.g. `call("claimMany", [keys, leaseMs])`.
    pub fn call(&self, method: &str, args: Vec<JsValue>) -> Result<JsValue, JsValue> {
        block_on_ready(crate::protocol::call(&self.store, method, &args))
            .map_err(|e| JsValue::from_str(&e.to_string()))?
    }
}

impl Default for TestkitBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// One run's JS store (every client shares it, as a backend is shared) and the
/// backend whose clock it reads.
struct JsHarness {
    store: JsValue,
    backend: JsValue,
}

impl Harness for JsHarness {
    type Client = GivenStore;
    fn rules(&self) -> Rules {
        InMemoryStore::RULES
    }
    fn open(&mut self) -> GivenStore {
        js_store(&self.store).unwrap_or_else(|e| panic!("{e}"))
    }
    fn now_ms(&self) -> u64 {
        call(&self.backend, "now", &[]).as_f64().unwrap_or(0.0) as u64
    }
    fn advance(&mut self, ms: u64) {
        call(&self.backend, "advance", &[JsValue::from_f64(ms as f64)]);
    }
}

/// The adapter over a test's plain-object store.
fn js_store(store: &JsValue) -> Result<GivenStore, String> {
    match GivenStore::from_js(store) {
        Ok((store @ GivenStore::Js(_), _)) => Ok(store),
        Ok(_) => Err("the testkit's store must be a plain JS object".to_string()),
        Err(e) => Err(format!("not a store: {e}")),
    }
}

fn call(target: &JsValue, name: &'static str, args: &[JsValue]) -> JsValue {
    let f: Function = prop(target, name).into();
    let args: Array = args.iter().collect();
    f.apply(target, &args).unwrap_or(JsValue::UNDEFINED)
}

/// `runStoreTestkit(make, cases, seed)`: see the module docs.
#[wasm_bindgen(js_name = runStoreTestkit)]
pub fn run_store_testkit(make: &Function, cases: u32, seed: f64) -> Result<(), JsValue> {
    let harness = || {
        let made = make.call0(&JsValue::NULL).unwrap_or(JsValue::UNDEFINED);
        JsHarness {
            store: prop(&made, "store"),
            backend: prop(&made, "backend"),
        }
    };
    testkit::check_seeded(cases, seed as u64, harness).map_err(|e| js_sys::Error::new(&e).into())
}

/// A history run's clients share one JS store (each opens its own adapter over
/// it) and the backend's manual clock.
#[derive(Clone)]
struct JsSetting {
    store: JsValue,
    backend: JsValue,
}

impl Setting<GivenStore> for JsSetting {
    fn open(&self) -> GivenStore {
        // Checked once before the run (`run_store_history`).
        js_store(&self.store).unwrap_or_else(|e| panic!("{e}"))
    }
    fn now_ms(&self) -> u64 {
        call(&self.backend, "now", &[]).as_f64().unwrap_or(0.0) as u64
    }
    fn advance(&self, ms: u64) {
        call(&self.backend, "advance", &[JsValue::from_f64(ms as f64)]);
    }
}

/// What a test store's thrown errors say, so that the checker tells them from
/// the adapter's own errors.
const INJECTED: &str = "injected by the test store";

/// `runStoreHistory(make, clients, seed)`: see the module docs.
#[wasm_bindgen(js_name = runStoreHistory)]
pub async fn run_store_history(make: Function, clients: u32, seed: f64) -> Result<(), JsValue> {
    let made = make.call0(&JsValue::NULL)?;
    let setting = JsSetting {
        store: prop(&made, "store"),
        backend: prop(&made, "backend"),
    };
    js_store(&setting.store).map_err(|e| js_sys::Error::new(&e))?;
    let plan = Plan {
        rules: InMemoryStore::RULES,
        // The backend's manual clock moves in whole ticks.
        tick_ms: 1_000,
        slack_ms: 0,
        clients: 4,
        steps: 16,
        backend_errors: true,
        // Only the test store's own throws; an error of the adapter fails.
        backend_error_mark: Some(&[INJECTED]),
    }
    .with_clients(clients as usize);
    let seed = seed as u64;
    let runs = plan.clients(&setting, seed).into_iter().map(|c| c.run());
    let calls: Result<Vec<_>, String> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .collect();
    calls
        .and_then(|calls| plan.judge(calls, None))
        .map_err(|e| {
            let clients = plan.clients;
            js_sys::Error::new(&format!(
                "history checker (BQ_TESTKIT_SEED={seed}, {clients} clients): {e}"
            ))
            .into()
        })
}

/// `runGuardFleet(store, prefix, mode, leaseMs, renewing)`: see the module docs.
#[wasm_bindgen(js_name = runGuardFleet)]
pub async fn run_guard_fleet(
    store: JsValue,
    prefix: String,
    mode: String,
    lease_ms: f64,
    renewing: bool,
) -> Result<(), JsValue> {
    let lease = std::time::Duration::from_millis(lease_ms as u64);
    let opts = js_sys::Object::new();
    if mode == "claiming" {
        js_sys::Reflect::set(&opts, &"claimLeaseMs".into(), &lease_ms.into())?;
    }
    let opts = Some(JsValue::from(opts));
    let guards = (0..4)
        .map(|_| crate::guard(&store, &opts))
        .collect::<Result<Vec<_>, _>>()?;
    // A panic aborts the module on wasm32: those handlers fail instead.
    let inbox = Inbox::new(&prefix, lease)
        .without_panics()
        .with_clock(|| js_sys::Date::now() as u64);
    let ran = if renewing {
        consume_all(&inbox, &guards, lease).await
    } else {
        // No timer: a slow handler's claim lapses and is taken over.
        let guards: Vec<_> = guards.into_iter().map(|g| g.with_timer(NoTimer)).collect();
        consume_all(&inbox, &guards, lease).await
    };
    ran.and_then(|()| inbox.check(&mode, None))
        .map_err(|e| js_sys::Error::new(&format!("the guard in the loop: {e}")).into())
}

/// Every guard a consumer of `inbox`, joined on the event loop.
async fn consume_all<T: Timer>(
    inbox: &Inbox,
    guards: &[Guard<GivenStore, crate::LastKey, T>],
    lease: std::time::Duration,
) -> Result<(), String> {
    let sleep = async |d| crate::JsTimer.sleep(d).await;
    let consumers = guards.iter().map(|guard| {
        inbox.consume(
            async |id, act| plain_delivery(guard, id, act, lease, sleep).await,
            sleep,
        )
    });
    futures_util::future::join_all(consumers)
        .await
        .into_iter()
        .collect()
}
