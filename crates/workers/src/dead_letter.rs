//! The BabelQueue `dead_letter` block for a message the consumer gives up on:
//! poison (not a valid envelope) or, on its last allowed attempt, a handler
//! failure.
//!
//! A body that is a JSON object gets the block added at the top level (the
//! envelope's own place for it); anything else (malformed JSON, a bare string or
//! number) is kept verbatim under `body` beside the block, so nothing is lost.

use serde_json::{Map, Value, json};

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
}

/// The dead-letter message for a delivery.
pub(crate) fn wrap(delivery: &DeadDelivery<'_>) -> Value {
    // The schema's `lang` enum has no Rust entry, so `lang` is left out.
    let block = json!({
        "reason": delivery.reason,
        "error": delivery.error,
        "exception": delivery.exception,
        "failed_at": delivery.failed_at_ms,
        "original_queue": delivery.original_queue,
        "attempts": delivery.attempts,
    });
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
    use bq_dedupe::{Limits, Message};

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

    #[test]
    fn malformed_body_is_kept_verbatim_beside_the_block() {
        let out = poison(b"{not json");
        assert_eq!(out["body"], "{not json");
        assert_eq!(out["dead_letter"]["failed_at"], 1_700_000_000_000u64);
    }
}
