//! `dedupeQueue(batch, env, handler, options?)`: the Rust adapter's Queues
//! consumer over a JS handler. Configuration, deciding, running, acking,
//! retrying, parking, dead-lettering and lease renewal are the adapter's; this
//! module converts the arguments and the report.

use bq_dedupe_js::{await_value, message_of};
use bq_dedupe_workers::{
    Action, BatchReport, ConsumeError, DedupeConfig, Delivery, MessageReport, QueueBatch,
    QueueConsumer, RoundTrips, WorkersStore, WorkersTimer,
};
use js_sys::{Array, Function, JSON, Object, Reflect};
use wasm_bindgen::prelude::*;
use worker::worker_sys::{D1PreparedStatement as D1PreparedStatementSys, MessageBatch};
use worker::{D1PreparedStatement, Env};

/// The options `dedupeQueue` takes besides the `DEDUPE_*` settings.
const OBSERVER: &str = "observer";

pub(crate) fn type_error(message: &str) -> JsValue {
    js_sys::TypeError::new(message).into()
}

fn set(object: &Object, key: &str, value: &JsValue) {
    let _ = Reflect::set(object, &JsValue::from_str(key), value);
}

/// `env` with the `DEDUPE_*` entries of `options` laid over it (as strings, as
/// wrangler passes vars), then `fixed` settings over those, and the observer, if
/// one is given.
fn configure_with(
    env: &Env,
    options: &JsValue,
    fixed: &[(&str, &str)],
) -> Result<(Env, Option<Function>), JsValue> {
    let overlay = Object::create(env.unchecked_ref());
    for (name, value) in fixed {
        set(&overlay, name, &JsValue::from_str(value));
    }
    if options.is_undefined() || options.is_null() {
        return Ok((JsValue::from(overlay).unchecked_into(), None));
    }
    if !options.is_object() {
        return Err(type_error("options must be an object"));
    }
    let mut observer = None;
    let options_object: &Object = options.unchecked_ref();
    for key in Object::keys(options_object).iter() {
        let name = key.as_string().unwrap_or_default();
        let value = Reflect::get(options, &key)?;
        if name == OBSERVER {
            if value.is_undefined() {
                continue;
            }
            let f = value
                .dyn_into::<Function>()
                .map_err(|_| type_error("options.observer must be a function"))?;
            observer = Some(f);
        } else if name.starts_with("DEDUPE_") {
            if fixed.iter().any(|(f, _)| *f == name) {
                return Err(type_error(&format!("{name} is fixed by this store")));
            }
            if !value.is_undefined() {
                let text = js_sys::JsString::from(value.clone());
                set(&overlay, &name, &text.into());
            }
        } else {
            return Err(type_error(&format!(
                "unknown option {name:?} (options are DEDUPE_* settings and observer)"
            )));
        }
    }
    Ok((JsValue::from(overlay).unchecked_into(), observer))
}

/// The envelope the handler is given: the body itself when the producer sent an
/// object (`v8` or `json`) that JSON writes as the text the core read, else
/// that text parsed (the core has validated it). A structured clone holding
/// `Map`s was read as the object they stand for: the handler gets that object
/// too (it got the Map, `envelope.meta.id` undefined: a trial).
fn envelope_of(body: &JsValue, bytes: &[u8]) -> JsValue {
    let text = String::from_utf8_lossy(bytes);
    if body.is_object()
        && !body.is_instance_of::<js_sys::ArrayBuffer>()
        && !js_sys::ArrayBuffer::is_view(body)
        && JSON::stringify(body)
            .ok()
            .and_then(|t| t.as_string())
            .as_deref()
            == Some(&*text)
    {
        return body.clone();
    }
    JSON::parse(&text).unwrap_or(JsValue::UNDEFINED)
}

/// `envelope` with the `job` the core read, where its own is not that (a
/// blank, `null` or number `job` gives way to `urn`: the handler got the
/// blank, a review): as a copy, the body left as sent.
fn with_job(envelope: JsValue, job: &str) -> JsValue {
    let key = JsValue::from_str("job");
    let own = js_sys::Reflect::get(&envelope, &key).ok();
    if !envelope.is_object() || own.and_then(|j| j.as_string()).as_deref() == Some(job) {
        return envelope;
    }
    let copy = Object::assign(&Object::new(), envelope.unchecked_ref());
    let _ = js_sys::Reflect::set(&copy, &key, &JsValue::from_str(job));
    copy.into()
}

