//! `bq-dedupe run`'s spans and metrics, exported over OTLP/HTTP (protobuf).
//!
//! The guard runs inside the WebAssembly component, where it cannot trace, so the
//! host makes its spans with the core's own [`Telemetry`]: one CONSUMER span per
//! input line, under the parent derived from the line's `trace_id`, ended with
//! the component's verdict; one CLIENT span per store call the host serves,
//! linked to the lines of the batch in the component; the core's metrics.
//!
//! [`Otlp::from_env`] installs the official SDK's providers only when an endpoint
//! is configured (`--otlp-endpoint`, `OTEL_EXPORTER_OTLP_ENDPOINT`, or a signal's
//! own `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`); otherwise there is no
//! [`Spans`] in the host state and every hook is one `None` check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context as _, Result};
use bq_dedupe::telemetry::otel::{Ended, SCOPE, StoreCall, Telemetry};
use bq_dedupe::telemetry::{Fields, Mode};
use bq_dedupe::{Message, OutcomeKind, envelope::Limits};
use opentelemetry::Context;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES` gives one.
pub const SERVICE_NAME: &str = "bq-dedupe";

/// The variables that switch export on, each alone.
const ENDPOINT_VARS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
];

/// The installed tracer and meter providers. Dropping it shuts them down, which
/// exports what is still buffered, so a run that ends in an error flushes too.
#[derive(Debug)]
pub struct Otlp {
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    telemetry: Arc<Telemetry>,
    /// `None` when spans are not exported.
    flow: Option<Arc<SpanFlow>>,
}

/// The spans a run ended and the exporter took, so that the run does not
/// outrun the batch processor's queue, which drops what overflows it without a
/// word (two thirds of a fast run's spans, exit 0: a trial), and says at exit
/// how many were not exported.
#[derive(Debug)]
struct SpanFlow {
    provider: SdkTracerProvider,
    exported: Arc<Exported>,
    ended: AtomicU64,
    /// Half the processor's queue (`OTEL_BSP_MAX_QUEUE_SIZE`): the run waits
    /// for an export once that many ended spans are not yet exported.
    flush_at: u64,
    /// A flush failed (the collector is down or slow): from then on spans are
    /// left to the queue, so telemetry never holds up the consumer for long.
    gave_up: AtomicBool,
}

/// What the exporter was given: spans it exported, and spans it failed to.
#[derive(Debug, Default)]
struct Exported {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl SpanFlow {
    fn new(provider: SdkTracerProvider, exported: Arc<Exported>) -> Self {
        let queue = std::env::var("OTEL_BSP_MAX_QUEUE_SIZE")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(2048);
        SpanFlow {
            provider,
            exported,
            ended: AtomicU64::new(0),
            flush_at: (queue / 2).max(1),
            gave_up: AtomicBool::new(false),
        }
    }

    /// One more span ended; waits for an export when the queue is half full.
    fn ended(&self) {
        let ended = self.ended.fetch_add(1, Ordering::Relaxed) + 1;
        let taken =
            self.exported.ok.load(Ordering::Relaxed) + self.exported.failed.load(Ordering::Relaxed);
        if ended.saturating_sub(taken) < self.flush_at || self.gave_up.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = self.provider.force_flush() {
            self.gave_up.store(true, Ordering::Relaxed);
            crate::say(&format!(
                "bq-dedupe: exporting spans over OTLP failed ({e}): from now on the spans the \
                 exporter's queue (OTEL_BSP_MAX_QUEUE_SIZE) cannot hold are dropped"
            ));
        }
    }

    /// How many ended spans were not exported, said on stderr.
    fn report(&self) {
        let ended = self.ended.load(Ordering::Relaxed);
        let lost = ended.saturating_sub(self.exported.ok.load(Ordering::Relaxed));
        if lost > 0 {
            crate::say(&format!(
                "bq-dedupe: {lost} of {ended} spans were not exported over OTLP"
            ));
        }
    }
}

/// The OTLP exporter, counting what it exported and what it failed to.
#[derive(Debug)]
struct Counted<E> {
    exporter: E,
    exported: Arc<Exported>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let result = self.exporter.export(batch).await;
        let counter = match result {
            Ok(()) => &self.exported.ok,
            Err(_) => &self.exported.failed,
        };
        counter.fetch_add(n, Ordering::Relaxed);
        result
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.exporter.set_resource(resource);
    }
}

impl Otlp {
    /// The providers, exporting over OTLP/HTTP, when an endpoint is configured:
    /// `flag` (a base URL as `OTEL_EXPORTER_OTLP_ENDPOINT`, taking precedence
    /// over every variable), else the `OTEL_EXPORTER_OTLP_*` variables; a
    /// signal with no endpoint of its own or in common is not exported.
    /// `None` when none is set, or `OTEL_SDK_DISABLED=true`. The exporters read
    /// the other standard variables themselves (`OTEL_EXPORTER_OTLP_HEADERS`,
    /// `_TIMEOUT`, `_COMPRESSION` and their per-signal forms), the SDK the
    /// resource's (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`), the batch
    /// processor's (`OTEL_BSP_*`) and the metric interval
    /// (`OTEL_METRIC_EXPORT_INTERVAL`).
    pub fn from_env(flag: Option<&str>) -> Result<Option<Otlp>> {
        let set = |var: &str| std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
        let disabled =
            std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let flag = flag.map(|url| url.trim_end_matches('/'));
        if disabled || (flag.is_none() && !ENDPOINT_VARS.iter().any(|v| set(v))) {
            return Ok(None);
        }
        let traces = flag.is_some() || set(ENDPOINT_VARS[0]) || set(ENDPOINT_VARS[1]);
        let metrics = flag.is_some() || set(ENDPOINT_VARS[0]) || set(ENDPOINT_VARS[2]);
        let resource = resource();

        let mut tracer_provider = SdkTracerProvider::builder().with_resource(resource.clone());
        let mut span_exporter = None;
        if traces {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
            if let Some(url) = flag {
                exporter = exporter.with_endpoint(format!("{url}/v1/traces"));
            }
            let exporter = exporter
                .build()
                .context("the OTLP trace exporter's configuration")
                .map_err(|e| masked_endpoints(&e, flag));
            span_exporter = unless_inherited(exporter, flag, "spans")?;
        }
        let mut meter_provider = SdkMeterProvider::builder().with_resource(resource);
        if metrics {
            let mut exporter = opentelemetry_otlp::MetricExporter::builder().with_http();
            if let Some(url) = flag {
                exporter = exporter.with_endpoint(format!("{url}/v1/metrics"));
            }
            let exporter = exporter
                .build()
                .context("the OTLP metric exporter's configuration")
                .map_err(|e| masked_endpoints(&e, flag));
            if let Some(exporter) = unless_inherited(exporter, flag, "metrics")? {
                meter_provider = meter_provider.with_periodic_exporter(exporter);
            }
        }
        let exported = Arc::new(Exported::default());
        let counted = span_exporter.map(|exporter| Counted {
            exporter,
            exported: exported.clone(),
        });
        let spans_exported = counted.is_some();
        if let Some(counted) = counted {
            tracer_provider = tracer_provider.with_batch_exporter(counted);
        }
        let tracer_provider = tracer_provider.build();
        let flow =
            spans_exported.then(|| Arc::new(SpanFlow::new(tracer_provider.clone(), exported)));
        let meter_provider = meter_provider.build();
        let tracer = BoxedTracer::new(Box::new(tracer_provider.tracer(SCOPE)));
        let telemetry = Arc::new(Telemetry::new(tracer, &meter_provider.meter(SCOPE)));
        Ok(Some(Otlp {
            tracer_provider,
            meter_provider,
            telemetry,
            flow,
        }))
    }

    /// The spans of a run in `mode`, for [`crate::runtime::HostState::spans`].
    pub fn spans(&self, mode: Mode) -> Spans {
        Spans {
            telemetry: self.telemetry.clone(),
            mode,
            batch: Vec::new(),
            texts: Vec::new(),
            handed: Vec::new(),
            flow: self.flow.clone(),
        }
    }
}

