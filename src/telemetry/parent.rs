//! The remote parent of a delivery's span, derived exactly as the BabelQueue
//! SDKs derive it (ADR-0025 v0.1, ADR-0028 v0.2), so our span joins the trace
//! a Go, PHP, Node or Python producer started.
//!
//! - A W3C `traceparent` carried beside the envelope (never inside it), when
//!   valid by the Node SDK's reading, is the parent.
//! - Otherwise the parent is synthetic: the trace id is `trace_id`'s 32 hex
//!   digits (dashes removed, not all zero), else the first 16 bytes of
//!   SHA-256 of `trace_id`; the span id the first 8 bytes of SHA-256 of
//!   `"babelqueue-span:" + trace_id` (never zero); sampled, remote.
//!
//! `tests/otel/trace_ids.json` holds the Node SDK's own answers; `tests/otel.rs`
//! checks these functions against every one.

use sha2::{Digest, Sha256};

/// A span's remote parent: the ids and flags of the span context a delivery's
/// span is started under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    /// The W3C trace id.
    pub trace_id: [u8; 16],
    /// The parent span's id.
    pub span_id: [u8; 8],
    /// The trace flags byte as received (bit 0: sampled).
    pub flags: u8,
    /// The valid `tracestate` members, `key=value,...` (empty: none).
    pub trace_state: String,
    /// `true` when the parent came from a `traceparent` header, `false` when
    /// it was derived from the envelope's `trace_id`.
    pub from_header: bool,
}

impl Parent {
    /// The parent of a delivery whose envelope carries `trace_id`, with the
    /// transport's `traceparent` / `tracestate` headers where it has them.
    pub fn of(trace_id: &str, traceparent: Option<&str>, tracestate: Option<&str>) -> Parent {
        match traceparent.and_then(parse_traceparent) {
            Some((trace, span, flags)) => Parent {
                trace_id: trace,
                span_id: span,
                flags,
                trace_state: tracestate.map(valid_members).unwrap_or_default(),
                from_header: true,
            },
            None => Parent {
                trace_id: trace_id_of(trace_id),
                span_id: synthetic_span_id(trace_id),
                flags: SAMPLED,
                trace_state: String::new(),
                from_header: false,
            },
        }
    }

    /// Is the trace sampled (flags bit 0)?
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

const SAMPLED: u8 = 0x01;

/// The trace id the SDKs derive from an envelope's `trace_id`.
pub fn trace_id_of(trace_id: &str) -> [u8; 16] {
    let digits: Vec<u8> = trace_id.bytes().filter(|&b| b != b'-').collect();
    if let Some(id) = hex_array::<16>(&digits).filter(|id| *id != [0; 16]) {
        return id;
    }
    let hash = Sha256::digest(trace_id.as_bytes());
    hash[..16].try_into().expect("SHA-256 has 32 bytes")
}

/// The synthetic parent span id the SDKs derive from `trace_id`.
pub fn synthetic_span_id(trace_id: &str) -> [u8; 8] {
    let mut hasher = Sha256::new();
    hasher.update(b"babelqueue-span:");
    hasher.update(trace_id.as_bytes());
    let id: [u8; 8] = hasher.finalize()[..8]
        .try_into()
        .expect("SHA-256 has 32 bytes");
    if id == [0; 8] {
        [0, 0, 0, 0, 0, 0, 0, 1]
    } else {
        id
    }
}

/// A `traceparent` header as the Node SDK reads it: `VV-T{32}-S{16}-FF`, with
/// lowercase hex, at most one whitespace character at each end, a version other
/// than `ff`, non-zero ids, and a trailing `-...` only after a version other
/// than `00`. The flags byte is kept as it came.
pub fn parse_traceparent(header: &str) -> Option<([u8; 16], [u8; 8], u8)> {
    let header = strip_one_space(header);
    let b = header.as_bytes();
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let lower = |part: &[u8]| part.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let (version, trace, span, flags) = (&b[..2], &b[3..35], &b[36..52], &b[53..55]);
    if !(lower(version) && lower(trace) && lower(span) && lower(flags)) || version == b"ff" {
        return None;
    }
    match &b[55..] {
        [] => {}
        // JS `.` stops at a line terminator.
        [b'-', rest @ ..] if version != b"00" && !has_line_terminator(rest) => {}
        _ => return None,
    }
    let trace = hex_array::<16>(trace).filter(|id| *id != [0; 16])?;
    let span = hex_array::<8>(span).filter(|id| *id != [0; 8])?;
    Some((trace, span, hex_array::<1>(flags)?[0]))
}

fn has_line_terminator(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.contains(['\n', '\r', '\u{2028}', '\u{2029}'])
}

/// Drops one leading and one trailing whitespace character (JS `\s`).
fn strip_one_space(s: &str) -> &str {
    let s = match s.chars().next() {
        Some(c) if is_js_space(c) => &s[c.len_utf8()..],
        _ => s,
    };
    match s.chars().next_back() {
        Some(c) if is_js_space(c) => &s[..s.len() - c.len_utf8()],
        _ => s,
    }
}

/// Whitespace as JS's `\s` and `trim()` read it (U+FEFF is, U+0085 is not).
fn is_js_space(c: char) -> bool {
    matches!(c, '\t'..='\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'..='\u{200a}')
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}' | '\u{feff}'
        )
}

/// The valid members of a `tracestate` header, as `@opentelemetry/api`'s
/// `createTraceState` (the Node SDK's) keeps them: none over 512 characters; an
/// invalid member dropped on its own; read right to left, a repeated key
/// keeps its leftmost value at its rightmost place; past 32, the first 32.
fn valid_members(header: &str) -> String {
    // Its length as JS counts it (UTF-16 units).
    if header.len() > 512 && header.encode_utf16().count() > 512 {
        return String::new();
    }
    // Right to left, as the API's Map is filled (its serialization reverses it).
    let mut members: Vec<(&str, &str)> = Vec::new();
    for member in header.split(',').rev().map(|m| m.trim_matches(is_js_space)) {
        let Some((key, value)) = member.split_once('=') else {
            continue;
        };
        if !(valid_key(key) && valid_value(value)) {
            continue;
        }
        match members.iter_mut().find(|(k, _)| *k == key) {
            Some(kept) => kept.1 = value,
            None => members.push((key, value)),
        }
    }
    if members.len() > 32 {
        members.reverse();
        members.truncate(32);
    }
    let members: Vec<String> = members
        .iter()
        .rev()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    members.join(",")
}

fn valid_key(key: &str) -> bool {
    let part = |s: &str, max: usize, first: fn(u8) -> bool| {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= max
            && first(b[0])
            && b[1..]
                .iter()
                .all(|&c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/'))
    };
    match key.split_once('@') {
        None => part(key, 256, |c| c.is_ascii_lowercase()),
        Some((tenant, system)) => {
            part(tenant, 241, |c| {
                c.is_ascii_lowercase() || c.is_ascii_digit()
            }) && part(system, 14, |c| c.is_ascii_lowercase())
        }
    }
}

fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.iter()
            .all(|&c| (b' '..=b'~').contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

/// `N` bytes from exactly `2N` ASCII hex digits (either case).
fn hex_array<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`, as trace and span ids are written.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
