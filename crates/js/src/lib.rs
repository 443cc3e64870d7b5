//! The bq-dedupe core for JavaScript (wasm-bindgen): `dedupe`, `dedupeBatch`,
//! `dedupeKey`, `validate`, `forget`, `runConformance` and the `InMemoryStore`
//! class (`process` and `processBatch`: deprecated aliases of the first two). A
//! thin adapter: every decision is the core's [`Guard`]; this crate only turns JS
//! values into the core's inputs (bytes, a [`Store`], a handler) and its
//! [`Outcome`]s into plain JS objects with the core's codes.

#[cfg(feature = "conformance")]
mod conformance;
mod crossing;
mod memory;
mod otel;
pub mod protocol;
mod store;
#[cfg(feature = "testkit")]
mod testkit;
mod types;

// A smaller allocator than std's dlmalloc for the one-threaded wasm module (as
// in the component).
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static TALC: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

use std::cell::{Cell, RefCell};
use std::time::Duration;

use bq_dedupe::observe::Event;
use bq_dedupe::{
    Guard, KeySpace, Message, Observer, Options, Outcome, OutcomeKind, Store, envelope::Limits,
    envelope::Rejection, lease::Timer,
};
use js_sys::{Array, Function, Object};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{JsFuture, future_to_promise};

use crate::crossing::{Batch, outcome_js, outcomes_js};
use crate::store::GivenStore;

pub use memory::JsInMemoryStore;
/// For the Workers build (crates/workers-js): awaiting a handler's value and
/// describing what it threw, as the package does.
pub use store::{await_value, message_of};

// ---- errors -----------------------------------------------------------------

pub(crate) fn type_error(message: &str) -> JsValue {
    js_sys::TypeError::new(message).into()
}

pub(crate) fn js_error(message: &str) -> JsValue {
    js_sys::Error::new(message).into()
}

// ---- crossing the boundary cheaply ---------------------------------------------
//
// A Rust string handed to JS is decoded by a `TextDecoder` call each time, which
// costs more than the property set it is for: property names and codes are made
// into JS strings once (`interned`). A batch's envelopes, handler calls and
// outcome objects cross through `crossing` (one call each way, not one per field).

#[wasm_bindgen]
extern "C" {
    /// `Reflect.set` on an object this module made (it cannot throw: no `catch`).
    #[wasm_bindgen(js_namespace = Reflect, js_name = set)]
    fn reflect_set(target: &JsValue, key: &JsValue, value: &JsValue) -> bool;
}

thread_local! {
    static INTERNED: RefCell<Vec<(&'static str, &'static JsValue)>> = const { RefCell::new(Vec::new()) };
}

