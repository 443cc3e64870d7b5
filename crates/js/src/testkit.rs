//! The core's store testkit over the JS store adapter ([`JsObjectStore`]), in a
//! test build of the module (cargo feature `testkit`, `scripts/build-js.sh
//! test` -> `pkg/conformance-node/`). Not in the published module.
//!
//! - `TestkitBackend`: the core's in-memory store on a manual clock, offered
//!   with every method a JS store may have, in the JS store protocol's shapes
//!   (`{state, token}` claims, `settle(step)` -> `{kept, renewed}`). A test
//!   builds plain objects from a subset of them, as a user's store would look.
//! - `runStoreTestkit(make, cases, seed)`: `make()` returns `{ store, backend }`
//!   (a fresh plain-object store and the backend whose clock it reads); every
//!   client is the adapter over `store`, every answer is checked against the
//!   record model. Throws an `Error` naming the smallest failing run and its
//!   seed.

use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::store::record::Rules;
use bq_dedupe::store::{Settlement, Store};
use bq_dedupe::testkit::{self, Harness};
use bq_dedupe::{Claim, ClaimToken, Clock, InMemoryStore, ManualClock, block_on_ready};
use js_sys::{Array, Function, Object};
use wasm_bindgen::prelude::*;

use crate::store::{GivenStore, claim_to_js};
use crate::{prop, set};

/// The backend a test's JS store forwards to.
#[wasm_bindgen]
pub struct TestkitBackend {
    store: InMemoryStore,
    clock: Arc<ManualClock>,
}

fn failed(e: bq_dedupe::StoreError) -> JsValue {
    let error = js_sys::Error::new(&e.message);
    set(&error, "kind", &JsValue::from_str(e.kind.code()));
    error.into()
}

fn run<T>(f: impl Future<Output = bq_dedupe::StoreResult<T>>) -> Result<T, JsValue> {
    block_on_ready(f)
        .map_err(|e| JsValue::from_str(&e.to_string()))?
        .map_err(failed)
}

fn ttl(ms: Option<f64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(ms as u64))
}

fn strings(keys: &Array) -> Vec<String> {
    keys.iter().filter_map(|k| k.as_string()).collect()
}

fn refs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

/// `[{key, token?}]` as (key, token) pairs.
fn claim_refs(list: &JsValue) -> Vec<(String, Option<ClaimToken>)> {
    Array::from(list)
        .iter()
        .map(|r| {
            let key = prop(&r, "key").as_string().unwrap_or_default();
            (key, prop(&r, "token").as_string().map(ClaimToken))
        })
        .collect()
}

fn owned_pairs(list: &[(String, Option<ClaimToken>)]) -> Vec<(&str, &ClaimToken)> {
    list.iter()
        .filter_map(|(k, t)| t.as_ref().map(|t| (k.as_str(), t)))
        .collect()
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
    pub fn seen(&self, key: &str) -> Result<bool, JsValue> {
        run(self.store.seen(key))
    }
    pub fn remember(&self, key: &str, ttl_ms: Option<f64>) -> Result<(), JsValue> {
        run(self.store.remember(key, ttl(ttl_ms)))
    }
    pub fn forget(&self, key: &str) -> Result<(), JsValue> {
        run(self.store.forget(key))
    }
    #[wasm_bindgen(js_name = seenMany)]
    pub fn seen_many(&self, keys: &Array) -> Result<Array, JsValue> {
        let keys = strings(keys);
        let seen = run(self.store.seen_many(&refs(&keys)))?;
        Ok(seen.into_iter().map(JsValue::from_bool).collect())
    }
    #[wasm_bindgen(js_name = rememberMany)]
    pub fn remember_many(&self, keys: &Array, ttl_ms: Option<f64>) -> Result<(), JsValue> {
        let keys = strings(keys);
        run(self.store.remember_many(&refs(&keys), ttl(ttl_ms)))
    }
    pub fn claim(&self, key: &str, lease_ms: f64) -> Result<JsValue, JsValue> {
        let lease = Duration::from_millis(lease_ms as u64);
        Ok(claim_to_js(&run(self.store.claim(key, lease))?))
    }
    #[wasm_bindgen(js_name = claimMany)]
    pub fn claim_many(&self, keys: &Array, lease_ms: f64) -> Result<Array, JsValue> {
        let keys = strings(keys);
        let lease = Duration::from_millis(lease_ms as u64);
        let claims: Vec<Claim> = run(self.store.claim_many(&refs(&keys), lease))?;
        Ok(claims.iter().map(claim_to_js).collect())
    }
    pub fn release(&self, key: &str, token: &str) -> Result<(), JsValue> {
        run(self.store.release(key, &ClaimToken(token.into())))
    }
    pub fn renew(&self, key: &str, token: &str, lease_ms: f64) -> Result<bool, JsValue> {
        let lease = Duration::from_millis(lease_ms as u64);
        run(self.store.renew(key, &ClaimToken(token.into()), lease))
    }
    #[wasm_bindgen(js_name = rememberFenced)]
    pub fn remember_fenced(
        &self,
        key: &str,
        token: &str,
        ttl_ms: Option<f64>,
    ) -> Result<bool, JsValue> {
        let token = ClaimToken(token.into());
        run(self.store.remember_fenced(key, &token, ttl(ttl_ms)))
    }
    /// `settle({remember, ttlMs, release, renew, leaseMs})` -> `{kept, renewed}`.
    pub fn settle(&self, step: &JsValue) -> Result<JsValue, JsValue> {
        let remember = claim_refs(&prop(step, "remember"));
        let release = claim_refs(&prop(step, "release"));
        let renew = claim_refs(&prop(step, "renew"));
        let remember: Vec<(&str, Option<&ClaimToken>)> = remember
            .iter()
            .map(|(k, t)| (k.as_str(), t.as_ref()))
            .collect();
        let lease = prop(step, "leaseMs").as_f64().unwrap_or(0.0);
        let settlement = Settlement {
            remember: &remember,
            ttl: ttl(prop(step, "ttlMs").as_f64()),
            release: &owned_pairs(&release),
            renew: &owned_pairs(&renew),
            lease: Duration::from_millis(lease as u64),
        };
        let settled = run(self.store.settle(&settlement))?;
        let reply = Object::new();
        let flags = |v: Vec<bool>| -> Array { v.into_iter().map(JsValue::from_bool).collect() };
        set(&reply, "kept", &flags(settled.kept));
        set(&reply, "renewed", &flags(settled.renewed));
        Ok(reply.into())
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
        match GivenStore::from_js(&self.store) {
            Ok((store @ GivenStore::Js(_), _)) => store,
            Ok(_) => panic!("the testkit's store must be a plain JS object"),
            Err(e) => panic!("not a store: {e}"),
        }
    }
    fn now_ms(&self) -> u64 {
        call(&self.backend, "now", &[]).as_f64().unwrap_or(0.0) as u64
    }
    fn advance(&mut self, ms: u64) {
        call(&self.backend, "advance", &[JsValue::from_f64(ms as f64)]);
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