/// `error` with every configured endpoint in it shown as [`shown_endpoint`]:
/// the exporter quotes an endpoint it cannot read whole, credentials included.
fn masked_endpoints(error: &anyhow::Error, flag: Option<&str>) -> anyhow::Error {
    let mut text = format!("{error:#}");
    let vars = ENDPOINT_VARS
        .iter()
        .filter_map(|var| std::env::var(var).ok());
    for endpoint in flag.map(str::to_owned).into_iter().chain(vars) {
        if !endpoint.is_empty() {
            text = text.replace(&endpoint, &shown_endpoint(&endpoint));
        }
    }
    anyhow::Error::msg(text)
}

/// An OTLP endpoint as it may be printed: a password in its user info and its
/// whole query (where an API key can be) masked.
fn shown_endpoint(endpoint: &str) -> String {
    let shown = crate::shown_spec(endpoint);
    match shown.split_once('?') {
        Some((base, _)) => format!("{base}?***"),
        None => shown,
    }
}

/// An exporter, or, where its configuration came from the environment and
/// cannot be read (gRPC's scheme-less `host:4317`), `None` and a word on
/// stderr, as the OTel SDKs ignore a variable they cannot interpret:
/// telemetry never stops the consumer (it exited 2 before its first line: a
/// review). With `--otlp-endpoint`, the user's own argument, an error.
fn unless_inherited<E>(exporter: Result<E>, flag: Option<&str>, what: &str) -> Result<Option<E>> {
    match (exporter, flag) {
        (Ok(exporter), _) => Ok(Some(exporter)),
        (Err(e), None) => {
            crate::say(&format!("bq-dedupe: {e:#}: {what} are not exported"));
            Ok(None)
        }
        (Err(e), Some(_)) => Err(e),
    }
}

