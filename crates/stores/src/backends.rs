//! The backends of [`AnyStore`] as one table: each row is a plain struct of
//! parts (its schemes, how a spec opens it and is shown, how its tests reach a
//! server). `AnyStore::from_spec`, [`shown_spec`](crate::shown_spec), the store
//! tests' matrix and `scripts/with-stores.sh` all read [`BACKENDS`]; a new store
//! is its module, its `AnyStore` variant and one row here.

use bq_dedupe::{InMemoryStore, StoreError, store::StoreErrorKind};

use crate::postgres::DEFAULT_POSTGRES_TABLE;
use crate::shown::{mask_parameters, masked};
use crate::tls::read_ca_file;
use crate::{AnyStore, Dialect, PostgresStore, RedisStore, SqliteStore, take_params};

/// How a backend opens a spec.
pub type Open = fn(&str) -> Result<AnyStore, StoreError>;

/// One backend: what [`AnyStore::from_spec`] and the tests need to know of it.
#[derive(Debug)]
pub struct Backend {
    /// Its name in test output.
    pub name: &'static str,
    /// How its specs start: a scheme ending in `:` or `://` begins a spec; any
    /// other (`memory`) is the whole spec.
    pub schemes: &'static [&'static str],
    /// Its spec's form, as the error for an unknown spec lists it.
    pub usage: &'static str,
    /// Opens a spec that [`Backend::takes`].
    pub open: Open,
    /// Opens it for a command that only reads or deletes: a store that does
    /// not exist (a SQLite file, a PostgreSQL table) is an error, not made
    /// empty (a mistyped spec read as a store with nothing in it).
    pub open_existing: Open,
    /// Its spec as it may be printed, every password masked.
    pub shown: fn(&str) -> String,
    /// How a test gets one of its own.
    pub test: TestPlace,
}

/// How the store tests give a backend a place of its own.
#[derive(Debug)]
pub enum TestPlace {
    /// Its spec alone: a new store per process (`memory`).
    Fresh,
    /// Its first scheme and a new file's path.
    File,
    /// A server a wrapper script starts, the test's records kept apart by a
    /// query parameter (`isolate`: a key prefix, a table).
    Server {
        /// The plain server.
        plain: TestServer,
        /// The same backend over TLS, if its tests have one.
        tls: Option<TestServer>,
        /// The spec's query parameter that keeps one test's records apart.
        isolate: &'static str,
    },
}

/// A test server: the script that starts it around a command and the
/// variable naming its spec. A test that needs it fails when the variable is
/// unset (a misconfigured run, never a skip).
#[derive(Debug)]
pub struct TestServer {
    /// `scripts/with-*.sh`, run from the workspace root.
    pub script: &'static str,
    /// The environment variable the script sets to the server's spec.
    pub var: &'static str,
}

/// Every backend [`AnyStore::from_spec`] opens. `scripts/with-stores.sh`
/// starts the servers whose scripts this table names, in its order.
pub const BACKENDS: &[Backend] = &[
    Backend {
        name: "memory",
        schemes: &["memory"],
        usage: "memory",
        open: |_| Ok(AnyStore::Memory(InMemoryStore::new())),
        open_existing: |_| Ok(AnyStore::Memory(InMemoryStore::new())),
        shown: str::to_owned,
        test: TestPlace::Fresh,
    },
    Backend {
        name: "sqlite",
        schemes: &["sqlite:"],
        usage: "sqlite:PATH",
        open: |spec| match &spec["sqlite:".len()..] {
            "" => Err(invalid("store spec sqlite:PATH needs a path")),
            path => SqliteStore::open(path).map(AnyStore::Sqlite),
        },
        open_existing: |spec| match &spec["sqlite:".len()..] {
            "" => Err(invalid("store spec sqlite:PATH needs a path")),
            path if !std::path::Path::new(path).exists() => Err(invalid(format!(
                "no store at {path}: no such SQLite file (`bq-dedupe run` creates one)"
            ))),
            path => SqliteStore::open(path).map(AnyStore::Sqlite),
        },
        // A path has no user info: an `@` in it is kept.
        shown: mask_parameters,
        test: TestPlace::File,
    },
    Backend {
        name: "redis",
        schemes: &["redis://", "rediss://"],
        usage: "redis://HOST:PORT[/DB][?prefix=P&dialect=native|php|go] (rediss:// for TLS)",
        open: open_redis,
        open_existing: open_redis,
        shown: masked,
        test: TestPlace::Server {
            plain: server("scripts/with-redis.sh", "BQ_TEST_REDIS_URL"),
            tls: Some(server("scripts/with-redis-tls.sh", "BQ_TEST_REDIS_TLS_URL")),
            isolate: "prefix",
        },
    },
    Backend {
        name: "redis-cluster",
        schemes: &["redis+cluster://", "rediss+cluster://"],
        usage: "redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster://)",
        open: open_redis_cluster,
        open_existing: open_redis_cluster,
        shown: masked,
        test: TestPlace::Server {
            plain: server("scripts/with-redis-cluster.sh", "BQ_TEST_REDIS_CLUSTER_URL"),
            tls: Some(server(
                "scripts/with-redis-tls.sh",
                "BQ_TEST_REDIS_TLS_CLUSTER_URL",
            )),
            isolate: "prefix",
        },
    },
    Backend {
        name: "postgres",
        schemes: &["postgres://", "postgresql://"],
        usage: "postgres://USER@HOST:PORT/DB[?table=T&sslmode=verify-full]",
        open: |spec| {
            let (url, table) = split_table(spec)?;
            PostgresStore::connect(&url, &table).map(AnyStore::Postgres)
        },
        open_existing: |spec| {
            let (url, table) = split_table(spec)?;
            PostgresStore::connect_existing(&url, &table).map(AnyStore::Postgres)
        },
        shown: masked,
        // TLS is on the same server (BQ_TEST_POSTGRES_TLS_CA names its CA).
        test: TestPlace::Server {
            plain: server("scripts/with-postgres.sh", "BQ_TEST_POSTGRES_URL"),
            tls: None,
            isolate: "table",
        },
    },
];

