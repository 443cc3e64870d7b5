//! Publishing envelopes so every consumer reads them as published.
//!
//! workers-rs `Queue::send(&value)` serializes with serde-wasm-bindgen's default
//! settings, which turn every serde map (a `serde_json::Value` object, a
//! `HashMap`, a `serde_json::Map` field) into a JS `Map`; the `json` content type
//! then stores a `Map` as `{}` (JSON.stringify), in the producer, before any
//! consumer sees it. A struct of plain fields survives; a `serde_json::Value`
//! does not. These functions send the JSON text serde_json makes, as a plain JS
//! object (content type `json`), so any envelope type arrives whole.

use serde::Serialize;
use wasm_bindgen::JsValue;
use worker::{BatchMessageBuilder, Queue, QueueContentType, RawMessageBuilder, SendMessage};

/// `sendBatch` takes at most 100 messages.
const SEND_BATCH_MAX: usize = 100;

fn message<T: Serialize + ?Sized>(body: &T) -> worker::Result<SendMessage<JsValue>> {
    let text = serde_json::to_string(body)?;
    let value = js_sys::JSON::parse(&text)?;
    Ok(RawMessageBuilder::new(value).build_with_content_type(QueueContentType::Json))
}

/// Publishes one envelope (a `serde_json::Value`, your own struct, ...) to `queue`.
pub async fn send_envelope<T: Serialize + ?Sized>(queue: &Queue, body: &T) -> worker::Result<()> {
    queue.send_raw(message(body)?).await
}

/// Publishes envelopes in `sendBatch` calls of up to 100; returns how many were sent.
pub async fn send_envelopes<T: Serialize>(
    queue: &Queue,
    bodies: impl IntoIterator<Item = T>,
) -> worker::Result<usize> {
    let bodies: Vec<T> = bodies.into_iter().collect();
    for chunk in bodies.chunks(SEND_BATCH_MAX) {
        let messages = chunk
            .iter()
            .map(message)
            .collect::<worker::Result<Vec<_>>>()?;
        queue
            .send_raw_batch(BatchMessageBuilder::new().messages(messages).build())
            .await?;
    }
    Ok(bodies.len())
}