fn action_code(action: Action) -> &'static str {
    match action {
        Action::Ack => "ack",
        Action::Retry => "retry",
        Action::DeadLettered => "dead-letter",
    }
}

fn message_to_js(m: &MessageReport) -> JsValue {
    let o = Object::new();
    set(&o, "id", &JsValue::from_str(&m.queue_message_id));
    let key = m.key.as_deref().map_or(JsValue::NULL, JsValue::from_str);
    set(&o, "key", &key);
    set(&o, "outcome", &JsValue::from_str(m.kind.code()));
    set(&o, "action", &JsValue::from_str(action_code(m.action)));
    let reason = m.reason.as_deref().map_or(JsValue::NULL, JsValue::from_str);
    set(&o, "reason", &reason);
    set(&o, "attempts", &JsValue::from(m.queue_attempts));
    set(&o, "redelivery", &JsValue::from_bool(m.redelivery));
    set(
        &o,
        "duplicatePublish",
        &JsValue::from_bool(m.duplicate_publish),
    );
    o.into()
}

/// `{ messages, outcomes: { "run-ok": n, ... }, actions: { ack, retry,
/// "dead-letter" }, redeliveries, duplicatePublishes }`.
fn report_to_js(report: &BatchReport) -> JsValue {
    let o = Object::new();
    let messages: Array = report.messages.iter().map(message_to_js).collect();
    set(&o, "messages", &messages);
    let outcomes = Object::new();
    let actions = Object::new();
    for action in [Action::Ack, Action::Retry, Action::DeadLettered] {
        let n = report.count_action(action) as u32;
        set(&actions, action_code(action), &JsValue::from(n));
    }
    for m in &report.messages {
        let code = m.kind.code();
        let n = Reflect::get(&outcomes, &JsValue::from_str(code))
            .ok()
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        set(&outcomes, code, &JsValue::from_f64(n + 1.0));
    }
    set(&o, "outcomes", &outcomes);
    set(&o, "actions", &actions);
    set(
        &o,
        "redeliveries",
        &JsValue::from(report.redeliveries() as u32),
    );
    set(
        &o,
        "duplicatePublishes",
        &JsValue::from(report.duplicate_publishes() as u32),
    );
    o.into()
}

/// What `env` and `options` configure (`fixed` settings laid over both): the
/// env as read (options laid over), the configuration, its store and the
/// options' observer.
pub(crate) struct Configured {
    pub(crate) env: Env,
    pub(crate) config: DedupeConfig,
    pub(crate) store: WorkersStore,
    pub(crate) observer: Option<Function>,
}

pub(crate) fn configured(
    env: &Env,
    options: &JsValue,
    fixed: &[(&str, &str)],
) -> Result<Configured, JsValue> {
    let (env, observer) = configure_with(env, options, fixed)?;
    let config = DedupeConfig::from_env(&env).map_err(|e| type_error(&e.0))?;
    let store = config
        .store(&env, RoundTrips::new())
        .map_err(|e| type_error(&e.0))?;
    Ok(Configured {
        env,
        config,
        store,
        observer,
    })
}

/// The consumer `env` and `options` configure, reporting each message to the
/// options' observer.
fn consumer_for(
    env: &Env,
    options: &JsValue,
    fixed: &[(&str, &str)],
) -> Result<QueueConsumer<WorkersStore, (), WorkersTimer>, JsValue> {
    let Configured {
        env,
        config,
        store,
        observer,
    } = configured(env, options, fixed)?;
    let mut consumer = config.consumer(&env, store).map_err(|e| type_error(&e.0))?;
    if let Some(observer) = observer {
        consumer = consumer.on_message(move |m| {
            let _ = observer.call1(&JsValue::NULL, &message_to_js(m));
        });
    }
    Ok(consumer)
}

/// The handler argument of `export`, a function.
fn handler_of(handler: JsValue, export: &str) -> Result<Function, JsValue> {
    handler
        .dyn_into()
        .map_err(|_| type_error(&format!("{export}: handler must be a function")))
}

/// Calls the JS handler with the delivery's envelope, Cloudflare's message and
/// `extra` (the D1 database, for `dedupeQueueD1`), awaiting what it returns.
async fn call_handler(
    handler: &Function,
    delivery: &Delivery<'_, '_>,
    extra: &JsValue,
) -> Result<JsValue, String> {
    let message = delivery.queue_message();
    let envelope = envelope_of(&message.body(), delivery.message().raw().as_bytes());
    let envelope = with_job(envelope, delivery.message().job());
    let called = handler.call3(&JsValue::NULL, &envelope, message.as_js(), extra);
    await_value(called).await.map_err(|e| message_of(&e))
}