/// The JS string for a static Rust string (a name or a code), made once.
pub(crate) fn interned(s: &'static str) -> &'static JsValue {
    INTERNED.with_borrow_mut(|known| {
        if let Some((_, v)) = known.iter().find(|(k, _)| std::ptr::eq(*k, s)) {
            return *v;
        }
        let v: &'static JsValue = Box::leak(Box::new(JsValue::from_str(s)));
        known.push((s, v));
        v
    })
}

pub(crate) fn set(o: &Object, key: &'static str, value: &JsValue) {
    reflect_set(o, interned(key), value);
}

fn str_or_null(s: Option<&str>) -> JsValue {
    s.map_or(JsValue::NULL, JsValue::from_str)
}

// ---- options ----------------------------------------------------------------

/// A property of an options object (`undefined` when absent).
pub(crate) fn prop(o: &JsValue, key: &'static str) -> JsValue {
    js_sys::Reflect::get(o, interned(key)).unwrap_or(JsValue::UNDEFINED)
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

/// `o[key]` when `o` is an object and the value is neither `undefined` nor
/// `null`. A getter that throws is refused: its option was dropped unsaid (a
/// `claimLeaseMs` so lost ran overlapping deliveries twice: a user's trial).
fn opt_prop(o: &JsValue, key: &'static str) -> Result<Option<JsValue>, JsValue> {
    if !o.is_object() {
        return Ok(None);
    }
    let v = js_sys::Reflect::get(o, interned(key)).map_err(|e| {
        let why = store::message_of(&e);
        type_error(&format!("options.{key} could not be read: {why}"))
    })?;
    Ok((!v.is_undefined() && !v.is_null()).then_some(v))
}

/// An optional non-negative number option.
pub(crate) fn opt_number(
    what: &str,
    o: &JsValue,
    key: &'static str,
) -> Result<Option<f64>, JsValue> {
    let Some(v) = opt_prop(o, key)? else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(n) if n.is_finite() && n >= 0.0 => Ok(Some(n)),
        _ => Err(type_error(&format!(
            "{what}.{key} must be a finite non-negative number"
        ))),
    }
}

fn opt_string(o: &JsValue, key: &'static str) -> Result<Option<String>, JsValue> {
    let Some(v) = opt_prop(o, key)? else {
        return Ok(None);
    };
    text(v, &format!("options.{key}")).map(Some)
}

/// A JS string as Rust text. A lone surrogate is refused: converting it would
/// make it U+FFFD, so two different strings would name one key.
pub(crate) fn text(v: JsValue, what: &str) -> Result<String, JsValue> {
    match v.as_string() {
        Some(s) if crossing::well_formed(&v) => Ok(s),
        Some(_) => Err(type_error(&format!(
            "{what} has a lone surrogate (not well-formed UTF-16)"
        ))),
        None => Err(type_error(&format!("{what} must be a string"))),
    }
}

/// 100 years in milliseconds: the longest TTL or lease.
const MAX_MS: f64 = 36_500.0 * 86_400_000.0;

const OPTIONS: &[&str] = &[
    "ttlMs",
    "claimLeaseMs",
    "keyPrefix",
    "scope",
    "maxBytes",
    "tracer",
    "headers",
];

/// The core's options from the JS options object (`undefined`: the defaults).
fn options(o: &Option<JsValue>) -> Result<Options, JsValue> {
    // No options (the common call): no property reads, each a crossing.
    let Some(o) = o else {
        return Ok(Options::default());
    };
    check_options("options", o, OPTIONS)?;
    // A lease of 0 lapses as it is taken, a TTL of 0 forgets at once: refused,
    // as the CLI refuses them; at most 100 years, as the Workers take.
    let ms = |key| match opt_number("options", o, key)? {
        Some(n) if n == 0.0 || n > MAX_MS => Err(type_error(&format!(
            "options.{key} must be more than 0 and at most 100 years"
        ))),
        n => Ok(n.map(|n| Duration::from_millis(n.ceil() as u64))),
    };
    let mut keyspace = KeySpace::new().with_prefix(opt_string(o, "keyPrefix")?.unwrap_or_default());
    if let Some(scope) = opt_string(o, "scope")? {
        keyspace = keyspace
            .with_scope(scope)
            .map_err(|e| type_error(&e.to_string()))?;
    }
    // Checked with or without a tracer, and so by `wrap` when it wraps: it was
    // ignored until a tracer came, then failed every delivery (a review).
    if opt_prop(o, "headers")?.is_some_and(|h| !h.is_object() && !h.is_function()) {
        return Err(type_error(
            "options.headers must be an object, an array or a function",
        ));
    }
    if opt_prop(o, "tracer")?.is_some_and(|t| !store::is_function(&t, "startSpan")) {
        return Err(type_error(
            "options.tracer must be an OpenTelemetry Tracer (trace.getTracer(name))",
        ));
    }
    let limits = match opt_number("options", o, "maxBytes")? {
        Some(n) if n < 1.0 => return Err(type_error("options.maxBytes must be at least 1")),
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

// ---- outcomes ---------------------------------------------------------------

pub(crate) fn rejection_js(r: &Rejection) -> JsValue {
    let o = Object::new();
    set(&o, "code", interned(r.code()));
    set(&o, "message", &JsValue::from_str(&r.to_string()));
    o.into()
}

/// What a JS handler threw (or rejected with), kept unchanged for the outcome.
pub struct HandlerError(pub(crate) JsValue);

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&message_of(&self.0))
    }
}

/// The store key of the outcome the guard reports, for a single delivery
/// (`Guard::process` hands back only the outcome; a batch's keys come with its
/// decisions, so it is off for batches).
#[derive(Default)]
struct LastKey {
    on: Cell<bool>,
    key: RefCell<Option<String>>,
}

impl Observer for LastKey {
    fn observe(&self, event: Event<'_>) {
        if let (true, Event::Outcome { key, .. }) = (self.on.get(), event) {
            *self.key.borrow_mut() = key.map(str::to_owned);
        }
    }
}

// ---- the handler ------------------------------------------------------------

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

