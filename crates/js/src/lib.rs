//! The bq-dedupe core for JavaScript (wasm-bindgen): `dedupe`, `dedupeBatch`,
//! `dedupeKey`, `validate`, `forget`, `runConformance` and the `InMemoryStore`
//! class (`process` and `processBatch`: deprecated aliases of the first two). A
//! thin adapter: every decision is the core's [`Guard`]; this crate only turns JS
//! values into the core's inputs (bytes, a [`Store`], a handler) and its
//! [`Outcome`]s into plain JS objects with the core's codes.

#[cfg(feature = "conformance")]
mod conformance;
mod memory;
mod store;
mod types;

// A smaller allocator than std's dlmalloc for the one-threaded wasm module (as
// in the component).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

use std::cell::RefCell;
use std::time::Duration;

use bq_dedupe::observe::Event;
use bq_dedupe::{
    Disposition, Guard, KeySpace, Limits, Message, Observer, Options, Outcome, Rejection, Timer,
};
use js_sys::{Function, Object, Reflect, Uint8Array};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::store::{AnyStore, message_of, settle};

pub use memory::JsInMemoryStore;

// ---- errors -----------------------------------------------------------------

pub(crate) fn type_error(message: &str) -> JsValue {
    js_sys::TypeError::new(message).into()
}

pub(crate) fn js_error(message: &str) -> JsValue {
    js_sys::Error::new(message).into()
}

pub(crate) fn set(o: &Object, key: &str, value: &JsValue) {
    let _ = Reflect::set(o, &JsValue::from_str(key), value);
}

fn str_or_null(s: Option<&str>) -> JsValue {
    s.map_or(JsValue::NULL, JsValue::from_str)
}

// ---- options ----------------------------------------------------------------

