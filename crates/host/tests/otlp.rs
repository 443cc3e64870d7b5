//! `bq-dedupe run` exports its spans and metrics over OTLP/HTTP: a real receiver
//! in this process (HTTP/1.1 on a std `TcpListener`, `POST /v1/traces` and
//! `/v1/metrics`) decodes the protobuf bodies with the official OpenTelemetry
//! proto definitions, and the spans and metrics are checked as a collector would
//! see them.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};

use bq_dedupe::telemetry::attr;
use bq_dedupe::telemetry::otel::metric;
use bq_dedupe::telemetry::parent::{synthetic_span_id, trace_id_of};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use prost::Message as _;
use serde_json::json;

/// One request the receiver took: its path and body.
type Request = (String, Vec<u8>);

/// An OTLP/HTTP receiver: every request's path and body, answered 200 with an
/// empty (valid) protobuf response.
struct Receiver {
    url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Receiver {
    fn start() -> Self {
        Self::on(TcpListener::bind("127.0.0.1:0").expect("a free port"))
    }

    fn on(listener: TcpListener) -> Self {
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = seen.clone();
                std::thread::spawn(move || serve(stream, &seen));
            }
        });
        Receiver { url, requests }
    }

    fn taken(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// One connection's requests (the exporter keeps it alive between them).
fn serve(stream: TcpStream, seen: &Mutex<Vec<Request>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers = BTreeMap::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').expect("a header");
            headers.insert(name.to_ascii_lowercase(), value.trim().to_owned());
        }
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next().unwrap(), parts.next().unwrap().to_owned());
        assert_eq!(method, "POST", "{request_line}");
        assert_eq!(
            headers.get("content-type").map(String::as_str),
            Some("application/x-protobuf"),
            "OTLP/HTTP protobuf: {headers:?}"
        );
        let length: usize = headers["content-length"].parse().unwrap();
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        seen.lock().unwrap().push((path, body));
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// `bq-dedupe ARGS` with `stdin`, every `OTEL_*` variable of this process
/// removed and `env` set.
fn run(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = common::command();
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("OTEL_")) {
        cmd.env_remove(name);
    }
    common::fed(cmd.args(args).envs(env.iter().copied()), stdin)
}

const TRACE_ID: &str = "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b";
const OTHER_TRACE_ID: &str = "order-flow-42";

fn envelope(id: &str, trace_id: &str, attempts: u32) -> String {
    json!({
        "job": "urn:babel:orders:created", "trace_id": trace_id,
        "data": {"order_id": 1042}, "attempts": attempts,
        "meta": {"id": id, "queue": "orders", "lang": "php", "schema_version": 1}
    })
    .to_string()
}

fn spans_of(requests: &[Request]) -> Vec<Span> {
    requests
        .iter()
        .filter(|(path, _)| path == "/v1/traces")
        .flat_map(|(_, body)| {
            let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("protobuf");
            for resource in &request.resource_spans {
                let resource = resource.resource.as_ref().expect("a resource");
                assert_eq!(
                    value(&resource.attributes, "service.name"),
                    Some(text("bq-dedupe"))
                );
            }
            request
                .resource_spans
                .into_iter()
                .flat_map(|r| r.scope_spans)
                .flat_map(|s| s.spans)
        })
        .collect()
}

fn value(attributes: &[KeyValue], key: &str) -> Option<any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|AnyValue { value }| value)
}

fn text(s: &str) -> any_value::Value {
    any_value::Value::StringValue(s.to_owned())
}

/// The deliveries counter's points, by outcome.
fn deliveries(requests: &[Request]) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (_, body) in requests.iter().filter(|(path, _)| path == "/v1/metrics") {
        let request = ExportMetricsServiceRequest::decode(body.as_slice()).expect("protobuf");
        let metrics = request
            .resource_metrics
            .into_iter()
            .flat_map(|r| r.scope_metrics)
            .flat_map(|s| s.metrics);
        for m in metrics.filter(|m| m.name == metric::DELIVERIES) {
            let Some(Data::Sum(sum)) = m.data else {
                panic!("deliveries is a counter: {m:?}");
            };
            for point in sum.data_points {
                let Some(any_value::Value::StringValue(outcome)) =
                    value(&point.attributes, attr::OUTCOME)
                else {
                    panic!("a point without an outcome: {point:?}");
                };
                let Some(number_data_point::Value::AsInt(n)) = point.value else {
                    panic!("an integer count: {point:?}");
                };
                // Cumulative: the last export holds the total.
                counts.insert(outcome, n);
            }
        }
    }
    counts
}

