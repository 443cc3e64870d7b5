//! Backends that answer one key per call, and the one place a batch becomes single calls.

use std::time::Duration;

use super::{Capabilities, Claim, ClaimToken, Settled, Settlement, Store, StoreError, StoreResult};

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
    /// See [`Store::kind`].
    fn kind(&self) -> &'static str {
        "custom"
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

    fn kind(&self) -> &'static str {
        self.0.kind()
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
pub(super) async fn release_each<K: KeyStore>(
    keys: &K,
    claims: &[(&str, &ClaimToken)],
) -> Option<StoreError> {
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
    fn kind(&self) -> &'static str {
        self.0.kind()
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
