//! The store the host serves to the component (the WIT `store` and `leases`
//! imports over an `AnyStore`, `host_store.rs`) passes the core's store
//! testkit: every call goes through the import functions the guest calls, with
//! their conversions of keys, tokens, claims and errors, and the host's note of
//! the claims it keeps alive. On a SQLite file, on the real clock.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bq_dedupe::store::{Settled, Settlement};
use bq_dedupe::{
    Store, StoreError, StoreResult, store::Capabilities, store::Claim, store::ClaimToken,
    store::StoreErrorKind,
};
use bq_dedupe_host::handler::Handler;
use bq_dedupe_host::runtime::HostState;
use bq_dedupe_host::wit::dedupe::babelqueue::idempotency::{leases, store, types};
use bq_dedupe_stores::{AnyStore, SqliteStore};
use bq_dedupe_testkit::{self as testkit, Fleet, OnServer, guard_fleet};

/// The host's imports, called as the guest calls them.
struct ViaImports(Mutex<HostState>);

impl ViaImports {
    fn state(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn from_wit<T>(result: Result<T, types::StoreError>) -> StoreResult<T> {
    result.map_err(|e| {
        let kind = match e.kind {
            types::StoreErrorKind::Unavailable => StoreErrorKind::Unavailable,
            types::StoreErrorKind::Unsupported => StoreErrorKind::Unsupported,
            types::StoreErrorKind::Invalid => StoreErrorKind::Invalid,
            types::StoreErrorKind::Internal => StoreErrorKind::Internal,
        };
        StoreError::new(kind, e.message)
    })
}

fn owned(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

fn pairs(claims: &[(&str, &ClaimToken)]) -> Vec<(String, String)> {
    claims
        .iter()
        .map(|(k, t)| (k.to_string(), t.0.clone()))
        .collect()
}

impl Store for ViaImports {
    async fn seen_many(&self, keys: &[&str]) -> StoreResult<Vec<bool>> {
        from_wit(store::Host::seen_many(&mut *self.state(), owned(keys)))
    }
    async fn remember_many(&self, keys: &[&str], ttl: Option<Duration>) -> StoreResult<()> {
        let ttl_ms = ttl.map(|d| d.as_millis() as u64);
        from_wit(store::Host::remember_many(
            &mut *self.state(),
            owned(keys),
            ttl_ms,
        ))
    }
    async fn forget(&self, key: &str) -> StoreResult<()> {
        from_wit(store::Host::forget(&mut *self.state(), key.into()))
    }
    fn capabilities(&self) -> Capabilities {
        let mut state = self.state();
        let caps = store::Host::capabilities(&mut *state);
        Capabilities {
            claim: caps.claim,
            ttl: caps.ttl,
            renew: caps.claim && leases::Host::supported(&mut *state),
        }
    }
    async fn claim_many(&self, keys: &[&str], lease: Duration) -> StoreResult<Vec<Claim>> {
        let lease_ms = lease.as_millis() as u64;
        let claims = store::Host::claim_many(&mut *self.state(), owned(keys), lease_ms);
        Ok(from_wit(claims)?
            .into_iter()
            .map(|c| match c {
                types::Claim::Acquired(token) => Claim::Acquired(ClaimToken(token)),
                types::Claim::Seen => Claim::Seen,
                types::Claim::Held => Claim::Held,
            })
            .collect())
    }
    async fn settle(&self, step: &Settlement<'_>) -> StoreResult<Settled> {
        let remember = step
            .remember
            .iter()
            .map(|(k, t)| (k.to_string(), t.map(|t| t.0.clone())))
            .collect();
        let settled = leases::Host::settle(
            &mut *self.state(),
            remember,
            step.ttl.map(|d| d.as_millis() as u64),
            pairs(step.release),
            pairs(step.renew),
            step.lease.as_millis() as u64,
        );
        let settled = from_wit(settled)?;
        Ok(Settled {
            kept: settled.kept,
            renewed: settled.renewed,
            release_error: from_wit::<()>(settled.release_error.map_or(Ok(()), Err)).err(),
        })
    }
}

/// A SQLite file for one run, removed after it.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

/// A fresh SQLite file for one run, and how a client opens it.
fn run_file() -> (TempFile, impl Fn() -> ViaImports + Send + Sync + 'static) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static RUN: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "bq-host-testkit-{}-{}.db",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ));
    let spec = format!("sqlite:{}", path.display());
    let open = move || {
        ViaImports(Mutex::new(HostState::new(
            AnyStore::from_spec(&spec).expect("open the SQLite file"),
            Handler::Mark,
        )))
    };
    (TempFile(path), open)
}

#[test]
fn the_host_store_served_to_the_component_follows_the_record_model() {
    testkit::check(24, || {
        let (file, open) = run_file();
        OnServer::new(SqliteStore::RULES, open).with_cleanup(file)
    });
}

/// Four clients at once, each its own host state and connection to one file,
/// every call through the imports: each key's history linearizable.
#[test]
fn the_host_store_served_to_the_component_has_linearizable_histories() {
    testkit::check_histories(6, || {
        let (file, open) = run_file();
        Fleet::new(SqliteStore::RULES, open).with_cleanup(file)
    });
}

/// The guard in the loop on the host's store: four claiming consumers, each
/// its own host state on one SQLite file, handlers that fail, panic, outlive
/// their lease or die before the commit (`bq_dedupe_testkit::guard_fleet`).
#[test]
fn claiming_consumers_on_the_host_store_lose_nothing() {
    let (_file, open) = run_file();
    let stores: Vec<ViaImports> = (0..4).map(|_| open()).collect();
    let lease = Duration::from_millis(150);
    guard_fleet::check_claiming_fleet("claiming host store", "fleet", &stores, lease);
}
