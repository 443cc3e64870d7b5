// How a batch's envelopes cross into wasm (crates/js/src/crossing.rs and glue.js) and what
// the handler and the outcomes get back: every input kind in one batch, in order;
// the handler parses the envelope's own JS text (a string as given, an object as
// JSON.stringify'd, a Uint8Array from its bytes); keys and codes with characters
// that need escaping or are outside ASCII come back unchanged.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bq, envelope } from './helpers.mjs';

const enc = new TextEncoder();

test('a batch mixing strings, bytes, objects and unreadable values keeps its order and each input kind', async () => {
  const store = new bq.InMemoryStore();
  const asObject = envelope('obj-1', { note: 'an object' });
  const inputs = [
    JSON.stringify(envelope('str-1')),
    enc.encode(JSON.stringify(envelope('bytes-1', { note: 'bytes' }))),
    asObject,
    undefined,
    'not json at all',
    JSON.stringify(envelope('str-2', { note: 'caf\u00e9 \u{1F600}' })),
    new Uint8Array([0x7b, 0xff, 0x7d]),
    JSON.stringify(envelope('str-1')), // a duplicate of the first, in the same batch
  ];
  const seen = [];
  const outcomes = await bq.dedupeBatch(inputs, store, (e) => { seen.push(e); });
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [
    ['run-ok', 'str-1'],
    ['run-ok', 'bytes-1'],
    ['run-ok', 'obj-1'],
    ['rejected', null],
    ['rejected', null],
    ['run-ok', 'str-2'],
    ['rejected', null],
    ['skip', 'str-1'],
  ]);
  assert.equal(outcomes[3].rejection.code, 'not-json');
  assert.match(outcomes[3].reason, /undefined/);
  assert.equal(outcomes[6].rejection.code, 'not-json');
  assert.deepEqual(seen, [
    envelope('str-1'),
    envelope('bytes-1', { note: 'bytes' }),
    asObject,
    envelope('str-2', { note: 'caf\u00e9 \u{1F600}' }),
  ]);
  assert.notEqual(seen[2], asObject, 'the handler gets a copy, not the caller\'s object');
});

test('a handler that changes its envelope does not change the caller\'s object', async () => {
  const original = envelope('mut-1');
  await bq.dedupeBatch([original], new bq.InMemoryStore(), (e) => { e.data.order_id = 999; e.extra = true; });
  assert.deepEqual(original, envelope('mut-1'));
});

test('the urn alias gives the handler a job in a batch of strings, bytes and objects alike', async () => {
  const env = envelope('urn-1');
  delete env.job;
  env.urn = 'urn:babel:alias';
  const got = [];
  await bq.dedupeBatch([JSON.stringify(env), enc.encode(JSON.stringify({ ...env, meta: { id: 'urn-2', schema_version: 1 } })), { ...env, meta: { id: 'urn-3', schema_version: 1 } }],
    new bq.InMemoryStore(), (e) => { got.push(e.job); });
  assert.deepEqual(got, ['urn:babel:alias', 'urn:babel:alias', 'urn:babel:alias']);
});

test('keys needing JSON escapes, and keys outside ASCII, come back as the store holds them', async () => {
  const ids = ['quote"d', 'back\\slash', 'tab\there', 'nl\nline', 'ctl\u0001', 'caf\u00e9', '\u{1F600}', '\u2028sep'];
  const store = new bq.InMemoryStore();
  const outcomes = await bq.dedupeBatch(ids.map((id) => JSON.stringify(envelope(id))), store, () => {}, { keyPrefix: 'p"\\:' });
  assert.deepEqual(outcomes.map((o) => o.key), ids.map((id) => `p"\\:${id}`));
  assert.deepEqual(store.entries().map((e) => e.key).sort(), ids.map((id) => `p"\\:${id}`).sort());
  for (const [i, id] of ids.entries()) {
    assert.equal(bq.dedupeKey(JSON.stringify(envelope(id)), { keyPrefix: 'p"\\:' }), outcomes[i].key);
  }
});

test('an envelope whose text contains a NUL (never valid JSON) is rejected alone; its neighbours are untouched', async () => {
  const store = new bq.InMemoryStore();
  const good = JSON.stringify(envelope('nul-neighbour'));
  const outcomes = await bq.dedupeBatch([good, `${good.slice(0, 10)}\u0000${good.slice(10)}`, JSON.stringify(envelope('nul-after'))], store, () => {});
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'rejected', 'run-ok']);
  assert.deepEqual(outcomes.map((o) => o.key), ['nul-neighbour', null, 'nul-after']);
});

