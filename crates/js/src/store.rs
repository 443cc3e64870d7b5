//! The core's [`Store`] trait over what JavaScript passes as the store: either the
//! Rust [`crate::memory::InMemoryStore`] class (used directly, no JS calls) or any
//! JS object with `seen` / `remember` / `forget` and optional batch, claim and
//! lease methods, each returning a value or a promise of it.
//!
//! Leases (`Capabilities::lease`: claims renewed while work runs, fenced commits)
//! need `claim` + `release` and either `settle(step)` (one call per batch step) or
//! both `renew` and `rememberFenced` (one call per key). A store without them
//! works as before leases: no renewal, and commits are plain `remember`s.
//!
//! A thrown error or a rejected promise becomes a [`StoreError`] (kind from the
//! error's `kind`/`code` property when it is one of the core's codes, else
//! `unavailable`); the guard turns that into its typed outcome.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::store::{Batch, Foreign, ForeignStore, KeyStore, wire};
use bq_dedupe::{
    InMemoryStore, StoreError, StoreResult, clock::Clock, store::Capabilities, store::Claim,
    store::ClaimToken, store::Settled, store::Settlement, store::StoreErrorKind,
};
use js_sys::{Array, Object, Promise, Reflect};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::memory::SteadyClock;

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
    #[wasm_bindgen(method, catch)]
    fn renew(this: &JsStore, key: &str, token: &str, lease_ms: f64) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = rememberFenced)]
    fn remember_fenced(
        this: &JsStore,
        key: &str,
        token: &str,
        ttl_ms: Option<f64>,
    ) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = settle)]
    fn settle_js(this: &JsStore, step: &Object) -> Result<JsValue, JsValue>;
}

/// Which optional methods a JS store has, read once per call into the package.
#[derive(Clone, Copy, Default)]
struct Has {
    seen_many: bool,
    remember_many: bool,
    claim: bool,
    claim_many: bool,
    /// `renew` and `rememberFenced`.
    fenced: bool,
    settle: bool,
}

/// A JS object used as a store.
pub struct JsObjectStore {
    obj: JsStore,
    has: Has,
}

/// The store behind one call: the Rust in-memory store, or a JS object.
pub enum GivenStore {
    Memory(Rc<InMemoryStore>),
    Js(Foreign<JsObjectStore>),
}

impl GivenStore {
    /// The store a JS caller passed (and the clock a guard over it reads: an
    /// `InMemoryStore`'s manual clock, else a [`SteadyClock`]), or a `TypeError` message
    /// saying why it is not one.
    pub fn from_js(value: &JsValue) -> Result<(GivenStore, Arc<dyn Clock>), String> {
        if let Some((memory, manual)) = crate::memory::lookup(value)? {
            let clock: Arc<dyn Clock> = match manual {
                Some(m) => m,
                None => Arc::new(SteadyClock::default()),
            };
            return Ok((GivenStore::Memory(memory), clock));
        }
        if !value.is_object() {
            return Err(
                "store must be an InMemoryStore or an object with seen/remember/forget".into(),
            );
        }
        for name in ["seen", "remember", "forget"] {
            if !is_function(value, name) {
                return Err(format!("store.{name} is not a function"));
            }
        }
        // Every optional method read, in this order (a getter may count reads).
        let has = |name| is_function(value, name);
        let has = Has {
            seen_many: has("seenMany"),
            remember_many: has("rememberMany"),
            claim: has("claim") & has("release"),
            claim_many: has("claimMany"),
            fenced: has("renew") & has("rememberFenced"),
            settle: has("settle"),
        };
        let store = GivenStore::Js(Foreign::new(JsObjectStore {
            obj: value.clone().unchecked_into(),
            has,
        }));
        Ok((store, Arc::new(SteadyClock::default())))
    }
}

pub(crate) fn is_function(obj: &JsValue, name: &'static str) -> bool {
    Reflect::get(obj, crate::interned(name)).is_ok_and(|f| f.is_function())
}

