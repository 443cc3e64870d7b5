//! The guard's spans and metrics (feature `otel`), read back from the official
//! OpenTelemetry SDK's in-memory exporters: one CONSUMER span per delivery by
//! BabelQueue's convention, the dedupe outcome on it, store calls as CLIENT
//! spans, the handler's own spans as children, and deliveries counted by outcome.

use std::sync::Arc;
use std::time::Duration;

use bq_dedupe::telemetry::otel::{Telemetry, metric};
use bq_dedupe::telemetry::parent::{hex, synthetic_span_id, trace_id_of};
use bq_dedupe::telemetry::{WithTraceHeaders, attr};
use bq_dedupe::{Guard, InMemoryStore, OutcomeKind, Store, block_on_ready};
use opentelemetry::trace::{SpanKind, Status, Tracer, TracerProvider as _};
use opentelemetry::{Context, Value, global::BoxedTracer};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

struct Recorder {
    spans: InMemorySpanExporter,
    tracer_provider: SdkTracerProvider,
    metrics: InMemoryMetricExporter,
    meter_provider: SdkMeterProvider,
}

impl Recorder {
    fn new() -> Self {
        let spans = InMemorySpanExporter::default();
        let tracer_provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let metrics = InMemoryMetricExporter::default();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .build();
        Recorder {
            spans,
            tracer_provider,
            metrics,
            meter_provider,
        }
    }

    fn telemetry(&self) -> Arc<Telemetry> {
        let tracer = BoxedTracer::new(Box::new(self.tracer_provider.tracer("bq-dedupe")));
        Arc::new(Telemetry::new(
            tracer,
            &opentelemetry::metrics::MeterProvider::meter(&self.meter_provider, "bq-dedupe"),
        ))
    }

    fn spans(&self) -> Vec<SpanData> {
        self.spans.get_finished_spans().expect("spans")
    }

    /// How many values each histogram recorded: (metric name, count).
    fn histogram_counts(&self) -> Vec<(String, u64)> {
        self.meter_provider.force_flush().expect("flush");
        let mut counts = Vec::new();
        for resource in self.metrics.get_finished_metrics().expect("metrics") {
            for scope in resource.scope_metrics() {
                for m in scope.metrics() {
                    let count: u64 = match m.data() {
                        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                            h.data_points().map(|p| p.count()).sum()
                        }
                        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                            h.data_points().map(|p| p.count()).sum()
                        }
                        _ => continue,
                    };
                    counts.push((m.name().to_owned(), count));
                }
            }
        }
        counts.sort();
        counts
    }

    /// A histogram's bucket boundaries.
    fn bounds(&self, name: &str) -> Vec<f64> {
        self.meter_provider.force_flush().expect("flush");
        for resource in self.metrics.get_finished_metrics().expect("metrics") {
            for scope in resource.scope_metrics() {
                for m in scope.metrics().filter(|m| m.name() == name) {
                    if let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() {
                        if let Some(p) = h.data_points().next() {
                            return p.bounds().collect();
                        }
                    }
                }
            }
        }
        panic!("no histogram {name}")
    }

    /// The deliveries counter's points: (outcome code, count).
    fn deliveries(&self) -> Vec<(String, u64)> {
        self.meter_provider.force_flush().expect("flush");
        let mut points = Vec::new();
        for resource in self.metrics.get_finished_metrics().expect("metrics") {
            for scope in resource.scope_metrics() {
                for m in scope.metrics().filter(|m| m.name() == metric::DELIVERIES) {
                    let AggregatedMetrics::U64(MetricData::Sum(sum)) = m.data() else {
                        panic!("deliveries is a u64 counter: {:?}", m.data());
                    };
                    for p in sum.data_points() {
                        let outcome = p
                            .attributes()
                            .find(|kv| kv.key.as_str() == attr::OUTCOME)
                            .map(|kv| kv.value.to_string())
                            .expect("outcome attribute");
                        points.push((outcome, p.value()));
                    }
                }
            }
        }
        points.sort();
        points
    }
}

fn envelope(id: &str, trace_id: &str) -> String {
    format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"{trace_id}","data":{{}},"meta":{{"id":"{id}","queue":"orders","schema_version":1}},"attempts":2}}"#
    )
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn consumer_spans(spans: &[SpanData]) -> Vec<&SpanData> {
    spans
        .iter()
        .filter(|s| s.span_kind == SpanKind::Consumer)
        .collect()
}

