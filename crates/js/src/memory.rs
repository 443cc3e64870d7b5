//! `InMemoryStore` for JavaScript: the core's reference store, with the browser's
//! clock (`Date.now`) or a manual one for simulations (`advance(ms)`).
//!
//! Passed as the `store` argument of `dedupe` & co. it is used directly (no JS
//! calls per store operation): each instance is registered under a handle that
//! [`lookup`] finds again from the JS object.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::{
    InMemoryStore as CoreStore, Store, block_on_ready, clock::Clock, clock::ManualClock,
    store::ClaimToken,
};
use js_sys::{Array, Object, Reflect};
use wasm_bindgen::prelude::*;

use crate::store::claim_to_js;
use crate::{check_options, js_error, opt_number, prop, type_error};

/// The host's wall clock.
pub struct DateClock;

impl Clock for DateClock {
    fn now_ms(&self) -> u64 {
        js_sys::Date::now() as u64
    }
}

/// A guard's clock: the host's monotonic time, plus the furthest `Date.now`
/// has been ahead of it (a sleep the monotonic clock did not count), so it
/// never steps back. A guard read `Date.now`: a wall clock stepped back made a
/// claim that had run out read as in its lease, and a late success on a store
/// that cannot renew `run-ok` beside another consumer's run (a trial).
#[derive(Default)]
pub struct SteadyClock {
    ahead: std::sync::atomic::AtomicU64,
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> u64 {
        let counted = crate::crossing::steady_now();
        let ahead = (js_sys::Date::now() - counted).max(0.0) as u64;
        let ahead = (self.ahead)
            .fetch_max(ahead, std::sync::atomic::Ordering::Relaxed)
            .max(ahead);
        (counted as u64).saturating_add(ahead)
    }
}

/// The live stores by handle (the last handle given out, then `(handle, store,
/// its manual clock)`). Handles count up and are never given out twice (a JS
/// number counts exactly to 2^53): a counter that wrapped at 2^21 gave a new
/// store the handle of a live one, whose ids then skipped the new store's
/// messages (a review's finding).
type Registry = (f64, Vec<(f64, Weak<CoreStore>, Option<Arc<ManualClock>>)>);

thread_local! {
    static REGISTRY: RefCell<Registry> = const { RefCell::new((0.0, Vec::new())) };
    /// This module instance's own object, which each of its stores shows
    /// (`__bqModule`): compared by identity, so a store made by another copy of
    /// the module, numbered from 1 too, is never taken for one of ours.
    static MODULE: Object = Object::new();
}

const HANDLE: &str = "__bqHandle";
const MODULE_MARK: &str = "__bqModule";

/// The Rust store behind a JS `InMemoryStore` object, if `value` is one of this
/// module's, and its manual clock if it has one (the guard then reads time from
/// it too, so a test that advances the store's clock drives renewals). Another
/// copy's store is `None` (it is then used through its methods).
pub fn lookup(value: &JsValue) -> Result<Option<Found>, String> {
    const FREED: &str = "this InMemoryStore has been freed";
    if !value.is_object() {
        return Ok(None);
    }
    // A freed store's getter throws (its pointer is gone).
    let handle = Reflect::get(value, crate::interned(HANDLE)).map_err(|_| FREED.to_string())?;
    let Some(id) = handle.as_f64() else {
        return Ok(None);
    };
    let mark = Reflect::get(value, crate::interned(MODULE_MARK)).map_err(|_| FREED.to_string())?;
    if !MODULE.with(|ours| Object::is(&mark, ours)) {
        return Ok(None);
    }
    REGISTRY.with(|r| {
        r.borrow()
            .1
            .iter()
            .find(|(known, ..)| *known == id)
            .and_then(|(_, weak, clock)| Some((weak.upgrade()?, clock.clone())))
            .map(Some)
            .ok_or_else(|| FREED.to_string())
    })
}

/// A registered store and its manual clock.
pub type Found = (Rc<CoreStore>, Option<Arc<ManualClock>>);

/// The reference in-memory seen-set (process-local, optional TTL and capacity).
#[wasm_bindgen(js_name = InMemoryStore)]
pub struct JsInMemoryStore {
    handle: f64,
    store: Rc<CoreStore>,
    manual: Option<Arc<ManualClock>>,
}

#[wasm_bindgen(js_class = InMemoryStore)]
impl JsInMemoryStore {
    /// `new InMemoryStore({ manualClock?, now?, capacity? })`.
    #[wasm_bindgen(constructor)]
    pub fn new(
        #[wasm_bindgen(unchecked_param_type = "InMemoryStoreOptions")] options: Option<JsValue>,
    ) -> Result<JsInMemoryStore, JsValue> {
        let options = options.unwrap_or(JsValue::UNDEFINED);
        const WHAT: &str = "InMemoryStore options";
        check_options(WHAT, &options, &["manualClock", "now", "capacity"])?;
        let now = opt_number(WHAT, &options, "now")?;
        let capacity = opt_number(WHAT, &options, "capacity")?;
        let manual = (options.is_object() && prop(&options, "manualClock").is_truthy())
            .then(|| Arc::new(ManualClock::new(now.unwrap_or(0.0) as u64)));
        // (Ignored, it was unsaid: a user's trial.)
        if manual.is_none() && now.is_some() {
            return Err(type_error(
                "now is the manual clock's start: add manualClock: true",
            ));
        }
        let clock: Arc<dyn Clock> = match &manual {
            Some(m) => m.clone(),
            None => Arc::new(DateClock),
        };
        let mut store = CoreStore::with_clock(clock);
        match capacity {
            // 0 held one id: a silent eviction of every id but the last.
            Some(cap) if cap < 1.0 => {
                return Err(type_error("capacity must be at least 1"));
            }
            Some(cap) => store = store.with_capacity_limit(cap as usize),
            None => {}
        }
        let store = Rc::new(store);
        let handle = REGISTRY.with(|r| {
            let mut r = r.borrow_mut();
            r.0 += 1.0;
            let id = r.0;
            r.1.retain(|(_, w, _)| w.strong_count() > 0);
            r.1.push((id, Rc::downgrade(&store), manual.clone()));
            id
        });
        Ok(JsInMemoryStore {
            handle,
            store,
            manual,
        })
    }

