//! Payload fingerprints: an id reused with a different `data` is caught instead of
//! skipped as a redelivery.
//!
//! With [`crate::Options::fingerprint`] on, a success is remembered with two
//! companion records beside its key, written in the same store call:
//!
//! - the *marker* `"\u{1f}fp:=" + key`: this id was remembered with a fingerprint;
//! - the *record* `"\u{1f}fp:" + hash + ":" + key`: and with this one.
//!
//! A later delivery of a remembered key is a skip if its record exists, a
//! [`crate::Outcome::PayloadMismatch`] if only the marker does, and a skip if
//! neither does (the id was remembered without fingerprints: by an older
//! consumer, another SDK, or before the option was turned on). Companion records
//! are plain keys of the store's own format, so every store holds them unchanged;
//! the stores that write another SDK's records refuse the option
//! ([`crate::Store::shared_format`]).
//!
//! The hash is SHA-256 over a canonical JSON text of `data` (object keys sorted by
//! their UTF-8 bytes, no whitespace, strings re-escaped, numbers as the JSON
//! library prints them), first 16 bytes in hex: a redelivery always matches, and
//! so does the same payload encoded by another library or in another key order.

#[cfg(feature = "fingerprint")]
use serde_json::Value;

/// What marks a companion record; ids starting with it can forge one another's
/// fingerprint records (documented in `docs/stores.md`).
const TAG: &str = "\u{1f}fp:";

/// How every companion key (marker and record) begins. No id's key does: the
/// key space gives a key that would begin with U+001F one more.
pub const COMPANION_PREFIX: &str = TAG;

/// A delivery's payload fingerprint and the companion keys it is stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    /// The hash of `data`, 32 lowercase hex digits.
    pub hash: String,
    /// Present when `key` was remembered with a fingerprint.
    pub marker_key: String,
    /// Present when `key` was remembered with this fingerprint.
    pub record_key: String,
}

impl Fingerprint {
    /// The fingerprint of the envelope `raw` (already validated: `data` is an
    /// object) remembered under `key`. `None` only if `raw` is not JSON.
    #[cfg(feature = "fingerprint")]
    pub fn of(raw: &str, key: &str) -> Option<Fingerprint> {
        let envelope: Value = serde_json::from_str(raw).ok()?;
        let hash = hash_data(envelope.get("data")?);
        Some(Fingerprint {
            marker_key: marker_key(key),
            record_key: format!("{TAG}{hash}:{key}"),
            hash,
        })
    }
}

/// The marker of `key` (forgetting an id forgets its marker too). Its `=`
/// is no hex digit, so no marker is ever a record: before it, the marker of
/// id `HASH:K` was id K's record for HASH, and a producer that sent that id
/// made K's changed payload read as a redelivery.
pub fn marker_key(key: &str) -> String {
    format!("{TAG}={key}")
}

/// The key a companion key (marker or record) belongs to; any other key is
/// its own. A sharded store places companions by it, beside their id, so a
/// success and its companions are written in one place at once.
pub fn owner_key(key: &str) -> &str {
    let Some(rest) = key.strip_prefix(TAG) else {
        return key;
    };
    if let Some(id_key) = rest.strip_prefix('=') {
        return id_key;
    }
    match rest.split_once(':') {
        Some((hash, id_key)) if hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            id_key
        }
        _ => key,
    }
}

/// The hex fingerprint of one `data` value.
#[cfg(feature = "fingerprint")]
pub fn hash_data(data: &Value) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;

    let mut canonical = Vec::with_capacity(256);
    write_canonical(data, &mut canonical);
    let digest = Sha256::digest(&canonical);
    let mut hex = String::with_capacity(32);
    for byte in &digest[..16] {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

#[cfg(feature = "fingerprint")]
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (n, (key, value)) in entries.into_iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

#[cfg(feature = "fingerprint")]
fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing a scalar into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(all(test, feature = "fingerprint"))]
mod tests {
    use super::*;

    fn fp(data: &str) -> String {
        let raw = format!(
            r#"{{"job":"j","trace_id":"t","meta":{{"id":"a","schema_version":1}},"data":{data}}}"#
        );
        Fingerprint::of(&raw, "a").unwrap().hash
    }

    #[test]
    fn equal_payloads_match_whatever_their_encoding() {
        let a = fp(r#"{"order":7,"items":["x","y"],"note":"a/b"}"#);
        assert_eq!(
            a,
            fp(r#"{ "note" : "a\/b", "items":[ "x","y" ], "order":7 }"#)
        );
        assert_eq!(a, fp(r#"{"order":7,"items":["x","y"],"note":"\u0061/b"}"#));
    }

    #[test]
    fn different_payloads_differ() {
        let a = fp(r#"{"order":7}"#);
        assert_ne!(a, fp(r#"{"order":8}"#));
        assert_ne!(a, fp(r#"{"order":"7"}"#));
        assert_ne!(a, fp(r#"{"order":7,"x":null}"#));
        assert_ne!(fp(r#"{"a":["x","y"]}"#), fp(r#"{"a":["y","x"]}"#));
    }

    #[test]
    fn the_hash_is_pinned() {
        // SHA-256 of `{"order":7}`: a change of the canonical form fails here, since
        // it would read every remembered fingerprint as a mismatch.
        assert_eq!(fp(r#"{ "order": 7 }"#), "8bcbace4a85bfd655264d50663d10000");
    }

    #[test]
    fn companion_keys_belong_to_their_key() {
        let f = Fingerprint::of(r#"{"data":{"a":1}}"#, "q:a").unwrap();
        for key in [&f.marker_key, &f.record_key] {
            assert_eq!(owner_key(key), "q:a", "{key:?}");
        }
        for key in ["q:a", "\u{1f}\u{1f}fp:=x", "\u{1f}fp:", "\u{1f}fp:abc:q:a"] {
            assert_eq!(owner_key(key), key, "{key:?}");
        }
    }

    #[test]
    fn companion_keys_carry_the_key() {
        let raw = r#"{"job":"j","trace_id":"t","meta":{"id":"a","schema_version":1},"data":{}}"#;
        let f = Fingerprint::of(raw, "q:a").unwrap();
        assert_eq!(f.marker_key, "\u{1f}fp:=q:a");
        assert_eq!(f.record_key, format!("\u{1f}fp:{}:q:a", f.hash));
    }
}
