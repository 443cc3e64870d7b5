// The core's own conformance runner (bq_dedupe::conformance::run, in the test build
// pkg/conformance-node/ made by `scripts/build-js.sh test`) against the JS runner
// over the public API (conformance.js): one reading of manifest.json, two runners,
// the same results.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { runConformance as runOverApi } from '@babelqueue/dedupe/conformance';
import { bq, manifestText, loadFixture, mapStore } from './helpers.mjs';

const built = fileURLToPath(new URL('../pkg/conformance-node/bq_dedupe.cjs', import.meta.url));
// Missing, it fails: a check that cannot run is not a pass.
assert.ok(existsSync(built), 'no test build: run scripts/build-js.sh test (make js-test does)');
const core = createRequire(import.meta.url)(built);
const manifest = await manifestText();
const parsed = JSON.parse(manifest);
const EXPECTED = parsed.cases.length + 1 + parsed.idempotency.sequences.cases.length;

test('the core runner in wasm passes the whole manifest', async () => {
  const report = await core.runConformance(manifest, loadFixture);
  assert.deepEqual(report.results.filter((r) => !r.passed), []);
  assert.equal(report.summary, `${EXPECTED} passed, 0 failed`);
});

test('the core runner and the JS runner over the public API give the same results, case by case', async () => {
  const fromCore = await core.runConformance(parsed, loadFixture);
  const fromApi = await runOverApi(bq, manifest, loadFixture);
  assert.deepEqual(fromApi.results.map((r) => [r.name, r.passed]), fromCore.results.map((r) => [r.name, r.passed]));
  assert.equal(fromApi.summary, fromCore.summary);
});

test('both runners report the same failures for a broken manifest', async () => {
  const broken = structuredClone(parsed);
  broken.cases[1].expect.lang = 'cobol';
  broken.cases[4].valid = true;
  broken.idempotency.sequences.cases[0].expected_effects = 2;
  broken.idempotency.sequences.cases[3].deliveries[1].expect_effect = 'skip';
  const fromCore = await core.runConformance(broken, loadFixture);
  const fromApi = await runOverApi(bq, broken, loadFixture);
  const failed = (r) => r.results.filter((x) => !x.passed).map((x) => x.name);
  assert.deepEqual(failed(fromCore), ['urn-alias', 'invalid-unknown-schema-version', 'duplicate-delivery-runs-once', 'throw-leaves-id-unmarked']);
  assert.deepEqual(failed(fromApi), failed(fromCore));
  assert.equal(fromCore.summary, `${EXPECTED - 4} passed, 4 failed`);
});

test('the core runner passes in claiming mode and on a synchronous JS store with claims', async () => {
  assert.equal((await core.runConformance(manifest, loadFixture, { claimLeaseMs: 1000 })).failed, 0);
  const store = mapStore('sync', { claims: true });
  const report = await core.runConformance(manifest, loadFixture, { store, claimLeaseMs: 1000 });
  assert.equal(report.summary, `${EXPECTED} passed, 0 failed`);
  assert.ok(store.calls.includes('claim'));
  assert.ok([...store.done.keys()].every((k) => k.startsWith('bq-conformance:')), 'each sequence in its own key prefix');
});

test('the core runner reports (not throws) an async store it cannot drive synchronously', async () => {
  const report = await core.runConformance(manifest, loadFixture, { store: mapStore('async') });
  for (const r of report.results.slice(parsed.cases.length + 1)) {
    if (r.name === 'missing-id-fails-open') assert.ok(r.passed, 'fail-open never touches the store');
    else assert.match(r.failure, /did not complete synchronously/, r.name);
  }
});
