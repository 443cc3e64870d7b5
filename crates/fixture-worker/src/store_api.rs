//! The dedupe store over HTTP, for the playground and for operators:
//! `POST /forget {"ids": [...]}` (by `meta.id`, namespaced like the consumer's
//! keys) and `/store/*` (by exact store key).

use std::time::Duration;

use bq_dedupe_workers::bq_dedupe::store::wire;
use bq_dedupe_workers::bq_dedupe::{Store, StoreError};
use bq_dedupe_workers::{DedupeConfig, RoundTrips, WorkersStore};
use serde::Deserialize;
use serde_json::{Value, json};
use worker::{Env, Request, Response, Result};

#[derive(Deserialize)]
struct Ids {
    ids: Vec<String>,
}

#[derive(Deserialize)]
struct Releases {
    releases: Vec<wire::ClaimRef>,
}

/// Where the `/store/*` routes read and write in a deployment: a key space of
/// their own, so the playground (or anyone with the admin token) never marks
/// a production id done or claims it. With test directives on (local runs
/// only, [`crate::access::DIRECTIVES_VAR`]) they reach the consumer's own keys,
/// as the Workers tests need to play a second consumer. `/store/entries` only
/// reads, and lists every key.
pub const PLAYGROUND_PREFIX: &str = "playground:";

fn scope(env: &Env, key: &mut String) {
    if !crate::access::directives_enabled(env) {
        key.insert_str(0, PLAYGROUND_PREFIX);
    }
}

fn open(env: &Env) -> Result<(DedupeConfig, WorkersStore)> {
    let config = DedupeConfig::from_env(env)?;
    let store = config.store(env, RoundTrips::new())?;
    Ok((config, store))
}

fn store_error(e: StoreError) -> Result<Response> {
    use bq_dedupe_workers::bq_dedupe::store::StoreErrorKind::{Invalid, Unsupported};
    let status = match e.kind {
        Unsupported | Invalid => 400,
        _ => 503,
    };
    Ok(Response::from_json(&e)?.with_status(status))
}

fn reply(result: std::result::Result<Value, StoreError>) -> Result<Response> {
    match result {
        Ok(body) => Response::from_json(&body),
        Err(e) => store_error(e),
    }
}

async fn body<T: serde::de::DeserializeOwned>(
    req: &mut Request,
    env: &Env,
) -> Result<std::result::Result<T, Response>> {
    crate::access::json_body(req, env).await
}

pub async fn forget(mut req: Request, env: Env) -> Result<Response> {
    let ids: Ids = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    let (config, store) = open(&env)?;
    let guard = config.guard(store);
    let mut forgotten = 0;
    for id in &ids.ids {
        if let Err(e) = guard.forget(id).await {
            return store_error(e);
        }
        forgotten += 1;
    }
    Response::from_json(&json!({ "forgotten": forgotten }))
}

/// A `/store/*` route on keys: `call` with the body's keys (scoped) and the store.
async fn on_keys(
    mut req: Request,
    env: Env,
    call: impl AsyncFnOnce(wire::Keys, WorkersStore) -> Result<Response>,
) -> Result<Response> {
    let mut keys: wire::Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    call(keys, open(&env)?.1).await
}

/// `POST /store/forget {"keys": [...]}`: by exact store key (no prefix added).
pub async fn forget_keys(req: Request, env: Env) -> Result<Response> {
    on_keys(req, env, async |keys, store| {
        for key in &keys.keys {
            if let Err(e) = store.forget(key).await {
                return store_error(e);
            }
        }
        Response::from_json(&json!({ "forgotten": keys.keys.len() }))
    })
    .await
}

pub async fn seen(req: Request, env: Env) -> Result<Response> {
    on_keys(req, env, async |keys, store| {
        let seen = store.seen_many(&keys.refs()).await;
        reply(seen.map(|seen| json!({ "seen": seen })))
    })
    .await
}

/// `POST /store/peek {"keys": [...]}`: for each key `{"state": "done"}` or
/// `{"state": "not-done", "claim_ends_in_ms": ms | null}` (0: free; null: the
/// store cannot tell), as the guard's re-check of a held key reads it.
pub async fn peek(req: Request, env: Env) -> Result<Response> {
    on_keys(req, env, async |keys, store| {
        let peeked = store.peek_many(&keys.refs()).await;
        reply(peeked.map(|peeked| json!({ "peeked": peeked })))
    })
    .await
}

pub async fn remember(req: Request, env: Env) -> Result<Response> {
    on_keys(req, env, async |keys, store| {
        let ttl = keys.ttl_ms.map(Duration::from_millis);
        let remembered = store.remember_many(&keys.refs(), ttl).await;
        reply(remembered.map(|()| json!({ "ok": true })))
    })
    .await
}

pub async fn claim(req: Request, env: Env) -> Result<Response> {
    on_keys(req, env, async |keys, store| {
        let lease = Duration::from_millis(keys.lease_ms.unwrap_or(60_000));
        let claims = store.claim_many(&keys.refs(), lease).await;
        reply(claims.map(|claims| json!({ "claims": claims })))
    })
    .await
}

