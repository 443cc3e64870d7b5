// Leases kept alive while slow handlers run (the guard's setTimeout timer and
// clock), fenced commits (run-ok-lease-lost), and what a JS store without the
// lease methods still gets. Real time: a 300 ms lease against 1 s handlers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bq, envelope, expiringStore, sleep } from './helpers.mjs';

const LEASE = { claimLeaseMs: 300 };
const IDS = ['order-1', 'order-2'];

/**
 * Consumer A runs a batch of IDS with a 1 s handler each; 500 ms in (the 300 ms
 * lease would have run out without renewals), consumer B gets the same batch on
 * the same store with the same handler. Returns both batches' kinds and the
 * number of effects per id.
 */
async function twoConsumers(store) {
  const effects = new Map();
  const slow = async (env) => {
    effects.set(env.meta.id, (effects.get(env.meta.id) ?? 0) + 1);
    await sleep(1000);
  };
  const batch = IDS.map((id) => envelope(id));
  const a = bq.dedupeBatch(batch, store, slow, LEASE);
  await sleep(500);
  const b = await bq.dedupeBatch(batch, store, slow, LEASE);
  const kinds = (outcomes) => outcomes.map((o) => o.kind);
  return { a: kinds(await a), b: kinds(b), effects: Object.fromEntries(effects) };
}

const once = Object.fromEntries(IDS.map((id) => [id, 1]));

test('a 1 s handler under a 300 ms lease keeps its claims: a concurrent dedupeBatch on the same ids parks, one effect per id (InMemoryStore)', async () => {
  const store = new bq.InMemoryStore();
  const { a, b, effects } = await twoConsumers(store);
  assert.deepEqual(a, ['run-ok', 'run-ok']);
  assert.deepEqual(b, ['park', 'park']);
  assert.deepEqual(effects, once);
  const again = await bq.dedupeBatch(IDS.map((id) => envelope(id)), store, () => assert.fail('ran again'), LEASE);
  assert.deepEqual(again.map((o) => o.kind), ['skip', 'skip']);
});

test('a JS store with settle(): claims renewed during a 1 s handler, the concurrent batch parks, one effect per id', async () => {
  const store = expiringStore('settle');
  const { a, b, effects } = await twoConsumers(store);
  assert.deepEqual(a, ['run-ok', 'run-ok']);
  assert.deepEqual(b, ['park', 'park']);
  assert.deepEqual(effects, once);
  assert.ok(store.calls.includes('settle'), 'renewed through settle');
  assert.ok(!store.calls.includes('renew') && !store.calls.includes('rememberFenced'));
});

test('a JS store with renew() + rememberFenced(): claims renewed during a 1 s handler, the concurrent batch parks, one effect per id', async () => {
  const store = expiringStore('fenced');
  const { a, b, effects } = await twoConsumers(store);
  assert.deepEqual(a, ['run-ok', 'run-ok']);
  assert.deepEqual(b, ['park', 'park']);
  assert.deepEqual(effects, once);
  assert.ok(store.calls.includes('renew'));
  assert.ok(store.calls.includes('rememberFenced'));
});

test('a JS store without lease methods: no renewal, so the concurrent batch runs the first id again (both reported run-ok-lease-lost); in each batch the id whose claim ran out before its handler parks', async () => {
  const store = expiringStore('none');
  const { a, b, effects } = await twoConsumers(store);
  // What the README documents for such a store: keep the lease above the batch's time.
  // A running handler finishes past its lease (the first id, twice): its
  // success, written after its claim ran out by the guard's clock, is
  // run-ok-lease-lost (it was run-ok, the double unreported: a review). An id
  // whose claim had run out when its turn came parks rather than run beside
  // the other batch (it ran, run-ok: a trial).
  assert.deepEqual(a, ['run-ok-lease-lost', 'park']);
  assert.deepEqual(b, ['run-ok-lease-lost', 'park']);
  assert.deepEqual(effects, { [IDS[0]]: 2 });
  assert.deepEqual(store.calls.sort(), ['claimMany', 'claimMany', 'rememberMany', 'rememberMany'], 'one claim and one commit call per batch, no renewals');
});

test('a fast batch on a lease-capable JS store still costs two store calls: claimMany and settle', async () => {
  const store = expiringStore('settle');
  const outcomes = await bq.dedupeBatch(['a', 'b', 'c'].map((id) => envelope(id)), store, () => {}, { claimLeaseMs: 30000, ttlMs: 60000 });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-ok', 'run-ok']);
  assert.deepEqual(store.calls, ['claimMany', 'settle']);
  assert.deepEqual([...store.done.entries()], [['a', 60000], ['b', 60000], ['c', 60000]]);
});

test('forgetting the id while its handler runs gives run-ok-lease-lost (ack), and the id is still remembered (InMemoryStore)', async () => {
  const store = new bq.InMemoryStore();
  const outcome = await bq.dedupe(envelope('lost-1'), store, async () => {
    await bq.forget('lost-1', store);
  }, { claimLeaseMs: 30000 });
  assert.equal(outcome.kind, 'run-ok-lease-lost');
  assert.equal(outcome.disposition, 'ack');
  assert.equal(outcome.ran, true);
  assert.equal(outcome.key, 'lost-1');
  assert.match(outcome.reason, /lost its claim before it was recorded/);
  assert.equal(store.seen('lost-1'), true, 'the effect happened: the free key is remembered');
});

