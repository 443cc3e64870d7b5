//! A worker of your own: a Queues consumer deduped by bq-dedupe, and the
//! producers that feed it. Built outside the bq-dedupe workspace by
//! crates/workers/tests/user-worker.test.mjs, exactly as it is here.

use bq_dedupe_workers::bq_dedupe::OutcomeKind;
use bq_dedupe_workers::{Delivery, QueueBatch, QueueConsumer, send_envelopes};
use serde::Serialize;
use serde_json::Value;
use worker::{Context, Env, Request, Response, Result, event};

// The Durable Object class that wrangler.toml binds as the dedupe store.
pub use bq_dedupe_workers::durable::DedupeShard;

// The consumer: instead of #[event(queue)] (it reads Cloudflare's attempts too).
bq_dedupe_workers::queue_consumer!(consume);

async fn consume(batch: QueueBatch, env: Env, _ctx: Context) -> Result<()> {
    let consumer = QueueConsumer::from_env(&env)?; // the DEDUPE_* vars
    let report = consumer
        .consume(&batch, async |delivery| charge(&env, delivery).await)
        .await?; // Err: the batch could not be read or a retry not recorded: throw
    worker::console_log!(
        "{} ran, {} skipped ({} duplicate publishes, {} redeliveries)",
        report.count(OutcomeKind::Ran),
        report.count(OutcomeKind::Skipped),
        report.duplicate_publishes(),
        report.redeliveries(),
    );
    // Anything else gets a line of its own, with why: a failure (retried),
    // poison (dead-lettered), a park, a delivery without a usable meta.id.
    for m in report
        .messages
        .iter()
        .filter(|m| !matches!(m.kind, OutcomeKind::Ran | OutcomeKind::Skipped))
    {
        let why = m.reason.as_deref().unwrap_or("");
        worker::console_log!(
            "bq-dedupe {} -> {:?}: message {}: {why}",
            m.kind.code(),
            m.action,
            m.queue_message_id
        );
    }
    Ok(())
}

/// Your side effect; `Err` means retry (the id is not remembered). This one
/// writes one KV key per run: `charge:<meta.id>:<Cloudflare message id>:<attempt>`
/// (the attempt too, so that a message run again is seen, not overwritten).
async fn charge(env: &Env, delivery: &Delivery<'_, '_>) -> std::result::Result<(), String> {
    let order = delivery.message().envelope().map_err(|e| e.to_string())?;
    let id = delivery.message().id().unwrap_or("no-id");
    let attempt = delivery.queue_message().attempts();
    let key = format!("charge:{id}:{}:{attempt}", delivery.queue_message().id());
    let kv = env.kv("CHARGES").map_err(|e| e.to_string())?;
    kv.put(&key, Value::Object(order.data).to_string())
        .map_err(|e| e.to_string())?
        .execute()
        .await
        .map_err(|e| e.to_string())
}

/// A typed envelope: plain fields survive workers-rs `Queue::send` as they are.
#[derive(Serialize, serde::Deserialize)]
struct Order {
    job: String,
    trace_id: String,
    data: OrderData,
    meta: Meta,
}

#[derive(Serialize, serde::Deserialize)]
struct OrderData {
    order_id: u64,
}

#[derive(Serialize, serde::Deserialize)]
struct Meta {
    id: String,
    schema_version: u32,
}

#[event(fetch)]
async fn fetch(mut req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let queue = env.queue("ORDERS")?;
    match req.path().as_str() {
        // Producer: a JSON array of envelopes, any shape (serde_json::Value).
        // `send_envelopes` sends each as a plain JSON object; workers-rs
        // `queue.send(&value)` would turn a serde_json::Value into a JS Map,
        // which arrives as `{}`.
        "/publish" => {
            let envelopes: Vec<Value> = req.json().await?;
            let sent = send_envelopes(&queue, envelopes).await?;
            Response::from_json(&serde_json::json!({ "sent": sent }))
        }
        // Producer: a typed envelope with workers-rs' own `queue.send`.
        "/publish-typed" => {
            let order: Order = req.json().await?;
            queue.send(&order).await?;
            Response::from_json(&serde_json::json!({ "sent": 1 }))
        }
        _ => Response::error("not found", 404),
    }
}
