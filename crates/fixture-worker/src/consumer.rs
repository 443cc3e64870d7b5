//! The queue consumer: `bq-orders` through bq-dedupe, and its dead-letter queue
//! into the effect log.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bq_dedupe_workers::bq_dedupe::store::{PerKey, Unbatched};
use bq_dedupe_workers::bq_dedupe::{OutcomeKind, Store, observe::Event};
use bq_dedupe_workers::{
    Action, BatchReport, ConsumeError, DedupeConfig, Delivery, QueueBatch, QueueConsumer,
    RoundTrips, WorkersTimer,
};
use serde::Deserialize;
use worker::{Context, Delay, Env, Result};

use crate::access::directives_enabled;
use crate::effects::{CounterUpdate, EffectLogClient, Invocation};

/// What an envelope's `data` may tell the fixture handler to do (tests use these).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Directives {
    /// Fail while the delivery's attempts (from 0) are below this.
    fail_attempts: u64,
    /// Fail every time.
    always_fail: bool,
    /// Take this long (widens race windows in the concurrency test).
    sleep_ms: u64,
    /// Panic (a crashing handler: the wasm instance aborts).
    panic: bool,
    /// With `EXAMPLE_D1_EFFECTS=on`: while the attempts (from 0) are below this,
    /// the effect's batch also carries a statement D1 refuses, so the batch
    /// fails after the handler ran (a failure between the handler and the write).
    bad_statement_attempts: u64,
    /// With `EXAMPLE_D1_EFFECTS=on`: the handler has nothing to write (`[]`).
    no_statements: bool,
}

#[derive(Deserialize, Default)]
struct Envelope {
    #[serde(default)]
    data: Directives,
}

impl Directives {
    /// The delivery's directives (none unless `enabled`), after its `sleep_ms`.
    async fn of(delivery: &Delivery<'_, '_>, enabled: bool) -> Directives {
        let directives: Directives = if enabled {
            serde_json::from_str::<Envelope>(delivery.message().raw())
                .map(|e| e.data)
                .unwrap_or_default()
        } else {
            Directives::default()
        };
        if directives.sleep_ms > 0 {
            Delay::from(Duration::from_millis(directives.sleep_ms)).await;
        }
        directives
    }
}

pub async fn consume(batch: QueueBatch, env: Env, _ctx: Context) -> Result<()> {
    let log = EffectLogClient::new(&env)?;
    let dead_letter_queue = env
        .var("EXAMPLE_DEAD_LETTER_QUEUE")
        .map(|v| v.to_string())
        .unwrap_or_default();
    if batch.queue() == dead_letter_queue {
        return keep_dead_letters(&batch, &log).await;
    }

    let config = DedupeConfig::from_env(&env)?;
    let round_trips = RoundTrips::new();
    let store = config.store(&env, round_trips.clone())?;
    let switch = |name: &str, on: &str| env.var(name).is_ok_and(|v| v.to_string() == on);
    // Benchmark switches: the naive adapter, and a handler without I/O.
    let naive = switch("EXAMPLE_NAIVE_STORE", "on");
    let handler = Handler {
        effects: (!switch("EXAMPLE_EFFECT_LOG", "off")).then_some(&log),
        directives: directives_enabled(&env),
    };
    let observed = Observed::default();
    let report = if switch("EXAMPLE_D1_EFFECTS", "on") {
        let db = env.d1(&config.d1_binding)?;
        d1_effects::consume(
            config.consumer(&env, store)?,
            &batch,
            &db,
            handler.directives,
        )
        .await?
    } else if naive {
        run(
            config.consumer(&env, PerKey(Unbatched(&store)))?,
            &batch,
            &handler,
            &observed,
        )
        .await?
    } else {
        run(config.consumer(&env, store)?, &batch, &handler, &observed).await?
    };
    log.count(&counters(&report, &round_trips, &observed)).await
}

/// What the consumer's observers saw: the guard's events and the adapter's
/// per-message reports (so `/stats` shows the observer path works end to end).
#[derive(Default, Clone)]
struct Observed {
    outcomes: Rc<Cell<i64>>,
    messages: Rc<Cell<i64>>,
}

