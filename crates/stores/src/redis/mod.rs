//! [`RedisStore`]: the seen-set as plain Redis string keys, on one server or a
//! Redis Cluster, in one of three record formats ([`Dialect`]; the table of
//! formats is `docs/stores.md`).

mod conn;
mod dialect;
mod scripts;
pub(crate) mod spec;
mod stats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bq_dedupe::store::record::Rules;
use bq_dedupe::{
    Store, StoreError, StoreResult, store::Capabilities, store::Claim, store::ClaimToken,
    store::Peeked, store::Settled, store::Settlement, store::StoreErrorKind,
};
use redis::cluster::ClusterClient;
use redis::{
    Client, Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, TlsCertificates, Value,
};

use crate::{StoreStats, new_token, ttl_ms};
use conn::{Conn, Target, error, error_at, eviction_note, not_a_cluster, open};
pub use dialect::Dialect;
use dialect::Record;
use scripts::{eval, load_scripts, scripts};
use stats::scan_stats;

/// Connect, read and write timeout: a dead server fails the call instead of
/// hanging the consumer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// How many pipelines a claim call sends at most, while its keys' records
/// vanish between a `SET NX` and its `GET` (see `RedisStore::claim_rounds`).
const CLAIM_ROUNDS: usize = 4;

/// A [`Store`] on Redis (one server or a cluster), shared by every consumer that
/// reaches it.
///
/// Each store key is `key_prefix + key`, a string whose value depends on the
/// [`Dialect`]; TTLs and leases are Redis expiries (`PX`), so Redis deletes
/// expired entries itself. A claim is `SET NX`, atomic across all clients. A
/// batch is one pipeline of single-key commands and scripts (one round trip on a
/// single server, one per node on a cluster).
///
/// One connection, behind a lock; an I/O error drops it and the call is retried
/// once on a fresh connection before the store reports itself unavailable.
/// Durability is the server's (RDB/AOF settings).
pub struct RedisStore {
    target: Target,
    conn: Mutex<Option<Conn>>,
    prefix: String,
    dialect: Dialect,
    /// Calls sent again on a fresh connection, or after loading the scripts.
    resent: AtomicU64,
    /// Said once on start-up: a server that may evict our keys.
    notes: Vec<String>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("dialect", &self.dialect)
            .field("cluster", &matches!(self.target, Target::Cluster(..)))
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// How `dialect`'s values follow the record model: Redis deletes a key
    /// when its `PX` runs out, so a lapsed claim is gone at once; PHP's claims
    /// (`1`) name no owner.
    pub const fn rules(dialect: Dialect) -> Rules {
        Rules {
            lapsed_claim_kept: false,
            done_keeps_token: matches!(dialect, Dialect::Native),
            claims_have_owners: matches!(dialect, Dialect::Native),
            remember_resets_expiry: true,
            lapsed_claim_swept: false,
            claim_given_back: false,
        }
    }

    /// [`Self::rules`] of this store's dialect, as every store answers them
    /// ([`AnyStore::record_rules`](crate::AnyStore::record_rules)).
    pub fn record_rules(&self) -> Rules {
        Self::rules(self.dialect())
    }

    /// Connects to `url` (`redis://[:PASSWORD@]HOST[:PORT][/DB]`) in our own
    /// format; every key is stored as `key_prefix + key`.
    pub fn connect(url: &str, key_prefix: impl Into<String>) -> Result<Self, StoreError> {
        Self::connect_dialect(url, key_prefix, Dialect::Native)
    }

    /// Connects to one server, reading and writing `dialect`'s records.
    /// `rediss://` is TLS, trusting the platform's roots (or the PEM file
    /// `SSL_CERT_FILE` names).
    pub fn connect_dialect(
        url: &str,
        key_prefix: impl Into<String>,
        dialect: Dialect,
    ) -> Result<Self, StoreError> {
        Self::connect_single(url, key_prefix.into(), dialect, None)
    }

    /// Connects to one server over TLS (`rediss://`), trusting only the CA
    /// certificates in `ca_pem` (a PEM file's bytes) instead of the platform's.
    pub fn connect_trusting(
        url: &str,
        key_prefix: impl Into<String>,
        dialect: Dialect,
        ca_pem: &[u8],
    ) -> Result<Self, StoreError> {
        Self::connect_single(url, key_prefix.into(), dialect, Some(ca_pem))
    }

