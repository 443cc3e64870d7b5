// dedupe / dedupeBatch / forget / dedupeKey / validate / InMemoryStore from
// Node: sync and async stores and handlers, thrown errors, malformed input,
// claiming, batches, TTLs. Outcome codes are the core's (src/outcome.rs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { bq, envelope, expiringStore, mapStore } from './helpers.mjs';

const ok = () => {};

test('a redelivery is skipped: run-ok then skip, the handler runs once (Rust InMemoryStore)', async () => {
  const store = new bq.InMemoryStore();
  let runs = 0;
  const first = await bq.dedupe(envelope('id-1'), store, () => { runs += 1; });
  const second = await bq.dedupe(envelope('id-1'), store, () => { runs += 1; });
  assert.deepEqual(first, { kind: 'run-ok', disposition: 'ack', ran: true, key: 'id-1' });
  assert.deepEqual(second, { kind: 'skip', disposition: 'ack', ran: false, key: 'id-1' });
  assert.equal(runs, 1);
  assert.equal(store.size, 1);
});

test('the handler receives the decoded envelope as a plain object, job filled in from the urn alias', async () => {
  const store = new bq.InMemoryStore();
  let got;
  const env = envelope('id-2', { custom: [1, 2] });
  delete env.job;
  env.urn = 'urn:babel:x';
  await bq.dedupe(JSON.stringify(env), store, (e) => { got = e; });
  assert.equal(got.job, 'urn:babel:x');
  assert.deepEqual(got.custom, [1, 2]);
  assert.equal(got.meta.id, 'id-2');
  assert.equal(Object.getPrototypeOf(got), Object.prototype);
});

test('envelopes are accepted as an object, JSON text or UTF-8 bytes, all with the same key', async () => {
  const store = new bq.InMemoryStore();
  const text = JSON.stringify(envelope('same'));
  assert.equal((await bq.dedupe(envelope('same'), store, ok)).kind, 'run-ok');
  assert.equal((await bq.dedupe(text, store, ok)).kind, 'skip');
  assert.equal((await bq.dedupe(new TextEncoder().encode(text), store, ok)).kind, 'skip');
});

// A NaN lease held its key for ever; a negative one or a string was taken
// as 0 (a trial): a TypeError now, as the options are.
test('the InMemoryStore\'s own claim and remember take milliseconds above 0, else a TypeError', () => {
  const store = new bq.InMemoryStore({ manualClock: true, now: 1000 });
  for (const bad of [NaN, -1, 0, 'soon']) {
    assert.throws(() => store.claim('k', bad), TypeError, String(bad));
    assert.throws(() => store.remember('k', bad), TypeError, String(bad));
  }
  assert.deepEqual(store.entries(), [], 'nothing was taken');
  assert.equal(store.claim('k', 1000).state, 'acquired');
  store.advance(1000);
  assert.equal(store.claim('k', 0.5).state, 'acquired', 'the lease ran out');
  store.remember('done', Infinity);
  assert.equal(store.seen('done'), true);
});

test('a synchronous JS store works and sees the verbatim id as its key', async () => {
  const store = mapStore('sync');
  assert.equal((await bq.dedupe(envelope(' A '), store, ok)).kind, 'run-ok');
  assert.equal((await bq.dedupe(envelope(' A '), store, ok)).kind, 'skip');
  assert.equal((await bq.dedupe(envelope(' a '), store, ok)).kind, 'run-ok');
  assert.deepEqual([...store.done.keys()], [' A ', ' a ']);
  assert.deepEqual(store.calls, ['seen', 'remember', 'seen', 'seen', 'remember']);
});

test('an async store and an async handler are awaited in order', async () => {
  const store = mapStore('async');
  const order = [];
  const handler = async () => {
    order.push('handler-start');
    await new Promise((r) => setTimeout(r, 5));
    order.push('handler-end');
  };
  const outcome = await bq.dedupe(envelope('async-1'), store, handler, { ttlMs: 1500 });
  assert.equal(outcome.kind, 'run-ok');
  assert.deepEqual(order, ['handler-start', 'handler-end']);
  assert.equal(store.done.get('async-1'), 1500, 'remember got the TTL in ms');
  assert.equal((await bq.dedupe(envelope('async-1'), store, handler)).kind, 'skip');
});

