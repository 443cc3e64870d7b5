//! `WorkersStore`: whichever store the configuration chose, as one type.

use std::time::Duration;

use bq_dedupe::StoreError;
use bq_dedupe::store::{ClaimToken, StatementStore, TxRun};
use worker::D1PreparedStatement;

use crate::d1::D1Store;
use crate::durable::DurableObjectStore;
use crate::kv::KvStore;
use crate::round_trips::RoundTrips;

/// The store [`crate::DedupeConfig::store`] built (`DEDUPE_STORE`).
#[derive(Debug)]
pub enum WorkersStore {
    /// `durable-object`: sharded `DedupeShard` objects.
    DurableObject(DurableObjectStore),
    /// `kv`: a Workers KV namespace.
    Kv(KvStore),
    /// `d1`: a D1 database.
    D1(D1Store),
}

impl WorkersStore {
    /// Requests made to the backend so far.
    pub fn round_trips(&self) -> &RoundTrips {
        match self {
            WorkersStore::DurableObject(s) => s.round_trips(),
            WorkersStore::Kv(s) => s.round_trips(),
            WorkersStore::D1(s) => s.round_trips(),
        }
    }
}

bq_dedupe::delegate_store!(WorkersStore {
    DurableObject,
    Kv,
    D1
});

/// The transactional mode is D1's alone: another configured store refuses it
/// (`Unsupported`, naming the setting), and every message is retried.
impl StatementStore for WorkersStore {
    type Statement = D1PreparedStatement;

    fn check_statements(&self) -> bq_dedupe::StoreResult<()> {
        match self {
            WorkersStore::D1(_) => Ok(()),
            _ => Err(not_d1()),
        }
    }

    async fn commit_with(
        &self,
        key: Option<&str>,
        ttl: Option<Duration>,
        claim: Option<&ClaimToken>,
        statements: Vec<D1PreparedStatement>,
    ) -> bq_dedupe::StoreResult<TxRun<(), StoreError>> {
        match self {
            WorkersStore::D1(d1) => d1.commit_with(key, ttl, claim, statements).await,
            _ => Err(not_d1()),
        }
    }
}

fn not_d1() -> StoreError {
    StoreError::unsupported(
        "the handler's D1 statements need DEDUPE_STORE = \"d1\" (and the D1 binding)",
    )
}

/// A claim token: unique per claim (time plus 52 random bits), so only the
/// claimer can release it.
pub(crate) fn new_token(now: i64) -> String {
    let random = (js_sys::Math::random() * 4_503_599_627_370_496.0) as u64;
    format!("{now:x}-{random:013x}")
}