/// A property of an options object (`undefined` when absent).
pub(crate) fn prop(o: &JsValue, key: &str) -> JsValue {
    Reflect::get(o, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

/// Checks an options object: `undefined`/`null` or an object with only `known` keys.
pub(crate) fn check_options(what: &str, o: &JsValue, known: &[&str]) -> Result<(), JsValue> {
    if o.is_undefined() || o.is_null() {
        return Ok(());
    }
    if !o.is_object() {
        return Err(type_error(&format!("{what} must be an object")));
    }
    for key in Object::keys(o.unchecked_ref::<Object>()).iter() {
        let key = key.as_string().unwrap_or_default();
        if !known.contains(&key.as_str()) {
            return Err(type_error(&format!(
                "{what}: unknown option \"{key}\" (expected one of {})",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

/// `o[key]` when `o` is an object and the value is neither `undefined` nor `null`.
fn opt_prop(o: &JsValue, key: &str) -> Option<JsValue> {
    let v = if o.is_object() {
        prop(o, key)
    } else {
        JsValue::UNDEFINED
    };
    (!v.is_undefined() && !v.is_null()).then_some(v)
}

/// An optional non-negative number option.
pub(crate) fn opt_number(what: &str, o: &JsValue, key: &str) -> Result<Option<f64>, JsValue> {
    let Some(v) = opt_prop(o, key) else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(Some(n)),
        _ => Err(type_error(&format!(
            "{what}.{key} must be a non-negative number"
        ))),
    }
}

fn opt_string(o: &JsValue, key: &str) -> Result<Option<String>, JsValue> {
    let Some(v) = opt_prop(o, key) else {
        return Ok(None);
    };
    v.as_string()
        .map(Some)
        .ok_or_else(|| type_error(&format!("options.{key} must be a string")))
}

const OPTIONS: &[&str] = &["ttlMs", "claimLeaseMs", "keyPrefix", "scope", "maxBytes"];

/// The core's options from the JS options object (`undefined`: the defaults).
fn options(o: &Option<JsValue>) -> Result<Options, JsValue> {
    let undefined = JsValue::UNDEFINED;
    let o = o.as_ref().unwrap_or(&undefined);
    check_options("options", o, OPTIONS)?;
    let ms = |key| {
        opt_number("options", o, key).map(|n| n.map(|n| Duration::from_millis(n.ceil() as u64)))
    };
    let mut keyspace = KeySpace::new().with_prefix(opt_string(o, "keyPrefix")?.unwrap_or_default());
    if let Some(scope) = opt_string(o, "scope")? {
        keyspace = keyspace
            .with_scope(scope)
            .map_err(|e| type_error(&e.to_string()))?;
    }
    let limits = match opt_number("options", o, "maxBytes")? {
        Some(n) => Limits {
            max_bytes: n as usize,
        },
        None => Limits::default(),
    };
    Ok(Options {
        ttl: ms("ttlMs")?,
        claim_lease: ms("claimLeaseMs")?,
        keyspace,
        limits,
        ..Options::default()
    })
}

// ---- envelopes --------------------------------------------------------------

/// The wire bytes of an envelope given as a string, a `Uint8Array` or a JS value
/// (serialised with `JSON.stringify`). `Err`: it cannot be turned into bytes.
fn body_of(value: &JsValue) -> Result<Vec<u8>, String> {
    if let Some(s) = value.as_string() {
        return Ok(s.into_bytes());
    }
    if let Some(bytes) = value.dyn_ref::<Uint8Array>() {
        return Ok(bytes.to_vec());
    }
    if value.is_undefined() {
        return Err("no envelope given (undefined)".into());
    }
    match js_sys::JSON::stringify(value) {
        Ok(s) => s
            .as_string()
            .map(String::into_bytes)
            .ok_or_else(|| "the envelope is not JSON-serialisable".to_string()),
        Err(e) => Err(format!("JSON.stringify failed: {}", message_of(&e))),
    }
}

fn rejection_js(r: &Rejection) -> JsValue {
    let o = Object::new();
    set(&o, "code", &JsValue::from_str(r.code()));
    set(&o, "message", &JsValue::from_str(&r.to_string()));
    o.into()
}

/// The plain-object form of the decoded envelope the handler receives: `JSON.parse`
/// of the delivered text (already validated by the core), with the canonical `job`
/// filled in when the producer used the `urn` alias.
fn envelope_js(msg: &Message<'_>) -> JsValue {
    let value = js_sys::JSON::parse(msg.raw()).unwrap_or(JsValue::NULL);
    if value.is_object()
        && Reflect::get(&value, &"job".into()).is_ok_and(|j| j.as_string().is_none())
    {
        let _ = Reflect::set(&value, &"job".into(), &JsValue::from_str(msg.job()));
    }
    value
}

// ---- outcomes ---------------------------------------------------------------

/// What a JS handler threw (or rejected with), kept unchanged for the outcome.
pub struct HandlerError(JsValue);

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&message_of(&self.0))
    }
}

fn disposition_code(d: Disposition) -> &'static str {
    match d {
        Disposition::Ack => "ack",
        Disposition::Retry => "retry",
        Disposition::Poison => "poison",
    }
}

/// `{ kind, disposition, ran, key, reason?, error?, storeError?, rejection? }`.
fn outcome_js(outcome: Outcome<HandlerError>, key: Option<String>) -> JsValue {
    let kind = outcome.kind();
    let o = Object::new();
    set(&o, "kind", &JsValue::from_str(kind.code()));
    set(
        &o,
        "disposition",
        &JsValue::from_str(disposition_code(kind.disposition())),
    );
    set(&o, "ran", &JsValue::from_bool(kind.handler_ran()));
    set(&o, "key", &str_or_null(key.as_deref()));
    if let Some(reason) = outcome.reason() {
        set(&o, "reason", &JsValue::from_str(&reason));
    }
    match outcome {
        Outcome::Failed(e) | Outcome::FailOpen(Err(e)) => set(&o, "error", &e.0),
        Outcome::RanUnrecorded(e) | Outcome::StoreUnavailable(e) => {
            let se = Object::new();
            set(&se, "code", &JsValue::from_str(e.kind.code()));
            set(&se, "message", &JsValue::from_str(&e.message));
            set(&o, "storeError", &se);
        }
        Outcome::Rejected(r) => set(&o, "rejection", &rejection_js(&r)),
        _ => {}
    }
    o.into()
}

/// Collects each outcome's store key, in delivery order (the guard reports every
/// outcome, with its key, to its observer).
#[derive(Default)]
struct KeyLog(RefCell<Vec<Option<String>>>);

impl Observer for KeyLog {
    fn observe(&self, event: Event<'_>) {
        if let Event::Outcome { key, .. } = event {
            self.0.borrow_mut().push(key.map(str::to_owned));
        }
    }
}

// ---- the handler ------------------------------------------------------------

async fn call_handler(handler: &Function, msg: &Message<'_>) -> Result<(), HandlerError> {
    let result = handler.call1(&JsValue::UNDEFINED, &envelope_js(msg));
    settle(result).await.map(drop).map_err(HandlerError)
}

fn handler_of(value: JsValue) -> Result<Function, JsValue> {
    value
        .dyn_into::<Function>()
        .map_err(|_| type_error("handler must be a function"))
}

// ---- time ---------------------------------------------------------------------

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(callback: &Function, ms: f64) -> JsValue;
    #[wasm_bindgen(js_name = clearTimeout)]
    fn clear_timeout(id: &JsValue);
}

/// The host's `setTimeout` as the guard's timer: a slow handler is raced against
/// it, so claims are renewed (and finished work written) while it runs.
pub struct JsTimer;

/// Clears a pending timeout when the sleep is dropped (the handler finished
/// first), so no timer outlives the call (and keeps Node running).
struct Pending(JsValue);

impl Drop for Pending {
    fn drop(&mut self) {
        clear_timeout(&self.0);
    }
}

impl Timer for JsTimer {
    async fn sleep(&self, duration: Duration) {
        let mut id = JsValue::UNDEFINED;
        let ms = duration.as_millis() as f64;
        let fired = js_sys::Promise::new(&mut |resolve, _| id = set_timeout(&resolve, ms));
        let _pending = Pending(id);
        let _ = wasm_bindgen_futures::JsFuture::from(fired).await;
    }
}

type JsGuard = Guard<AnyStore, KeyLog, JsTimer>;

fn guard(store: &JsValue, opts: &Option<JsValue>) -> Result<JsGuard, JsValue> {
    let options = options(opts)?;
    let (store, clock) = AnyStore::from_js(store).map_err(|e| type_error(&e))?;
    Ok(Guard::new(store)
        .with_options(options)
        .with_clock(clock)
        .with_timer(JsTimer)
        .with_observer(KeyLog::default()))
}

// ---- exports ----------------------------------------------------------------

/// What one of the promise-returning exports does. They share one future type,
/// so the module carries one copy of the promise glue instead of three.
enum Call {
    One(JsValue),
    Batch(JsValue),
    Forget(String),
}

async fn call(
    call: Call,
    store: JsValue,
    handler: JsValue,
    options: Option<JsValue>,
) -> Result<JsValue, JsValue> {
    let (envelopes, one) = match call {
        Call::Forget(id) => {
            let guard = guard(&store, &options)?;
            return match guard.forget(&id).await {
                Ok(()) => Ok(JsValue::UNDEFINED),
                Err(e) => Err(js_error(&e.to_string())),
            };
        }
        Call::One(envelope) => (vec![envelope], true),
        Call::Batch(envelopes) if js_sys::Array::is_array(&envelopes) => {
            (js_sys::Array::from(&envelopes).to_vec(), false)
        }
        Call::Batch(_) => return Err(type_error("envelopes must be an array")),
    };
    let mut outcomes = run_batch(&envelopes, store, handler, options).await?;
    Ok(match one {
        true => outcomes.pop().unwrap_or(JsValue::UNDEFINED),
        false => outcomes.into_iter().collect::<js_sys::Array>().into(),
    })
}

async fn run_batch(
    envelopes: &[JsValue],
    store: JsValue,
    handler: JsValue,
    options: Option<JsValue>,
) -> Result<Vec<JsValue>, JsValue> {
    let handler = handler_of(handler)?;
    let guard = guard(&store, &options)?;
    // Bodies that cannot become bytes go through as empty text (rejected as
    // not-json by the guard) and get their own reason afterwards.
    let mut unreadable: Vec<(usize, String)> = Vec::new();
    let bodies: Vec<Vec<u8>> = envelopes
        .iter()
        .enumerate()
        .map(|(i, e)| {
            body_of(e).unwrap_or_else(|why| {
                unreadable.push((i, why));
                Vec::new()
            })
        })
        .collect();
    let mut outcomes = guard
        .process_batch(&bodies, async |msg| call_handler(&handler, msg).await)
        .await;
    for (i, why) in unreadable {
        if let Some(o) = outcomes.get_mut(i) {
            *o = Outcome::Rejected(Rejection::NotJson(why));
        }
    }
    let keys = guard.observer().0.take();
    Ok(outcomes
        .into_iter()
        .enumerate()
        .map(|(i, outcome)| outcome_js(outcome, keys.get(i).cloned().flatten()))
        .collect())
}

/// Puts one delivery through the guard: decode, decide, run `handler` if needed,
/// record. Resolves to an `Outcome`; rejects only for a bad argument (not a
/// store, not a function, bad options). The core's batch of one: the same single-key
/// store calls as `Guard::process`, and one code path to ship.
#[wasm_bindgen(unchecked_return_type = "Promise<Outcome>")]
pub fn dedupe(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput")] envelope: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    future_to_promise(call(Call::One(envelope), store, handler, options))
}

/// The old name of `dedupe` (the same function).
///
/// @deprecated Use `dedupe`: `process` shadows Node's global `process`.
#[wasm_bindgen(unchecked_return_type = "Promise<Outcome>")]
pub fn process(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput")] envelope: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    dedupe(envelope, store, handler, options)
}

/// Puts a batch through the guard: one store call to decide, one to record;
/// deliveries sharing an id run at most once. Resolves to one `Outcome` per
/// envelope, in order.
#[wasm_bindgen(js_name = dedupeBatch, unchecked_return_type = "Promise<Outcome[]>")]
pub fn dedupe_batch(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput[]")] envelopes: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    future_to_promise(call(Call::Batch(envelopes), store, handler, options))
}

/// The old name of `dedupeBatch` (the same function).
///
/// @deprecated Use `dedupeBatch` (renamed with `process` -> `dedupe`).
#[wasm_bindgen(js_name = processBatch, unchecked_return_type = "Promise<Outcome[]>")]
pub fn process_batch(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput[]")] envelopes: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    dedupe_batch(envelopes, store, handler, options)
}

/// Forgets a `meta.id` (namespaced by the options' prefix/scope like every key),
/// so its next delivery runs again.
#[wasm_bindgen(unchecked_return_type = "Promise<void>")]
pub fn forget(
    id: String,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    future_to_promise(call(Call::Forget(id), store, JsValue::UNDEFINED, options))
}

/// The store key of an envelope (`meta.id`, namespaced by the options), or `null`
/// when it has no usable id (fail-open). Throws a `RejectionError` (an `Error`
/// with `code` and `rejection`) for an invalid envelope.
#[wasm_bindgen(js_name = dedupeKey, unchecked_return_type = "string | null")]
pub fn dedupe_key(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput")] envelope: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> Result<JsValue, JsValue> {
    let opts = self::options(&options)?;
    let body = body_of(&envelope).map_err(|why| rejection_error(&Rejection::NotJson(why)))?;
    let msg = Message::parse(&body, &opts.limits).map_err(|r| rejection_error(&r))?;
    Ok(str_or_null(
        msg.id().map(|id| opts.keyspace.key(id)).as_deref(),
    ))
}

fn rejection_error(r: &Rejection) -> JsValue {
    let e = js_sys::Error::new(&r.to_string());
    e.set_name("RejectionError");
    set(&e, "code", &JsValue::from_str(r.code()));
    set(&e, "rejection", &rejection_js(r));
    e.into()
}

/// Validates an envelope without touching any store: `{ valid: true, id, key,
/// failOpen, job, traceId, attempts }` or `{ valid: false, rejection }`.
#[wasm_bindgen(unchecked_return_type = "Validation")]
pub fn validate(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput")] envelope: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> Result<JsValue, JsValue> {
    let opts = self::options(&options)?;
    let o = Object::new();
    let parsed = body_of(&envelope)
        .map_err(Rejection::NotJson)
        .and_then(|body| {
            let msg = Message::parse(&body, &opts.limits)?;
            let id = msg.id().map(str::to_owned);
            let key = msg.id().map(|id| opts.keyspace.key(id).into_owned());
            Ok((
                id,
                key,
                msg.job().to_owned(),
                msg.trace_id().to_owned(),
                msg.attempts(),
            ))
        });
    match parsed {
        Ok((id, key, job, trace_id, attempts)) => {
            set(&o, "valid", &JsValue::TRUE);
            set(&o, "failOpen", &JsValue::from_bool(id.is_none()));
            set(&o, "id", &str_or_null(id.as_deref()));
            set(&o, "key", &str_or_null(key.as_deref()));
            set(&o, "job", &JsValue::from_str(&job));
            set(&o, "traceId", &JsValue::from_str(&trace_id));
            set(&o, "attempts", &JsValue::from_f64(attempts as f64));
        }
        Err(r) => {
            set(&o, "valid", &JsValue::FALSE);
            set(&o, "rejection", &rejection_js(&r));
        }
    }
    Ok(o.into())
}
