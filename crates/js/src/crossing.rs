//! The batch's way in and out of wasm, through the JS half in `glue.js`: the
//! envelopes written into wasm memory by one call, each handler run by one call
//! (the envelope parsed by JS from the caller's own string), the outcome
//! objects built by JS from one buffer of kinds and one string of keys. A
//! crossing costs more than most of the work it carries (a property set, a
//! short string), so the per-delivery crossings are what this module removes.

use std::cell::{Cell, RefCell};

use bq_dedupe::{Message, Outcome, OutcomeKind, Rejection};
use js_sys::{Array, Function, Object, Promise};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

use crate::{HandlerError, disposition_code, interned, message_of, rejection_js, set};

#[wasm_bindgen(module = "/src/glue.js")]
extern "C" {
    /// A batch's envelopes on the JS side.
    type Deliveries;

    #[wasm_bindgen(constructor)]
    fn new(envelopes: &Array) -> Deliveries;

    #[wasm_bindgen(static_method_of = Deliveries)]
    fn one(envelope: &JsValue) -> Deliveries;

    /// 0: all written; else the bytes `buf` must hold to go on.
    #[wasm_bindgen(method)]
    fn encode(this: &Deliveries, buf: &mut [u8], ends: &mut [u32]) -> f64;

    #[wasm_bindgen(method)]
    fn why(this: &Deliveries, i: u32) -> JsValue;

    #[wasm_bindgen(method, catch)]
    fn run(this: &Deliveries, i: u32, handler: &Function) -> Result<JsValue, JsValue>;

    #[wasm_bindgen(method, catch, js_name = runWithJob)]
    fn run_with_job(this: &Deliveries, handler: &Function, job: &str) -> Result<JsValue, JsValue>;

    #[wasm_bindgen(js_name = defineKind)]
    fn define_kind(index: u8, kind: &JsValue, disposition: &JsValue, ran: bool);

    #[wasm_bindgen(js_name = outcomes)]
    fn outcome_objects(kinds: &[u8], keys: &str, ends: &[u32]) -> Array;

    /// `key`: UTF-8 (`ascii`: all below U+0080, read without a `TextDecoder`).
    #[wasm_bindgen(js_name = outcome)]
    fn one_outcome(kind: u8, key: Option<&[u8]>, ascii: bool) -> JsValue;
}

/// `glue.js`: `ends` entries of envelopes without bytes, and of `null` keys.
const NO_BYTES: u32 = 0x8000_0000;
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
/// and, for the handler, the JS side's own texts.
pub(crate) struct Batch {
    deliveries: Deliveries,
    buf: Vec<u8>,
    /// Each envelope's end offset in `buf`, `NO_BYTES` set where it has none.
    ends: Vec<u32>,
}

impl Batch {
    pub(crate) fn of(envelopes: &Array) -> Batch {
        Self::encoded(Deliveries::new(envelopes), envelopes.length() as usize)
    }

    pub(crate) fn of_one(envelope: &JsValue) -> Batch {
        Self::encoded(Deliveries::one(envelope), 1)
    }

    fn encoded(deliveries: Deliveries, len: usize) -> Batch {
        let mut buf = SPARE.with_borrow_mut(std::mem::take);
        let mut ends = vec![0; len];
        loop {
            let needed = deliveries.encode(&mut buf, &mut ends) as usize;
            if needed == 0 {
                break;
            }
            // The bytes already written stay where they are.
            buf.resize(needed.max(buf.len() * 2), 0);
        }
        Batch {
            deliveries,
            buf,
            ends,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Each envelope's bytes (empty for one without: see [`Batch::refused`]).
    pub(crate) fn bodies(&self) -> Vec<&[u8]> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let body = match end & NO_BYTES {
                    0 => &self.buf[start..end as usize],
                    _ => &[][..],
                };
                start = (end & !NO_BYTES) as usize;
                body
            })
            .collect()
    }

    /// Why envelope `i` has no bytes (`undefined`, or JSON.stringify would not).
    pub(crate) fn refused(&self, i: usize) -> Option<Rejection> {
        if self.ends[i] & NO_BYTES == 0 {
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
            None => Ok(&self.buf[..self.ends[0] as usize]),
        }
    }

    /// Runs `handler` on envelope `i` (which the core decoded as `msg`).
    pub(crate) async fn run(
        &self,
        i: usize,
        handler: &Function,
        msg: &Message<'_>,
    ) -> Result<(), HandlerError> {
        let mut ran = self.deliveries.run(i as u32, handler);
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
            None => ends.push(NO_BYTES),
        }
    }
    let array = outcome_objects(&kinds, &text, &ends);
    for (i, outcome) in outcomes.into_iter().enumerate() {
        if outcome.reason().is_some() {
            add_details(&array.get(i as u32).unchecked_into(), outcome);
        }
    }
    array
}

/// One delivery's outcome object (see [`outcomes_js`]), built by one call.
pub(crate) fn outcome_js(outcome: Outcome<HandlerError>, key: Option<&str>) -> JsValue {
    let ascii = key.is_some_and(|k| k.len() <= 256 && k.is_ascii());
    let o: Object =
        one_outcome(defined(outcome.kind()), key.map(str::as_bytes), ascii).unchecked_into();
    if outcome.reason().is_some() {
        add_details(&o, outcome);
    }
    o.into()
}

/// The fields beyond the fixed four, for an outcome that has a reason.
fn add_details(o: &Object, outcome: Outcome<HandlerError>) {
    if let Some(reason) = outcome.reason() {
        set(o, "reason", &JsValue::from_str(&reason));
    }
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
            interned(disposition_code(kind.disposition())),
            kind.handler_ran(),
        );
        DEFINED.set(DEFINED.get() | bit);
    }
    index
}