test('a handler that throws gives run-failed (retry), the error unchanged, and the id stays unmarked', async () => {
  const store = new bq.InMemoryStore();
  const boom = new Error('payment gateway timeout');
  const failed = await bq.dedupe(envelope('id-3'), store, () => { throw boom; });
  assert.equal(failed.kind, 'run-failed');
  assert.equal(failed.disposition, 'retry');
  assert.equal(failed.ran, true);
  assert.equal(failed.error, boom);
  assert.equal(failed.reason, 'payment gateway timeout');
  assert.equal(store.seen('id-3'), false);
  assert.equal((await bq.dedupe(envelope('id-3'), store, ok)).kind, 'run-ok');
});

test('an async handler that rejects (even with a non-Error) gives run-failed', async () => {
  const store = mapStore('async');
  const outcome = await bq.dedupe(envelope('id-4'), store, async () => Promise.reject({ why: 'nope' }));
  assert.equal(outcome.kind, 'run-failed');
  assert.deepEqual(outcome.error, { why: 'nope' });
  assert.equal(outcome.reason, '{"why":"nope"}');
  assert.equal(store.done.size, 0);
});

test('no usable meta.id fails open: absent, null, empty and non-string ids all run every time', async () => {
  const store = mapStore('sync');
  for (const id of [undefined, null, '', 42, true, { a: 1 }]) {
    for (let i = 0; i < 2; i += 1) {
      const outcome = await bq.dedupe(envelope(id), store, ok);
      const reason = 'no usable meta.id (absent, null, empty or not a string): ran without dedupe';
      assert.deepEqual(outcome, { kind: 'fail-open', disposition: 'ack', ran: true, key: null, reason }, `id ${JSON.stringify(id)}`);
    }
  }
  const failed = await bq.dedupe(envelope(''), store, () => { throw new Error('x'); });
  assert.equal(failed.kind, 'fail-open-failed');
  assert.equal(failed.disposition, 'retry');
  assert.deepEqual(store.calls, [], 'fail-open never touches the store');
});

test('a store whose seen() throws gives store-unavailable (retry) and the handler does not run', async () => {
  let runs = 0;
  const store = { seen() { throw new Error('redis down'); }, remember: ok, forget: ok };
  const outcome = await bq.dedupe(envelope('id-5'), store, () => { runs += 1; });
  assert.equal(outcome.kind, 'store-unavailable');
  assert.equal(outcome.disposition, 'retry');
  assert.deepEqual(outcome.storeError, { code: 'unavailable', message: 'seen: redis down' });
  assert.equal(runs, 0);
});

test('a store whose seen() rejects with a typed error keeps its kind', async () => {
  const store = { seen: async () => { throw Object.assign(new Error('bad key'), { kind: 'invalid' }); }, remember: ok, forget: ok };
  const outcome = await bq.dedupe(envelope('id-6'), store, ok);
  assert.equal(outcome.kind, 'store-unavailable');
  assert.equal(outcome.storeError.code, 'invalid');
});

test('a store whose remember() fails after a successful run gives run-ok-unrecorded, still acked', async () => {
  const store = { seen: () => false, remember: async () => { throw new Error('disk full'); }, forget: ok };
  const outcome = await bq.dedupe(envelope('id-7'), store, ok);
  assert.equal(outcome.kind, 'run-ok-unrecorded');
  assert.equal(outcome.disposition, 'ack');
  assert.match(outcome.storeError.message, /disk full/);
});

test('forget() lets an id run again, namespaced like the keys; a failing forget rejects', async () => {
  const store = new bq.InMemoryStore();
  const options = { keyPrefix: 'app:', scope: 'billing' };
  assert.equal((await bq.dedupe(envelope('id-8'), store, ok, options)).key, 'app:billing:id-8');
  assert.equal((await bq.dedupe(envelope('id-8'), store, ok, options)).kind, 'skip');
  await bq.forget('id-8', store, options);
  assert.equal((await bq.dedupe(envelope('id-8'), store, ok, options)).kind, 'run-ok');
  const broken = { seen: ok, remember: ok, forget: () => { throw new Error('nope'); } };
  await assert.rejects(bq.forget('x', broken), /forget: nope/);
});