fn failed_batch(e: ConsumeError) -> JsValue {
    JsValue::from(js_sys::Error::new(&e.to_string()))
}

/// `dedupeQueue(batch, env, handler, options?)`: consumes a Queues batch. The
/// handler `(envelope, message) => void | Promise<void>` runs once per id; a
/// throw (or rejection) fails that delivery (retried, its id unmarked).
/// Resolves to the report; rejects with a `TypeError` for bad arguments or a
/// configuration error, every message not yet acked then marked for retry (a
/// `queue()` that catches the rejection and returns would have them all acked,
/// unrun: a trial).
#[wasm_bindgen(js_name = dedupeQueue)]
pub async fn dedupe_queue(
    batch: MessageBatch,
    env: Env,
    handler: JsValue,
    options: JsValue,
) -> Result<JsValue, JsValue> {
    let batch = QueueBatch::from(batch);
    let ready = handler_of(handler, "dedupeQueue")
        .and_then(|handler| Ok((handler, consumer_for(&env, &options, &[])?)));
    let (handler, consumer) = ready.inspect_err(|_| batch.retry_all())?;
    let report = consumer
        .consume(&batch, async |delivery| {
            call_handler(&handler, delivery, &JsValue::UNDEFINED)
                .await
                .map(drop)
        })
        .await
        .map_err(failed_batch)?;
    Ok(report_to_js(&report))
}

/// The D1 statements a handler gave back (an array of prepared statements).
fn statements_of(value: JsValue) -> Result<Vec<D1PreparedStatement>, String> {
    let wrong = || {
        "the handler must return (or resolve to) an array of D1 prepared statements, \
         prepared on the database it is given (db.prepare(...).bind(...)), [] for none"
            .to_string()
    };
    if !Array::is_array(&value) {
        return Err(wrong());
    }
    let bind = JsValue::from_str("bind");
    // Read through Reflect, which catches: a Proxy or a getter that throws
    // must fail this delivery, not unwind through the module and wedge it.
    let length = Reflect::get(&value, &JsValue::from_str("length"))
        .ok()
        .and_then(|n| n.as_f64())
        .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= f64::from(u32::MAX))
        .ok_or_else(wrong)?;
    (0..length as u32)
        .map(|i| Reflect::get_u32(&value, i).map_err(|e| message_of(&e)))
        .map(|statement| {
            let statement = statement?;
            let is_statement = statement.is_object()
                && Reflect::get(&statement, &bind).is_ok_and(|f| f.is_function());
            if !is_statement {
                return Err(wrong());
            }
            Ok(D1PreparedStatement::from(
                statement.unchecked_into::<D1PreparedStatementSys>(),
            ))
        })
        .collect()
}

/// `dedupeQueueD1(batch, env, handler, options?)`: exactly-once effects on D1.
/// The handler `(envelope, message, db) => D1PreparedStatement[] | Promise<...>`
/// builds the statements of its effect on `db` without running them; they
/// commit with the id in one `batch()` (one transaction), so the effect happens
/// once or not at all. `db` is the database the ids live in (binding
/// `DEDUPE_D1`, or the one `DEDUPE_D1_BINDING` names: point it at your own),
/// whatever `DEDUPE_STORE` says.
#[wasm_bindgen(js_name = dedupeQueueD1)]
pub async fn dedupe_queue_d1(
    batch: MessageBatch,
    env: Env,
    handler: JsValue,
    options: JsValue,
) -> Result<JsValue, JsValue> {
    let batch = QueueBatch::from(batch);
    let ready = handler_of(handler, "dedupeQueueD1").and_then(|handler| {
        Ok((
            handler,
            consumer_for(&env, &options, &[("DEDUPE_STORE", "d1")])?,
        ))
    });
    let (handler, consumer) = ready.inspect_err(|_| batch.retry_all())?;
    // The database the ids live in: the handler prepares its statements on it
    // (a D1 batch runs every statement in the database it is sent to).
    let WorkersStore::D1(d1) = consumer.guard().store() else {
        batch.retry_all();
        return Err(type_error("dedupeQueueD1: the store is not D1"));
    };
    let db: &JsValue = d1.database().as_ref();
    let report = consumer
        .consume_with_statements(&batch, async |delivery| {
            statements_of(call_handler(&handler, delivery, db).await?)
        })
        .await
        .map_err(failed_batch)?;
    Ok(report_to_js(&report))
}
