//! The seen-set a consumer dedupes against.
//!
//! [`Store`] has the three operations of the spec (`seen` / `remember` / `forget`)
//! plus optional extensions with default implementations: batch forms, and an
//! in-flight claim (lease) for stores that can take one atomically.
//!
//! The methods are `async` so one trait serves async hosts (Workers, whose storage
//! calls are JS promises) and sync hosts (a wasmtime import, SQLite) alike: a sync
//! store simply returns a ready future, and [`crate::block_on_ready`] drives it.

mod memory;

use std::sync::Arc;
use std::time::Duration;

pub use memory::{InMemoryStore, StoreEntry};

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// What kind of failure a store reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The backend could not be reached or did not answer; retrying may help.
    Unavailable,
    /// The store does not offer this operation (e.g. claims, TTL without a clock).
    Unsupported,
    /// The store refused the input (e.g. a key it cannot hold).
    Invalid,
    /// Anything else the backend reported.
    Internal,
}

impl StoreErrorKind {
    /// A stable kebab-case code, shared with the WIT contract.
    pub fn code(self) -> &'static str {
        match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Unsupported => "unsupported",
            StoreErrorKind::Invalid => "invalid",
            StoreErrorKind::Internal => "internal",
        }
    }
}

/// A typed store failure. Stores never panic; they return this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store {}: {message}", kind.code())]
pub struct StoreError {
    pub kind: StoreErrorKind,
    pub message: String,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unavailable, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unsupported, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Internal, message)
    }
    /// A backend failure: `Unavailable` when retrying may help, else `Internal`.
    pub fn backend(transient: bool, message: impl Into<String>) -> Self {
        let kind = if transient {
            StoreErrorKind::Unavailable
        } else {
            StoreErrorKind::Internal
        };
        Self::new(kind, message)
    }
}

/// Proof of an in-flight claim, needed to release it (so only the owner can).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub String);

/// The answer to a claim attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The id was free: the caller holds it until it remembers or releases it, or
    /// the lease runs out.
    Acquired(ClaimToken),
    /// The id was already remembered: skip.
    Seen,
    /// Another consumer holds a live claim on the id.
    Held,
}

/// What a store offers beyond the three spec operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// `claim` / `release` work (atomically, for this store's audience).
    pub claim: bool,
    /// `remember` honours a TTL.
    pub ttl: bool,
}

/// A record of processed message ids.
///
/// Only `seen`, `remember` and `forget` are required. The batch forms default to
/// loops over the single calls; a backend with a real batch call (a pipeline, a
/// transaction, one RPC) overrides them to save round trips.
#[allow(async_fn_in_trait)] // Workers' futures are !Send; no Send bound is wanted.
pub trait Store {
    /// Has this key been processed (remembered, and not expired)?
    async fn seen(&self, key: &str) -> StoreResult<bool>;

    /// Records the key as processed, for `ttl` or until forgotten. Ends any claim
    /// on the key.
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()>;

    /// Drops the key (and any claim on it), so its next delivery runs again.
    async fn forget(&self, key: &str) -> StoreResult<()>;

    /// What this store supports beyond the three spec operations.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// `seen` for many keys, answers in the same order.
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let mut answers = Vec::with_capacity(keys.len());
        for key in keys {
            answers.push(self.seen(key).await?);
        }
        Ok(answers)
    }

    /// `remember` for many keys.
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        for key in keys {
            self.remember(key, ttl).await?;
        }
        Ok(())
    }

    /// Atomically: `Seen` if remembered, `Held` if claimed by someone else, else
    /// takes a claim that lasts `lease` (so a crashed holder cannot block forever).
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        let _ = (key, lease);
        Err(StoreError::unsupported("this store cannot claim"))
    }

    /// Gives up a claim, if `token` still owns it.
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        let _ = (key, token);
        Err(StoreError::unsupported("this store cannot claim"))
    }

    /// `claim` for many keys, answers in the same order.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        claim_each(self, keys, lease).await
    }

    /// Settles a batch in one call where the backend can: remembers `done` and
    /// releases the claims in `release`.
    async fn commit_many(
        &self,
        done: &[&str],
        ttl: Option<Duration>,
        release: &[(&str, &ClaimToken)],
    ) -> StoreResult<()> {
        commit_each(self, done, ttl, release).await
    }
}

