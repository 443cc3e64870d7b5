// `wrap(store, handler)`, the shape of the Node SDK's `Wrap` (@babelqueue/core):
// the behaviours its own idempotency tests pin, written here from that list,
// over the SDK's kind of store (a plain `{ seen, remember, forget }` keyed by
// meta.id, sync or async) and over the package's InMemoryStore.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bq, envelope } from './helpers.mjs';

/** A store as the Node SDK's InMemoryStore is: a Set of ids; `async` answers with promises. */
function sdkStore({ async = false } = {}) {
  const entries = new Set();
  const answer = (v) => (async ? Promise.resolve(v) : v);
  return {
    entries,
    seen: (id) => answer(entries.has(id)),
    remember: (id) => answer(void entries.add(id)),
    forget: (id) => answer(void entries.delete(id)),
  };
}

for (const async of [false, true]) {
  const kind = async ? 'an async' : 'a sync';

  test(`${kind} SDK store: the first delivery runs and is remembered under its meta.id`, async () => {
    const store = sdkStore({ async });
    let calls = 0;
    const handler = bq.wrap(store, () => { calls += 1; });
    assert.equal(await handler(envelope('m1')), undefined);
    assert.equal(calls, 1);
    assert.ok(store.entries.has('m1'), [...store.entries].join());
  });

  test(`${kind} SDK store: a redelivery of the same id is skipped; another id runs`, async () => {
    const store = sdkStore({ async });
    let calls = 0;
    const handler = bq.wrap(store, () => { calls += 1; });
    await handler(envelope('m1'));
    await handler(envelope('m1'));
    assert.equal(calls, 1);
    await handler(envelope('m2'));
    assert.equal(calls, 2);
  });

  test(`${kind} SDK store: a throwing handler rejects with its error, the id stays unmarked, a redelivery runs again`, async () => {
    const store = sdkStore({ async });
    let calls = 0;
    const boom = new Error('boom');
    const handler = bq.wrap(store, () => { calls += 1; throw boom; });
    await assert.rejects(handler(envelope('m1')), (e) => e === boom);
    assert.equal(store.entries.has('m1'), false);
    await assert.rejects(handler(envelope('m1')), /boom/);
    assert.equal(calls, 2);
  });
}

test('a message without a usable id runs every time and is never remembered', async () => {
  const store = sdkStore();
  let calls = 0;
  const handler = bq.wrap(store, () => { calls += 1; });
  await handler(envelope(''));
  await handler(envelope(''));
  await handler(envelope(undefined));
  assert.equal(calls, 3);
  assert.equal(store.entries.size, 0);
});

test('a rejecting async handler rejects the wrapped call the same way', async () => {
  const handler = bq.wrap(sdkStore(), async () => { throw new TypeError('nope'); });
  await assert.rejects(handler(envelope('a1')), TypeError);
});

test('the handler gets the decoded envelope; objects, text and bytes are taken', async () => {
  const seen = [];
  const handler = bq.wrap(new bq.InMemoryStore(), (e) => { seen.push(e.meta.id); });
  await handler(envelope('o1'));
  await handler(JSON.stringify(envelope('t1')));
  await handler(new TextEncoder().encode(JSON.stringify(envelope('b1'))));
  await handler(envelope('o1'));
  assert.deepEqual(seen, ['o1', 't1', 'b1']);
});

test('an invalid envelope rejects with a RejectionError and runs nothing', async () => {
  let calls = 0;
  const handler = bq.wrap(sdkStore(), () => { calls += 1; });
  await assert.rejects(handler({ meta: { id: 'x', schema_version: 1 } }), (e) => e.name === 'RejectionError' && e.code === 'missing-job');
  assert.equal(calls, 0);
});

test('a store that cannot answer rejects with a DedupeError and runs nothing', async () => {
  let calls = 0;
  const down = { seen: () => { throw new Error('redis down'); }, remember() {}, forget() {} };
  const handler = bq.wrap(down, () => { calls += 1; });
  await assert.rejects(handler(envelope('d1')), (e) => e.name === 'DedupeError' && e.kind === 'store-unavailable' && /redis down/.test(e.message));
  assert.equal(calls, 0);
});

/** Runs `f` with console.warn collected. */
async function warned(f) {
  const said = [];
  const warn = console.warn;
  console.warn = (text) => { said.push(String(text)); };
  try {
    await f();
  } finally {
    console.warn = warn;
  }
  return said;
}

test('a success the store could not record resolves (acked: a retry would run the effect again), and says so', async () => {
  let calls = 0;
  const flaky = { seen: () => false, remember: () => { throw new Error('write failed'); }, forget() {} };
  const handler = bq.wrap(flaky, () => { calls += 1; });
  const said = await warned(async () => assert.equal(await handler(envelope('u1')), undefined));
  assert.equal(calls, 1);
  assert.equal(said.length, 1, `${said}`);
  assert.match(said[0], /run-ok-unrecorded u1: /);
});

// A run whose claim was taken over while it ran resolved as a plain success:
// two runs, both silent (a review's finding). It resolves (it did run) and
// says so, as `dedupe` reports run-ok-lease-lost.
test('a run whose claim was lost before its success was recorded resolves and says so on console.warn', async () => {
  const store = new bq.InMemoryStore({ manualClock: true, now: 1_000_000 });
  let effects = 0;
  const options = { claimLeaseMs: 1000 };
  const second = bq.wrap(store, () => { effects++; }, options);
  const first = bq.wrap(store, async () => {
    effects++;
    store.advance(5000); // stalls past its lease; the redelivery is taken meanwhile
    await second(envelope('order-7'));
  }, options);
  const said = await warned(() => first(envelope('order-7')));
  assert.equal(effects, 2);
  assert.equal(said.length, 1, `${said}`);
  assert.match(said[0], /run-ok-lease-lost order-7: .*lost its claim before it was recorded/);
});

// A number id (the Node SDK keys it as it is) ran on every redelivery here,
// the wrapped handler silent (a trial): said once on console.warn.
test('a delivery without a usable id runs undeduped and says so once on console.warn', async () => {
  let calls = 0;
  const handler = bq.wrap(new bq.InMemoryStore(), () => { calls += 1; });
  const numbered = { ...envelope('n'), meta: { id: 42, schema_version: 1 } };
  const said = await warned(async () => {
    await handler(numbered);
    await handler(numbered);
  });
  assert.equal(calls, 2, 'no usable id: it runs every time');
  assert.equal(said.length, 1, `${said}`);
  assert.match(said[0], /fail-open: no usable meta\.id .*runs again on each redelivery/);
});

test('bad arguments are a TypeError when wrapping, not at the first delivery', () => {
  assert.throws(() => bq.wrap({}, () => {}), TypeError);
  assert.throws(() => bq.wrap(sdkStore(), 'not a function'), TypeError);
  assert.throws(() => bq.wrap(sdkStore(), () => {}, { nope: 1 }), TypeError);
});

test('forget makes a remembered id run again', async () => {
  const store = new bq.InMemoryStore();
  let calls = 0;
  const handler = bq.wrap(store, () => { calls += 1; });
  await handler(envelope('f1'));
  await bq.forget('f1', store);
  await handler(envelope('f1'));
  assert.equal(calls, 2);
});
