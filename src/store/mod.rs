//! The seen-set a consumer dedupes against.
//!
//! [`Store`] has the three operations of the spec (`seen` / `remember` / `forget`)
//! plus optional extensions with default implementations: batch forms, and an
//! in-flight claim (lease) for stores that can take one atomically.
//!
//! The methods are `async` so one trait serves async hosts (Workers, whose storage
//! calls are JS promises) and sync hosts (a wasmtime import, SQLite) alike: a sync
//! store simply returns a ready future, and [`crate::block_on_ready`] drives it.

mod claim;
mod delegate;
mod error;
mod foreign;
mod memory;
mod per_key;
pub mod record;
mod settle;
pub mod sql;
mod transactional;
pub mod wire;

use std::time::Duration;

pub use claim::{Claim, ClaimToken, Peeked};
pub use error::{StoreError, StoreErrorKind, StoreResult};
pub use foreign::{Batch, Foreign, ForeignStore};
pub use memory::{InMemoryStore, StoreEntry};
pub use per_key::{KeyStore, PerKey, Unbatched};
pub use settle::{Settled, Settlement};
pub use transactional::{StatementStore, TransactionalStore, TxRun, each_alone};

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
    /// before leases were kept: no renewal, and a lost lease told only by the
    /// guard's clock (or by a commit fenced by value: [`Store::fences_commits`]).
    pub renew: bool,
}

impl Capabilities {
    /// Every capability: claims, TTLs, renewals and fenced commits.
    pub const ALL: Capabilities = Capabilities {
        claim: true,
        ttl: true,
        renew: true,
    };
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

    /// Whether a claimed success is committed under its claim's token
    /// (`settle`'s `remember` with `Some(token)`), which records the id and
    /// answers `false` when the claim was no longer there to commit under (a
    /// lost lease, reported). By default where claims are kept alive
    /// (`capabilities().renew`); a format whose claims carry no owner may fence
    /// by its claim value alone (PHP's Redis format: a claim gone or done by
    /// another is told, one another consumer took cannot be).
    fn fences_commits(&self) -> bool {
        self.capabilities().renew
    }

    /// Which backend this is, for telemetry: `memory`, `sqlite`, `redis`,
    /// `postgres`, `durable-object`, `kv`, `d1`, ... (`custom` by default).
    fn kind(&self) -> &'static str {
        "custom"
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
