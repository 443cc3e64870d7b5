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

/// `sendBatch` takes at most 100 messages,
const SEND_BATCH_MAX: usize = 100;
/// of at most 256 KB together,
const SEND_BATCH_MAX_BYTES: usize = 256_000;
/// each at most 128 KB (Cloudflare Queues' limits), counting about 100 bytes of
/// the queue's own per message: this much is kept for them.
const MESSAGE_OVERHEAD: usize = 128;
const MESSAGE_MAX_BYTES: usize = 128_000 - MESSAGE_OVERHEAD;

/// An envelope as the queue takes it, and its size as the runtime writes it
/// (JS writes some numbers longer than serde_json: `1e20` as 21 digits);
/// refused here when over the message limit: the queue's own refusal says only
/// "Unknown Internal Error".
/// `at`: its place in a list (named in the refusal).
fn message<T: Serialize + ?Sized>(
    body: &T,
    at: Option<usize>,
) -> worker::Result<(SendMessage<JsValue>, usize)> {
    let value = js_sys::JSON::parse(&serde_json::to_string(body)?)?;
    // UTF-8 bytes (a JS string's length counts UTF-16 units).
    let size = js_sys::JSON::stringify(&value)?
        .as_string()
        .map_or(usize::MAX, |text| text.len());
    if size > MESSAGE_MAX_BYTES {
        let which = at.map_or("the envelope".into(), |i| format!("envelope {i} (from 0)"));
        return Err(worker::Error::RustError(format!(
            "{which} is {size} bytes of JSON, over Cloudflare Queues' 128 KB message limit \
             (with the queue's own ~100 bytes): not sent (carry the payload elsewhere, \
             e.g. R2, and its key in `data`)"
        )));
    }
    let message = RawMessageBuilder::new(value).build_with_content_type(QueueContentType::Json);
    Ok((message, size))
}

/// Publishes one envelope (a `serde_json::Value`, your own struct, ...) to `queue`.
pub async fn send_envelope<T: Serialize + ?Sized>(queue: &Queue, body: &T) -> worker::Result<()> {
    queue.send_raw(message(body, None)?.0).await
}

/// Publishes envelopes in `sendBatch` calls (up to 100 messages and 256 KB
/// each); returns how many were sent. An envelope over the 128 KB message
/// limit fails the call before anything is sent, naming its place in the list;
/// a `sendBatch` that fails says how many were sent before it (sending the
/// whole list again publishes those twice: consumers skip them, as duplicates).
pub async fn send_envelopes<T: Serialize>(
    queue: &Queue,
    bodies: impl IntoIterator<Item = T>,
) -> worker::Result<usize> {
    // Every message made (and measured) before the first is sent.
    let messages = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| message(&body, Some(i)))
        .collect::<worker::Result<Vec<_>>>()?;
    let (mut chunk, mut bytes, mut sent) = (Vec::new(), 0, 0);
    let total = messages.len();
    for (message, size) in messages {
        let size = size + MESSAGE_OVERHEAD;
        if chunk.len() == SEND_BATCH_MAX || bytes + size > SEND_BATCH_MAX_BYTES {
            sent += send_batch(queue, std::mem::take(&mut chunk), sent, total).await?;
            bytes = 0;
        }
        bytes += size;
        chunk.push(message);
    }
    if !chunk.is_empty() {
        sent += send_batch(queue, chunk, sent, total).await?;
    }
    Ok(sent)
}

/// One `sendBatch`; its failure says how many of the list went before it.
async fn send_batch(
    queue: &Queue,
    messages: Vec<SendMessage<JsValue>>,
    sent: usize,
    total: usize,
) -> worker::Result<usize> {
    let n = messages.len();
    queue
        .send_raw_batch(BatchMessageBuilder::new().messages(messages).build())
        .await
        .map_err(|e| {
            worker::Error::RustError(format!(
                "sendBatch failed: {e} ({sent} of the {total} envelopes were sent before it)"
            ))
        })?;
    Ok(n)
}
