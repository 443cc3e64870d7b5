//! The seen-set a consumer dedupes against.
//!
//! [`Store`] has the three operations of the spec (`seen` / `remember` / `forget`)
//! plus optional extensions with default implementations: batch forms, and an
//! in-flight claim (lease) for stores that can take one atomically.
//!
//! The methods are `async` so one trait serves async hosts (Workers, whose storage
//! calls are JS promises) and sync hosts (a wasmtime import, SQLite) alike: a sync
//! store simply returns a ready future, and [`crate::block_on_ready`] drives it.

mod foreign;
mod memory;
pub mod record;
pub mod sql;
mod transactional;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

pub use foreign::{Batch, Foreign, ForeignStore};
pub use memory::{InMemoryStore, StoreEntry};
pub use transactional::{StatementStore, TransactionalStore, TxRun};

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// What kind of failure a store reported (on the wire, its [`code`](Self::code)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
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

    /// The kind whose [`code`](Self::code) this is.
    pub fn from_code(code: &str) -> Option<Self> {
        use StoreErrorKind::*;
        [Unavailable, Unsupported, Invalid, Internal]
            .into_iter()
            .find(|kind| kind.code() == code)
    }
}

/// A typed store failure. Stores never panic; they return this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("store {}: {message}", kind.code())]
pub struct StoreError {
    /// What the backend said (on the wire, `error`).
    #[serde(rename = "error")]
    pub message: String,
    /// What kind of failure.
    pub kind: StoreErrorKind,
}

impl StoreError {
    /// A failure of `kind`.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
        }
    }
    /// The backend could not be reached; retrying may help.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unavailable, message)
    }
    /// The store does not offer this operation.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Unsupported, message)
    }
    /// Anything else the backend reported.
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ClaimToken(pub String);

/// The answer to a claim attempt (on the wire, a [`wire::Claim`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "wire::Claim", from = "wire::Claim")]
pub enum Claim {
    /// The id was free: the caller holds it until it remembers or releases it, or
    /// the lease runs out.
    Acquired(ClaimToken),
    /// The id was already remembered: skip.
    Seen,
    /// Another consumer holds a live claim on the id.
    Held,
}

/// What [`Store::peek_many`] sees of a key now (on the wire, a [`wire::Peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "wire::Peek", from = "wire::Peek")]
pub enum Peeked {
    /// Remembered and not expired: skip.
    Done,
    /// Not done. `claim_ends_in`: a live claim holds the key and runs out in
    /// that long (`Some(ZERO)`: free, nobody holds it); `None`: the store cannot
    /// tell (the default `peek_many`), so it may be held for up to a lease.
    NotDone {
        /// How long the live claim on the key has left, where the store knows.
        claim_ends_in: Option<Duration>,
    },
}

/// What a store offers beyond the three spec operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// `claim` / `release` work (atomically, for this store's audience).
    pub claim: bool,
    /// `remember` honours a TTL.
    pub ttl: bool,
    /// Claims can be kept alive and commits are fenced: `renew` extends a claim
    /// only for its owner, and `remember_fenced` records an id only while the
    /// committing token still owns its claim. Without it, claiming mode works as
    /// before leases were kept: no renewal, and a lost lease goes unnoticed.
    pub lease: bool,
}

/// The writes of one batch step, applied by [`Store::settle`] in one call where
/// the backend can (one transaction, one script, one request per shard).
#[derive(Debug, Clone, Copy, Default)]
pub struct Settlement<'a> {
    /// Keys whose handler succeeded. With a token (claiming mode) the key is
    /// remembered fenced: see [`Store::remember_fenced`]. Without one, plainly.
    pub remember: &'a [(&'a str, Option<&'a ClaimToken>)],
    /// How long remembered keys count as seen (`None`: until forgotten).
    pub ttl: Option<Duration>,
    /// Claims to give up (their handler failed or did not run).
    pub release: &'a [(&'a str, &'a ClaimToken)],
    /// Claims to extend to `lease` from now, where their token still owns them.
    pub renew: &'a [(&'a str, &'a ClaimToken)],
    /// The lease `renew` extends to.
    pub lease: Duration,
}

/// What [`Store::settle`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// One per `remember` entry: `true` if the id was recorded under its own
    /// claim (always `true` without a token); `false` if the claim had been lost.
    pub kept: Vec<bool>,
    /// One per `renew` entry: `true` if the claim is still ours and now lasts
    /// another lease; `false` if it was lost.
    pub renewed: Vec<bool>,
    /// A release that failed. It changes no outcome (the lease runs out by
    /// itself), so it is reported here instead of failing the settlement.
    pub release_error: Option<StoreError>,
}

