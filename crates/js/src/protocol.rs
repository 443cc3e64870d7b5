//! A Rust [`Store`] answering in the JS store protocol (the methods and shapes
//! a JS store has: `{state, token}` claims, `settle(step)` -> `{kept,
//! renewed}`, errors as an `Error` with `kind`): the one conversion behind the
//! Workers build's `DurableObjectStore` and `KvStore` classes and the test
//! build's `TestkitBackend`. The inverse of [`crate::store`]'s reading of a JS
//! store.

use std::time::Duration;

use bq_dedupe::store::wire::{ClaimRef, Remember, Step};
use bq_dedupe::{Store, StoreError, store::ClaimToken};
use js_sys::{Array, Object};
use wasm_bindgen::prelude::*;

use crate::store::claim_to_js;
use crate::{prop, set};

/// A store failure as JS sees one: an `Error` whose `kind` is the core's code.
pub fn error_to_js(e: StoreError) -> JsValue {
    let error = js_sys::Error::new(&e.message);
    set(&error, "kind", &JsValue::from_str(e.kind.code()));
    error.into()
}

fn ms(value: Option<f64>) -> Option<Duration> {
    value.map(|ms| Duration::from_millis(ms.max(0.0) as u64))
}

/// The keys of a batch call, each a string without a lone surrogate, else a
/// TypeError (a key made U+FFFD named another id; one that was no string was
/// left out of the batch: a user's trial).
fn strings(keys: &JsValue) -> Result<Vec<String>, JsValue> {
    Array::from(keys)
        .iter()
        .map(|k| crate::text(k, "key"))
        .collect()
}

fn refs(keys: &[String]) -> Vec<&str> {
    keys.iter().map(String::as_str).collect()
}

fn flags(values: Vec<bool>) -> JsValue {
    values
        .into_iter()
        .map(JsValue::from_bool)
        .collect::<Array>()
        .into()
}

/// The settle step a JS store is passed (see `crate::store`'s `settle`): a
/// `release` or `renew` entry without a token is left out. Its keys and
/// tokens are refused as [`strings`] refuses them (a key made U+FFFD recorded
/// another id: a review).
fn step_from_js(step: &JsValue) -> Result<Step, JsValue> {
    let ms = |name| prop(step, name).as_f64().map(|ms| ms.max(0.0) as u64);
    let entries = |name| -> Result<Vec<(String, Option<ClaimToken>)>, JsValue> {
        Array::from(&prop(step, name))
            .into_iter()
            .map(|r| {
                let key = crate::text(prop(&r, "key"), "key")?;
                let token = prop(&r, "token");
                let token = match token.is_undefined() || token.is_null() {
                    true => None,
                    false => Some(ClaimToken(crate::text(token, "token")?)),
                };
                Ok((key, token))
            })
            .collect()
    };
    let claims = |name| -> Result<Vec<ClaimRef>, JsValue> {
        let claim =
            |(key, token): (String, Option<ClaimToken>)| Some(ClaimRef { key, token: token? });
        Ok(entries(name)?.into_iter().filter_map(claim).collect())
    };
    Ok(Step {
        remember: (entries("remember")?.into_iter())
            .map(|(key, token)| Remember { key, token })
            .collect(),
        ttl_ms: ms("ttlMs"),
        release: claims("release")?,
        renew: claims("renew")?,
        lease_ms: ms("leaseMs"),
    })
}

/// One call of the JS store protocol on `store`: `method` with JS `args`, as a
/// JS store would be called; the answer as that store would give it.
pub async fn call<S: Store + ?Sized>(
    store: &S,
    method: &str,
    args: &[JsValue],
) -> Result<JsValue, JsValue> {
    let arg = |i: usize| args.get(i).cloned().unwrap_or(JsValue::UNDEFINED);
    // Refused as `crate::text` refuses them, not made U+FFFD or "".
    let text = |i: usize| crate::text(arg(i), "key");
    let lease = |i: usize| ms(arg(i).as_f64()).unwrap_or_default();
    let token = |i: usize| crate::text(arg(i), "token").map(ClaimToken);
    let answer = match method {
        "seen" => store.seen(&text(0)?).await.map(JsValue::from_bool),
        "remember" => store
            .remember(&text(0)?, ms(arg(1).as_f64()))
            .await
            .map(|()| JsValue::UNDEFINED),
        "forget" => store.forget(&text(0)?).await.map(|()| JsValue::UNDEFINED),
        "seenMany" => {
            let keys = strings(&arg(0))?;
            store.seen_many(&refs(&keys)).await.map(flags)
        }
        "rememberMany" => {
            let keys = strings(&arg(0))?;
            let ttl = ms(arg(1).as_f64());
            store
                .remember_many(&refs(&keys), ttl)
                .await
                .map(|()| JsValue::UNDEFINED)
        }
        "claim" => store
            .claim(&text(0)?, lease(1))
            .await
            .map(|c| claim_to_js(&c)),
        "claimMany" => {
            let keys = strings(&arg(0))?;
            store
                .claim_many(&refs(&keys), lease(1))
                .await
                .map(|claims| claims.iter().map(claim_to_js).collect::<Array>().into())
        }
        "release" => store
            .release(&text(0)?, &token(1)?)
            .await
            .map(|()| JsValue::UNDEFINED),
        "renew" => store
            .renew(&text(0)?, &token(1)?, lease(2))
            .await
            .map(JsValue::from_bool),
        "rememberFenced" => store
            .remember_fenced(&text(0)?, &token(1)?, ms(arg(2).as_f64()))
            .await
            .map(JsValue::from_bool),
        "settle" => (step_from_js(&arg(0))?.apply(store, Duration::ZERO).await).map(|settled| {
            let reply = Object::new();
            set(&reply, "kept", &flags(settled.kept));
            set(&reply, "renewed", &flags(settled.renewed));
            reply.into()
        }),
        other => {
            return Err(js_sys::TypeError::new(&format!("no store method {other:?}")).into());
        }
    };
    answer.map_err(error_to_js)
}
