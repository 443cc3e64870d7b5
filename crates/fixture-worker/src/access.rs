//! Who may use the fixture worker's routes, and how much they may send.
//!
//! Every route (all but the static playground, which the assets layer serves
//! before the worker runs) needs `Authorization: Bearer <EXAMPLE_ADMIN_TOKEN>`.
//! The token is a secret (`wrangler secret put EXAMPLE_ADMIN_TOKEN`; locally
//! `.dev.vars` or `wrangler dev --env-file FILE`); with none configured
//! every route refuses, so a deployment without one is closed, not open.
//! Request bodies are limited to [`MAX_BODY_BYTES`].

use serde::de::DeserializeOwned;
use worker::{Env, Headers, Request, Response, Result};

/// The setting that holds the token.
pub const TOKEN_VAR: &str = "EXAMPLE_ADMIN_TOKEN";
/// The setting that lets `data` carry test directives (`panic`, `sleep_ms`, ...):
/// `1` only in local runs (the tests, `make dev`), never in a deployment.
pub const DIRECTIVES_VAR: &str = "EXAMPLE_TEST_DIRECTIVES";
/// The largest request body accepted by default: 1 MiB (a `/publish` of 100
/// ordinary envelopes fits many times over). `EXAMPLE_MAX_BODY_BYTES` changes it.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// The setting that overrides [`MAX_BODY_BYTES`].
pub const MAX_BODY_VAR: &str = "EXAMPLE_MAX_BODY_BYTES";

fn setting(env: &Env, name: &str) -> Option<String> {
    env.var(name)
        .ok()
        .map(|v| v.to_string())
        .filter(|v| !v.trim().is_empty())
}

/// Whether test directives are honoured (see [`DIRECTIVES_VAR`]).
pub fn directives_enabled(env: &Env) -> bool {
    matches!(
        setting(env, DIRECTIVES_VAR).as_deref(),
        Some("1" | "on" | "true")
    )
}

/// `None` when the request carries the configured token; otherwise the refusal:
/// 403 when no token is configured, 401 when it is missing or wrong.
pub fn refuse(req: &Request, env: &Env) -> Result<Option<Response>> {
    let Some(token) = setting(env, TOKEN_VAR) else {
        return Response::error(
            format!(
                "{TOKEN_VAR} is not set, so every route is refused: set it \
                 (`wrangler secret put {TOKEN_VAR}`; locally .dev.vars or \
                 `wrangler dev --env-file FILE`) and send `Authorization: Bearer <token>`"
            ),
            403,
        )
        .map(Some);
    };
    let header = req.headers().get("authorization")?.unwrap_or_default();
    let given = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "));
    if given.is_some_and(|given| same(given.trim().as_bytes(), token.as_bytes())) {
        return Ok(None);
    }
    let why = if given.is_none() { "missing" } else { "wrong" };
    let headers = Headers::new();
    headers.set("www-authenticate", "Bearer")?;
    Ok(Some(
        Response::error(
            format!("{why} token: send `Authorization: Bearer <{TOKEN_VAR}>`"),
            401,
        )?
        .with_headers(headers),
    ))
}

/// Compares `given` with the `secret` in a time that depends on the secret's
/// length only: neither where they differ nor the secret's length shows in how
/// long a wrong guess takes to refuse.
fn same(given: &[u8], secret: &[u8]) -> bool {
    let mut differ = given.len() ^ secret.len();
    for (i, s) in secret.iter().enumerate() {
        differ |= usize::from(given.get(i).copied().unwrap_or(!s) ^ s);
    }
    differ == 0
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cre", b"s3cret"));
        assert!(!same(b"s3cretX", b"s3cret"));
        assert!(!same(b"S3cret", b"s3cret"));
        assert!(!same(b"", b"s3cret"));
    }
}

/// The request body as JSON, at most [`MAX_BODY_BYTES`] (or `EXAMPLE_MAX_BODY_BYTES`):
/// `Ok(Err(response))` is the refusal to send (413 too large, 400 not the JSON
/// expected).
pub async fn json_body<T: DeserializeOwned>(
    req: &mut Request,
    env: &Env,
) -> Result<std::result::Result<T, Response>> {
    let limit = setting(env, MAX_BODY_VAR)
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(MAX_BODY_BYTES);
    let too_large = || {
        Response::error(
            format!("request body over {limit} bytes ({MAX_BODY_VAR})"),
            413,
        )
    };
    let declared = req
        .headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|n| n.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large().map(Err);
    }
    let bytes = match req.bytes().await {
        Ok(bytes) => bytes,
        Err(e) => return bad(&e.to_string()).map(Err),
    };
    if bytes.len() > limit {
        return too_large().map(Err);
    }
    match serde_json::from_slice(&bytes) {
        Ok(value) => Ok(Ok(value)),
        Err(e) => bad(&e.to_string()).map(Err),
    }
}

fn bad(why: &str) -> Result<Response> {
    Response::error(format!("bad request body: {why}"), 400)
}
