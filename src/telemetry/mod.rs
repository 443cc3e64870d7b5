//! OpenTelemetry by BabelQueue's convention (feature `telemetry`), written once
//! for every target: the consumer span `process <job>` with the attributes every
//! BabelQueue SDK sets, its remote parent derived as they derive it
//! ([`parent`]), and ours on top: the dedupe outcome of the delivery, which no
//! SDK reports. The names are in one table, [`attr`]; `docs/observability.md`
//! shows them.
//!
//! This module only says *what* a span carries, in plain types; each target
//! hands it to its own tracing API (the `opentelemetry` crate natively, a JS
//! `Tracer` in the package, `cloudflare:workers` tracing in a Worker).

#[cfg(feature = "otel")]
pub mod otel;
pub mod parent;

use std::borrow::Cow;

use crate::envelope::Message;
use crate::outcome::{Disposition, OutcomeKind};

pub use crate::guard::Mode;
pub use parent::Parent;

/// Every attribute name, once.
pub mod attr {
    /// `babelqueue`.
    pub const SYSTEM: &str = "messaging.system";
    /// `process`.
    pub const OPERATION: &str = "messaging.operation";
    /// The envelope's `meta.queue` (`""` when absent).
    pub const DESTINATION: &str = "messaging.destination.name";
    /// The envelope's `meta.id` (`""` when it has no usable id).
    pub const MESSAGE_ID: &str = "messaging.message.id";
    /// The envelope's `trace_id`, as received.
    pub const CONVERSATION_ID: &str = "messaging.message.conversation_id";
    /// The envelope's `attempts` (an int).
    pub const ATTEMPTS: &str = "messaging.babelqueue.attempts";
    /// Ours: the outcome code (`run-ok`, `skip`, `park`, ...).
    pub const OUTCOME: &str = "messaging.babelqueue.dedupe.outcome";
    /// Ours: what the queue is told (`ack`, `retry`, `poison`).
    pub const DISPOSITION: &str = "messaging.babelqueue.dedupe.disposition";
    /// Ours: `true` when the delivery was a duplicate (its id already done,
    /// or an earlier delivery of the same batch), so its handler did not run.
    pub const DUPLICATE: &str = "messaging.babelqueue.dedupe.duplicate";
    /// Ours: the guard's mode (`seen-set`, `claiming`, `transactional`,
    /// `statements`).
    pub const MODE: &str = "messaging.babelqueue.dedupe.mode";
    /// Ours: `true` when this delivery took a claim on its key.
    pub const CLAIMED: &str = "messaging.babelqueue.dedupe.claimed";
    /// Ours, on a store call's span and metric: which call (`seen_many`, ...).
    pub const STORE_OP: &str = "messaging.babelqueue.dedupe.store.operation";
    /// Ours, on a store call's span: how many keys it carried.
    pub const STORE_KEYS: &str = "messaging.babelqueue.dedupe.store.keys";
    /// Ours, on a store call's span and metric: which store (`memory`,
    /// `sqlite`, `redis`, `postgres`, `durable-object`, `kv`, `d1`, ...).
    pub const STORE_KIND: &str = "messaging.babelqueue.dedupe.store.kind";
    /// OpenTelemetry's `error.type`: the outcome code of a failed delivery,
    /// where a span can carry no status (the Workers runtime's spans).
    pub const ERROR_TYPE: &str = "error.type";
}

/// One attribute value, in the types the SDKs use.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    /// A string.
    Str(Cow<'a, str>),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

/// The envelope fields a delivery's span reads: from a decoded [`Message`], or
/// leniently from a body that is not a valid envelope (whatever of them it
/// has; `""` and `0` for the rest, as the SDKs write absent fields).
#[derive(Debug, Clone, Default)]
pub struct Fields<'a> {
    /// `job` (or its alias `urn`).
    pub job: Cow<'a, str>,
    /// `meta.queue`.
    pub queue: Cow<'a, str>,
    /// `meta.id`.
    pub id: Cow<'a, str>,
    /// `trace_id`; `None` when the body has none (its span then starts a trace
    /// of its own unless a `traceparent` came with it).
    pub trace_id: Option<Cow<'a, str>>,
    /// `attempts`.
    pub attempts: i64,
}

impl<'a> Fields<'a> {
    /// A decoded envelope's fields.
    pub fn of(message: &'a Message<'a>) -> Self {
        Fields {
            job: Cow::Borrowed(message.job()),
            queue: queue_of(message.raw()),
            id: Cow::Borrowed(message.id().unwrap_or_default()),
            trace_id: Some(Cow::Borrowed(message.trace_id())),
            attempts: i64::try_from(message.attempts()).unwrap_or(i64::MAX),
        }
    }

