// The `tracer` option's JS half (a wasm-bindgen snippet, bound in src/otel.rs):
// BabelQueue's consumer span for each delivery, through the OpenTelemetry
// tracer the caller passed. What each delivery became (its outcome, whether it
// was a duplicate, whether it held a claim) is the core's, handed over by
// src/otel.rs; the attribute names come from the core's table too (passed to
// `startSpans`). Nothing here can change an outcome: a tracer that throws only
// loses its span.
//
// No import of @opentelemetry/api (an optional peer): a context is any object
// with getValue/setValue/deleteValue, the span in it sits under the key every
// copy of the API 1.x makes with createContextKey (a Symbol.for), and the
// context manager the SDK registered is read from the API's own global
// registration, as each copy of the API finds it.

const SPAN_KEY = Symbol.for('OpenTelemetry Context Key SPAN');
const API = Symbol.for('opentelemetry.js.api.1');
const CLIENT = 2;
const CONSUMER = 4;
const STATUS_ERROR = 2;
const SAMPLED = 1;

const encoder = new TextEncoder();
let decoder;
let names;

/** An immutable context (the API's BaseContext, which this module cannot import). */
class Ctx {
  constructor(values) {
    this.values = values;
  }
  getValue(key) {
    return this.values.get(key);
  }
  setValue(key, value) {
    return new Ctx(new Map(this.values).set(key, value));
  }
  deleteValue(key) {
    const values = new Map(this.values);
    values.delete(key);
    return new Ctx(values);
  }
}
const ROOT = new Ctx(new Map());

/** The remote parent a delivery's span starts under (the API's NonRecordingSpan). */
class Remote {
  constructor(spanContext) {
    this.sc = spanContext;
  }
  spanContext() {
    return this.sc;
  }
  isRecording() {
    return false;
  }
}

async function sha256Hex(text) {
  const digest = await crypto.subtle.digest('SHA-256', encoder.encode(text));
  let hex = '';
  for (const b of new Uint8Array(digest)) hex += b.toString(16).padStart(2, '0');
  return hex;
}

/**
 * The remote parent the BabelQueue SDKs derive from `trace_id`: its 32 hex
 * digits (dashes removed, not all zero), else the first 16 bytes of SHA-256;
 * the span id the first 8 bytes of SHA-256 of "babelqueue-span:" + trace_id,
 * never zero. Checked against the Node SDK's answers (tests/otel/trace_ids.json).
 */
export async function parentOf(traceId) {
  const hex = traceId.replace(/-/g, '').toLowerCase();
  const uuid = /^[0-9a-f]{32}$/.test(hex) && !/^0+$/.test(hex);
  const [trace, span] = await Promise.all([uuid ? hex : sha256Hex(traceId), sha256Hex(`babelqueue-span:${traceId}`)]);
  const spanId = span.slice(0, 16);
  return {
    traceId: trace.slice(0, 32),
    spanId: spanId === '0000000000000000' ? '0000000000000001' : spanId,
    traceFlags: SAMPLED,
    isRemote: true,
  };
}

// A W3C `traceparent` as the Node SDK reads it (its regex, @opentelemetry/core's):
// version not ff, non-zero ids, lowercase hex, a trailing part only after a
// version other than 00.
const TRACEPARENT = /^\s?((?!ff)[\da-f]{2})-((?![0]{32})[\da-f]{32})-((?![0]{16})[\da-f]{16})-([\da-f]{2})(-.*)?\s?$/;
const STATE_KEY = /^(?:[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})$/;
const STATE_VALUE = /^[ -~]{0,255}[!-~]$/;

/**
 * A `tracestate`, read and kept as @opentelemetry/api's own (the Node SDK's
 * `createTraceState`): over 512 characters, none; each member checked; a
 * repeated key once; at most 32; the members kept newest first in a Map.
 */
class TraceState {
  constructor(members = new Map()) {
    this.members = members;
  }
  static parse(header) {
    if (header.length > 512) return new TraceState();
    let members = header.split(',').reduceRight((agg, part) => {
      const member = part.trim();
      const at = member.indexOf('=');
      if (at !== -1) {
        const [key, value] = [member.slice(0, at), member.slice(at + 1)];
        if (STATE_KEY.test(key) && STATE_VALUE.test(value) && !/[,=]/.test(value)) agg.set(key, value);
      }
      return agg;
    }, new Map());
    if (members.size > 32) members = new Map([...members.entries()].reverse().slice(0, 32));
    return new TraceState(members);
  }
  get(key) {
    return this.members.get(key);
  }
  set(key, value) {
    const members = new Map(this.members);
    members.delete(key);
    return new TraceState(members.set(key, value));
  }
  unset(key) {
    const members = new Map(this.members);
    members.delete(key);
    return new TraceState(members);
  }
  serialize() {
    return [...this.members.keys()].reverse().map((k) => `${k}=${this.members.get(k)}`).join(',');
  }
}

