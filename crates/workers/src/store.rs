//! `WorkersStore`: whichever store the configuration chose, as one type.

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
}

impl WorkersStore {
    /// Requests made to the backend so far.
    pub fn round_trips(&self) -> &RoundTrips {
        match self {
            WorkersStore::DurableObject(s) => s.round_trips(),
            WorkersStore::Kv(s) => s.round_trips(),
        }
    }
}

bq_dedupe::delegate_store!(WorkersStore { DurableObject, Kv });
