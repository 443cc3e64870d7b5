//! [`AnyStore`]: a store picked at run time from a spec string.

use bq_dedupe::{InMemoryStore, StoreError, StoreErrorKind, StoreResult};

use crate::postgres::DEFAULT_POSTGRES_TABLE;
use crate::tls::read_ca_file;
use crate::{Dialect, PostgresStore, RedisStore, SqliteStore, StoreStats, take_params};

/// The key prefix of a `redis://` spec without `?prefix=` or `?dialect=`: our
/// own format's, a prefix no other SDK uses (the PHP SDK's is `bq:idem:`, the Go
/// SDK's `bq:idemp:`; `?dialect=php|go` defaults to theirs).
pub const DEFAULT_REDIS_PREFIX: &str = "bq:dedupe:";

/// One of the stores, chosen at run time (see the crate docs for the spec syntax).
#[allow(clippy::large_enum_variant)] // one per process, never copied in a hot path
pub enum AnyStore {
    /// `memory`: the core's process-local store.
    Memory(InMemoryStore),
    /// `sqlite:PATH`.
    Sqlite(SqliteStore),
    /// `redis://...` or `redis+cluster://...`.
    Redis(RedisStore),
    /// `postgres://...` (or `postgresql://`).
    Postgres(PostgresStore),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyStore::Memory(_) => f.write_str("AnyStore::Memory"),
            AnyStore::Sqlite(s) => write!(f, "AnyStore::Sqlite({s:?})"),
            AnyStore::Redis(s) => write!(f, "AnyStore::Redis({s:?})"),
            AnyStore::Postgres(s) => write!(f, "AnyStore::Postgres({s:?})"),
        }
    }
}

impl From<InMemoryStore> for AnyStore {
    fn from(s: InMemoryStore) -> Self {
        AnyStore::Memory(s)
    }
}

impl From<SqliteStore> for AnyStore {
    fn from(s: SqliteStore) -> Self {
        AnyStore::Sqlite(s)
    }
}

impl From<RedisStore> for AnyStore {
    fn from(s: RedisStore) -> Self {
        AnyStore::Redis(s)
    }
}

impl From<PostgresStore> for AnyStore {
    fn from(s: PostgresStore) -> Self {
        AnyStore::Postgres(s)
    }
}

fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Invalid, message)
}

impl AnyStore {
    /// What the connection leaves unchecked, where it does not authenticate
    /// its server (PostgreSQL's `prefer`, `allow`, `require` without a CA,
    /// `disable`: [`PostgresStore::security_note`]), for a host to say once.
    pub fn security_note(&self) -> Option<&str> {
        match self {
            AnyStore::Postgres(store) => store.security_note(),
            _ => None,
        }
    }