test('malformed input is rejected (poison) with the core rejection code, never a trap', async () => {
  const store = mapStore('sync');
  let runs = 0;
  const handler = () => { runs += 1; };
  const cases = [
    ['{"job":', 'not-json'],
    [new Uint8Array([0x7b, 0xff, 0x7d]), 'not-json'],
    ['[1,2]', 'not-an-object'],
    [42, 'not-an-object'],
    [undefined, 'not-json'],
    [{ big: 1n }, 'not-json'],
    [JSON.stringify({ ...envelope('x'), job: '  ' }), 'missing-job'],
    [JSON.stringify({ ...envelope('x'), meta: 'm' }), 'meta-not-object'],
    [JSON.stringify({ ...envelope('x'), meta: { id: 'x', schema_version: 2 } }), 'unsupported-schema-version'],
    [JSON.stringify({ ...envelope('x'), data: [] }), 'data-not-object'],
    [JSON.stringify({ ...envelope('x'), trace_id: '' }), 'blank-trace-id'],
    [JSON.stringify({ ...envelope('x'), attempts: -1 }), 'bad-attempts'],
    ['['.repeat(10_000) + ']'.repeat(10_000), 'too-deep'],
    [JSON.stringify(envelope('x', { pad: 'x'.repeat(2_000_000) })), 'too-large'],
  ];
  for (const [input, code] of cases) {
    const outcome = await bq.dedupe(input, store, handler);
    assert.equal(outcome.kind, 'rejected', code);
    assert.equal(outcome.disposition, 'poison', code);
    assert.equal(outcome.rejection.code, code);
    assert.equal(typeof outcome.rejection.message, 'string');
    assert.equal(outcome.key, null);
  }
  assert.equal(runs, 0);
  assert.deepEqual(store.calls, []);
  const small = await bq.dedupe(envelope('x'), store, handler, { maxBytes: 20 });
  assert.equal(small.rejection.code, 'too-large');
});

test("an outcome's key keeps a leading U+FEFF of the id (it named another id: a review's finding)", async () => {
  const id = '\uFEFForder-7';
  const store = new bq.InMemoryStore();
  const outcome = await bq.dedupe(envelope(id), store, ok);
  assert.equal(outcome.key, id);
  const [batched] = await bq.dedupeBatch([envelope(id)], new bq.InMemoryStore(), ok);
  assert.equal(batched.key, id);
  store.forget(outcome.key);
  assert.equal(store.seen(id), false, 'forgetting the key forgets this id');
});

test('bad arguments reject with a TypeError that says what is wrong', async () => {
  const store = new bq.InMemoryStore();
  await assert.rejects(bq.dedupe(envelope('a'), store, 'not a function'), { name: 'TypeError', message: 'handler must be a function' });
  await assert.rejects(bq.dedupe(envelope('a'), null, ok), TypeError);
  await assert.rejects(bq.dedupe(envelope('a'), { seen: ok, remember: ok }, ok), /store\.forget is not a function/);
  await assert.rejects(bq.dedupe(envelope('a'), store, ok, { ttl: 5 }), /unknown option "ttl"/);
  await assert.rejects(bq.dedupe(envelope('a'), store, ok, { ttlMs: -1 }), /ttlMs must be a finite non-negative number/);
  // NaN and Infinity are numbers: the message says what else it must be (a trial).
  for (const ttlMs of [NaN, Infinity]) {
    await assert.rejects(bq.dedupe(envelope('a'), store, ok, { ttlMs }), /ttlMs must be a finite non-negative number/);
  }
  await assert.rejects(bq.dedupe(envelope('a'), store, ok, { scope: 'a:b' }), /invalid key scope/);
  await assert.rejects(bq.dedupeBatch('nope', store, ok), /envelopes must be an array/);
  // A batch over 10,000 envelopes: a RangeError before anything is copied or
  // run (a million took 844 MB of wasm memory, never given back).
  let ran = 0;
  const huge = new Array(10_001).fill(envelope('huge'));
  await assert.rejects(bq.dedupeBatch(huge, store, () => { ran++; }), {
    name: 'RangeError',
    message: /at most 10000 envelopes, got 10001/,
  });
  assert.equal(ran, 0);
  assert.equal((await bq.dedupeBatch(huge.slice(1), store, () => { ran++; })).length, 10_000);
  assert.throws(() => new bq.InMemoryStore({ manual: true }), /unknown option "manual"/);
  // A start without a manual clock was ignored, unsaid (a user's trial).
  assert.throws(() => new bq.InMemoryStore({ now: 5 }), /add manualClock: true/);
  assert.throws(() => new bq.InMemoryStore({ capacity: 0 }), { name: 'TypeError', message: /capacity must be at least 1/ });
  const freed = new bq.InMemoryStore();
  // A copy of its handle is not the store: it has not the module's mark.
  const handle = { __bqHandle: freed.__bqHandle };
  freed.free();
  await assert.rejects(bq.dedupe(envelope('a'), handle, ok), /store\.seen is not a function/);
  await assert.rejects(bq.dedupe(envelope('a'), freed, ok), /freed/, 'the freed object itself');
});

