# JS package and playground targets (issue #5).
#
#   make js-build       crates/js -> crates/js/pkg/{web,node} + www/pkg (wasm-bindgen, wasm-opt, size budget)
#   make js-test        the package's Node tests (node --test crates/js/tests/), incl. the
#                       core's conformance runner in a test build next to the JS runner, and
#                       tests/pack.test.mjs: `npm pack` of a clean copy of the tree installed in a
#                       scratch project (ESM, CommonJS, tsc 5.9 + 7.0, the README's examples)
#   make browser-test   the playground end to end in headless Chromium (tests/browser)
#   make playground     serve www/ on http://127.0.0.1:8788/
#   make js-bench       the package against plain JS in Node (JSON.parse + a Set), dedupe and
#                       dedupeBatch side by side on the bench workload (crates/js/bench/node.mjs),
#                       and with BQ_NODE_SDK=<a bundle of @babelqueue/core> against BabelQueue's own
#                       Node helper (bench/README.md says how to make one); it measures, it asserts
#                       no timing
#
# Every tool is installed only when missing (scripts/ensure-tools.sh: `npm ci` from
# the committed lock file, only when node_modules is older than package(-lock).json).

PLAYGROUND_PORT ?= 8788

.PHONY: js-build js-test js-bench browser-test playground browser-setup

js-build:
	scripts/build-js.sh

# `test` also builds pkg/conformance-node (the core's conformance runner, for the tests).
# The pack test also needs the TypeScript versions (the root package.json) and, for the
# README's browser example, Chromium (browser-setup).
js-test: js-build browser-setup
	scripts/build-js.sh test
	node --test crates/js/tests/

# JS_BENCH_LINES: how many workload lines (the issue's figure: 100,000).
JS_BENCH_LINES ?= 100000
JS_BENCH_WORKLOAD ?= target/bench/workload.jsonl

js-bench: js-build
	@test -s $(JS_BENCH_WORKLOAD) || { mkdir -p $(dir $(JS_BENCH_WORKLOAD)) && \
	  cargo run --quiet --release --example gen_workload -- $(JS_BENCH_WORKLOAD); }
	node crates/js/bench/node.mjs $(JS_BENCH_WORKLOAD) $(JS_BENCH_LINES)

browser-setup:
	@scripts/ensure-tools.sh chromium >/dev/null
	@scripts/ensure-tools.sh npm . >/dev/null # playwright-core, TypeScript

browser-test: js-build browser-setup workers-build
	node --test tests/browser/

playground: js-build
	@echo "playground: http://127.0.0.1:$(PLAYGROUND_PORT)/  (Ctrl-C to stop)"
	node scripts/serve-www.mjs $(PLAYGROUND_PORT)

EXTRA_TESTS += js-test browser-test
