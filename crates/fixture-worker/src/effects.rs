//! `EffectLog`: where the fixture handler's side effects land, with the consumer's
//! counters and the dead letters it received. One object, SQLite-backed, so every
//! count is exact and survives restarts of the local runtime.

use std::cell::Cell;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use wasm_bindgen::JsValue;
use worker::{
    DurableObject, Env, Method, Request, RequestInit, Response, Result, SqlStorage,
    SqlStorageValue, State, Stub, durable_object,
};

const BINDING: &str = "EFFECTS";
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS effects (id TEXT PRIMARY KEY NOT NULL, fired INTEGER NOT NULL, invocations INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS dead_letters (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
";

/// The counters `GET /stats` always reports (0 until they happen).
pub const COUNTERS: &[&str] = &[
    "batches",
    "deliveries",
    "runs",
    "failures",
    "skips",
    "fail_open",
    "parked",
    "lease_lost",
    "poison",
    "dead_lettered",
    "store_errors",
    "store_round_trips",
    "store_rows_read",
    "store_rows_written",
    "max_batch_round_trips",
    "dead_letters_received",
    "redeliveries",
    "duplicate_publishes",
    "observed_outcomes",
    "observed_messages",
];

/// One handler invocation: `fired` when its side effect happened.
#[derive(Serialize, Deserialize)]
pub struct Invocation {
    /// `meta.id`; `None` for a fail-open run (no usable id).
    pub id: Option<String>,
    pub fired: bool,
}

/// Counter increments; names ending in `max_` keep the maximum instead.
#[derive(Serialize, Deserialize, Default)]
pub struct CounterUpdate {
    pub add: Vec<(String, i64)>,
    pub max: Vec<(String, i64)>,
}

#[durable_object]
pub struct EffectLog {
    sql: SqlStorage,
    schema_ready: Cell<bool>,
}

impl DurableObject for EffectLog {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        EffectLog {
            sql,
            schema_ready: Cell::new(false),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        if !self.schema_ready.get() {
            self.sql.exec(SCHEMA, None)?;
            self.schema_ready.set(true);
        }
        let path = req.path();
        match (req.method(), path.as_str()) {
            (Method::Post, "/record") => {
                let invocation: Invocation = req.json().await?;
                self.record(&invocation)?;
                Response::ok("recorded")
            }
            (Method::Post, "/counters") => {
                let update: CounterUpdate = req.json().await?;
                self.update_counters(&update)?;
                Response::ok("counted")
            }
            (Method::Post, "/dead-letter") => {
                let bodies: Vec<String> = req.json().await?;
                for body in bodies {
                    self.sql.exec(
                        "INSERT INTO dead_letters (body) VALUES (?)",
                        vec![body.into()],
                    )?;
                }
                Response::ok("kept")
            }
            (Method::Get, "/effects") => Response::from_json(&self.effects()?),
            (Method::Get, "/stats") => Response::from_json(&self.stats()?),
            (Method::Get, "/dead-letters") => Response::from_json(&self.dead_letters()?),
            _ => Response::error("not found", 404),
        }
    }
}

#[derive(Deserialize)]
struct EffectRow {
    id: String,
    fired: i64,
    invocations: i64,
}

#[derive(Deserialize)]
struct CounterRow {
    name: String,
    value: i64,
}

#[derive(Deserialize)]
struct BodyRow {
    body: String,
}

impl EffectLog {
    fn record(&self, invocation: &Invocation) -> Result<()> {
        let fired = i64::from(invocation.fired);
        match &invocation.id {
            Some(id) => {
                self.sql.exec(
                    "INSERT INTO effects (id, fired, invocations) VALUES (?, ?, 1)
                     ON CONFLICT (id) DO UPDATE SET fired = fired + excluded.fired,
                                                    invocations = invocations + 1",
                    vec![id.as_str().into(), fired.into()],
                )?;
            }
            None => self.update_counters(&CounterUpdate {
                add: vec![
                    ("fail_open_fired".into(), fired),
                    ("fail_open_invocations".into(), 1),
                ],
                max: vec![],
            })?,
        }
        Ok(())
    }

    fn update_counters(&self, update: &CounterUpdate) -> Result<()> {
        for (name, n) in &update.add {
            self.sql.exec(
                "INSERT INTO counters (name, value) VALUES (?, ?)
                 ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
                vec![name.as_str().into(), SqlStorageValue::from(*n)],
            )?;
        }
        for (name, n) in &update.max {
            self.sql.exec(
                "INSERT INTO counters (name, value) VALUES (?, ?)
                 ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
                vec![name.as_str().into(), SqlStorageValue::from(*n)],
            )?;
        }
        Ok(())
    }

    fn counters(&self) -> Result<Map<String, Value>> {
        let rows: Vec<CounterRow> = self
            .sql
            .exec("SELECT name, value FROM counters", None)?
            .to_array()?;
        let mut out: Map<String, Value> =
            COUNTERS.iter().map(|n| (n.to_string(), json!(0))).collect();
        for row in rows {
            out.insert(row.name, json!(row.value));
        }
        Ok(out)
    }

    /// `{"effects": {id: fired}, "total": fired incl. fail-open, "invocations": {id: n},
    /// "invocations_total": n incl. fail-open}`.
    fn effects(&self) -> Result<Value> {
        let rows: Vec<EffectRow> = self
            .sql
            .exec(
                "SELECT id, fired, invocations FROM effects ORDER BY id",
                None,
            )?
            .to_array()?;
        let counters = self.counters()?;
        let counter = |name: &str| counters.get(name).and_then(Value::as_i64).unwrap_or(0);
        let mut effects = Map::new();
        let mut invocations = Map::new();
        let (mut total, mut invocations_total) =
            (counter("fail_open_fired"), counter("fail_open_invocations"));
        for row in rows {
            total += row.fired;
            invocations_total += row.invocations;
            if row.fired > 0 {
                effects.insert(row.id.clone(), json!(row.fired));
            }
            invocations.insert(row.id, json!(row.invocations));
        }
        Ok(json!({
            "effects": effects,
            "total": total,
            "invocations": invocations,
            "invocations_total": invocations_total,
        }))
    }

    fn stats(&self) -> Result<Value> {
        Ok(Value::Object(self.counters()?))
    }

    fn dead_letters(&self) -> Result<Value> {
        let rows: Vec<BodyRow> = self
            .sql
            .exec("SELECT body FROM dead_letters ORDER BY seq", None)?
            .to_array()?;
        let bodies: Vec<Value> = rows
            .into_iter()
            .map(|r| serde_json::from_str(&r.body).unwrap_or(Value::String(r.body)))
            .collect();
        Ok(json!({ "dead_letters": bodies }))
    }
}

/// The consumer's and the routes' handle on the log.
pub struct EffectLogClient {
    stub: Stub,
}

impl EffectLogClient {
    pub fn new(env: &Env) -> Result<Self> {
        let stub = env.durable_object(BINDING)?.get_by_name("effects")?;
        Ok(EffectLogClient { stub })
    }

    pub async fn record(&self, invocation: &Invocation) -> Result<()> {
        self.post("/record", &serde_json::to_string(invocation)?)
            .await
    }

    pub async fn count(&self, update: &CounterUpdate) -> Result<()> {
        self.post("/counters", &serde_json::to_string(update)?)
            .await
    }

    pub async fn keep_dead_letters(&self, bodies: &[String]) -> Result<()> {
        self.post("/dead-letter", &serde_json::to_string(bodies)?)
            .await
    }

    async fn post(&self, path: &str, body: &str) -> Result<()> {
        let mut init = RequestInit::new();
        init.with_method(Method::Post)
            .with_body(Some(JsValue::from_str(body)));
        let req = Request::new_with_init(&format!("https://effects{path}"), &init)?;
        let mut resp = self.stub.fetch_with_request(req).await?;
        if resp.status_code() != 200 {
            let text = resp.text().await.unwrap_or_default();
            return Err(worker::Error::RustError(format!(
                "effect log {path}: {text}"
            )));
        }
        Ok(())
    }

    async fn get(&self, path: &str) -> Result<Response> {
        self.stub
            .fetch_with_str(&format!("https://effects{path}"))
            .await
    }
}

/// `GET /effects`, `/stats`, `/dead-letters`: answered by the log.
pub async fn forward(env: Env, path: &str) -> Result<Response> {
    EffectLogClient::new(&env)?.get(path).await
}
