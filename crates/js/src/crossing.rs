//! The batch's way in and out of wasm, through the JS half in `glue.js`: the
//! envelopes written into wasm memory by one call, each handler run by one call
//! (the envelope parsed by JS from the caller's own string), the outcome
//! objects built by JS from one buffer of kinds and one string of keys. A
//! crossing costs more than most of the work it carries (a property set, a
//! short string), so the per-delivery crossings are what this module removes.

use std::cell::{Cell, RefCell};

use bq_dedupe::{Message, Outcome, OutcomeKind, envelope::Rejection};
use js_sys::{Array, Function, Object, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::{HandlerError, interned, message_of, rejection_js, set};

#[wasm_bindgen(module = "/src/glue.js")]
extern "C" {
    /// A batch's envelopes on the JS side.
    type Deliveries;

    /// Throws what reading the caller's array threw (a getter, a proxy).
    #[wasm_bindgen(constructor, catch)]
    fn new(envelopes: &Array) -> Result<Deliveries, JsValue>;

    #[wasm_bindgen(static_method_of = Deliveries, catch)]
    fn one(envelope: &JsValue) -> Result<Deliveries, JsValue>;

    #[wasm_bindgen(method, getter)]
    fn length(this: &Deliveries) -> u32;

    /// 0: all written; else the bytes `buf` must hold to go on. Throws what
    /// reading an envelope threw (a `Uint8Array` subclass's getter).
    #[wasm_bindgen(method, catch)]
    fn encode(
        this: &Deliveries,
        buf: &mut [u8],
        ends: &mut [u32],
        kinds: &mut [u8],
    ) -> Result<f64, JsValue>;

    #[wasm_bindgen(method)]
    fn why(this: &Deliveries, i: u32) -> JsValue;

    /// For an envelope given as text.
    #[wasm_bindgen(method, catch, js_name = run)]
    fn run_text(this: &Deliveries, i: u32, handler: &Function) -> Result<JsValue, JsValue>;

    /// For an envelope given as bytes: `body` is its copy the core validated.
    #[wasm_bindgen(method, catch, js_name = run)]
    fn run_bytes(
        this: &Deliveries,
        i: u32,
        handler: &Function,
        body: &[u8],
    ) -> Result<JsValue, JsValue>;

    #[wasm_bindgen(method, catch, js_name = runWithJob)]
    fn run_with_job(this: &Deliveries, handler: &Function, job: &str) -> Result<JsValue, JsValue>;

    #[wasm_bindgen(js_name = defineKind)]
    fn define_kind(index: u8, kind: &JsValue, disposition: &JsValue, ran: bool);

    #[wasm_bindgen(js_name = outcomes)]
    fn outcome_objects(kinds: &[u8], keys: &str, ends: &[u32]) -> Array;

    /// Is this string well-formed UTF-16 (no lone surrogate)?
    #[wasm_bindgen(js_name = wellFormed)]
    pub(crate) fn well_formed(text: &JsValue) -> bool;

    /// `key`: UTF-8 (`ascii`: all below U+0080, read without a `TextDecoder`).
    #[wasm_bindgen(js_name = outcome)]
    fn one_outcome(kind: u8, key: Option<&[u8]>, ascii: bool) -> JsValue;

    /// The host's monotonic time in ms since the epoch (`performance`), or
    /// `Date.now()` where it has none.
    #[wasm_bindgen(js_name = steadyNow)]
    pub(crate) fn steady_now() -> f64;
}

/// `glue.js`: what each envelope became (`encode`'s `kinds`).
const BYTES: u8 = 1;
const NO_BYTES: u8 = 2;
/// `glue.js`: the `ends` entry of an outcome without a key.
const NO_KEY: u32 = u32::MAX;
/// `glue.js`: what `run` answers for an envelope without `job`.
const NEEDS_JOB: f64 = 1.0;

thread_local! {
    /// A batch buffer to reuse (taken while a batch is in flight, so batches
    /// that overlap, awaiting their handlers, each have their own).
    static SPARE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// The outcome kinds `glue.js` has a template for (bit = the kind's index).
    static DEFINED: Cell<u32> = const { Cell::new(0) };
}

/// A batch's envelopes: their bytes in one buffer (written by JS in one call)
/// and, for the handler, the JS side's own copy of the batch.
pub(crate) struct Batch {
    deliveries: Deliveries,
    buf: Vec<u8>,
    /// Each envelope's end offset in `buf`.
    ends: Vec<u32>,
    /// What each envelope was: text, bytes, or none (`glue.js`).
    kinds: Vec<u8>,
}

impl Batch {
    /// Fails with what reading `envelopes` threw.
    pub(crate) fn of(envelopes: &Array) -> Result<Batch, JsValue> {
        Self::encoded(Deliveries::new(envelopes)?)
    }

    pub(crate) fn of_one(envelope: &JsValue) -> Result<Batch, JsValue> {
        Self::encoded(Deliveries::one(envelope)?)
    }

    fn encoded(deliveries: Deliveries) -> Result<Batch, JsValue> {
        // The JS side's count: its copy of the caller's array is the batch.
        let len = deliveries.length() as usize;
        let mut batch = Batch {
            deliveries,
            buf: SPARE.with_borrow_mut(std::mem::take),
            ends: vec![0; len],
            kinds: vec![NO_BYTES; len],
        };
        loop {
            let Batch {
                deliveries,
                buf,
                ends,
                kinds,
            } = &mut batch;
            let needed = deliveries.encode(buf, ends, kinds)?;
            if needed == 0.0 {
                return Ok(batch);
            }
            // The bytes already written stay where they are; growing by half
            // at least keeps a batch of many texts outside ASCII to a few calls.
            let target = (buf.len() + buf.len() / 2).max(needed as usize);
            let grown = needed.is_finite()
                && needed > buf.len() as f64
                && buf.try_reserve_exact(target - buf.len()).is_ok();
            if !grown {
                // (An integer: float formatting would add ~20 KB to the module.)
                let e = js_sys::RangeError::new(&format!(
                    "the batch does not fit in wasm memory ({} bytes needed)",
                    needed as u64
                ));
                return Err(e.into());
            }
            buf.resize(target, 0);
        }
    }

    /// The JS side's copy of the batch (`glue.js`'s `Deliveries`).
    pub(crate) fn deliveries(&self) -> &JsValue {
        &self.deliveries
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Envelope `i`'s bytes (empty for one without: see [`Batch::refused`]).
    pub(crate) fn body(&self, i: usize) -> &[u8] {
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        match self.kinds[i] {
            NO_BYTES => &[],
            _ => self.buf.get(start..self.ends[i] as usize).unwrap_or(&[]),
        }
    }

    /// Each envelope's bytes.
    pub(crate) fn bodies(&self) -> Vec<&[u8]> {
        (0..self.len()).map(|i| self.body(i)).collect()
    }

    /// Why envelope `i` has no bytes (`undefined`, or JSON.stringify would not).
    pub(crate) fn refused(&self, i: usize) -> Option<Rejection> {
        if self.kinds[i] != NO_BYTES {
            return None;
        }
        let why = self.deliveries.why(i as u32);
        let message = match why.as_string() {
            Some(message) => message,
            None => {
                let thrown = js_sys::Reflect::get(&why, interned("thrown")).unwrap_or(why);
                format!("JSON.stringify failed: {}", message_of(&thrown))
            }
        };
        Some(Rejection::NotJson(message))
    }

    /// The body of a batch of one, or why it has none.
    pub(crate) fn only_body(&self) -> Result<&[u8], Rejection> {
        match self.refused(0) {
            Some(r) => Err(r),
            None => Ok(self.body(0)),
        }
    }

    /// Runs `handler` on envelope `i` (which the core decoded as `msg`).
    pub(crate) async fn run(
        &self,
        i: usize,
        handler: &Function,
        msg: &Message<'_>,
    ) -> Result<(), HandlerError> {
        let mut ran = match self.kinds[i] {
            BYTES => self.deliveries.run_bytes(i as u32, handler, self.body(i)),
            _ => self.deliveries.run_text(i as u32, handler),
        };
        if matches!(&ran, Ok(v) if v.as_f64() == Some(NEEDS_JOB)) {
            ran = self.deliveries.run_with_job(handler, msg.job());
        }
        match ran {
            Ok(v) if v.is_undefined() => Ok(()),
            Ok(thenable) => JsFuture::from(Promise::resolve(&thenable))
                .await
                .map(drop)
                .map_err(HandlerError),
            Err(thrown) => Err(HandlerError(thrown)),
        }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // A huge batch's buffer is not kept.
        if buf.len() <= 1 << 20 {
            SPARE.with_borrow_mut(|spare| *spare = buf);
        }
    }
}

/// The outcomes of a batch as JS objects `{ kind, disposition, ran, key, reason?,
/// error?, storeError?, rejection? }`, in order: the four fixed fields built by
/// JS in one call, the rest (only where an outcome has them) set from here.
pub(crate) fn outcomes_js(outcomes: Vec<Outcome<HandlerError>>, keys: &[Option<String>]) -> Array {
    let mut kinds = Vec::with_capacity(outcomes.len());
    let mut text = String::new();
    let mut ends = Vec::with_capacity(outcomes.len());
    let mut at = 0u32;
    for (i, outcome) in outcomes.iter().enumerate() {
        kinds.push(defined(outcome.kind()));
        match keys.get(i).and_then(Option::as_deref) {
            Some(key) => {
                text.push_str(key);
                at += match key.is_ascii() {
                    true => key.len(),
                    false => key.encode_utf16().count(),
                } as u32;
                ends.push(at);
            }
            None => ends.push(NO_KEY),
        }
    }
    let array = outcome_objects(&kinds, &text, &ends);
    for (i, outcome) in outcomes.into_iter().enumerate() {
        if let Some(reason) = outcome.reason() {
            add_details(&array.get(i as u32).unchecked_into(), outcome, &reason);
        }
    }
    array
}

/// One delivery's outcome object (see [`outcomes_js`]), built by one call.
pub(crate) fn outcome_js(outcome: Outcome<HandlerError>, key: Option<&str>) -> JsValue {
    let ascii = key.is_some_and(|k| k.len() <= 256 && k.is_ascii());
    let o: Object =
        one_outcome(defined(outcome.kind()), key.map(str::as_bytes), ascii).unchecked_into();
    if let Some(reason) = outcome.reason() {
        add_details(&o, outcome, &reason);
    }
    o.into()
}

/// The fields beyond the fixed four, for an outcome that has a reason.
fn add_details(o: &Object, outcome: Outcome<HandlerError>, reason: &str) {
    set(o, "reason", &JsValue::from_str(reason));
    match outcome {
        Outcome::Failed(e) | Outcome::FailOpen(Err(e)) => set(o, "error", &e.0),
        Outcome::RanUnrecorded(e) | Outcome::StoreUnavailable(e) => {
            let se = Object::new();
            set(&se, "code", interned(e.kind.code()));
            set(&se, "message", &JsValue::from_str(&e.message));
            set(o, "storeError", &se);
        }
        Outcome::Rejected(r) => set(o, "rejection", &rejection_js(&r)),
        _ => {}
    }
}

/// `kind`'s index, its template defined in `glue.js` on first use.
fn defined(kind: OutcomeKind) -> u8 {
    let index = kind as u8;
    let bit = 1u32 << index;
    if DEFINED.get() & bit == 0 {
        define_kind(
            index,
            interned(kind.code()),
            interned(kind.disposition().code()),
            kind.handler_ran(),
        );
        DEFINED.set(DEFINED.get() | bit);
    }
    index
}