impl Drop for Otlp {
    /// Ends the providers: what is buffered is exported (within the exporters'
    /// timeout). A failure is said on stderr; the run's result stands.
    fn drop(&mut self) {
        let traces = self.tracer_provider.shutdown();
        let metrics = self.meter_provider.shutdown();
        for (what, result) in [("spans", traces), ("metrics", metrics)] {
            if let Err(e) = result {
                crate::say(&format!(
                    "bq-dedupe: exporting {what} over OTLP failed: {e}"
                ));
            }
        }
        if let Some(flow) = &self.flow {
            flow.report();
        }
    }
}

/// The SDK's resource (the variables it reads), named [`SERVICE_NAME`] when they
/// name no service.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder().with_service_name(SERVICE_NAME).build()
    }
}

/// The spans of one run: the core's instruments, the run's mode, and the spans
/// of the lines in the component now (what a store call is linked to).
#[derive(Debug)]
pub struct Spans {
    telemetry: Arc<Telemetry>,
    mode: Mode,
    batch: Vec<Context>,
    /// Each line's text, hashed ([`crate::runtime::envelope_hash`]): which
    /// line's span a handler's envelope runs under.
    texts: Vec<Option<u64>>,
    /// Whose span a handler was given: a copy of a line (the same text) run
    /// again after its first copy failed gets its own.
    handed: Vec<bool>,
    /// `None` when spans are not exported.
    flow: Option<Arc<SpanFlow>>,
}