#[test]
fn every_delivery_gets_a_consumer_span_with_the_sdks_attributes_and_its_dedupe_outcome() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let trace = "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b";
    let first = envelope("order-1", trace);
    block_on_ready(guard.process(first.as_str(), async |_| Ok::<(), String>(()))).unwrap();
    // A redelivery, an in-batch duplicate and a new id, in one batch.
    let batch = [
        first.clone(),
        envelope("order-2", "not-a-uuid"),
        envelope("order-2", "not-a-uuid"),
    ];
    let outcomes =
        block_on_ready(guard.process_batch(&batch, async |_| Ok::<(), String>(()))).unwrap();
    let kinds: Vec<OutcomeKind> = outcomes.iter().map(|o| o.kind()).collect();
    assert_eq!(
        kinds,
        [OutcomeKind::Skipped, OutcomeKind::Ran, OutcomeKind::Skipped]
    );

    let spans = recorder.spans();
    let deliveries = consumer_spans(&spans);
    assert_eq!(deliveries.len(), 4, "one span per delivery: {spans:#?}");
    let outcomes: Vec<String> = deliveries
        .iter()
        .map(|s| attribute(s, attr::OUTCOME).expect("outcome").to_string())
        .collect();
    assert_eq!(outcomes, ["run-ok", "skip", "run-ok", "skip"]);
    for span in &deliveries {
        assert_eq!(span.name, "process urn:babel:orders:created");
        assert_eq!(
            attribute(span, attr::SYSTEM),
            Some(&Value::from("babelqueue"))
        );
        assert_eq!(
            attribute(span, attr::OPERATION),
            Some(&Value::from("process"))
        );
        assert_eq!(
            attribute(span, attr::DESTINATION),
            Some(&Value::from("orders"))
        );
        assert_eq!(attribute(span, attr::ATTEMPTS), Some(&Value::I64(2)));
        assert_eq!(attribute(span, attr::MODE), Some(&Value::from("seen-set")));
        assert!(span.parent_span_is_remote);
        assert_eq!(span.status, Status::Unset);
    }
    let duplicate: Vec<bool> = deliveries
        .iter()
        .map(|s| attribute(s, attr::DUPLICATE) == Some(&Value::Bool(true)))
        .collect();
    assert_eq!(duplicate, [false, true, false, true]);
    assert_eq!(
        attribute(deliveries[1], attr::MESSAGE_ID),
        Some(&Value::from("order-1"))
    );
    assert_eq!(
        attribute(deliveries[1], attr::CONVERSATION_ID),
        Some(&Value::from(trace))
    );
    // The trace and the remote parent as the SDKs derive them from trace_id.
    for (span, trace_id) in deliveries
        .iter()
        .zip([trace, trace, "not-a-uuid", "not-a-uuid"])
    {
        assert_eq!(
            hex(&span.span_context.trace_id().to_bytes()),
            hex(&trace_id_of(trace_id))
        );
        assert_eq!(
            hex(&span.parent_span_id.to_bytes()),
            hex(&synthetic_span_id(trace_id))
        );
    }
    assert_eq!(
        recorder.deliveries(),
        [("run-ok".to_owned(), 2), ("skip".to_owned(), 2)]
    );
}

