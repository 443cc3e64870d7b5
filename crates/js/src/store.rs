//! The core's [`Store`] trait over what JavaScript passes as the store: either the
//! Rust [`crate::memory::InMemoryStore`] class (used directly, no JS calls) or any
//! JS object with `seen` / `remember` / `forget` and optional batch and claim
//! methods, each returning a value or a promise of it.
//!
//! A thrown error or a rejected promise becomes a [`StoreError`] (kind from the
//! error's `kind`/`code` property when it is one of the core's codes, else
//! `unavailable`); the guard turns that into its typed outcome.

use std::rc::Rc;
use std::time::Duration;

use bq_dedupe::{
    Capabilities, Claim, ClaimToken, InMemoryStore, Settled, Settlement, Store, StoreError,
    StoreErrorKind, StoreResult,
};
use js_sys::{Array, Object, Promise, Reflect};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    /// A duck-typed JS store (see `DedupeStore` in the `.d.ts`).
    pub type JsStore;

    #[wasm_bindgen(method, catch)]
    fn seen(this: &JsStore, key: &str) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn remember(this: &JsStore, key: &str, ttl_ms: Option<f64>) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn forget(this: &JsStore, key: &str) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = seenMany)]
    fn seen_many(this: &JsStore, keys: &Array) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = rememberMany)]
    fn remember_many(this: &JsStore, keys: &Array, ttl_ms: Option<f64>)
    -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn claim(this: &JsStore, key: &str, lease_ms: f64) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn release(this: &JsStore, key: &str, token: &str) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = claimMany)]
    fn claim_many(this: &JsStore, keys: &Array, lease_ms: f64) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = commitMany)]
    fn commit_many(
        this: &JsStore,
        done: &Array,
        ttl_ms: Option<f64>,
        releases: &Array,
    ) -> Result<JsValue, JsValue>;
}

/// Which optional methods a JS store has, read once per call into the package.
#[derive(Clone, Copy, Default)]
struct Has {
    seen_many: bool,
    remember_many: bool,
    claim: bool,
    claim_many: bool,
    commit_many: bool,
}

/// A JS object used as a store.
pub struct JsObjectStore {
    obj: JsStore,
    has: Has,
}

/// The store behind one call: the Rust in-memory store, or a JS object.
pub enum AnyStore {
    Memory(Rc<InMemoryStore>),
    Js(JsObjectStore),
}

impl AnyStore {
    /// The store a JS caller passed, or a `TypeError` message saying why it is not one.
    pub fn from_js(value: &JsValue) -> Result<AnyStore, String> {
        if let Some(memory) = crate::memory::lookup(value)? {
            return Ok(AnyStore::Memory(memory));
        }
        if !value.is_object() {
            return Err(
                "store must be an InMemoryStore or an object with seen/remember/forget".into(),
            );
        }
        for required in ["seen", "remember", "forget"] {
            if !is_function(value, required) {
                return Err(format!("store.{required} is not a function"));
            }
        }
        let has = Has {
            seen_many: is_function(value, "seenMany"),
            remember_many: is_function(value, "rememberMany"),
            claim: is_function(value, "claim") && is_function(value, "release"),
            claim_many: is_function(value, "claimMany"),
            commit_many: is_function(value, "commitMany"),
        };
        Ok(AnyStore::Js(JsObjectStore {
            obj: value.clone().unchecked_into(),
            has,
        }))
    }
}

fn is_function(obj: &JsValue, name: &str) -> bool {
    Reflect::get(obj, &JsValue::from_str(name)).is_ok_and(|f| f.is_function())
}

/// Waits for a thenable; passes any other value through (a sync store stays sync,
/// so `block_on_ready` can drive it, as the conformance runner does).
pub async fn settle(value: Result<JsValue, JsValue>) -> Result<JsValue, JsValue> {
    let value = value?;
    if value.is_object() && is_function(&value, "then") {
        JsFuture::from(Promise::resolve(&value)).await
    } else {
        Ok(value)
    }
}

/// A human-readable message for a thrown JS value.
pub fn message_of(error: &JsValue) -> String {
    if let Some(s) = error.as_string() {
        return s;
    }
    if let Some(e) = error.dyn_ref::<js_sys::Error>() {
        return String::from(e.message());
    }
    if error.is_object()
        && let Some(m) = Reflect::get(error, &"message".into())
            .ok()
            .and_then(|m| m.as_string())
    {
        return m;
    }
    if error.is_undefined() {
        return "undefined".into();
    }
    // JSON, or (a BigInt, a cycle, a symbol: stringify throws or gives nothing)
    // the type, never a call that can throw again.
    js_sys::JSON::stringify(error)
        .ok()
        .and_then(|s| s.as_string())
        .unwrap_or_else(|| error.js_typeof().as_string().unwrap_or_default())
}

/// A store failure from what a JS store threw.
fn store_error(op: &str, error: JsValue) -> StoreError {
    let kind = ["kind", "code"]
        .iter()
        .filter(|_| error.is_object())
        .filter_map(|p| {
            Reflect::get(&error, &JsValue::from_str(p))
                .ok()?
                .as_string()
        })
        .find_map(|code| match code.as_str() {
            "unavailable" => Some(StoreErrorKind::Unavailable),
            "unsupported" => Some(StoreErrorKind::Unsupported),
            "invalid" => Some(StoreErrorKind::Invalid),
            "internal" => Some(StoreErrorKind::Internal),
            _ => None,
        })
        .unwrap_or(StoreErrorKind::Unavailable);
    StoreError::new(kind, format!("{op}: {}", message_of(&error)))
}