test('dedupeKey returns the namespaced key, null for fail-open, and throws a RejectionError when invalid', () => {
  assert.equal(bq.dedupeKey(envelope('f1e2')), 'f1e2');
  assert.equal(bq.dedupeKey(JSON.stringify(envelope('\u00e9'))), '\u00e9');
  assert.equal(bq.dedupeKey('{"job":"j","trace_id":"t","data":{},"meta":{"id":"\\u0069d-1","schema_version":1}}'), 'id-1');
  assert.equal(bq.dedupeKey(envelope('x'), { keyPrefix: 'bq:idem:' }), 'bq:idem:x');
  assert.equal(bq.dedupeKey(envelope(undefined)), null);
  assert.throws(() => bq.dedupeKey('{}'), (e) => e.name === 'RejectionError' && e.code === 'missing-job' && e.rejection.code === 'missing-job');
});

test('validate reports id, key, fail-open and the rejection reason', () => {
  assert.deepEqual(bq.validate(envelope('v-1', { attempts: 3 }), { keyPrefix: 'p:' }), {
    valid: true, failOpen: false, id: 'v-1', key: 'p:v-1', job: 'urn:babel:orders:created', traceId: 't-1', attempts: 3,
  });
  assert.equal(bq.validate(envelope(null)).failOpen, true);
  assert.deepEqual(bq.validate('{"job":"j"}').rejection.code, 'meta-not-object');
  assert.equal(bq.validate('').valid, false);
});

test('dedupeBatch: one seenMany and one rememberMany for the batch, in-batch duplicates run once', async () => {
  const store = mapStore('async', { batch: true });
  const runs = [];
  const outcomes = await bq.dedupeBatch(
    [envelope('a'), envelope('b'), envelope('a'), envelope(undefined), '{', envelope('c')],
    store,
    async (e) => { runs.push(e.meta.id ?? null); },
  );
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-ok', 'skip', 'fail-open', 'rejected', 'run-ok']);
  assert.deepEqual(outcomes.map((o) => o.key), ['a', 'b', 'a', null, null, 'c']);
  assert.deepEqual(runs, ['a', 'b', null, 'c']);
  assert.deepEqual(store.calls, ['seenMany', 'rememberMany']);
  const again = await bq.dedupeBatch([envelope('a'), envelope('d')], store, ok);
  assert.deepEqual(again.map((o) => o.kind), ['skip', 'run-ok']);
});

test('dedupeBatch: a failed delivery parks its in-batch duplicate and a store without batch methods is called per key', async () => {
  const store = mapStore('sync');
  const outcomes = await bq.dedupeBatch([envelope('x'), envelope('x'), envelope('y')], store, (e) => {
    if (e.meta.id === 'x') throw new Error('fail x');
  });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-failed', 'park', 'run-ok']);
  assert.deepEqual(store.calls, ['seen', 'seen', 'remember']);
});

