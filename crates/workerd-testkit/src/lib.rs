//! [`HttpStore`]: the store a worker serves over HTTP (the example worker's
//! `/store/*` routes: its `DurableObjectStore` over `DedupeShard`s on workerd)
//! as a native [`Store`], so the core's store testkit can drive the Durable
//! Object store from outside, on workerd's own clock (see
//! `tests/durable_object.rs`, run by `make workers-test`).

use std::time::Duration;

use bq_dedupe::store::{Peeked, Settled, Settlement, TxRun};
use bq_dedupe::{Capabilities, Claim, ClaimToken, Store, StoreError, StoreErrorKind, StoreResult};
use serde_json::{Value, json};

/// The admin token `scripts/with-worker.sh` configures.
pub const TOKEN: &str = "test-admin-token-0123456789";

/// The worker `scripts/with-worker.sh` started (`BQ_TEST_WORKER_URL`); without
/// it a test fails rather than skips.
pub fn worker_url() -> String {
    std::env::var("BQ_TEST_WORKER_URL")
        .expect("BQ_TEST_WORKER_URL: run this test through scripts/with-worker.sh")
}

/// A fresh key space for one run, `tag` and a counter (the worker keeps every
/// earlier run's rows).
pub fn run_prefix(tag: &str) -> String {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{tag}-{}-{run}:", std::process::id())
}

/// A worker's store routes, every key under `prefix` (one per run, so runs
/// never meet).
#[derive(Debug)]
pub struct HttpStore {
    agent: ureq::Agent,
    base: String,
    auth: String,
    prefix: String,
}

impl HttpStore {
    /// The routes under `base` (`http://127.0.0.1:PORT`), with the bearer
    /// `token` the example worker asks for.
    pub fn new(base: &str, token: &str, prefix: &str) -> Self {
        // Store errors come back as 4xx/5xx with a JSON body: read it.
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build();
        HttpStore {
            agent: config.into(),
            base: base.trim_end_matches('/').to_string(),
            auth: format!("Bearer {token}"),
            prefix: prefix.to_string(),
        }
    }

    fn keys(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| format!("{}{k}", self.prefix)).collect()
    }

    fn refs(&self, claims: &[(&str, &ClaimToken)]) -> Vec<Value> {
        claims
            .iter()
            .map(|(k, t)| json!({ "key": format!("{}{k}", self.prefix), "token": t.0 }))
            .collect()
    }

    /// POSTs `body` to `/store/{route}`: the JSON reply, or the store error the
    /// worker answered (its `kind`), or `unavailable` when it cannot be reached.
    fn post(&self, route: &str, body: Value) -> StoreResult<Value> {
        let url = format!("{}/store/{route}", self.base);
        let mut reply = self
            .agent
            .post(&url)
            .header("authorization", &self.auth)
            .send_json(&body)
            .map_err(|e| StoreError::unavailable(format!("{url}: {e}")))?;
        let status = reply.status().as_u16();
        let text = reply
            .body_mut()
            .read_to_string()
            .map_err(|e| StoreError::unavailable(format!("{url}: {e}")))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|_| StoreError::internal(format!("{url}: HTTP {status}: {text}")))?;
        if status == 200 {
            return Ok(value);
        }
        let kind = match value["kind"].as_str() {
            Some("unsupported") => StoreErrorKind::Unsupported,
            Some("invalid") => StoreErrorKind::Invalid,
            Some("unavailable") => StoreErrorKind::Unavailable,
            _ => StoreErrorKind::Internal,
        };
        Err(StoreError::new(
            kind,
            format!("{url}: HTTP {status}: {text}"),
        ))
    }
}

impl HttpStore {
    /// The transactional mode through `/store/transact` (a D1 store): one
    /// effect row for `key` and the key in one batch, the batch refused when
    /// `ok` is false.
    pub fn transact(
        &self,
        key: &str,
        ttl: Option<Duration>,
        ok: bool,
    ) -> StoreResult<TxRun<(), ()>> {
        let body =
            json!({ "key": format!("{}{key}", self.prefix), "ttl_ms": ttl.map(ms), "ok": ok });
        let reply = self.post("transact", body)?;
        match reply["run"].as_str() {
            Some("committed") => Ok(TxRun::Committed(())),
            Some("already-done") => Ok(TxRun::AlreadyDone),
            Some("held") => Ok(TxRun::Held),
            Some("rolled-back") => Ok(TxRun::RolledBack(())),
            _ => Err(StoreError::internal(format!("transact: {reply}"))),
        }
    }

    /// How many effect rows `/store/transact` left for `key`.
    pub fn effects(&self, key: &str) -> StoreResult<u64> {
        let reply = self.post("effects", json!({ "keys": self.keys(&[key]) }))?;
        reply["effects"]
            .as_u64()
            .ok_or_else(|| StoreError::internal(format!("effects: {reply}")))
    }
}

fn field<'v>(reply: &'v Value, name: &str, n: usize) -> StoreResult<&'v Vec<Value>> {
    match reply[name].as_array() {
        Some(items) if items.len() == n => Ok(items),
        _ => Err(StoreError::internal(format!(
            "expected {n} `{name}` in {reply}"
        ))),
    }
}

fn bools(reply: &Value, name: &str, n: usize) -> StoreResult<Vec<bool>> {
    field(reply, name, n)?
        .iter()
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| StoreError::internal(format!("`{name}`: {v} is not a boolean")))
        })
        .collect()
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl Store for HttpStore {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let reply = self.post("seen", json!({ "keys": self.keys(keys) }))?;
        bools(&reply, "seen", keys.len())
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let body = json!({ "keys": self.keys(keys), "ttl_ms": ttl.map(ms) });
        self.post("remember", body).map(drop)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.post("forget", json!({ "keys": self.keys(&[key]) }))
            .map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: true,
            ttl: true,
            lease: true,
        }
    }

    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let reply = self.post("peek", json!({ "keys": self.keys(keys) }))?;
        field(&reply, "peeked", keys.len())?
            .iter()
            .map(|p| match p["state"].as_str() {
                Some("done") => Ok(Peeked::Done),
                Some("not-done") => Ok(Peeked::NotDone {
                    claim_ends_in: p["claim_ends_in_ms"].as_u64().map(Duration::from_millis),
                }),
                _ => Err(StoreError::internal(format!("peek: {p}"))),
            })
            .collect()
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let body = json!({ "keys": self.keys(keys), "lease_ms": ms(lease) });
        let reply = self.post("claim", body)?;
        field(&reply, "claims", keys.len())?
            .iter()
            .map(|c| match (c["state"].as_str(), c["token"].as_str()) {
                (Some("acquired"), Some(token)) => Ok(Claim::Acquired(ClaimToken(token.into()))),
                (Some("seen"), _) => Ok(Claim::Seen),
                (Some("held"), _) => Ok(Claim::Held),
                _ => Err(StoreError::internal(format!("claim: {c}"))),
            })
            .collect()
    }

    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let remember: Vec<Value> = step
            .remember
            .iter()
            .map(|(k, t)| json!({ "key": format!("{}{k}", self.prefix), "token": t.map(|t| &t.0) }))
            .collect();
        let body = json!({
            "remember": remember,
            "release": self.refs(step.release),
            "renew": self.refs(step.renew),
            "ttl_ms": step.ttl.map(ms),
            "lease_ms": ms(step.lease),
        });
        let reply = self.post("settle", body)?;
        Ok(Settled {
            kept: bools(&reply, "kept", step.remember.len())?,
            renewed: bools(&reply, "renewed", step.renew.len())?,
            release_error: reply["release_error"].as_str().map(StoreError::unavailable),
        })
    }
}
