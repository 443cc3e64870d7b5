// The bq-dedupe component, transpiled by jco, driven from Node with a JS store
// (a Map) and a JS handler.
//
//   scripts/build-component.sh js                     # build + transpile
//   node --test crates/component/js/component.test.mjs
//
// jco's shapes: variants are `{ tag: 'run-ok' }` / `{ tag: 'run-failed', val }`;
// records are camelCase objects; u64 is a BigInt; option<T> is T | undefined; an
// exported result<T, E> returns T or throws a ComponentError whose `payload` is E.
// Imports are called unbound (closures, not methods); an import returning
// result<T, E> returns T, or throws E (a plain value, not an Error: a thrown Error
// traps the instance).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../../..');
const jsDir = process.env.BQ_COMPONENT_JS_DIR ?? path.join(root, 'target/component/js');
const conformanceDir = path.join(root, 'tests/conformance');

const { instantiate } = await import(pathToFileURL(path.join(jsDir, 'bq_dedupe.js')).href);

const modules = new Map();
const getCoreModule = (file) => {
  if (!modules.has(file)) modules.set(file, WebAssembly.compile(readFileSync(path.join(jsDir, file))));
  return modules.get(file);
};

/** A host without lease support (WIT 1.1 `leases.supported()` false): the 1.0 behaviour. */
const noLeases = { supported: () => false, nowMs: () => BigInt(Date.now()), settle: () => { throw 'unsupported'; } };

/**
 * A fresh component instance over `store` and `handler` (import objects of closures),
 * and `leases` (default: none).
 */
async function component(store, handler = { handle: () => {} }, leases = noLeases) {
  const imports = {
    // jco 1.35 reads the unversioned keys; the .d.ts names the versioned ones.
    'babelqueue:idempotency/store': store,
    'babelqueue:idempotency/store@1.1.0': store,
    'babelqueue:idempotency/leases': leases,
    'babelqueue:idempotency/leases@1.1.0': leases,
    'babelqueue:idempotency/handler': handler,
    'babelqueue:idempotency/handler@1.1.0': handler,
    'babelqueue:idempotency/types': {},
    'babelqueue:idempotency/types@1.1.0': {},
  };
  return instantiate(getCoreModule, imports);
}

/**
 * `leases` over a memoryStore's maps: renew and fenced commits by token, as a JS
 * host would write them.
 */
function memoryLeases(mem) {
  const calls = [];
  return {
    calls,
    supported: () => true,
    nowMs: () => BigInt(Date.now()),
    settle: (remember, ttlMs, release, renew, _leaseMs) => {
      calls.push({ remember, release, renew });
      for (const [key, token] of release) if (mem.claims.get(key) === token) mem.claims.delete(key);
      const renewed = renew.map(([key, token]) => mem.claims.get(key) === token);
      const kept = remember.map(([key, token]) => {
        const ours = token === undefined || mem.claims.get(key) === token;
        const free = !mem.claims.has(key) && !mem.remembered.has(key);
        if (ours || free) {
          mem.remembered.set(key, ttlMs);
          mem.claims.delete(key);
        }
        return ours;
      });
      return { kept, renewed, releaseError: undefined };
    },
  };
}

/**
 * A Map-backed store with every `store` function, logging each call. `caps` is what
 * `capabilities()` reports; `overrides` replaces single functions.
 */
