//! [`RedisStore`]: the seen-set as plain Redis string keys.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bq_dedupe::{
    Capabilities, Claim, ClaimToken, Settled, Settlement, Store, StoreError, StoreErrorKind,
    StoreResult,
};
use redis::{Client, Connection, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::{StoreStats, new_token, ttl_ms};

/// Connect, read and write timeout: a dead server fails the call instead of
/// hanging the consumer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The value of a remembered key; a claim is `c:<token>`.
const DONE: &[u8] = b"d";

/// Compare-and-delete, so only the claim's owner can release it (a claim re-taken
/// after its lease ran out belongs to someone else).
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                       return redis.call('DEL', KEYS[1]) end return 0";

/// Extends a claim only for its owner: 1 if renewed, 0 if the claim is gone.
const RENEW: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// The fenced commit, in one atomic step per key. ARGV: our claim value, the
/// remembered value, the TTL in ms (0: none). The owner's claim becomes
/// remembered (1). A lost claim (0): the key is remembered only if it is gone
/// (expired or forgotten); a remembered key or another consumer's claim is left.
const COMMIT: &str = "local v = redis.call('GET', KEYS[1]) \
    if v == ARGV[1] or v == false then \
      if ARGV[3] == '0' then redis.call('SET', KEYS[1], ARGV[2]) \
      else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end \
      if v == ARGV[1] then return 1 end \
    end return 0";

/// A [`Store`] on a Redis server, shared by every consumer that reaches it.
///
/// Each store key is `key_prefix + key`, a string whose value is `d` once
/// remembered or `c:<token>` while claimed; TTLs and leases are Redis expiries
/// (`PX`), so Redis deletes expired entries itself. A claim is `SET NX`, atomic
/// across all clients. Batches are pipelined: one round trip each.
///
/// One connection, behind a lock; an I/O error drops it and the call is retried
/// once on a fresh connection before the store reports itself unavailable.
/// Durability is the server's (RDB/AOF settings).
pub struct RedisStore {
    client: Client,
    conn: Mutex<Option<Connection>>,
    prefix: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://[:PASSWORD@]HOST[:PORT][/DB]`); every key is
    /// stored as `key_prefix + key`.
    pub fn connect(url: &str, key_prefix: impl Into<String>) -> Result<Self, StoreError> {
        let client = Client::open(url).map_err(|e| {
            StoreError::new(StoreErrorKind::Invalid, format!("redis: bad url: {e}"))
        })?;
        let conn = open(&client).map_err(error)?;
        Ok(RedisStore {
            client,
            conn: Mutex::new(Some(conn)),
            prefix: key_prefix.into(),
        })
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Counts the keys under the prefix (`SCAN`, then `MGET` per page): remembered
    /// ids and claims. Keys under the prefix that are neither are not counted.
    /// `expired` is always 0: Redis deletes expired keys itself.
    pub fn stats(&self) -> StoreResult<StoreStats> {
        let pattern = format!("{}*", glob_escape(&self.prefix));
        self.run(|conn| {
            let mut stats = StoreStats::default();
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(conn)?;
                if !keys.is_empty() {
                    let mut mget = redis::cmd("MGET");
                    for key in &keys {
                        mget.arg(key);
                    }
                    let values: Vec<Option<Vec<u8>>> = mget.query(conn)?;
                    for value in values.into_iter().flatten() {
                        if value == DONE {
                            stats.remembered += 1;
                        } else if value.starts_with(b"c:") {
                            stats.claimed += 1;
                        }
                    }
                }
                if next == 0 {
                    return Ok(stats);
                }
                cursor = next;
            }
        })
    }

    /// Nothing to do: Redis expires keys itself. Always `Ok(0)`.
    pub fn purge_expired(&self) -> StoreResult<u64> {
        Ok(0)
    }

    fn key(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    fn lock(&self) -> StoreResult<MutexGuard<'_, Option<Connection>>> {
        self.conn
            .lock()
            .map_err(|_| StoreError::internal("redis: connection lock poisoned by a panic"))
    }

    /// Runs `op` on the connection, reconnecting and retrying once after an I/O
    /// error. Every operation here is safe to repeat: a claim that landed before
    /// the connection broke is recognised by its token (see [`decide`]).
    fn run<T>(&self, op: impl Fn(&mut Connection) -> RedisResult<T>) -> StoreResult<T> {
        let mut slot = self.lock()?;
        let mut retried = false;
        loop {
            let conn = match slot.as_mut() {
                Some(conn) => conn,
                None => slot.insert(open(&self.client).map_err(error)?),
            };
            match op(conn) {
                Ok(value) => return Ok(value),
                Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
                    *slot = None;
                    if retried {
                        return Err(error(e));
                    }
                    retried = true;
                }
                Err(e) => return Err(error(e)),
            }
        }
    }
}