    fn connect_single(
        url: &str,
        prefix: String,
        dialect: Dialect,
        ca: Option<&[u8]>,
    ) -> Result<Self, StoreError> {
        let client = match ca {
            None => Client::open(url),
            Some(pem) => Client::build_with_tls(url, certificates(pem)),
        }
        .map_err(|e| {
            // The hint for the part that may be wrong: a URL without user
            // info was told to percent-encode its password (a `?` forgotten
            // before `dialect=`: a trial).
            let hint = match url.contains('@') {
                true => "in a user name or password, @ / ? # % are percent-encoded: %40 %2F %3F %23 %25",
                false => "the form is redis://HOST:PORT[/DB][?prefix=P&dialect=native|php|go]: parameters after a `?`",
            };
            StoreError::new(
                StoreErrorKind::Invalid,
                format!("redis: bad url: {e} ({hint})"),
            )
        })?;
        Self::open_target(Target::Single(client), prefix, dialect)
    }

    /// Connects to a Redis Cluster through any of its nodes
    /// (`redis://[:PASSWORD@]HOST:PORT` each, `rediss://` for TLS), reading and
    /// writing `dialect`'s records.
    pub fn connect_cluster(
        nodes: &[String],
        key_prefix: impl Into<String>,
        dialect: Dialect,
    ) -> Result<Self, StoreError> {
        Self::connect_nodes(nodes, key_prefix.into(), dialect, None)
    }

    /// Connects to a Redis Cluster over TLS (`rediss://` nodes), trusting only
    /// the CA certificates in `ca_pem` instead of the platform's.
    pub fn connect_cluster_trusting(
        nodes: &[String],
        key_prefix: impl Into<String>,
        dialect: Dialect,
        ca_pem: &[u8],
    ) -> Result<Self, StoreError> {
        Self::connect_nodes(nodes, key_prefix.into(), dialect, Some(ca_pem))
    }

    fn connect_nodes(
        nodes: &[String],
        prefix: String,
        dialect: Dialect,
        ca: Option<&[u8]>,
    ) -> Result<Self, StoreError> {
        if nodes.is_empty() {
            return Err(StoreError::new(
                StoreErrorKind::Invalid,
                "redis cluster: no node given",
            ));
        }
        let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(TIMEOUT)
            .response_timeout(TIMEOUT);
        if let Some(pem) = ca {
            builder = builder.certs(certificates(pem));
        }
        let bad = |e: redis::RedisError| {
            StoreError::new(
                StoreErrorKind::Invalid,
                format!("redis cluster: bad node list: {e}"),
            )
        };
        let client = builder.build().map_err(bad)?;
        let first = match ca {
            None => Client::open(nodes[0].as_str()),
            Some(pem) => Client::build_with_tls(nodes[0].as_str(), certificates(pem)),
        }
        .map_err(bad)?;
        Self::open_target(
            Target::Cluster(client, nodes.to_vec(), Box::new(first)),
            prefix,
            dialect,
        )
    }

    fn open_target(target: Target, prefix: String, dialect: Dialect) -> StoreResult<Self> {
        // Which server refused (a certificate, a password): host:port, never
        // the credentials.
        let mut conn = open(&target).map_err(|e| error_at(e, &target.location()))?;
        if let Some(refused) = not_a_cluster(&target) {
            return Err(refused);
        }
        let notes = eviction_note(&target, &mut conn).into_iter().collect();
        Ok(RedisStore {
            target,
            conn: Mutex::new(Some(conn)),
            prefix,
            dialect,
            resent: AtomicU64::new(0),
            notes,
        })
    }

    /// What a host should say once on start-up: a server that evicts keys
    /// when full (a `maxmemory-policy` other than `noeviction`).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The record format this store reads and writes.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// How many calls this store has sent again: after losing its connection
    /// (the first sending may have reached the server), or after loading its
    /// scripts (on a cluster, the commands of other nodes ran the first time).
    /// Each may have taken effect twice: claims, renewals, releases and
    /// commits go by their tokens, and a `forget` is never sent again.
    pub fn resent_calls(&self) -> u64 {
        self.resent.load(Ordering::Relaxed)
    }

