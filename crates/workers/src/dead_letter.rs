//! The BabelQueue `dead_letter` block for a message the consumer gives up on:
//! poison (not a valid envelope) or, on its last allowed attempt, a handler
//! failure.
//!
//! A body that is a JSON object gets the block added at the top level (the
//! envelope's own place for it); anything else (malformed JSON, a bare string or
//! number) is kept verbatim under `body` beside the block, so nothing is lost; a
//! body no UTF-8 text holds whole is kept as the value itself ([`wrap_block_only`]).

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Cloudflare Queues' largest message (128 KB), less room for the encoding:
/// no dead letter is larger.
pub(crate) const MAX_DEAD_LETTER_BYTES: usize = 128_000 - 1_024;
/// The longest `dead_letter.error` kept when the whole letter is too large.
const ERROR_CHARS: usize = 1_000;

/// What is known about the delivery being dead-lettered.
pub(crate) struct DeadDelivery<'a> {
    pub body: &'a [u8],
    /// `poison` or `failed` (the schema's other reason, `unknown_urn`, is the
    /// handler's business).
    pub reason: &'static str,
    /// Human-readable: the rejection or the handler's error.
    pub error: String,
    /// A stable code: the rejection code, or `handler-error`.
    pub exception: &'a str,
    pub original_queue: &'a str,
    /// Delivery attempts made (Cloudflare's count).
    pub attempts: u32,
    pub failed_at_ms: u64,
    /// How many times in a row it is dead-lettered with this letter (1 for a
    /// message that was no letter): the block's `laps`.
    pub laps: u64,
}

/// The dead-letter message for a delivery, never over
/// [`MAX_DEAD_LETTER_BYTES`]: the envelope whole with its block if that fits;
/// else with the block's `error` cut short (still whole, so a redrive can
/// send it again); else the envelope's `job`, `trace_id` and `meta`, and a
/// `truncated` digest of the body in place of the rest (less still, if even
/// those do not fit).
pub(crate) fn wrap(delivery: &DeadDelivery<'_>) -> Value {
    let whole = wrap_whole(delivery, &delivery.error);
    if fits(&whole) {
        return whole;
    }
    let short = wrap_whole(delivery, &cut(&delivery.error));
    if fits(&short) {
        return short;
    }
    wrap_truncated(delivery, TOO_LARGE, &fits)
}

/// Why a letter holds a digest: the whole would not fit the queue.
pub(crate) const TOO_LARGE: &str = "the dead letter would exceed the queue's 128 KB message \
     limit: the envelope's job, trace_id and meta are kept, the rest is this digest";
/// Why a letter holds a digest: the body as it came (no UTF-8 text holds it)
/// was refused as a structured clone, and text would not be the body.
pub(crate) const NOT_TEXT: &str = "the body is no UTF-8 text and the queue refused it as \
     a structured clone: the envelope's job, trace_id and meta are kept, the rest is this \
     digest of its bytes";

/// The letter without the body: the envelope's `job`, `trace_id` and `meta`
/// (less, if even those do not fit) and a `truncated` digest of the body,
/// saying `why`: [`TOO_LARGE`], a letter whose whole form, as the runtime
/// encodes it, is over the limit; [`NOT_TEXT`], a body text would not keep.
/// `fits`: whether a letter is within the limit, as the sender will encode it
/// (the runtime writes some numbers longer than serde_json: a `meta` full of
/// them fit by serde's measure and was refused on every attempt, a review).
pub(crate) fn wrap_truncated(
    delivery: &DeadDelivery<'_>,
    why: &str,
    fits: &dyn Fn(&Value) -> bool,
) -> Value {
    let error = cut(&delivery.error);
    let body = serde_json::from_slice::<Value>(delivery.body).ok();
    let kept: Vec<(&str, Value)> = match &body {
        Some(Value::Object(envelope)) => ["job", "trace_id", "meta"]
            .into_iter()
            .filter_map(|k| envelope.get(k).map(|v| (k, v.clone())))
            .collect(),
        _ => Vec::new(),
    };
    let digest = json!({
        "bytes": delivery.body.len(),
        "sha256": hex(&Sha256::digest(delivery.body)),
        "why": why,
    });
    // The most of the envelope that fits: all three fields, then `meta.id`
    // alone, then nothing but the digest.
    let meta_id = kept
        .iter()
        .find(|(k, _)| *k == "meta")
        .and_then(|(_, meta)| meta.get("id").cloned());
    let tries: [Vec<(&str, Value)>; 3] = [
        kept.clone(),
        meta_id
            .map(|id| vec![("meta", json!({ "id": id }))])
            .unwrap_or_default(),
        Vec::new(),
    ];
    let mut letter = Value::Null;
    for fields in tries {
        let mut out: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.into(), v)).collect();
        out.insert("truncated".into(), digest.clone());
        out.insert("dead_letter".into(), block(delivery, &error));
        letter = Value::Object(out);
        if fits(&letter) {
            break;
        }
    }
    letter
}

/// The letter of a body that UTF-8 JSON text cannot hold whole (a BigInt, a
/// lone surrogate, binary bytes): the block alone, its `error` cut short; the
/// sender puts the body itself beside it and sends the letter as a structured
/// clone.
pub(crate) fn wrap_block_only(delivery: &DeadDelivery<'_>) -> Value {
    json!({ "dead_letter": block(delivery, &cut(&delivery.error)) })
}

fn fits(letter: &Value) -> bool {
    serde_json::to_vec(letter).is_ok_and(|bytes| bytes.len() <= MAX_DEAD_LETTER_BYTES)
}