pub(crate) type JsGuard = Guard<GivenStore, LastKey, JsTimer>;

pub(crate) fn guard(store: &JsValue, opts: &Option<JsValue>) -> Result<JsGuard, JsValue> {
    let options = options(opts)?;
    let (store, clock) = GivenStore::from_js(store).map_err(|e| type_error(&e))?;
    // A setup mistake, not a store outage: refused here, not reported as
    // `store-unavailable` on every delivery (each one retried).
    let caps = store.capabilities();
    if options.claim_lease.is_some() {
        if !caps.claim {
            return Err(type_error(
                "claimLeaseMs needs store.claim and store.release",
            ));
        }
        if !caps.renew && !WARNED.replace(true) {
            // Said once: a handler past its lease can then run beside a
            // redelivery (each reported run-ok-lease-lost, by the clock alone;
            // an InMemoryStore of another copy of this package is such a store
            // too: used through its methods).
            warn(
                "bq-dedupe: claimLeaseMs with a store that has no renew/rememberFenced \
                 (or settle): a handler slower than the lease can run beside a redelivery",
            );
        }
    }
    Ok(Guard::new(store)
        .with_options(options)
        .with_clock(clock)
        .with_timer(JsTimer)
        .with_observer(LastKey::default()))
}

// ---- exports ----------------------------------------------------------------

/// The promise of `call`. A call whose store and handler answer at once (the
/// in-memory store, a handler that returns no promise) is done in its first
/// poll: its promise is made already settled, without the executor's queue and
/// closures. Otherwise the same future, polled once, is handed to
/// `future_to_promise` and driven from there (a future may be polled again
/// with another waker).
fn promise_of(
    call: impl std::future::Future<Output = Result<JsValue, JsValue>> + 'static,
) -> js_sys::Promise {
    let mut call = Box::pin(call);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match call.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(value)) => js_sys::Promise::resolve(&value),
        std::task::Poll::Ready(Err(e)) => js_sys::Promise::reject(&e),
        std::task::Poll::Pending => future_to_promise(call),
    }
}

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
    let (batch, one) = match call {
        Call::Forget(id) => {
            let guard = guard(&store, &options)?;
            return match guard.forget(&id).await {
                Ok(()) => Ok(JsValue::UNDEFINED),
                Err(e) => Err(js_error(&e.to_string())),
            };
        }
        Call::One(envelope) => (Batch::of_one(&envelope)?, true),
        Call::Batch(envelopes) if Array::is_array(&envelopes) => {
            let envelopes: &Array = envelopes.unchecked_ref();
            // Checked before anything is copied: wasm memory, once grown,
            // is never given back.
            // Read as a property that may throw (a Proxy's getter): its error
            // is then the rejection, from `Batch::of`, never a trap.
            let length = js_sys::Reflect::get(envelopes, interned("length"))
                .ok()
                .and_then(|n| n.as_f64());
            if let Some(n) = length.filter(|&n| n > f64::from(MAX_BATCH)) {
                return Err(js_sys::RangeError::new(&format!(
                    "dedupeBatch takes at most {MAX_BATCH} envelopes, got {}: split the batch",
                    n as u64
                ))
                .into());
            }
            (Batch::of(envelopes)?, false)
        }
        Call::Batch(_) => return Err(type_error("envelopes must be an array")),
    };
    let (mut outcomes, keys) = run_outcomes(&batch, store, handler, options).await?;
    match (one, outcomes.len()) {
        (true, 1) => Ok(outcome_js(outcomes.remove(0), keys[0].as_deref())),
        _ => Ok(outcomes_js(outcomes, &keys).into()),
    }
}