#[test]
fn store_calls_are_client_spans_the_child_of_one_delivery_or_linked_to_each() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let one = envelope("solo", "t-solo");
    block_on_ready(guard.process(one.as_str(), async |_| Ok::<(), String>(()))).unwrap();
    let spans = recorder.spans();
    let solo = consumer_spans(&spans)[0].span_context.clone();
    let calls: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_kind == SpanKind::Client)
        .collect();
    let names: Vec<&str> = calls.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["bq-dedupe seen", "bq-dedupe settle"]);
    for call in &calls {
        assert_eq!(call.span_context.trace_id(), solo.trace_id());
        assert_eq!(call.parent_span_id, solo.span_id());
        assert_eq!(
            attribute(call, attr::STORE_KIND),
            Some(&Value::from("memory"))
        );
    }

    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let batch = [
        envelope("a", "t-a"),
        envelope("b", "t-b"),
        envelope("c", "t-c"),
    ];
    block_on_ready(guard.process_batch(&batch, async |_| Ok::<(), String>(()))).unwrap();
    let spans = recorder.spans();
    let deliveries: Vec<_> = consumer_spans(&spans)
        .iter()
        .map(|s| s.span_context.clone())
        .collect();
    let seen = spans
        .iter()
        .find(|s| s.name == "bq-dedupe seen_many")
        .expect("one seen_many");
    assert_eq!(attribute(seen, attr::STORE_KEYS), Some(&Value::I64(3)));
    let linked: Vec<_> = seen.links.iter().map(|l| l.span_context.clone()).collect();
    assert_eq!(
        linked, deliveries,
        "a batch call links every delivery it carries"
    );
    // Two store calls (seen_many, settle) timed; one batch of three.
    assert_eq!(
        recorder.histogram_counts(),
        [
            (metric::BATCH_SIZE.to_owned(), 1),
            (metric::STORE_DURATION.to_owned(), 2)
        ]
    );
    // Buckets a store call's microseconds land apart in (the SDK's default
    // ones start at 5 s: a trial's finding).
    assert_eq!(
        recorder.bounds(metric::STORE_DURATION),
        bq_dedupe::telemetry::otel::STORE_DURATION_BUCKETS
    );

    // The settle links the deliveries it writes, not one that failed (it
    // linked every delivery that ran: a trial's finding).
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let batch = [envelope("ok", "t-ok"), envelope("fails", "t-fails")];
    block_on_ready(guard.process_batch(&batch, async |m| match m.id() {
        Some("fails") => Err("told to".to_owned()),
        _ => Ok(()),
    }))
    .unwrap();
    let spans = recorder.spans();
    let ok = consumer_spans(&spans)
        .into_iter()
        .find(|s| attribute(s, "messaging.message.id") == Some(&Value::from("ok")))
        .expect("the ok delivery's span")
        .span_context
        .clone();
    let settle = spans
        .iter()
        .find(|s| s.name == "bq-dedupe settle")
        .expect("one settle");
    assert_eq!(attribute(settle, attr::STORE_KEYS), Some(&Value::I64(1)));
    // One delivery carried: its span is the call's parent, nothing linked.
    assert!(settle.links.is_empty(), "{:?}", settle.links);
    assert_eq!(settle.parent_span_id, ok.span_id());
}

#[test]
fn a_failed_handler_or_a_bad_body_is_an_error_span_and_the_handlers_spans_are_children() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new())
        .with_claiming(Duration::from_secs(30))
        .with_telemetry(recorder.telemetry());
    let tracer = recorder.tracer_provider.tracer("handler");
    let body = envelope("boom", "t-boom");
    let outcome = block_on_ready(guard.process(body.as_str(), async |_| {
        let _child = tracer.start_with_context("charge card", &Context::current());
        Err::<(), String>("card declined".into())
    }))
    .unwrap();
    assert_eq!(outcome.kind(), OutcomeKind::Failed);
    let rejected =
        block_on_ready(guard.process("{not json", async |_| Ok::<(), String>(()))).unwrap();
    assert_eq!(rejected.kind(), OutcomeKind::Rejected);

    let spans = recorder.spans();
    let deliveries = consumer_spans(&spans);
    let failed = deliveries[0];
    assert!(
        matches!(failed.status, Status::Error { .. }),
        "{:?}",
        failed.status
    );
    assert_eq!(
        attribute(failed, attr::MODE),
        Some(&Value::from("claiming"))
    );
    assert_eq!(attribute(failed, attr::CLAIMED), Some(&Value::Bool(true)));
    assert_eq!(failed.events.len(), 1, "the exception event");
    let event = failed.events.iter().next().unwrap();
    assert_eq!(event.name, "exception");
    let event_attr = |key: &str| {
        event
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(
        event_attr("exception.type").as_deref(),
        Some(std::any::type_name::<String>())
    );
    assert_eq!(
        event_attr("exception.message").as_deref(),
        Some(OutcomeKind::Failed.code())
    );
    let child = spans
        .iter()
        .find(|s| s.name == "charge card")
        .expect("the handler's span");
    assert_eq!(child.parent_span_id, failed.span_context.span_id());
    assert_eq!(
        child.span_context.trace_id(),
        failed.span_context.trace_id()
    );

    let bad = deliveries[1];
    assert_eq!(
        bad.name, "process ",
        "the SDKs' name for a delivery with no job"
    );
    assert_eq!(
        attribute(bad, attr::SYSTEM),
        Some(&Value::from("babelqueue"))
    );
    assert_eq!(attribute(bad, attr::MESSAGE_ID), Some(&Value::from("")));
    assert_eq!(attribute(bad, attr::ATTEMPTS), Some(&Value::I64(0)));
    assert_eq!(
        attribute(bad, attr::OUTCOME),
        Some(&Value::from("rejected"))
    );
    assert!(matches!(&bad.status, Status::Error { description } if !description.is_empty()));
}

