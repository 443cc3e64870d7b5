// The `tracer` option, through the official OpenTelemetry SDK's in-memory
// exporter: BabelQueue's consumer span per delivery (the SDKs' attributes and
// parent), ours on top (the dedupe outcome), the handler's spans inside it,
// and the store's calls as CLIENT spans.
import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { context, createTraceState, trace, SpanKind, SpanStatusCode } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { bq, envelope, mapStore } from './helpers.mjs';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const tracer = provider.getTracer('bq-dedupe-test');
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

// The Node SDK's own derivations (tests/otel/README.md says how they were made).
const VECTORS = JSON.parse(readFileSync(new URL('../../../tests/otel/trace_ids.json', import.meta.url), 'utf8'));

const A = 'messaging.babelqueue.dedupe.';
const UUID = '7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b';

beforeEach(() => exporter.reset());

const spans = () => exporter.getFinishedSpans();
const consumers = () => spans().filter((s) => s.kind === SpanKind.CONSUMER);
const clients = () => spans().filter((s) => s.kind === SpanKind.CLIENT);
const parentOf = (s) => s.parentSpanContext?.spanId;

test('a fresh delivery: one CONSUMER span with the SDKs\' attributes, ours, and the parent trace_id names', async () => {
  const store = new bq.InMemoryStore();
  const env = envelope('m-1', { trace_id: UUID, attempts: 2, meta: { schema_version: 1, id: 'm-1', queue: 'orders' } });
  const outcome = await bq.dedupe(env, store, () => {}, { tracer });
  assert.equal(outcome.kind, 'run-ok');
  const [span, ...rest] = spans();
  assert.equal(rest.length, 0, 'the in-memory store makes no traced call');
  assert.equal(span.name, 'process urn:babel:orders:created');
  assert.equal(span.kind, SpanKind.CONSUMER);
  assert.deepEqual(span.attributes, {
    'messaging.system': 'babelqueue',
    'messaging.operation': 'process',
    'messaging.destination.name': 'orders',
    'messaging.message.id': 'm-1',
    'messaging.message.conversation_id': UUID,
    'messaging.babelqueue.attempts': 2,
    [A + 'outcome']: 'run-ok',
    [A + 'disposition']: 'ack',
    [A + 'duplicate']: false,
    [A + 'mode']: 'seen-set',
    [A + 'claimed']: false,
  });
  const vector = VECTORS.trace_ids.find((v) => v.trace_id === UUID);
  assert.equal(span.spanContext().traceId, vector.trace_id_hex);
  assert.equal(parentOf(span), vector.parent_span_id);
  assert.equal(span.status.code, SpanStatusCode.UNSET);
});

test('a redelivery is a duplicate: outcome skip, duplicate true, the handler not run', async () => {
  const store = new bq.InMemoryStore();
  let runs = 0;
  await bq.dedupe(envelope('m-1'), store, () => runs++, { tracer });
  exporter.reset();
  const outcome = await bq.dedupe(envelope('m-1'), store, () => runs++, { tracer });
  assert.equal(outcome.kind, 'skip');
  assert.equal(runs, 1);
  const [span] = consumers();
  assert.equal(span.attributes[A + 'outcome'], 'skip');
  assert.equal(span.attributes[A + 'duplicate'], true);
  assert.equal(span.attributes[A + 'disposition'], 'ack');
});

test('every trace_id vector: the trace id and parent span id the Node SDK derives', async () => {
  const store = new bq.InMemoryStore();
  const envs = VECTORS.trace_ids.map((v, i) => envelope(`v-${i}`, { trace_id: v.trace_id }));
  assert.ok(envs.length >= 20);
  await bq.dedupeBatch(envs, store, () => {}, { tracer });
  const byId = new Map(consumers().map((s) => [s.attributes['messaging.message.id'], s]));
  VECTORS.trace_ids.forEach((v, i) => {
    const span = byId.get(`v-${i}`);
    assert.equal(span.spanContext().traceId, v.trace_id_hex, `trace_id ${JSON.stringify(v.trace_id)}`);
    assert.equal(parentOf(span), v.parent_span_id, `trace_id ${JSON.stringify(v.trace_id)}`);
    assert.equal(span.parentSpanContext.isRemote, true);
  });
});