impl Spans {
    /// Starts the spans of a batch of lines, in order (`None`: a line that is
    /// not UTF-8; a line that is not an envelope has a `process` span in a
    /// trace of its own), and records the batch's size.
    pub fn start_batch<'a>(&mut self, lines: impl IntoIterator<Item = Option<&'a str>>) {
        let limits = Limits::default();
        self.texts.clear();
        self.batch = lines
            .into_iter()
            .map(|text| {
                (self.texts).push(text.map(crate::runtime::envelope_hash));
                let message = text.and_then(|t| Message::parse_str(t, &limits).ok());
                let fields = match (&message, text) {
                    (Some(message), _) => Fields::of(message),
                    (None, text) => Fields::lenient(text.unwrap_or_default().as_bytes()),
                };
                self.telemetry.start_delivery(&fields, (None, None))
            })
            .collect();
        self.handed = vec![false; self.batch.len()];
        self.telemetry.batch(self.batch.len());
    }

    /// Ends the batch's spans, in order, with each line's outcome: its kind
    /// (`None`: its call trapped, see [`Telemetry::end_trapped`]), reason, and
    /// whether it was a duplicate and held a claim (the component's report).
    pub fn end_batch<'a>(
        &mut self,
        outcomes: impl IntoIterator<Item = (Option<OutcomeKind>, Option<&'a str>, bool, bool)>,
    ) {
        for (span, (kind, reason, duplicate, claimed)) in self.batch.drain(..).zip(outcomes) {
            let sampled = span.span().span_context().is_sampled();
            let reason = reason.map(str::to_owned);
            match kind {
                Some(kind) => {
                    let end = Ended {
                        kind,
                        mode: self.mode,
                        claimed,
                        duplicate,
                        reason,
                        error_type: None,
                    };
                    self.telemetry.end_delivery(&span, end)
                }
                None => self
                    .telemetry
                    .end_trapped(&span, self.mode, reason.unwrap_or_default()),
            }
            // Counted while the processor gets it (a sampler's drop never
            // reaches it: counted, each end flushed, a review); checked per
            // span, as a batch can be longer than the queue.
            if let (Some(flow), true) = (&self.flow, sampled) {
                flow.ended();
            }
        }
    }

    /// The trace context a handler of `envelope` runs in, as the variables
    /// OpenTelemetry's SDKs read from a process's environment (`TRACEPARENT`,
    /// `TRACESTATE`): its line's span, so that the handler's own spans are its
    /// children (an `--exec` handler started traces of its own: a review).
    pub fn handler_env(&mut self, envelope: &str) -> Vec<(&'static str, String)> {
        use opentelemetry::propagation::TextMapPropagator as _;
        let hash = Some(crate::runtime::envelope_hash(envelope));
        let copies = || (0..self.texts.len()).filter(|&i| self.texts[i] == hash);
        // The first copy not yet handed out (the copy run again after its
        // first copy failed ran under that one's span: a trial).
        let line = copies()
            .find(|&i| !self.handed[i])
            .or_else(|| copies().next());
        let Some(line) = line else {
            return Vec::new();
        };
        self.handed[line] = true;
        let mut carrier = std::collections::HashMap::new();
        let propagator = opentelemetry_sdk::propagation::TraceContextPropagator::new();
        propagator.inject_context(&self.batch[line], &mut carrier);
        [("TRACEPARENT", "traceparent"), ("TRACESTATE", "tracestate")]
            .into_iter()
            .filter_map(|(var, key)| Some((var, carrier.remove(key)?)))
            .collect()
    }

    /// Starts a store call's span (`op` carrying `keys` keys to a store of
    /// `kind`), linked to the lines of the batch (the child of the one line of
    /// a batch of one).
    pub(crate) fn store_call(
        &self,
        op: &'static str,
        kind: &'static str,
        keys: usize,
    ) -> StoreCall {
        let lines: Vec<&Context> = self.batch.iter().collect();
        self.telemetry.store_call(op, kind, keys, &lines)
    }

    /// Ends a store call's span and records its latency.
    pub(crate) fn end_store_call(&self, call: StoreCall, error: Option<&String>) {
        let error = error.map(|e| e as &dyn std::fmt::Display);
        let sampled = call.is_sampled();
        self.telemetry.end_store_call(call, error);
        // Counted, not waited for: a store call runs inside the component's
        // batch, its claims held and not renewed; the wait comes at the next
        // line's end.
        if let (Some(flow), true) = (&self.flow, sampled) {
            flow.ended.fetch_add(1, Ordering::Relaxed);
        }
    }
}