const fn server(script: &'static str, var: &'static str) -> TestServer {
    TestServer { script, var }
}

impl Backend {
    /// Whether `spec` is one of this backend's.
    pub fn takes(&self, spec: &str) -> bool {
        self.schemes.iter().any(|scheme| {
            spec == *scheme
                || (scheme.ends_with(':') || scheme.ends_with("//")) && spec.starts_with(scheme)
        })
    }

    /// The row whose scheme `spec` has.
    pub fn of(spec: &str) -> Option<&'static Backend> {
        BACKENDS.iter().find(|b| b.takes(spec))
    }
}

fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Invalid, message)
}

/// `redis://` or `rediss://`: one server.
fn open_redis(spec: &str) -> Result<AnyStore, StoreError> {
    let (url, redis) = split_redis(spec, spec.starts_with("rediss://"))?;
    match redis.ca {
        Some(ca) => RedisStore::connect_trusting(&url, redis.prefix, redis.dialect, &ca),
        None => RedisStore::connect_dialect(&url, redis.prefix, redis.dialect),
    }
    .map(AnyStore::Redis)
}

/// `redis+cluster://` or `rediss+cluster://`: any reachable nodes of a cluster.
fn open_redis_cluster(spec: &str) -> Result<AnyStore, StoreError> {
    let tls = spec.starts_with("rediss");
    let rest = &spec[spec.find("://").map_or(0, |i| i + 3)..];
    let (url, redis) = split_redis(&format!("redis://{rest}"), tls)?;
    let nodes = cluster_nodes(&url, tls)?;
    match redis.ca {
        Some(ca) => RedisStore::connect_cluster_trusting(&nodes, redis.prefix, redis.dialect, &ca),
        None => RedisStore::connect_cluster(&nodes, redis.prefix, redis.dialect),
    }
    .map(AnyStore::Redis)
}

/// Our parameters of a Redis spec: the key prefix (the dialect's own by
/// default), the dialect, and the CAs `ca=PATH` trusts.
struct RedisParams {
    prefix: String,
    dialect: Dialect,
    ca: Option<Vec<u8>>,
}

/// Takes `prefix=`, `dialect=` and `ca=` out of a Redis URL's query (the client
/// would not know them), returning the URL for the client and them.
/// `tls`: the spec's scheme is `rediss` (a CA file is refused otherwise).
fn split_redis(spec: &str, tls: bool) -> Result<(String, RedisParams), StoreError> {
    let (url, ours) = take_params(spec, &["prefix", "dialect", "ca"])?;
    let url = without_foreign_settings(&url)?;
    let mut dialect = Dialect::Native;
    let mut prefix = None;
    let mut ca = None;
    for (name, value) in ours {
        match name.as_str() {
            "dialect" => {
                dialect = Dialect::from_name(&value).ok_or_else(|| {
                    invalid(format!(
                        "redis spec: unknown dialect {value:?} (use native, php or go)"
                    ))
                })?;
            }
            "ca" => ca = Some(value),
            _ => prefix = Some(value),
        }
    }
    if ca.is_some() && !tls {
        return Err(invalid(
            "redis spec: ca= is for TLS; use rediss:// (or rediss+cluster://)",
        ));
    }
    let ca = ca.as_deref().map(read_ca_file).transpose()?;
    let prefix = prefix.unwrap_or_else(|| dialect.default_prefix().to_owned());
    Ok((
        url,
        RedisParams {
            prefix,
            dialect,
            ca,
        },
    ))
}

