//! The guard's spans and metrics through the vendor-neutral `opentelemetry` API
//! (feature `otel`). No SDK and no exporter here: the program that embeds the
//! guard installs those (the `bq-dedupe` CLI exports over OTLP/HTTP).
//!
//! Why the `opentelemetry` API and not `tracing` with `tracing-opentelemetry`: a
//! delivery's span must start under a remote parent derived from `trace_id` (a
//! span context we build), and the guard also counts and times things; the
//! OpenTelemetry API does both directly, `tracing` has no metrics and sets a
//! parent only through the bridge.

use std::borrow::Cow;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer,
};
use opentelemetry::{Context, KeyValue, global};

use super::{Fields, Mode, Parent, Value, attr, outcome_attributes};
use crate::outcome::OutcomeKind;

/// Where the guard's spans and metrics go: a tracer and the instruments made
/// from a meter. Give it to [`crate::Guard::with_telemetry`].
#[derive(Debug)]
pub struct Telemetry {
    tracer: global::BoxedTracer,
    deliveries: Counter<u64>,
    store_duration: Histogram<f64>,
    batch_size: Histogram<u64>,
}

/// The instrumentation scope's name.
pub const SCOPE: &str = "bq-dedupe";

impl Telemetry {
    /// The globally installed tracer and meter providers
    /// (`opentelemetry::global::set_tracer_provider` / `set_meter_provider`).
    pub fn global() -> Self {
        Self::new(global::tracer(SCOPE), &global::meter(SCOPE))
    }

    /// A tracer (`global::BoxedTracer::new(Box::new(provider.tracer("bq-dedupe")))`
    /// for a provider that is not the global one) and a meter.
    pub fn new(tracer: global::BoxedTracer, meter: &Meter) -> Self {
        Telemetry {
            tracer,
            deliveries: meter
                .u64_counter(metric::DELIVERIES)
                .with_description("Deliveries put through the dedupe guard, by outcome.")
                .build(),
            store_duration: meter
                .f64_histogram(metric::STORE_DURATION)
                .with_unit("s")
                // A store call takes microseconds to milliseconds: the SDK's
                // default buckets (0, 5, 10, ... s) put every call in one.
                .with_boundaries(STORE_DURATION_BUCKETS.to_vec())
                .with_description("How long each dedupe store call took.")
                .build(),
            batch_size: meter
                .u64_histogram(metric::BATCH_SIZE)
                .with_description("Deliveries per batch put through the guard.")
                .build(),
        }
    }

    /// Starts a delivery's CONSUMER span under its remote parent (the
    /// transport's `traceparent`, else one derived from `trace_id`). `None`
    /// message: a body that is not an envelope, in a trace of its own.
    ///
    /// A guard given [`crate::Guard::with_telemetry`] calls this and the
    /// methods below itself. They are public for a host that runs the guard
    /// where it cannot trace (the `bq-dedupe` CLI, whose guard runs in the
    /// WebAssembly component), so its spans are these, not a copy.
    ///
    /// Like every method here, it never panics: a panic inside the tracer or
    /// its exporter loses that span or value, never the delivery.
    pub fn start_delivery(
        &self,
        fields: &Fields<'_>,
        headers: (Option<&str>, Option<&str>),
    ) -> Context {
        // (Not the caller's context on a panic: its span would be ended as
        // the delivery's, a review.)
        quietly(|| self.start_delivery_span(fields, headers)).unwrap_or_default()
    }