test('claiming with a JS store: concurrent deliveries of one id run the handler once, the other parks', async () => {
  const store = mapStore('async', { claims: true });
  let runs = 0;
  let release;
  const gate = new Promise((r) => { release = r; });
  const handler = async () => { runs += 1; await gate; };
  const first = bq.dedupe(envelope('c-1'), store, handler, { claimLeaseMs: 30_000 });
  await new Promise((r) => setTimeout(r, 20));
  const second = await bq.dedupe(envelope('c-1'), store, handler, { claimLeaseMs: 30_000 });
  assert.equal(second.kind, 'park');
  assert.equal(second.disposition, 'retry');
  release();
  assert.equal((await first).kind, 'run-ok');
  assert.equal(runs, 1);
  assert.equal((await bq.dedupe(envelope('c-1'), store, handler, { claimLeaseMs: 30_000 })).kind, 'skip');
  assert.ok(store.calls.includes('claim'));
});

test('claiming with a JS store: a throwing handler releases its claim so the redelivery runs', async () => {
  const store = mapStore('sync', { claims: true });
  const failed = await bq.dedupe(envelope('c-2'), store, () => { throw new Error('x'); }, { claimLeaseMs: 1000 });
  assert.equal(failed.kind, 'run-failed');
  assert.equal(store.claims.size, 0);
  assert.deepEqual(store.calls, ['claim', 'release']);
  assert.equal((await bq.dedupe(envelope('c-2'), store, ok, { claimLeaseMs: 1000 })).kind, 'run-ok');
});

test('claiming with a batch JS store uses one claimMany, a release for the failed run and one rememberMany', async () => {
  const store = mapStore('async', { claims: true, batch: true });
  const outcomes = await bq.dedupeBatch([envelope('p'), envelope('q')], store, (e) => {
    if (e.meta.id === 'q') throw new Error('q fails');
  }, { claimLeaseMs: 1000 });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-failed']);
  assert.deepEqual(store.calls, ['claimMany', 'release', 'rememberMany']);
  assert.deepEqual([...store.done.keys()], ['p']);
  assert.equal(store.claims.size, 0);
});

// A setup mistake, refused before anything runs: it was store-unavailable on
// every delivery, each one retried (a trial's finding).
test('claiming on a store without claim/release is a TypeError, and nothing runs', async () => {
  let ran = 0;
  const run = () => { ran++; };
  for (const call of [
    () => bq.dedupe(envelope('c-3'), mapStore('sync'), run, { claimLeaseMs: 1000 }),
    () => bq.dedupeBatch([envelope('c-3')], mapStore('sync'), run, { claimLeaseMs: 1000 }),
  ]) {
    await assert.rejects(call(), { name: 'TypeError', message: /claimLeaseMs needs store\.claim and store\.release/ });
  }
  assert.equal(ran, 0);
});

test('InMemoryStore with a manual clock: TTLs and claim leases expire when the clock advances', async () => {
  const store = new bq.InMemoryStore({ manualClock: true, now: 1_000_000 });
  assert.equal(store.now, 1_000_000);
  await bq.dedupe(envelope('t-1'), store, ok, { ttlMs: 10_000 });
  await bq.dedupe(envelope('t-2'), store, ok);
  assert.deepEqual(store.entries(), [
    { key: 't-1', state: 'done', expiresAt: 1_010_000 },
    { key: 't-2', state: 'done', expiresAt: null },
  ]);
  store.advance(9_999);
  assert.equal((await bq.dedupe(envelope('t-1'), store, ok)).kind, 'skip');
  store.advance(1);
  assert.equal((await bq.dedupe(envelope('t-1'), store, ok, { ttlMs: 10_000 })).kind, 'run-ok');

  const claim = store.claim('c', 5_000);
  assert.equal(claim.state, 'acquired');
  assert.deepEqual(store.claim('c', 5_000), { state: 'held' });
  assert.deepEqual(store.entries().at(-1), { key: 'c', state: 'claimed', expiresAt: null });
  assert.equal((await bq.dedupe(envelope('c'), store, ok, { claimLeaseMs: 5_000 })).kind, 'park');
  store.advance(5_000);
  assert.equal((await bq.dedupe(envelope('c'), store, ok, { claimLeaseMs: 5_000 })).kind, 'run-ok');
  assert.throws(() => new bq.InMemoryStore().advance(1), /manual clock/);
});

test('InMemoryStore can be used directly as a sync JS store too', () => {
  const store = new bq.InMemoryStore({ capacity: 2 });
  store.remember('a');
  store.remember('b');
  store.remember('c');
  assert.equal(store.seen('a'), false, 'the oldest was evicted');
  assert.equal(store.seen('c'), true);
  store.forget('c');
  assert.equal(store.size, 1);
});