/// Connection settings the other SDKs' Redis clients read from a URL a fleet
/// shares (go-redis, predis): ours has its own, so they are dropped.
const FOREIGN_SETTINGS: &[&str] = &[
    "client_name",
    "max_retries",
    "min_retry_backoff",
    "max_retry_backoff",
    "dial_timeout",
    "read_timeout",
    "write_timeout",
    "pool_fifo",
    "pool_size",
    "pool_timeout",
    "min_idle_conns",
    "max_idle_conns",
    "max_active_conns",
    "conn_max_idle_time",
    "conn_max_lifetime",
    "idle_timeout",
    "idle_check_frequency",
    "max_conn_age",
    "timeout",
    "read_write_timeout",
    "persistent",
];

/// The client's URL with the other SDKs' connection settings dropped; any
/// parameter but `protocol` (the one the client reads) and those is refused:
/// the client would ignore it, and a misspelt `dialect` or `prefix` would
/// leave the default, silently. A database given as a parameter (`db`,
/// `database`) is refused unless the path names the same one: the other SDKs
/// would use it where this store used the path's.
fn without_foreign_settings(url: &str) -> Result<String, StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let path_db = base
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map_or("0", |(_, db)| if db.is_empty() { "0" } else { db });
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "protocol" => kept.push(pair),
            "db" | "database" if value == path_db => {}
            "db" | "database" => {
                return Err(invalid(format!(
                    "redis spec: {name}={value:?} names another database than the path's ({path_db}): \
                     give it as redis://HOST:PORT/{value}"
                )));
            }
            _ if FOREIGN_SETTINGS.contains(&name) => {}
            _ => {
                return Err(invalid(format!(
                    "redis spec: unknown parameter {name:?} (ours: prefix, dialect, ca; \
                     the client's: protocol)"
                )));
            }
        }
    }
    Ok(match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    })
}

/// The node URLs of `redis://[USERINFO@]H:P,H:P[/...]`: each node gets the
/// userinfo; a database number is refused (a cluster has only database 0).
fn cluster_nodes(url: &str, tls: bool) -> Result<Vec<String>, StoreError> {
    let scheme = if tls { "rediss://" } else { "redis://" };
    let rest = url.strip_prefix("redis://").unwrap_or(url);
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !matches!(tail, "" | "/" | "/0") {
        return Err(invalid(
            "redis+cluster spec: a cluster has no database number or client parameters; \
             use redis+cluster://HOST:PORT[,HOST:PORT...][?prefix=P&dialect=D]",
        ));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| match userinfo {
            Some(u) => format!("{scheme}{u}@{h}"),
            None => format!("{scheme}{h}"),
        })
        .collect();
    if nodes.is_empty() {
        return Err(invalid("redis+cluster spec: no HOST:PORT given"));
    }
    Ok(nodes)
}