test('a failing handler: status ERROR with the reason, the exception event from what it threw', async () => {
  const store = new bq.InMemoryStore();
  const outcome = await bq.dedupe(envelope('m-2'), store, () => {
    throw new RangeError('card declined');
  }, { tracer });
  assert.equal(outcome.kind, 'run-failed');
  const [span] = consumers();
  assert.equal(span.attributes[A + 'outcome'], 'run-failed');
  assert.equal(span.attributes[A + 'disposition'], 'retry');
  assert.equal(span.status.code, SpanStatusCode.ERROR);
  assert.equal(span.status.message, outcome.reason);
  const [event] = span.events;
  assert.equal(event.name, 'exception');
  assert.equal(event.attributes['exception.type'], 'RangeError');
  assert.equal(event.attributes['exception.message'], 'card declined');
});

test('an error from another realm keeps its type and stack; a thrown string is the message, as the Node SDK records it', async () => {
  const { runInNewContext } = await import('node:vm');
  const foreign = runInNewContext('new TypeError("from a vm")');
  assert.equal(foreign instanceof Error, false, 'another realm\'s Error');
  const store = new bq.InMemoryStore();
  await bq.dedupe(envelope('realm-1'), store, () => { throw foreign; }, { tracer });
  await bq.dedupe(envelope('realm-2'), store, () => { throw 'out of stock'; }, { tracer });
  const [vm, text] = ['realm-1', 'realm-2'].map((id) => consumers().find((s) => s.attributes['messaging.message.id'] === id).events[0]);
  assert.equal(vm.attributes['exception.type'], 'TypeError');
  assert.equal(vm.attributes['exception.message'], 'from a vm');
  assert.ok(vm.attributes['exception.stacktrace'], 'its stack');
  assert.equal(text.attributes['exception.message'], 'out of stock');
  assert.equal(text.attributes['exception.type'], undefined);
});

test('the handler runs inside its delivery\'s span: its own spans are children, across an await', async () => {
  const store = mapStore('async', { batch: true });
  const seen = [];
  const handler = async (env) => {
    await new Promise((r) => setTimeout(r, 2));
    tracer.startActiveSpan(`charge ${env.meta.id}`, (child) => {
      seen.push(trace.getActiveSpan() === child);
      child.end();
    });
  };
  await bq.dedupeBatch([envelope('h-1'), envelope('h-2')], store, handler, { tracer });
  assert.deepEqual(seen, [true, true]);
  for (const id of ['h-1', 'h-2']) {
    const delivery = consumers().find((s) => s.attributes['messaging.message.id'] === id);
    const child = spans().find((s) => s.name === `charge ${id}`);
    assert.equal(parentOf(child), delivery.spanContext().spanId);
    assert.equal(child.spanContext().traceId, delivery.spanContext().traceId);
  }
});

test('claiming, a batch with an in-batch duplicate: leader claimed, follower a duplicate; store calls are CLIENT spans linked to their deliveries', async () => {
  const store = mapStore('async', { claims: true, batch: true });
  const envs = [envelope('c-1', { trace_id: 'a' }), envelope('c-1', { trace_id: 'b' }), envelope('c-2', { trace_id: 'c' })];
  const outcomes = await bq.dedupeBatch(envs, store, () => {}, { tracer, claimLeaseMs: 30_000 });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'skip', 'run-ok']);
  const [leader, follower, other] = ['a', 'b', 'c'].map((t) => consumers().find((s) => s.attributes['messaging.message.conversation_id'] === t));
  assert.equal(leader.attributes[A + 'claimed'], true);
  assert.equal(leader.attributes[A + 'mode'], 'claiming');
  assert.equal(leader.attributes[A + 'duplicate'], false);
  assert.equal(follower.attributes[A + 'duplicate'], true);
  assert.equal(follower.attributes[A + 'claimed'], false);
  assert.equal(other.attributes[A + 'claimed'], true);

  const calls = clients();
  assert.deepEqual(calls.map((s) => s.name).sort(), store.calls.map((c) => `bq-dedupe ${c.replace(/[A-Z]/g, (x) => `_${x.toLowerCase()}`)}`).sort());
  const claim = calls.find((s) => s.name === 'bq-dedupe claim_many');
  assert.equal(claim.attributes[A + 'store.operation'], 'claim_many');
  assert.equal(claim.attributes[A + 'store.kind'], 'custom');
  assert.equal(claim.attributes[A + 'store.keys'], 2);
  const linked = claim.links.map((l) => l.context.spanId).sort();
  assert.deepEqual(linked, [leader, other].map((s) => s.spanContext().spanId).sort());
});

