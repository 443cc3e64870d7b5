//! `runConformance(manifest, loadFixture, options?)`: the core's own manifest
//! runner (`bq_dedupe::conformance::run`) in a test build of the module (cargo
//! feature `conformance`, `scripts/build-js.sh test` -> `pkg/conformance-node/`),
//! so the Node tests can check that the core's runner and the JS runner over the
//! public API (`conformance.js`) agree. Not in the published module: the runner
//! needs the owned `Envelope` and serde-derived manifest types, about 73 KB.
//!
//! The runner is synchronous; fixtures are loaded (awaited) first, then the run
//! uses them from memory. The subject is the core's guard over the given store (a
//! fresh in-memory one by default; a JS store must answer synchronously here).

use std::time::Duration;

use bq_dedupe::InMemoryStore;
use bq_dedupe::conformance::{self, GuardSubject};
use js_sys::{Array, Function, Object, Uint8Array};
use serde_json::Value;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::memory::DateClock;
use crate::store::{GivenStore, await_value, message_of};
use crate::{check_options, js_error, opt_number, prop, set, type_error};

/// The fixture paths a manifest refers to, in order, without duplicates.
fn fixture_paths(manifest: &Value) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    let cases = manifest.get("cases").and_then(Value::as_array);
    let files = cases
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("file"))
        .chain(manifest.pointer("/idempotency/dedup_key/envelope_file"));
    for file in files.filter_map(Value::as_str) {
        if !paths.iter().any(|p| p == file) {
            paths.push(file.to_owned());
        }
    }
    paths
}

fn bytes_of(value: &JsValue) -> Result<Vec<u8>, String> {
    if let Some(s) = value.as_string() {
        Ok(s.into_bytes())
    } else if let Some(b) = value.dyn_ref::<Uint8Array>() {
        Ok(b.to_vec())
    } else if let Some(b) = value.dyn_ref::<js_sys::ArrayBuffer>() {
        Ok(Uint8Array::new(b).to_vec())
    } else {
        Err("loadFixture must return a string, a Uint8Array or an ArrayBuffer".into())
    }
}

/// Runs the manifest's envelope cases, `dedup_key` and idempotency sequences.
/// Resolves to `{ results: [{ name, passed, failure }], passed, failed, summary }`.
#[wasm_bindgen(js_name = runConformance, unchecked_return_type = "{ results: { name: string; passed: boolean; failure: string | null }[]; passed: number; failed: number; summary: string }")]
pub async fn run_conformance(
    #[wasm_bindgen(unchecked_param_type = "string | object")] manifest: JsValue,
    #[wasm_bindgen(
        unchecked_param_type = "(path: string) => string | Uint8Array | ArrayBuffer | Promise<string | Uint8Array | ArrayBuffer>"
    )]
    load_fixture: JsValue,
    #[wasm_bindgen(
        unchecked_param_type = "{ store?: DedupeStore | InMemoryStore; claimLeaseMs?: number }"
    )]
    options: JsValue,
) -> Result<JsValue, JsValue> {
    let text = match manifest.as_string() {
        Some(text) => text,
        None => js_sys::JSON::stringify(&manifest)
            .ok()
            .and_then(|s| s.as_string())
            .ok_or_else(|| type_error("manifest must be JSON text or an object"))?,
    };
    let load = load_fixture
        .dyn_into::<Function>()
        .map_err(|_| type_error("loadFixture must be a function"))?;
    let parsed: Value = serde_json::from_str(&text)
        .map_err(|e| type_error(&format!("unreadable manifest: {e}")))?;

    check_options("options", &options, &["store", "claimLeaseMs"])?;
    let claim_lease_ms = opt_number("options", &options, "claimLeaseMs")?;
    let store_value = if options.is_object() {
        prop(&options, "store")
    } else {
        JsValue::UNDEFINED
    };
    let store = if store_value.is_undefined() || store_value.is_null() {
        GivenStore::Memory(std::rc::Rc::new(InMemoryStore::with_clock(
            std::sync::Arc::new(DateClock),
        )))
    } else {
        GivenStore::from_js(&store_value)
            .map_err(|e| type_error(&e))?
            .0
    };

    let mut fixtures: Vec<(String, Result<Vec<u8>, String>)> = Vec::new();
    for path in fixture_paths(&parsed) {
        let loaded = await_value(load.call1(&JsValue::UNDEFINED, &JsValue::from_str(&path)))
            .await
            .map_err(|e| format!("{path}: {}", message_of(&e)))
            .and_then(|v| bytes_of(&v).map_err(|e| format!("{path}: {e}")));
        fixtures.push((path, loaded));
    }
    let lookup = |path: &str| {
        fixtures
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| Err(format!("{path}: not loaded")))
    };

    let mut subject = GuardSubject::new(store).with_prefix_base("bq-conformance:");
    if let Some(ms) = claim_lease_ms {
        subject = subject.with_claiming(Duration::from_millis(ms as u64));
    }
    let report = conformance::run(&text, lookup, &mut subject, |_| {}).map_err(|e| js_error(&e))?;

    let results = Array::new();
    for r in &report.results {
        let o = Object::new();
        set(&o, "name", &JsValue::from_str(&r.name));
        set(&o, "passed", &JsValue::from_bool(r.failure.is_none()));
        let failure = r
            .failure
            .as_deref()
            .map_or(JsValue::NULL, JsValue::from_str);
        set(&o, "failure", &failure);
        results.push(&o);
    }
    let out = Object::new();
    set(&out, "results", &results);
    set(&out, "passed", &JsValue::from_f64(report.passed() as f64));
    set(&out, "failed", &JsValue::from_f64(report.failed() as f64));
    set(&out, "summary", &JsValue::from_str(&report.summary()));
    Ok(out.into())
}