test('validate and the outcomes agree on rejections, and validate reports every field', () => {
  const v = bq.validate(JSON.stringify(envelope('v-1', { attempts: 3 })), { scope: 'billing' });
  assert.deepEqual(v, { valid: true, failOpen: false, id: 'v-1', key: 'billing:v-1', job: 'urn:babel:orders:created', traceId: 't-1', attempts: 3 });
  const bad = bq.validate('{"job":"j"}');
  assert.equal(bad.valid, false);
  assert.equal(bad.rejection.code, 'meta-not-object');
  assert.equal(typeof bad.rejection.message, 'string');
});

test('a batch bigger than any before it, most envelopes outside ASCII, is written whole (the buffer grows mid-batch)', async () => {
  const store = new bq.InMemoryStore();
  // A small batch first, so the module's reusable buffer is small.
  await bq.dedupeBatch([JSON.stringify(envelope('warm-1'))], store, () => {});
  const ids = Array.from({ length: 600 }, (_, i) => (i % 3 === 0 ? `ascii-${i}` : `\u00e9t\u00e9-\u{1F600}-${i}`));
  const texts = ids.map((id, i) => JSON.stringify(envelope(id, { note: i % 2 ? '\u4e2d\u6587'.repeat(40) : 'plain' })));
  const got = [];
  const outcomes = await bq.dedupeBatch(texts, store, (e) => { got.push(e.meta.id); });
  assert.deepEqual(outcomes.map((o) => o.key), ids);
  assert.ok(outcomes.every((o) => o.kind === 'run-ok'));
  assert.deepEqual(got, ids);
  // The same batch again is all skips (every key was remembered as written).
  const again = await bq.dedupeBatch(texts, store, () => { throw new Error('ran twice'); });
  assert.ok(again.every((o) => o.kind === 'skip'));
});

test('batches in flight together (their handlers awaiting) each keep their own envelopes', async () => {
  const store = new bq.InMemoryStore();
  const batch = (tag, n) => Array.from({ length: n }, (_, i) => JSON.stringify(envelope(`${tag}-${i}`, { note: tag.repeat(i + 1) })));
  const seen = { a: [], b: [] };
  const handler = (tag) => async (e) => {
    await new Promise((r) => setTimeout(r, 1));
    seen[tag].push([e.meta.id, e.note]);
  };
  const [a, b] = await Promise.all([
    bq.dedupeBatch(batch('a', 20), store, handler('a')),
    bq.dedupeBatch(batch('b\u00e9', 30), store, handler('b')),
  ]);
  assert.deepEqual(a.map((o) => o.key), Array.from({ length: 20 }, (_, i) => `a-${i}`));
  assert.deepEqual(b.map((o) => o.key), Array.from({ length: 30 }, (_, i) => `b\u00e9-${i}`));
  assert.deepEqual(seen.a, Array.from({ length: 20 }, (_, i) => [`a-${i}`, 'a'.repeat(i + 1)]));
  assert.deepEqual(seen.b, Array.from({ length: 30 }, (_, i) => [`b\u00e9-${i}`, 'b\u00e9'.repeat(i + 1)]));
});

test('an object JSON.stringify refuses is rejected with why; its neighbours run', async () => {
  const cyclic = envelope('cyc-1');
  cyclic.self = cyclic;
  const outcomes = await bq.dedupeBatch(
    [envelope('ok-1'), cyclic, { ...envelope('big-1'), n: 1n }, () => {}, envelope('ok-2')],
    new bq.InMemoryStore(),
    () => {},
  );
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [
    ['run-ok', 'ok-1'], ['rejected', null], ['rejected', null], ['rejected', null], ['run-ok', 'ok-2'],
  ]);
  assert.match(outcomes[1].reason, /JSON\.stringify failed: .*circular/i);
  assert.match(outcomes[2].reason, /JSON\.stringify failed: .*BigInt/i);
  assert.match(outcomes[3].reason, /not JSON-serialisable/);
  assert.ok(outcomes.slice(1, 4).every((o) => o.rejection.code === 'not-json'));
});

test('one delivery gives back its key whatever its length or script (the short-ASCII path and the decoder)', async () => {
  const store = new bq.InMemoryStore();
  for (const id of ['a', 'x'.repeat(256), 'y'.repeat(257), 'z'.repeat(70_000), 'caf\u00e9', '\u{1F600}'.repeat(100), 'quote"d\\']) {
    const o = await bq.dedupe(JSON.stringify(envelope(id)), store, () => {}, { keyPrefix: 'p:' });
    assert.equal(o.kind, 'run-ok');
    assert.equal(o.key, `p:${id}`);
  }
});

