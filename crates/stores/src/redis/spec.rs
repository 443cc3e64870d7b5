//! A Redis spec's parts: the key prefix, the dialect and a CA file (ours), the
//! other SDKs' connection settings a fleet's shared URL carries (dropped), and
//! a cluster's nodes. Its row in [`crate::BACKENDS`] opens with [`open`] and
//! [`open_cluster`].

use bq_dedupe::StoreError;

use super::{Dialect, RedisStore};
use crate::invalid;
use crate::tls::read_ca_file;
use crate::{AnyStore, take_params};

/// `redis://` or `rediss://`: one server.
pub(crate) fn open(spec: &str) -> Result<AnyStore, StoreError> {
    let (url, redis) = split_redis(spec, spec.starts_with("rediss://"))?;
    match redis.ca {
        Some(ca) => RedisStore::connect_trusting(&url, redis.prefix, redis.dialect, &ca),
        None => RedisStore::connect_dialect(&url, redis.prefix, redis.dialect),
    }
    .map(AnyStore::Redis)
}

/// `redis+cluster://` or `rediss+cluster://`: any reachable nodes of a cluster.
pub(crate) fn open_cluster(spec: &str) -> Result<AnyStore, StoreError> {
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
            // Without a prefix every key of the database reads as an id's: an
            // id named as an application's key was skipped, and `forget`
            // deleted that key (a trial).
            _ if value.is_empty() => {
                return Err(invalid(
                    "redis spec: prefix= is empty, so every key of the database would read as \
                     an id's (an application's own keys skipped or forgotten): name a prefix, \
                     or leave prefix= out for the dialect's own",
                ));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_REDIS_PREFIX;
    use bq_dedupe::store::StoreErrorKind;

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
        let Err(empty) = split_redis("redis://h?dialect=go&prefix=", false) else {
            panic!("an empty prefix taken");
        };
        assert!(empty.message.contains("prefix= is empty"), "{empty}");
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
}
