//! [`AnyStore`]: a store picked at run time from a spec string.

use bq_dedupe::{InMemoryStore, StoreError, StoreResult, store::StoreErrorKind};

#[cfg(feature = "postgres")]
use crate::PostgresStore;
#[cfg(feature = "redis")]
use crate::RedisStore;
#[cfg(feature = "sqlite")]
use crate::SqliteStore;
use crate::StoreStats;
use crate::backends::{BACKENDS, Backend, Open};

/// The key prefix of a `redis://` spec without `?prefix=` or `?dialect=`: our
/// own format's, a prefix no other SDK uses (the PHP SDK's is `bq:idem:`, the Go
/// SDK's `bq:idemp:`; `?dialect=php|go` defaults to theirs).
pub const DEFAULT_REDIS_PREFIX: &str = "bq:dedupe:";

/// The enum, one variant per store type (a backend's behind its feature), with
/// what only forwards to the variant: `From` each store, `Debug`, `Store`,
/// `stats`, `record_rules` and `purge_expired` (each backend has its own of
/// those; the memory store's are [`memory_stats`], its `RULES` and its purge).
macro_rules! any_store {
    (
        $(#[doc = $mdoc:literal])* Memory($memory:ty),
        $($(#[doc = $doc:literal])* #[cfg($cfg:meta)] $variant:ident($store:ty),)+
    ) => {
        /// One of the stores, chosen at run time (see the crate docs for the spec syntax).
        #[allow(clippy::large_enum_variant)] // one per process, never copied in a hot path
        pub enum AnyStore {
            $(#[doc = $mdoc])* Memory($memory),
            $($(#[doc = $doc])* #[cfg($cfg)] $variant($store),)+
        }
        impl From<$memory> for AnyStore {
            fn from(s: $memory) -> Self {
                AnyStore::Memory(s)
            }
        }
        $(#[cfg($cfg)] impl From<$store> for AnyStore {
            fn from(s: $store) -> Self {
                AnyStore::$variant(s)
            }
        })+
        impl std::fmt::Debug for AnyStore {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {
                    // The memory store's contents are not shown.
                    AnyStore::Memory(_) => f.write_str("AnyStore::Memory"),
                    $(#[cfg($cfg)] AnyStore::$variant(s) => write!(f, "AnyStore::{}({s:?})", stringify!($variant)),)+
                }
            }
        }
        // Calls the same method on whichever store this is.
        bq_dedupe::delegate_store!(AnyStore { Memory, $(#[cfg($cfg)] $variant),+ });
        impl AnyStore {
            /// What the store holds now (see [`StoreStats`]).
            pub fn stats(&self) -> StoreResult<StoreStats> {
                match self {
                    AnyStore::Memory(s) => Ok(memory_stats(s)),
                    $(#[cfg($cfg)] AnyStore::$variant(s) => s.stats(),)+
                }
            }

            /// How the store's records follow the record model (the testkit's
            /// model of it).
            pub fn record_rules(&self) -> bq_dedupe::store::record::Rules {
                match self {
                    AnyStore::Memory(_) => InMemoryStore::RULES,
                    $(#[cfg($cfg)] AnyStore::$variant(s) => s.record_rules(),)+
                }
            }

            /// Deletes expired entries where the backend keeps them; says how
            /// many went.
            pub fn purge_expired(&self) -> StoreResult<u64> {
                match self {
                    AnyStore::Memory(s) => Ok(s.purge_expired() as u64),
                    $(#[cfg($cfg)] AnyStore::$variant(s) => s.purge_expired(),)+
                }
            }
        }
    };
}

/// The memory store's [`StoreStats`].
fn memory_stats(s: &InMemoryStore) -> StoreStats {
    let live = s.entries().len() as u64;
    StoreStats {
        remembered: live,
        claimed: s.claimed().len() as u64,
        expired: (s.len() as u64).saturating_sub(live),
    }
}

any_store! {
    /// `memory`: the core's process-local store.
    Memory(InMemoryStore),
    /// `sqlite:PATH`.
    #[cfg(feature = "sqlite")]
    Sqlite(SqliteStore),
    /// `redis://...` or `redis+cluster://...`.
    #[cfg(feature = "redis")]
    Redis(RedisStore),
    /// `postgres://...` (or `postgresql://`).
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

impl AnyStore {
    /// What a host should say once on start-up ([`PostgresStore::notes`]:
    /// a connection that does not authenticate its server, a timeout left to
    /// a server that sets none; [`RedisStore::notes`]: a server that evicts
    /// keys when full).
    pub fn notes(&self) -> &[String] {
        match self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(store) => store.notes(),
            #[cfg(feature = "redis")]
            AnyStore::Redis(store) => store.notes(),
            _ => &[],
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
        Self::open_with(spec, |backend| backend.open)
    }

    /// [`Self::from_spec`] for a command that only reads or deletes: a store
    /// that does not exist is an error (`Invalid`), not made empty.
    pub fn from_existing_spec(spec: &str) -> Result<AnyStore, StoreError> {
        Self::open_with(spec, |backend| backend.open_existing)
    }

    fn open_with(spec: &str, opener: fn(&Backend) -> Open) -> Result<AnyStore, StoreError> {
        if let Some(backend) = Backend::of(spec) {
            // A network backend's URL (a `sqlite:` path is read as it is).
            if backend.is_url()
                && let Some(why) = crate::shown::ambiguity(spec)
            {
                let shown = crate::shown_spec(spec);
                return Err(StoreError::new(
                    StoreErrorKind::Invalid,
                    format!("store spec {shown:?}: {why}"),
                ));
            }
            return opener(backend)(spec);
        }
        let (last, rest) = BACKENDS.split_last().expect("a backend");
        let forms: Vec<&str> = rest.iter().map(|b| b.usage).collect();
        Err(StoreError::new(
            StoreErrorKind::Invalid,
            format!(
                "unknown store spec {:?}: use {} or {}",
                crate::shown_store_spec(spec),
                forms.join(", "),
                last.usage
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
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
    fn an_unknown_spec_lists_every_backends_form() {
        let e = AnyStore::from_spec("mysql://u:pw@h/db").unwrap_err();
        assert_eq!(
            e.message,
            "unknown store spec \"mysql://u:***@h/db\": use memory, sqlite:PATH, \
             redis://HOST:PORT[/DB][?prefix=P&dialect=native|php|go] (rediss:// for TLS), \
             redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster://) or \
             postgres://USER@HOST:PORT/DB[?table=T&sslmode=verify-full]"
        );
    }

    /// A raw `@ / ? #` in a password: the clients took its end for the host
    /// or a parameter and named it (`cannot connect to SECRET:5432`).
    #[test]
    fn a_spec_whose_user_info_a_client_could_split_elsewhere_is_refused() {
        for spec in [
            "postgres://bob:pw@SECRET/x@127.0.0.1:1/app",
            "postgresql://bob:pw@SECRET@127.0.0.1:1/app",
            "redis://:pw?SECRET@127.0.0.1:1/0",
            "rediss+cluster://:pw#SECRET@127.0.0.1:1",
            "postgres://127.0.0.1:1/app?user=bob&password=pw@SECRET/x",
            "redis://h:1?prefix=a@b",
        ] {
            assert!(refused(spec).contains("percent-encode"), "{spec}");
        }
        // One `@`, before the host: as before.
        #[cfg(feature = "redis")]
        {
            let e = AnyStore::from_spec("redis://:p%40w@127.0.0.1:1/0?prefix=a%40b").unwrap_err();
            assert_eq!(e.kind, StoreErrorKind::Unavailable, "{e}");
        }
    }

    /// A SQLite path is not a URL: an `@` in it is kept, read as it is (the
    /// first version refused `sqlite:///srv/a@1/seen.db`, and the `%40` it
    /// advised opened another, empty file: a review's finding). The URL forms
    /// are refused as such.
    #[cfg(feature = "sqlite")]
    #[test]
    fn an_at_in_a_sqlite_path_is_its_own() {
        let dir = std::env::temp_dir().join(format!("bq-at-{}", std::process::id()));
        let path = dir.join("a@1").join("seen.db");
        AnyStore::from_spec(&format!("sqlite:{}", path.display())).unwrap();
        assert!(path.exists());
        // A URL form, read otherwise by other tools, is refused.
        for spec in [
            "sqlite://data/seen.db",
            "sqlite:///data/seen.db",
            "sqlite:file:/data/seen.db?cache=private",
        ] {
            let e = AnyStore::from_spec(spec).unwrap_err();
            assert!(e.message.contains("not a URL"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A password parameter the clients or our own parsers could split
    /// elsewhere: its end was named in their errors (`parameter "SECRET"
    /// given twice`, `unknown sslmode "disable?password=SECRET"`, `cannot
    /// connect to SECRET:1`; a review's findings). Refused before any parse.
    #[test]
    fn a_query_whose_password_could_be_split_elsewhere_is_refused() {
        for spec in [
            "postgres://127.0.0.1:1/db?password=pw&SECRET&SECRET",
            "postgres://127.0.0.1:1/db?password=pw&sslmode=SECRET",
            "postgres://127.0.0.1:1/db?password=pw&host=SECRET",
            "postgres://127.0.0.1:1/db?password=pw&sslrootcert=SECRET",
            "postgres://127.0.0.1:1/db?sslmode=disable?password=SECRET",
            "postgres://127.0.0.1:1/db?table=seen?password=SECRET",
            "postgres://127.0.0.1:1/db?user=bob;password=SECRET",
            "redis://127.0.0.1:1/0?prefix=a&password=pw&SECRET=1",
        ] {
            assert!(refused(spec).contains("must come last"), "{spec}");
        }
    }

    /// The message of `spec`'s refusal (`Invalid`), which names no `SECRET`.
    fn refused(spec: &str) -> String {
        let e = AnyStore::from_spec(spec).unwrap_err();
        assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec}: {e}");
        assert!(!e.message.contains("SECRET"), "{spec}: {e}");
        e.message
    }

    /// A raw `&` in a `password=` value given to `PostgresStore::connect`
    /// (not refused there, as a spec is): what follows it was named by the
    /// client as an unknown option (a review's finding).
    #[cfg(feature = "postgres")]
    #[test]
    fn a_password_parameters_end_is_not_named_as_an_option() {
        for url in [
            "postgres://bob@127.0.0.1:1/app?password=pw&SECRET=1",
            "postgres://bob@127.0.0.1:1/app?PassWord=pw&SECRET",
        ] {
            let e = PostgresStore::connect(url, "t").unwrap_err();
            let spec = url;
            assert_eq!(e.kind, StoreErrorKind::Invalid, "{spec}: {e}");
            assert!(!e.message.contains("SECRET"), "{spec}: {e}");
            assert!(e.message.contains("%26"), "{e}");
        }
        // Without a password parameter, the option is named.
        let e = AnyStore::from_spec("postgres://bob@127.0.0.1:1/app?tabel=x").unwrap_err();
        assert!(e.message.contains("tabel"), "{e}");
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