    fn start_delivery_span(
        &self,
        fields: &Fields<'_>,
        headers: (Option<&str>, Option<&str>),
    ) -> Context {
        let parent = match (&fields.trace_id, headers.0) {
            (Some(trace_id), _) => Some(Parent::of(trace_id, headers.0, headers.1)),
            (None, Some(traceparent)) => {
                Some(Parent::of("", Some(traceparent), headers.1)).filter(|p| p.from_header)
            }
            (None, None) => None,
        };
        // The caller's context (its baggage, its values) with the delivery's
        // parent in place of its span, as the Node SDK does (an empty one
        // lost the caller's baggage in the handler: a review). Without a
        // parent (an unreadable body, whose handler never runs) a root.
        let parent = match parent {
            Some(parent) => Context::current().with_remote_span_context(span_context(&parent)),
            None => Context::new(),
        };
        let attributes: Vec<KeyValue> = fields.attributes().into_iter().map(key_value).collect();
        let span = self
            .tracer
            .span_builder(fields.span_name())
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span)
    }

    /// Ends a delivery's span with its outcome and counts it: our attributes;
    /// status ERROR with `reason` when the delivery failed; and, when its
    /// handler failed or panicked, an `exception` event as the SDKs record one
    /// (`exception.type`: `error_type`, else the outcome code).
    pub fn end_delivery(&self, span: &Context, end: Ended<'_>) {
        let Ended {
            kind,
            mode,
            claimed,
            duplicate,
            reason,
            error_type,
        } = end;
        let ours = outcome_attributes(kind, mode, claimed, duplicate);
        let error = kind
            .is_failure()
            .then(|| reason.unwrap_or_else(|| kind.code().to_owned()));
        let exception = kind
            .handler_failed()
            .then(|| error_type.unwrap_or(kind.code()));
        quietly(|| self.end(span, ours, error, exception));
    }

    /// Ends the span of a delivery the guard never decided because the call
    /// that carried it trapped ([`super::TRAPPED`]: retried, status ERROR with
    /// `reason`), and counts it.
    pub fn end_trapped(&self, span: &Context, mode: Mode, reason: String) {
        quietly(|| self.end(span, super::trapped_attributes(mode), Some(reason), None));
    }

    fn end(
        &self,
        span: &Context,
        ours: [(&'static str, Value<'static>); 5],
        error: Option<String>,
        exception_type: Option<&str>,
    ) {
        let ours = ours.map(key_value);
        self.deliveries.add(1, &ours[..2]);
        let span = span.span();
        span.set_attributes(ours);
        if let Some(message) = error {
            if let Some(kind) = exception_type {
                span.add_event(
                    "exception",
                    vec![
                        KeyValue::new("exception.type", kind.to_owned()),
                        KeyValue::new("exception.message", message.clone()),
                    ],
                );
            }
            span.set_status(Status::error(message));
        }
        span.end();
    }

    /// Times one store call: a CLIENT span (the child of its delivery's span
    /// when it carries one delivery's keys, else linked to each delivery) and
    /// the latency histogram.
    pub fn store_call(
        &self,
        op: &'static str,
        store: &'static str,
        keys: usize,
        deliveries: &[&Context],
    ) -> StoreCall {
        let labels = || {
            [
                KeyValue::new(attr::STORE_OP, op),
                KeyValue::new(attr::STORE_KIND, store),
            ]
        };
        quietly(|| self.start_store_call(op, labels(), keys, deliveries)).unwrap_or_else(|| {
            StoreCall {
                span: Context::new(),
                started: Started::now(),
                labels: labels(),
            }
        })
    }

    fn start_store_call(
        &self,
        op: &str,
        labels: [KeyValue; 2],
        keys: usize,
        deliveries: &[&Context],
    ) -> StoreCall {
        let mut builder = self
            .tracer
            .span_builder(format!("{SCOPE} {op}"))
            .with_kind(SpanKind::Client)
            .with_attributes(
                labels
                    .iter()
                    .cloned()
                    .chain([KeyValue::new(attr::STORE_KEYS, keys as i64)]),
            );
        let parent = match deliveries {
            [one] => (*one).clone(),
            many => {
                let links = many
                    .iter()
                    .map(|cx| Link::with_context(cx.span().span_context().clone()))
                    .collect();
                builder = builder.with_links(links);
                Context::current()
            }
        };
        let span = builder.start_with_context(&self.tracer, &parent);
        StoreCall {
            span: parent.with_span(span),
            started: Started::now(),
            labels,
        }
    }

    /// Ends a store call's span; an error marks it ERROR.
    pub fn end_store_call(&self, call: StoreCall, error: Option<&dyn std::fmt::Display>) {
        quietly(|| {
            let took = call.started.elapsed();
            self.store_duration.record(took.as_secs_f64(), &call.labels);
            let span = call.span.span();
            if let Some(error) = error {
                span.set_status(Status::error(error.to_string()));
            }
            span.end();
        });
    }

    /// Records a batch's size.
    pub fn batch(&self, size: usize) {
        quietly(|| self.batch_size.record(size as u64, &[]));
    }
}