#[test]
fn run_exports_each_lines_span_its_store_calls_and_the_deliveries_metric() {
    let receiver = Receiver::start();
    // Fails the delivery of id `f`, runs every other one.
    let handler = r#"input=$(cat); case "$input" in *'"id":"f"'*) echo boom >&2; exit 3;; esac"#;
    let input = [
        envelope("a", TRACE_ID, 0),
        envelope("a", TRACE_ID, 1),
        "not json".to_owned(),
        envelope("f", OTHER_TRACE_ID, 0),
    ]
    .join("\n");
    // One batch (an `--exec` run's default is 1), so each store call is
    // linked to every line.
    let out = run(
        &[
            "run", "--store", "memory", "--batch", "100", "--exec", handler,
        ],
        &input,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "one failed delivery: {stderr}");
    let decided: Vec<_> = common::decisions(&out)
        .iter()
        .map(|d| d["outcome"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(decided, ["run-ok", "skip", "rejected", "run-failed"]);

    let requests = receiver.taken();
    let spans = spans_of(&requests);
    let consumers: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Consumer as i32)
        .collect();
    assert_eq!(consumers.len(), 4, "one CONSUMER span per line: {spans:#?}");
    let by_outcome = |outcome: &str| -> &Span {
        consumers
            .iter()
            .find(|s| value(&s.attributes, attr::OUTCOME) == Some(text(outcome)))
            .unwrap_or_else(|| panic!("no span with outcome {outcome}: {consumers:#?}"))
    };

    // The first delivery: BabelQueue's attributes and ours, in the trace the
    // producer's SDK derived from `trace_id`, under its synthetic parent.
    let ran = by_outcome("run-ok");
    assert_eq!(ran.name, "process urn:babel:orders:created");
    let expected = [
        (attr::SYSTEM, text("babelqueue")),
        (attr::OPERATION, text("process")),
        (attr::DESTINATION, text("orders")),
        (attr::MESSAGE_ID, text("a")),
        (attr::CONVERSATION_ID, text(TRACE_ID)),
        (attr::ATTEMPTS, any_value::Value::IntValue(0)),
        (attr::DISPOSITION, text("ack")),
        (attr::DUPLICATE, any_value::Value::BoolValue(false)),
        (attr::MODE, text("seen-set")),
        (attr::CLAIMED, any_value::Value::BoolValue(false)),
    ];
    for (key, want) in expected {
        assert_eq!(value(&ran.attributes, key), Some(want), "{key} on {ran:#?}");
    }
    assert_eq!(ran.trace_id, trace_id_of(TRACE_ID));
    assert_eq!(ran.parent_span_id, synthetic_span_id(TRACE_ID));
    assert_ne!(
        ran.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );

    // The redelivery: a skipped duplicate, in the same trace.
    let skipped = by_outcome("skip");
    assert_eq!(
        value(&skipped.attributes, attr::DUPLICATE),
        Some(any_value::Value::BoolValue(true))
    );
    assert_eq!(
        value(&skipped.attributes, attr::ATTEMPTS),
        Some(any_value::Value::IntValue(1))
    );
    assert_eq!(skipped.trace_id, trace_id_of(TRACE_ID));

    // The line that is not an envelope: `process ` (no job, as the SDKs name
    // it), the SDKs' attributes with their defaults, ERROR, a trace of its own.
    let rejected = by_outcome("rejected");
    assert_eq!(rejected.name, "process ");
    assert_eq!(
        value(&rejected.attributes, attr::SYSTEM),
        Some(text("babelqueue"))
    );
    assert_eq!(
        value(&rejected.attributes, attr::DISPOSITION),
        Some(text("poison"))
    );
    let status = rejected.status.as_ref().expect("a status");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(!status.message.is_empty());

    // The failed handler: ERROR with the handler's error; a `trace_id` that is
    // not a UUID hashed as the SDKs hash it.
    let failed = by_outcome("run-failed");
    let status = failed.status.as_ref().expect("a status");
    assert_eq!(status.code, StatusCode::Error as i32);
    assert!(status.message.contains("boom"), "{status:?}");
    assert!(failed.events.iter().any(|e| e.name == "exception"));
    assert_eq!(failed.trace_id, trace_id_of(OTHER_TRACE_ID));
    assert_eq!(failed.parent_span_id, synthetic_span_id(OTHER_TRACE_ID));
    assert_eq!(
        value(&failed.attributes, attr::DISPOSITION),
        Some(text("retry"))
    );

    // The store calls the host served: CLIENT spans with the store's kind and
    // keys, each linked to every line of the batch.
    let clients: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    assert!(!clients.is_empty(), "store calls are traced: {spans:#?}");
    for call in &clients {
        let Some(any_value::Value::StringValue(op)) = value(&call.attributes, attr::STORE_OP)
        else {
            panic!("a store call without its operation: {call:#?}");
        };
        assert_eq!(call.name, format!("bq-dedupe {op}"));
        assert_eq!(
            value(&call.attributes, attr::STORE_KIND),
            Some(text("memory"))
        );
        assert!(matches!(
            value(&call.attributes, attr::STORE_KEYS),
            Some(any_value::Value::IntValue(n)) if n > 0
        ));
        let linked: Vec<(&[u8], &[u8])> = call
            .links
            .iter()
            .map(|l| (l.trace_id.as_slice(), l.span_id.as_slice()))
            .collect();
        for line in &consumers {
            assert!(
                linked.contains(&(line.trace_id.as_slice(), line.span_id.as_slice())),
                "{} is linked to line span {}: {linked:?}",
                call.name,
                line.name
            );
        }
    }

    // Deliveries by outcome.
    let counted = deliveries(&requests);
    let want: BTreeMap<String, i64> = [
        ("run-ok", 1),
        ("skip", 1),
        ("rejected", 1),
        ("run-failed", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    assert_eq!(counted, want);
}

#[test]
fn run_in_claiming_mode_says_so_and_that_the_line_held_its_claim() {
    let receiver = Receiver::start();
    let out = run(
        &[
            "run",
            "--store",
            "memory",
            "--claim",
            "--otlp-endpoint",
            &receiver.url,
        ],
        &envelope("c", TRACE_ID, 0),
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = spans_of(&receiver.taken());
    let line = spans
        .iter()
        .find(|s| s.kind == SpanKind::Consumer as i32)
        .expect("the line's span");
    assert_eq!(value(&line.attributes, attr::MODE), Some(text("claiming")));
    assert_eq!(
        value(&line.attributes, attr::CLAIMED),
        Some(any_value::Value::BoolValue(true))
    );
    // A batch of one: its store calls are the line's children.
    let calls: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    assert!(
        calls.iter().any(|s| s.name == "bq-dedupe claim_many"),
        "{calls:#?}"
    );
    for call in calls {
        assert_eq!(call.trace_id, line.trace_id);
        assert_eq!(call.parent_span_id, line.span_id);
    }
}

/// An `--exec` handler runs with its line's span as `TRACEPARENT` (the
/// variable OpenTelemetry's SDKs read), so its own spans are that span's
/// children; it had none, and its spans started traces of their own (a
/// review). Without export, the variable is what `run` itself was given.
#[test]
fn an_exec_handler_gets_its_lines_span_as_traceparent() {
    let receiver = Receiver::start();
    let dir = common::scratch("traceparent");
    let seen = dir.join("seen");
    let handler = format!(
        r#"printf '%s
' "$TRACEPARENT" >> '{}'"#,
        seen.display()
    );
    let input = [
        envelope("t-1", TRACE_ID, 0),
        envelope("t-2", OTHER_TRACE_ID, 0),
    ]
    .join(
        "
",
    );
    let out = run(
        &[
            "run", "--store", "memory", "--batch", "10", "--exec", &handler,
        ],
        &input,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
            ("TRACEPARENT", "inherited"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (given, lines) = given_and_lines(&seen, &receiver);
    assert_eq!(
        given, lines,
        "each handler's TRACEPARENT is its line's span"
    );

    std::fs::remove_file(&seen).unwrap();
    let out = run(
        &["run", "--store", "memory", "--exec", &handler],
        &envelope("t-3", TRACE_ID, 0),
        &[("TRACEPARENT", "inherited")],
    );
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "inherited\n");
}

#[test]
fn without_an_endpoint_nothing_is_sent() {
    let input = [envelope("a", TRACE_ID, 0), envelope("a", TRACE_ID, 1)].join("\n");
    // An endpoint set, with the SDK disabled: a receiver there sees nothing.
    let receiver = Receiver::start();
    let out = run(
        &["run", "--store", "memory"],
        &input,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No endpoint, other OTEL_* variables set: nothing is installed, so nothing
    // reaches the default endpoint (localhost:4318) an exporter would use.
    match TcpListener::bind("127.0.0.1:4318") {
        Ok(listener) => {
            let default = Receiver::on(listener);
            let out = run(
                &["run", "--store", "memory"],
                &input,
                &[
                    ("OTEL_SERVICE_NAME", "bq-test"),
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
                ],
            );
            assert!(out.status.success());
            assert_eq!(
                default.taken().len(),
                0,
                "nothing sent to the default endpoint"
            );
        }
        Err(e) => eprintln!("127.0.0.1:4318 is taken ({e}): the default endpoint left unchecked"),
    }
    // The receiver works: the same run with the endpoint set reaches it.
    assert_eq!(receiver.taken().len(), 0, "nothing sent while disabled");
    let out = run(
        &["run", "--store", "memory"],
        &input,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)],
    );
    assert!(out.status.success());
    assert!(
        !receiver.taken().is_empty(),
        "the same run with an endpoint exports"
    );
}

/// An inherited endpoint variable the exporter cannot read (gRPC's scheme-less
/// `host:4317`, a common injected value) is said and ignored, as the OTel
/// SDKs do: the run exited 2 before its first line (a review). The flag is
/// the user's own argument, still an error.
#[test]
fn an_unreadable_endpoint_variable_is_said_and_export_is_off() {
    let line = envelope("bad-endpoint", TRACE_ID, 0);
    for var in ENDPOINT_VARS_FOR_TESTS {
        let out = run(
            &["run", "--store", "memory"],
            &line,
            &[(var, "otel-collector:4317")],
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{var}: {said}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("bad-endpoint"),
            "{var}: {out:?}"
        );
        // (A signal's own variable is taken as it is and fails at export.)
        if var == "OTEL_EXPORTER_OTLP_ENDPOINT" {
            assert!(said.contains("otel-collector:4317"), "{var}: {said}");
        }
    }
    let out = run(
        &[
            "run",
            "--store",
            "memory",
            "--otlp-endpoint",
            "otel-collector:4317",
        ],
        &line,
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

const ENDPOINT_VARS_FOR_TESTS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
];

/// A collector that cannot be reached, with stderr a closed pipe (a
/// supervisor's log stream gone): the export's failure is said where it can
/// be and changes no exit status. `eprintln!` at the end of the run panicked
/// (exit 101; a review).
#[test]
fn an_unreachable_collector_with_stderr_closed_changes_no_exit_status() {
    let closed = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut child = common::command()
        .args(["run", "--store", "memory", "--otlp-endpoint", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bq-dedupe starts");
    drop(child.stderr.take()); // the reader goes away
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", envelope("epipe-otlp", TRACE_ID, 0)).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("epipe-otlp"),
        "{out:?}"
    );
}

/// A run faster than the exporter does not overflow the batch processor's
/// queue (`OTEL_BSP_MAX_QUEUE_SIZE`, here 64), which drops what it cannot hold
/// without a word: two thirds of a fast run's spans were lost, exit 0 (a
/// trial). The run waits for an export instead, and every line's span arrives.
#[test]
fn a_fast_run_loses_no_span_to_the_processors_queue() {
    let receiver = Receiver::start();
    let lines: Vec<String> = (0..3000)
        .map(|i| envelope(&format!("fast-{i}"), TRACE_ID, 0))
        .collect();
    let out = run(
        &["run", "--store", "memory", "--otlp-endpoint", &receiver.url],
        &lines.join("\n"),
        &[("OTEL_BSP_MAX_QUEUE_SIZE", "64")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let spans = spans_of(&receiver.taken());
    let lines_spans = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Consumer as i32)
        .count();
    assert_eq!(lines_spans, 3000, "{stderr}");
    assert!(!stderr.contains("not exported"), "{stderr}");
    // Spans a sampler drops never reach the processor: neither waited for
    // nor said to be lost (each end flushed, and all said lost: a review).
    let out = run(
        &["run", "--store", "memory", "--otlp-endpoint", &receiver.url],
        &lines.join("\n"),
        &[
            ("OTEL_BSP_MAX_QUEUE_SIZE", "64"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("not exported"), "{stderr}");
}

/// Spans that could not be exported are counted on stderr at exit, the run's
/// verdicts and status unchanged.
#[test]
fn spans_an_unreachable_collector_never_took_are_counted_at_exit() {
    let closed = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let lines: Vec<String> = (0..100)
        .map(|i| envelope(&format!("gone-{i}"), TRACE_ID, 0))
        .collect();
    let out = run(
        &["run", "--store", "memory", "--otlp-endpoint", &url],
        &lines.join("\n"),
        &[("OTEL_BSP_MAX_QUEUE_SIZE", "64")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 100);
    assert!(
        stderr.contains("spans were not exported over OTLP"),
        "{stderr}"
    );
}

/// An endpoint the exporter cannot read is quoted in the error: its password
/// and its query (an API key) masked, as store specs are (a trial printed
/// them whole).
#[test]
fn an_unreadable_endpoint_is_said_without_its_credentials() {
    let line = envelope("secret-endpoint", TRACE_ID, 0);
    for (var, value) in [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "user:TopSecret1@collector:4317",
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "collector:4317?api_key=TopSecret2",
        ),
    ] {
        let out = run(&["run", "--store", "memory"], &line, &[(var, value)]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{said}");
        assert!(
            said.contains("collector:4317"),
            "the endpoint is named: {said}"
        );
        assert!(!said.contains("TopSecret"), "{said}");
    }
    let out = run(
        &[
            "run",
            "--store",
            "memory",
            "--otlp-endpoint",
            "user:TopSecret3@collector:4317",
        ],
        &line,
        &[],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("collector:4317"), "{said}");
    assert!(!said.contains("TopSecret"), "{said}");
}

/// Two copies of a line in one batch, the first failing: the copy run again
/// gets its own line's span as TRACEPARENT, not the failed copy's (a trial).
#[test]
fn a_copy_run_again_after_its_first_failed_gets_its_own_span() {
    let receiver = Receiver::start();
    let dir = common::scratch("traceparent-copy");
    let (seen, flag) = (dir.join("seen"), dir.join("fail-once"));
    std::fs::write(&flag, "").unwrap();
    let handler = format!(
        "printf '%s\\n' \"$TRACEPARENT\" >> '{}'; cat > /dev/null; \
         if [ -e '{1}' ]; then rm '{1}'; exit 1; fi",
        seen.display(),
        flag.display()
    );
    let line = envelope("copy-1", TRACE_ID, 0);
    let out = run(
        &[
            "run", "--store", "memory", "--batch", "10", "--exec", &handler,
        ],
        &format!("{line}\n{line}"),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let verdicts = String::from_utf8_lossy(&out.stdout);
    assert!(
        verdicts.contains("run-failed") && verdicts.contains("run-ok"),
        "{verdicts} {stderr}"
    );
    let (given, lines) = given_and_lines(&seen, &receiver);
    assert_eq!(given, lines, "each run under its own line's span");
}

/// The TRACEPARENTs the handlers wrote to `seen`, and each line's span as
/// one, both sorted.
fn given_and_lines(seen: &std::path::Path, receiver: &Receiver) -> (Vec<String>, Vec<String>) {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let mut lines: Vec<String> = spans_of(&receiver.taken())
        .iter()
        .filter(|s| s.kind == SpanKind::Consumer as i32)
        .map(|s| format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)))
        .collect();
    let given = std::fs::read_to_string(seen).unwrap();
    let mut given: Vec<String> = given.lines().map(str::to_owned).collect();
    lines.sort();
    given.sort();
    (given, lines)
}
