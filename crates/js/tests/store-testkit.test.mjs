// The store testkit over the package's JS store adapter (the Rust side
// that calls a JS object's seen/remember/claim/settle/... and reads its
// answers), in the test build pkg/conformance-node/ (`scripts/build-js.sh
// test`). Each store below is a plain object, shaped as a user's store would
// be, forwarding to a TestkitBackend (the core's in-memory store on a manual
// clock): a wrong conversion in the adapter (a token, a claim state, a settle
// reply, an error kind) fails the model's check.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const built = fileURLToPath(new URL('../pkg/conformance-node/bq_dedupe.cjs', import.meta.url));
assert.ok(existsSync(built), 'no test build: run scripts/build-js.sh test (make js-test does)');
const core = createRequire(import.meta.url)(built);

const SPEC = ['seen', 'remember', 'forget'];
const CLAIMS = ['claim', 'release'];
const BATCH = ['seenMany', 'rememberMany', 'claimMany'];

/**
 * A store with exactly `methods`, forwarding to a fresh backend. Synchronous:
 * the testkit drives each call to its end at once (promise-returning stores are
 * covered by the package's other tests).
 */
function shaped(methods) {
  return () => {
    const backend = new core.TestkitBackend();
    const store = {};
    for (const name of methods) store[name] = (...args) => backend.call(name, args);
    return { store, backend };
  };
}

const seed = Date.now();
const variants = {
  'the three spec methods only': [...SPEC],
  'single-key claims without leases': [...SPEC, ...CLAIMS],
  'single-key claims with renew and rememberFenced': [...SPEC, ...CLAIMS, 'renew', 'rememberFenced'],
  'batch methods and settle': [...SPEC, ...CLAIMS, ...BATCH, 'settle'],
  'batch methods with renew and rememberFenced': [...SPEC, ...CLAIMS, ...BATCH, 'renew', 'rememberFenced'],
};

for (const [name, methods] of Object.entries(variants)) {
  test(`the JS store adapter follows the record model: ${name}`, () => {
    core.runStoreTestkit(shaped(methods), 48, seed);
  });
}

test('a wrong answer from the JS store fails the testkit with its seed', () => {
  // A store that forgets claims' owners: every release frees the key.
  const make = () => {
    const { store, backend } = shaped([...SPEC, ...CLAIMS, 'renew', 'rememberFenced'])();
    store.release = (key) => backend.call("forget", [key]);
    return { store, backend };
  };
  assert.throws(() => core.runStoreTestkit(make, 200, seed), /store testkit \(BQ_TESTKIT_SEED=\d+\)/);
});

test("the store protocol a Rust store answers (the Workers package's DurableObjectStore and KvStore methods) refuses a key with a lone surrogate or no string: made U+FFFD it named another id, whose message was then skipped (a user's trial)", () => {
  const backend = new core.TestkitBackend();
  const calls = [
    ['remember', ['k-\ud83d']],
    ['seen', ['k-\ud83d']],
    ['forget', ['k-\udfff']],
    ['claim', ['k-\ud83d', 1000]],
    ['seenMany', [['ok', 'k-\ud83d']]],
    ['rememberMany', [['ok', 42]]],
    ['rememberFenced', ['ok', 't-\ud800', 1000]],
    ['settle', [{ remember: [{ key: 'k-\ud83d' }], release: [], renew: [] }]],
    ['settle', [{ remember: [{ key: 42 }], release: [], renew: [] }]],
  ];
  for (const [method, args] of calls) {
    assert.throws(() => backend.call(method, args), /(key|token) (has a lone surrogate|must be a string)/, method);
  }
  assert.equal(backend.call('seen', ['k-\ufffd']), false, 'nothing was remembered under U+FFFD');
  assert.equal(backend.call('seen', ['ok']), false, "nor the refused batch's other key");
});