/// A record of processed message ids.
///
/// Batch-first: the required methods are the batch forms of the spec's
/// operations (`seen_many`, `remember_many`, and `forget`), because every
/// networked backend is batch-native (a pipeline, a statement, one request per
/// shard). Claims are the optional batch primitives `claim_many`, `peek_many` and
/// [`settle`](Store::settle) (a whole batch step: remembers, fenced or not,
/// releases, renewals). The single-key calls are provided on top, as batches of
/// one; a store overrides one only where a single key is cheaper.
///
/// A backend that answers one key per call implements [`KeyStore`] instead and
/// is used through [`PerKey`], the one place that turns a batch into single
/// calls. The guard only ever calls the batch methods.
#[allow(async_fn_in_trait)] // Workers' futures are !Send; no Send bound is wanted.
pub trait Store {
    /// For each key: has it been processed (remembered, and not expired)?
    /// Answers in the same order.
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>>;

    /// Records the keys as processed, for `ttl` or until forgotten. Ends any
    /// claim on them.
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()>;

    /// Drops the key (and any claim on it), so its next delivery runs again.
    async fn forget(&self, key: &str) -> StoreResult<()>;

    /// What this store supports beyond the three spec operations.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// `Some(name)` when this store reads and writes another SDK's records (a
    /// Go or PHP dialect, the Go SDK's PostgreSQL table): the guard then adds no
    /// records of its own there, so payload fingerprints are refused. `None`
    /// (the default): the store's records are ours.
    fn shared_format(&self) -> Option<&'static str> {
        None
    }

    /// For each key: done, or how long a live claim on it has left (the guard
    /// asks about keys another consumer holds, to park them just as long). The
    /// default is `seen_many`, which cannot tell how long: `NotDone` with
    /// `claim_ends_in: None`.
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        Ok(self
            .seen_many(keys)
            .await?
            .into_iter()
            .map(|seen| match seen {
                true => Peeked::Done,
                false => Peeked::NotDone {
                    claim_ends_in: None,
                },
            })
            .collect())
    }

    /// Atomically for each key: `Seen` if remembered, `Held` if claimed by
    /// someone else, else takes a claim that lasts `lease` (so a crashed holder
    /// cannot block forever). Answers in the same order. If the call fails, the
    /// claims it did take are given back (best effort).
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let _ = (keys, lease);
        Err(StoreError::unsupported("this store cannot claim"))
    }

    /// Applies one batch step (see [`Settlement`]) in as few calls as the
    /// backend allows. `Err` means the remembered part is unknown; the guard then
    /// reports those runs unrecorded. The default takes plain remembers only
    /// (`remember_many`): a store that can claim overrides it.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        if !(step.release.is_empty() && step.renew.is_empty())
            || step.remember.iter().any(|(_, token)| token.is_some())
        {
            return Err(StoreError::unsupported("this store cannot claim"));
        }
        let keys: Vec<&str> = step.remember.iter().map(|(key, _)| *key).collect();
        if !keys.is_empty() {
            self.remember_many(&keys, step.ttl).await?;
        }
        Ok(Settled {
            kept: vec![true; keys.len()],
            ..Settled::default()
        })
    }

    /// Has this key been processed? `seen_many` of one key.
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        one("seen_many", self.seen_many(&[key]).await?)
    }

    /// Records one key: `remember_many` of one key.
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.remember_many(&[key], ttl).await
    }

    /// Claims one key: `claim_many` of one key.
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        one("claim_many", self.claim_many(&[key], lease).await?)
    }

    /// Gives up a claim, if `token` still owns it: a one-claim `settle`.
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        let release = [(key, token)];
        let step = Settlement {
            release: &release,
            ..Settlement::default()
        };
        match self.settle(&step).await?.release_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Extends a claim to `lease` from now if `token` still owns it (live or
    /// lapsed but not taken over). `false`: the claim is lost (taken by another
    /// consumer, remembered, forgotten, or expired and gone). A one-claim
    /// `settle`.
    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        let renew = [(key, token)];
        let step = Settlement {
            renew: &renew,
            lease,
            ..Settlement::default()
        };
        Ok(self.settle(&step).await?.renewed.first() == Some(&true))
    }

    /// The fenced commit: remembers `key` if `token` still owns its claim and
    /// answers `true`. Otherwise answers `false` (the lease was lost): the key is
    /// then remembered only if it is free (no live claim of another consumer,
    /// not already remembered), so the effect that did happen is not run again,
    /// and another consumer's live claim is never overwritten. A one-key
    /// `settle`.
    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        let remember = [(key, Some(token))];
        let step = Settlement {
            remember: &remember,
            ttl,
            ..Settlement::default()
        };
        Ok(self.settle(&step).await?.kept.first() == Some(&true))
    }
}

