//! [`HttpStore`]: the store a worker serves over HTTP (the fixture worker's
//! `/store/*` routes: its `DurableObjectStore` over `DedupeShard`s on workerd)
//! as a native [`Store`], so the store testkit can drive the Durable
//! Object store from outside, on workerd's own clock (see
//! `tests/durable_object.rs`, run by `make workers-test`).

use std::time::Duration;

use bq_dedupe::store::wire::{self, ms};
use bq_dedupe::store::{ClaimToken, Peeked, Settled, Settlement, TxRun};
use bq_dedupe::{
    Store, StoreError, StoreResult, store::Capabilities, store::Claim, store::StoreErrorKind,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

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
    /// `token` the fixture worker asks for.
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

    fn keys(&self, keys: &[&str], ttl: Option<Duration>, lease: Option<Duration>) -> wire::Keys {
        wire::Keys {
            keys: keys.iter().map(|k| format!("{}{k}", self.prefix)).collect(),
            ttl_ms: ttl.map(ms),
            lease_ms: lease.map(ms),
        }
    }

    /// POSTs `body` to `/store/{route}`: the JSON reply, or the store error the
    /// worker answered (its `kind`), or `unavailable` when it cannot be reached.
    fn post(&self, route: &str, body: impl serde::Serialize) -> StoreResult<Value> {
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
        let kind = serde_json::from_value::<StoreError>(value)
            .map_or(StoreErrorKind::Internal, |e| e.kind);
        Err(StoreError::new(
            kind,
            format!("{url}: HTTP {status}: {text}"),
        ))
    }
}

impl HttpStore {
    /// The transactional mode through `/store/transact` (a D1 store): one
    /// effect row for `key` and the key in one batch, the batch refused when
    /// `ok` is false; `claim`, the run's own claim on `key`, cleared by the
    /// batch.
    pub fn transact(
        &self,
        key: &str,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        ok: bool,
    ) -> StoreResult<TxRun<(), ()>> {
        let key = format!("{}{key}", self.prefix);
        let reply = self.post(
            "transact",
            wire::Transact {
                key,
                ttl_ms: ttl.map(ms),
                claim: claim.cloned(),
                ok,
            },
        )?;
        match read::<wire::Run>(&reply, "run")? {
            wire::Run::Aborted(_) => Err(StoreError::internal(format!("transact: {reply}"))),
            run => Ok(run.into()),
        }
    }

    /// How many effect rows `/store/transact` left for `key`.
    pub fn effects(&self, key: &str) -> StoreResult<u64> {
        let reply = self.post("effects", self.keys(&[key], None, None))?;
        read(&reply, "effects")
    }
}

/// `reply[name]` as a `T`.
fn read<T: DeserializeOwned>(reply: &Value, name: &str) -> StoreResult<T> {
    serde_json::from_value(reply[name].clone())
        .map_err(|e| StoreError::internal(format!("`{name}` in {reply}: {e}")))
}

/// `reply[name]`: `n` answers.
fn answers<T: DeserializeOwned>(reply: &Value, name: &str, n: usize) -> StoreResult<Vec<T>> {
    match read::<Vec<T>>(reply, name)? {
        items if items.len() == n => Ok(items),
        _ => Err(StoreError::internal(format!(
            "expected {n} `{name}` in {reply}"
        ))),
    }
}

impl Store for HttpStore {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let reply = self.post("seen", self.keys(keys, None, None))?;
        answers(&reply, "seen", keys.len())
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.post("remember", self.keys(keys, ttl, None)).map(drop)
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.post("forget", self.keys(&[key], None, None)).map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let reply = self.post("peek", self.keys(keys, None, None))?;
        answers(&reply, "peeked", keys.len())
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let reply = self.post("claim", self.keys(keys, None, Some(lease)))?;
        answers(&reply, "claims", keys.len())
    }

    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let mut body = wire::Step::from(step);
        let refs = body.release.iter_mut().chain(body.renew.iter_mut());
        let keys = (refs.map(|r| &mut r.key)).chain(body.remember.iter_mut().map(|r| &mut r.key));
        keys.for_each(|key| key.insert_str(0, &self.prefix));
        let reply = self.post("settle", body)?;
        let settled: wire::Settled = serde_json::from_value(reply)
            .map_err(|e| StoreError::internal(format!("settle: {e}")))?;
        settled.answering(step)
    }
}
