//! Keeping the guest's claims alive while one handler runs.
//!
//! The guest renews its claims between handlers itself (the core's checkpoint,
//! through `leases.settle`), but it cannot run while a synchronous `handler`
//! import is being served. So the host remembers which claims the guest holds
//! (every claim it granted, minus those settled, released or found lost) and,
//! while a handler runs, renews them from a second thread on the guest's own
//! schedule (`LeasePolicy::renew_interval`), with the same `Store::settle` call
//! the guest would make. Only claims of a store that can prove ownership
//! (`capabilities().renew`) are held: in PHP's format nothing is renewed.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use bq_dedupe::{LeasePolicy, Store, block_on_ready, store::ClaimToken, store::Settlement};
use bq_dedupe_stores::AnyStore;

/// The claims the guest holds: key -> (token, lease).
#[derive(Debug, Default)]
pub struct HeldClaims(HashMap<String, (ClaimToken, Duration)>);

impl HeldClaims {
    /// The guest was granted the claim on `key` (`token`, for `lease`).
    pub fn granted(&mut self, key: &str, token: &ClaimToken, lease: Duration) {
        self.0.insert(key.to_owned(), (token.clone(), lease));
    }

    /// The claim on `key` ended (remembered, released, lost or forgotten).
    pub fn ended(&mut self, key: &str) {
        self.0.remove(key);
    }

    /// Whether the guest holds no claim.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Runs `work`, renewing every held claim from another thread each third of
    /// the shortest lease until `work` returns.
    pub fn kept_alive_during<T>(&self, store: &AnyStore, work: impl FnOnce() -> T) -> T {
        let Some(lease) = self.0.values().map(|(_, lease)| *lease).min() else {
            return work();
        };
        // The guest's guard renews on the default policy; so does this thread.
        let every = LeasePolicy::default().renew_interval(lease);
        let (done, stopped) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    self.renew_all(store);
                }
            });
            let out = work();
            drop(done);
            out
        })
    }

    /// One settle per distinct lease. A claim found lost stays listed: the guest's
    /// fenced commit reports it, and its next settle ends it here.
    fn renew_all(&self, store: &AnyStore) {
        let mut by_lease: HashMap<Duration, Vec<(&str, &ClaimToken)>> = HashMap::new();
        for (key, (token, lease)) in &self.0 {
            by_lease
                .entry(*lease)
                .or_default()
                .push((key.as_str(), token));
        }
        for (lease, renew) in by_lease {
            let step = Settlement {
                renew: &renew,
                lease,
                ..Settlement::default()
            };
            // A failed renewal changes nothing here: the commit is fenced.
            let _ = block_on_ready(store.settle(&step));
        }
    }
}