async fn run<S: Store>(
    consumer: QueueConsumer<S, (), WorkersTimer>,
    batch: &QueueBatch,
    handler: &Handler<'_>,
    observed: &Observed,
) -> std::result::Result<BatchReport, ConsumeError> {
    let outcomes = observed.outcomes.clone();
    let messages = observed.messages.clone();
    consumer
        .with_observer(move |event: Event<'_>| {
            if let Event::Outcome { .. } = event {
                outcomes.set(outcomes.get() + 1);
            }
        })
        .on_message(move |_| messages.set(messages.get() + 1))
        .consume(batch, async |delivery| handler.handle(delivery).await)
        .await
}

/// The transactional example (`EXAMPLE_D1_EFFECTS=on`, `DEDUPE_STORE=d1`): the
/// handler's effect is a row in D1's `example_effects` (no unique key, so a
/// second write would show), committed with the id in one batch.
mod d1_effects {
    use super::*;
    use bq_dedupe_workers::WorkersStore;
    use wasm_bindgen::JsValue;
    use worker::{D1Database, D1PreparedStatement};

    const EFFECTS: &str =
        "CREATE TABLE IF NOT EXISTS example_effects (id TEXT NOT NULL, attempt INTEGER NOT NULL)";
    const EFFECT: &str = "INSERT INTO example_effects (id, attempt) VALUES (?1, ?2)";
    /// A statement D1 refuses (the table does not exist).
    const REFUSED: &str = "INSERT INTO example_no_such_table (id) VALUES (?1)";

    pub(super) async fn consume(
        consumer: QueueConsumer<WorkersStore, (), WorkersTimer>,
        batch: &QueueBatch,
        db: &D1Database,
        directives: bool,
    ) -> Result<BatchReport> {
        db.prepare(EFFECTS).run().await?;
        Ok(consumer
            .consume_with_statements(batch, async |delivery| {
                statements(db, delivery, directives).await
            })
            .await?)
    }

    async fn statements(
        db: &D1Database,
        delivery: &Delivery<'_, '_>,
        directives: bool,
    ) -> std::result::Result<Vec<D1PreparedStatement>, String> {
        let message = delivery.message();
        let directives = Directives::of(delivery, directives).await;
        if directives.panic {
            panic!("fixture handler told to panic");
        }
        let attempt = delivery.attempts();
        if directives.always_fail || attempt < directives.fail_attempts {
            return Err(format!("fixture handler told to fail (attempt {attempt})"));
        }
        if directives.no_statements {
            return Ok(Vec::new());
        }
        let id = JsValue::from_str(message.id().unwrap_or_default());
        let bind =
            |sql: &str, args: &[JsValue]| db.prepare(sql).bind(args).map_err(|e| e.to_string());
        let mut statements = vec![bind(EFFECT, &[id.clone(), JsValue::from(attempt as f64)])?];
        if attempt < directives.bad_statement_attempts {
            statements.push(bind(REFUSED, &[id])?);
        }
        Ok(statements)
    }
}

/// The fixture handler: its side effect is one row in the effect log (none when
/// the log is switched off for a benchmark). It obeys the test directives in
/// `data` only when `EXAMPLE_TEST_DIRECTIVES=1` (local runs).
struct Handler<'a> {
    effects: Option<&'a EffectLogClient>,
    directives: bool,
}

impl Handler<'_> {
    async fn handle(&self, delivery: &Delivery<'_, '_>) -> std::result::Result<(), String> {
        let message = delivery.message();
        let directives = Directives::of(delivery, self.directives).await;
        if directives.panic {
            panic!("fixture handler told to panic");
        }
        let attempt = delivery.attempts();
        let fail = directives.always_fail || attempt < directives.fail_attempts;
        let invocation = Invocation {
            id: message.id().map(str::to_string),
            fired: !fail,
        };
        if let Some(log) = self.effects {
            log.record(&invocation).await.map_err(|e| e.to_string())?;
        }
        if fail {
            return Err(format!("fixture handler told to fail (attempt {attempt})"));
        }
        Ok(())
    }
}