    #[wasm_bindgen(getter, js_name = __bqHandle, skip_typescript)]
    pub fn handle(&self) -> f64 {
        self.handle
    }

    #[wasm_bindgen(getter, js_name = __bqModule, skip_typescript)]
    pub fn module(&self) -> Object {
        MODULE.with(Object::clone)
    }

    /// Is `key` remembered (and not expired)?
    pub fn seen(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] key: JsValue,
    ) -> Result<bool, JsValue> {
        ready(self.store.seen(&key_of(key)?))
    }

    /// Remembers `key`, for `ttlMs` milliseconds or until forgotten.
    pub fn remember(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] key: JsValue,
        #[wasm_bindgen(js_name = ttlMs)] ttl_ms: Option<f64>,
    ) -> Result<(), JsValue> {
        ready(
            self.store
                .remember(&key_of(key)?, ttl_ms.map(millis).transpose()?),
        )
    }

    /// Drops `key` and any claim on it.
    pub fn forget(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] key: JsValue,
    ) -> Result<(), JsValue> {
        ready(self.store.forget(&key_of(key)?))
    }

    /// Claims `key` for `leaseMs` (see the claiming mode).
    #[wasm_bindgen(unchecked_return_type = "ClaimResult")]
    pub fn claim(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] key: JsValue,
        #[wasm_bindgen(js_name = leaseMs)] lease_ms: f64,
    ) -> Result<JsValue, JsValue> {
        ready(self.store.claim(&key_of(key)?, millis(lease_ms)?)).map(|c| claim_to_js(&c))
    }

    /// Gives up a claim, if `token` still owns it.
    pub fn release(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] key: JsValue,
        token: &str,
    ) -> Result<(), JsValue> {
        ready(
            self.store
                .release(&key_of(key)?, &ClaimToken(token.to_string())),
        )
    }

    /// Remembered ids (`state: "done"`) and live claims (`state: "claimed"`), oldest first.
    #[wasm_bindgen(unchecked_return_type = "StoreEntry[]")]
    pub fn entries(&self) -> Array {
        let out = Array::new();
        for e in self.store.entries() {
            out.push(&entry(&e.key, "done", e.expires_at_ms));
        }
        for key in self.store.claimed() {
            out.push(&entry(&key, "claimed", None));
        }
        out
    }

    /// How many ids are remembered.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> usize {
        self.store.len()
    }

    /// The store's clock, in ms since the Unix epoch (the manual clock when there is one).
    #[wasm_bindgen(getter)]
    pub fn now(&self) -> f64 {
        match &self.manual {
            Some(m) => m.now_ms() as f64,
            None => js_sys::Date::now(),
        }
    }

    /// Moves the manual clock forward (TTLs and leases expire); only with `manualClock: true`.
    pub fn advance(&self, ms: f64) -> Result<(), JsValue> {
        match &self.manual {
            Some(m) if ms.is_finite() && ms >= 0.0 => {
                m.advance(ms as u64);
                Ok(())
            }
            Some(_) => Err(type_error("advance(ms): ms must be a non-negative number")),
            None => Err(type_error(
                "advance() needs a manual clock: new InMemoryStore({ manualClock: true })",
            )),
        }
    }

    /// Removes expired entries now; returns how many went.
    #[wasm_bindgen(js_name = purgeExpired)]
    pub fn purge_expired(&self) -> usize {
        self.store.purge_expired()
    }
}

/// A key given to a store method, refused where it is no string or holds a
/// lone surrogate: made U+FFFD on the way in, `remember("a\u{d83d}")` recorded
/// `a\u{fffd}`, and a message with that id was skipped, never run (a user's
/// trial); as `forget` and the ids of envelopes are refused.
fn key_of(key: JsValue) -> Result<String, JsValue> {
    crate::text(key, "key")
}

/// A TTL or lease given to the store's own methods: milliseconds above 0
/// (`Infinity`: for ever). NaN, 0 or less is a TypeError: a NaN lease held
/// its key for ever (a trial).
fn millis(ms: f64) -> Result<Duration, JsValue> {
    if ms.is_nan() || ms <= 0.0 {
        return Err(type_error("ttlMs and leaseMs are milliseconds above 0"));
    }
    Ok(Duration::from_millis(match ms.is_finite() {
        true => ms.ceil() as u64,
        false => u64::MAX,
    }))
}

fn ready<T>(future: impl Future<Output = bq_dedupe::StoreResult<T>>) -> Result<T, JsValue> {
    match block_on_ready(future) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failed(&e)),
        Err(e) => Err(failed(&e)),
    }
}

/// One copy of the error conversion for every method (not one per `ready::<T>`).
#[inline(never)]
fn failed(e: &dyn std::fmt::Display) -> JsValue {
    js_error(&e.to_string())
}

fn entry(key: &str, state: &'static str, expires_at: Option<u64>) -> JsValue {
    let o = Object::new();
    crate::set(&o, "key", &JsValue::from_str(key));
    crate::set(&o, "state", crate::interned(state));
    let expires = expires_at.map_or(JsValue::NULL, |ms| JsValue::from_f64(ms as f64));
    crate::set(&o, "expiresAt", &expires);
    o.into()
}