/// The guard's outcomes for a batch, and each one's store key.
async fn run_outcomes(
    batch: &Batch,
    store: JsValue,
    handler: JsValue,
    options: Option<JsValue>,
) -> Result<(Vec<Outcome<HandlerError>>, Vec<Option<String>>), JsValue> {
    let handler = handler_of(handler)?;
    let mut store = store;
    // (Read, and checked, once before: a getter that throws now is no tracer.)
    let tracer = options
        .as_ref()
        .and_then(|o| opt_prop(o, "tracer").ok().flatten());
    if let Some(tracer) = &tracer {
        // A store or options the guard refuses, refused before any span
        // starts (they were left open: a review).
        guard(&store, &options)?;
        store = JsFuture::from(otel::start(tracer, batch, &store, &options)?).await?;
    }
    let guard = guard(&store, &options)?;
    // Envelopes that have no bytes go through as empty text (rejected as
    // not-json by the guard) and get their own reason afterwards.
    let (outcomes, keys): (Vec<_>, Vec<_>) = match batch.len() {
        // One delivery: the core's single-delivery path (fewer allocations);
        // a traced one takes the batch path, whose decision the span reads.
        1 if tracer.is_none() => {
            let body = batch.body(0);
            let run = async |msg: &Message<'_>| batch.run(0, &handler, msg).await;
            guard.observer().on.set(true);
            let mut outcome = guard.process(body, run).await;
            if let Some(refused) = batch.refused(0) {
                outcome = Outcome::Rejected(refused);
            }
            (vec![outcome], vec![guard.observer().key.take()])
        }
        _ => {
            let bodies = batch.bodies();
            let run = async |i, msg: &Message<'_>| batch.run(i, &handler, msg).await;
            let mut processed = guard.process_each(&bodies, run).await;
            for (i, p) in processed.iter_mut().enumerate() {
                if let Some(refused) = batch.refused(i) {
                    p.outcome = Outcome::Rejected(refused);
                }
                if tracer.is_some() {
                    otel::end(batch, i, p);
                }
            }
            processed
                .into_iter()
                .map(|p| (p.outcome, p.decision.key))
                .unzip()
        }
    };
    Ok((outcomes, keys))
}

