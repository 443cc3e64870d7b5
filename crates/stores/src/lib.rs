//! Persistent and shared [`Store`](bq_dedupe::Store)s for `bq-dedupe`.
//!
//! - [`SqliteStore`]: an embedded SQLite file. Survives restarts; shared by every
//!   process on one machine that opens the same file.
//! - [`RedisStore`]: a Redis server or a Redis Cluster, in our own record format
//!   or the PHP or Go SDK's ([`Dialect`]). Shared by every consumer that reaches it.
//! - [`PostgresStore`]: a PostgreSQL table in the Go SDK's schema, claims in a
//!   table beside it. Shared with Go consumers.
//! - [`AnyStore`]: one of those or the core's `InMemoryStore`, chosen at run time
//!   from a spec string; every backend it opens is one row of [`BACKENDS`].
//!
//! Each backend is a cargo feature (`sqlite`, `redis`, `postgres`), all on by
//! default: `default-features = false, features = ["sqlite"]` builds no Redis,
//! PostgreSQL, tokio or rustls, and a spec of a backend left out is refused.
//!
//! The record format of every backend and dialect, and what each other SDK sees
//! of it, is one table in `docs/stores.md`.
//!
//! All of them can claim atomically (claiming mode) and honour TTLs, except
//! Redis in the Go dialect (no in-flight state: plain mode only). Their methods
//! do blocking I/O and return ready futures, so sync hosts drive them with
//! [`bq_dedupe::block_on_ready`]; async hosts should call them off the reactor.
//!
//! # Store specs ([`AnyStore::from_spec`])
//!
//! | spec | store |
//! |---|---|
//! | `memory` | `InMemoryStore` (process-local, lost on exit) |
//! | `sqlite:PATH` | `SqliteStore` at `PATH` (parent folders are created) |
//! | `redis://HOST[:PORT][/DB][?prefix=P][&dialect=D]` | `RedisStore`, keys `P + key` |
//! | `redis+cluster://HOST:PORT[,HOST:PORT...][?prefix=P][&dialect=D]` | `RedisStore` on a Redis Cluster |
//! | `postgres://[USER[:PW]@]HOST[:PORT]/DB[?table=T]` | `PostgresStore`, tables `T` and `T_claims` |
//!
//! `D` is `native` (the default), `php` or `go`. The Redis prefix defaults to the
//! dialect's: [`DEFAULT_REDIS_PREFIX`] (`bq:dedupe:`, used by no other SDK) for
//! ours, `bq:idem:` for PHP's, `bq:idemp:` for Go's; it is percent-decoded
//! (`?prefix=app%201:`), and `?prefix=` gives no prefix. `?protocol=resp3` and a
//! password (`redis://:secret@host`, percent-encoded) go to the client; the Go and
//! PHP clients' connection settings a fleet's shared URL may carry (`dial_timeout`,
//! `pool_size`, `timeout`, ...; `db` only as the path's) are dropped; any other
//! parameter is refused (the client would ignore a misspelt `dialect`). The table
//! defaults to Go's, `babelqueue_idempotency` (`postgresql://` works too).
//!
//! `rediss://` is TLS (rustls; the platform's roots, the PEM file
//! `SSL_CERT_FILE` names, or only the CAs of `?ca=PATH`); PostgreSQL reads
//! libpq's `sslmode` (`require`, `verify-ca`, `verify-full`) and `sslrootcert`
//! ([`PostgresStore::connect`]).
//!
//! ```no_run
//! use bq_dedupe::{block_on_ready, Guard};
//! use bq_dedupe_stores::AnyStore;
//!
//! let store = AnyStore::from_spec("sqlite:/var/lib/app/dedupe.db")?;
//! let guard = Guard::new(store).with_claiming(std::time::Duration::from_secs(60));
//! # Ok::<(), bq_dedupe::StoreError>(())
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// A build without every backend leaves some shared helpers unused.
#![cfg_attr(
    not(all(feature = "sqlite", feature = "redis", feature = "postgres")),
    allow(dead_code, unused_imports)
)]

mod any;
mod backends;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod shown;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod tls;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bq_dedupe::{StoreError, store::ClaimToken};

pub use any::{AnyStore, DEFAULT_REDIS_PREFIX};
pub use backends::{BACKENDS, Backend, Open, TestPlace, TestServer};
#[cfg(feature = "postgres")]
pub use postgres::{DEFAULT_POSTGRES_TABLE, PostgresStore};
#[cfg(feature = "redis")]
pub use redis::{Dialect, RedisStore};
pub use shown::{shown_spec, shown_store_spec};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// What a store holds right now, for inspection and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Ids remembered and not expired.
    pub remembered: u64,
    /// Live in-flight claims.
    pub claimed: u64,
    /// Entries past their expiry that still take space (they already read as
    /// unseen). Always 0 for Redis, which deletes them itself.
    pub expired: u64,
}