    /// Counts the keys under the prefix (`SCAN`, then the values per page):
    /// remembered ids and claims. Keys under the prefix that are neither are not
    /// counted. `expired` is always 0: Redis deletes expired keys itself. On a
    /// cluster every master is scanned (found with `CLUSTER NODES`).
    pub fn stats(&self) -> StoreResult<StoreStats> {
        let prefix = self.prefix.as_str();
        let dialect = self.dialect;
        let Target::Cluster(_, _, first) = &self.target else {
            return self.run(|conn| match conn {
                Conn::Single(conn) => scan_stats(conn, prefix, dialect),
                Conn::Cluster(_) => unreachable!("a single server's connection"),
            });
        };
        let text: String = self.run(|conn| match conn {
            Conn::Cluster(conn) => redis::cmd("CLUSTER").arg("NODES").query(&mut **conn),
            Conn::Single(conn) => redis::cmd("CLUSTER").arg("NODES").query(conn),
        })?;
        let base = first.get_connection_info();
        let mut total = StoreStats::default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            // A master only suspected (`fail?`) is asked too: left out, its ids
            // would go uncounted with no word; one that is down fails the call,
            // naming it.
            if !flags.split(',').any(|f| f == "master") || flags.split(',').any(|f| f == "fail") {
                continue;
            }
            // ip:port@cport[,hostname]: over TLS, the hostname where the node
            // announces one (a certificate may name it alone); else the IP (a
            // name announced may not resolve here).
            let hostport = addr.split(['@', ',']).next().unwrap_or_default();
            let Some((ip, port)) = hostport.rsplit_once(':') else {
                continue;
            };
            let tls = matches!(base.addr(), redis::ConnectionAddr::TcpTls { .. });
            let host = match addr.split_once(',') {
                Some((_, name)) if tls && !name.is_empty() => name,
                _ => ip,
            };
            let port: u16 = port
                .parse()
                .map_err(|_| StoreError::internal(format!("redis cluster: bad node {addr}")))?;
            // The node's address, over TLS as the first node is, with its CA.
            let host = host.to_owned();
            let addr = match base.addr() {
                redis::ConnectionAddr::TcpTls {
                    insecure,
                    tls_params,
                    ..
                } => redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => redis::ConnectionAddr::Tcp(host, port),
            };
            let at = addr.to_string();
            let client = Client::open(base.clone().set_addr(addr)).map_err(error)?;
            let mut conn = match open(&Target::Single(client)).map_err(|e| error_at(e, &at))? {
                Conn::Single(conn) => conn,
                Conn::Cluster(_) => unreachable!("a single server's connection"),
            };
            let node = scan_stats(&mut conn, prefix, dialect).map_err(|e| error_at(e, &at))?;
            total.remembered += node.remembered;
            total.claimed += node.claimed;
        }
        Ok(total)
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

