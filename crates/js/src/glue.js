// The JS half of the package's crossings (a wasm-bindgen snippet, bound in
// src/crossing.rs). A call between wasm and JS costs more than most of the work
// it is for, so a batch crosses as few times as it can: its envelopes are
// written into wasm memory by one call, each handler runs from one call, and
// the batch's outcome objects are built here from their kinds and keys in one
// call. Nothing is decided here: what runs, and what each outcome is, is the
// core's.

const encoder = new TextEncoder();
let decoder;
/** Keys keep a leading U+FEFF: it is part of the id (the default decoder drops it). */
let keyDecoder;

/** Returned by `run` when the envelope has no `job` (the `urn` alias): call `runWithJob`. */
const NEEDS_JOB = 1;
/** What each envelope became, in `encode`'s `kinds`: its JSON text, its bytes, or nothing. */
const TEXT = 0;
const BYTES = 1;
const NO_BYTES = 2;

/** A batch's envelopes as given (JSON text, its bytes, or an object to stringify). */
export class Deliveries {
  constructor(envelopes) {
    // A copy taken first, by index (not through the array's iterator): the
    // caller may reuse its array while handlers run. The strings in it cannot
    // change; bytes become this module's own `Uint8Array` over the same memory
    // (read back from the copy the core validated, see `run`); an object
    // becomes its JSON text.
    const n = envelopes.length;
    const items = new Array(n);
    this.items = items;
    this.whys = null;
    this.next = 0;
    this.at = 0;
    this.pending = undefined;
    this.pendingAt = 0;
    /** The call's spans, with the `tracer` option (src/otel.js). */
    this.spans = undefined;
    for (let i = 0; i < n; i++) {
      const item = envelopes[i];
      if (typeof item === 'string') {
        items[i] = item;
        continue;
      }
      const bytes = this.bytesOf(i, item);
      items[i] = bytes === NOT_BYTES ? this.textOf(i, item) : bytes;
    }
  }

  /**
   * An envelope given as bytes (a `Uint8Array` from any realm, a `DataView`, an
   * `ArrayBuffer` or a `SharedArrayBuffer`) as this module's own `Uint8Array` over the same memory, read
   * through the built-in getters, so a subclass's `length` cannot lie;
   * `NOT_BYTES` for anything else; `undefined` (with why) for bytes that
   * cannot be read.
   */
  bytesOf(i, item) {
    if (item === null || typeof item !== 'object') return NOT_BYTES;
    try {
      const tag = typedArrayTag.call(item);
      if (tag === 'Uint8Array') return new Uint8Array(typedArrayBuffer.call(item), typedArrayOffset.call(item), typedArrayLength.call(item));
      if (tag !== undefined) return this.refuse(i, `a ${tag} is not an envelope: pass its bytes as a Uint8Array`);
      if (isA(dataViewLength, item)) return new Uint8Array(dataViewBuffer.call(item), dataViewOffset.call(item), dataViewLength.call(item));
      // Its length read once: a view of a growable buffer follows its growth,
      // and another thread's `grow` between two reads made the envelope bytes
      // never written (a review).
      if (isA(arrayBufferLength, item)) return new Uint8Array(item, 0, arrayBufferLength.call(item));
      if (isA(sharedArrayBufferLength, item)) return new Uint8Array(item, 0, sharedArrayBufferLength.call(item));
    } catch (e) {
      // (A detached buffer: no JSON.stringify was involved.)
      return this.refuse(i, `its bytes cannot be read: ${e instanceof Error ? e.message : String(e)}`);
    }
    return NOT_BYTES;
  }

  refuse(i, why) {
    (this.whys ??= [])[i] = why;
    return undefined;
  }

  static one(envelope) {
    return new Deliveries([envelope]);
  }

  /** How many envelopes (the copy's, whatever the caller's array does since). */
  get length() {
    return this.items.length;
  }