test('a single delivery\'s store calls are children of its span', async () => {
  const store = mapStore('async');
  await bq.dedupe(envelope('s-1'), store, () => {}, { tracer });
  const [delivery] = consumers();
  assert.deepEqual(clients().map((s) => s.name), ['bq-dedupe seen', 'bq-dedupe remember']);
  for (const call of clients()) assert.equal(parentOf(call), delivery.spanContext().spanId);
});

test('a store call that fails: its span has status ERROR, the delivery\'s the store-unavailable outcome', async () => {
  const store = {
    seen: async () => {
      throw new Error('connection refused');
    },
    remember: async () => {},
    forget: async () => {},
  };
  const outcome = await bq.dedupe(envelope('f-1'), store, () => {}, { tracer });
  assert.equal(outcome.kind, 'store-unavailable');
  const [call] = clients();
  assert.equal(call.status.code, SpanStatusCode.ERROR);
  assert.equal(call.status.message, 'connection refused');
  const [delivery] = consumers();
  assert.equal(delivery.attributes[A + 'outcome'], 'store-unavailable');
  assert.equal(delivery.status.code, SpanStatusCode.ERROR);
  assert.equal(delivery.events.length, 0, 'not the handler\'s failure: no exception event');
});

test('a body that is not an envelope still gets its span: what can be read of it, and rejected', async () => {
  const store = new bq.InMemoryStore();
  const hashed = VECTORS.trace_ids.find((v) => v.derived_by !== 'hex');
  const outcomes = await bq.dedupeBatch(['not json', JSON.stringify({ job: 'j', trace_id: hashed.trace_id, meta: 'no' })], store, () => {}, { tracer });
  assert.deepEqual(outcomes.map((o) => o.kind), ['rejected', 'rejected']);
  const [bad, shaped] = consumers().sort((a, b) => a.name.localeCompare(b.name));
  assert.equal(bad.name, 'process ');
  assert.equal(bad.attributes['messaging.message.id'], '');
  assert.equal(bad.attributes['messaging.babelqueue.attempts'], 0);
  assert.equal(bad.parentSpanContext, undefined, 'no trace_id: a trace of its own');
  assert.equal(bad.status.code, SpanStatusCode.ERROR);
  assert.equal(shaped.name, 'process j');
  assert.equal(shaped.attributes[A + 'disposition'], 'poison');
  assert.equal(shaped.spanContext().traceId, hashed.trace_id_hex);
  assert.equal(parentOf(shaped), hashed.parent_span_id);
});

test('wrap takes the tracer too', async () => {
  const store = new bq.InMemoryStore();
  const run = bq.wrap(store, () => {}, { tracer });
  await run(envelope('w-1'));
  await run(envelope('w-1'));
  assert.deepEqual(consumers().map((s) => s.attributes[A + 'outcome']), ['run-ok', 'skip']);
});

test('a tracer that throws loses its spans, never a delivery', async () => {
  const broken = {
    startSpan() {
      throw new Error('exporter down');
    },
  };
  const store = mapStore('sync', { batch: true });
  let runs = 0;
  const outcomes = await bq.dedupeBatch([envelope('b-1'), envelope('b-2')], store, () => runs++, { tracer: broken });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-ok']);
  assert.equal(runs, 2);
  const again = await bq.dedupe(envelope('b-1'), store, () => runs++, { tracer: broken });
  assert.equal(again.kind, 'skip');

  const halfBroken = {
    startSpan: (...args) => {
      const span = tracer.startSpan(...args);
      span.setAttributes = () => {
        throw new Error('no attributes today');
      };
      return span;
    },
  };
  const last = await bq.dedupe(envelope('b-3'), store, () => runs++, { tracer: halfBroken });
  assert.equal(last.kind, 'run-ok');
  assert.ok(consumers().some((s) => s.attributes['messaging.message.id'] === 'b-3'), 'ended even so');
});

test('a tracer option that is not a tracer is a TypeError; no option, no span', async () => {
  const store = new bq.InMemoryStore();
  await assert.rejects(bq.dedupe(envelope('t-1'), store, () => {}, { tracer: {} }), TypeError);
  await bq.dedupe(envelope('t-2'), store, () => {});
  assert.equal(spans().length, 0);
});

