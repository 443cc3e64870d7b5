// The whole conformance manifest (envelope cases, dedup-key, idempotency
// sequences) through the package's public API, on every kind of store.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runConformance, conformanceCount } from '@babelqueue/dedupe/conformance';
import { bq, manifestText, loadFixture, mapStore } from './helpers.mjs';

const manifest = await manifestText();
const parsed = JSON.parse(manifest);
// Counted here from the manifest itself, not by the runner.
const EXPECTED = parsed.cases.length + 1 + parsed.idempotency.sequences.cases.length;

function assertAllPass(report) {
  const failures = report.results.filter((r) => !r.passed).map((r) => `${r.name}: ${r.failure}`);
  assert.deepEqual(failures, []);
  assert.equal(report.results.length, EXPECTED);
  assert.equal(report.summary, `${EXPECTED} passed, 0 failed`);
}

test('the manifest yields 13 results: 6 envelope cases, dedup-key, 6 sequences', () => {
  assert.equal(EXPECTED, 13);
  assert.equal(conformanceCount(manifest), EXPECTED);
});

test('conformance passes in full on the Rust InMemoryStore', async () => {
  const names = [];
  const report = await runConformance(bq, manifest, loadFixture, {}, (r) => names.push(r.name));
  assertAllPass(report);
  assert.deepEqual(names, [
    ...parsed.cases.map((c) => c.name), 'dedup-key', ...parsed.idempotency.sequences.cases.map((s) => s.name),
  ]);
});

test('conformance passes in full on the InMemoryStore in claiming mode', async () => {
  assertAllPass(await runConformance(bq, manifest, loadFixture, { claimLeaseMs: 60_000 }));
});

test('conformance passes in full on a synchronous JS store', async () => {
  assertAllPass(await runConformance(bq, manifest, loadFixture, { store: () => mapStore('sync') }));
});

test('conformance passes in full on an asynchronous JS store', async () => {
  assertAllPass(await runConformance(bq, manifest, loadFixture, { store: () => mapStore('async') }));
});

test('conformance passes in full on an async JS store with claim/release in claiming mode', async () => {
  const stores = [];
  const report = await runConformance(bq, parsed, loadFixture, {
    claimLeaseMs: 60_000,
    store: () => { const s = mapStore('async', { claims: true }); stores.push(s); return s; },
  });
  assertAllPass(report);
  assert.ok(stores.some((s) => s.calls.includes('claim')), 'claiming mode used claim()');
  assert.ok(stores.some((s) => s.calls.includes('release')), 'a thrown handler released its claim');
});

test('each idempotency sequence, driven delivery by delivery through dedupe(), gives the manifest effects', async () => {
  const template = JSON.parse(await loadFixture(parsed.idempotency.dedup_key.envelope_file));
  for (const seq of parsed.idempotency.sequences.cases) {
    const store = new bq.InMemoryStore();
    let effects = 0;
    for (const d of seq.deliveries) {
      if (d.forget_before) await bq.forget(d.meta_id, store);
      template.meta.id = d.meta_id;
      const outcome = await bq.dedupe(template, store, async () => {
        effects += 1;
        if (d.outcome === 'throw') throw new Error('handler threw');
      });
      assert.equal(outcome.ran ? 'run' : outcome.kind, d.expect_effect, `${seq.name}: ${d.meta_id}`);
      if (d.outcome === 'throw') assert.equal(outcome.kind, 'run-failed');
      if (d.meta_id === '') assert.equal(outcome.kind, 'fail-open');
    }
    assert.equal(effects, seq.expected_effects, seq.name);
    store.free();
  }
});

test('a failing case is reported with its reason, not thrown', async () => {
  const broken = structuredClone(parsed);
  broken.cases[0].expect.attempts = 99;
  broken.idempotency.dedup_key.expected_key = 'nope';
  const report = await runConformance(bq, broken, loadFixture);
  assert.equal(report.summary, `${EXPECTED - 2} passed, 2 failed`);
  assert.match(report.results[0].failure, /attempts is 0, expected 99/);
  const missing = await runConformance(bq, manifest, () => { throw new Error('no such file'); });
  assert.equal(missing.passed, 0);
  assert.match(missing.results[0].failure, /no such file/);
});