  textOf(i, item) {
    if (item === undefined) return this.refuse(i, 'no envelope given (undefined)');
    try {
      const text = JSON.stringify(item);
      if (typeof text === 'string') return text;
      return this.refuse(i, 'the envelope is not JSON-serialisable');
    } catch (e) {
      return this.refuse(i, { thrown: e });
    }
  }

  /**
   * Writes the envelopes' UTF-8 bytes into `buf` (wasm memory), one after the
   * other, each one's end offset into `ends` and what it was into `kinds`
   * (`TEXT`, `BYTES`, `NO_BYTES`). Answers 0 when all are written, else how
   * many bytes `buf` must hold for the next call to go on from where this one
   * stopped.
   */
  encode(buf, ends, kinds) {
    const items = this.items;
    let at = this.at;
    for (let i = this.next; i < items.length; i++) {
      const item = items[i];
      if (typeof item === 'string') {
        if (buf.length - at < item.length) return this.stop(i, at);
        const { read, written } = encoder.encodeInto(item, buf.subarray(at));
        // Characters past U+007F take two or three bytes: room ran out.
        if (read < item.length) return this.stop(i, at);
        if (written !== read && !wellFormed(item)) {
          // A lone surrogate has no UTF-8 form: encoding would make it U+FFFD,
          // and two different ids the same key. Refused, as its escaped form is.
          this.refuse(i, 'the text has a lone surrogate (not well-formed UTF-16), so it has no UTF-8 form');
          kinds[i] = NO_BYTES;
        } else {
          at += written;
          kinds[i] = TEXT;
        }
      } else if (item !== undefined) {
        if (buf.length - at < item.length) return this.stop(i, at);
        buf.set(item, at);
        at += item.length;
        kinds[i] = BYTES;
      } else {
        kinds[i] = NO_BYTES;
      }
      ends[i] = at;
    }
    this.next = items.length;
    this.at = at;
    return 0;
  }

  /**
   * Where `encode` stopped, and the room it needs to go on: a text outside
   * ASCII at 3 bytes per UTF-16 unit (its most), any other text and bytes at
   * their length.
   */
  stop(i, at) {
    this.next = i;
    this.at = at;
    let needed = at;
    for (let j = i; j < this.items.length; j++) {
      const item = this.items[j];
      if (typeof item === 'string') needed += NOT_ASCII.test(item) ? 3 * item.length : item.length;
      else if (item !== undefined) needed += item.length;
    }
    return needed;
  }

  /** Why envelope `i` has no bytes: a message, or `{ thrown }` from JSON.stringify. */
  why(i) {
    return this.whys?.[i];
  }

  /**
   * Runs `handler` on envelope `i`, parsed from its own text, or for bytes from
   * `body` (the copy in wasm memory the core validated, not the caller's
   * buffer, which may have changed or be shared memory). Answers `undefined`
   * when it returned (anything but a thenable), the thenable when it returned
   * one, `NEEDS_JOB` when the envelope has no usable `job`; throws what it threw.
   */
  run(i, handler, body) {
    const item = this.items[i];
    const envelope = JSON.parse(typeof item === 'string' ? item : (decoder ??= new TextDecoder()).decode(body));
    // Not a non-blank string: the core's (a blank `job` gives way to `urn`;
    // blank as Rust's `trim` reads it, which takes U+0085 and JS's does not).
    if (typeof envelope.job !== 'string' || !envelope.job.replace(/\u0085/g, '').trim()) {
      this.pending = envelope;
      this.pendingAt = i;
      return NEEDS_JOB;
    }
    return this.call(i, handler, envelope);
  }

  /** `run` for the envelope it left pending, with `job` (from the core) filled in. */
  runWithJob(handler, job) {
    const envelope = this.pending;
    this.pending = undefined;
    envelope.job = job;
    return this.call(this.pendingAt, handler, envelope);
  }

  /** Calls `handler`, inside delivery `i`'s span when the call is traced (src/otel.js). */
  call(i, handler, envelope) {
    const spans = this.spans;
    return thenable(spans === undefined ? handler(envelope) : spans.run(i, () => handler(envelope)));
  }
}