test('a handler or store that throws undefined (or rejects with nothing) still settles with a typed outcome', async () => {
  const store = mapStore('sync');
  const thrown = await bq.dedupe(envelope('u-1'), store, () => { throw undefined; });
  assert.equal(thrown.kind, 'run-failed');
  const rejected = await bq.dedupe(envelope('u-2'), store, async () => { await Promise.reject(); });
  assert.equal(rejected.kind, 'run-failed');
  const badStore = { seen: () => Promise.reject(), remember: ok, forget: ok };
  const unavailable = await bq.dedupe(envelope('u-3'), badStore, ok);
  assert.equal(unavailable.kind, 'store-unavailable');
  // And the module still works afterwards.
  assert.equal((await bq.dedupe(envelope('u-4'), store, ok)).kind, 'run-ok');
});

test('claiming per key: a claim that fails gives back the claims the batch already took', async () => {
  const store = mapStore('sync', { claims: true });
  const claim = store.claim;
  store.claim = (k, lease) => { if (k === 'cb-bad') throw new Error('claim down'); return claim(k, lease); };
  const outcomes = await bq.dedupeBatch([envelope('cb-1'), envelope('cb-2'), envelope('cb-bad')], store, ok,
    { claimLeaseMs: 60_000 });
  assert.deepEqual(outcomes.map((o) => o.kind), ['store-unavailable', 'store-unavailable', 'store-unavailable']);
  assert.equal(store.claims.size, 0, `claims left: ${[...store.claims.keys()]}`);
});

test('claiming per key: a failed remember still releases the claim of a failed run', async () => {
  const store = mapStore('sync', { claims: true });
  store.remember = () => { throw new Error('remember down'); };
  const outcomes = await bq.dedupeBatch([envelope('cr-ok'), envelope('cr-fail')], store,
    (e) => { if (e.meta.id === 'cr-fail') throw new Error('no'); }, { claimLeaseMs: 60_000 });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok-unrecorded', 'run-failed']);
  assert.ok(!store.claims.has('cr-fail'), 'the failed run can be redelivered at once');
});

test('a claim token that is not a string is refused (it could not be released unchanged)', async () => {
  const store = mapStore('sync', { claims: true });
  store.claim = () => ({ state: 'acquired', token: 1 });
  const outcome = await bq.dedupe(envelope('nt-1'), store, ok, { claimLeaseMs: 1000 });
  assert.equal(outcome.kind, 'store-unavailable');
  assert.match(outcome.reason, /string token/);
});

test("another module copy's InMemoryStore is used through its methods, never as one of ours", async () => {
  const ours = new bq.InMemoryStore();
  // A store from another instance: same shape, a handle from a different instance.
  const foreign = new bq.InMemoryStore();
  const imposter = {
    __bqHandle: foreign.__bqHandle + 2 ** 21 * (foreign.__bqHandle >= 2 ** 50 ? -1 : 1),
    seen: (k) => foreign.seen(k), remember: (k, t) => foreign.remember(k, t), forget: (k) => foreign.forget(k),
  };
  assert.equal((await bq.dedupe(envelope('f-1'), imposter, ok)).kind, 'run-ok');
  assert.equal(foreign.seen('f-1'), true);
  assert.equal(ours.seen('f-1'), false);
});

test('process and processBatch: deprecated aliases of dedupe and dedupeBatch (marked @deprecated in the .d.ts)', async () => {
  const store = new bq.InMemoryStore();
  let runs = 0;
  const ok = () => { runs += 1; };
  assert.equal((await bq.process(envelope('alias-1'), store, ok)).kind, 'run-ok');
  assert.equal((await bq.dedupe(envelope('alias-1'), store, ok)).kind, 'skip');
  const batch = await bq.processBatch([envelope('alias-1'), envelope('alias-2')], store, ok);
  assert.deepEqual(batch.map((o) => o.kind), ['skip', 'run-ok']);
  assert.equal(runs, 2);
  for (const file of ['../pkg/web/bq_dedupe.d.ts', '../pkg/node/bq_dedupe.d.cts']) {
    const dts = readFileSync(new URL(file, import.meta.url), 'utf8');
    for (const [old, now] of [['process', 'dedupe'], ['processBatch', 'dedupeBatch']]) {
      assert.match(dts, new RegExp(`@deprecated Use \`${now}\`[^/]*\\*/\\nexport function ${old}\\(`), `${file}: ${old}`);
    }
  }
});