/// The store-call histogram's bucket boundaries, in seconds: 100 µs to 10 s.
pub const STORE_DURATION_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// What became of a delivery, for [`Telemetry::end_delivery`].
#[derive(Debug)]
pub struct Ended<'a> {
    /// Its outcome.
    pub kind: OutcomeKind,
    /// The guard's mode.
    pub mode: Mode,
    /// Did it hold a claim on its id?
    pub claimed: bool,
    /// Was it an in-batch duplicate (a `skip` always counts as one)?
    pub duplicate: bool,
    /// Why it failed, where it did.
    pub reason: Option<String>,
    /// The handler error's type, for the `exception` event.
    pub error_type: Option<&'a str>,
}

/// The metric names, once.
pub mod metric {
    /// Counter: deliveries, by `messaging.babelqueue.dedupe.outcome` and
    /// `.disposition`.
    pub const DELIVERIES: &str = "messaging.babelqueue.dedupe.deliveries";
    /// Histogram, seconds: each store call, by `.store.operation` and `.store.kind`.
    pub const STORE_DURATION: &str = "messaging.babelqueue.dedupe.store.duration";
    /// Histogram: deliveries per batch.
    pub const BATCH_SIZE: &str = "messaging.babelqueue.dedupe.batch.size";
}

/// A store call in flight ([`Telemetry::store_call`]), to hand to
/// [`Telemetry::end_store_call`].
#[derive(Debug)]
pub struct StoreCall {
    span: Context,
    started: Started,
    labels: [KeyValue; 2],
}

impl StoreCall {
    /// Whether its span is sampled (one the sampler dropped is never exported).
    pub fn is_sampled(&self) -> bool {
        self.span.span().span_context().is_sampled()
    }
}

fn span_context(parent: &Parent) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(parent.trace_id),
        SpanId::from_bytes(parent.span_id),
        TraceFlags::new(parent.flags),
        true,
        trace_state(&parent.trace_state),
    )
}

/// The `tracestate` the crate takes: whole, or where it refuses a member that
/// W3C allows (a vendor system id of 14 characters: it takes 13), the others
/// (one such member cost the whole header: a review).
fn trace_state(header: &str) -> TraceState {
    header.parse().unwrap_or_else(|_| {
        let members = header.split(',').filter_map(|m| m.trim().split_once('='));
        let taken = members.filter(|&m| TraceState::from_key_value([m]).is_ok());
        TraceState::from_key_value(taken).unwrap_or(TraceState::NONE)
    })
}

fn key_value((key, value): (&'static str, Value<'_>)) -> KeyValue {
    match value {
        Value::Str(Cow::Borrowed(s)) => KeyValue::new(key, s.to_owned()),
        Value::Str(Cow::Owned(s)) => KeyValue::new(key, s),
        Value::Int(n) => KeyValue::new(key, n),
        Value::Bool(b) => KeyValue::new(key, b),
    }
}

/// When a store call started: a monotonic clock natively (wall time can step),
/// the API's clock on `wasm32-unknown-unknown`, where `Instant` has no source.
#[derive(Debug)]
struct Started(
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))] std::time::Instant,
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))] std::time::SystemTime,
);

impl Started {
    fn now() -> Self {
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        return Started(std::time::Instant::now());
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        return Started(opentelemetry::time::now());
    }

    fn elapsed(&self) -> std::time::Duration {
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        return self.0.elapsed();
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        return opentelemetry::time::now()
            .duration_since(self.0)
            .unwrap_or_default();
    }
}

/// Runs a telemetry call with its panics caught: an exporter that panics loses
/// its span, never a delivery (a panic after a commit would otherwise unwind
/// past the outcomes and get the batch redelivered).
fn quietly<R>(call: impl FnOnce() -> R) -> Option<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).ok()
}