test('the handler gets the envelope that was deduped, even if the caller reuses its array or bytes while handlers run', async () => {
  const store = new bq.InMemoryStore();
  const batch = ['a', 'b', 'c'].map((id) => JSON.stringify(envelope(`reuse-${id}`)));
  const ran = [];
  const pending = bq.dedupeBatch(batch, store, async (e) => { ran.push(e.meta.id); await new Promise((r) => setTimeout(r, 2)); });
  batch.length = 0;
  batch.push(...['x', 'y', 'z'].map((id) => JSON.stringify(envelope(`reuse-${id}`))));
  const outcomes = await pending;
  assert.deepEqual(ran, ['reuse-a', 'reuse-b', 'reuse-c']);
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [['run-ok', 'reuse-a'], ['run-ok', 'reuse-b'], ['run-ok', 'reuse-c']]);

  // Bytes: the handler reads the copy the core validated, not the caller's buffer.
  const bytes = enc.encode(JSON.stringify(envelope('bytes-w1')));
  const slowStore = {
    seen: async (k) => store.seen(k),
    remember: async (k, ttl) => store.remember(k, ttl),
    forget: async (k) => store.forget(k),
  };
  let got;
  const one = bq.dedupe(bytes, slowStore, (e) => { got = e.meta.id; });
  bytes.set(enc.encode(JSON.stringify(envelope('bytes-w2'))));
  assert.equal((await one).key, 'bytes-w1');
  assert.equal(got, 'bytes-w1');
});

test('an array that grows while it is read, or an envelope whose reading throws, never traps the module', async () => {
  const store = new bq.InMemoryStore();
  const grows = [];
  grows.push({ toJSON() { grows.push(JSON.stringify(envelope('late'))); return envelope('first'); } }, JSON.stringify(envelope('second')));
  const outcomes = await bq.dedupeBatch(grows, store, () => {});
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [['run-ok', 'first'], ['run-ok', 'second']]);

  // A subclass whose `length` throws or lies is read by its real bytes (the
  // built-in getters), never past them into what an earlier batch left.
  class Evil extends Uint8Array { get length() { throw new Error('evil length'); } }
  const evil = new Evil(enc.encode(JSON.stringify(envelope('evil'))));
  assert.deepEqual((await bq.dedupeBatch([envelope('ok'), evil], store, () => {})).map((o) => [o.kind, o.key]), [['run-ok', 'ok'], ['run-ok', 'evil']]);
  const secret = JSON.stringify(envelope('earlier', { card: '4111' }));
  await bq.dedupeBatch([secret, secret], new bq.InMemoryStore(), () => {});
  class Lies extends Uint8Array { get length() { return secret.length; } }
  const seen = [];
  const lied = await bq.dedupeBatch([new Lies(0), 'x'], store, (e) => { seen.push(e); });
  assert.deepEqual(lied.map((o) => o.kind), ['rejected', 'rejected']);
  assert.deepEqual(seen, []);
  // An array whose iterator lies: every index is still a delivery.
  const iterates = [envelope('it-1'), envelope('it-2')];
  iterates[Symbol.iterator] = function* () { yield this[0]; };
  assert.deepEqual((await bq.dedupeBatch(iterates, store, () => {})).map((o) => o.key), ['it-1', 'it-2']);
  const trap = new Proxy([envelope('p')], { get(t, k) { if (k === 'length') throw new Error('length trap'); return t[k]; } });
  await assert.rejects(bq.dedupeBatch(trap, store, () => {}), /length trap/);
  // The module still works.
  assert.deepEqual((await bq.dedupeBatch([envelope('after')], store, () => {})).map((o) => o.kind), ['run-ok']);
});

test('text with a lone surrogate is rejected (it has no UTF-8 form), never turned into U+FFFD and deduped as another id', async () => {
  const text = (id) => `{"job":"j","trace_id":"t","data":{},"meta":{"id":"${id}","schema_version":1}}`;
  const check = async () => {
    const store = new bq.InMemoryStore();
    const ran = [];
    const outcomes = await bq.dedupeBatch([text('ab\ud800'), text('ab\ud801'), text('\udc00x'), text('ok\ud83d\ude00')], store, (e) => { ran.push(e.meta.id); });
    assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [['rejected', null], ['rejected', null], ['rejected', null], ['run-ok', 'ok\ud83d\ude00']]);
    assert.ok(outcomes.slice(0, 3).every((o) => o.rejection.code === 'not-json' && /lone surrogate/.test(o.reason)));
    assert.deepEqual(ran, ['ok\ud83d\ude00']);
    assert.equal((await bq.dedupe(text('\u00e9\ud800'), store, () => {})).kind, 'rejected');
    assert.throws(() => bq.dedupeKey(text('x\udfff')), (e) => e.code === 'not-json');
  };
  await check();
  // Where the engine has no String.prototype.isWellFormed (before ES2024), the same.
  const own = Object.getOwnPropertyDescriptor(String.prototype, 'isWellFormed');
  delete String.prototype.isWellFormed;
  try {
    await check();
  } finally {
    if (own) Object.defineProperty(String.prototype, 'isWellFormed', own);
  }
});

