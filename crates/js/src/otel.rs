//! The `tracer` option: BabelQueue's consumer span for each delivery, made
//! through the caller's OpenTelemetry `Tracer` by the JS half (`otel.js`),
//! ended here with what the core decided. Without the option none of this
//! runs: the untraced call pays one property read.

use bq_dedupe::guard::Mode;
use bq_dedupe::telemetry::attr;
use bq_dedupe::{Outcome, Processed};
use js_sys::{Array, Promise};
use wasm_bindgen::prelude::*;

use crate::HandlerError;
use crate::crossing::Batch;

#[wasm_bindgen(module = "/src/otel.js")]
extern "C" {
    #[wasm_bindgen(js_name = startSpans)]
    fn start_spans(
        names: Array,
        tracer: &JsValue,
        deliveries: &JsValue,
        keys: Array,
        mode: &str,
        store: &JsValue,
        memory: bool,
        headers: &JsValue,
    ) -> Promise;
    #[wasm_bindgen(js_name = endSpan)]
    fn end_span(
        deliveries: &JsValue,
        i: u32,
        kind: &str,
        disposition: &str,
        flags: u8,
        reason: Option<String>,
        error: &JsValue,
    );
}

/// The attribute names, in `otel.js`'s order.
const NAMES: [&str; 14] = [
    attr::SYSTEM,
    attr::OPERATION,
    attr::DESTINATION,
    attr::MESSAGE_ID,
    attr::CONVERSATION_ID,
    attr::ATTEMPTS,
    attr::OUTCOME,
    attr::DISPOSITION,
    attr::DUPLICATE,
    attr::MODE,
    attr::CLAIMED,
    attr::STORE_OP,
    attr::STORE_KIND,
    attr::STORE_KEYS,
];

/// Starts the spans of `batch`'s deliveries (kept by its JS side): a promise
/// of the store to hand the guard (`store` with each call traced, unless it is
/// the in-memory store: no round trip, no JS call to trace). Each delivery's
/// store key goes along, to tell which delivery a store call carries.
pub(crate) fn start(
    tracer: &JsValue,
    batch: &Batch,
    store: &JsValue,
    options: &Option<JsValue>,
) -> Result<Promise, JsValue> {
    let opts = crate::options(options)?;
    let keys = (0..batch.len())
        .map(|i| match crate::key_of(batch.body(i), &opts) {
            Ok(Some(key)) => JsValue::from_str(&key),
            _ => JsValue::NULL,
        })
        .collect();
    let mode = match opts.claim_lease {
        Some(_) => Mode::Claiming,
        None => Mode::SeenSet,
    };
    let memory = crate::memory::lookup(store).ok().flatten().is_some();
    let names = NAMES.iter().map(|n| JsValue::from_str(n)).collect();
    // The transport's `traceparent` / `tracestate`, read by `otel.js`.
    let headers = options
        .as_ref()
        .and_then(|o| crate::opt_prop(o, "headers").ok().flatten());
    Ok(start_spans(
        names,
        tracer,
        batch.deliveries(),
        keys,
        mode.code(),
        store,
        memory,
        &headers.unwrap_or_default(),
    ))
}

/// Ends the span of `batch`'s delivery `i` with what became of it.
pub(crate) fn end(batch: &Batch, i: usize, p: &Processed<HandlerError>) {
    let kind = p.outcome.kind();
    let flags = u8::from(p.duplicate())
        | u8::from(p.claimed()) << 1
        | u8::from(kind.is_failure()) << 2
        | u8::from(kind.handler_failed()) << 3;
    let error = match &p.outcome {
        Outcome::Failed(e) | Outcome::FailOpen(Err(e)) => &e.0,
        _ => &JsValue::UNDEFINED,
    };
    end_span(
        batch.deliveries(),
        i as u32,
        kind.code(),
        kind.disposition().code(),
        flags,
        p.outcome.reason(),
        error,
    );
}