test("a store's yes or no is a boolean or 0/1: anything else is a store error, never read as truthy", async () => {
  let runs = 0;
  const run = () => { runs += 1; };
  const store = (seen) => ({ seen: () => seen, remember: ok, forget: ok });
  for (const [answer, kind] of [[false, 'run-ok'], [0, 'run-ok'], [true, 'skip'], [1, 'skip']]) {
    assert.equal((await bq.dedupe(envelope('yn'), store(answer), run)).kind, kind, `${answer}`);
  }
  runs = 0;
  // A store client that answers "0" used to skip every message unrun.
  for (const answer of ['0', 'false', {}, null, undefined, 2, [false]]) {
    const outcome = await bq.dedupe(envelope('yn'), store(answer), run);
    assert.equal(outcome.kind, 'store-unavailable', `${JSON.stringify(answer)}`);
    assert.equal(outcome.disposition, 'retry');
    assert.match(outcome.reason, /seen: answered neither a boolean nor 0\/1/);
  }
  // A thenable whose `then` getter throws rejects with that error, as `await` does.
  const getter = { get then() { throw new Error('then getter broke'); } };
  const thrown = await bq.dedupe(envelope('yn'), store(getter), run);
  assert.equal(thrown.kind, 'store-unavailable');
  assert.match(thrown.reason, /then getter broke/);
  const many = { seen: ok, remember: ok, forget: ok, seenMany: (keys) => keys.map(() => '0') };
  const batch = await bq.dedupeBatch([envelope('m1'), envelope('m2')], many, run);
  assert.deepEqual(batch.map((o) => o.kind), ['store-unavailable', 'store-unavailable']);
  assert.equal(runs, 0, 'nothing ran, nothing was skipped');
  // The lease methods too: a fenced commit answered "false" is not a success.
  const leased = expiringStore('fenced', 'sync');
  leased.rememberFenced = () => 'false';
  const fenced = await bq.dedupe(envelope('f1'), leased, run, { claimLeaseMs: 60_000 });
  assert.equal(fenced.kind, 'run-ok-unrecorded', JSON.stringify(fenced));
  assert.match(fenced.reason, /rememberFenced: answered neither/);
});

test('ids, prefixes and scopes with a lone surrogate are refused, never turned into U+FFFD', async () => {
  const store = new bq.InMemoryStore();
  assert.equal((await bq.dedupe(envelope('a\ufffd'), store, ok)).kind, 'run-ok');
  await assert.rejects(bq.forget('a\ud800', store), {
    name: 'TypeError',
    message: 'forget: the id has a lone surrogate (not well-formed UTF-16)',
  });
  assert.equal((await bq.dedupe(envelope('a\ufffd'), store, ok)).kind, 'skip', 'another id was not forgotten');
  await assert.rejects(bq.forget(42, store), { name: 'TypeError', message: 'forget: the id must be a string' });
  for (const options of [{ keyPrefix: 'p\ud800' }, { scope: 's\udc00' }]) {
    await assert.rejects(bq.dedupe(envelope('x'), store, ok, options), /lone surrogate/);
    assert.throws(() => bq.dedupeKey(envelope('x'), options), /lone surrogate/);
  }
  assert.equal(bq.dedupeKey(envelope('x'), { keyPrefix: 'p\ud83d\ude00' }), 'p\ud83d\ude00x', 'a pair is fine');
});

