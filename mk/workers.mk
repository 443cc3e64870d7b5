# The Cloudflare Workers adapter (crates/workers) and the fixture worker
# (crates/fixture-worker, wrangler.toml) on real workerd through Miniflare.

WORKER_PORT ?= 8787
WORKER_STATE := .wrangler-state

.PHONY: setup-workers workers-build workers-lint workers-test workers-bench workers-cost ts-startup dev-worker

## workers-build: the fixture worker bundle (offline worker-build), size printed.
workers-build:
	scripts/build-worker.sh

# The adapter and the example ship as wasm32: lint them for that target.
workers-lint:
	cargo clippy -p babelqueue-dedupe-workers -p babelqueue-dedupe-fixture-worker -p babelqueue-dedupe-workers-js --target wasm32-unknown-unknown -- -D warnings

## workers-test: every scenario of the adapter as queue traffic on workerd, the
## locked example routes, a user's own worker (examples/user-worker) built
## outside the workspace with worker-build, and the store testkit against the
## Durable Object and D1 stores on workerd (crates/workerd-testkit).
workers-test: workers-build workers-lint
	node --test --test-reporter=spec crates/workers/tests/
	scripts/with-worker.sh cargo test -p babelqueue-dedupe-workerd-testkit --test durable_object
	BQ_SERVE_VARS='{"DEDUPE_STORE":"d1"}' scripts/with-worker.sh cargo test -p babelqueue-dedupe-workerd-testkit --test d1

## workers-bench: batch RPC vs a naive per-message adapter, same runtime.
workers-bench: workers-build
	node crates/workers/bench/bench.mjs

## workers-cost: requests and rows (the backends' own counts) per 1,000 messages
## and US$ per million, per store, mode and batch size, beside the naive adapter:
## target/bench/workers-cost.md (BQ_BENCH_TOTAL, BQ_BENCH_DONE, BQ_BENCH_BATCHES, BQ_BENCH_MODES).
workers-cost: workers-build
	node crates/workers/bench/cost.mjs

## ts-startup: the TypeScript template's bundle size and start-up CPU (`wrangler
## check startup`, BQ_STARTUP_RUNS runs) beside a plain TypeScript consumer:
## target/bench/ts-startup.md. `npm pack` builds the JS package.
ts-startup: setup-workers
	node crates/workers/bench/startup.mjs

## dev-worker: `wrangler dev` on 127.0.0.1 with local state in .wrangler-state/,
## publish the sample stream (with duplicates and a malformed line), print effects.
dev-worker:
	scripts/worker-demo.sh $(WORKER_PORT) $(WORKER_STATE)

EXTRA_TESTS += workers-test

## setup-workers: the npm tools (wrangler, miniflare, esbuild, binaryen) and the
## pinned cargo tools worker-build runs; each skipped when already present.
setup-workers:
	@scripts/ensure-tools.sh npm . >/dev/null
	@scripts/ensure-tools.sh wasm-bindgen >/dev/null
	@scripts/ensure-tools.sh worker-build >/dev/null

setup: setup-workers
