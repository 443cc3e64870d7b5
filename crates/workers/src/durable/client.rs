//! `DurableObjectStore`: the core's `Store` over sharded `DedupeShard` objects.

use std::time::Duration;

use bq_dedupe::{Capabilities, Claim, ClaimToken, Store, StoreError, StoreResult};
use futures_util::future::{join_all, try_join_all};
use wasm_bindgen::JsValue;
use worker::{Method, ObjectNamespace, Request, RequestInit};

use super::protocol::{ClaimReply, Entry, MAX_SAFE_MS, Release, ShardReply, ShardRequest};
use crate::round_trips::RoundTrips;
use crate::shard::{shard_name, shard_of};

/// The seen-set in `shards` Durable Objects of `namespace` (the `DedupeShard`
/// class). Every batch call makes one request per shard it touches, concurrently.
pub struct DurableObjectStore {
    namespace: ObjectNamespace,
    shards: u32,
    round_trips: RoundTrips,
}

impl DurableObjectStore {
    /// `shards` >= 1. Changing it later starts from empty objects (the count is
    /// part of each object's name), so pick it once per queue.
    pub fn new(namespace: ObjectNamespace, shards: u32) -> Self {
        DurableObjectStore {
            namespace,
            shards: shards.max(1),
            round_trips: RoundTrips::new(),
        }
    }

    /// Counts this store's requests into `counter`.
    pub fn with_round_trips(mut self, counter: RoundTrips) -> Self {
        self.round_trips = counter;
        self
    }

    pub fn round_trips(&self) -> &RoundTrips {
        &self.round_trips
    }

    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The live rows of every shard (with `expired`, also expired rows not yet
    /// swept), up to `limit` per shard.
    pub async fn entries(&self, limit: u32, expired: bool) -> StoreResult<Vec<Entry>> {
        let replies = try_join_all(
            (0..self.shards)
                .map(|shard| self.call(shard, ShardRequest::Entries { limit, expired })),
        )
        .await?;
        Ok(replies
            .into_iter()
            .flat_map(|r| r.entries.unwrap_or_default())
            .collect())
    }

    /// Groups key indexes by shard, in first-seen order.
    fn by_shard<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Vec<(u32, Vec<usize>)> {
        let mut groups: Vec<(u32, Vec<usize>)> = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let shard = shard_of(key, self.shards);
            match groups.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, members)) => members.push(i),
                None => groups.push((shard, vec![i])),
            }
        }
        groups
    }

    /// One request to one shard.
    async fn call(&self, shard: u32, request: ShardRequest) -> StoreResult<ShardReply> {
        self.round_trips.add(1);
        let unavailable = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::unavailable(format!("dedupe shard {shard}: {what}: {e}"))
        };
        let body = serde_json::to_string(&request).map_err(|e| unavailable("encode", &e))?;
        let stub = self
            .namespace
            .get_by_name(&shard_name(shard, self.shards))
            .map_err(|e| unavailable("stub", &e))?;
        let mut init = RequestInit::new();
        init.with_method(Method::Post)
            .with_body(Some(JsValue::from_str(&body)));
        let request = Request::new_with_init("https://dedupe-shard/rpc", &init)
            .map_err(|e| unavailable("request", &e))?;
        let mut response = stub
            .fetch_with_request(request)
            .await
            .map_err(|e| unavailable("fetch", &e))?;
        let status = response.status_code();
        if status != 200 {
            let text = response.text().await.unwrap_or_default();
            return Err(StoreError::backend(
                status >= 500,
                format!("dedupe shard {shard}: HTTP {status}: {text}"),
            ));
        }
        response
            .json::<ShardReply>()
            .await
            .map_err(|e| unavailable("reply", &e))
    }

    /// Sends `make(keys of the shard)` to every shard holding one of `keys`
    /// (concurrently) and returns the replies with each shard's key indexes.
    async fn fan_out(
        &self,
        keys: &[&str],
        make: impl Fn(Vec<String>) -> ShardRequest,
    ) -> StoreResult<Vec<(Vec<usize>, ShardReply)>> {
        let groups = self.by_shard(keys.iter().copied());
        try_join_all(groups.into_iter().map(|(shard, members)| {
            let request = make(members.iter().map(|&i| keys[i].to_string()).collect());
            async move { Ok((members, self.call(shard, request).await?)) }
        }))
        .await
    }
}

