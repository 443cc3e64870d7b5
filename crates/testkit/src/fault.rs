//! [`Faulty`]: a store wrapper that fails a chosen call, before or after it
//! takes effect, or sends it twice as a client that lost the first reply does.

use std::any::Any;
use std::sync::Mutex;

use bq_dedupe::store::{Store, StoreError, StoreResult};

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

/// The error of a call a test broke itself in the middle (a connection killed
/// inside a transaction, say), whose outcome nobody knows: the history
/// checker records it as unknown instead of failing the run.
pub fn outcome_unknown(why: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(format!("{OUTCOME_UNKNOWN}: {why}"))
}

/// How [`outcome_unknown`]'s errors begin.
pub(crate) const OUTCOME_UNKNOWN: &str = "injected fault, outcome unknown";

impl<S: Store> Store for Faulty<S> {
    bq_dedupe::__store_methods!(layer);
}
