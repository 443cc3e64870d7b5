//! `POST /publish`: a JSON array of envelopes (objects, sent as JSON) or raw
//! strings (sent as text, as-is, so malformed bodies can be published too).

use serde_json::{Value, json};
use wasm_bindgen::JsValue;
use worker::{
    BatchMessageBuilder, Env, QueueContentType, RawMessageBuilder, Request, Response, Result,
    SendMessage,
};

const PRODUCER: &str = "ORDERS";
/// `sendBatch` takes at most 100 messages.
const SEND_BATCH_MAX: usize = 100;

pub async fn publish(mut req: Request, env: Env) -> Result<Response> {
    let items = match crate::access::json_body::<Value>(&mut req, &env).await? {
        Ok(Value::Array(items)) => items,
        Ok(_) => return Response::error("body must be a JSON array of envelopes or strings", 400),
        Err(refusal) => return Ok(refusal),
    };
    let queue = env.queue(PRODUCER)?;
    let mut sent = 0;
    for chunk in items.chunks(SEND_BATCH_MAX) {
        let messages = chunk.iter().map(to_message).collect::<Result<Vec<_>>>()?;
        queue
            .send_raw_batch(BatchMessageBuilder::new().messages(messages).build())
            .await?;
        sent += chunk.len();
    }
    Response::from_json(&json!({ "sent": sent }))
}

fn to_message(item: &Value) -> Result<SendMessage<JsValue>> {
    Ok(match item {
        Value::String(raw) => RawMessageBuilder::new(JsValue::from_str(raw))
            .build_with_content_type(QueueContentType::Text),
        // A plain JS object (a serde map would arrive as a JS Map).
        other => RawMessageBuilder::new(js_sys::JSON::parse(&other.to_string())?)
            .build_with_content_type(QueueContentType::Json),
    })
}
