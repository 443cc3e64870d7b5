//! `DurableObjectStore` and `KvStore`: the Rust adapter's stores as JS store
//! objects, for calling `dedupe` / `dedupeBatch` / `wrap` yourself. Each is
//! configured from `env` and the same `DEDUPE_*` settings as `dedupeQueue`
//! (the binding names, shards, resharding), and answers the JS store protocol
//! (`bq_dedupe_js::protocol`): promise-returning `seen`, `seenMany`,
//! `claimMany`, `settle`, ...

use std::rc::Rc;

use bq_dedupe_js::protocol;
use bq_dedupe_workers::bq_dedupe::KeySpace;
use js_sys::{Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;
use worker::Env;

use crate::keyed::Keyed;
use crate::queue::{configured, type_error};

/// Settings of the queue consumer alone: given to a store in code they would
/// be ignored (`dedupe`'s own options claim: `claimLeaseMs`).
const CONSUMER_ONLY: &[&str] = &[
    "DEDUPE_CLAIMING",
    "DEDUPE_CLAIM_LEASE_SECONDS",
    "DEDUPE_FINGERPRINT",
    "DEDUPE_DEAD_LETTER",
    "DEDUPE_MAX_RETRIES",
    "DEDUPE_RETRY_DELAY_SECONDS",
    "DEDUPE_PARK_DELAY_SECONDS",
];

/// The store `env` and `options` configure, with `store` forced to `kind`,
/// keeping the consumer's keys and window ([`Keyed`]).
fn open(env: &Env, options: &JsValue, kind: &str) -> Result<Rc<Keyed>, JsValue> {
    if options.is_object() {
        for name in CONSUMER_ONLY {
            if Reflect::has(options, &JsValue::from_str(name)).unwrap_or(false) {
                return Err(type_error(&format!(
                    "{name} is dedupeQueue's: a store object does not claim, fingerprint or \
                     settle messages (to claim, pass claimLeaseMs to dedupe or dedupeBatch)"
                )));
            }
        }
    }
    // Claiming off: the consumer's setting, which refused a KV store an env
    // that has it on for its consumer (a review).
    let fixed = [("DEDUPE_STORE", kind), ("DEDUPE_CLAIMING", "off")];
    let configured = configured(env, options, &fixed)?;
    if configured.observer.is_some() {
        return Err(type_error("a store takes no observer (dedupeQueue does)"));
    }
    Ok(Rc::new(Keyed {
        store: configured.store,
        space: KeySpace::new().with_prefix(&configured.config.key_prefix),
        ttl: configured.config.ttl,
    }))
}

fn answer(store: &Rc<Keyed>, method: &'static str, args: Vec<JsValue>) -> Promise {
    let store = Rc::clone(store);
    future_to_promise(async move { protocol::call(&*store, method, &args).await })
}

/// One JS method per store protocol method, each `answer`ing through the Rust store.
macro_rules! protocol_methods {
    ($class:ident: $($js:literal => $rust:ident($($arg:ident: $ty:ty),*)),+ $(,)?) => {
        #[wasm_bindgen]
        impl $class {
            $(
                #[wasm_bindgen(js_name = $js)]
                pub fn $rust(&self, $($arg: $ty),*) -> Promise {
                    answer(&self.store, $js, vec![$(JsValue::from($arg)),*])
                }
            )+
        }
    };
}

/// The Durable Object store (`DEDUPE_DO`, `DEDUPE_SHARDS`, `DEDUPE_PREVIOUS_SHARDS`):
/// claims, leases and fenced commits, one request per shard per call.
#[wasm_bindgen]
pub struct DurableObjectStore {
    store: Rc<Keyed>,
}

#[wasm_bindgen]
impl DurableObjectStore {
    /// `new DurableObjectStore(env, options?)`: `options` overrides `DEDUPE_*`.
    #[wasm_bindgen(constructor)]
    pub fn new(env: Env, options: JsValue) -> Result<DurableObjectStore, JsValue> {
        Ok(DurableObjectStore {
            store: open(&env, &options, "durable-object")?,
        })
    }
}

protocol_methods!(DurableObjectStore:
    "seen" => seen(key: JsValue),
    "remember" => remember(key: JsValue, ttl_ms: Option<f64>),
    "forget" => forget(key: JsValue),
    "seenMany" => seen_many(keys: JsValue),
    "rememberMany" => remember_many(keys: JsValue, ttl_ms: Option<f64>),
    "claim" => claim(key: JsValue, lease_ms: f64),
    "claimMany" => claim_many(keys: JsValue, lease_ms: f64),
    "release" => release(key: JsValue, token: JsValue),
    "renew" => renew(key: JsValue, token: JsValue, lease_ms: f64),
    "rememberFenced" => remember_fenced(key: JsValue, token: JsValue, ttl_ms: Option<f64>),
    "settle" => settle(step: JsValue),
);

/// The best-effort Workers KV store (`DEDUPE_KV`): no claims (KV cannot take
/// one atomically), TTLs of 60 s or more.
#[wasm_bindgen]
pub struct KvStore {
    store: Rc<Keyed>,
}

#[wasm_bindgen]
impl KvStore {
    /// `new KvStore(env, options?)`: `options` overrides `DEDUPE_*`.
    #[wasm_bindgen(constructor)]
    pub fn new(env: Env, options: JsValue) -> Result<KvStore, JsValue> {
        Ok(KvStore {
            store: open(&env, &options, "kv")?,
        })
    }
}

protocol_methods!(KvStore:
    "seen" => seen(key: JsValue),
    "remember" => remember(key: JsValue, ttl_ms: Option<f64>),
    "forget" => forget(key: JsValue),
    "seenMany" => seen_many(keys: JsValue),
    "rememberMany" => remember_many(keys: JsValue, ttl_ms: Option<f64>),
);