    fn lock(&self) -> StoreResult<MutexGuard<'_, Option<Conn>>> {
        self.conn
            .lock()
            .map_err(|_| StoreError::internal("redis: connection lock poisoned by a panic"))
    }

    /// Runs `op` on the connection, reconnecting and retrying once after an I/O
    /// error other than a timeout, or a cluster redirect. In our format every
    /// operation sent through it is safe to repeat: a claim that landed before
    /// the connection broke is recognised by its token (see [`decide`]), a
    /// commit by its `d:<token>`. In PHP's format, which has no token, a repeat
    /// may park its own claim, read its own commit as lost, or release another
    /// consumer's claim (docs/stores.md). `forget` is sent once
    /// ([`Self::run_sending`]).
    fn run<T>(&self, op: impl Fn(&mut Conn) -> RedisResult<T>) -> StoreResult<T> {
        self.run_sending(2, op)
    }

    /// [`Self::run`], sending `op` at most `sendings` times.
    fn run_sending<T>(
        &self,
        sendings: u32,
        op: impl Fn(&mut Conn) -> RedisResult<T>,
    ) -> StoreResult<T> {
        let mut slot = self.lock()?;
        let mut sent = 0;
        loop {
            let conn = match slot.as_mut() {
                Some(conn) => conn,
                None => slot.insert(open(&self.target).map_err(error)?),
            };
            sent += 1;
            match op(conn) {
                Ok(value) => return Ok(value),
                // No answer in time: sending it again would wait as long again
                // (a stalled server made one call take 15 s). The connection
                // goes: a late answer must not be read as the next call's.
                Err(e) if e.is_timeout() => {
                    *slot = None;
                    return Err(error(e));
                }
                Err(e)
                    if e.is_io_error()
                        || e.is_unrecoverable_error()
                        || stale_slots(&e)
                        || demoted(&e) =>
                {
                    *slot = None;
                    if sent >= sendings {
                        return Err(error(e));
                    }
                    self.resent.fetch_add(1, Ordering::Relaxed);
                }
                // Any other error leaves the connection too: a cluster's
                // pipeline cut short (a node it had to connect to refused the
                // PING: loading, at maxclients, another ACL) left the replies of
                // the nodes it had written to unread, and every later call on
                // it read an earlier one's (a `d` for a new id: skipped, never
                // run; a review).
                Err(e) => {
                    *slot = None;
                    return Err(error(e));
                }
            }
        }
    }

    /// One pipeline of `cmds`, answered one value per command.
    fn pipeline(&self, cmds: Vec<Cmd>) -> StoreResult<Vec<Value>> {
        self.pipeline_with(cmds, Conn::pipeline)
    }

    /// [`Self::pipeline`] with `send` ([`Conn::pipeline`] or
    /// [`Conn::pipeline_each`]).
    fn pipeline_with(
        &self,
        cmds: Vec<Cmd>,
        send: fn(&mut Conn, Vec<Cmd>) -> redis::RedisResult<Vec<Value>>,
    ) -> StoreResult<Vec<Value>> {
        let n = cmds.len();
        let replies = self.run(|conn| match send(conn, cmds.clone()) {
            // A server that has not seen our scripts yet (first use, a restart,
            // a failover, SCRIPT FLUSH): load them and send the batch again. Every
            // step is safe to repeat (see `run`).
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                load_scripts(conn)?;
                self.resent.fetch_add(1, Ordering::Relaxed);
                send(conn, cmds.clone())
            }
            other => other,
        })?;
        if replies.len() != n {
            return Err(StoreError::internal("redis: pipeline answered short"));
        }
        Ok(replies)
    }

    /// The error for a value under our prefix that this dialect does not write.
    fn foreign(&self, what: &str) -> StoreError {
        // The other dialects only (it named the one in use: a trial).
        let others: Vec<String> = (Dialect::ALL.into_iter())
            .filter(|d| *d != self.dialect)
            .map(|d| format!("?dialect={}", d.name()))
            .collect();
        StoreError::internal(format!(
            "redis: a key under {:?} holds a value that is not a {} record ({what}); \
             another SDK's records? pick its dialect ({}) or another prefix",
            self.prefix,
            self.dialect.name(),
            others.join(" or ")
        ))
    }

    /// Refuses claims in the Go dialect, which has no in-flight state.
    fn claims_allowed(&self) -> StoreResult<()> {
        if self.dialect == Dialect::Go {
            return Err(StoreError::unsupported(
                "redis (dialect go): the Go SDK's records have no in-flight state, so claiming \
                 mode is refused; run without claiming, or use dialect php or native",
            ));
        }
        Ok(())
    }

    /// After a claim call that failed: some of its `SET NX`s may have landed
    /// (the connection broke after sending them, or one key held a foreign
    /// value). Gives every one of them back, best effort, by compare-and-delete
    /// on its own token, so a call that answered an error holds no id for a
    /// lease. In PHP's format a claim is `1` for everyone, so deleting one whose
    /// answer was lost could end a PHP consumer's claim: only those this call
    /// saw taken (`acquired`, indices into `keys`) are given back, a moment
    /// after they were set (they lapsed with their lease, 15 minutes by
    /// default, parking the batch's every other id behind one foreign value:
    /// a trial).
    fn give_back(&self, keys: &[&str], tokens: &[ClaimToken], acquired: &[usize]) {
        let ours: Vec<usize> = match self.dialect {
            Dialect::Native => (0..keys.len()).collect(),
            _ => acquired.to_vec(),
        };
        let cmds: Vec<Cmd> = (ours.iter())
            .map(|&i| self.release_cmd(keys[i], &tokens[i]))
            .collect();
        if !cmds.is_empty() {
            let _ = self.pipeline(cmds);
        }
    }

    /// The compare-and-delete of `token`'s claim on `key`.
    fn release_cmd(&self, key: &str, token: &ClaimToken) -> Cmd {
        let mut cmd = eval(&scripts().release, self.key(key));
        cmd.arg(self.dialect.claim_value(token));
        cmd
    }

    /// `SET key <done> [PX ttl]`.
    fn remember_cmd(&self, key: &str, ttl: Option<Duration>) -> Cmd {
        let mut set = redis::cmd("SET");
        set.arg(self.key(key)).arg(self.dialect.done());
        if let Some(ttl) = ttl {
            set.arg("PX").arg(ttl_ms(ttl));
        }
        set
    }

    /// What a GET reply says about a key: seen, or an error for a foreign value.
    fn seen_value(&self, value: &Value) -> StoreResult<bool> {
        match value {
            Value::Nil => Ok(false),
            Value::BulkString(v) => match self.dialect.read(v) {
                Record::Done => Ok(true),
                Record::Claimed => Ok(false),
                Record::Foreign => Err(self.foreign("read")),
            },
            Value::Int(n) => Ok(*n > 0), // EXISTS, in the Go dialect
            other => Err(self.unexpected(other)),
        }
    }

    fn unexpected(&self, reply: &Value) -> StoreError {
        StoreError::internal(format!("redis: unexpected reply {reply:?}"))
    }

    /// Claims `keys` with `tokens`: one pipeline of `SET NX` + `GET` per key,
    /// then again for the keys whose value vanished between the two (the
    /// `SET` found a record, which expired or was deleted before the `GET`):
    /// the next `SET` then takes effect on the key as it is now. After
    /// [`CLAIM_ROUNDS`] such rounds, `Held`, the safe answer (the guard
    /// re-checks, then parks).
    fn claim_rounds(
        &self,
        keys: &[&str],
        tokens: &[ClaimToken],
        lease: Duration,
        acquired: &mut Vec<usize>,
    ) -> StoreResult<Vec<Claim>> {
        let mut answers: Vec<Option<Claim>> = vec![None; keys.len()];
        for _ in 0..CLAIM_ROUNDS {
            let pending: Vec<usize> = (0..keys.len()).filter(|&i| answers[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let mut cmds = Vec::with_capacity(2 * pending.len());
            for &i in &pending {
                let key = self.key(keys[i]);
                let mut set = redis::cmd("SET");
                set.arg(&key)
                    .arg(self.dialect.claim_value(&tokens[i]))
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms(lease));
                let mut get = redis::cmd("GET");
                get.arg(key);
                cmds.push(set);
                cmds.push(get);
            }
            let replies = self.pipeline_with(cmds, Conn::pipeline_each)?;
            // Every answer read, a foreign value's error kept for after: what
            // was taken is known, to be given back.
            let mut failed = None;
            for (&i, pair) in pending.iter().zip(replies.chunks_exact(2)) {
                match self.decide(&pair[0], &pair[1], &tokens[i]) {
                    Ok(answer) => {
                        if matches!(answer, Some(Claim::Acquired(_))) {
                            acquired.push(i);
                        }
                        answers[i] = answer;
                    }
                    Err(e) => failed = failed.or(Some(e)),
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(answers
            .into_iter()
            .map(|answer| answer.unwrap_or(Claim::Held))
            .collect())
    }

    /// A claim's answer from its `SET NX` reply and the `GET` that followed it;
    /// `None` when the key vanished between the two (try again).
    fn decide(&self, set: &Value, got: &Value, token: &ClaimToken) -> StoreResult<Option<Claim>> {
        let ours = self.dialect.claim_value(token);
        Ok(Some(match (set, got) {
            // A key of another type (WRONGTYPE): its SET NX found it, its
            // GET failed.
            (Value::ServerError(e), _) | (_, Value::ServerError(e)) => {
                return Err(self.foreign(&format!("claim: {e}")));
            }
            (Value::Okay, _) => Claim::Acquired(token.clone()),
            (Value::SimpleString(s), _) if s == "OK" => Claim::Acquired(token.clone()),
            (_, Value::BulkString(v)) => match self.dialect.read(v) {
                Record::Done => Claim::Seen,
                // Our own claim, set by an attempt whose reply was lost before a
                // reconnect (only our format can tell: PHP's claims are all `1`).
                Record::Claimed if self.dialect == Dialect::Native && *v == ours => {
                    Claim::Acquired(token.clone())
                }
                Record::Claimed => Claim::Held,
                Record::Foreign => return Err(self.foreign("claim")),
            },
            // Nil: the record the `SET` found expired, or was forgotten, before
            // the `GET`.
            _ => return Ok(None),
        }))
    }
}

impl Store for RedisStore {
    /// Sent once: a `DEL` sent again after a lost connection would also
    /// delete what was written between the two sendings (another consumer's
    /// claim, whose duplicate a third could then claim). A forget that met a
    /// broken connection fails (`Unavailable`); whether to send it again is
    /// the caller's.
    async fn forget(&self, key: &str) -> StoreResult<()> {
        let mut del = redis::cmd("DEL");
        del.arg(self.key(key));
        self.run_sending(1, |conn| conn.pipeline(vec![del.clone()]))
            .map(drop)
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        match self.dialect {
            Dialect::Native => Capabilities::ALL,
            Dialect::Php => Capabilities {
                claim: true,
                ttl: true,
                renew: false,
            },
            Dialect::Go => Capabilities {
                claim: false,
                ttl: true,
                renew: false,
            },
        }
    }

    /// Ours by token; PHP's format by its claim value (the commit script's `p`
    /// mode): a claim gone (an eviction, a failover) or done by another is
    /// told at the commit; a plain `SET 2` said `run-ok` over it (a review).
    fn fences_commits(&self) -> bool {
        self.dialect != Dialect::Go
    }

    /// The PHP and Go dialects hold exactly those SDKs' records, nothing of ours.
    fn shared_format(&self) -> Option<&'static str> {
        match self.dialect {
            Dialect::Native => None,
            Dialect::Php => Some("the PHP SDK's Redis"),
            Dialect::Go => Some("the Go SDK's Redis"),
        }
    }

    /// One pipeline of `GET`s (`EXISTS` in the Go dialect): no `MGET`, so a
    /// batch never spans slots on a cluster.
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        let op = if self.dialect == Dialect::Go {
            "EXISTS"
        } else {
            "GET"
        };
        let cmds = keys
            .iter()
            .map(|key| {
                let mut cmd = redis::cmd(op);
                cmd.arg(self.key(key));
                cmd
            })
            .collect();
        self.pipeline(cmds)?
            .iter()
            .map(|v| self.seen_value(v))
            .collect()
    }

    /// One pipeline of one script per key (its value and time left, read at
    /// one instant): done, a claim's time left, or free (no key: a lapsed
    /// claim expires with its key).
    async fn peek_many(&self, keys: &[&str]) -> StoreResult<Vec<Peeked>> {
        let cmds = (keys.iter())
            .map(|key| eval(&scripts().peek, self.key(key)))
            .collect();
        self.pipeline(cmds)?
            .iter()
            .map(|reply| {
                let free = Peeked::NotDone {
                    claim_ends_in: Some(Duration::ZERO),
                };
                let (value, left) = match reply {
                    Value::Nil => return Ok(free),
                    Value::Array(parts) => match &parts[..] {
                        [Value::BulkString(v), Value::Int(left)] => (v, *left),
                        _ => return Err(self.unexpected(reply)),
                    },
                    other => return Err(self.unexpected(other)),
                };
                match self.dialect.read(value) {
                    Record::Done => Ok(Peeked::Done),
                    // -1: a claim that never runs out; -2: gone since the GET.
                    Record::Claimed => Ok(Peeked::NotDone {
                        claim_ends_in: match left {
                            -1 => None,
                            ms if ms <= 0 => Some(Duration::ZERO),
                            ms => Some(Duration::from_millis(ms as u64)),
                        },
                    }),
                    Record::Foreign => Err(self.foreign("read")),
                }
            })
            .collect()
    }

    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let cmds = keys.iter().map(|k| self.remember_cmd(k, ttl)).collect();
        self.pipeline(cmds).map(|_| ())
    }

    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        self.claims_allowed()?;
        // Tokens are made once, so a retried pipeline recognises its own claims.
        let tokens: Vec<ClaimToken> = keys.iter().map(|_| new_token()).collect();
        let mut acquired = Vec::new();
        let answers = self.claim_rounds(keys, &tokens, lease, &mut acquired);
        if answers.is_err() {
            self.give_back(keys, &tokens, &acquired);
        }
        answers
    }

    /// One pipeline: each key's step is one atomic command or script, so a batch
    /// needs no cross-key transaction (and works on a cluster). In PHP's format a
    /// renewal or fenced commit goes by the value `1` alone (any claimer's).
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        if step.release.is_empty() && step.renew.is_empty() && step.remember.is_empty() {
            return Ok(Settled::default());
        }
        let fenced = step.remember.iter().any(|(_, t)| t.is_some());
        if !step.release.is_empty() || !step.renew.is_empty() || fenced {
            self.claims_allowed()?;
        }
        let dialect = self.dialect;
        let (renew, commit) = (&scripts().renew, &scripts().commit);
        let mut cmds: Vec<Cmd> = step
            .release
            .iter()
            .map(|(key, token)| self.release_cmd(key, token))
            .collect();
        for (key, token) in step.renew {
            let mut cmd = eval(renew, self.key(key));
            cmd.arg(dialect.claim_value(token))
                .arg(ttl_ms(step.lease))
                .arg(dialect.mode());
            cmds.push(cmd);
        }
        let ttl = step.ttl.map_or(0, ttl_ms);
        for (key, token) in step.remember {
            cmds.push(match token {
                Some(token) => {
                    let mut cmd = eval(commit, self.key(key));
                    cmd.arg(dialect.claim_value(token))
                        .arg(dialect.done_by(token))
                        .arg(ttl)
                        .arg(dialect.mode())
                        .arg(dialect.done());
                    cmd
                }
                None => self.remember_cmd(key, step.ttl),
            });
        }
        let replies = self.pipeline(cmds)?;
        // 1: kept or renewed. 0: the claim is gone; -1: the key holds a value
        // this format does not write (put while the handler ran), so the
        // claim is gone too, and nothing was written: that key's answer
        // alone, not the call's (it failed every commit of a batch: a trial).
        let answer = |v: &Value| !matches!(v, Value::Int(n) if *n != 1); // SET's OK: kept
        let replies = &replies[step.release.len()..];
        let (renewed, commits) = replies.split_at(step.renew.len());
        Ok(Settled {
            kept: step
                .remember
                .iter()
                .zip(commits)
                .map(|(_, v)| answer(v))
                .collect(),
            renewed: renewed.iter().map(answer).collect(),
            release_error: None,
        })
    }
}

