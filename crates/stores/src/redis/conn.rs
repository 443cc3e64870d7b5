//! The connection: one server or a cluster, one pipeline per call, and what a
//! Redis error means for the caller.

use bq_dedupe::StoreError;
use bq_dedupe::store::StoreErrorKind;
use redis::cluster::{ClusterClient, ClusterConnection, cluster_pipe};
use redis::{Client, Cmd, Connection, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::TIMEOUT;

/// Where the store's connection goes: one server, or a Redis Cluster.
pub(super) enum Target {
    Single(Client),
    /// The client, the node URLs it was given, and a client of the first
    /// node: its credentials and TLS settings (the CA too) reach every master
    /// [`RedisStore::stats`](super::RedisStore::stats) scans.
    Cluster(ClusterClient, Vec<String>, Box<Client>),
}

impl Target {
    /// `host:port` of the server, or of each node: never the credentials.
    pub(super) fn location(&self) -> String {
        match self {
            Target::Single(client) => client.get_connection_info().addr().to_string(),
            Target::Cluster(_, nodes, _) => nodes
                .iter()
                .map(|n| {
                    let rest = n.split_once("://").map_or(n.as_str(), |(_, r)| r);
                    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
                    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
                })
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

pub(super) enum Conn {
    Single(Connection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    /// The commands in one pipeline: one round trip on a single server; on a
    /// cluster the client groups them by the node owning each key's slot (one
    /// round trip per node touched). Every command names one key, so nothing is
    /// ever cross-slot.
    pub(super) fn pipeline(&mut self, cmds: Vec<Cmd>) -> RedisResult<Vec<Value>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Conn::Single(conn) => {
                let mut pipe = redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                pipe.query(&mut Deadlined(conn))
            }
            Conn::Cluster(conn) => {
                let mut pipe = cluster_pipe();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                pipe.query(conn)
            }
        }
    }

    /// [`Self::pipeline`], on one server with a key of another type's
    /// WRONGTYPE left in its reply's place: the other replies are read (a
    /// claim call took some keys beside it, and failed as one before they
    /// were known, so none was given back and PHP's format parked the batch's
    /// other ids for the lease: a review). Any other error is the call's, as
    /// there. (A cluster pipeline cannot leave its errors: as there.)
    pub(super) fn pipeline_each(&mut self, cmds: Vec<Cmd>) -> RedisResult<Vec<Value>> {
        let Conn::Single(conn) = self else {
            return self.pipeline(cmds);
        };
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        let replies: Vec<Value> = pipe.query(&mut Deadlined(conn))?;
        let other = replies.iter().find_map(|reply| match reply {
            Value::ServerError(e) if e.code() != "WRONGTYPE" => Some(e.clone()),
            _ => None,
        });
        match other {
            Some(e) => Err(e.into()),
            None => Ok(replies),
        }
    }
}

/// A server's connection whose pipeline is answered within one [`TIMEOUT`]
/// in all: redis-rs reads each reply of a pipeline after a timeout too, each
/// with the socket's own timeout (a stopped server made a pipeline of six
/// commands wait 30 s: a trial). The first error ends the reading; the
/// caller then drops the connection, unread replies and all.
struct Deadlined<'c>(&'c mut Connection);

impl redis::ConnectionLike for Deadlined<'_> {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let deadline = std::time::Instant::now() + TIMEOUT;
        self.0.send_packed_command(cmd)?;
        let mut replies = Vec::with_capacity(count);
        let (mut read, mut due) = (0, offset + count);
        let answered = loop {
            if read == due {
                break Ok(replies);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                let late = std::io::Error::new(std::io::ErrorKind::TimedOut, "pipeline");
                break Err(late.into());
            }
            if let Err(e) = self.0.set_read_timeout(Some(left)) {
                break Err(e);
            }
            match self.0.recv_response() {
                // RESP3 push data between replies is not a reply.
                Ok(Value::Push { .. }) => due += 1,
                Ok(reply) if read >= offset => replies.push(reply),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
            read += 1;
        };
        self.0.set_read_timeout(Some(TIMEOUT))?;
        answered
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.0.check_connection()
    }

    fn is_open(&self) -> bool {
        self.0.is_open()
    }
}

pub(super) fn open(target: &Target) -> RedisResult<Conn> {
    match target {
        Target::Single(client) => {
            let mut conn = client.get_connection_with_timeout(TIMEOUT)?;
            conn.set_read_timeout(Some(TIMEOUT))?;
            conn.set_write_timeout(Some(TIMEOUT))?;
            // The client sends nothing on connect without a password: a
            // server that requires one would answer NOAUTH only to the first
            // call, as if it were down. Asked here, it says so at once.
            match redis::cmd("PING").query::<()>(&mut conn) {
                // A user whose ACL leaves PING out: let in all the same.
                Err(e) if e.code() == Some("NOPERM") => {}
                other => other?,
            }
            Ok(Conn::Single(conn))
        }
        Target::Cluster(client, _, _) => Ok(Conn::Cluster(Box::new(client.get_connection()?))),
    }
}

/// A connection to a cluster's first node, for what is asked of one node
/// alone (its nodes are configured alike), every reply within [`TIMEOUT`].
fn first_node(first: &Client) -> RedisResult<Connection> {
    let conn = first.get_connection_with_timeout(TIMEOUT)?;
    // The timeout above is the handshake's alone: a node that stalled after
    // it would hold the connect (a review).
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    Ok(conn)
}

/// A cluster spec whose first node is a server out of cluster mode: opened
/// without a word, every call then failed "Missing slot coverage",
/// store-unavailable, run after run (a trial). Said at the open instead.
/// (Not told when the first node does not answer: the others may.)
pub(super) fn not_a_cluster(target: &Target) -> Option<StoreError> {
    let Target::Cluster(_, _, first) = target else {
        return None;
    };
    let mut conn = first_node(first).ok()?;
    let info: String = redis::cmd("INFO").arg("cluster").query(&mut conn).ok()?;
    let disabled = info.lines().any(|line| line.trim() == "cluster_enabled:0");
    // Some servers speak the cluster protocol and say 0 (RedisRaft with
    // sharding, EloqKV single-node): refused only where that is refused too
    // (a review).
    let mut speaks_cluster =
        || (redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(&mut conn)).is_ok();
    (disabled && !speaks_cluster()).then(|| {
        StoreError::new(
            StoreErrorKind::Invalid,
            format!(
                "redis cluster: {} is a server out of cluster mode (cluster_enabled:0): \
                 use redis:// (rediss:// for TLS) for one server",
                target.location().split(',').next().unwrap_or_default()
            ),
        )
    })
}

/// What to say on start-up where the server may evict keys under memory
/// pressure (a `maxmemory` with a policy other than `noeviction`, as managed
/// services often set): an evicted done record reads as never processed, and
/// its redelivery runs again unreported (a review). Nothing where the server
/// will not say (`INFO` refused to this user).
pub(super) fn eviction_note(target: &Target, conn: &mut Conn) -> Option<String> {
    let info: String = match (target, conn) {
        (Target::Single(_), Conn::Single(conn)) => redis::cmd("INFO").arg("memory").query(conn),
        // The first node's: the cluster's nodes are configured alike.
        (Target::Cluster(_, _, first), _) => {
            first_node(first).and_then(|mut conn| redis::cmd("INFO").arg("memory").query(&mut conn))
        }
        _ => return None,
    }
    .ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let policy = field("maxmemory_policy")?;
    let limited = field("maxmemory").is_some_and(|bytes| bytes != "0");
    (limited && policy != "noeviction").then(|| {
        format!(
            "redis: the server evicts keys when full (maxmemory-policy {policy}): an evicted \
             id reads as never processed and runs again, and an evicted claim lets a second \
             consumer run beside the first; set maxmemory-policy noeviction (docs/stores.md)"
        )
    })
}

/// Network trouble and a server that is loading, read-only or failing over may
/// pass (`Unavailable`); anything else is `Internal`.
pub(super) fn error(e: RedisError) -> StoreError {
    if e.is_timeout() {
        // The OS says "Resource temporarily unavailable" for a read timeout.
        let secs = super::TIMEOUT.as_secs();
        return StoreError::unavailable(format!("redis: no answer within {secs} s ({e})"));
    }
    StoreError::backend(transient(&e), format!("redis: {}", shown(&e)))
}

/// `e` as said in an error: a pipeline's failures, one per command (a
/// cluster down answers each of a page's keys: 20 KB), as the first of them
/// and how many more.
fn shown(e: &RedisError) -> String {
    match e.clone().into_server_errors() {
        Some(errors) if errors.len() > 2 => {
            let (index, first) = &errors[0];
            let more = errors.len() - 1;
            format!("command {index} of a pipeline: {first} (and {more} other commands failed)")
        }
        _ => e.to_string(),
    }
}

/// [`error`], saying which server it came from (`host:port`).
pub(super) fn error_at(e: RedisError, location: &str) -> StoreError {
    if e.is_timeout() {
        let secs = super::TIMEOUT.as_secs();
        return StoreError::unavailable(format!(
            "redis {location}: no answer within {secs} s (is it a Redis server, and up?): {e}"
        ));
    }
    let hint = match e.code() {
        Some("NOAUTH") => {
            " (the server requires a password: redis://:PASSWORD@HOST, percent-encoded)"
        }
        Some("WRONGPASS") => " (the user or password in the spec is not the server's)",
        _ => "",
    };
    StoreError::backend(
        transient(&e),
        format!("redis {location}: {}{hint}", shown(&e)),
    )
}

fn transient(e: &RedisError) -> bool {
    e.is_io_error()
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
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask
            )
        )
}