/**
 * The remote parent a transport's headers name (`traceparent`, and its
 * `tracestate`, keys in lowercase as the Node SDK reads them), or undefined
 * where there is no valid one (the parent is then the one `trace_id` names).
 */
export function headerParent(carrier) {
  // Values as the SDK's regex reads them (a Buffer as its text); a getter
  // that throws, or a Proxy, is no header (telemetry never fails a delivery).
  return quietly(() => {
    const header = carrier?.traceparent;
    const m = header ? TRACEPARENT.exec(String(header)) : null;
    if (m === null || (m[1] === '00' && m[5] !== undefined)) return undefined;
    const parent = { traceId: m[2], spanId: m[3], traceFlags: parseInt(m[4], 16), isRemote: true };
    // Its own guard: a tracestate that throws loses only itself.
    const state = quietly(() => {
      const value = carrier.tracestate;
      return value ? TraceState.parse(String(value)) : undefined;
    });
    if (state) parent.traceState = state;
    return parent;
  });
}

/**
 * Delivery `i`'s headers from the `headers` option, as `{ carrier }` (never
 * awaited as it is: a carrier may be a Proxy that throws on `then`): one
 * carrier for every delivery, an array of them by index, or a function of
 * the index (a promise of its answer). A getter that throws, or does not
 * answer within a second, is no headers: telemetry never fails a delivery.
 */
function carrierOf(headers, i) {
  if (typeof headers !== 'function') return { carrier: quietly(() => (Array.isArray(headers) ? headers[i] : headers)) };
  return (async () => {
    let timer;
    try {
      const late = new Promise((resolve) => {
        timer = setTimeout(resolve, HEADERS_WAIT_MS);
      });
      return { carrier: await Promise.race([headers(i), late]) };
    } catch {
      return {};
    } finally {
      clearTimeout(timer);
    }
  })();
}

/** How long a `headers` function may take before its delivery goes on without it. */
const HEADERS_WAIT_MS = 1000;

/**
 * The context a delivery's span starts in: `base` under the parent its
 * `trace_id` names, else (none, or no `crypto.subtle` to derive it with) with
 * no span, so the delivery starts a trace of its own.
 */
async function parentContext(base, traceId) {
  try {
    if (traceId !== undefined) return base.setValue(SPAN_KEY, new Remote(await parentOf(traceId)));
  } catch {
    // no parent to derive
  }
  return quietly(() => base.deleteValue(SPAN_KEY)) ?? ROOT;
}

/** What a span can read of an envelope, valid or not (as the core's `telemetry::Fields`). */
function fieldsOf(item) {
  let o;
  try {
    const text = typeof item === 'string' ? item : (decoder ??= new TextDecoder()).decode(item);
    o = text.length <= 1 << 20 ? JSON.parse(text) : undefined;
  } catch {
    o = undefined;
  }
  if (o === null || typeof o !== 'object' || Array.isArray(o)) o = {};
  const meta = o.meta !== null && typeof o.meta === 'object' ? o.meta : {};
  const text = (v) => (typeof v === 'string' ? v : '');
  return {
    job: text(o.job ?? o.urn),
    queue: text(meta.queue),
    id: text(meta.id),
    traceId: typeof o.trace_id === 'string' ? o.trace_id : undefined,
    attempts: Number.isSafeInteger(o.attempts) ? o.attempts : 0,
  };
}

/** The attribute names, in the order of the core's list (src/otel.rs `NAMES`). */
function namesOf(list) {
  const [system, operation, destination, id, conversation, attempts, outcome, disposition, duplicate, mode, claimed, storeOp, storeKind, storeKeys] = list;
  return { system, operation, destination, id, conversation, attempts, outcome, disposition, duplicate, mode, claimed, storeOp, storeKind, storeKeys };
}

/** Calls into the tracer: what it throws costs its span, never the delivery. */
function quietly(f) {
  try {
    return f();
  } catch {
    return undefined;
  }
}