function memoryStore({ caps = { batch: true, claim: true, ttl: true }, overrides = {} } = {}) {
  const remembered = new Map(); // key -> ttlMs (undefined: forever)
  const claims = new Map(); // key -> token
  const calls = [];
  let tokens = 0;
  const claimOne = (key) => {
    if (remembered.has(key)) return { tag: 'seen' };
    if (claims.has(key)) return { tag: 'held' };
    const token = `token-${++tokens}`;
    claims.set(key, token);
    return { tag: 'acquired', val: token };
  };
  const rememberOne = (key, ttlMs) => {
    remembered.set(key, ttlMs);
    claims.delete(key);
  };
  const releaseOne = (key, token) => {
    if (claims.get(key) === token) claims.delete(key);
  };
  const fns = {
    capabilities: () => caps,
    seen: (key) => remembered.has(key),
    remember: (key, ttlMs) => rememberOne(key, ttlMs),
    forget: (key) => {
      remembered.delete(key);
      claims.delete(key);
    },
    seenMany: (keys) => keys.map((key) => remembered.has(key)),
    rememberMany: (keys, ttlMs) => keys.forEach((key) => rememberOne(key, ttlMs)),
    claim: (key, _leaseMs) => claimOne(key),
    claimMany: (keys, _leaseMs) => keys.map(claimOne),
    release: (key, token) => releaseOne(key, token),
    commitMany: (done, ttlMs, release) => {
      done.forEach((key) => rememberOne(key, ttlMs));
      release.forEach(([key, token]) => releaseOne(key, token));
    },
    ...overrides,
  };
  const store = {};
  for (const [name, fn] of Object.entries(fns)) {
    store[name] = (...args) => {
      calls.push([name, ...args]);
      return fn(...args);
    };
  }
  return { store, remembered, claims, calls, names: () => calls.map(([name]) => name) };
}

/** A handler that records each envelope and fails (throws a string) while `fail` is set. */
function recordingHandler() {
  const h = { calls: [], fail: false };
  h.import = {
    handle: (envelope) => {
      h.calls.push(envelope);
      if (h.fail) throw 'handler threw';
    },
  };
  return h;
}

const defaults = { keyPrefix: '' };
const manifest = JSON.parse(readFileSync(path.join(conformanceDir, 'manifest.json'), 'utf8'));
const fixture = (file) => readFileSync(path.join(conformanceDir, file), 'utf8');
const template = JSON.parse(fixture(manifest.idempotency.dedup_key.envelope_file));
const envelopeWithId = (id) => JSON.stringify({ ...template, meta: { ...template.meta, id } });
const RAN = new Set(['run-ok', 'run-ok-unrecorded', 'run-failed', 'run-panicked', 'fail-open', 'fail-open-failed']);
const effectOf = (outcome) => (RAN.has(outcome.tag) ? 'run' : outcome.tag === 'skip' ? 'skip' : outcome.tag);

test('leases 1.1: a claim forgotten while the handler runs is run-ok-lease-lost, never a silent run-ok', async () => {
  const mem = memoryStore();
  const leases = memoryLeases(mem);
  const env = envelopeWithId('lease-1');
  const handler = { handle: () => mem.store.forget('lease-1') }; // someone forgets the id mid-run
  const c = await component(mem.store, handler, leases);
  const outcome = c.consumer.process(env, { ...defaults, claimLeaseMs: 60_000n });
  assert.equal(outcome.tag, 'run-ok-lease-lost');
  assert.ok(mem.remembered.has('lease-1'), 'the effect happened, so the free key is remembered');
  assert.deepEqual(leases.calls.at(-1).remember, [['lease-1', 'token-1']], 'committed fenced, with its token');
});

test('leases 1.1: a host answering supported() false gets the 1.0 calls (no settle)', async () => {
  const mem = memoryStore();
  const c = await component(mem.store);
  const bodies = ['a', 'b'].map(envelopeWithId);
  const outcomes = c.consumer.processBatch(bodies, { ...defaults, claimLeaseMs: 60_000n });
  assert.deepEqual(outcomes.map((o) => o.tag), ['run-ok', 'run-ok']);
  assert.ok(!mem.names().includes('commitMany') && mem.names().includes('rememberMany'), mem.names().join(','));
});