test('a store the guard refuses rejects before any span starts: none is left open (a review)', async () => {
  let open = 0;
  const counting = {
    startSpan: (...args) => {
      const span = tracer.startSpan(...args);
      open++;
      const end = span.end.bind(span);
      span.end = (...a) => { open--; return end(...a); };
      return span;
    },
  };
  const noClaims = { seen: async () => false, remember: async () => {}, forget: async () => {} };
  const options = { tracer: counting, claimLeaseMs: 5000 };
  await assert.rejects(bq.dedupeBatch([envelope('r-1'), envelope('r-2')], noClaims, () => {}, options), TypeError);
  await assert.rejects(bq.dedupe(envelope('r-3'), noClaims, () => {}, options), TypeError);
  assert.equal(open, 0);
});

// Review findings: the traced store must behave exactly as the store itself.

test('a store whose lease methods are locked (non-writable, non-configurable) still renews its claims when traced: one run', async () => {
  const done = new Map();
  const claims = new Map();
  let n = 0;
  const live = (k) => claims.has(k) && claims.get(k).until > Date.now();
  const owns = (k, t) => claims.get(k)?.token === t;
  const store = {
    seen: async (k) => done.has(k),
    remember: async (k) => { done.set(k, 1); claims.delete(k); },
    forget: async (k) => { done.delete(k); claims.delete(k); },
    claim: async (k, lease) => {
      if (done.has(k)) return { state: 'seen' };
      if (live(k)) return { state: 'held' };
      claims.set(k, { token: `t${++n}`, until: Date.now() + lease });
      return { state: 'acquired', token: `t${n}` };
    },
    release: async (k, t) => { if (owns(k, t)) claims.delete(k); },
  };
  Object.defineProperty(store, 'renew', { value: async (k, t, lease) => owns(k, t) && ((claims.get(k).until = Date.now() + lease), true) });
  Object.defineProperty(store, 'rememberFenced', { value: async (k, t) => owns(k, t) && (done.set(k, 1), claims.delete(k), true) });
  Object.freeze(store);
  let runs = 0;
  const handler = async () => { runs++; await new Promise((r) => setTimeout(r, 600)); };
  const options = { claimLeaseMs: 200, tracer };
  const first = bq.dedupe(envelope('lock-1'), store, handler, options);
  await new Promise((r) => setTimeout(r, 350)); // past the lease the claim began with
  const second = await bq.dedupe(envelope('lock-1'), store, handler, options);
  assert.equal(second.kind, 'park');
  assert.equal((await first).kind, 'run-ok');
  assert.equal(runs, 1);
});