/**
 * The spans of one call's deliveries (`list`: the attribute names, from the
 * core's `telemetry::attr`; `deliveries`: the envelopes as
 * `Deliveries` holds them; `keys`: each one's store key or null), started
 * under their parents (the `headers` option's `traceparent`, else the one
 * `trace_id` names); `deliveries.spans` is set so its handlers run inside
 * them. Resolves to the store the guard is to call: `store` with each call
 * traced, unless it is the in-memory store (`memory`: no round trip, no JS
 * call to trace).
 */
export async function startSpans(list, tracer, deliveries, keys, mode, store, memory, headers) {
  if (headers !== undefined && headers !== null && typeof headers !== 'object' && typeof headers !== 'function') {
    throw new TypeError('options.headers must be { traceparent, tracestate }, an array of them (one per envelope) or a function of the envelope\'s index');
  }
  names ??= namesOf(list);
  const items = deliveries.items;
  const fields = items.map((item) => (item === undefined ? fieldsOf('') : fieldsOf(item)));
  // The caller's context (its baggage, its values) with the delivery's parent
  // in place of its span: read now, in the caller's call.
  const manager = globalThis[API]?.context;
  const base = quietly(() => manager?.active()) ?? ROOT;
  const parents = await Promise.all(fields.map(async (f, i) => {
    const got = headers == null ? {} : carrierOf(headers, i);
    const remote = headerParent((got instanceof Promise ? await got : got).carrier);
    return (remote && quietly(() => base.setValue(SPAN_KEY, new Remote(remote)))) ?? parentContext(base, f.traceId);
  }));
  const spans = new Spans(tracer, mode, parents, manager);
  // Not an object: no store at all, which the guard refuses with its own message.
  const object = store !== null && (typeof store === 'object' || typeof store === 'function');
  spans.store = memory || !object ? store : spans.tracedStore(store);
  for (let i = 0; i < fields.length; i++) {
    const f = fields[i];
    const attributes = {
      [names.system]: 'babelqueue',
      [names.operation]: 'process',
      [names.destination]: f.queue,
      [names.id]: f.id,
      [names.conversation]: f.traceId ?? '',
      [names.attempts]: f.attempts,
    };
    spans.spans[i] = quietly(() => tracer.startSpan(`process ${f.job}`, { kind: CONSUMER, attributes }, parents[i]));
    const key = keys[i];
    if (typeof key === 'string' && !spans.byKey.has(key)) spans.byKey.set(key, i);
  }
  deliveries.spans = spans;
  return spans.store;
}

/** Ends the span of delivery `i` of `deliveries` (see `Spans.end`). */
export function endSpan(deliveries, i, kind, disposition, flags, reason, error) {
  deliveries.spans?.end(i, kind, disposition, flags, reason, error);
}

class Spans {
  constructor(tracer, mode, parents, manager) {
    this.tracer = tracer;
    this.mode = mode;
    this.parents = parents;
    this.spans = [];
    this.byKey = new Map();
    /** The context manager the SDK registered (undefined: none). */
    this.manager = manager;
    this.store = undefined;
  }

  /** Delivery `i`'s span in its parent's context (undefined: none to give). */
  context(i) {
    const span = this.spans[i];
    return span == null ? undefined : quietly(() => this.parents[i].setValue(SPAN_KEY, span));
  }

  /**
   * Runs `f` (a handler) once with delivery `i`'s span current, where a
   * context manager is registered. The manager is telemetry and cannot change
   * an outcome: if it throws or never calls `f`, `f` runs without it; if it
   * calls `f` again, the first run's answer stands; what `f` returned or
   * threw is the answer, whatever the manager made of it.
   */
  run(i, f) {
    const manager = this.manager;
    const cx = this.context(i);
    const withFn = quietly(() => manager?.with);
    if (cx == null || typeof withFn !== 'function') return f();
    let ran = false;
    let threw = false;
    let answer;
    const once = () => {
      // A second call (a repeat, or the manager's own after we ran `f`
      // without it) gets the answer, and never a throw to its caller.
      if (ran) return threw ? undefined : answer;
      ran = true;
      try {
        return (answer = oneSettlement(f()));
      } catch (e) {
        threw = true;
        answer = e;
        throw e;
      }
    };
    try {
      const other = withFn.call(manager, cx, once);
      // Not the handler's answer: a rejection of it is the manager's, not
      // unhandled (a native promise only: a foreign `then` may run work).
      if (other !== answer && other instanceof Promise) other.catch(() => {});
    } catch {
      // the manager's own failure, or the handler's (below)
    }
    // Not called (yet: a manager may call it later, which then runs nothing).
    if (!ran) return once();
    if (threw) throw answer;
    return answer;
  }

