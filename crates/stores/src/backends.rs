//! The backends of [`AnyStore`] as one table: each row is a plain struct of
//! parts (its schemes, how a spec opens it and is shown, how its tests reach a
//! server). `AnyStore::from_spec`, [`shown_spec`](crate::shown_spec), the store
//! tests' matrix and `scripts/with-stores.sh` all read [`BACKENDS`]; a new store
//! is its module (its spec's parsing in it), its cargo feature, its `AnyStore`
//! variant and one row here.

use bq_dedupe::{InMemoryStore, StoreError};

use crate::AnyStore;
use crate::invalid;
use crate::shown::{mask_parameters, masked};

/// How a backend opens a spec.
pub type Open = fn(&str) -> Result<AnyStore, StoreError>;

/// A backend's opener where its cargo feature is on; where it is off, one
/// that refuses the spec, naming the feature (the spec is still known).
macro_rules! built_with {
    ($feature:literal, $open:expr) => {{
        #[cfg(feature = $feature)]
        let open: Open = $open;
        #[cfg(not(feature = $feature))]
        let open: Open = |spec| Err(left_out($feature, spec));
        open
    }};
}

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
    /// Its spec's other record formats, each a query parameter (another SDK's
    /// records): the store tests run on each beside the native one, every
    /// check as far as the format's `capabilities()` reach.
    pub formats: &'static [&'static str],
    /// Whether this build has it (its cargo feature is on); a row left out
    /// still knows its specs, to refuse them by name.
    pub built: bool,
}

/// How the store tests give a backend a place of its own.
#[derive(Debug)]
pub enum TestPlace {
    /// Its spec alone: a new store per process (`memory`).
    Fresh,
    /// Its first scheme and a new path of its own (a file, or a folder the
    /// store makes), deleted with whatever begins with its name.
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
        formats: &[],
        built: true,
    },
    Backend {
        name: "sqlite",
        schemes: &["sqlite:"],
        usage: "sqlite:PATH",
        open: built_with!("sqlite", |spec| crate::sqlite::open_spec(spec, false)
            .map(AnyStore::Sqlite)),
        open_existing: built_with!("sqlite", |spec| crate::sqlite::open_spec(spec, true)
            .map(AnyStore::Sqlite)),
        // A path has no user info: an `@` in it is kept. A URL form
        // (refused, `sqlite://u:pw@h`) is masked as one (a trial).
        shown: |spec| match spec.starts_with("sqlite://") {
            true => masked(spec),
            false => mask_parameters(spec),
        },
        test: TestPlace::File,
        formats: &[],
        built: cfg!(feature = "sqlite"),
    },
    Backend {
        name: "redis",
        schemes: &["redis://", "rediss://"],
        usage: "redis://HOST:PORT[/DB][?prefix=P&dialect=native|php|go] (rediss:// for TLS)",
        open: built_with!("redis", crate::redis::spec::open),
        open_existing: built_with!("redis", crate::redis::spec::open),
        shown: masked,
        test: TestPlace::Server {
            plain: server("scripts/with-redis.sh", "BQ_TEST_REDIS_URL"),
            tls: Some(server("scripts/with-redis-tls.sh", "BQ_TEST_REDIS_TLS_URL")),
            isolate: "prefix",
        },
        formats: REDIS_FORMATS,
        built: cfg!(feature = "redis"),
    },
    Backend {
        name: "redis-cluster",
        schemes: &["redis+cluster://", "rediss+cluster://"],
        usage: "redis+cluster://HOST:PORT[,HOST:PORT...] (rediss+cluster://)",
        open: built_with!("redis", crate::redis::spec::open_cluster),
        open_existing: built_with!("redis", crate::redis::spec::open_cluster),
        shown: masked,
        test: TestPlace::Server {
            plain: server("scripts/with-redis-cluster.sh", "BQ_TEST_REDIS_CLUSTER_URL"),
            tls: Some(server(
                "scripts/with-redis-tls.sh",
                "BQ_TEST_REDIS_TLS_CLUSTER_URL",
            )),
            isolate: "prefix",
        },
        formats: REDIS_FORMATS,
        built: cfg!(feature = "redis"),
    },
    Backend {
        name: "postgres",
        schemes: &["postgres://", "postgresql://"],
        usage: "postgres://USER@HOST:PORT/DB[?table=T&sslmode=verify-full]",
        open: built_with!("postgres", |spec| {
            let (url, table) = crate::postgres::split_table(spec)?;
            crate::PostgresStore::connect(&url, &table).map(AnyStore::Postgres)
        }),
        open_existing: built_with!("postgres", |spec| {
            let (url, table) = crate::postgres::split_table(spec)?;
            crate::PostgresStore::connect_existing(&url, &table).map(AnyStore::Postgres)
        }),
        shown: masked,
        // TLS is on the same server (BQ_TEST_POSTGRES_TLS_CA names its CA).
        test: TestPlace::Server {
            plain: server("scripts/with-postgres.sh", "BQ_TEST_POSTGRES_URL"),
            tls: None,
            isolate: "table",
        },
        formats: &[],
        built: cfg!(feature = "postgres"),
    },
];

/// The PHP SDK's Redis records (claims without owners) and the Go SDK's (no
/// claims): docs/stores.md.
const REDIS_FORMATS: &[&str] = &["dialect=php", "dialect=go"];

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

    /// Whether its specs are URLs (`scheme://`), not paths.
    pub(crate) fn is_url(&self) -> bool {
        self.schemes.iter().any(|s| s.ends_with("://"))
    }

    /// Every backend's spec form, as a command's help lists them.
    pub fn forms() -> String {
        let forms: Vec<&str> = BACKENDS.iter().map(|b| b.usage).collect();
        forms.join(" | ")
    }

    /// The row whose scheme `spec` has.
    pub fn of(spec: &str) -> Option<&'static Backend> {
        BACKENDS.iter().find(|b| b.takes(spec))
    }
}

/// The error for a spec whose backend this build left out.
#[allow(dead_code)] // every backend built in: no row calls it
fn left_out(feature: &str, spec: &str) -> StoreError {
    invalid(format!(
        "store spec {:?}: this build of babelqueue-dedupe-stores has no {feature} store \
         (its cargo feature `{feature}` is off)",
        crate::shown_spec(spec)
    ))
}