/** `bytesOf`'s answer for an envelope that is not bytes. */
const NOT_BYTES = Symbol('not bytes');
const NOT_ASCII = /[^\x00-\x7f]/;

// The built-in getters, which read an object's internal slots: they work on
// objects from any realm, and no subclass or proxy can fake their answers.
const getter = (proto, key) => Object.getOwnPropertyDescriptor(proto, key).get;
const TypedArray = Object.getPrototypeOf(Uint8Array.prototype);
const typedArrayTag = getter(TypedArray, Symbol.toStringTag); // undefined for a non-typed-array
const typedArrayBuffer = getter(TypedArray, 'buffer');
const typedArrayOffset = getter(TypedArray, 'byteOffset');
const typedArrayLength = getter(TypedArray, 'length');
const dataViewBuffer = getter(DataView.prototype, 'buffer');
const dataViewOffset = getter(DataView.prototype, 'byteOffset');
const dataViewLength = getter(DataView.prototype, 'byteLength');
const arrayBufferLength = getter(ArrayBuffer.prototype, 'byteLength');
// (Where there is none, a getter that reads nothing as one.)
const sharedArrayBufferLength =
  typeof SharedArrayBuffer === 'function' ? getter(SharedArrayBuffer.prototype, 'byteLength') : () => { throw new TypeError(); };

/** Is `item` what the built-in getter `get` reads (it throws on anything else)? */
function isA(get, item) {
  try {
    get.call(item);
    return true;
  } catch {
    return false;
  }
}

/** A lone surrogate (no lookbehind: older engines' regexes have none). */
const LONE_SURROGATE = /(?:^|[^\uD800-\uDBFF])[\uDC00-\uDFFF]|[\uD800-\uDBFF](?![\uDC00-\uDFFF])/;

/** Monotonic ms since the epoch: `performance`'s, else `Date.now()`. */
export function steadyNow() {
  const p = globalThis.performance;
  return p && typeof p.now === 'function' && typeof p.timeOrigin === 'number' ? p.timeOrigin + p.now() : Date.now();
}

export function wellFormed(text) {
  return typeof text.isWellFormed === 'function' ? text.isWellFormed() : !LONE_SURROGATE.test(text);
}

function thenable(value) {
  return value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value.then === 'function'
    ? value
    : undefined;
}

/** An `ends` entry of `outcomes` for an outcome without a key. */
const NO_KEY = 0xffffffff;

/** Per outcome kind (the core's index): `{ kind, disposition, ran }`. */
const KINDS = [];

export function defineKind(index, kind, disposition, ran) {
  KINDS[index] = { kind, disposition, ran };
}

/**
 * One delivery's outcome object. `key`: its UTF-8 bytes (a view of wasm
 * memory) or `undefined` for none; `ascii`: at most 256 bytes, each below
 * 0x80, so the bytes are the characters (a `TextDecoder` call costs more than
 * a short key; the bound keeps `apply` within any engine's argument limit).
 */
export function outcome(kind, key, ascii) {
  let text = null;
  if (key !== undefined) text = ascii ? String.fromCharCode.apply(null, key) : (keyDecoder ??= new TextDecoder('utf-8', { ignoreBOM: true })).decode(key);
  return outcomeObject(kind, text);
}

/** An outcome object: its kind's three fixed fields and its key (`null`: none). */
function outcomeObject(kind, key) {
  const t = KINDS[kind];
  return { kind: t.kind, disposition: t.disposition, ran: t.ran, key };
}

/**
 * The batch's outcome objects: `kinds[i]` indexes `KINDS`, the keys are
 * `keys` cut at `ends` (UTF-16 offsets; `NO_KEY`: a `null` key).
 */
export function outcomes(kinds, keys, ends) {
  const out = new Array(kinds.length);
  let at = 0;
  for (let i = 0; i < kinds.length; i++) {
    const end = ends[i];
    let key = null;
    if (end !== NO_KEY) {
      key = keys.slice(at, end);
      at = end;
    }
    out[i] = outcomeObject(kinds[i], key);
  }
  return out;
}