fn open(client: &Client) -> RedisResult<Connection> {
    let conn = client.get_connection_with_timeout(TIMEOUT)?;
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    Ok(conn)
}

/// Network trouble and a server that is loading, read-only or failing over may
/// pass (`Unavailable`); anything else is `Internal`.
fn error(e: RedisError) -> StoreError {
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::ReadOnly
            )
        );
    StoreError::backend(transient, format!("redis: {e}"))
}

/// Escapes glob metacharacters so the prefix matches only itself in `SCAN MATCH`.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn claim_value(token: &ClaimToken) -> String {
    format!("c:{}", token.0)
}

/// `SET key d [PX ttl]`, queued on a pipeline.
fn push_remember(pipe: &mut redis::Pipeline, key: Vec<u8>, ttl: Option<Duration>) {
    let set = pipe.cmd("SET").arg(key).arg(DONE);
    if let Some(ttl) = ttl {
        set.arg("PX").arg(ttl_ms(ttl));
    }
    set.ignore();
}

/// A claim's answer from its `SET NX` reply and the `GET` that followed it.
fn decide(set: &Value, got: &Value, token: ClaimToken) -> Claim {
    let ours = claim_value(&token);
    match (set, got) {
        (Value::Okay, _) => Claim::Acquired(token),
        (Value::SimpleString(s), _) if s == "OK" => Claim::Acquired(token),
        (_, Value::BulkString(v)) if v == DONE => Claim::Seen,
        // Our own claim, set by an attempt whose reply was lost before a reconnect.
        (_, Value::BulkString(v)) if *v == ours.as_bytes() => Claim::Acquired(token),
        // Another claim, or nil: the holder finished and was forgotten, or its lease
        // ran out, between our SET and GET. Held is the safe answer (the guard
        // re-checks, then parks).
        _ => Claim::Held,
    }
}

impl Store for RedisStore {
    async fn seen(&self, key: &str) -> StoreResult<bool> {
        let key = self.key(key);
        let value: Option<Vec<u8>> = self.run(|conn| redis::cmd("GET").arg(&key).query(conn))?;
        Ok(value.as_deref() == Some(DONE))
    }

    async fn remember(&self, key: &str, ttl: Option<Duration>) -> StoreResult<()> {
        let key = self.key(key);
        self.run(|conn| {
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(DONE);
            if let Some(ttl) = ttl {
                set.arg("PX").arg(ttl_ms(ttl));
            }
            set.exec(conn)
        })
    }