/// The caller's context (its baggage, its values) is the base of the
/// delivery's: the handler runs with it, only its span replaced by the
/// delivery span, as the Node SDK and our JS package do. It started from an
/// empty context, the caller's baggage gone inside the handler (a review).
#[test]
fn the_handler_keeps_the_callers_context_values() {
    #[derive(Debug, PartialEq)]
    struct Tenant(u32);
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let _caller = Context::current_with_value(Tenant(7)).attach();
    let mut seen = Vec::new();
    let bodies = [envelope("cx-1", "t-1"), "not json".to_string()];
    block_on_ready(guard.process(bodies[0].as_str(), async |_| {
        seen.push(Context::current().get::<Tenant>().map(|t| t.0));
        Ok::<(), String>(())
    }))
    .unwrap();
    assert_eq!(seen, [Some(7)]);
    // No parent to take (the body unreadable): a root span still.
    block_on_ready(guard.process(bodies[1].as_str(), async |_| Ok::<(), String>(()))).unwrap();
    let spans = recorder.spans();
    let unread = consumer_spans(&spans)[1];
    assert_eq!(unread.parent_span_id, opentelemetry::trace::SpanId::INVALID);
}

/// A member the opentelemetry crate refuses (a vendor system id of 14
/// characters, which W3C and `@opentelemetry/api` allow) costs that member,
/// not the whole tracestate (it was dropped whole: a review).
#[test]
fn a_member_the_crate_refuses_costs_only_itself() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let body = WithTraceHeaders {
        body: envelope("ts-14", "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b"),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        tracestate: Some("congo=t61rcWkgMzE,t@abcdefghijklmn=v,rojo=00f067aa0ba902b7".into()),
    };
    block_on_ready(guard.process(&body, async |_| Ok::<(), String>(()))).unwrap();
    let spans = recorder.spans();
    let state = consumer_spans(&spans)[0]
        .span_context
        .trace_state()
        .header();
    assert!(state.contains("congo=t61rcWkgMzE"), "{state:?}");
    assert!(state.contains("rojo=00f067aa0ba902b7"), "{state:?}");
}

#[test]
fn a_traceparent_beside_the_body_is_the_parent() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let body = WithTraceHeaders {
        body: envelope("tp", "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b"),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        tracestate: Some("congo=t61rcWkgMzE".into()),
    };
    block_on_ready(guard.process(&body, async |_| Ok::<(), String>(()))).unwrap();
    let spans = recorder.spans();
    let span = consumer_spans(&spans)[0];
    assert_eq!(
        hex(&span.span_context.trace_id().to_bytes()),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(hex(&span.parent_span_id.to_bytes()), "00f067aa0ba902b7");
    assert_eq!(
        span.span_context.trace_state().header(),
        "congo=t61rcWkgMzE"
    );
}

#[test]
fn without_telemetry_nothing_is_recorded_even_with_global_providers() {
    let recorder = Recorder::new();
    opentelemetry::global::set_tracer_provider(recorder.tracer_provider.clone());
    let guard = Guard::new(InMemoryStore::new());
    let bodies = [envelope("quiet", "t-quiet"), envelope("quiet", "t-quiet")];
    let processed =
        block_on_ready(guard.process_each(&bodies, async |_, _| Ok::<(), String>(()))).unwrap();
    assert!(processed.iter().all(|p| !p.decision.span.is_recording()));
    assert_eq!(processed[1].outcome.kind(), OutcomeKind::Skipped);
    assert!(recorder.spans().is_empty());
    // The same providers, given: now it records (so the check above can fail).
    let traced = Guard::new(InMemoryStore::new()).with_telemetry(Telemetry::global());
    block_on_ready(traced.process_each(&bodies, async |_, _| Ok::<(), String>(()))).unwrap();
    assert_eq!(consumer_spans(&recorder.spans()).len(), 2);
}

#[test]
fn a_traceparent_survives_a_batch_of_references() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let body = WithTraceHeaders {
        body: envelope("ref", "t-ref"),
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        tracestate: None,
    };
    block_on_ready(guard.process_batch(&[&body], async |_| Ok::<(), String>(()))).unwrap();
    let spans = recorder.spans();
    let span = consumer_spans(&spans)[0];
    assert_eq!(hex(&span.parent_span_id.to_bytes()), "00f067aa0ba902b7");
}

/// An exporter that panics on every span.
#[derive(Debug)]
struct Panicking;