test('a Uint8Array from another realm (a vm context, as test runners make) is bytes, not an object to stringify', async () => {
  const { runInNewContext } = await import('node:vm');
  const text = JSON.stringify(envelope('realm-1'));
  const foreign = runInNewContext('new Uint8Array(bytes)', { bytes: Array.from(enc.encode(text)) });
  const sub = runInNewContext('new Uint8Array(3)'); // not one of ours, not an envelope either
  assert.equal(foreign instanceof Uint8Array, false, 'the test needs a foreign Uint8Array');
  const got = [];
  const outcomes = await bq.dedupeBatch([foreign, sub], new bq.InMemoryStore(), (e) => { got.push(e.meta.id); });
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [['run-ok', 'realm-1'], ['rejected', null]]);
  assert.equal(outcomes[1].rejection.code, 'not-json');
  assert.deepEqual(got, ['realm-1']);
  assert.equal(bq.dedupeKey(foreign), 'realm-1');
});

test('bytes come as a Uint8Array, a DataView or an ArrayBuffer; other typed arrays are refused with a reason that says so', async () => {
  const store = new bq.InMemoryStore();
  const bytes = (id) => enc.encode(JSON.stringify(envelope(id)));
  const b = bytes('view-dv');
  const padded = new Uint8Array(b.length + 8);
  padded.set(b, 4);
  const outcomes = await bq.dedupeBatch([
    new DataView(padded.buffer, 4, b.length),
    bytes('view-ab').buffer,
    new Uint16Array(4),
    new Float64Array(2),
    Buffer.from(bytes('view-buffer')),
  ], store, () => {});
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [
    ['run-ok', 'view-dv'], ['run-ok', 'view-ab'], ['rejected', null], ['rejected', null], ['run-ok', 'view-buffer'],
  ]);
  assert.match(outcomes[2].reason, /Uint16Array is not an envelope: pass its bytes as a Uint8Array/);
  assert.equal(outcomes[3].rejection.code, 'not-json');
  assert.equal(bq.dedupeKey(bytes('view-key').buffer), 'view-key');
});

// A SharedArrayBuffer was read as an object: JSON.stringify gave "{}", and
// its envelope was rejected `missing-job` (a review, h89).
test('bytes in a SharedArrayBuffer (raw, or under a Uint8Array or DataView) are read as bytes', async () => {
  const shared = (id) => {
    const b = enc.encode(JSON.stringify(envelope(id)));
    const sab = new SharedArrayBuffer(b.length);
    new Uint8Array(sab).set(b);
    return sab;
  };
  const outcomes = await bq.dedupeBatch([shared('sab-raw'), new Uint8Array(shared('sab-u8')), new DataView(shared('sab-dv'))], new bq.InMemoryStore(), () => {});
  assert.deepEqual(outcomes.map((o) => [o.kind, o.key]), [['run-ok', 'sab-raw'], ['run-ok', 'sab-u8'], ['run-ok', 'sab-dv']]);
  assert.equal(bq.dedupeKey(shared('sab-key')), 'sab-key');
});

// Said "JSON.stringify failed", where no JSON.stringify was involved (h89).
test('a detached ArrayBuffer is rejected as bytes that cannot be read', async () => {
  const detached = enc.encode(JSON.stringify(envelope('gone'))).buffer;
  structuredClone(detached, { transfer: [detached] });
  const [outcome] = await bq.dedupeBatch([detached], new bq.InMemoryStore(), () => assert.fail('ran'));
  assert.equal(outcome.kind, 'rejected');
  assert.equal(outcome.rejection.code, 'not-json');
  assert.match(outcome.reason, /its bytes cannot be read: .*detached/);
  assert.doesNotMatch(outcome.reason, /JSON\.stringify/);
});

test('a batch too large for wasm memory rejects with a RangeError, and the module goes on', async () => {
  const store = new bq.InMemoryStore();
  // Twice 2 GiB: more than a wasm32 module can hold (the pages are never touched).
  let big = new Uint8Array(2 ** 31 + 16);
  await assert.rejects(bq.dedupeBatch([JSON.stringify(envelope('\u00e9')), big, big], store, () => {}), RangeError);
  big = null;
  assert.deepEqual((await bq.dedupeBatch([envelope('after-big')], store, () => {})).map((o) => o.kind), ['run-ok']);
});