    async fn forget(&self, key: &str) -> StoreResult<()> {
        let key = self.key(key);
        self.run(|conn| redis::cmd("DEL").arg(&key).exec(conn))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            claim: true,
            ttl: true,
            lease: true,
        }
    }

    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut mget = redis::cmd("MGET");
        for key in keys {
            mget.arg(self.key(key));
        }
        let values: Vec<Option<Vec<u8>>> = self.run(|conn| mget.query(conn))?;
        if values.len() != keys.len() {
            return Err(StoreError::internal("redis: MGET answered the wrong count"));
        }
        Ok(values.iter().map(|v| v.as_deref() == Some(DONE)).collect())
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            push_remember(&mut pipe, self.key(key), ttl);
        }
        self.run(|conn| pipe.exec(conn))
    }

    async fn claim(&self, key: &str, lease: Duration) -> StoreResult<Claim> {
        let mut answers = self.claim_many(&[key], lease).await?;
        answers
            .pop()
            .ok_or_else(|| StoreError::internal("redis: claim gave no answer"))
    }

    async fn release(&self, key: &str, token: &ClaimToken) -> StoreResult<()> {
        let key = self.key(key);
        let value = claim_value(token);
        self.run(|conn| {
            redis::cmd("EVAL")
                .arg(RELEASE)
                .arg(1)
                .arg(&key)
                .arg(&value)
                .exec(conn)
        })
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // Tokens are made once, so a retried pipeline recognises its own claims.
        let tokens: Vec<ClaimToken> = keys.iter().map(|_| new_token()).collect();
        let mut pipe = redis::pipe();
        for (key, token) in keys.iter().zip(&tokens) {
            let key = self.key(key);
            pipe.cmd("SET")
                .arg(&key)
                .arg(claim_value(token))
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms(lease));
            pipe.cmd("GET").arg(key);
        }
        let replies: Vec<Value> = self.run(|conn| pipe.query(conn))?;
        if replies.len() != 2 * keys.len() {
            return Err(StoreError::internal("redis: claim pipeline answered short"));
        }
        Ok(replies
            .chunks_exact(2)
            .zip(tokens)
            .map(|(pair, token)| decide(&pair[0], &pair[1], token))
            .collect())
    }

    async fn renew(&self, key: &str, token: &ClaimToken, lease: Duration) -> StoreResult<bool> {
        let step = Settlement {
            renew: &[(key, token)],
            lease,
            ..Settlement::default()
        };
        Ok(self.settle(&step).await?.renewed.first() == Some(&true))
    }

    async fn remember_fenced(
        &self,
        key: &str,
        token: &ClaimToken,
        ttl: Option<Duration>,
    ) -> StoreResult<bool> {
        let step = Settlement {
            remember: &[(key, Some(token))],
            ttl,
            ..Settlement::default()
        };
        Ok(self.settle(&step).await?.kept.first() == Some(&true))
    }

    /// One pipeline (one round trip): each key's step is one atomic command or
    /// script, so a batch needs no cross-key transaction.
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let mut pipe = redis::pipe();
        for (key, token) in step.release {
            pipe.cmd("EVAL")
                .arg(RELEASE)
                .arg(1)
                .arg(self.key(key))
                .arg(claim_value(token))
                .ignore();
        }
        for (key, token) in step.renew {
            pipe.cmd("EVAL")
                .arg(RENEW)
                .arg(1)
                .arg(self.key(key))
                .arg(claim_value(token))
                .arg(ttl_ms(step.lease));
        }
        let ttl = step.ttl.map_or(0, ttl_ms);
        for (key, token) in step.remember {
            match token {
                Some(token) => {
                    pipe.cmd("EVAL")
                        .arg(COMMIT)
                        .arg(1)
                        .arg(self.key(key))
                        .arg(claim_value(token))
                        .arg(DONE)
                        .arg(ttl);
                }
                None => push_remember(&mut pipe, self.key(key), step.ttl),
            }
        }
        if step.release.is_empty() && step.renew.is_empty() && step.remember.is_empty() {
            return Ok(Settled::default());
        }
        let fenced = step.remember.iter().filter(|(_, t)| t.is_some()).count();
        let replies: Vec<i64> = self.run(|conn| pipe.query(conn))?;
        if replies.len() != step.renew.len() + fenced {
            return Err(StoreError::internal(
                "redis: settle pipeline answered short",
            ));
        }
        let (renewed, mut commits) = (
            replies[..step.renew.len()].iter(),
            replies[step.renew.len()..].iter(),
        );
        let kept = step
            .remember
            .iter()
            .map(|(_, token)| token.is_none() || commits.next() == Some(&1))
            .collect();
        Ok(Settled {
            kept,
            renewed: renewed.map(|&r| r == 1).collect(),
            release_error: None,
        })
    }
}