/// Whole milliseconds (options are rounded up to whole milliseconds when parsed,
/// so a store never forgets or frees a claim early).
fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

fn keys_array(keys: &[&str]) -> Array {
    keys.iter().map(|k| JsValue::from_str(k)).collect()
}

fn bools(op: &str, value: JsValue) -> StoreResult<Vec<bool>> {
    let array = value
        .dyn_into::<Array>()
        .map_err(|_| StoreError::new(StoreErrorKind::Internal, format!("{op}: not an array")))?;
    Ok(array.iter().map(|v| v.is_truthy()).collect())
}

/// `{state:"acquired",token}` | `{state:"seen"}` | `{state:"held"}` (or the bare
/// strings `"seen"` / `"held"`).
fn claim_of(value: &JsValue) -> StoreResult<Claim> {
    let state = value.as_string().or_else(|| {
        Reflect::get(value, &"state".into())
            .ok()
            .and_then(|s| s.as_string())
    });
    match state.as_deref() {
        Some("seen") => Ok(Claim::Seen),
        Some("held") => Ok(Claim::Held),
        Some("acquired") => {
            // A string, passed back to `release` unchanged (a number would not be).
            let token = Reflect::get(value, &"token".into())
                .ok()
                .and_then(|t| t.as_string())
                .ok_or_else(|| {
                    StoreError::new(
                        StoreErrorKind::Internal,
                        "claim: acquired without a string token",
                    )
                })?;
            Ok(Claim::Acquired(ClaimToken(token)))
        }
        _ => Err(StoreError::new(
            StoreErrorKind::Internal,
            "claim: expected {state: \"acquired\"|\"seen\"|\"held\"}",
        )),
    }
}

impl JsObjectStore {
    async fn call(&self, op: &str, result: Result<JsValue, JsValue>) -> StoreResult<JsValue> {
        settle(result).await.map_err(|e| store_error(op, e))
    }

    fn check_claim(&self) -> StoreResult<()> {
        if self.has.claim {
            Ok(())
        } else {
            Err(StoreError::unsupported(
                "this store cannot claim (it has no claim/release methods)",
            ))
        }
    }
}

impl Store for JsObjectStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        Ok(self.call("seen", self.obj.seen(key)).await?.is_truthy())
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.call("remember", self.obj.remember(key, ttl.map(ms)))
            .await
            .map(drop)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.call("forget", self.obj.forget(key)).await.map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: self.has.claim,
            ttl: true,
            lease: false,
        }
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if !self.has.seen_many {
            let mut answers = Vec::with_capacity(keys.len());
            for key in keys {
                answers.push(self.seen(key).await?);
            }
            return Ok(answers);
        }
        let value = self
            .call("seenMany", self.obj.seen_many(&keys_array(keys)))
            .await?;
        bools("seenMany", value)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if !self.has.remember_many {
            for key in keys {
                self.remember(key, ttl).await?;
            }
            return Ok(());
        }
        self.call(
            "rememberMany",
            self.obj.remember_many(&keys_array(keys), ttl.map(ms)),
        )
        .await
        .map(drop)
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.check_claim()?;
        claim_of(&self.call("claim", self.obj.claim(key, ms(lease))).await?)
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.check_claim()?;
        self.call("release", self.obj.release(key, &token.0))
            .await
            .map(drop)
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.check_claim()?;
        if !self.has.claim_many {
            return bq_dedupe::store::claim_each(self, keys, lease).await;
        }
        let value = self
            .call(
                "claimMany",
                self.obj.claim_many(&keys_array(keys), ms(lease)),
            )
            .await?;
        let array = value
            .dyn_into::<Array>()
            .map_err(|_| StoreError::new(StoreErrorKind::Internal, "claimMany: not an array"))?;
        // A malformed reply fails the batch; what it did grant is not released (a
        // store breaking the contract; the lease frees it), which keeps the module
        // inside its size budget.
        array.iter().map(|c| claim_of(&c)).collect()
    }

    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let plain = step.renew.is_empty() && step.remember.iter().all(|(_, t)| t.is_none());
        if !(self.has.commit_many && plain) {
            return bq_dedupe::store::settle_each(self, step).await;
        }
        let done: Vec<&str> = step.remember.iter().map(|(k, _)| *k).collect();
        let releases: Array = step
            .release
            .iter()
            .map(|(key, token)| {
                let o = Object::new();
                let _ = Reflect::set(&o, &"key".into(), &JsValue::from_str(key));
                let _ = Reflect::set(&o, &"token".into(), &JsValue::from_str(&token.0));
                JsValue::from(o)
            })
            .collect();
        self.call(
            "commitMany",
            self.obj
                .commit_many(&keys_array(&done), step.ttl.map(ms), &releases),
        )
        .await?;
        Ok(Settled {
            kept: vec![true; done.len()],
            ..Settled::default()
        })
    }
}

bq_dedupe::delegate_store!(AnyStore { Memory, Js });

/// For `claim` results handed back to JS by the in-memory class.
pub fn claim_to_js(claim: &Claim) -> JsValue {
    let o = Object::new();
    let (state, token) = match claim {
        Claim::Acquired(t) => ("acquired", Some(t.0.as_str())),
        Claim::Seen => ("seen", None),
        Claim::Held => ("held", None),
    };
    let _ = Reflect::set(&o, &"state".into(), &JsValue::from_str(state));
    if let Some(token) = token {
        let _ = Reflect::set(&o, &"token".into(), &JsValue::from_str(token));
    }
    o.into()
}