pub async fn release(mut req: Request, env: Env) -> Result<Response> {
    let mut releases: Releases = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    (releases.releases.iter_mut()).for_each(|r| scope(&env, &mut r.key));
    let (_, store) = open(&env)?;
    let step = wire::Step {
        release: releases.releases,
        ..wire::Step::default()
    };
    let settled = step.apply(&store, Duration::ZERO).await;
    reply(settled.and_then(|settled| match settled.release_error {
        Some(e) => Err(e),
        None => Ok(json!({ "ok": true })),
    }))
}

/// `POST /store/settle {"remember": [{key, token?}], "release": [{key, token}],
/// "renew": [{key, token}], "ttl_ms"?, "lease_ms"?}`: one batch step, as the
/// guard makes it. Answers `kept`, `renewed` and `release_error` (or `null`).
pub async fn settle(mut req: Request, env: Env) -> Result<Response> {
    let mut step: wire::Step = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    let items = step.release.iter_mut().chain(step.renew.iter_mut());
    items.for_each(|r| scope(&env, &mut r.key));
    step.remember
        .iter_mut()
        .for_each(|r| scope(&env, &mut r.key));
    let (_, store) = open(&env)?;
    let settled = step.apply(&store, Duration::from_millis(60_000)).await;
    reply(settled.map(|settled| json!(wire::Settled::from(settled))))
}

/// The testkit's effect rows (test directives only): one per committed
/// transaction of `/store/transact`.
const TESTKIT_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS testkit_effects (key TEXT NOT NULL)";

/// `POST /store/transact {"key", "ttl_ms", "claim", "ok"}` (D1, test
/// directives only): the transactional mode on one key (the run's own claim
/// on it, if `claim` names its token), its work one row in `testkit_effects`,
/// the batch made to fail (a statement D1 refuses) when `ok` is false.
/// Answers `{"run": "committed" | "already-done" | "held" | "rolled-back"}`.
pub async fn transact(mut req: Request, env: Env) -> Result<Response> {
    use bq_dedupe_workers::bq_dedupe::store::{StatementStore, TxRun};
    if !crate::access::directives_enabled(&env) {
        return Response::error(
            "the testkit's transactions need EXAMPLE_TEST_DIRECTIVES=1",
            403,
        );
    }
    let mut tx: wire::Transact = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    scope(&env, &mut tx.key);
    let (config, store) = open(&env)?;
    let db = env.d1(&config.d1_binding)?;
    db.prepare(TESTKIT_EFFECTS).run().await?;
    let key = wasm_bindgen::JsValue::from_str(&tx.key);
    let mut statements = vec![
        db.prepare("INSERT INTO testkit_effects (key) VALUES (?1)")
            .bind(std::slice::from_ref(&key))?,
    ];
    if !tx.ok {
        statements.push(
            db.prepare("INSERT INTO testkit_no_such_table (key) VALUES (?1)")
                .bind(&[key])?,
        );
    }
    let ttl = tx.ttl_ms.map(Duration::from_millis);
    reply(
        store
            .commit_with(Some(&tx.key), ttl, tx.claim.as_ref(), statements)
            .await
            .and_then(|run| {
                let run = match run {
                    // The handler's statement refused: the run's own failure.
                    TxRun::Aborted(_) => wire::Run::RolledBack,
                    // The batch failed whole: the store's error, as the guard takes it.
                    TxRun::RolledBack(e) => return Err(e),
                    run => run.into(),
                };
                Ok(json!({ "run": run }))
            }),
    )
}

/// `POST /store/effects {"keys": [key]}` (test directives only): how many rows
/// `/store/transact` left for the key, `{"effects": n}`.
pub async fn effects(mut req: Request, env: Env) -> Result<Response> {
    if !crate::access::directives_enabled(&env) {
        return Response::error("the testkit's effects need EXAMPLE_TEST_DIRECTIVES=1", 403);
    }
    let mut keys: wire::Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    let (config, _) = open(&env)?;
    let db = env.d1(&config.d1_binding)?;
    db.prepare(TESTKIT_EFFECTS).run().await?;
    #[derive(Deserialize)]
    struct Count {
        n: u64,
    }
    let key = wasm_bindgen::JsValue::from_str(keys.keys.first().map_or("", String::as_str));
    let count: Option<Count> = db
        .prepare("SELECT count(*) AS n FROM testkit_effects WHERE key = ?1")
        .bind(&[key])?
        .first(None)
        .await?;
    Response::from_json(&json!({ "effects": count.map_or(0, |c| c.n) }))
}

/// `GET /store/entries[?expired=1]`: the live rows; with `expired=1` also the
/// expired rows the sweep alarm has not removed yet.
pub async fn entries(req: Request, env: Env) -> Result<Response> {
    // A string check, not `req.url()`: parsing a URL links the `url` crate's IDNA
    // tables (about 180 KB of wasm) for one flag.
    let url = req.inner().url();
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let expired = query.split('&').any(|pair| pair == "expired=1");
    let (_, store) = open(&env)?;
    match &store {
        WorkersStore::DurableObject(s) => reply(
            s.entries(1000, expired)
                .await
                .map(|entries| json!({ "entries": entries })),
        ),
        WorkersStore::Kv(_) => store_error(StoreError::unsupported(
            "the KV store cannot list its entries consistently",
        )),
        WorkersStore::D1(_) => store_error(StoreError::unsupported(
            "the D1 store's entries are its bq_dedupe table: query it with wrangler d1 execute",
        )),
    }
}