/// `claim_many` as single `claim` calls. If one fails, the claims already taken
/// are released (best effort) before the error is returned, so a partial failure
/// does not hold ids for a whole lease.
pub async fn claim_each<S: Store + ?Sized>(
    store: &S,
    keys: &[&str],
    lease: Duration,
) -> StoreResult<Vec<Claim>> {
    let mut answers = Vec::with_capacity(keys.len());
    for key in keys {
        match store.claim(key, lease).await {
            Ok(claim) => answers.push(claim),
            Err(e) => {
                for (key, claim) in keys.iter().zip(&answers) {
                    if let Claim::Acquired(token) = claim {
                        let _ = store.release(key, token).await;
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(answers)
}

/// `commit_many` as `remember_many` plus single `release` calls. Every release is
/// attempted even when remembering fails; the first error is returned.
pub async fn commit_each<S: Store + ?Sized>(
    store: &S,
    done: &[&str],
    ttl: Option<Duration>,
    release: &[(&str, &ClaimToken)],
) -> StoreResult<()> {
    let mut first_error = None;
    if !done.is_empty() {
        first_error = store.remember_many(done, ttl).await.err();
    }
    for (key, token) in release {
        if let Err(e) = store.release(key, token).await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Forwards every call, so a store can be shared by reference or `Arc`.
macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        impl<S: Store + ?Sized> Store for $ty {
            async fn seen(&self, key: &str) -> StoreResult<bool> {
                (**self).seen(key).await
            }
            async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
                (**self).remember(key, ttl).await
            }
            async fn forget(&self, key: &str) -> StoreResult<()> {
                (**self).forget(key).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
                (**self).seen_many(keys).await
            }
            async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
                (**self).remember_many(keys, ttl).await
            }
            async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
                (**self).claim(key, lease).await
            }
            async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
                (**self).release(key, token).await
            }
            async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
                (**self).claim_many(keys, lease).await
            }
            async fn commit_many(
                &self,
                done: &[&str],
                ttl: Option<Duration>,
                release: &[(&str, &ClaimToken)],
            ) -> StoreResult<()> {
                (**self).commit_many(done, ttl, release).await
            }
        }
    )*};
}

forward_store!(&S, Arc<S>, Box<S>);

/// Implements [`Store`] for an enum whose every variant holds one store, by calling
/// the same method on the variant's store: for a "whichever backend was configured"
/// type.
///
/// ```
/// use bq_dedupe::{InMemoryStore, store::PerKey};
///
/// enum Configured {
///     Plain(InMemoryStore),
///     OneCallPerKey(PerKey<'static, InMemoryStore>),
/// }
/// bq_dedupe::delegate_store!(Configured { Plain, OneCallPerKey });
/// ```
#[macro_export]
macro_rules! delegate_store {
    ($enum:ident { $($variant:ident),+ $(,)? }) => {
        impl $crate::Store for $enum {
            async fn seen(&self, key: &str) -> $crate::StoreResult<bool> {
                match self { $($enum::$variant(s) => s.seen(key).await,)+ }
            }
            async fn remember(
                &self,
                key: &str,
                ttl: ::std::option::Option<::std::time::Duration>,
            ) -> $crate::StoreResult<()> {
                match self { $($enum::$variant(s) => s.remember(key, ttl).await,)+ }
            }
            async fn forget(&self, key: &str) -> $crate::StoreResult<()> {
                match self { $($enum::$variant(s) => s.forget(key).await,)+ }
            }
            fn capabilities(&self) -> $crate::Capabilities {
                match self { $($enum::$variant(s) => s.capabilities(),)+ }
            }
            async fn seen_many(&self, keys: &[&str]) -> $crate::StoreResult<::std::vec::Vec<bool>> {
                match self { $($enum::$variant(s) => s.seen_many(keys).await,)+ }
            }
            async fn remember_many(
                &self,
                keys: &[&str],
                ttl: ::std::option::Option<::std::time::Duration>,
            ) -> $crate::StoreResult<()> {
                match self { $($enum::$variant(s) => s.remember_many(keys, ttl).await,)+ }
            }
            async fn claim(
                &self,
                key: &str,
                lease: ::std::time::Duration,
            ) -> $crate::StoreResult<$crate::Claim> {
                match self { $($enum::$variant(s) => s.claim(key, lease).await,)+ }
            }
            async fn release(&self, key: &str, token: &$crate::ClaimToken) -> $crate::StoreResult<()> {
                match self { $($enum::$variant(s) => s.release(key, token).await,)+ }
            }
            async fn claim_many(
                &self,
                keys: &[&str],
                lease: ::std::time::Duration,
            ) -> $crate::StoreResult<::std::vec::Vec<$crate::Claim>> {
                match self { $($enum::$variant(s) => s.claim_many(keys, lease).await,)+ }
            }
            async fn commit_many(
                &self,
                done: &[&str],
                ttl: ::std::option::Option<::std::time::Duration>,
                release: &[(&str, &$crate::ClaimToken)],
            ) -> $crate::StoreResult<()> {
                match self { $($enum::$variant(s) => s.commit_many(done, ttl, release).await,)+ }
            }
        }
    };
}

/// A store used through its single-key calls only (`seen`, `remember`, `claim`,
/// `release`): the batch forms are the trait's defaults, one call per key. For a
/// backend without batch calls, and as the baseline a batch store is measured
/// against.
pub struct PerKey<'a, S: ?Sized>(pub &'a S);

impl<S: Store + ?Sized> Store for PerKey<'_, S> {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        self.0.seen(key).await
    }
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.0.remember(key, ttl).await
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.0.forget(key).await
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.0.claim(key, lease).await
    }
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.0.release(key, token).await
    }
}