test('conformance: the six idempotency sequences through consumer.process', async (t) => {
  assert.equal(manifest.idempotency.sequences.cases.length, 6);
  for (const seq of manifest.idempotency.sequences.cases) {
    await t.test(seq.name, async () => {
      const { store } = memoryStore();
      const handler = recordingHandler();
      const { consumer } = await component(store, handler.import);
      for (const [n, delivery] of seq.deliveries.entries()) {
        if (delivery.forget_before) consumer.forget(delivery.meta_id, defaults);
        const body = envelopeWithId(delivery.meta_id);
        handler.fail = delivery.outcome === 'throw';
        const before = handler.calls.length;
        const outcome = consumer.process(body, defaults);
        const where = `delivery ${n + 1} (${JSON.stringify(delivery.meta_id)}): ${JSON.stringify(outcome)}`;
        assert.equal(effectOf(outcome), delivery.expect_effect, where);
        assert.equal(handler.calls.length - before, delivery.expect_effect === 'run' ? 1 : 0, where);
        if (delivery.expect_effect === 'run') {
          // The handler gets the envelope text exactly as delivered.
          assert.equal(handler.calls.at(-1), body);
          const noId = delivery.meta_id === '';
          const expected = handler.fail
            ? { tag: noId ? 'fail-open-failed' : 'run-failed', val: 'handler threw' }
            : { tag: noId ? 'fail-open' : 'run-ok' };
          assert.deepEqual(outcome, expected, where);
        }
      }
      assert.equal(handler.calls.length, seq.expected_effects, 'handler calls = expected_effects');
    });
  }
});

test('conformance: decode on the six envelope cases, and the dedupe key', async (t) => {
  const { guard } = await component(memoryStore().store);
  // The manifest states why an invalid case is invalid; these are the codes of those rules.
  const rejectionCode = {
    'invalid-unknown-schema-version': 'unsupported-schema-version',
    'invalid-missing-urn': 'missing-job',
  };
  assert.equal(manifest.cases.length, 6);
  for (const c of manifest.cases) {
    await t.test(c.name, () => {
      const raw = fixture(c.file);
      if (!c.valid) {
        assert.throws(
          () => guard.decode(raw),
          (e) => e.payload?.code === rejectionCode[c.name] && typeof e.payload.message === 'string',
        );
        return;
      }
      const env = JSON.parse(guard.decode(raw));
      assert.ok(!('urn' in env), 'decode writes the canonical `job`');
      for (const [field, want] of Object.entries(c.expect ?? {})) {
        if (field === 'urn') assert.equal(env.job, want);
        else if (field === 'lang' || field === 'schema_version') assert.deepEqual(env.meta[field], want);
        else if (field === 'dead_letter') {
          for (const [k, v] of Object.entries(want)) assert.deepEqual(env.dead_letter[k], v, `dead_letter.${k}`);
        } else assert.deepEqual(env[field], want, field);
      }
    });
  }
  const key = manifest.idempotency.dedup_key;
  assert.equal(guard.dedupeKey(fixture(key.envelope_file), defaults), key.expected_key);
  assert.equal(guard.dedupeKey(envelopeWithId(''), defaults), undefined, 'no usable id');
  assert.equal(
    guard.dedupeKey(fixture(key.envelope_file), { keyPrefix: 'bq:', keyScope: 'billing' }),
    `bq:billing:${key.expected_key}`,
  );
});

test('process-batch: an in-batch duplicate runs once', async () => {
  const { store, names } = memoryStore();
  const handler = recordingHandler();
  const { consumer } = await component(store, handler.import);
  const a = envelopeWithId('id-A');
  assert.deepEqual(consumer.processBatch([a, a], defaults), [{ tag: 'run-ok' }, { tag: 'skip' }]);
  assert.equal(handler.calls.length, 1);

  // Two distinct keys: one batch call to decide and one to record.
  const b = envelopeWithId('id-B');
  const c = envelopeWithId('id-C');
  handler.calls.length = 0;
  const before = names().length;
  const outcomes = consumer.processBatch([b, c, b, a], defaults);
  assert.deepEqual(outcomes.map((o) => o.tag), ['run-ok', 'run-ok', 'skip', 'skip']);
  assert.deepEqual(handler.calls, [b, c]);
  assert.deepEqual(names().slice(before), ['capabilities', 'seenMany', 'rememberMany']);
});