test('a store whose methods are getters over private fields, or that answers with thenables, is called as itself', async () => {
  class Store {
    #done = new Set();
    get seen() { return (k) => this.#done.has(k); }
    get remember() { return (k) => { this.#done.add(k); }; }
    get forget() { return (k) => { this.#done.delete(k); }; }
  }
  assert.equal((await bq.dedupe(envelope('g-1'), new Store(), () => {}, { tracer })).kind, 'run-ok');

  let executions = 0;
  const once = (value) => {
    let ran = false;
    return { then(resolve, reject) { executions++; if (ran) reject(new Error('query already executed')); else { ran = true; resolve(value); } } };
  };
  const done = new Set();
  const lazy = { seen: (k) => once(done.has(k)), remember: (k) => once(done.add(k) && undefined), forget: (k) => once(done.delete(k)) };
  assert.equal((await bq.dedupe(envelope('q-1'), lazy, () => {}, { tracer })).kind, 'run-ok');
  assert.equal((await bq.dedupe(envelope('q-1'), lazy, () => {}, { tracer })).kind, 'skip');
  assert.equal(executions, 3, 'each thenable\'s then called once');
});

test('a tracer whose spans are not spans, or no crypto.subtle: outcomes as without a tracer', async () => {
  const nulls = { startSpan: () => null };
  const store = mapStore('sync', { batch: true });
  const outcomes = await bq.dedupeBatch([envelope('n-1'), envelope('n-2')], store, () => {}, { tracer: nulls });
  assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-ok']);

  const crypto = Object.getOwnPropertyDescriptor(globalThis, 'crypto');
  Object.defineProperty(globalThis, 'crypto', { value: undefined, configurable: true });
  try {
    const [o] = await bq.dedupeBatch([envelope('n-3', { trace_id: 'not a uuid' })], store, () => {}, { tracer });
    assert.equal(o.kind, 'run-ok');
  } finally {
    Object.defineProperty(globalThis, 'crypto', crypto);
  }
  const [span] = consumers().filter((s) => s.attributes['messaging.message.id'] === 'n-3');
  assert.equal(span.parentSpanContext, undefined, 'no parent to derive it with: a trace of its own');
});

test('bad arguments with a tracer: wrap refuses a non-tracer at once; a bad store is the usual TypeError and starts no span', async () => {
  assert.throws(() => bq.wrap(new bq.InMemoryStore(), () => {}, { tracer: {} }), TypeError);
  await assert.rejects(bq.dedupe(envelope('x-1'), 42, () => {}, { tracer }), /store must be/);
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(spans().length, 0);
});

test('the handler keeps the caller\'s context (its baggage) under the delivery\'s span', async () => {
  const key = Symbol.for('bq-test-key');
  const outer = context.active().setValue(key, 'tenant-7');
  let seen;
  await context.with(outer, () => bq.dedupe(envelope('ctx-1'), new bq.InMemoryStore(), () => {
    seen = [context.active().getValue(key), trace.getActiveSpan()?.name];
  }, { tracer }));
  assert.deepEqual(seen, ['tenant-7', 'process urn:babel:orders:created']);
});

test('a context manager that throws, skips or repeats the handler: each handler runs once, its own outcome kept', async () => {
  const handlerError = new Error('card declined');
  const managers = {
    'throws before': (cx, fn) => {
      throw new Error('context manager broken');
    },
    'throws after': (cx, fn, thisArg, ...args) => {
      fn.call(thisArg, ...args);
      throw new Error('context manager broken after the handler');
    },
    'never calls it': () => undefined,
    'calls it twice': (cx, fn, thisArg, ...args) => {
      fn.call(thisArg, ...args);
      return fn.call(thisArg, ...args);
    },
    'returns another value': (cx, fn, thisArg, ...args) => {
      fn.call(thisArg, ...args);
      return Promise.reject(new Error('not the handler\'s answer'));
    },
    'calls it in a microtask': (cx, fn, thisArg, ...args) => {
      queueMicrotask(() => fn.call(thisArg, ...args));
    },
    'calls it on a timer, then throws': (cx, fn, thisArg, ...args) => {
      setTimeout(() => fn.call(thisArg, ...args), 0);
      throw new Error('context manager broken');
    },
    'calls it later and returns that': (cx, fn, thisArg, ...args) => Promise.resolve().then(() => fn.call(thisArg, ...args)),
    'wraps its answer in a thenable': (cx, fn, thisArg, ...args) => {
      const r = fn.call(thisArg, ...args);
      return r && typeof r.then === 'function' ? { then: (ok, ko) => r.then(ok, ko) } : r;
    },
  };
  // A handler's answer may be lazy: a query builder runs its work on each then() (knex, Mongoose).
  const lazy = (work) => ({ then(ok, ko) { work(); return Promise.resolve().then(ok, ko); } });
  try {
    for (const [name, withFn] of Object.entries(managers)) {
      context.disable();
      context.setGlobalContextManager({ active: () => context.active(), with: withFn, bind: (_, t) => t, enable() { return this; }, disable() { return this; } });
      const store = mapStore('sync', { batch: true });
      let runs = 0;
      const one = await bq.dedupe(envelope(`cm-${name}`), store, () => { runs++; }, { tracer });
      assert.equal(one.kind, 'run-ok', name);
      const batch = await bq.dedupeBatch([envelope(`cm-${name}-a`), envelope(`cm-${name}-b`)], store, () => lazy(() => runs++), { tracer });
      assert.deepEqual(batch.map((o) => o.kind), ['run-ok', 'run-ok'], name);
      assert.equal(runs, 3, `${name}: each handler once`);
      const again = await bq.dedupe(envelope(`cm-${name}`), store, () => { runs++; }, { tracer });
      assert.equal(again.kind, 'skip', name);
      const failed = await bq.dedupeBatch([envelope(`cm-${name}-f`)], store, () => { runs++; throw handlerError; }, { tracer });
      assert.equal(failed[0].kind, 'run-failed', name);
      await new Promise((r) => setTimeout(r, 20)); // a deferred call of the manager's, if any
      assert.equal(runs, 4, `${name}: the failing handler once`);
    }
  } finally {
    context.disable();
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  }
});

test('a context manager whose with() getter throws, or whose contexts answer setValue with undefined: the handler runs once without it', async () => {
  const brokenGetter = { active: () => context.active(), get with() { throw new Error('with getter broken'); }, bind: (_, t) => t, enable() { return this; }, disable() { return this; } };
  const mutable = { values: new Map(), getValue(k) { return this.values.get(k); }, setValue(k, v) { this.values.set(k, v); }, deleteValue(k) { this.values.delete(k); } };
  const mockManager = { active: () => mutable, with: (cx, fn, t, ...a) => fn.call(t, ...a), bind: (_, t) => t, enable() { return this; }, disable() { return this; } };
  try {
    for (const [name, manager] of Object.entries({ brokenGetter, mockManager })) {
      context.disable();
      context.setGlobalContextManager(manager);
      const store = mapStore('sync', { batch: true });
      let runs = 0;
      const one = await bq.dedupe(envelope(`cg-${name}`), store, () => { runs++; }, { tracer });
      const batch = await bq.dedupeBatch([envelope(`cg-${name}-a`), envelope(`cg-${name}-b`)], store, () => { runs++; }, { tracer });
      assert.deepEqual([one, ...batch].map((o) => o.kind), ['run-ok', 'run-ok', 'run-ok'], name);
      assert.equal(runs, 3, name);
    }
  } finally {
    context.disable();
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  }
});

test('every traceparent vector: the parent the Node SDK takes from the transport\'s headers, else the one trace_id names', async () => {
  const store = new bq.InMemoryStore();
  for (const [n, v] of VECTORS.traceparents.entries()) {
    const id = `tp-${n}`;
    const env = envelope(id, { trace_id: v.envelope_trace_id });
    const outcome = await bq.dedupe(env, store, () => {}, { tracer, headers: v.headers ?? undefined });
    assert.equal(outcome.kind, 'run-ok', v.note);
    const span = consumers().find((s) => s.attributes['messaging.message.id'] === id);
    if (v.result === 'traceparent' && (v.parent_trace_flags & 1) === 0) {
      assert.equal(span, undefined, `${v.note}: the producer did not sample it, nor does the default sampler`);
      continue;
    }
    const parent = span.parentSpanContext;
    if (v.result === 'traceparent') {
      assert.equal(parent.traceId, v.parent_trace_id, v.note);
      assert.equal(parent.spanId, v.parent_span_id, v.note);
      assert.equal(parent.traceFlags, v.parent_trace_flags, v.note);
      assert.equal(parent.isRemote, true, v.note);
      assert.equal(parent.traceState?.serialize() ?? null, v.tracestate, v.note);
      assert.equal(span.spanContext().traceState?.serialize() ?? null, v.tracestate, `${v.note}: the span carries it`);
    } else {
      const derived = VECTORS.trace_ids.find((t) => t.trace_id === v.envelope_trace_id);
      assert.equal(parent.spanId, derived.parent_span_id, `${v.note}: the trace_id's parent`);
    }
  }
});

test('headers for a batch: an array by index or a function of the index; a getter that throws, or none, is the trace_id parent', async () => {
  const tp = (span) => ({ traceparent: `00-4bf92f3577b34da6a3ce929d0e0e4736-${span}-01` });
  const store = mapStore('sync', { batch: true });
  const ids = ['h-0', 'h-1', 'h-2'];
  await bq.dedupeBatch(ids.map((id) => envelope(id, { trace_id: UUID })), store, () => {}, {
    tracer, headers: [tp('00000000000000a0'), undefined, tp('00000000000000a2')],
  });
  const byFunction = async (i) => {
    if (i === 1) throw new Error('transport lost its headers');
    return tp(`00000000000000b${i}`);
  };
  const more = await bq.dedupeBatch(['g-0', 'g-1', 'g-2'].map((id) => envelope(id, { trace_id: UUID })), store, () => {}, { tracer, headers: byFunction });
  assert.deepEqual(more.map((o) => o.kind), ['run-ok', 'run-ok', 'run-ok']);
  const derived = VECTORS.trace_ids.find((t) => t.trace_id === UUID).parent_span_id;
  const parentOfId = (id) => parentOf(consumers().find((s) => s.attributes['messaging.message.id'] === id));
  assert.deepEqual(['h-0', 'h-1', 'h-2', 'g-0', 'g-1', 'g-2'].map(parentOfId),
    ['00000000000000a0', derived, '00000000000000a2', '00000000000000b0', derived, '00000000000000b2']);
  // wrap: a getter, read for each delivery, as the Node SDK's wrapHandler takes one.
  let calls = 0;
  const wrapped = bq.wrap(store, () => {}, { tracer, headers: () => { calls++; return tp('00000000000000c0'); } });
  await wrapped(envelope('w-0', { trace_id: UUID }));
  assert.equal(calls, 1);
  assert.equal(parentOfId('w-0'), '00000000000000c0');
  await assert.rejects(bq.dedupe(envelope('x-h'), store, () => {}, { tracer, headers: 'traceparent' }), /options\.headers must be/);
  assert.equal((await bq.dedupe(envelope('x-h'), store, () => {}, { tracer })).kind, 'run-ok', 'the refused call ran nothing');
  // A bad headers option is refused with or without a tracer, and by wrap
  // when wrapping: it was ignored until a tracer was added, then every
  // wrapped delivery rejected, retried until dead-lettered (a review).
  await assert.rejects(bq.dedupe(envelope('x-h2'), store, () => {}, { headers: 'traceparent' }), TypeError);
  assert.throws(() => bq.wrap(store, () => {}, { tracer, headers: '00-x' }), TypeError);
});

test('hostile headers lose the header, never the delivery: throwing getters, a Proxy, a getter that never settles; a Buffer is read as text', async () => {
  const throwing = { get traceparent() { throw new Error('boom'); } };
  const throwingState = { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', get tracestate() { throw new Error('boom'); } };
  const proxy = new Proxy({}, { get() { throw new Error('trap'); } });
  const store = mapStore('sync', { batch: true });
  let runs = 0;
  for (const [name, headers] of Object.entries({ throwing, throwingState, proxy, inArray: [throwing, proxy], fromFunction: () => proxy })) {
    const outcomes = await bq.dedupeBatch([envelope(`hh-${name}-a`), envelope(`hh-${name}-b`)], store, () => { runs++; }, { tracer, headers });
    assert.deepEqual(outcomes.map((o) => o.kind), ['run-ok', 'run-ok'], name);
  }
  assert.equal(runs, 10);
  const started = Date.now();
  const slow = await bq.dedupe(envelope('hh-never'), store, () => { runs++; }, { tracer, headers: () => new Promise(() => {}) });
  assert.equal(slow.kind, 'run-ok', 'a getter that never settles: no headers after a while');
  assert.ok(Date.now() - started < 3000, `waited ${Date.now() - started} ms`);
  // A tracestate getter that throws loses the tracestate only, not its traceparent.
  const stateless = consumers().find((s) => s.attributes['messaging.message.id'] === 'hh-throwingState-a');
  assert.equal(parentOf(stateless), '00f067aa0ba902b7', 'the traceparent kept beside a throwing tracestate');
  const buffer = Buffer.from('00-4bf92f3577b34da6a3ce929d0e0e4736-00000000000000d1-01');
  await bq.dedupe(envelope('hh-buffer', { trace_id: UUID }), store, () => {}, { tracer, headers: { traceparent: buffer } });
  const span = consumers().find((s) => s.attributes['messaging.message.id'] === 'hh-buffer');
  assert.equal(parentOf(span), '00000000000000d1', 'as the Node SDK reads it (the regex makes it a string)');
});

test('tracestate as @opentelemetry/api reads it (the Node SDK\'s createTraceState): a repeated key once, over 512 characters none, at most 32 keys', async () => {
  const tp = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
  const many = Array.from({ length: 40 }, (_, i) => `k${i}=v${i}`).join(',');
  const headers = ['a=1,b=2,a=3', `a=${'x'.repeat(250)},b=${'y'.repeat(250)},c=${'z'.repeat(20)}`, many, ' ok=2 , Bad Key=1', 'a=1,a=2,b=3',
    'x@y=1,=2,k=,k2=v 2 ,tenant1@sys=ok', 'k=a=b,m=c'];
  const store = new bq.InMemoryStore();
  for (const [n, header] of headers.entries()) {
    const expected = createTraceState(header).serialize();
    await bq.dedupe(envelope(`ts-${n}`), store, () => {}, { tracer, headers: { traceparent: tp, tracestate: header } });
    const span = consumers().find((s) => s.attributes['messaging.message.id'] === `ts-${n}`);
    assert.equal(span.parentSpanContext.traceState.serialize(), expected, header.slice(0, 40));
  }
});
