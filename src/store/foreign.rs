//! [`Foreign`]: a store another runtime implements (a JS object, a WIT host),
//! each of whose batch calls is optional: its batch call where it has one, else
//! one call per key through [`PerKey`].

use std::time::Duration;

use super::{
    Capabilities, Claim, KeyStore, PerKey, Settled, Settlement, Store, StoreResult,
    per_key::release_each,
};

/// A batch call a foreign store may make itself: `seen_many`, `remember_many`,
/// `claim_many`, `settle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Batch {
    Seen,
    Remember,
    Claim,
    Settle,
}

/// A foreign store's calls: the single-key ones always, each batch one where
/// [`has`](ForeignStore::has) says so. Used as a [`Store`] through [`Foreign`].
#[allow(async_fn_in_trait)]
pub trait ForeignStore: KeyStore {
    /// Does this store make `call` itself, for a batch of `keys` keys?
    fn has(&self, call: Batch, keys: usize) -> bool;
    /// `Ok` if this store can claim, else the error every claim gets (checked
    /// before any claim call).
    fn can_claim(&self) -> StoreResult<()>;
    /// See [`Store::seen_many`]; called only where the store [`has`](Self::has) it.
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>>;
    /// See [`Store::remember_many`]; called only where the store has it.
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()>;
    /// See [`Store::claim_many`]; called only where the store has it.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>>;
    /// See [`Store::settle`]; called only where the store has it.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled>;
}

/// A [`ForeignStore`] as a [`Store`].
#[derive(Debug, Clone, Default)]
pub struct Foreign<F>(PerKey<F>);

impl<F> Foreign<F> {
    /// The store over `calls`.
    pub fn new(calls: F) -> Self {
        Foreign(PerKey(calls))
    }

    /// The foreign store's calls.
    pub fn calls(&self) -> &F {
        &self.0.0
    }
}

impl<F: ForeignStore> Store for Foreign<F> {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        match self.calls().has(Batch::Seen, keys.len()) {
            true => ForeignStore::seen_many(self.calls(), keys).await,
            false => self.0.seen_many(keys).await,
        }
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        match self.calls().has(Batch::Remember, keys.len()) {
            true => ForeignStore::remember_many(self.calls(), keys, ttl).await,
            false => self.0.remember_many(keys, ttl).await,
        }
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.calls().forget(key).await
    }

    fn capabilities(&self) -> Capabilities {
        self.calls().capabilities()
    }

    fn shared_format(&self) -> Option<&'static str> {
        self.calls().shared_format()
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.calls().can_claim()?;
        match self.calls().has(Batch::Claim, keys.len()) {
            true => ForeignStore::claim_many(self.calls(), keys, lease).await,
            false => self.0.claim_many(keys, lease).await,
        }
    }

    /// The store's `settle` where it has one. Else a step with tokens or
    /// renewals goes one call per key; a plain one (all a store without leases
    /// is given) releases one call each (a failure kept in
    /// [`Settled::release_error`]), then remembers every key with one
    /// `remember_many` where the store has one.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let keys = step.remember.len() + step.release.len() + step.renew.len();
        if self.calls().has(Batch::Settle, keys) {
            return ForeignStore::settle(self.calls(), step).await;
        }
        let fenced = step.remember.iter().any(|(_, token)| token.is_some());
        if fenced || !step.renew.is_empty() {
            return self.0.settle(step).await;
        }
        let release_error = release_each(self.calls(), step.release).await;
        let done: Vec<&str> = step.remember.iter().map(|(key, _)| *key).collect();
        if !done.is_empty() {
            self.remember_many(&done, step.ttl).await?;
        }
        Ok(Settled {
            kept: vec![true; done.len()],
            release_error,
            ..Settled::default()
        })
    }
}