test('a store that fails on seen: store-unavailable, the handler does not run', async () => {
  const { store } = memoryStore({
    overrides: {
      seen: () => {
        throw { kind: 'unavailable', message: 'redis down' };
      },
    },
  });
  const handler = recordingHandler();
  const { consumer } = await component(store, handler.import);
  assert.deepEqual(consumer.process(envelopeWithId('id-A'), defaults), {
    tag: 'store-unavailable',
    val: { kind: 'unavailable', message: 'redis down' },
  });
  assert.equal(handler.calls.length, 0);
});

test('claiming mode: an id held by another consumer parks', async () => {
  const { store, names } = memoryStore({ overrides: { claim: () => ({ tag: 'held' }) } });
  const handler = recordingHandler();
  const { consumer } = await component(store, handler.import);
  const outcome = consumer.process(envelopeWithId('id-A'), { ...defaults, claimLeaseMs: 30_000n });
  assert.deepEqual(outcome, { tag: 'park' });
  assert.equal(handler.calls.length, 0);
  assert.deepEqual(names(), ['capabilities', 'claim', 'seen']); // claim, then re-check seen
});

test('claiming mode: acquired, remembered on success; redelivery skips', async () => {
  const { store, calls, claims } = memoryStore();
  const handler = recordingHandler();
  const { consumer } = await component(store, handler.import);
  const options = { ...defaults, claimLeaseMs: 30_000n, ttlMs: 60_000n };
  assert.deepEqual(consumer.process(envelopeWithId('id-A'), options), { tag: 'run-ok' });
  assert.deepEqual(calls.find(([name]) => name === 'claim'), ['claim', 'id-A', 30_000n]);
  assert.deepEqual(calls.find(([name]) => name === 'remember'), ['remember', 'id-A', 60_000n]);
  assert.equal(claims.size, 0);
  assert.deepEqual(consumer.process(envelopeWithId('id-A'), options), { tag: 'skip' });
  assert.equal(handler.calls.length, 1);
});

test('claiming mode, batch (a host without leases): one claim-many, a release for the failed delivery, then the remember', async () => {
  const { store, calls, claims, remembered } = memoryStore();
  const failing = envelopeWithId('id-B');
  const handled = [];
  const handler = {
    handle: (envelope) => {
      handled.push(envelope);
      if (envelope === failing) throw 'no stock';
    },
  };
  const { consumer } = await component(store, handler);
  const options = { ...defaults, claimLeaseMs: 10_000n };
  const outcomes = consumer.processBatch([envelopeWithId('id-A'), failing], options);
  assert.deepEqual(outcomes, [{ tag: 'run-ok' }, { tag: 'run-failed', val: 'no stock' }]);
  // No commit-many: a guest no longer sends it (hosts still answer it).
  assert.deepEqual(calls.map(([name]) => name), ['capabilities', 'claimMany', 'release', 'remember']);
  assert.deepEqual(calls[2], ['release', 'id-B', 'token-2']);
  assert.deepEqual(calls[3], ['remember', 'id-A', undefined]);
  assert.equal(claims.size, 0, 'the failed delivery released its claim');
  assert.ok(remembered.has('id-A') && !remembered.has('id-B'));
  assert.equal(handled.length, 2);

  // Without the batch capability the same batch claims and settles key by key
  // (releases first: a failed release never reads as a failed remember).
  const single = memoryStore({ caps: { batch: false, claim: true, ttl: true } });
  const c = await component(single.store, handler);
  c.consumer.processBatch([envelopeWithId('id-A'), failing], options);
  assert.deepEqual(single.names(), ['capabilities', 'claim', 'claim', 'release', 'remember']);
});