    /// Opens the store a spec names: `memory`, `sqlite:PATH`,
    /// `redis://HOST[:PORT][/DB][?prefix=P][&dialect=D]`,
    /// `redis+cluster://HOST:PORT[,HOST:PORT...][?prefix=P][&dialect=D]` or
    /// `postgres://...[?table=T]` (see the crate docs). A bad spec is `Invalid`,
    /// `rediss://` (and `rediss+cluster://`) is TLS with rustls, trusting the
    /// platform's roots (or the PEM file `SSL_CERT_FILE` names), or only the
    /// CAs of the PEM file `?ca=PATH` names; PostgreSQL's TLS is libpq's
    /// `sslmode` and `sslrootcert` ([`PostgresStore::connect`]). A backend
    /// that cannot be reached, or whose certificate fails its check, is
    /// `Unavailable`, naming its host.
    pub fn from_spec(spec: &str) -> Result<AnyStore, StoreError> {
        if spec == "memory" {
            return Ok(AnyStore::Memory(InMemoryStore::new()));
        }
        if let Some(path) = spec.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(invalid("store spec sqlite:PATH needs a path"));
            }
            return SqliteStore::open(path).map(AnyStore::Sqlite);
        }
        if spec.starts_with("redis://") || spec.starts_with("rediss://") {
            let (url, redis) = split_redis(spec, spec.starts_with("rediss://"))?;
            return match redis.ca {
                Some(ca) => RedisStore::connect_trusting(&url, redis.prefix, redis.dialect, &ca),
                None => RedisStore::connect_dialect(&url, redis.prefix, redis.dialect),
            }
            .map(AnyStore::Redis);
        }
        if let Some(rest) = spec
            .strip_prefix("redis+cluster://")
            .or_else(|| spec.strip_prefix("rediss+cluster://"))
        {
            let tls = spec.starts_with("rediss");
            let (url, redis) = split_redis(&format!("redis://{rest}"), tls)?;
            let nodes = cluster_nodes(&url, tls)?;
            return match redis.ca {
                Some(ca) => {
                    RedisStore::connect_cluster_trusting(&nodes, redis.prefix, redis.dialect, &ca)
                }
                None => RedisStore::connect_cluster(&nodes, redis.prefix, redis.dialect),
            }
            .map(AnyStore::Redis);
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            let (url, table) = split_table(spec)?;
            return PostgresStore::connect(&url, &table).map(AnyStore::Postgres);
        }
        Err(invalid(format!(
            "unknown store spec {:?}: use memory, sqlite:PATH, redis://HOST:PORT[/DB][?prefix=P&dialect=native|php|go] \
             (rediss:// for TLS), redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster://) or \
             postgres://USER@HOST:PORT/DB[?table=T&sslmode=verify-full]",
            crate::shown_spec(spec)
        )))
    }

    /// What the store holds now (see [`StoreStats`]).
    pub fn stats(&self) -> StoreResult<StoreStats> {
        match self {
            AnyStore::Memory(s) => {
                let live = s.entries().len() as u64;
                Ok(StoreStats {
                    remembered: live,
                    claimed: s.claimed().len() as u64,
                    expired: (s.len() as u64).saturating_sub(live),
                })
            }
            AnyStore::Sqlite(s) => s.stats(),
            AnyStore::Redis(s) => s.stats(),
            AnyStore::Postgres(s) => s.stats(),
        }
    }

    /// Deletes expired entries where the backend keeps them; says how many went.
    pub fn purge_expired(&self) -> StoreResult<u64> {
        match self {
            AnyStore::Memory(s) => Ok(s.purge_expired() as u64),
            AnyStore::Sqlite(s) => s.purge_expired(),
            AnyStore::Redis(s) => s.purge_expired(),
            AnyStore::Postgres(s) => s.purge_expired(),
        }
    }
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

// Calls the same method on whichever store this is.
bq_dedupe::delegate_store!(AnyStore {
    Memory,
    Sqlite,
    Redis,
    Postgres
});

#[cfg(test)]
mod tests {
    use super::*;

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
            split("redis://h/0?protocol=resp3&prefix=a%20b%3A&x=1"),
            ("redis://h/0?protocol=resp3&x=1".into(), "a b:".into())
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
            split("redis://h/1?dialect=go&x=1"),
            ("redis://h/1?x=1".into(), "bq:idemp:".into(), Dialect::Go)
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

    #[test]
    fn postgres_tls_settings_are_checked_before_connecting() {
        for (spec, says) in [
            ("postgres://u:pw@h/db?sslmode=verify", "unknown sslmode"),
            (
                "postgres://u:pw@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem",
                "/nonexistent.pem",
            ),
        ] {
            let e = AnyStore::from_spec(spec).unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec}: {e}");
            assert!(e.message.contains(says), "{e}");
            assert!(!e.message.contains("pw"), "no secrets in errors: {e}");
        }
    }

    #[test]
    fn unknown_and_empty_specs_are_invalid() {
        for spec in ["", "mem", "sqlite:", "mysql://u:pw@h/db"] {
            let e = AnyStore::from_spec(spec).unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec}");
            assert!(!e.message.contains("pw"), "no secrets in errors: {e}");
        }
    }
}
