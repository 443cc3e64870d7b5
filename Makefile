# The two commands a newcomer needs: `make dev` (the local demo) and `make test`
# (every check CI runs). Both install what is missing and skip what is present.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

CARGO_FUZZ_VERSION := 0.13.2
BABELQUEUE_PY_VERSION := 1.24.0
SAMPLE := examples/sample-stream.jsonl
# The sample's third order fails once, to show a retry running again.
SAMPLE_FAIL := 00000003-b5a6-4789-90ab-cdef01234567
FUZZ_SECONDS ?= 30
# `make bench`: lines for the CLI comparison (each side reads the file 3 times).
CLI_BENCH_LINES ?= 200000

BQ := target/debug/bq-dedupe
# One build per checkout: incremental caches would double the disk a run needs.
export CARGO_INCREMENTAL ?= 0
# The wasm-only crates (the component, the Workers adapter, the fixture worker) are
# built and tested for wasm32 by their own targets, not natively.
TEST_CRATES := --workspace --exclude babelqueue-dedupe-component \
  --exclude babelqueue-dedupe-fixture-worker --exclude babelqueue-dedupe-workerd-testkit \
  --exclude babelqueue-dedupe-workers-js

# Each target family adds its own rules and appends its checks to EXTRA_TESTS.
EXTRA_TESTS :=
include mk/*.mk
# `make` alone is the demo, not the first rule of an included file.
.DEFAULT_GOAL := dev


.PHONY: histories
## histories: the history checker longer than in `make test` (HISTORY_RUNS runs per
## store, more clients' calls at once): every store's histories linearizable.
HISTORY_RUNS ?= 200
histories: setup
	BQ_HISTORY_RUNS=$(HISTORY_RUNS) cargo test -p babelqueue-dedupe --test store_testkit histor
	BQ_HISTORY_RUNS=$(HISTORY_RUNS) scripts/with-stores.sh \
	  cargo test -p babelqueue-dedupe-stores --test histories --test sqlite_processes
	scripts/build-js.sh test
	BQ_HISTORY_RUNS=$(HISTORY_RUNS) BQ_HISTORY_CLIENTS=8 node --test crates/js/tests/store-histories.test.mjs

.PHONY: bench-net
## bench-net: store round trips per delivery and throughput at 0, 0.5 and 2 ms round
## trips, ours beside the Go, PHP and Powertools patterns, Redis and PostgreSQL in a
## network namespace of their own (bench/net.sh; root; removed after).
bench-net:
	bench/net.sh

.PHONY: dev demo-host demo-native test setup setup-fuzz setup-bench lint wasm component-build component-test host unit unit-run conformance packages fuzz bench

## dev: the fixture worker on local workerd (`wrangler dev`, state in .wrangler-state/):
## publish the sample stream twice and print the effects (see mk/workers.mk).
dev: setup dev-worker

## demo-host: dedupe the sample stream through the component with the embedded SQLite
## default (.bq-dedupe/seen.db), then deliver the whole stream again: all skipped.
demo-host: setup component-build host
	@rm -rf .bq-dedupe && mkdir -p .bq-dedupe
	@echo "== first delivery of $(SAMPLE) (exit 3: a retry is needed; exit 4: some lines are poison, by design)"
	$(BQ) run --exec examples/demo-handler.sh $(SAMPLE) || case $$? in 3|4) ;; *) exit 1 ;; esac
	@echo "== the same stream redelivered (a new process, the same SQLite file)"
	$(BQ) run --exec examples/demo-handler.sh $(SAMPLE) || case $$? in 3|4) ;; *) exit 1 ;; esac
	$(BQ) stats

## demo-native: the same sample through the native core and the in-memory store.
demo-native: setup
	cargo run --quiet --release --example dedupe_stream -- $(SAMPLE) --fail $(SAMPLE_FAIL)

## test: formatting, lints, the wasm32 build, the component (+ its JS test), every
## Rust test with a real Redis, conformance through the component on every store,
## a fuzz smoke, and the native conformance run.
test: setup lint wasm component-test unit fuzz conformance packages demo-host $(EXTRA_TESTS)

# Every cargo command after this one builds what Cargo.lock pins: a lock file
# that would need an update fails here (--locked) instead of resolving afresh.
setup:
	@cargo metadata --locked --format-version 1 >/dev/null
	@cargo metadata --locked --format-version 1 --manifest-path crates/component/componentize/Cargo.toml >/dev/null
	@rustup target list --installed | grep -qx wasm32-unknown-unknown \
	  || rustup target add wasm32-unknown-unknown
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt

lint:
	cargo fmt --all --check
	cargo clippy $(TEST_CRATES) --all-targets -- -D warnings
	cargo clippy -p babelqueue-dedupe-workerd-testkit --all-targets -- -D warnings
	cargo clippy -p babelqueue-dedupe --features tracing,exact-json,otel --all-targets -- -D warnings
	# The stores crate with each backend alone (the features its table names),
	# and with none (memory only), its tests and benches too (a test naming a
	# backend needs its feature).
	for f in $$(grep -o 'built_with!("[a-z]*"' crates/stores/src/backends.rs | cut -d'"' -f2 | sort -u) ''; do \
	  cargo clippy -q -p babelqueue-dedupe-stores --no-default-features --features "$$f" --all-targets -- -D warnings; \
	done
	cargo clippy -p babelqueue-dedupe-component --target wasm32-unknown-unknown -- -D warnings
	cargo clippy -p babelqueue-dedupe-component --features minimal --target wasm32-unknown-unknown -- -D warnings

# The core must stay portable: build it for the target the component and the JS package use.
wasm:
	cargo build --lib --release --target wasm32-unknown-unknown

# The components (and their size budget); with the JS (jco) test of the full one
# and a Python (wasmtime-py) host of the minimal one.
component-build:
	scripts/build-component.sh

component-test:
	scripts/build-component.sh test
	scripts/python-host-test.sh

# Built with the same package selection as the tests (TEST_CRATES), so that the
# dependencies' features are unified as there and their builds are shared: a
# `-p` build of one package rebuilds much of the tree with other features.
host:
	cargo build --quiet $(TEST_CRATES) --bins

# Every test, once, with each test server the store table names running
# (scripts/with-stores.sh reads crates/stores/src/backends.rs).
unit: component-build
	scripts/with-stores.sh $(MAKE) --no-print-directory unit-run

unit-run:
	cargo build --quiet $(TEST_CRATES) --examples
	cargo test $(TEST_CRATES) --all-targets
	cargo test $(TEST_CRATES) --doc
	cargo test -p babelqueue-dedupe --features tracing,otel --test tracing_observer --test otel --test otel_guard
	scripts/host-conformance.sh

conformance:
	cargo run --quiet --example conformance

# The crates a user depends on or installs package and build from their packaged
# sources alone (cargo verifies them together, so unpublished path dependencies
# resolve); every other crate says publish = false.
PUBLISHED := -p babelqueue-dedupe -p babelqueue-dedupe-stores -p babelqueue-dedupe-workers \
  -p babelqueue-dedupe-host
# Cargo treats a registry crate of one version as immutable (its extraction and its
# build are reused), so a changed crate of the same version would be verified
# against stale sources: drop our own extractions and builds first. The verify
# builds share the tests' target directory and, for the dependencies, the tests'
# profile (Cargo.toml's [profile.dev.package."*"], which a packaged member does not
# carry), so wasmtime and the clients are not built a second time: on a fresh
# machine this step took 8.6 min in a directory of its own, 3.2 min here.
PUBLISH_PROFILE := --config 'profile.dev.package."*".opt-level=2' \
  --config 'profile.dev.package."*".debug=false'
packages: component-build
	rm -rf $${CARGO_HOME:-$$HOME/.cargo}/registry/src/-*/babelqueue-dedupe*
	cargo clean --quiet $(PUBLISHED)
	CARGO_PROFILE_DEV_DEBUG=false \
	  cargo publish --dry-run --allow-dirty $(PUBLISH_PROFILE) $(PUBLISHED)

