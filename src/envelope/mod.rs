//! The BabelQueue wire envelope, `schema_version` 1.
//!
//! Two ways in:
//! - [`Message::parse`] is the hot path: one borrowed pass, validation, the dedupe
//!   key, and the raw text kept for the handler. No `serde_json::Value` tree.
//!   A hand-written scanner (`scan.rs`) decides the valid envelopes it can vouch
//!   for and leaves every text in doubt, so every rejection, to the serde_json
//!   reference (`view.rs`).
//! - [`Envelope`] is the full owned form (unknown fields preserved), built on demand
//!   with [`Message::envelope`] or [`Envelope::decode`].

mod accept;
mod body;
mod owned;
mod rejection;
mod scan;
mod view;

use std::borrow::Cow;

pub use body::Body;
pub use owned::Envelope;
pub use rejection::Rejection;
pub(crate) use view::quoted;
use view::{EnvelopeView, Loose, MetaField, TopLevel};

/// The only envelope schema version this crate accepts.
pub const SCHEMA_VERSION: u64 = 1;

/// Nesting depth at which decoding stops (serde_json's recursion limit): an
/// envelope nested this deep is refused, the envelope itself level 1 (127 is
/// the deepest read; the docs said "more than 128": a user's trial).
pub const MAX_DEPTH: usize = 128;

/// Input limits applied before and during decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted envelope in bytes (default 1 MiB; Cloudflare Queues caps
    /// messages at 128 KB, so this only bites on hostile input).
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: 1 << 20 }
    }
}

/// A decoded, validated delivery: the raw text plus the fields the dedupe reads.
///
/// Borrowed from the input: parsing copies nothing but strings that contain escapes.
#[derive(Debug, Clone)]
pub struct Message<'a> {
    raw: &'a str,
    job: Cow<'a, str>,
    trace_id: Cow<'a, str>,
    attempts: u64,
    id: Loose<'a>,
}