test('capabilities: no claim -> unsupported without calling claim; no batch -> single calls; no ttl -> none', async () => {
  const noClaim = memoryStore({ caps: { batch: true, claim: false, ttl: true } });
  let c = await component(noClaim.store);
  const parked = c.consumer.process(envelopeWithId('id-A'), { ...defaults, claimLeaseMs: 1000n });
  assert.equal(parked.tag, 'store-unavailable');
  assert.equal(parked.val.kind, 'unsupported');
  assert.deepEqual(noClaim.names(), ['capabilities']);

  const single = memoryStore({ caps: { batch: false, claim: false, ttl: false } });
  const handler = recordingHandler();
  c = await component(single.store, handler.import);
  const bodies = ['id-A', 'id-B'].map(envelopeWithId);
  const outcomes = c.consumer.processBatch(bodies, { ...defaults, ttlMs: 5000n });
  assert.deepEqual(outcomes.map((o) => o.tag), ['run-ok', 'run-ok']);
  assert.deepEqual(single.calls, [
    ['capabilities'],
    ['seen', 'id-A'],
    ['seen', 'id-B'],
    ['remember', 'id-A', undefined],
    ['remember', 'id-B', undefined],
  ]);
});

test('options: prefix and scope namespace the key; an invalid scope is refused without the store', async () => {
  const { store, calls } = memoryStore();
  const { consumer, guard } = await component(store);
  consumer.process(envelopeWithId('id-A'), { keyPrefix: 'bq:', keyScope: 'billing' });
  assert.deepEqual(calls.find(([name]) => name === 'seen'), ['seen', 'bq:billing:id-A']);

  calls.length = 0;
  const bad = { keyPrefix: '', keyScope: 'a:b' };
  const outcome = consumer.process(envelopeWithId('id-A'), bad);
  assert.equal(outcome.tag, 'store-unavailable');
  assert.equal(outcome.val.kind, 'invalid');
  assert.equal(guard.decide(envelopeWithId('id-A'), bad).verdict.tag, 'store-unavailable');
  assert.throws(() => guard.forget('id-A', bad), (e) => e.payload?.kind === 'invalid');
  assert.deepEqual(calls, []);
});

test('dedupe-key with an invalid scope traps, as the WIT says', async () => {
  const { guard } = await component(memoryStore().store);
  assert.throws(() => guard.dedupeKey(envelopeWithId('id-A'), { keyPrefix: '', keyScope: '' }), WebAssembly.RuntimeError);
});

test('guard: decide, the host runs the handler, complete', async () => {
  const { store, remembered } = memoryStore();
  const { guard } = await component(store);
  const bodies = [envelopeWithId('id-A'), envelopeWithId('id-A'), '{"not":"an envelope"}', envelopeWithId('')];
  const decisions = guard.decideBatch(bodies, defaults);
  assert.deepEqual(
    decisions.map((d) => d.verdict.tag),
    ['run', 'duplicate', 'reject', 'fail-open'],
  );
  assert.equal(decisions[1].verdict.val, 0);
  assert.equal(decisions[0].key, 'id-A');
  assert.equal(decisions[2].verdict.val.code, 'missing-job');
  const outcomes = guard.completeBatch(decisions, [{ tag: 'ok' }, undefined, undefined, { tag: 'failed', val: 'boom' }], defaults);
  assert.deepEqual(outcomes, [
    { tag: 'run-ok' },
    { tag: 'skip' },
    { tag: 'rejected', val: decisions[2].verdict.val },
    { tag: 'fail-open-failed', val: 'boom' },
  ]);
  assert.ok(remembered.has('id-A'));

  // Single delivery: already seen now.
  assert.deepEqual(guard.decide(envelopeWithId('id-A'), defaults).verdict, { tag: 'skip' });
  const d = guard.decide(envelopeWithId('id-B'), defaults);
  assert.deepEqual(guard.complete(d, { tag: 'panicked', val: 'oops' }, defaults), { tag: 'run-panicked', val: 'oops' });
  assert.deepEqual(guard.complete(d, undefined, defaults), { tag: 'park' }, 'told to run but did not');
  assert.ok(!remembered.has('id-B'));
  // A remember failure after success still acks, and says so.
  const failing = memoryStore({
    overrides: {
      remember: () => {
        throw { kind: 'internal', message: 'disk full' };
      },
    },
  });
  const g2 = (await component(failing.store)).guard;
  const d2 = g2.decide(envelopeWithId('id-C'), defaults);
  assert.deepEqual(g2.complete(d2, { tag: 'ok' }, defaults), {
    tag: 'run-ok-unrecorded',
    val: { kind: 'internal', message: 'disk full' },
  });
});