/// The batch's counts for `GET /stats`.
fn counters(report: &BatchReport, round_trips: &RoundTrips, observed: &Observed) -> CounterUpdate {
    let (rows, round_trips) = (round_trips.rows(), round_trips.get());
    let n = |kinds: &[OutcomeKind]| kinds.iter().map(|&k| report.count(k) as i64).sum::<i64>();
    let add = vec![
        ("batches", 1),
        ("deliveries", report.messages.len() as i64),
        (
            "runs",
            n(&[
                OutcomeKind::Ran,
                OutcomeKind::RanUnrecorded,
                OutcomeKind::RanLeaseLost,
            ]),
        ),
        ("lease_lost", n(&[OutcomeKind::RanLeaseLost])),
        (
            "failures",
            n(&[
                OutcomeKind::Failed,
                OutcomeKind::Panicked,
                OutcomeKind::FailOpenFailed,
            ]),
        ),
        ("skips", n(&[OutcomeKind::Skipped])),
        (
            "fail_open",
            n(&[OutcomeKind::FailOpen, OutcomeKind::FailOpenFailed]),
        ),
        ("parked", n(&[OutcomeKind::Parked])),
        (
            "poison",
            n(&[OutcomeKind::Rejected, OutcomeKind::PayloadMismatch]),
        ),
        (
            "dead_lettered",
            report.count_action(Action::DeadLettered) as i64,
        ),
        (
            "store_errors",
            n(&[OutcomeKind::StoreUnavailable, OutcomeKind::RanUnrecorded]),
        ),
        ("store_round_trips", round_trips as i64),
        ("store_rows_read", rows.read as i64),
        ("store_rows_written", rows.written as i64),
        ("redeliveries", report.redeliveries() as i64),
        ("duplicate_publishes", report.duplicate_publishes() as i64),
        ("observed_outcomes", observed.outcomes.get()),
        ("observed_messages", observed.messages.get()),
    ];
    CounterUpdate {
        add: add.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        max: vec![("max_batch_round_trips".into(), round_trips as i64)],
    }
}

/// A dead letter as the log keeps it: its text, or for a letter sent as a
/// structured clone, JSON with each BigInt written as the string `"10n"` and
/// each `ArrayBuffer` as `{"array_buffer": [its bytes]}` (JSON writes `{}`).
fn letter_text(message: &bq_dedupe_workers::QueueMessage) -> String {
    use wasm_bindgen::{JsCast, JsValue, closure::Closure};
    let bytes = message.body_bytes();
    let letter = message.body();
    let binary =
        letter.is_instance_of::<js_sys::ArrayBuffer>() || js_sys::ArrayBuffer::is_view(&letter);
    if letter.is_string() || binary {
        return String::from_utf8_lossy(&bytes).into_owned();
    }
    let replacer =
        Closure::<dyn FnMut(JsValue, JsValue) -> JsValue>::new(|_key: JsValue, value: JsValue| {
            if value.is_instance_of::<js_sys::ArrayBuffer>() {
                let bytes = js_sys::Array::from(&js_sys::Uint8Array::new(&value));
                let out = js_sys::Object::new();
                let _ = js_sys::Reflect::set(&out, &"array_buffer".into(), &bytes);
                return out.into();
            }
            if value.is_instance_of::<js_sys::Map>() {
                return js_sys::Object::from_entries(&value).map_or(value, Into::into);
            }
            if !value.is_bigint() {
                return value;
            }
            let n = value.unchecked_into::<js_sys::BigInt>().to_string(10);
            n.map_or(JsValue::NULL, |n| JsValue::from_str(&format!("{n}n")))
        });
    let text = js_sys::JSON::stringify_with_replacer(&letter, replacer.as_ref());
    let text = text.ok().and_then(|t| t.as_string()).unwrap_or_default();
    match text.is_empty() {
        true => String::from_utf8_lossy(&bytes).into_owned(),
        false => text,
    }
}

/// Dead letters are kept in the log (so `GET /dead-letters` shows them) and acked.
async fn keep_dead_letters(batch: &QueueBatch, log: &EffectLogClient) -> Result<()> {
    let messages = batch.messages().map_err(worker::Error::RustError)?;
    let bodies: Vec<String> = messages.iter().map(letter_text).collect();
    log.keep_dead_letters(&bodies).await?;
    log.count(&CounterUpdate {
        add: vec![("dead_letters_received".into(), bodies.len() as i64)],
        max: vec![],
    })
    .await?;
    for message in &messages {
        if let Err(e) = message.ack() {
            worker::console_error!("acking a dead letter: {e}");
        }
    }
    Ok(())
}