impl<'a> Message<'a> {
    /// Decodes and validates `raw` (the `accepts()` of the other SDKs), with a typed
    /// reason for each rejection.
    pub fn parse(raw: &'a [u8], limits: &Limits) -> Result<Message<'a>, Rejection> {
        Self::parse_text(Self::checked_text(raw, limits)?)
    }

    /// [`Message::parse`] of a text: the size limit, no UTF-8 check (a `str` is
    /// UTF-8 already).
    pub fn parse_str(raw: &'a str, limits: &Limits) -> Result<Message<'a>, Rejection> {
        Self::check_size(raw.len(), limits)?;
        Self::parse_text(raw)
    }

    fn parse_text(text: &'a str) -> Result<Message<'a>, Rejection> {
        // The scanner first: it only ever accepts, and leaves every doubt (and so
        // every rejection) to the reference decoder below.
        match scan::parse(text) {
            Some(msg) => Ok(msg),
            None => Self::parse_text_reference(text),
        }
    }

    /// [`Message::parse`] with the reference decoder alone (serde_json over the
    /// borrowed view), never the scanner: what the owned [`Envelope`]
    /// validates with, so the two decoders can be checked against each other.
    pub(crate) fn parse_reference(
        raw: &'a [u8],
        limits: &Limits,
    ) -> Result<Message<'a>, Rejection> {
        Self::parse_text_reference(Self::checked_text(raw, limits)?)
    }

    /// The size limit and the UTF-8 check, shared by both decoders.
    fn checked_text(raw: &'a [u8], limits: &Limits) -> Result<&'a str, Rejection> {
        Self::check_size(raw.len(), limits)?;
        std::str::from_utf8(raw)
            .map_err(|e| Rejection::NotJson(format!("invalid UTF-8 at byte {}", e.valid_up_to())))
    }

    /// The reference decoder: every rejection comes from here.
    fn parse_text_reference(text: &'a str) -> Result<Message<'a>, Rejection> {
        let view = match serde_json::from_str::<TopLevel<'a>>(text) {
            Ok(TopLevel::Object(view)) => view,
            Ok(TopLevel::NotAnObject) => return Err(Rejection::NotAnObject),
            // JSON has no byte order mark (RFC 8259), and the peers refuse it
            // too; serde's "expected value at line 1 column 1" hides it.
            Err(_) if text.starts_with('\u{feff}') => {
                return Err(Rejection::NotJson(
                    "starts with a byte order mark (U+FEFF)".into(),
                ));
            }
            Err(e) => return Err(Rejection::from_json_error(&e)),
        };
        Self::validate(text, view)
    }

    fn check_size(size: usize, limits: &Limits) -> Result<(), Rejection> {
        if size > limits.max_bytes {
            return Err(Rejection::TooLarge {
                size,
                limit: limits.max_bytes,
            });
        }
        Ok(())
    }

    fn validate(raw: &'a str, view: EnvelopeView<'a>) -> Result<Message<'a>, Rejection> {
        // `job` is canonical; `urn` is the inbound alias, used when `job` is
        // not a non-blank string (absent, blank, null, a number: the Python
        // SDK's rule, and this crate's docs; such a message was poison).
        let usable = |field| match field {
            Loose::Str(s) if !s.trim().is_empty() => Some(s),
            _ => None,
        };
        let Some(job) = usable(view.job).or_else(|| usable(view.urn)) else {
            return Err(Rejection::MissingJob);
        };
        let meta = match view.meta {
            MetaField::Object(meta) => meta,
            MetaField::Absent => return Err(Rejection::MetaNotObject),
            MetaField::Other(_) => return Err(Rejection::MetaNotObject),
        };
        match meta.schema_version {
            Loose::Unsigned(SCHEMA_VERSION) => {}
            other => {
                return Err(Rejection::UnsupportedSchemaVersion {
                    found: other.describe(),
                });
            }
        }
        if view.data != Loose::Object {
            return Err(Rejection::DataNotObject {
                found: view.data.describe(),
            });
        }
        let trace_id = match view.trace_id {
            Loose::Str(s) if !s.trim().is_empty() => s,
            _ => return Err(Rejection::BlankTraceId),
        };
        // Absent `attempts` reads as 0 (a first delivery); anything but a
        // non-negative integer is rejected, as the Python and Node SDKs do.
        let attempts = match view.attempts {
            Loose::Absent => 0,
            Loose::Unsigned(n) => n,
            other => {
                return Err(Rejection::BadAttempts {
                    found: other.describe(),
                });
            }
        };
        Ok(Message {
            raw,
            job,
            trace_id,
            attempts,
            id: meta.id,
        })
    }

    /// The dedupe id: `meta.id` verbatim, or `None` when the message has no usable id
    /// (absent, null, empty, or not a string) and must run unchanged (fail-open).
    /// Never trimmed: `" "` is a valid id, as in every BabelQueue SDK.
    pub fn id(&self) -> Option<&str> {
        match &self.id {
            Loose::Str(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    /// The message URN (`job`, or its inbound alias `urn`).
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The causal-chain id (not the dedupe key).
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The transport's retry counter (0 on a first delivery).
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    /// The envelope text exactly as delivered.
    pub fn raw(&self) -> &'a str {
        self.raw
    }

    /// The envelope's `data` as your type (`serde_json::Value` for any):
    /// `let order: Order = msg.data()?`. Read from the delivered text, only
    /// `data` is built; an error says where `data` does not fit your type.
    pub fn data<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        #[derive(serde::Deserialize)]
        struct Data<T> {
            data: T,
        }
        serde_json::from_str::<Data<T>>(self.raw).map(|d| d.data)
    }

    /// The full owned envelope, unknown fields preserved (builds a JSON tree).
    pub fn envelope(&self) -> Result<Envelope, Rejection> {
        Envelope::from_validated(self.raw)
    }
}
