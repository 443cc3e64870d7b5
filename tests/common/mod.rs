//! Test helpers: envelopes and a store whose failures a test switches on.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::time::Duration;

use bq_dedupe::{
    InMemoryStore, Store, StoreError, StoreResult, store::Capabilities, store::Claim,
    store::ClaimToken, store::Settled, store::Settlement,
};

/// A valid envelope whose `meta.id` is `id` (a JSON value, so tests can pass
/// numbers, null, or leave it out with `None`).
pub fn envelope_with(id: Option<serde_json::Value>) -> String {
    let mut env = serde_json::json!({
        "job": "urn:babel:orders:created",
        "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "data": {"order_id": 1042},
        "meta": {"queue": "orders", "lang": "php", "schema_version": 1, "created_at": 1749132727000u64},
        "attempts": 0
    });
    if let Some(id) = id {
        env["meta"]["id"] = id;
    }
    env.to_string()
}

/// A valid envelope with a string `meta.id`.
pub fn envelope(id: &str) -> String {
    envelope_with(Some(serde_json::Value::String(id.to_owned())))
}

/// Which store calls fail, and how many of each were made.
#[derive(Default)]
pub struct Faults {
    pub seen: Cell<bool>,
    pub remember: Cell<bool>,
    pub claim: Cell<bool>,
    pub release: Cell<bool>,
}

/// An [`InMemoryStore`] with switchable failures and a call log, to test the
/// guard's policies when a backend misbehaves.
pub struct FlakyStore {
    pub inner: InMemoryStore,
    pub faults: Faults,
    pub calls: RefCell<Vec<&'static str>>,
    pub can_claim: bool,
}

impl FlakyStore {
    pub fn new() -> Self {
        FlakyStore {
            inner: InMemoryStore::new(),
            faults: Faults::default(),
            calls: RefCell::new(Vec::new()),
            can_claim: true,
        }
    }

    pub fn calls(&self) -> Vec<&'static str> {
        self.calls.borrow().clone()
    }

    fn call(&self, name: &'static str, fail: &Cell<bool>) -> StoreResult<()> {
        self.calls.borrow_mut().push(name);
        if fail.get() {
            Err(StoreError::unavailable(format!("{name}: backend down")))
        } else {
            Ok(())
        }
    }
}

impl Store for FlakyStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        self.call("seen", &self.faults.seen)?;
        self.inner.seen(key).await
    }
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.call("remember", &self.faults.remember)?;
        self.inner.remember(key, ttl).await
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.call("forget", &Cell::new(false))?;
        self.inner.forget(key).await
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: self.can_claim,
            ttl: true,
            renew: self.can_claim,
        }
    }
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.call("seen_many", &self.faults.seen)?;
        self.inner.seen_many(keys).await
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.call("remember_many", &self.faults.remember)?;
        self.inner.remember_many(keys, ttl).await
    }
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        if !self.can_claim {
            return Err(StoreError::unsupported("no claims here"));
        }
        self.call("claim", &self.faults.claim)?;
        self.inner.claim(key, lease).await
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        if !self.can_claim {
            return Err(StoreError::unsupported("no claims here"));
        }
        self.call("claim_many", &self.faults.claim)?;
        let mut out = Vec::new();
        for k in keys {
            out.push(self.inner.claim(k, lease).await?);
        }
        Ok(out)
    }
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.call("release", &self.faults.release)?;
        self.inner.release(key, token).await
    }
    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        self.call("renew", &self.faults.claim)?;
        self.inner.renew(key, token, lease).await
    }
    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        self.call("remember_fenced", &self.faults.remember)?;
        self.inner.remember_fenced(key, token, ttl).await
    }
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        self.call("settle", &self.faults.remember)?;
        self.inner.settle(step).await
    }
}