/// Waits for a thenable; passes any other value through (a sync store stays sync,
/// so `block_on_ready` can drive it, as the conformance runner does).
/// A `then` getter that throws rejects, as `await` would (a trial: it was
/// read as a plain answer, "neither a boolean nor 0/1").
pub async fn await_value(value: Result<JsValue, JsValue>) -> Result<JsValue, JsValue> {
    let value = value?;
    if !value.is_object() {
        return Ok(value);
    }
    match Reflect::get(&value, crate::interned("then"))?.is_function() {
        true => JsFuture::from(Promise::resolve(&value)).await,
        false => Ok(value),
    }
}

/// A human-readable message for a thrown JS value.
pub fn message_of(error: &JsValue) -> String {
    if let Some(s) = error.as_string() {
        return s;
    }
    // Read as a property that may be anything, or a getter that throws: an
    // Error's `message` set to null once panicked here, and the panic wedged
    // the module (the batch never settled, its successes unrecorded).
    if error.is_object()
        && let Some(m) = Reflect::get(error, crate::interned("message"))
            .ok()
            .and_then(|m| m.as_string())
    {
        return m;
    }
    if error.is_instance_of::<js_sys::Error>() {
        return "an Error without a string message".into();
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
        .find_map(|code| StoreErrorKind::from_code(&code))
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
    let mut answers = Vec::with_capacity(array.length() as usize);
    for v in array.iter() {
        answers.push(yes_no(op, &v)?);
    }
    Ok(answers)
}

/// A store's yes or no: `true`/`false`, or 1/0 (as Redis `EXISTS` answers).
/// Anything else is a store error, never read by its truthiness: a `"0"` or
/// `{}` read as `true` would skip messages that never ran.
#[inline(never)]
fn yes_no(op: &str, value: &JsValue) -> StoreResult<bool> {
    match (value.as_bool(), value.as_f64()) {
        (Some(b), _) => Ok(b),
        (_, Some(n)) if n == 0.0 || n == 1.0 => Ok(n == 1.0),
        _ => Err(StoreError::new(
            StoreErrorKind::Internal,
            format!("{op}: answered neither a boolean nor 0/1"),
        )),
    }
}

/// `{state:"acquired",token}` | `{state:"seen"}` | `{state:"held"}` (or the bare
/// strings `"seen"` / `"held"`).
fn claim_of(value: &JsValue) -> StoreResult<Claim> {
    let state = value.as_string().or_else(|| {
        Reflect::get(value, crate::interned("state"))
            .ok()
            .and_then(|s| s.as_string())
    });
    // A string token, passed back to `release` unchanged (a number would not be).
    let token = || {
        Reflect::get(value, crate::interned("token"))
            .ok()
            .and_then(|t| t.as_string())
    };
    wire::Claim::from_parts(state.as_deref(), token)
}

impl JsObjectStore {
    async fn call(&self, op: &str, result: Result<JsValue, JsValue>) -> StoreResult<JsValue> {
        await_value(result).await.map_err(|e| store_error(op, e))
    }

    fn check_fenced(&self) -> StoreResult<()> {
        let why = "this store cannot keep leases (it has no renew/rememberFenced methods)";
        supported(self.has.fenced, why)
    }
}

/// The JS object's single-key methods, used where it has no batch form of a
/// call.
impl KeyStore for JsObjectStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        yes_no("seen", &self.call("seen", self.obj.seen(key)).await?)
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        let value = self.obj.remember(key, ttl.map(ms));
        self.call("remember", value).await.map(drop)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.call("forget", self.obj.forget(key)).await.map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: self.has.claim,
            ttl: true,
            renew: self.has.claim && (self.has.settle || self.has.fenced),
        }
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        claim_of(&self.call("claim", self.obj.claim(key, ms(lease))).await?)
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.can_claim()?;
        let value = self.obj.release(key, &token.0);
        self.call("release", value).await.map(drop)
    }

    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        self.check_fenced()?;
        let value = self.call("renew", self.obj.renew(key, &token.0, ms(lease)));
        yes_no("renew", &value.await?)
    }

    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        self.check_fenced()?;
        let value = self.obj.remember_fenced(key, &token.0, ttl.map(ms));
        yes_no("rememberFenced", &self.call("rememberFenced", value).await?)
    }
}