/// Longest TTL or lease honoured (about 35,000 years): keeps `now + ttl` far from
/// overflow in SQLite's i64 and within what Redis' `PX` accepts.
const MAX_TTL_MS: u64 = 1 << 50;

/// How long after its lease ran out a claim nobody took over is swept by a
/// purge (`SqliteStore::purge_expired`, `PostgresStore::purge_expired`): until
/// then its owner may still renew or commit it, as the rules of SQL rows say; a
/// claim lapsed this long is a crashed consumer's.
pub const STALE_CLAIM: Duration = Duration::from_secs(3600);

/// A spec or argument the store refuses (`Invalid`).
pub(crate) fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::new(bq_dedupe::store::StoreErrorKind::Invalid, message)
}

/// A commit the database refused for the work's writes (a deferred
/// constraint or trigger): the transactional run's failure, not the store's.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn refused_at_commit(e: StoreError) -> StoreError {
    StoreError::internal(format!(
        "{}: the commit was refused for the handler's writes (a deferred constraint or \
         trigger); nothing of this run is committed",
        e.message
    ))
}

/// A TTL or lease in whole milliseconds, at least 1 (Redis rejects `PX 0`, and a
/// zero TTL should not mean something different per backend).
fn ttl_ms(d: Duration) -> u64 {
    (d.as_millis().min(u128::from(MAX_TTL_MS)) as u64).max(1)
}

/// The savepoint a transactional batch puts around each delivery, named by a
/// fresh token so that no handler's own savepoint can catch its rollback.
fn savepoint_for(token: &ClaimToken) -> String {
    format!("bq_delivery_{}", token.0.replace('-', "_"))
}

/// A claim token unique across the processes sharing a store: pid, 64 random
/// bits of its own, and a counter. Pid, start time and counter alone were the
/// same in two processes cloned from one snapshot, or a child forked after a
/// first claim, whose claims then both read as their own (a review); the
/// start time stands in where the OS gives no random bits.
fn new_token() -> ClaimToken {
    static FALLBACK: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let random = getrandom::u64().unwrap_or_else(|_| {
        *FALLBACK.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    ClaimToken(format!("{:x}-{random:016x}-{n:x}", std::process::id()))
}

/// Splits a URL's query into our own parameters (`names`) and the rest, which
/// goes to the client unchanged. Values are percent-decoded.
pub(crate) fn take_params(
    spec: &str,
    names: &[&str],
) -> Result<(String, Vec<(String, String)>), StoreError> {
    let Some((base, query)) = spec.split_once('?') else {
        return Ok((spec.to_owned(), Vec::new()));
    };
    let mut ours = Vec::new();
    let mut rest = Vec::new();
    let mut given: Vec<String> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        // A client's URL parse would take one of two silently (which one
        // differs between clients): refused, naming the parameter only.
        // Compared as the client reads them: percent-decoded.
        let decoded = percent_encoding::percent_decode_str(name)
            .decode_utf8_lossy()
            .into_owned();
        if given.contains(&decoded) {
            return Err(StoreError::new(
                bq_dedupe::store::StoreErrorKind::Invalid,
                format!("store spec: parameter {decoded:?} given twice"),
            ));
        }
        given.push(decoded);
        if names.contains(&name) {
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| {
                    StoreError::new(
                        bq_dedupe::store::StoreErrorKind::Invalid,
                        format!("store spec: {name} is not UTF-8 once decoded"),
                    )
                })?
                .into_owned();
            ours.push((name.to_owned(), value));
        } else {
            rest.push(pair);
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, ours))
}

#[cfg(test)]
mod tests {
    use super::new_token;

    /// A child forked after its parent's first claim takes a token of its own:
    /// the pid, start time and counter it inherits made the same token as its
    /// parent's next one.
    #[cfg(unix)]
    #[test]
    fn a_forked_child_takes_tokens_of_its_own() {
        let _first = new_token();
        let mut fds = [0; 2];
        // SAFETY: pipe fills two fds; the child only makes a token, writes it
        // and leaves with _exit (no destructors, no test harness).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let token = new_token().0;
            unsafe {
                libc::write(fds[1], token.as_ptr().cast(), token.len());
                libc::_exit(0);
            }
        }
        unsafe { libc::close(fds[1]) };
        let mut got = vec![0u8; 128];
        let n = unsafe { libc::read(fds[0], got.as_mut_ptr().cast(), got.len()) };
        unsafe {
            libc::close(fds[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        got.truncate(n.max(0) as usize);
        let child = String::from_utf8(got).unwrap();
        let parent = new_token().0;
        assert!(!child.is_empty());
        // The child's pid differs, so compare what follows it.
        let tail = |t: &str| t.split_once('-').map(|(_, rest)| rest.to_owned());
        assert_ne!(tail(&child), tail(&parent), "{child} vs {parent}");
    }
}
