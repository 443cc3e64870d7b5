//! The dedupe store over HTTP, for the playground and for operators:
//! `POST /forget {"ids": [...]}` (by `meta.id`, namespaced like the consumer's
//! keys) and `/store/*` (by exact store key).

use std::time::Duration;

use bq_dedupe_workers::bq_dedupe::store::{Peeked, Settlement};
use bq_dedupe_workers::bq_dedupe::{Claim, ClaimToken, Store, StoreError};
use bq_dedupe_workers::{DedupeConfig, RoundTrips, WorkersStore};
use serde::Deserialize;
use serde_json::{Value, json};
use worker::{Env, Request, Response, Result};

#[derive(Deserialize)]
struct Ids {
    ids: Vec<String>,
}

#[derive(Deserialize)]
struct Keys {
    keys: Vec<String>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    lease_ms: Option<u64>,
}

#[derive(Deserialize)]
struct Releases {
    releases: Vec<ReleaseItem>,
}

#[derive(Deserialize)]
struct ReleaseItem {
    key: String,
    token: String,
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
    let status = match e.kind.code() {
        "unsupported" | "invalid" => 400,
        _ => 503,
    };
    Ok(
        Response::from_json(&json!({ "error": e.message, "kind": e.kind.code() }))?
            .with_status(status),
    )
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

/// `POST /store/forget {"keys": [...]}`: by exact store key (no prefix added).
pub async fn forget_keys(mut req: Request, env: Env) -> Result<Response> {
    let mut keys: Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    let (_, store) = open(&env)?;
    for key in &keys.keys {
        if let Err(e) = store.forget(key).await {
            return store_error(e);
        }
    }
    Response::from_json(&json!({ "forgotten": keys.keys.len() }))
}

pub async fn seen(mut req: Request, env: Env) -> Result<Response> {
    let mut keys: Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    let (_, store) = open(&env)?;
    let refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
    reply(
        store
            .seen_many(&refs)
            .await
            .map(|seen| json!({ "seen": seen })),
    )
}

/// `POST /store/peek {"keys": [...]}`: for each key `{"state": "done"}` or
/// `{"state": "not-done", "claim_ends_in_ms": ms | null}` (0: free; null: the
/// store cannot tell), as the guard's re-check of a held key reads it.
pub async fn peek(mut req: Request, env: Env) -> Result<Response> {
    let mut keys: Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    let (_, store) = open(&env)?;
    let refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
    reply(store.peek_many(&refs).await.map(|peeked| {
        let peeked: Vec<Value> = peeked
            .into_iter()
            .map(|p| match p {
                Peeked::Done => json!({ "state": "done" }),
                Peeked::NotDone { claim_ends_in } => json!({
                    "state": "not-done",
                    "claim_ends_in_ms": claim_ends_in.map(|d| d.as_millis() as u64),
                }),
            })
            .collect();
        json!({ "peeked": peeked })
    }))
}

pub async fn remember(mut req: Request, env: Env) -> Result<Response> {
    let mut keys: Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    let (_, store) = open(&env)?;
    let refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
    let ttl = keys.ttl_ms.map(Duration::from_millis);
    reply(
        store
            .remember_many(&refs, ttl)
            .await
            .map(|()| json!({ "ok": true })),
    )
}

pub async fn claim(mut req: Request, env: Env) -> Result<Response> {
    let mut keys: Keys = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    keys.keys.iter_mut().for_each(|k| scope(&env, k));
    let (_, store) = open(&env)?;
    let refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
    let lease = Duration::from_millis(keys.lease_ms.unwrap_or(60_000));
    reply(store.claim_many(&refs, lease).await.map(|claims| {
        let claims: Vec<Value> = claims
            .into_iter()
            .map(|claim| match claim {
                Claim::Acquired(ClaimToken(token)) => {
                    json!({ "state": "acquired", "token": token })
                }
                Claim::Seen => json!({ "state": "seen" }),
                Claim::Held => json!({ "state": "held" }),
            })
            .collect();
        json!({ "claims": claims })
    }))
}

pub async fn release(mut req: Request, env: Env) -> Result<Response> {
    let mut releases: Releases = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    (releases.releases.iter_mut()).for_each(|r| scope(&env, &mut r.key));
    let (_, store) = open(&env)?;
    let tokens: Vec<(&str, ClaimToken)> = releases
        .releases
        .iter()
        .map(|r| (r.key.as_str(), ClaimToken(r.token.clone())))
        .collect();
    let refs: Vec<(&str, &ClaimToken)> = tokens.iter().map(|(k, t)| (*k, t)).collect();
    let step = Settlement {
        release: &refs,
        ..Settlement::default()
    };
    reply(
        store
            .settle(&step)
            .await
            .and_then(|settled| match settled.release_error {
                Some(e) => Err(e),
                None => Ok(json!({ "ok": true })),
            }),
    )
}

#[derive(Deserialize)]
struct SettleBody {
    #[serde(default)]
    remember: Vec<RememberItem>,
    #[serde(default)]
    release: Vec<ReleaseItem>,
    #[serde(default)]
    renew: Vec<ReleaseItem>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    lease_ms: Option<u64>,
}

#[derive(Deserialize)]
struct RememberItem {
    key: String,
    #[serde(default)]
    token: Option<String>,
}

/// `POST /store/settle {"remember": [{key, token?}], "release": [{key, token}],
/// "renew": [{key, token}], "ttl_ms"?, "lease_ms"?}`: one batch step, as the
/// guard makes it. Answers `kept`, `renewed` and `release_error` (or `null`).
pub async fn settle(mut req: Request, env: Env) -> Result<Response> {
    let mut step: SettleBody = match body(&mut req, &env).await? {
        Ok(b) => b,
        Err(refusal) => return Ok(refusal),
    };
    let items = step.release.iter_mut().chain(step.renew.iter_mut());
    items.for_each(|r| scope(&env, &mut r.key));
    step.remember
        .iter_mut()
        .for_each(|r| scope(&env, &mut r.key));
    let (_, store) = open(&env)?;
    let token = |t: &str| ClaimToken(t.to_string());
    let remember_tokens: Vec<(&str, Option<ClaimToken>)> = step
        .remember
        .iter()
        .map(|r| (r.key.as_str(), r.token.as_deref().map(token)))
        .collect();
    let release_tokens: Vec<(&str, ClaimToken)> = step
        .release
        .iter()
        .map(|r| (r.key.as_str(), token(&r.token)))
        .collect();
    let renew_tokens: Vec<(&str, ClaimToken)> = step
        .renew
        .iter()
        .map(|r| (r.key.as_str(), token(&r.token)))
        .collect();
    let remember: Vec<(&str, Option<&ClaimToken>)> = remember_tokens
        .iter()
        .map(|(k, t)| (*k, t.as_ref()))
        .collect();
    let release: Vec<(&str, &ClaimToken)> = release_tokens.iter().map(|(k, t)| (*k, t)).collect();
    let renew: Vec<(&str, &ClaimToken)> = renew_tokens.iter().map(|(k, t)| (*k, t)).collect();
    let settlement = Settlement {
        remember: &remember,
        ttl: step.ttl_ms.map(Duration::from_millis),
        release: &release,
        renew: &renew,
        lease: Duration::from_millis(step.lease_ms.unwrap_or(60_000)),
    };
    reply(store.settle(&settlement).await.map(|settled| {
        json!({
            "kept": settled.kept,
            "renewed": settled.renewed,
            "release_error": settled.release_error.map(|e| e.to_string()),
        })
    }))
}

#[derive(Deserialize)]
struct Transaction {
    key: String,
    #[serde(default)]
    ttl_ms: Option<u64>,
    ok: bool,
}

/// The testkit's effect rows (test directives only): one per committed
/// transaction of `/store/transact`.
const TESTKIT_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS testkit_effects (key TEXT NOT NULL)";

/// `POST /store/transact {"key", "ttl_ms", "ok"}` (D1, test directives only):
/// the transactional mode on one key, its work one row in `testkit_effects`,
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
    let mut tx: Transaction = match body(&mut req, &env).await? {
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
            .commit_with(Some(&tx.key), ttl, statements)
            .await
            .map(|run| {
                let run = match run {
                    TxRun::Committed(()) => "committed",
                    TxRun::AlreadyDone => "already-done",
                    TxRun::Held => "held",
                    TxRun::RolledBack(_) | TxRun::Aborted(_) => "rolled-back",
                };
                json!({ "run": run })
            }),
    )
}

/// `POST /store/effects {"keys": [key]}` (test directives only): how many rows
/// `/store/transact` left for the key, `{"effects": n}`.
pub async fn effects(mut req: Request, env: Env) -> Result<Response> {
    if !crate::access::directives_enabled(&env) {
        return Response::error("the testkit's effects need EXAMPLE_TEST_DIRECTIVES=1", 403);
    }
    let mut keys: Keys = match body(&mut req, &env).await? {
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