test("an InMemoryStore's own methods refuse a key with a lone surrogate (it became U+FFFD: another id was remembered, then skipped; a user's trial)", async () => {
  const store = new bq.InMemoryStore();
  const refused = { name: 'TypeError', message: 'key has a lone surrogate (not well-formed UTF-16)' };
  assert.throws(() => store.remember('order-\ud83d'), refused);
  assert.throws(() => store.seen('order-\ud83d'), refused);
  assert.throws(() => store.claim('order-\ud83d', 1000), refused);
  assert.throws(() => store.release('order-\ud83d', 't'), refused);
  assert.throws(() => store.remember(42), { name: 'TypeError', message: 'key must be a string' });
  assert.equal((await bq.dedupe(envelope('order-\ufffd'), store, ok)).kind, 'run-ok', 'never remembered');
  assert.throws(() => store.forget('order-\udfff'), refused);
  assert.equal((await bq.dedupe(envelope('order-\ufffd'), store, ok)).kind, 'skip', 'not forgotten');
});

test("an option whose getter throws is refused, not dropped (claiming was silently off, and overlapping deliveries ran twice: a user's trial)", async () => {
  const store = new bq.InMemoryStore();
  let runs = 0;
  for (const key of ['claimLeaseMs', 'ttlMs', 'keyPrefix', 'tracer']) {
    const options = Object.defineProperty({}, key, { enumerable: true, get() { throw new Error('no value for you'); } });
    await assert.rejects(bq.dedupe(envelope(`g-${key}`), store, () => { runs += 1; }, options), {
      name: 'TypeError',
      message: `options.${key} could not be read: no value for you`,
    });
  }
  assert.equal(runs, 0);
});

test('a TTL or lease of 0, or past 100 years, and maxBytes 0 are refused', async () => {
  const store = new bq.InMemoryStore();
  let runs = 0;
  for (const options of [{ claimLeaseMs: 0 }, { ttlMs: 0 }, { ttlMs: 1e300 }, { claimLeaseMs: 4e12 }]) {
    await assert.rejects(bq.dedupe(envelope('z'), store, () => { runs += 1; }, options), {
      name: 'TypeError',
      message: /must be more than 0 and at most 100 years/,
    });
  }
  await assert.rejects(bq.dedupe(envelope('z'), store, ok, { maxBytes: 0 }), /maxBytes must be at least 1/);
  assert.equal(runs, 0);
  assert.equal((await bq.dedupe(envelope('z'), store, ok, { claimLeaseMs: 0.5, ttlMs: 1 })).kind, 'run-ok');
});

test('a handler that throws an Error whose message is not a string fails its delivery, never wedges the batch', async () => {
  const odd = () => {
    const nulled = new Error('x');
    nulled.message = null;
    const objected = new Error('y');
    objected.message = { status: 503 };
    const getter = new Error('z');
    Object.defineProperty(getter, 'message', { get() { throw new Error('no message for you'); } });
    return [nulled, objected, getter];
  };
  for (const [i, error] of odd().entries()) {
    for (const how of ['sync', 'async']) {
      const store = new bq.InMemoryStore();
      const effects = [];
      const handler = (env) => {
        effects.push(env.meta.id);
        if (env.meta.id === 'b') {
          if (how === 'sync') throw error;
          return Promise.reject(error);
        }
      };
      const outcomes = await bq.dedupeBatch([envelope('a'), envelope('b'), envelope('c')], store, handler);
      assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-failed', 'run-ok'], `${i} ${how}`);
      assert.equal(outcomes[1].error, error, 'the error as thrown');
      assert.equal(typeof outcomes[1].reason, 'string');
      const again = await bq.dedupeBatch([envelope('a'), envelope('b'), envelope('c')], store, handler);
      assert.deepEqual(again.map((o) => o.kind), ['skip', 'run-failed', 'skip'], `${i} ${how}: recorded once`);
      assert.deepEqual(effects, ['a', 'b', 'c', 'b']);
      const one = await bq.dedupe(envelope('b'), store, handler);
      assert.equal(one.kind, 'run-failed');
    }
  }
});

test('a blank, null or number job gives way to urn, and the handler gets it as job (a review)', async () => {
  const store = new bq.InMemoryStore();
  for (const [n, job] of ['', '  ', '\u0085', null, 7].entries()) {
    let seen;
    const env = JSON.stringify(envelope(`blank-job-${n}`, { job, urn: 'urn:babel:orders:paid' }));
    const outcome = await bq.dedupe(env, store, (e) => { seen = e.job; });
    assert.equal(outcome.kind, 'run-ok');
    assert.equal(seen, 'urn:babel:orders:paid', JSON.stringify(job));
  }
});