/// The answer of a batch of one.
fn one<T>(op: &str, answers: Vec<T>) -> StoreResult<T> {
    let n = answers.len();
    match <[T; 1]>::try_from(answers) {
        Ok([answer]) => Ok(answer),
        Err(_) => Err(StoreError::internal(format!(
            "{op} of one key gave {n} answers"
        ))),
    }
}

/// A backend that answers one key per call (a JS object with `seen` /
/// `remember` / `forget`, a host import, a test double). Use it as a [`Store`]
/// through [`PerKey`]. Only the three spec operations are required; claims are
/// `unsupported` unless implemented.
#[allow(async_fn_in_trait)]
pub trait KeyStore {
    /// Has this key been processed (remembered, and not expired)?
    async fn seen(&self, key: &str) -> StoreResult<bool>;
    /// Records the key as processed, for `ttl` or until forgotten.
    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()>;
    /// Drops the key and any claim on it.
    async fn forget(&self, key: &str) -> StoreResult<()>;
    /// See [`Store::capabilities`].
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// See [`Store::shared_format`].
    fn shared_format(&self) -> Option<&'static str> {
        None
    }
    /// See [`Store::claim`].
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        let _ = (key, lease);
        Err(StoreError::unsupported("this store cannot claim"))
    }
    /// See [`Store::release`].
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        let _ = (key, token);
        Err(StoreError::unsupported("this store cannot claim"))
    }
    /// See [`Store::renew`].
    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        let _ = (key, token, lease);
        Err(StoreError::unsupported("this store cannot renew claims"))
    }
    /// See [`Store::remember_fenced`].
    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        let _ = (key, token, ttl);
        Err(StoreError::unsupported("this store cannot fence commits"))
    }
}

/// A [`KeyStore`] used as a [`Store`]: every batch is one call per key. The
/// one place a batch step is planned into single calls.
#[derive(Debug, Clone, Default)]
pub struct PerKey<S>(pub S);

impl<S: KeyStore> Store for PerKey<S> {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let mut answers = Vec::with_capacity(keys.len());
        for key in keys {
            answers.push(self.0.seen(key).await?);
        }
        Ok(answers)
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        for key in keys {
            self.0.remember(key, ttl).await?;
        }
        Ok(())
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        self.0.forget(key).await
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn shared_format(&self) -> Option<&'static str> {
        self.0.shared_format()
    }

    /// One `claim` per key. If one fails, the claims already taken are released
    /// (best effort) before the error is returned, so a partial failure does not
    /// hold ids for a whole lease.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let mut answers = Vec::with_capacity(keys.len());
        for key in keys {
            match self.0.claim(key, lease).await {
                Ok(claim) => answers.push(claim),
                Err(e) => {
                    for (key, claim) in keys.iter().zip(&answers) {
                        if let Claim::Acquired(token) = claim {
                            let _ = self.0.release(key, token).await;
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(answers)
    }

    /// Releases first (a failure there is kept in [`Settled::release_error`],
    /// never turned into a failed remember), then renewals, then the remembers,
    /// in order, each one call.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let mut settled = Settled {
            release_error: release_each(&self.0, step.release).await,
            ..Settled::default()
        };
        for (key, token) in step.renew {
            settled
                .renewed
                .push(self.0.renew(key, token, step.lease).await?);
        }
        for (key, token) in step.remember {
            settled.kept.push(match token {
                Some(token) => self.0.remember_fenced(key, token, step.ttl).await?,
                None => self.0.remember(key, step.ttl).await.map(|()| true)?,
            });
        }
        Ok(settled)
    }
}

/// Releases each claim with its own call; the first failure, if any (a release
/// that fails changes no outcome: the lease runs out by itself).
async fn release_each<K: KeyStore>(keys: &K, claims: &[(&str, &ClaimToken)]) -> Option<StoreError> {
    let mut first_error = None;
    for (key, token) in claims {
        if let Err(e) = keys.release(key, token).await {
            first_error.get_or_insert(e);
        }
    }
    first_error
}

/// A batch store seen through its single-key calls, for [`PerKey`]: the
/// one-call-per-key baseline a batch store is measured against
/// (`PerKey(Unbatched(&store))`).
#[derive(Debug)]
pub struct Unbatched<'a, S: ?Sized>(pub &'a S);

impl<S: Store + ?Sized> KeyStore for Unbatched<'_, S> {
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
    fn shared_format(&self) -> Option<&'static str> {
        self.0.shared_format()
    }
    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        self.0.claim(key, lease).await
    }
    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.0.release(key, token).await
    }
    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        self.0.renew(key, token, lease).await
    }
    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        self.0.remember_fenced(key, token, ttl).await
    }
}

