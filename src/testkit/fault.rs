//! [`Faulty`]: a store wrapper that fails a chosen call, before or after it
//! takes effect, or sends it twice as a client that lost the first reply does.

use std::any::Any;
use std::sync::Mutex;
use std::time::Duration;

use crate::store::{
    Capabilities, Claim, ClaimToken, Peeked, Settled, Settlement, Store, StoreError, StoreResult,
};

/// What happens to the next call of a [`Faulty`] store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with `Unavailable` without reaching the store (nothing happened).
    Before,
    /// Reaches the store, then fails with `Unavailable`: it happened, the reply
    /// was lost (the error-after-commit case).
    After,
    /// Reaches the store twice and answers the second reply: a client that
    /// re-sent a call whose first reply it lost (a Redis pipeline run again after
    /// an I/O error, a request retried after a lost connection).
    Resend,
}

/// Wraps a store so the testkit (or a test) can make its next call fail.
#[derive(Debug)]
pub struct Faulty<S> {
    inner: S,
    armed: Mutex<Option<Fault>>,
    /// The reply an [`Fault::After`] swallowed (the first one, for `Resend`), so
    /// a checker can tell what really happened.
    swallowed: Mutex<Option<Box<dyn Any + Send>>>,
}

impl<S: Store> Faulty<S> {
    /// `inner`, with no fault armed.
    pub fn new(inner: S) -> Self {
        Faulty {
            inner,
            armed: Mutex::new(None),
            swallowed: Mutex::new(None),
        }
    }

    /// The next call (only that one) meets `fault`.
    pub fn arm(&self, fault: Fault) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
    }

    /// Whether an armed fault is still waiting for a call.
    pub fn armed(&self) -> bool {
        self.armed.lock().is_ok_and(|a| a.is_some())
    }

    /// The reply the last `After` or `Resend` fault kept from the caller, if it
    /// was a `T` (taken: a second call answers `None`).
    pub fn take_swallowed<T: 'static>(&self) -> Option<T> {
        let mut slot = self.swallowed.lock().unwrap_or_else(|e| e.into_inner());
        let any = slot.take()?;
        any.downcast::<T>().ok().map(|b| *b)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    async fn call<T: Send + 'static>(
        &self,
        call: impl AsyncFn() -> StoreResult<T>,
    ) -> StoreResult<T> {
        let fault = self.armed.lock().unwrap_or_else(|e| e.into_inner()).take();
        let injected = |when: &str| StoreError::unavailable(format!("injected fault ({when})"));
        match fault {
            None => call().await,
            Some(Fault::Before) => Err(injected("before the call")),
            Some(Fault::After) => {
                let reply = call().await;
                *self.swallowed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(reply));
                Err(injected("after the call took effect"))
            }
            Some(Fault::Resend) => {
                let first = call().await;
                *self.swallowed.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(first));
                call().await
            }
        }
    }
}

impl<S: Store> Store for Faulty<S> {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        self.call(async || self.inner.seen(key).await).await
    }
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.call(async || self.inner.remember(key, ttl).await)
            .await
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.call(async || self.inner.forget(key).await).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn shared_format(&self) -> Option<&'static str> {
        self.inner.shared_format()
    }
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        self.call(async || self.inner.seen_many(keys).await).await
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.call(async || self.inner.remember_many(keys, ttl).await)
            .await
    }
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        self.call(async || self.inner.peek_many(keys).await).await
    }
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.call(async || self.inner.claim(key, lease).await).await
    }
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.call(async || self.inner.release(key, token).await)
            .await
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.call(async || self.inner.claim_many(keys, lease).await)
            .await
    }
    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        self.call(async || self.inner.renew(key, token, lease).await)
            .await
    }
    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        self.call(async || self.inner.remember_fenced(key, token, ttl).await)
            .await
    }
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        self.call(async || self.inner.settle(step).await).await
    }
}