const guardOptions = (more = {}) => ({ keyPrefix: '', fingerprint: false, ...more });

test('consumer.Guard (1.1): options and capabilities once, then only the bodies, batches in batch calls', async () => {
  const { store, names, remembered } = memoryStore();
  const handler = recordingHandler();
  const leases = { ...noLeases, calls: 0 };
  leases.supported = () => {
    leases.calls += 1;
    return false;
  };
  const { consumer } = await component(store, handler.import, leases);
  const guard = new consumer.Guard(guardOptions({ keyPrefix: 'bq:' }));
  assert.deepEqual(names(), ['capabilities']);
  assert.equal(leases.calls, 1);
  const [a, b, c] = ['id-A', 'id-B', 'id-C'].map(envelopeWithId);
  assert.deepEqual(guard.processBatch([a, b, a]).map((o) => o.tag), ['run-ok', 'run-ok', 'skip']);
  assert.deepEqual(guard.process(a), { tag: 'skip' });
  assert.deepEqual(guard.process(c), { tag: 'run-ok' });
  assert.deepEqual(names().slice(1), ['seenMany', 'rememberMany', 'seen', 'seen', 'remember']);
  assert.equal(leases.calls, 1, 'read once, by the constructor');
  assert.deepEqual(handler.calls, [a, b, c]);
  assert.ok(remembered.has('bq:id-A'));
  assert.deepEqual(
    guard.processBatchIds([b, 'nope', envelopeWithId('')]).map((p) => [p.id, p.outcome.tag]),
    [['id-B', 'skip'], [undefined, 'rejected'], [undefined, 'fail-open']],
  );
  // With what each delivery's span reports: an in-batch duplicate, a skip.
  assert.deepEqual(
    guard.processBatchReports([c, envelopeWithId('id-D'), envelopeWithId('id-D')]).map((r) => [r.id, r.outcome.tag, r.duplicate, r.claimed]),
    [['id-C', 'skip', true, false], ['id-D', 'run-ok', false, false], ['id-D', 'skip', true, false]],
  );
  guard.forget('id-A');
  assert.ok(!remembered.has('bq:id-A'));
  assert.deepEqual(guard.process(a), { tag: 'run-ok' });
  // The same outcomes as the free functions with the same options.
  const fresh = await component(memoryStore().store);
  const freeGuard = new fresh.consumer.Guard(guardOptions());
  const again = await component(memoryStore().store);
  const bodies = [a, b, a, 'nope', c, b];
  assert.deepEqual(freeGuard.processBatch(bodies), again.consumer.processBatch(bodies, defaults));
});

test('consumer.Guard: refused options throw a typed store-error from the constructor, not a trap', async () => {
  const { store, calls } = memoryStore();
  const { consumer } = await component(store);
  assert.throws(
    () => new consumer.Guard(guardOptions({ keyScope: 'a:b' })),
    (e) => e.payload?.kind === 'invalid' && /a:b/.test(e.payload.message),
  );
  assert.deepEqual(calls, [], 'nothing reached the store');
  const guard = new consumer.Guard(guardOptions({ keyScope: 'billing' }));
  assert.deepEqual(guard.process(envelopeWithId('id-A')), { tag: 'run-ok' });
  assert.deepEqual(calls.find(([name]) => name === 'seen'), ['seen', 'billing:id-A']);
});