test('a lease that expires and is taken by another consumer mid-handler: that one runs, this one reports run-ok-lease-lost (manual clock)', async () => {
  const store = new bq.InMemoryStore({ manualClock: true, now: 1_000_000 });
  const opts = { claimLeaseMs: 1000 };
  let effects = 0;
  let inner;
  const outer = await bq.dedupe(envelope('taken-1'), store, async () => {
    effects += 1;
    store.advance(5000); // this consumer stalls past its lease
    inner = await bq.dedupe(envelope('taken-1'), store, () => { effects += 1; }, opts);
  }, opts);
  assert.equal(inner.kind, 'run-ok');
  assert.equal(outer.kind, 'run-ok-lease-lost');
  assert.equal(outer.disposition, 'ack');
  assert.equal(effects, 2, 'the lost lease is the one case where an effect can happen twice, and it is reported');
});

test('a lease lost on a JS store with settle() or renew/rememberFenced is reported as run-ok-lease-lost', async () => {
  for (const leases of ['settle', 'fenced']) {
    const store = expiringStore(leases);
    const outcome = await bq.dedupe(envelope('lost-js'), store, async () => {
      store.claims.delete('lost-js'); // e.g. expired and swept
    }, LEASE);
    assert.equal(outcome.kind, 'run-ok-lease-lost', leases);
    assert.ok(store.done.has('lost-js'));
  }
});

test('a JS store without lease methods cannot fence its commit: a success written after the lease ran out by the guard\'s clock is run-ok-lease-lost', async () => {
  const store = expiringStore('none');
  const outcome = await bq.dedupe(envelope('lost-plain'), store, async () => {
    store.claims.delete('lost-plain');
    await sleep(400); // longer than the lease: nothing renews it
  }, LEASE);
  // A plain remember, written past the lease: another consumer may have run
  // the id meanwhile (it was run-ok: a review).
  assert.equal(outcome.kind, 'run-ok-lease-lost');
  // One delivery is a batch of one: a store's batch methods answer it.
  assert.deepEqual(store.calls, ['claimMany', 'rememberMany']);
});

test('with a manual clock the guard renews by the store\'s clock: advancing past the lease while the handler runs keeps the claim', async () => {
  const store = new bq.InMemoryStore({ manualClock: true, now: 0 });
  const opts = { claimLeaseMs: 1000 };
  let second;
  const first = await bq.dedupe(envelope('held-1'), store, async () => {
    for (let i = 0; i < 3; i += 1) {
      store.advance(400); // 1200 ms of store time in all: past the 1000 ms lease
      await sleep(400); // the guard's timer ticks every lease / 3 = 333 ms and renews
    }
    second = await bq.dedupe(envelope('held-1'), store, () => assert.fail('ran twice'), opts);
  }, opts);
  assert.equal(second.kind, 'park');
  assert.equal(first.kind, 'run-ok');
});

test('a handler that finishes before the timer leaves no timer behind (the process can exit at once)', async () => {
  const store = new bq.InMemoryStore();
  const before = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  const outcome = await bq.dedupe(envelope('quick-1'), store, async () => { await sleep(5); }, { claimLeaseMs: 30000 });
  assert.equal(outcome.kind, 'run-ok');
  const after = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  assert.equal(after, before);
});

test('a renewal that finds the running handler\'s claim gone is not sent again while it runs (a Node trial saw 11 in 1.2 s), and the run is run-ok-lease-lost', async () => {
  const store = expiringStore('fenced');
  const outcome = await bq.dedupe(envelope('gone-mid-run'), store, async () => {
    store.claims.clear(); // the claim ends while the handler runs (taken over, or forgotten)
    await sleep(1200); // the lease is 300 ms: renewals fall due every 100 ms
  }, LEASE);
  assert.equal(outcome.kind, 'run-ok-lease-lost');
  assert.equal(store.calls.filter((c) => c === 'renew').length, 1, store.calls.join(','));
});

test('renewals that fail (the store unreachable past a lease) do not end the running claim\'s renewals: once the store answers, it is renewed again and the run is recorded (a review)', async () => {
  const store = expiringStore('fenced');
  const renew = store.renew;
  const down = Date.now() + 600; // twice the lease
  let renewedAfter = 0;
  store.renew = (...args) => {
    if (Date.now() < down) return Promise.reject(Object.assign(new Error('down'), { kind: 'unavailable' }));
    renewedAfter += 1;
    return renew(...args);
  };
  const outcome = await bq.dedupe(envelope('store-down-mid-run'), store, async () => {
    await sleep(1200);
  }, LEASE);
  assert.ok(renewedAfter > 0, 'renewed again once the store answered');
  assert.equal(outcome.kind, 'run-ok');
});

test('a wall clock stepped back while a handler runs hides no lost lease: the guard counts the time passed (a trial)', async () => {
  // A store without renew: only the guard's clock tells a success written past its lease.
  const store = expiringStore('none');
  const realNow = Date.now;
  try {
    const outcome = await bq.dedupe(envelope('stepped-back'), store, async () => {
      await sleep(450);
      const stepped = realNow() - 60_000;
      Date.now = () => stepped; // NTP, an operator's `date`
    }, LEASE);
    assert.equal(outcome.kind, 'run-ok-lease-lost');
  } finally {
    Date.now = realNow;
  }
});