/// Takes `table=` out of a PostgreSQL URL's query.
fn split_table(spec: &str) -> Result<(String, String), StoreError> {
    let (url, ours) = take_params(spec, &["table"])?;
    let table = ours
        .into_iter()
        .next_back()
        .map_or_else(|| DEFAULT_POSTGRES_TABLE.to_owned(), |(_, v)| v);
    Ok((url, table))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_REDIS_PREFIX;

    #[test]
    fn prefix_is_taken_out_of_the_redis_url() {
        let split = |s| {
            let (url, redis) = split_redis(s, false).unwrap();
            (url, redis.prefix)
        };
        assert_eq!(
            split("redis://h:1/2"),
            ("redis://h:1/2".into(), DEFAULT_REDIS_PREFIX.into())
        );
        assert_eq!(
            split("redis://h:1/2?prefix=app:"),
            ("redis://h:1/2".into(), "app:".into())
        );
        assert_eq!(
            split("redis://h/0?protocol=resp3&prefix=a%20b%3A"),
            ("redis://h/0?protocol=resp3".into(), "a b:".into())
        );
        assert_eq!(split("redis://h?prefix="), ("redis://h".into(), "".into()));
        assert!(split_redis("redis://h?prefix=%ff", false).is_err());
    }

    #[test]
    fn dialects_pick_their_sdks_prefix() {
        let split = |s| {
            let (url, redis) = split_redis(s, false).unwrap();
            (url, redis.prefix, redis.dialect)
        };
        assert_eq!(
            split("redis://h?dialect=php"),
            ("redis://h".into(), "bq:idem:".into(), Dialect::Php)
        );
        assert_eq!(
            split("redis://h/1?dialect=go&protocol=resp2"),
            (
                "redis://h/1?protocol=resp2".into(),
                "bq:idemp:".into(),
                Dialect::Go
            )
        );
        assert_eq!(
            split("redis://h?dialect=php&prefix=app:"),
            ("redis://h".into(), "app:".into(), Dialect::Php)
        );
        assert_eq!(split("redis://h").2, Dialect::Native);
        assert_eq!(
            split_redis("redis://h?dialect=java", false)
                .map(drop)
                .unwrap_err()
                .kind,
            StoreErrorKind::Invalid
        );
    }

    #[test]
    fn a_ca_file_is_read_at_once_and_only_for_tls() {
        let err = |s: &str| {
            split_redis(s, s.starts_with("rediss"))
                .map(drop)
                .unwrap_err()
        };
        let missing = err("rediss://h?ca=/nonexistent/ca.pem");
        assert_eq!(missing.kind, StoreErrorKind::Invalid);
        assert!(missing.message.contains("/nonexistent/ca.pem"), "{missing}");
        let not_pem = std::env::temp_dir().join(format!("bq-not-a-ca-{}", std::process::id()));
        std::fs::write(&not_pem, "not a certificate").unwrap();
        let spec = format!("rediss://h?ca={}", not_pem.display());
        let empty = err(&spec);
        std::fs::remove_file(&not_pem).unwrap();
        assert!(empty.message.contains("no PEM certificate"), "{empty}");
        assert!(err("redis://h?ca=/x").message.contains("rediss://"));
    }

    #[test]
    fn a_redis_parameter_neither_we_nor_the_client_know_is_refused() {
        // A typo (`dialekt=php`) left the dialect native: a PHP fleet's ids
        // were not seen, with no error.
        for spec in [
            "redis://h?dialekt=php",
            "redis://h/0?prefix=a&prefx=b",
            "rediss://h?x=1",
        ] {
            let e = split_redis(spec, spec.starts_with("rediss"))
                .map(drop)
                .unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec}");
            assert!(e.message.contains("unknown parameter"), "{spec}: {e}");
        }
        let (url, _) = split_redis("redis://h/0?protocol=resp3&dialect=php", false).unwrap();
        assert_eq!(url, "redis://h/0?protocol=resp3");
        // A URL the fleet shares: the Go and PHP clients' settings are theirs.
        let (url, _) = split_redis(
            "redis://h/2?dial_timeout=3s&db=2&pool_size=9&timeout=1",
            false,
        )
        .unwrap();
        assert_eq!(url, "redis://h/2");
        let e = split_redis("redis://h/0?db=3", false)
            .map(drop)
            .unwrap_err();
        assert!(e.message.contains("redis://HOST:PORT/3"), "{e}");
        let (url, _) = split_redis("redis://a:1,b:2?pool_size=4&prefix=p:", false).unwrap();
        assert_eq!(url, "redis://a:1,b:2");
    }

    #[test]
    fn cluster_specs_name_every_node() {
        assert_eq!(
            cluster_nodes("redis://:pw@a:1,b:2", false).unwrap(),
            vec!["redis://:pw@a:1", "redis://:pw@b:2"]
        );
        assert_eq!(
            cluster_nodes("redis://a:1/", false).unwrap(),
            vec!["redis://a:1"]
        );
        assert!(cluster_nodes("redis://a:1/3", false).is_err());
        assert!(cluster_nodes("redis://", false).is_err());
    }

    #[test]
    fn table_is_taken_out_of_the_postgres_url() {
        assert_eq!(
            split_table("postgres://u@h:5/db?table=seen&connect_timeout=3").unwrap(),
            (
                "postgres://u@h:5/db?connect_timeout=3".into(),
                "seen".into()
            )
        );
        assert_eq!(
            split_table("postgres://u@h/db").unwrap().1,
            DEFAULT_POSTGRES_TABLE
        );
        let e = AnyStore::from_spec("postgres://u:pw@h/db?table=a;drop").unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Invalid);
        assert!(!e.message.contains("pw"), "no secrets in errors: {e}");
    }
}