/// `error` cut to [`ERROR_CHARS`] characters, saying so.
fn cut(error: &str) -> String {
    match error.char_indices().nth(ERROR_CHARS) {
        Some((end, _)) => format!("{}... ({} bytes in all)", &error[..end], error.len()),
        None => error.to_string(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn block(delivery: &DeadDelivery<'_>, error: &str) -> Value {
    // The schema's `lang` enum has no Rust entry, so `lang` is left out.
    json!({
        "reason": delivery.reason,
        "error": error,
        "exception": delivery.exception,
        "failed_at": delivery.failed_at_ms,
        "original_queue": delivery.original_queue,
        "attempts": delivery.attempts,
        "laps": delivery.laps,
    })
}

fn wrap_whole(delivery: &DeadDelivery<'_>, error: &str) -> Value {
    let block = block(delivery, error);
    match serde_json::from_slice::<Value>(delivery.body) {
        Ok(Value::Object(mut envelope)) => {
            envelope.insert("dead_letter".into(), block);
            Value::Object(envelope)
        }
        _ => {
            let mut wrapper = Map::new();
            wrapper.insert(
                "body".into(),
                Value::String(String::from_utf8_lossy(delivery.body).into_owned()),
            );
            wrapper.insert("dead_letter".into(), block);
            Value::Object(wrapper)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bq_dedupe::{Message, envelope::Limits};

    fn poison(body: &[u8]) -> Value {
        let rejection = Message::parse(body, &Limits::default()).unwrap_err();
        wrap(&DeadDelivery {
            body,
            reason: "poison",
            error: rejection.to_string(),
            exception: rejection.code(),
            original_queue: "orders",
            attempts: 1,
            failed_at_ms: 1_700_000_000_000,
            laps: 1,
        })
    }

    #[test]
    fn invalid_envelope_object_keeps_every_field_and_gains_the_block() {
        let out = poison(br#"{"job":"urn:x","meta":{"id":"a","schema_version":2},"extra":[1]}"#);
        assert_eq!(out["extra"], json!([1]));
        assert_eq!(out["meta"]["id"], "a");
        assert_eq!(out["dead_letter"]["reason"], "poison");
        assert_eq!(out["dead_letter"]["original_queue"], "orders");
        assert_eq!(out["dead_letter"]["attempts"], 1);
        assert!(
            out["dead_letter"]["exception"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        );
    }

    fn failed(body: &[u8], error: String) -> Value {
        wrap(&DeadDelivery {
            body,
            reason: "failed",
            error,
            exception: "handler-error",
            original_queue: "orders",
            attempts: 4,
            failed_at_ms: 1_700_000_000_000,
            laps: 1,
        })
    }

    fn size(letter: &Value) -> usize {
        serde_json::to_vec(letter).unwrap().len()
    }

    fn envelope(pad: usize) -> Vec<u8> {
        json!({
            "job": "urn:babel:orders:created",
            "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
            "data": {"pad": "x".repeat(pad)},
            "meta": {"id": "big-1", "queue": "orders", "schema_version": 1},
            "attempts": 0
        })
        .to_string()
        .into_bytes()
    }

    /// Issue #29: a 128 KB body wrapped with its block could not be sent (over
    /// the queue's limit), so it left without its block. Now no letter is over.
    #[test]
    fn a_dead_letter_never_exceeds_the_queue_message_limit() {
        // Fits whole once the handler's long error is cut: still redrivable.
        let body = envelope(124_000);
        let letter = failed(&body, "e".repeat(50_000));
        assert!(size(&letter) <= MAX_DEAD_LETTER_BYTES, "{}", size(&letter));
        assert_eq!(letter["data"]["pad"].as_str().map(str::len), Some(124_000));
        assert!(
            letter["dead_letter"]["error"]
                .as_str()
                .unwrap()
                .ends_with("(50000 bytes in all)")
        );
        // Too large whatever: job, trace_id and meta, and a digest of the rest.
        let body = envelope(128_000);
        let letter = failed(&body, "boom".into());
        assert!(size(&letter) <= MAX_DEAD_LETTER_BYTES, "{}", size(&letter));
        assert_eq!(letter["meta"]["id"], "big-1");
        assert_eq!(letter["job"], "urn:babel:orders:created");
        assert_eq!(letter["trace_id"], "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b");
        assert!(letter.get("data").is_none());
        assert_eq!(letter["truncated"]["bytes"], body.len());
        assert_eq!(
            letter["truncated"]["sha256"].as_str().map(str::len),
            Some(64)
        );
        assert_eq!(letter["dead_letter"]["error"], "boom");
        // A huge meta: its id alone. A body that is not JSON: the digest alone.
        let body = json!({"job": "j", "trace_id": "t", "data": {}, "meta": {"id": "m-1", "x": "y".repeat(200_000)}})
            .to_string();
        let letter = failed(body.as_bytes(), "boom".into());
        assert!(size(&letter) <= MAX_DEAD_LETTER_BYTES);
        assert_eq!(letter["meta"], json!({"id": "m-1"}));
        let letter = poison(&vec![b'{'; 300_000]);
        assert!(size(&letter) <= MAX_DEAD_LETTER_BYTES);
        assert_eq!(letter["truncated"]["bytes"], 300_000);
        assert_eq!(letter["dead_letter"]["reason"], "poison");
    }

    #[test]
    fn malformed_body_is_kept_verbatim_beside_the_block() {
        let out = poison(b"{not json");
        assert_eq!(out["body"], "{not json");
        assert_eq!(out["dead_letter"]["failed_at"], 1_700_000_000_000u64);
    }
}