test('consumer.Guard: payload fingerprints, an id reused with other data is payload-mismatch', async () => {
  const { store, remembered } = memoryStore({ caps: { batch: true, claim: false, ttl: false } });
  const handler = recordingHandler();
  const { consumer } = await component(store, handler.import);
  const guard = new consumer.Guard(guardOptions({ fingerprint: true }));
  const withData = (data) => JSON.stringify({ ...template, data, meta: { ...template.meta, id: 'id-F' } });
  assert.deepEqual(guard.process(withData({ order: 1, sku: 'a' })), { tag: 'run-ok' });
  assert.deepEqual(guard.process(withData({ sku: 'a', order: 1 })), { tag: 'skip' }, 'keys reordered: a redelivery');
  assert.deepEqual(guard.process(withData({ order: 1, sku: 'b' })), { tag: 'payload-mismatch' });
  assert.equal(handler.calls.length, 1);
  assert.equal(remembered.size, 3, 'the id and its two companion records');
  assert.ok(remembered.has('\u001ffp:=id-F'));
  // Off, the same body is a redelivery.
  assert.deepEqual(new consumer.Guard(guardOptions()).process(withData({ order: 1, sku: 'b' })), { tag: 'skip' });
});

test('examples/jco-minimal.mjs (docs/component.md\'s jco example) runs as written: run-ok, then skip,skip, one effect', async () => {
  const { execFileSync } = await import('node:child_process');
  const out = execFileSync(process.execPath, [path.join(root, 'examples/jco-minimal.mjs')], {
    env: { ...process.env, BQ_JCO_DIR: `${jsDir}-minimal` },
    encoding: 'utf8',
  });
  assert.equal(out, 'run-ok\nskip,skip\n1\n');
});

test('jco reads a Promise from an import as a value: an async seen would skip every message unrun, which the example\'s check refuses', async () => {
  const { instantiate: minimal } = await import(pathToFileURL(path.join(`${jsDir}-minimal`, 'bq_dedupe_minimal.js')).href);
  const dir = `${jsDir}-minimal`;
  const load = (file) => WebAssembly.compile(readFileSync(path.join(dir, file)));
  const body = readFileSync(path.join(root, 'examples/minimal-envelope.json'), 'utf8');
  const ran = [];
  const make = (seen) => minimal(load, {
    'babelqueue:idempotency/seen-set': { seen, remember: () => {}, forget: () => {} },
    'babelqueue:idempotency/handler': { handle: () => { ran.push(1); } },
  });
  // Unchecked, as jco takes it: the message is acked as a skip and never runs.
  const loose = await make(async () => false);
  assert.deepEqual(new loose.consumer.Guard({ keyPrefix: '', fingerprint: false }).process(body), { tag: 'skip' });
  assert.equal(ran.length, 0);
  // Checked as the example does: a store error, retried, nothing acked.
  const strict = await make(() => {
    throw { kind: 'internal', message: 'seen answered object: imports are synchronous' };
  });
  const outcome = new strict.consumer.Guard({ keyPrefix: '', fingerprint: false }).process(body);
  assert.equal(outcome.tag, 'store-unavailable', JSON.stringify(outcome));
});

test('a minimal-world handler fails by throwing a string (run-failed, retried); an object thrown from handle traps the call', async () => {
  const { instantiate: minimal } = await import(pathToFileURL(path.join(`${jsDir}-minimal`, 'bq_dedupe_minimal.js')).href);
  const load = (file) => WebAssembly.compile(readFileSync(path.join(`${jsDir}-minimal`, file)));
  const body = readFileSync(path.join(root, 'examples/minimal-envelope.json'), 'utf8');
  const ids = new Set();
  const make = (handle) => minimal(load, {
    'babelqueue:idempotency/seen-set': { seen: (k) => ids.has(k), remember: (k) => { ids.add(k); }, forget: () => {} },
    'babelqueue:idempotency/handler': { handle },
  });
  const failing = await make(() => { throw 'the handler returned a Promise: handlers are synchronous'; });
  const outcome = new failing.consumer.Guard({ keyPrefix: '', fingerprint: false }).process(body);
  assert.equal(outcome.tag, 'run-failed', JSON.stringify(outcome));
  assert.equal(ids.size, 0, 'nothing recorded');
  const trapping = await make(() => { throw { kind: 'internal', message: 'an object' }; });
  assert.throws(() => new trapping.consumer.Guard({ keyPrefix: '', fingerprint: false }).process(body));
  assert.equal(ids.size, 0);
});