impl opentelemetry_sdk::trace::SpanExporter for Panicking {
    async fn export(&self, _: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        panic!("exporter bug")
    }
}

#[test]
fn an_exporter_that_panics_loses_its_spans_never_a_delivery() {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(Panicking)
        .build();
    let meter = opentelemetry::metrics::MeterProvider::meter(&SdkMeterProvider::default(), "x");
    let telemetry = Telemetry::new(
        BoxedTracer::new(Box::new(provider.tracer("bq-dedupe"))),
        &meter,
    );
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(telemetry);
    let body = envelope("boom-export", "t-boom");
    let mut runs = 0;
    for _ in 0..2 {
        let outcome = block_on_ready(guard.process(body.as_str(), async |_| {
            runs += 1;
            Ok::<(), String>(())
        }))
        .unwrap();
        let _ = outcome;
    }
    assert_eq!(
        runs, 1,
        "the first run was committed despite the exporter's panics"
    );
}

#[test]
fn telemetry_changes_no_outcome_and_no_store_state() {
    let bodies = [
        envelope("x1", "t1"),
        envelope("x2", "t2"),
        envelope("x1", "t1"),
        "{broken".to_owned(),
        envelope("x3", "t3"),
    ];
    let run = |guard: &Guard<InMemoryStore>| {
        block_on_ready(guard.process_batch(&bodies, async |m| match m.id() {
            Some("x2") => Err("no".to_owned()),
            _ => Ok(()),
        }))
        .unwrap()
        .iter()
        .map(|o| o.kind())
        .collect::<Vec<_>>()
    };
    let recorder = Recorder::new();
    let plain = Guard::new(InMemoryStore::new()).with_claiming(Duration::from_secs(30));
    let traced = Guard::new(InMemoryStore::new())
        .with_claiming(Duration::from_secs(30))
        .with_telemetry(recorder.telemetry());
    for _ in 0..2 {
        assert_eq!(run(&plain), run(&traced));
    }
    for id in ["x1", "x2", "x3"] {
        assert_eq!(
            block_on_ready(plain.store().seen(id)).unwrap().unwrap(),
            block_on_ready(traced.store().seen(id)).unwrap().unwrap(),
            "{id}"
        );
    }
    assert_eq!(consumer_spans(&recorder.spans()).len(), 2 * bodies.len());
}

#[test]
fn an_in_batch_follower_is_a_duplicate_even_when_its_leader_failed() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    let bodies = [envelope("twice", "t-2"), envelope("twice", "t-2")];
    let outcomes =
        block_on_ready(guard.process_batch(&bodies, async |_| Err::<(), String>("no".into())))
            .unwrap();
    assert_eq!(
        outcomes[1].kind(),
        OutcomeKind::Parked,
        "the follower waits for its leader's retry"
    );
    let spans = recorder.spans();
    let deliveries = consumer_spans(&spans);
    assert_eq!(
        attribute(deliveries[0], attr::DUPLICATE),
        Some(&Value::Bool(false))
    );
    assert_eq!(
        attribute(deliveries[1], attr::DUPLICATE),
        Some(&Value::Bool(true))
    );
    assert_eq!(
        attribute(deliveries[1], attr::OUTCOME),
        Some(&Value::from("park"))
    );
}

#[test]
fn a_rejected_envelope_keeps_the_trace_and_fields_it_names() {
    let recorder = Recorder::new();
    let guard = Guard::new(InMemoryStore::new()).with_telemetry(recorder.telemetry());
    // A future schema version: rejected, but its job, id and trace are readable.
    let body = envelope("v2", "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b")
        .replace(r#""schema_version":1"#, r#""schema_version":2"#);
    let outcome =
        block_on_ready(guard.process(body.as_bytes(), async |_| Ok::<(), String>(()))).unwrap();
    assert_eq!(outcome.kind(), OutcomeKind::Rejected);
    let spans = recorder.spans();
    let span = consumer_spans(&spans)[0];
    assert_eq!(span.name, "process urn:babel:orders:created");
    assert_eq!(attribute(span, attr::MESSAGE_ID), Some(&Value::from("v2")));
    assert_eq!(
        attribute(span, attr::DESTINATION),
        Some(&Value::from("orders"))
    );
    assert_eq!(attribute(span, attr::ATTEMPTS), Some(&Value::I64(2)));
    assert_eq!(
        hex(&span.span_context.trace_id().to_bytes()),
        "7b3f9c2ae41d4f889b2a1c0d5e6f7a8b"
    );
    assert!(span.parent_span_is_remote);
}