impl ForeignStore for JsObjectStore {
    fn has(&self, call: Batch, _keys: usize) -> bool {
        match call {
            Batch::Seen => self.has.seen_many,
            Batch::Remember => self.has.remember_many,
            Batch::Claim => self.has.claim_many,
            Batch::Settle => self.has.settle,
        }
    }

    fn can_claim(&self) -> StoreResult<()> {
        let why = "this store cannot claim (it has no claim/release methods)";
        supported(self.has.claim, why)
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let value = self.obj.seen_many(&keys_array(keys));
        bools("seenMany", self.call("seenMany", value).await?)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let value = self.obj.remember_many(&keys_array(keys), ttl.map(ms));
        self.call("rememberMany", value).await.map(drop)
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let value = self.obj.claim_many(&keys_array(keys), ms(lease));
        let array = (self.call("claimMany", value).await?)
            .dyn_into::<Array>()
            .map_err(|_| StoreError::new(StoreErrorKind::Internal, "claimMany: not an array"))?;
        // A malformed reply fails the batch; what it did grant is not released (a
        // store breaking the contract; the lease frees it), which keeps the module
        // inside its size budget.
        array.iter().map(|c| claim_of(&c)).collect()
    }

    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let ttl = step
            .ttl
            .map_or(JsValue::UNDEFINED, |d| JsValue::from_f64(ms(d)));
        let o = Object::new();
        let remember: Array = step
            .remember
            .iter()
            .map(|(key, token)| claim_ref(key, *token))
            .collect();
        crate::set(&o, "remember", &remember);
        crate::set(&o, "ttlMs", &ttl);
        crate::set(&o, "release", &claim_refs(step.release));
        crate::set(&o, "renew", &claim_refs(step.renew));
        crate::set(&o, "leaseMs", &JsValue::from_f64(ms(step.lease)));
        let reply = self.call("settle", self.obj.settle_js(&o)).await?;
        Ok(Settled {
            kept: flags(&reply, "kept", step.remember.len())?,
            renewed: flags(&reply, "renewed", step.renew.len())?,
            release_error: None,
        })
    }
}

/// `Err(unsupported(why))` unless `has`.
fn supported(has: bool, why: &'static str) -> StoreResult<()> {
    has.then_some(())
        .ok_or_else(|| StoreError::unsupported(why))
}

/// `{ key, token }` (no `token` for a plain remember).
fn claim_ref(key: &str, token: Option<&ClaimToken>) -> JsValue {
    let o = Object::new();
    crate::set(&o, "key", &JsValue::from_str(key));
    if let Some(token) = token {
        crate::set(&o, "token", &JsValue::from_str(&token.0));
    }
    o.into()
}

fn claim_refs(claims: &[(&str, &ClaimToken)]) -> Array {
    claims
        .iter()
        .map(|(key, token)| claim_ref(key, Some(token)))
        .collect()
}

/// `reply[name]`: `n` booleans (anything when `n` is 0).
fn flags(reply: &JsValue, name: &'static str, n: usize) -> StoreResult<Vec<bool>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let answers = bools("settle", crate::prop(reply, name))?;
    if answers.len() != n {
        return Err(StoreError::new(
            StoreErrorKind::Internal,
            "settle: expected {kept: boolean[], renewed: boolean[]}, one per entry",
        ));
    }
    Ok(answers)
}

bq_dedupe::delegate_store!(GivenStore { Memory, Js });

/// For `claim` results handed back to JS by the in-memory class.
pub fn claim_to_js(claim: &Claim) -> JsValue {
    let o = Object::new();
    let (state, token) = wire::Claim::parts(claim);
    crate::set(&o, "state", crate::interned(state));
    if let Some(token) = token {
        crate::set(&o, "token", &JsValue::from_str(token));
    }
    o.into()
}