/// The CAs a TLS connection trusts instead of the platform's.
fn certificates(ca_pem: &[u8]) -> TlsCertificates {
    TlsCertificates {
        client_tls: None,
        root_cert: Some(ca_pem.to_vec()),
    }
}

/// A server that answers `READONLY`: demoted to a replica by a failover, while
/// our connection still reaches it. A new connection (through a name or proxy
/// that now points at the new master) may not: without one, every later call
/// failed the same way until the process restarted (a review).
fn demoted(e: &RedisError) -> bool {
    let read_only = |kind| kind == Some(ServerErrorKind::ReadOnly);
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, e)| read_only(e.kind())))
}

/// A cluster node answered MOVED or ASK to a command: the slot map the
/// connection holds is out of date (a reshard, a failover). The cluster
/// client follows a redirect for one command but not in a pipeline's replies,
/// so a connection kept after one failed every later call on the moved slots
/// (and a running handler's renewals, until its claim lapsed). A new
/// connection reads the map again; `run` sends the call once more (safe to
/// repeat, as after an I/O error). An ASK, a slot caught mid-move, may be
/// answered again: `Unavailable`, tried later.
fn stale_slots(e: &RedisError) -> bool {
    let redirect = |kind| matches!(kind, Some(ServerErrorKind::Moved | ServerErrorKind::Ask));
    e.clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, e)| redirect(e.kind())))
}