/// Puts per-shard answers back in the order of the keys asked about.
fn scatter<T: Clone>(
    len: usize,
    parts: Vec<(Vec<usize>, Option<Vec<T>>)>,
    what: &str,
) -> StoreResult<Vec<T>> {
    let mut out: Vec<Option<T>> = vec![None; len];
    for (members, answers) in parts {
        let answers = answers.unwrap_or_default();
        if answers.len() != members.len() {
            return Err(StoreError::internal(format!(
                "dedupe shard answered {} {what} for {} keys",
                answers.len(),
                members.len()
            )));
        }
        for (i, answer) in members.into_iter().zip(answers) {
            out[i] = Some(answer);
        }
    }
    out.into_iter()
        .map(|a| a.ok_or_else(|| StoreError::internal(format!("a key got no {what}"))))
        .collect()
}

/// A duration in whole milliseconds for the wire: at least 1, at most 2^53 - 1.
fn wire_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).map_or(MAX_SAFE_MS, |ms| ms.clamp(1, MAX_SAFE_MS))
}

fn ttl_ms(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(wire_ms)
}

impl Store for DurableObjectStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        Ok(self.seen_many(&[key]).await?[0])
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        self.remember_many(&[key], ttl).await
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        let keys = vec![key.to_string()];
        self.call(shard_of(key, self.shards), ShardRequest::Forget { keys })
            .await
            .map(drop)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: true,
            ttl: true,
        }
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let parts = self
            .fan_out(keys, |keys| ShardRequest::Seen { keys })
            .await?;
        let parts = parts.into_iter().map(|(m, r)| (m, r.seen)).collect();
        scatter(keys.len(), parts, "seen answers")
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        self.commit_many(keys, ttl, &[]).await
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        Ok(self.claim_many(&[key], lease).await?.remove(0))
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        self.commit_many(&[], None, &[(key, token)]).await
    }

    /// One request per shard. If any shard fails, the claims the others took are
    /// released (best effort) before the error is returned, so a partial failure
    /// does not park those ids for a whole lease.
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let lease_ms = wire_ms(lease);
        let groups = self.by_shard(keys.iter().copied());
        let replies = join_all(groups.into_iter().map(|(shard, members)| {
            let request = ShardRequest::Claim {
                keys: members.iter().map(|&i| keys[i].to_string()).collect(),
                lease_ms,
            };
            async move { (members, self.call(shard, request).await) }
        }))
        .await;
        if let Some(error) = replies.iter().find_map(|(_, r)| r.as_ref().err()).cloned() {
            let mut taken: Vec<(&str, ClaimToken)> = Vec::new();
            for (members, reply) in &replies {
                let claims = reply.as_ref().ok().and_then(|r| r.claims.as_ref());
                for (&i, claim) in members.iter().zip(claims.into_iter().flatten()) {
                    if let ClaimReply::Acquired { token } = claim {
                        taken.push((keys[i], ClaimToken(token.clone())));
                    }
                }
            }
            let release: Vec<(&str, &ClaimToken)> = taken.iter().map(|(k, t)| (*k, t)).collect();
            let _ = self.commit_many(&[], None, &release).await;
            return Err(error);
        }
        let parts = replies
            .into_iter()
            .map(|(m, r)| (m, r.ok().and_then(|r| r.claims)))
            .collect();
        let claims = scatter(keys.len(), parts, "claims")?;
        Ok(claims
            .into_iter()
            .map(|claim| match claim {
                ClaimReply::Acquired { token } => Claim::Acquired(ClaimToken(token)),
                ClaimReply::Seen => Claim::Seen,
                ClaimReply::Held => Claim::Held,
            })
            .collect())
    }

    /// One request per shard touched: its remembered keys and released claims.
    async fn commit_many(
        &self,
        done: &[&str],
        ttl: Option<Duration>,
        release: &[(&str, &ClaimToken)],
    ) -> StoreResult<()> {
        let all = done
            .iter()
            .copied()
            .chain(release.iter().map(|(key, _)| *key));
        let groups = self.by_shard(all);
        try_join_all(groups.into_iter().map(|(shard, members)| {
            let mut done_here = Vec::new();
            let mut release_here = Vec::new();
            for i in members {
                match i.checked_sub(done.len()) {
                    None => done_here.push(done[i].to_string()),
                    Some(r) => release_here.push(Release {
                        key: release[r].0.to_string(),
                        token: release[r].1.0.clone(),
                    }),
                }
            }
            let request = ShardRequest::Commit {
                done: done_here,
                ttl_ms: ttl_ms(ttl),
                release: release_here,
            };
            self.call(shard, request)
        }))
        .await
        .map(drop)
    }
}
