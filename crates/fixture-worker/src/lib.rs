//! The test fixture the workerd tests run; the example to copy is `examples/user-worker`.
//!
//! It publishes BabelQueue envelopes to a queue and consumes them through
//! bq-dedupe, counting the fixture handler's side effects; `make dev` and the
//! playground serve it too.
//!
//! Modules, one binding each:
//! - [`consumer`]: the queue consumer (`bq-orders` and its dead-letter queue);
//! - [`effects`]: `EffectLog`, a Durable Object recording effects, dead letters
//!   and consumer counters (strongly consistent, so tests can count exactly);
//! - [`publish`]: `POST /publish`;
//! - [`store_api`]: the dedupe store over HTTP (`/forget`, `/store/*`), used by
//!   the playground;
//! - [`access`]: every route needs `Authorization: Bearer <EXAMPLE_ADMIN_TOKEN>`
//!   (none configured: all refused), bodies are size-limited, and the handler's
//!   test directives work only with `EXAMPLE_TEST_DIRECTIVES=1` (local runs).
//!
//! The benchmark's baseline (`EXAMPLE_NAIVE_STORE=on`) is the same store behind
//! the core's per-key wrapper (`PerKey(Unbatched(&store))`).

mod access;
mod consumer;
mod effects;
mod publish;
mod store_api;

use worker::{Context, Env, Request, Response, Result, Router, event};

// The Durable Object classes this worker binds (wrangler.toml).
pub use bq_dedupe_workers::durable::DedupeShard;
pub use effects::EffectLog;

bq_dedupe_workers::queue_consumer!(consumer::consume);

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    // Every route needs the admin token (the playground is served before this).
    if let Some(refusal) = access::refuse(&req, &env)? {
        return Ok(refusal);
    }
    Router::new()
        .post_async("/publish", |req, ctx| publish::publish(req, ctx.env))
        .get_async("/effects", |_, ctx| effects::forward(ctx.env, "/effects"))
        .get_async("/stats", |_, ctx| effects::forward(ctx.env, "/stats"))
        .get_async("/dead-letters", |_, ctx| {
            effects::forward(ctx.env, "/dead-letters")
        })
        .post_async("/forget", |req, ctx| store_api::forget(req, ctx.env))
        .post_async("/store/seen", |req, ctx| store_api::seen(req, ctx.env))
        .post_async("/store/peek", |req, ctx| store_api::peek(req, ctx.env))
        .post_async("/store/forget", |req, ctx| {
            store_api::forget_keys(req, ctx.env)
        })
        .post_async("/store/remember", |req, ctx| {
            store_api::remember(req, ctx.env)
        })
        .post_async("/store/claim", |req, ctx| store_api::claim(req, ctx.env))
        .post_async("/store/release", |req, ctx| {
            store_api::release(req, ctx.env)
        })
        .post_async("/store/settle", |req, ctx| store_api::settle(req, ctx.env))
        .post_async("/store/transact", |req, ctx| {
            store_api::transact(req, ctx.env)
        })
        .post_async("/store/effects", |req, ctx| {
            store_api::effects(req, ctx.env)
        })
        .get_async("/store/entries", |req, ctx| {
            store_api::entries(req, ctx.env)
        })
        .run(req, env)
        .await
        // A configuration or binding error, as text rather than a bare 500.
        .or_else(|e| Response::error(e.to_string(), 500))
}
