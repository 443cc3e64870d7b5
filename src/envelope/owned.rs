//! The full, owned envelope: every field, unknown ones preserved, serializable back.

use serde::Serialize;
use serde_json::{Map, Value};

use super::{Limits, Message, Rejection};

/// A validated BabelQueue envelope with all of its fields.
///
/// `urn` on input is read as `job`; output always writes the canonical `job`. Unknown
/// top-level fields stay in [`Envelope::extra`]; unknown `meta`, `data` and
/// `dead_letter` fields stay in their maps. Serializing writes them all back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope {
    /// The message URN.
    pub job: String,
    /// The causal-chain id.
    pub trace_id: String,
    /// The business payload.
    pub data: Map<String, Value>,
    /// Producer metadata: `id`, `queue`, `lang`, `schema_version`, `created_at`, ...
    pub meta: Map<String, Value>,
    /// The transport's retry counter.
    pub attempts: u64,
    /// Present only on dead-lettered messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<Map<String, Value>>,
    /// Unknown top-level fields, kept as they came.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Envelope {
    /// Decodes and validates an envelope (same rules and limits as [`Message::parse`]).
    ///
    /// Validated by the reference decoder alone (serde_json), never the native fast
    /// path, so this and [`Message::parse`] are two independent decoders that the
    /// `decode` fuzz target and `tests/decode_fast.rs` hold to the same answers.
    pub fn decode(raw: &[u8], limits: &Limits) -> Result<Envelope, Rejection> {
        Message::parse_reference(raw, limits)?.envelope()
    }

    /// Builds the owned form of text that [`Message::parse`] already accepted, so
    /// every typed field below is known to be present and well-typed.
    pub(super) fn from_validated(raw: &str) -> Result<Envelope, Rejection> {
        let mut top = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(Rejection::NotAnObject),
            Err(e) => return Err(Rejection::from_json_error(&e)),
        };
        let job = match top.remove("job") {
            Some(Value::String(job)) if !job.trim().is_empty() => job,
            // `job` not a non-blank string: the alias was used (and is written
            // as `job`). If both came, `urn` stays in `extra`.
            _ => match top.remove("urn") {
                Some(Value::String(urn)) => urn,
                _ => return Err(Rejection::MissingJob),
            },
        };
        let trace_id = match top.remove("trace_id") {
            Some(Value::String(t)) => t,
            _ => return Err(Rejection::BlankTraceId),
        };
        let data = match top.remove("data") {
            Some(Value::Object(d)) => d,
            other => {
                return Err(Rejection::DataNotObject {
                    found: other.map_or_else(|| "nothing".into(), |v| v.to_string()),
                });
            }
        };
        let meta = match top.remove("meta") {
            Some(Value::Object(m)) => m,
            _ => return Err(Rejection::MetaNotObject),
        };
        let attempts = match top.remove("attempts") {
            None => 0,
            Some(v) => v.as_u64().ok_or(Rejection::BadAttempts {
                found: v.to_string(),
            })?,
        };
        let dead_letter = match top.remove("dead_letter") {
            None => None,
            Some(Value::Object(d)) => Some(d),
            // Not an object: not a dead-letter block we understand; keep it verbatim.
            Some(other) => {
                top.insert("dead_letter".into(), other);
                None
            }
        };
        Ok(Envelope {
            job,
            trace_id,
            data,
            meta,
            attempts,
            dead_letter,
            extra: top,
        })
    }

    /// `meta.id` when it is a usable dedupe id (see [`Message::id`]).
    pub fn id(&self) -> Option<&str> {
        self.meta
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
    }

    /// `meta.lang`, the producer's language tag.
    pub fn lang(&self) -> Option<&str> {
        self.meta.get("lang").and_then(Value::as_str)
    }

    /// `meta.schema_version` (always 1 for a validated envelope).
    pub fn schema_version(&self) -> Option<u64> {
        self.meta.get("schema_version").and_then(Value::as_u64)
    }

    /// The envelope as JSON text (canonical `job`, all fields preserved).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a Map-based envelope always serializes")
    }
}