thread_local! {
    /// Whether the warning of a claiming store that cannot renew was given.
    static WARNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[wasm_bindgen]
extern "C" {
    /// `console.warn`.
    #[wasm_bindgen(js_namespace = console)]
    fn warn(text: &str);
}

/// What a wrapped handler (see [`wrap`]) does with one delivery's outcome:
/// resolve (it ran, or needs not run), or reject with what the handler threw,
/// a `RejectionError`, or an `Error` saying why it did not run. A run that may
/// have a twin (its claim was lost, or its record was not taken) resolves,
/// since it did run, and says so on `console.warn`: never a silent success.
/// `fail_open_said`: whether this wrapped handler said a delivery without a
/// usable id ran undeduped (said once per wrapped handler).
fn wrapped_result(
    outcome: Outcome<HandlerError>,
    key: Option<&str>,
    fail_open_said: &Cell<bool>,
) -> Result<JsValue, JsValue> {
    match outcome {
        Outcome::RanUnrecorded(_) | Outcome::RanLeaseLost => {
            let mut text = String::from("bq-dedupe wrap: ");
            for part in [outcome.kind().code(), " ", key.unwrap_or_default(), ": "] {
                text.push_str(part);
            }
            text.push_str(&outcome.reason().unwrap_or_default());
            warn(&text);
            Ok(JsValue::UNDEFINED)
        }
        // Said once: a number id, which the Node SDK keys as it is, runs on
        // every redelivery here (it was silent: a trial).
        Outcome::FailOpen(Ok(())) => {
            if !fail_open_said.replace(true) {
                let why = OutcomeKind::FailOpen.reason().unwrap_or_default();
                warn(&format!(
                    "bq-dedupe wrap: fail-open: {why}; such a delivery runs again on each \
                     redelivery (said once)"
                ));
            }
            Ok(JsValue::UNDEFINED)
        }
        Outcome::Ran | Outcome::Skipped => Ok(JsValue::UNDEFINED),
        Outcome::Failed(e) | Outcome::FailOpen(Err(e)) => Err(e.0),
        Outcome::Rejected(r) => Err(rejection_error(&r)),
        other => {
            let kind = other.kind().code();
            let why = other.reason().unwrap_or_else(|| kind.into());
            let e = js_sys::Error::new(&format!("{kind}: {why}"));
            e.set_name("DedupeError");
            set(&e, "kind", interned(kind));
            Err(e.into())
        }
    }
}

/// The Node SDK's `Wrap(store, handler)` shape: a handler `(envelope) =>
/// Promise<void>` that runs `handler` once per id. A delivery already processed
/// resolves without running; a handler that throws rejects with what it threw
/// and leaves the id unmarked (so a redelivery runs it again); an envelope
/// without a usable id runs every time. Invalid envelopes reject with a
/// `RejectionError`; a store that cannot answer, a parked claim or a panic
/// reject with a `DedupeError` (`kind` says which). A success the store could
/// not record resolves (the SDK rejects there, which runs the effect again).
#[wasm_bindgen(unchecked_return_type = "(envelope: EnvelopeInput) => Promise<void>")]
pub fn wrap(
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> Result<Function, JsValue> {
    // Bad arguments are a TypeError now, not at the first delivery.
    handler_of(handler.clone())?;
    guard(&store, &options)?;
    let fail_open_said = std::rc::Rc::new(Cell::new(false));
    let wrapped = Closure::<dyn Fn(JsValue) -> js_sys::Promise>::new(move |envelope: JsValue| {
        let (store, handler, options) = (store.clone(), handler.clone(), options.clone());
        let said = fail_open_said.clone();
        promise_of(async move {
            let batch = Batch::of_one(&envelope)?;
            let (outcomes, keys) = run_outcomes(&batch, store, handler, options).await?;
            let key = keys.into_iter().next().flatten();
            match outcomes.into_iter().next() {
                Some(outcome) => wrapped_result(outcome, key.as_deref(), &said),
                None => Err(js_error("dedupe: no outcome")),
            }
        })
    });
    Ok(wrapped.into_js_value().unchecked_into())
}

/// Puts one delivery through the guard: decode, decide, run `handler` if needed,
/// record. Resolves to an `Outcome`; rejects only for a bad argument (not a
/// store, not a function, bad options). The core's `Guard::process`: the
/// store's batch methods with one key where it has them, else its single-key ones.
#[wasm_bindgen(unchecked_return_type = "Promise<Outcome>")]
pub fn dedupe(
    #[wasm_bindgen(unchecked_param_type = "EnvelopeInput")] envelope: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    promise_of(call(Call::One(envelope), store, handler, options))
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

/// The most envelopes one `dedupeBatch` takes (a queue's batch is at most a
/// few hundred; a million-element array took 844 MB of wasm memory that is
/// never given back).
const MAX_BATCH: u32 = 10_000;

/// Puts a batch through the guard: one store call to decide, one to record;
/// deliveries sharing an id run at most once. Resolves to one `Outcome` per
/// envelope, in order.
#[wasm_bindgen(js_name = dedupeBatch, unchecked_return_type = "Promise<Outcome[]>")]
pub fn dedupe_batch(
    #[wasm_bindgen(unchecked_param_type = "readonly EnvelopeInput[]")] envelopes: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Handler")] handler: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    promise_of(call(Call::Batch(envelopes), store, handler, options))
}

/// The old name of `dedupeBatch` (the same function).
///
/// @deprecated Use `dedupeBatch` (renamed with `process` -> `dedupe`).
#[wasm_bindgen(js_name = processBatch, unchecked_return_type = "Promise<Outcome[]>")]
pub fn process_batch(
    #[wasm_bindgen(unchecked_param_type = "readonly EnvelopeInput[]")] envelopes: JsValue,
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
    #[wasm_bindgen(unchecked_param_type = "string")] id: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeStore | InMemoryStore")] store: JsValue,
    #[wasm_bindgen(unchecked_param_type = "DedupeOptions")] options: Option<JsValue>,
) -> js_sys::Promise {
    match text(id, "forget: the id") {
        Ok(id) => promise_of(call(Call::Forget(id), store, JsValue::UNDEFINED, options)),
        Err(e) => js_sys::Promise::reject(&e),
    }
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
    let batch = Batch::of_one(&envelope)?;
    let key = batch.only_body().and_then(|body| key_of(body, &opts));
    Ok(str_or_null(
        key.map_err(|r| rejection_error(&r))?.as_deref(),
    ))
}

/// The store key of an envelope (`None`: no usable id), or why it is not one.
#[inline(never)]
pub(crate) fn key_of(body: &[u8], opts: &Options) -> Result<Option<String>, Rejection> {
    let msg = Message::parse(body, &opts.limits)?;
    Ok(msg.id().map(|id| opts.keyspace.key(id).into_owned()))
}

fn rejection_error(r: &Rejection) -> JsValue {
    let e = js_sys::Error::new(&r.to_string());
    e.set_name("RejectionError");
    set(&e, "code", interned(r.code()));
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
    let batch = Batch::of_one(&envelope)?;
    let parsed = batch.only_body().and_then(|body| {
        let msg = Message::parse(body, &opts.limits)?;
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