    /// What can be read of a body that did not decode (a JSON object with the
    /// wrong shape still names its job and trace); all defaults for one that is
    /// not JSON at all.
    pub fn lenient(raw: &[u8]) -> Fields<'static> {
        // Past the decoder's own limit a body is not read at all: its
        // rejection stays cheap.
        if raw.len() > crate::envelope::Limits::default().max_bytes {
            return Fields::default();
        }
        let Ok(serde_json::Value::Object(body)) = serde_json::from_slice(raw) else {
            return Fields::default();
        };
        let text = |v: Option<&serde_json::Value>| {
            Cow::Owned(v.and_then(|v| v.as_str()).unwrap_or_default().to_owned())
        };
        let meta = body.get("meta");
        Fields {
            job: text(body.get("job").or_else(|| body.get("urn"))),
            queue: text(meta.and_then(|m| m.get("queue"))),
            id: text(meta.and_then(|m| m.get("id"))),
            trace_id: body
                .get("trace_id")
                .and_then(|t| t.as_str())
                .map(|t| Cow::Owned(t.to_owned())),
            attempts: body.get("attempts").and_then(|a| a.as_i64()).unwrap_or(0),
        }
    }

    /// The consumer span's name: `process <job>` (`process ` with no job, as
    /// the SDKs name it).
    pub fn span_name(&self) -> String {
        format!("process {}", self.job)
    }

    /// The attributes every BabelQueue SDK puts on the consumer span, in its
    /// order.
    pub fn attributes(&self) -> Vec<(&'static str, Value<'_>)> {
        let text = |s: &Cow<'_, str>| Value::Str(Cow::Owned(s.to_string()));
        vec![
            (attr::SYSTEM, Value::Str(Cow::Borrowed("babelqueue"))),
            (attr::OPERATION, Value::Str(Cow::Borrowed("process"))),
            (attr::DESTINATION, text(&self.queue)),
            (attr::MESSAGE_ID, text(&self.id)),
            (
                attr::CONVERSATION_ID,
                text(self.trace_id.as_ref().unwrap_or(&Cow::Borrowed(""))),
            ),
            (attr::ATTEMPTS, Value::Int(self.attempts)),
        ]
    }
}

/// Ours: what became of the delivery. `duplicate`: its handler did not run
/// because its id was done or an earlier delivery of its batch had it (a
/// `skip` always is; the guard also knows its in-batch followers).
pub fn outcome_attributes(
    kind: OutcomeKind,
    mode: Mode,
    claimed: bool,
    duplicate: bool,
) -> [(&'static str, Value<'static>); 5] {
    let duplicate = duplicate || kind == OutcomeKind::Skipped;
    ours(kind.code(), kind.disposition(), duplicate, mode, claimed)
}

/// The outcome code of a delivery a host could not have decided because the
/// call into the guard that carried it trapped (the guard in a WebAssembly
/// component): it is retried, never lost.
pub const TRAPPED: &str = "trap";

/// Ours, for a delivery whose call trapped: outcome [`TRAPPED`], disposition
/// `retry`, no duplicate, no claim.
pub fn trapped_attributes(mode: Mode) -> [(&'static str, Value<'static>); 5] {
    ours(TRAPPED, Disposition::Retry, false, mode, false)
}

fn ours(
    code: &'static str,
    disposition: Disposition,
    duplicate: bool,
    mode: Mode,
    claimed: bool,
) -> [(&'static str, Value<'static>); 5] {
    [
        (attr::OUTCOME, Value::Str(Cow::Borrowed(code))),
        (
            attr::DISPOSITION,
            Value::Str(Cow::Borrowed(disposition.code())),
        ),
        (attr::DUPLICATE, Value::Bool(duplicate)),
        (attr::MODE, Value::Str(Cow::Borrowed(mode.code()))),
        (attr::CLAIMED, Value::Bool(claimed)),
    ]
}

/// `meta.queue`, read only when a span asks for it (the hot-path decoder keeps
/// only what the decision needs). `""` when absent or not a string.
fn queue_of(raw: &str) -> Cow<'_, str> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow, default)]
        meta: Option<Meta<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, default)]
        queue: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<Envelope<'_>>(raw)
        .ok()
        .and_then(|e| e.meta?.queue)
        .unwrap_or_default()
}

/// A body with the W3C `traceparent` / `tracestate` its transport carried
/// beside it (never inside the envelope): the delivery's span is then that
/// trace's child.
#[derive(Debug, Clone)]
pub struct WithTraceHeaders<B> {
    /// The delivery's body.
    pub body: B,
    /// The `traceparent` header, if any.
    pub traceparent: Option<String>,
    /// The `tracestate` header, if any.
    pub tracestate: Option<String>,
}

impl<B: crate::envelope::Body> crate::envelope::Body for WithTraceHeaders<B> {
    fn decode(
        &self,
        limits: &crate::envelope::Limits,
    ) -> Result<Message<'_>, crate::envelope::Rejection> {
        self.body.decode(limits)
    }

    fn trace_headers(&self) -> (Option<&str>, Option<&str>) {
        (self.traceparent.as_deref(), self.tracestate.as_deref())
    }

    fn raw(&self) -> &[u8] {
        self.body.raw()
    }
}
