//! The Queues batch and its messages, bound directly so `attempts` is readable
//! (worker 0.8.7's `MessageBatch` has no accessor for it).

use js_sys::{Array, Reflect};
use wasm_bindgen::{JsCast, JsValue};
use worker::worker_sys::{Message as MessageSys, MessageBatch as MessageBatchSys};

use crate::body::body_bytes;

/// A batch handed to a queue consumer (see [`crate::queue_consumer!`]).
#[derive(Debug, Clone)]
pub struct QueueBatch {
    inner: MessageBatchSys,
}

impl From<MessageBatchSys> for QueueBatch {
    fn from(inner: MessageBatchSys) -> Self {
        QueueBatch { inner }
    }
}

impl QueueBatch {
    /// The name of the queue the batch came from.
    pub fn queue(&self) -> String {
        self.inner.queue().map(String::from).unwrap_or_default()
    }

    /// The batch's messages, in delivery order.
    pub fn messages(&self) -> Result<Vec<QueueMessage>, String> {
        let messages: Array = self.inner.messages().map_err(describe)?;
        Ok(messages
            .iter()
            .map(|m| QueueMessage {
                inner: m.unchecked_into(),
            })
            .collect())
    }

    /// Marks every message not yet acked or retried for retry.
    pub fn retry_all(&self) {
        let _ = self.inner.retry_all(JsValue::NULL);
    }
}

/// One queue message.
#[derive(Debug, Clone)]
pub struct QueueMessage {
    inner: MessageSys,
}

impl QueueMessage {
    /// Cloudflare's id for this send (not `meta.id`: each publish gets a new one).
    pub fn id(&self) -> String {
        self.inner.id().map(String::from).unwrap_or_default()
    }

    /// The JS `Message` object itself (handed to a JS handler unchanged).
    pub fn as_js(&self) -> &JsValue {
        self.inner.as_ref()
    }

    /// The body as sent (a string, bytes or a JSON value).
    pub fn body(&self) -> JsValue {
        self.inner.body().unwrap_or(JsValue::UNDEFINED)
    }

    /// The body as the UTF-8 JSON text the core decodes.
    pub fn body_bytes(&self) -> Vec<u8> {
        body_bytes(&self.body())
    }

    /// Cloudflare's delivery count: 1 on the first delivery.
    pub fn attempts(&self) -> u32 {
        Reflect::get(&self.inner, &JsValue::from_str("attempts"))
            .ok()
            .and_then(|v| v.as_f64())
            .filter(|n| *n >= 1.0)
            .map_or(1, |n| n as u32)
    }

    /// Acknowledges the message: it will not be delivered again.
    pub fn ack(&self) -> Result<(), String> {
        self.inner.ack().map_err(describe)
    }

    /// Asks for redelivery, after `delay_seconds` if given.
    pub fn retry(&self, delay_seconds: Option<u32>) -> Result<(), String> {
        let options = match delay_seconds {
            Some(delay) => {
                let options = js_sys::Object::new();
                Reflect::set(&options, &"delaySeconds".into(), &delay.into()).map_err(describe)?;
                options.into()
            }
            None => JsValue::NULL,
        };
        self.inner.retry(options).map_err(describe)
    }
}

/// A queue message as a handler sees it: what it carries, without `ack` and
/// `retry`, which are the consumer's, by the delivery's outcome (Cloudflare
/// keeps a message's first call: a handler's `ack` before a failure would
/// lose the message, its `retry` before a success would be recorded done).
#[derive(Debug, Clone, Copy)]
pub struct HandlerMessage<'m>(pub(crate) &'m QueueMessage);

impl HandlerMessage<'_> {
    /// Cloudflare's id for this send (not `meta.id`: each publish gets a new one).
    pub fn id(&self) -> String {
        self.0.id()
    }

    /// The body as sent (a string, bytes or a JSON value).
    pub fn body(&self) -> JsValue {
        self.0.body()
    }

    /// Cloudflare's delivery count: 1 on the first delivery.
    pub fn attempts(&self) -> u32 {
        self.0.attempts()
    }

    /// The JS `Message` object (for a JS handler; the package's glue gives it
    /// one whose `ack` and `retry` throw).
    pub fn as_js(&self) -> &JsValue {
        self.0.as_js()
    }
}

/// A JS exception as text.
pub(crate) fn describe(error: JsValue) -> String {
    // `message` read as a property that may be anything (an Error's set to
    // null would panic in `Error::message`) or a getter that throws.
    error
        .as_string()
        .or_else(|| {
            Reflect::get(&error, &"message".into())
                .ok()
                .and_then(|m| m.as_string())
        })
        // Not `{error:?}`: wasm-bindgen's debug string reads `message` too,
        // outside any catch.
        .unwrap_or_else(|| {
            let kind = error.js_typeof().as_string().unwrap_or_default();
            format!("a thrown {kind} without a string message")
        })
}
