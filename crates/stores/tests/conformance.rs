//! The vendored BabelQueue conformance manifest through `Guard<AnyStore>`, for
//! every store, in plain and in claiming mode.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bq_dedupe::conformance::{self, Effect, Subject};
use bq_dedupe::{Envelope, Guard, KeySpace, Limits, Message, block_on_ready};
use bq_dedupe_stores::AnyStore;
use common::{RedisCleanup, TempDb, redis_prefix, redis_url, unique};
use serde_json::Value;

/// A guard over one store. `reset` moves to a fresh key prefix instead of wiping
/// the store, so a persistent store starts each sequence empty and reruns never
/// meet earlier runs' ids.
struct StoreSubject {
    guard: Option<Guard<AnyStore>>,
    base: String,
    sequence: u32,
    claiming: bool,
}

impl StoreSubject {
    fn new(store: AnyStore, claiming: bool) -> Self {
        let mut subject = StoreSubject {
            guard: Some(Guard::new(store)),
            base: unique("conf"),
            sequence: 0,
            claiming,
        };
        subject.reset().unwrap();
        subject
    }

    fn guard(&self) -> Result<&Guard<AnyStore>, String> {
        self.guard.as_ref().ok_or_else(|| "no guard".to_string())
    }
}

impl Subject for StoreSubject {
    fn decode(&mut self, raw: &[u8]) -> Result<Value, String> {
        let env = Envelope::decode(raw, &Limits::default()).map_err(|r| r.to_string())?;
        serde_json::to_value(env).map_err(|e| e.to_string())
    }

    fn dedup_key(&mut self, raw: &[u8]) -> Result<Option<String>, String> {
        // The dedupe key is meta.id; the per-sequence prefix only isolates runs.
        let msg = Message::parse(raw, &Limits::default()).map_err(|r| r.to_string())?;
        Ok(msg.id().map(str::to_owned))
    }

    fn reset(&mut self) -> Result<(), String> {
        self.sequence += 1;
        let keyspace = KeySpace::new().with_prefix(format!("{}:{}:", self.base, self.sequence));
        let mut guard = self.guard.take().ok_or("no guard")?.with_keyspace(keyspace);
        if self.claiming {
            guard = guard.with_claiming(Duration::from_secs(30));
        }
        self.guard = Some(guard);
        Ok(())
    }

    fn forget(&mut self, id: &str) -> Result<(), String> {
        block_on_ready(self.guard()?.forget(id))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    fn deliver(&mut self, raw: &[u8], succeed: bool) -> Result<Effect, String> {
        let outcome = block_on_ready(self.guard()?.process(raw, async |_| {
            if succeed {
                Ok(())
            } else {
                Err("handler threw")
            }
        }))
        .map_err(|e| e.to_string())?;
        Ok(Effect::of(outcome.kind()))
    }
}

/// Runs the manifest on a fresh guard per mode and prints `NAME: N passed, N failed`.
fn run_manifest(name: &str, open: impl Fn() -> AnyStore) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance");
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    for claiming in [false, true] {
        let label = if claiming {
            format!("{name}-claiming")
        } else {
            name.to_string()
        };
        let mut subject = StoreSubject::new(open(), claiming);
        let load = |file: &str| std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"));
        let report =
            conformance::run(&manifest, load, &mut subject, |r| println!("{label} {r}")).unwrap();
        println!("{label}: {}", report.summary());
        // 6 envelope cases + dedup_key + 6 sequences.
        assert_eq!(report.results.len(), 13);
        assert_eq!(report.failed(), 0, "{label}: {:#?}", report.results);
    }
}

#[test]
fn conformance_memory() {
    run_manifest("memory", || AnyStore::from_spec("memory").unwrap());
}

#[test]
fn conformance_sqlite() {
    let db = TempDb::new("conformance");
    let spec = format!("sqlite:{}", db.path().display());
    run_manifest("sqlite", || AnyStore::from_spec(&spec).unwrap());
}

#[test]
fn conformance_redis() {
    let Some(url) = redis_url() else {
        return;
    };
    let prefix = redis_prefix("conformance");
    let _clean = RedisCleanup {
        url: url.clone(),
        prefix: prefix.clone(),
    };
    // The spec's own prefix syntax, percent-encoded as a URL query value.
    let sep = if url.contains('?') { '&' } else { '?' };
    let spec = format!("{url}{sep}prefix={}", prefix.replace(':', "%3A"));
    run_manifest("redis", || AnyStore::from_spec(&spec).unwrap());
}
