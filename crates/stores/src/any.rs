//! [`AnyStore`]: a store picked at run time from a spec string.

use bq_dedupe::{InMemoryStore, StoreError, StoreErrorKind, StoreResult};

use crate::{RedisStore, SqliteStore, StoreStats};

/// The key prefix of a `redis://` spec without `?prefix=`.
pub const DEFAULT_REDIS_PREFIX: &str = "bq:idem:";

/// One of the stores, chosen at run time (see the crate docs for the spec syntax).
pub enum AnyStore {
    Memory(InMemoryStore),
    Sqlite(SqliteStore),
    Redis(RedisStore),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnyStore::Memory(_) => f.write_str("AnyStore::Memory"),
            AnyStore::Sqlite(s) => write!(f, "AnyStore::Sqlite({s:?})"),
            AnyStore::Redis(s) => write!(f, "AnyStore::Redis({s:?})"),
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

fn invalid(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Invalid, message)
}

impl AnyStore {
    /// Opens the store a spec names: `memory`, `sqlite:PATH` or
    /// `redis://HOST[:PORT][/DB][?prefix=P]`. A bad spec is `Invalid`; a backend
    /// that cannot be reached is `Unavailable`.
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
            let (url, prefix) = split_prefix(spec)?;
            return RedisStore::connect(&url, prefix).map(AnyStore::Redis);
        }
        Err(invalid(format!(
            "unknown store spec {:?}: use memory, sqlite:PATH or redis://HOST:PORT[/DB][?prefix=P]",
            spec.split(['/', '?', '@']).next().unwrap_or_default()
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
        }
    }

    /// Deletes expired entries where the backend keeps them; says how many went.
    pub fn purge_expired(&self) -> StoreResult<u64> {
        match self {
            AnyStore::Memory(s) => Ok(s.purge_expired() as u64),
            AnyStore::Sqlite(s) => s.purge_expired(),
            AnyStore::Redis(s) => s.purge_expired(),
        }
    }
}

/// Takes `prefix=` out of a Redis URL's query (the client would not know it),
/// returning the URL for the client and the key prefix.
fn split_prefix(spec: &str) -> Result<(String, String), StoreError> {
    let Some((base, query)) = spec.split_once('?') else {
        return Ok((spec.to_owned(), DEFAULT_REDIS_PREFIX.to_owned()));
    };
    let mut prefix = DEFAULT_REDIS_PREFIX.to_owned();
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.strip_prefix("prefix=") {
            Some(value) => {
                prefix = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map_err(|_| invalid("redis spec: prefix is not UTF-8 once decoded"))?
                    .into_owned();
            }
            None => rest.push(pair),
        }
    }
    let url = if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    Ok((url, prefix))
}

// Calls the same method on whichever store this is.
bq_dedupe::delegate_store!(AnyStore {
    Memory,
    Sqlite,
    Redis
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_taken_out_of_the_redis_url() {
        let split = |s| split_prefix(s).unwrap();
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
        assert!(split_prefix("redis://h?prefix=%ff").is_err());
    }

    #[test]
    fn unknown_and_empty_specs_are_invalid() {
        for spec in ["", "mem", "sqlite:", "postgres://u:pw@h/db"] {
            let e = AnyStore::from_spec(spec).unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec}");
            assert!(!e.message.contains("pw"), "no secrets in errors: {e}");
        }
    }
}
