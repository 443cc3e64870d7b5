// The testkit's history checker over the package's JS store adapter, in the test
// build pkg/conformance-node/ (`scripts/build-js.sh test`): several clients,
// each its own adapter over one promise-returning store, call it at once on the
// event loop; the store answers after a random number of turns and sometimes
// throws, before or after its backend (the core's in-memory store on a manual
// clock) took the call. Every key's history must be linearizable against the
// record model. A store with only the spec's methods makes the adapter fan a
// multi-key call out one key at a time, so a throw lands between its parts.
//
// Repeat a failing run: BQ_TESTKIT_SEED=<seed> BQ_HISTORY_RUNS=1 node --test
// tests/store-histories.test.mjs (in crates/js). BQ_HISTORY_RUNS and
// BQ_HISTORY_CLIENTS make the run longer (`make histories`).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const built = fileURLToPath(new URL('../pkg/conformance-node/bq_dedupe.cjs', import.meta.url));
assert.ok(existsSync(built), 'no test build: run scripts/build-js.sh test (make js-test does)');
const core = createRequire(import.meta.url)(built);

const env = (name) => (process.env[name] ? Number(process.env[name]) : undefined);
const fixedSeed = env('BQ_TESTKIT_SEED');
const RUNS = env('BQ_HISTORY_RUNS') ?? 12;
const CLIENTS = env('BQ_HISTORY_CLIENTS') ?? 4;

/** A small seeded generator (mulberry32), so a seed repeats the store's faults. */
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const turn = () => new Promise((resolve) => setImmediate(resolve));

/**
 * A store with exactly `methods`, each answering a promise after 0 to 3 turns
 * of the event loop on either side of the backend's call; one call in 12
 * throws before the backend took it, one in 12 after.
 */
function flaky(methods, seed) {
  return () => {
    const next = random(seed);
    const backend = new core.TestkitBackend();
    const store = {};
    const made = { store, backend, inFlight: 0, mostInFlight: 0 };
    for (const name of methods) {
      store[name] = async (...args) => {
        made.mostInFlight = Math.max(made.mostInFlight, ++made.inFlight);
        try {
          for (let n = Math.floor(next() * 4); n > 0; n--) await turn();
          const fault = next();
          if (fault < 1 / 12) throw new Error(`store down (before ${name}): injected by the test store`);
          const answer = backend.call(name, args);
          for (let n = Math.floor(next() * 4); n > 0; n--) await turn();
          if (fault > 11 / 12) throw new Error(`reply lost (after ${name}): injected by the test store`);
          return answer;
        } finally {
          made.inFlight--;
        }
      };
    }
    return made;
  };
}

const SPEC = ['seen', 'remember', 'forget'];
const CLAIMS = ['claim', 'release', 'renew', 'rememberFenced'];
const BATCH = ['seenMany', 'rememberMany', 'claimMany', 'settle'];
const variants = {
  'the three spec methods only': [...SPEC],
  'single-key claims with leases (multi-key calls fanned out)': [...SPEC, ...CLAIMS],
  'batch methods and settle': [...SPEC, ...CLAIMS, ...BATCH],
};

const base = fixedSeed ?? Date.now() % 2 ** 31;
for (const [name, methods] of Object.entries(variants)) {
  test(`the JS store adapter's histories are linearizable, ${CLIENTS} clients at once: ${name}`, async () => {
    for (let run = 0; run < RUNS; run++) {
      const seed = fixedSeed ?? (base + run * 7919) % 2 ** 31;
      const make = flaky(methods, seed);
      let made;
      try {
        await core.runStoreHistory(() => (made = make()), CLIENTS, seed);
        // The clients' calls did overlap: the run tested concurrency.
        if (CLIENTS > 1) assert.ok(made.mostInFlight > 1, `seed ${seed}: no two calls at once`);
      } catch (e) {
        e.message += `\nrepeat it (in crates/js): BQ_TESTKIT_SEED=${seed} BQ_HISTORY_RUNS=1 ` +
          `BQ_HISTORY_CLIENTS=${CLIENTS} node --test tests/store-histories.test.mjs`;
        throw e;
      }
    }
  });
}

test('the history checker over the JS adapter fails a store that breaks a rule, with its seed', async () => {
  // A store whose release frees the key whoever holds it: a claim taken by one
  // client and released by another's stale token is then claimable twice.
  const make = (seed) => () => {
    const made = flaky([...SPEC, ...CLAIMS], seed)();
    made.store.release = async (key) => made.backend.call('forget', [key]);
    return made;
  };
  let failed;
  for (let run = 0; run < 40 && !failed; run++) {
    const seed = base + run;
    await core.runStoreHistory(make(seed), CLIENTS, seed).catch((e) => (failed = e));
  }
  assert.ok(failed, 'no run of a store that frees claims on any release failed the checker');
  assert.match(failed.message, /history checker \(BQ_TESTKIT_SEED=\d+, \d+ clients\): key .*not linearizable/s);
});

test('an error of the adapter itself fails the history checker (only the store\'s injected throws are unknown)', async () => {
  // claimMany answers a non-array: the adapter's own error, on every call.
  const make = (seed) => () => {
    const made = flaky([...SPEC, ...CLAIMS, ...BATCH], seed)();
    made.store.claimMany = async () => 'acquired';
    return made;
  };
  let failed;
  for (let run = 0; run < 10 && !failed; run++) {
    await core.runStoreHistory(make(base + run), CLIENTS, base + run).catch((e) => (failed = e));
  }
  assert.ok(failed, 'a store whose claimMany never answers an array passed the checker');
  assert.match(failed.message, /the store failed, with no fault injected/);
});