/// Every [`Store`] method, stated once, each body handed to `$dispatch!` with
/// the receiver and a call on the inner store `s` (not awaited): the one list
/// behind `&S` / `Arc<S>` / `Box<S>`, [`delegate_store!`] and the testkit's
/// fault wrapper.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_methods {
    ($($ctx:tt)*) => {
        async fn seen_many(&self, keys: &[&str]) -> $crate::StoreResult<::std::vec::Vec<bool>> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.seen_many(keys))
        }
        async fn remember_many(
            &self,
            keys: &[&str],
            ttl: ::std::option::Option<::std::time::Duration>,
        ) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.remember_many(keys, ttl))
        }
        async fn forget(&self, key: &str) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.forget(key))
        }
        fn capabilities(&self) -> $crate::Capabilities {
            $crate::__store_call!(sync [$($ctx)*]; self, s => s.capabilities())
        }
        fn shared_format(&self) -> ::std::option::Option<&'static str> {
            $crate::__store_call!(sync [$($ctx)*]; self, s => s.shared_format())
        }
        async fn peek_many(
            &self,
            keys: &[&str],
        ) -> $crate::StoreResult<::std::vec::Vec<$crate::store::Peeked>> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.peek_many(keys))
        }
        async fn claim_many(
            &self,
            keys: &[&str],
            lease: ::std::time::Duration,
        ) -> $crate::StoreResult<::std::vec::Vec<$crate::Claim>> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.claim_many(keys, lease))
        }
        async fn settle(
            &self,
            step: &$crate::store::Settlement<'_>,
        ) -> $crate::StoreResult<$crate::store::Settled> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.settle(step))
        }
        async fn seen(&self, key: &str) -> $crate::StoreResult<bool> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.seen(key))
        }
        async fn remember(
            &self,
            key: &str,
            ttl: ::std::option::Option<::std::time::Duration>,
        ) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.remember(key, ttl))
        }
        async fn claim(
            &self,
            key: &str,
            lease: ::std::time::Duration,
        ) -> $crate::StoreResult<$crate::Claim> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.claim(key, lease))
        }
        async fn release(&self, key: &str, token: &$crate::ClaimToken) -> $crate::StoreResult<()> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.release(key, token))
        }
        async fn renew(
            &self,
            key: &str,
            token: &$crate::ClaimToken,
            lease: ::std::time::Duration,
        ) -> $crate::StoreResult<bool> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.renew(key, token, lease))
        }
        async fn remember_fenced(
            &self,
            key: &str,
            token: &$crate::ClaimToken,
            ttl: ::std::option::Option<::std::time::Duration>,
        ) -> $crate::StoreResult<bool> {
            $crate::__store_call!(async [$($ctx)*]; self, s => s.remember_fenced(key, token, ttl))
        }
    };
}

/// How each `__store_methods!` body reaches the inner store `s`: through a
/// pointer (`deref`), a variant of an enum (`variants`), or the testkit's fault
/// wrapper (`faulty`).
#[doc(hidden)]
#[macro_export]
macro_rules! __store_call {
    (async [deref]; $self:ident, $s:ident => $call:expr) => {{
        let $s = &**$self;
        $call.await
    }};
    (sync [deref]; $self:ident, $s:ident => $call:expr) => {{
        let $s = &**$self;
        $call
    }};
    (async [variants $enum:ident { $($variant:ident),+ }]; $self:ident, $s:ident => $call:expr) => {
        match $self { $($enum::$variant($s) => $call.await,)+ }
    };
    (sync [variants $enum:ident { $($variant:ident),+ }]; $self:ident, $s:ident => $call:expr) => {
        match $self { $($enum::$variant($s) => $call,)+ }
    };
    (async [faulty]; $self:ident, $s:ident => $call:expr) => {
        $self.call(async || {
            let $s = &$self.inner;
            $call.await
        })
        .await
    };
    (sync [faulty]; $self:ident, $s:ident => $call:expr) => {{
        let $s = &$self.inner;
        $call
    }};
}

impl<S: Store + ?Sized> Store for &S {
    __store_methods!(deref);
}
impl<S: Store + ?Sized> Store for Arc<S> {
    __store_methods!(deref);
}
impl<S: Store + ?Sized> Store for Box<S> {
    __store_methods!(deref);
}

/// Implements [`Store`] for an enum whose every variant holds one store, by calling
/// the same method on the variant's store: for a "whichever backend was configured"
/// type.
///
/// ```
/// use bq_dedupe::{InMemoryStore, store::{PerKey, Unbatched}};
///
/// enum Configured {
///     Plain(InMemoryStore),
///     OneCallPerKey(PerKey<Unbatched<'static, InMemoryStore>>),
/// }
/// bq_dedupe::delegate_store!(Configured { Plain, OneCallPerKey });
/// ```
#[macro_export]
macro_rules! delegate_store {
    ($enum:ident { $($variant:ident),+ $(,)? }) => {
        impl $crate::Store for $enum {
            $crate::__store_methods!(variants $enum { $($variant),+ });
        }
    };
}
