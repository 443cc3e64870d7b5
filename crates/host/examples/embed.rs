//! The smallest wasmtime host of the dedupe component: a `HashSet` as the store,
//! no batches, claims or leases, and a handler that prints. Run it after
//! `scripts/build-component.sh`: `cargo run -p babelqueue-dedupe-host --example embed`.

use std::collections::HashSet;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, Store};

wasmtime::component::bindgen!({ path: "wit", world: "dedupe" });
use babelqueue::idempotency::{handler, leases, store, types};

struct Host {
    seen: HashSet<String>,
}

fn unsupported<T>() -> Result<T, types::StoreError> {
    Err(types::StoreError {
        kind: types::StoreErrorKind::Unsupported,
        message: "not offered by this host".into(),
    })
}

impl types::Host for Host {}

impl store::Host for Host {
    // What the guest may rely on: the three spec functions only.
    fn capabilities(&mut self) -> types::Capabilities {
        types::Capabilities {
            batch: false,
            claim: false,
            ttl: false,
        }
    }
    fn seen(&mut self, key: String) -> Result<bool, types::StoreError> {
        Ok(self.seen.contains(&key))
    }
    fn remember(&mut self, key: String, _ttl_ms: Option<u64>) -> Result<(), types::StoreError> {
        self.seen.insert(key);
        Ok(())
    }
    fn forget(&mut self, key: String) -> Result<(), types::StoreError> {
        self.seen.remove(&key);
        Ok(())
    }
    // Never called while capabilities() says batch and claim are false.
    fn seen_many(&mut self, _: Vec<String>) -> Result<Vec<bool>, types::StoreError> {
        unsupported()
    }
    fn remember_many(&mut self, _: Vec<String>, _: Option<u64>) -> Result<(), types::StoreError> {
        unsupported()
    }
    fn claim(&mut self, _: String, _: u64) -> Result<types::Claim, types::StoreError> {
        unsupported()
    }
    fn claim_many(
        &mut self,
        _: Vec<String>,
        _: u64,
    ) -> Result<Vec<types::Claim>, types::StoreError> {
        unsupported()
    }
    fn release(&mut self, _: String, _: String) -> Result<(), types::StoreError> {
        unsupported()
    }
    fn commit_many(
        &mut self,
        _: Vec<String>,
        _: Option<u64>,
        _: Vec<(String, String)>,
    ) -> Result<(), types::StoreError> {
        unsupported()
    }
}

impl leases::Host for Host {
    // 1.1.0: false keeps the 1.0 behaviour (no renewals, no fenced commits).
    fn supported(&mut self) -> bool {
        false
    }
    fn now_ms(&mut self) -> u64 {
        0
    }
    fn settle(
        &mut self,
        _: Vec<(String, Option<String>)>,
        _: Option<u64>,
        _: Vec<(String, String)>,
        _: Vec<(String, String)>,
        _: u64,
    ) -> Result<leases::Settled, types::StoreError> {
        unsupported()
    }
}

impl handler::Host for Host {
    fn handle(&mut self, envelope: String) -> Result<(), String> {
        println!("handling {} bytes", envelope.len()); // your side effect
        Ok(())
    }
}

fn main() -> wasmtime::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or("target/component/bq_dedupe.component.wasm".into());
    let engine = Engine::default();
    let component = Component::from_file(&engine, &path)?;
    let mut linker = Linker::new(&engine);
    Dedupe::add_to_linker::<Host, HasSelf<Host>>(&mut linker, |h| h)?;
    let mut store = Store::new(
        &engine,
        Host {
            seen: HashSet::new(),
        },
    );
    let dedupe = Dedupe::instantiate(&mut store, &component, &linker)?;
    // One guard for the life of the consumer: options checked, capabilities read, once.
    let options = types::GuardOptions {
        ttl_ms: None,
        claim_lease_ms: None,
        key_prefix: String::new(),
        key_scope: None,
        max_bytes: None,
        fingerprint: false,
    };
    let guards = dedupe.babelqueue_idempotency_consumer().guard();
    let guard = guards
        .call_constructor(&mut store, &options)?
        .map_err(|refused| wasmtime::format_err!("options refused: {}", refused.message))?;
    let body = include_str!("../../../examples/minimal-envelope.json");
    for _ in 0..2 {
        let outcome = guards.call_process(&mut store, guard, body)?;
        println!("{outcome:?}"); // RunOk, then Skip
    }
    guard.resource_drop(&mut store)?;
    Ok(())
}