# cargo-fuzz needs a nightly toolchain; without one the smoke run is skipped, loudly.
setup-fuzz:
	@if rustup toolchain list | grep -q '^nightly'; then \
	  (cargo fuzz --version 2>/dev/null | grep -q "$(CARGO_FUZZ_VERSION)") \
	    || cargo install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked; \
	fi

fuzz: setup-fuzz
	@if rustup toolchain list | grep -q '^nightly'; then \
	  mkdir -p fuzz/corpus/decode; \
	  cd fuzz && cargo +nightly fuzz run decode corpus/decode ../tests/conformance/fixtures \
	    -- -max_total_time=$(FUZZ_SECONDS) 2>&1 | tail -n 25; \
	else \
	  echo "fuzz: skipped, no nightly toolchain on this machine"; \
	fi

setup-bench:
	@python3 -c "import babelqueue, importlib.metadata as m; assert m.version('babelqueue') == '$(BABELQUEUE_PY_VERSION)'" 2>/dev/null \
	  || pip install --quiet babelqueue==$(BABELQUEUE_PY_VERSION)

## bench: every path side by side on the same workload (bench/README.md): native
## single, batch and decode alone vs the Python peer on 1,000,000 deliveries, bytes
## per id, the component single and batch, `bq-dedupe run --store memory` vs the
## Python peer's CLI loop, the JS package vs plain JS in Node, the cost of each
## mode (seen-set, claiming, transactional) on SQLite and PostgreSQL, and the sizes.
## It measures; it asserts no timing.
bench: setup-bench
	mkdir -p target/bench
	cargo run --quiet --release --example gen_workload -- target/bench/workload.jsonl
	cargo bench --bench throughput
	python3 bench/python_peer.py target/bench/workload.jsonl --out target/bench/python.json
	python3 bench/compare.py
	cargo run --quiet --release --example memory_per_id
	scripts/build-component.sh
	cargo bench -p babelqueue-dedupe-host --bench component
	python3 bench/compare.py --group component_1m
	cargo build --quiet --release -p babelqueue-dedupe-host
	head -n $(CLI_BENCH_LINES) target/bench/workload.jsonl > target/bench/cli-workload.jsonl
	bench/cli.sh target/bench/cli-workload.jsonl
	$(MAKE) --no-print-directory js-bench
	scripts/with-postgres.sh cargo bench -p babelqueue-dedupe-stores --bench modes
	scripts/build-worker.sh
	bench/sizes.sh
