// The guard in the loop over the package's own guard (`runGuardFleet` in the
// test build pkg/conformance-node/, `scripts/build-js.sh test`): four consumers,
// each the guard `dedupe` builds over its own adapter to one promise-returning
// plain-object store, take deliveries from one inbox (30 ids, some delivered up
// to three times) at once on the event loop, with handlers that fail, outlive
// their lease or die after their effect and before the commit. Checked: nothing
// acked that never ran, and (claiming) every run beyond the first reported or
// after a death (`bq_dedupe_testkit::guard_fleet`).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const built = fileURLToPath(new URL('../pkg/conformance-node/bq_dedupe.cjs', import.meta.url));
assert.ok(existsSync(built), 'no test build: run scripts/build-js.sh test (make js-test does)');
const core = createRequire(import.meta.url)(built);

const turn = () => new Promise((resolve) => setImmediate(resolve));

/**
 * A store with exactly `methods` over a fresh backend whose clock follows real
 * time (the guard's clock is the JS one), answering after a turn of the event
 * loop, so the consumers' calls interleave.
 */
function store(methods) {
  const backend = new core.TestkitBackend();
  const start = Date.now() - 1;
  let synced = 0;
  const store = {};
  const stats = { calls: 0, inFlight: 0, mostInFlight: 0 };
  for (const name of methods) {
    store[name] = async (...args) => {
      stats.calls++;
      stats.mostInFlight = Math.max(stats.mostInFlight, ++stats.inFlight);
      try {
        await turn();
        const elapsed = Date.now() - start;
        backend.advance(elapsed - synced);
        synced = elapsed;
        return backend.call(name, args);
      } finally {
        stats.inFlight--;
      }
    };
  }
  return { store, stats };
}

const SPEC = ['seen', 'remember', 'forget'];
const CLAIMS = ['claim', 'release', 'renew', 'rememberFenced'];
const BATCH = ['seenMany', 'rememberMany', 'claimMany', 'settle'];

for (const [name, methods] of Object.entries({
  'single-key claims with leases': [...SPEC, ...CLAIMS],
  'batch methods and settle': [...SPEC, ...CLAIMS, ...BATCH],
})) {
  for (const renewing of [true, false]) {
    const how = renewing ? 'claims renewed while a handler runs' : 'slow handlers losing their claims';
    test(`claiming consumers on the JS store adapter lose nothing and report every second run: ${name}, ${how}`, async () => {
      const { store: s, stats } = store(methods);
      await core.runGuardFleet(s, `fleet-${Date.now()}`, 'claiming', 150, renewing);
      assert.ok(stats.calls > 60, `the fleet made ${stats.calls} store calls`);
      assert.ok(stats.mostInFlight > 1, 'the consumers\' calls overlapped');
    });
  }
}

test('seen-set consumers on the JS store adapter lose nothing', async () => {
  const { store: s } = store(SPEC);
  await core.runGuardFleet(s, `fleet-${Date.now()}`, 'seen-set', 150, true);
});

test('the guard in the loop fails a store whose fenced commit ignores a lost claim', async () => {
  // rememberFenced records the id whoever holds the claim and says it was
  // kept: a slow handler whose claim another consumer took reports a plain
  // run-ok, and the id runs twice unreported.
  const { store: s } = store([...SPEC, ...CLAIMS]);
  s.rememberFenced = async (key, _token, ttl) => {
    await s.remember(key, ttl);
    return true;
  };
  await assert.rejects(
    core.runGuardFleet(s, `fleet-${Date.now()}`, 'claiming', 150, false),
    /the guard in the loop: claiming: .* ran \d+ times/,
  );
});
