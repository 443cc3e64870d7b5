//! Each delivery of a batch as a span in Workers' own traces, through the
//! runtime's tracing API (`tracing.enterSpan` from `cloudflare:workers`,
//! `spans.js`): BabelQueue's consumer span `process <job>` with the SDKs'
//! attributes and ours (the dedupe outcome), from the core's `telemetry`
//! table. The runtime's API takes no parent, no kind and no status: the spans
//! are children of the queue invocation, and a failed delivery says so in its
//! outcome and in `error.type`. Where the runtime traces nothing (`isTraced`
//! false, as on workerd with no trace consumer) no span is kept after the
//! first, so an untraced batch pays one call.

use bq_dedupe::guard::Mode;
use bq_dedupe::telemetry::{Fields, Value, attr, outcome_attributes};
use bq_dedupe::{Disposition, Processed};
use wasm_bindgen::prelude::*;

use crate::consumer::Action;

#[wasm_bindgen(module = "/src/spans.js")]
extern "C" {
    type OpenSpan;

    #[wasm_bindgen(js_name = openSpan)]
    fn open_span(name: &str) -> Option<OpenSpan>;
    #[wasm_bindgen(method, js_name = set)]
    fn set_str(this: &OpenSpan, key: &str, value: &str);
    #[wasm_bindgen(method, js_name = set)]
    fn set_number(this: &OpenSpan, key: &str, value: f64);
    #[wasm_bindgen(method, js_name = set)]
    fn set_bool(this: &OpenSpan, key: &str, value: bool);
    #[wasm_bindgen(method)]
    fn close(this: &OpenSpan);
}

impl OpenSpan {
    fn set(&self, key: &str, value: &Value<'_>) {
        match value {
            Value::Str(s) => self.set_str(key, s),
            // The runtime's attributes are JS numbers (a BigInt throws).
            Value::Int(n) => self.set_number(key, *n as f64),
            Value::Bool(b) => self.set_bool(key, *b),
        }
    }
}

/// The open spans of one batch's deliveries, in order; any left open are
/// closed on drop (a consumer that returned early).
pub(crate) struct BatchSpans {
    spans: Vec<Option<OpenSpan>>,
    mode: Mode,
}

impl BatchSpans {
    /// Opens a span for each body, with what can be read of it.
    pub(crate) fn open(bodies: &[Vec<u8>], mode: Mode) -> Self {
        let mut spans = Vec::new();
        for body in bodies {
            let fields = Fields::lenient(body);
            let Some(span) = open_span(&fields.span_name()) else {
                break;
            };
            for (key, value) in fields.attributes() {
                span.set(key, &value);
            }
            spans.push(Some(span));
        }
        BatchSpans { spans, mode }
    }

    /// Closes each delivery's span with what the guard decided, how it
    /// ended and what the queue was told (`told[i]`, where known: the
    /// outcome's own disposition said `poison` for a message retried without
    /// a dead-letter producer, `retry` for one dead-lettered on its last
    /// attempt; a review).
    pub(crate) fn close<E>(&mut self, processed: &[Processed<E>], told: &[Action]) {
        for (i, (span, p)) in self.spans.iter_mut().zip(processed).enumerate() {
            let Some(span) = span.take() else { continue };
            let kind = p.outcome.kind();
            for (key, value) in outcome_attributes(kind, self.mode, p.claimed(), p.duplicate()) {
                span.set(key, &value);
            }
            if let Some(action) = told.get(i) {
                let disposition = match action {
                    Action::Ack => Disposition::Ack,
                    Action::Retry => Disposition::Retry,
                    Action::DeadLettered => Disposition::Poison,
                };
                span.set_str(attr::DISPOSITION, disposition.code());
            }
            if kind.is_failure() {
                span.set_str(attr::ERROR_TYPE, kind.code());
            }
            span.close();
        }
    }
}

impl Drop for BatchSpans {
    fn drop(&mut self) {
        for span in self.spans.iter().flatten() {
            span.close();
        }
    }
}
