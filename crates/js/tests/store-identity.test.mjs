// Which InMemoryStore a call uses: the one passed, never another live one of
// this module or one of another copy of the module (a review's findings).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { bq, envelope } from './helpers.mjs';

const require = createRequire(import.meta.url);
const main = require.resolve('@babelqueue/dedupe');

/** A fresh copy of the package's Node build (two versions installed, jest's registries). */
function anotherCopy() {
  delete require.cache[main];
  return require(main);
}

test('a store made after two million others is its own, not a live older one', async () => {
  const older = new bq.InMemoryStore();
  await bq.dedupe(envelope('order-7'), older, () => {});
  // The handle counter wrapped at 2^21: the new store got the older one's.
  for (let i = 0; i < 2 ** 21 - 1; i++) new bq.InMemoryStore().free();
  const fresh = new bq.InMemoryStore();
  let ran = 0;
  const outcome = await bq.dedupe(envelope('order-7'), fresh, () => { ran++; });
  assert.equal(outcome.kind, 'run-ok', 'an empty store has not seen it');
  assert.equal(ran, 1);
  assert.equal(fresh.size, 1);
  assert.equal(older.size, 1);
});

test("another copy's store is never taken for one of ours, even with Math.random stubbed", async () => {
  const random = Math.random;
  Math.random = () => 0.42; // a seeded test setup: both copies draw the same
  try {
    const a = anotherCopy();
    const b = anotherCopy();
    const storeA = new a.InMemoryStore();
    const storeB = new b.InMemoryStore();
    await a.dedupe(envelope('order-7'), storeA, () => {});
    let ran = 0;
    // Copy A with copy B's empty store: used through its methods, so it runs.
    const outcome = await a.dedupe(envelope('order-7'), storeB, () => { ran++; });
    assert.equal(outcome.kind, 'run-ok');
    assert.equal(ran, 1);
    assert.deepEqual([storeA.size, storeB.size], [1, 1]);
  } finally {
    Math.random = random;
  }
});

test("claimLeaseMs with a store that cannot renew (another copy's InMemoryStore) is said once on console.warn", async () => {
  const other = anotherCopy();
  const warnings = [];
  const warn = console.warn;
  console.warn = (text) => { warnings.push(String(text)); };
  try {
    const store = new other.InMemoryStore();
    await bq.dedupe(envelope('w-1'), store, () => {}, { claimLeaseMs: 1000 });
    await bq.dedupe(envelope('w-2'), store, () => {}, { claimLeaseMs: 1000 });
  } finally {
    console.warn = warn;
  }
  // Once per module instance (each test file is a process of its own).
  const said = warnings.filter((w) => w.includes('claimLeaseMs with a store that has no renew'));
  assert.equal(said.length, 1, `${warnings}`);
});