  /**
   * The store the guard calls, each call a CLIENT span `bq-dedupe <call>`: the
   * child of the one delivery whose keys it carries, else linked to each.
   */
  tracedStore(store) {
    const spans = this;
    // Over an empty target, reading the store's own properties with the store
    // as the receiver: a getter or a method sees the store as `this` (private
    // fields work), and a frozen store's methods can still be wrapped.
    return new Proxy(Object.create(null), {
      get(_, name) {
        const value = Reflect.get(store, name, store);
        if (typeof value !== 'function' || typeof name !== 'string') return value;
        return function (...args) {
          const span = spans.storeSpan(name, args);
          if (span == null) return value.apply(store, args);
          let result;
          try {
            result = value.apply(store, args);
          } catch (e) {
            spans.endStoreSpan(span, e);
            throw e;
          }
          if (typeof result?.then !== 'function') {
            spans.endStoreSpan(span);
            return result;
          }
          // Its `then` called once, here: a thenable may run its work on each
          // call (a query builder); the guard awaits this promise instead.
          const settled = Promise.resolve(result);
          settled.then(
            () => spans.endStoreSpan(span),
            (e) => spans.endStoreSpan(span, e),
          );
          return settled;
        };
      },
    });
  }

  storeSpan(name, args) {
    const op = name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
    const keys = keysOf(args);
    const carried = [...new Set(keys.map((k) => this.byKey.get(k)).filter((i) => i !== undefined && this.spans[i] != null))];
    const attributes = { [names.storeOp]: op, [names.storeKind]: 'custom', [names.storeKeys]: keys.length };
    return quietly(() => {
      if (carried.length === 1) return this.tracer.startSpan(`bq-dedupe ${op}`, { kind: CLIENT, attributes }, this.context(carried[0]));
      const links = carried.map((i) => ({ context: this.spans[i].spanContext() }));
      return this.tracer.startSpan(`bq-dedupe ${op}`, { kind: CLIENT, attributes, links });
    });
  }

  endStoreSpan(span, error) {
    quietly(() => {
      if (error !== undefined) span.setStatus({ code: STATUS_ERROR, message: messageOf(error) });
      span.end();
    });
  }

  /**
   * Ends delivery `i`'s span with its outcome: `flags` bit 0 duplicate, 1
   * claimed, 2 failure (status ERROR with `reason`), 3 the handler failed
   * (the `exception` event, from what it threw).
   */
  end(i, kind, disposition, flags, reason, error) {
    const span = this.spans[i];
    if (span == null) return;
    this.spans[i] = undefined;
    quietly(() => {
      span.setAttributes({
        [names.outcome]: kind,
        [names.disposition]: disposition,
        [names.duplicate]: (flags & 1) !== 0,
        [names.mode]: this.mode,
        [names.claimed]: (flags & 2) !== 0,
      });
      if (flags & 4) {
        if (flags & 8) span.recordException(exceptionOf(error, reason ?? kind));
        span.setStatus({ code: STATUS_ERROR, message: reason ?? kind });
      }
    });
    quietly(() => span.end());
  }
}

/**
 * A handler's answer as one native promise where it is a foreign thenable:
 * its `then` called once, here. A lazy one (a query builder) runs its work
 * on each call, and a context manager may hand it on to be called again.
 */
function oneSettlement(answer) {
  try {
    const thenable = answer !== null && (typeof answer === 'object' || typeof answer === 'function') && typeof answer.then === 'function';
    return thenable && !(answer instanceof Promise) ? Promise.resolve(answer) : answer;
  } catch (e) {
    return Promise.reject(e);
  }
}

/** The store keys a store call carries: a key, an array of keys, or a settle step's claim references. */
function keysOf(args) {
  const first = args[0];
  if (typeof first === 'string') return [first];
  if (Array.isArray(first)) return first.filter((k) => typeof k === 'string');
  const keys = [];
  if (first !== null && typeof first === 'object') {
    for (const refs of Object.values(first)) {
      if (Array.isArray(refs)) for (const r of refs) if (typeof r?.key === 'string') keys.push(r.key);
    }
  }
  return keys;
}

/**
 * What a handler threw, as `recordException` takes it: an error (of any realm:
 * `instanceof` fails across them) or a string as it is, as the Node SDK
 * records them; anything else an `Error` with the outcome's reason.
 */
function exceptionOf(e, reason) {
  if (typeof e === 'string') return e;
  if (e !== null && typeof e === 'object' && typeof e.message === 'string') return e;
  return { name: 'Error', message: reason };
}

function messageOf(e) {
  return e instanceof Error ? e.message : String(e);
}
