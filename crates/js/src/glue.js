// The JS half of the package's crossings (a wasm-bindgen snippet, bound in
// src/crossing.rs). A call between wasm and JS costs more than most of the work
// it is for, so a batch crosses as few times as it can: its envelopes are
// written into wasm memory by one call, each handler runs from one call, and
// the batch's outcome objects are built here from their kinds and keys in one
// call. Nothing is decided here: what runs, and what each outcome is, is the
// core's.

const encoder = new TextEncoder();
let decoder;

/** Returned by `run` when the envelope has no `job` (the `urn` alias): call `runWithJob`. */
const NEEDS_JOB = 1;
/** What each envelope became, in `encode`'s `kinds`: its JSON text, its bytes, or nothing. */
const TEXT = 0;
const BYTES = 1;
const NO_BYTES = 2;

/** A batch's envelopes as given (JSON text, its bytes, or an object to stringify). */
export class Deliveries {
  constructor(envelopes) {
    // A copy taken first: the caller may reuse its array while handlers run
    // (the strings in it cannot change; the bytes are read back from the copy
    // in wasm memory that the core validated, see `run`). An object becomes
    // its JSON text here.
    const items = Array.from(envelopes);
    this.items = items;
    this.whys = null;
    this.next = 0;
    this.at = 0;
    this.pending = undefined;
    for (let i = 0; i < items.length; i++) {
      const item = items[i];
      if (typeof item === 'string' || isBytes(item)) continue;
      items[i] = this.textOf(i, item);
    }
  }

  static one(envelope) {
    return new Deliveries([envelope]);
  }

  /** How many envelopes (the copy's, whatever the caller's array does since). */
  get length() {
    return this.items.length;
  }

  textOf(i, item) {
    let why;
    if (item === undefined) {
      why = 'no envelope given (undefined)';
    } else {
      try {
        const text = JSON.stringify(item);
        if (typeof text === 'string') return text;
        why = 'the envelope is not JSON-serialisable';
      } catch (e) {
        why = { thrown: e };
      }
    }
    (this.whys ??= [])[i] = why;
    return undefined;
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
        if (buf.length - at < item.length) return this.stop(i, at, 1);
        const { read, written } = encoder.encodeInto(item, buf.subarray(at));
        // Characters past U+007F take two or three bytes: room ran out.
        if (read < item.length) return this.stop(i, at, 3);
        if (written !== read && !wellFormed(item)) {
          // A lone surrogate has no UTF-8 form: encoding would make it U+FFFD,
          // and two different ids the same key. Refused, as its escaped form is.
          (this.whys ??= [])[i] = 'the text has a lone surrogate (not well-formed UTF-16), so it has no UTF-8 form';
          kinds[i] = NO_BYTES;
          ends[i] = at;
          continue;
        }
        at += written;
        kinds[i] = TEXT;
      } else if (isBytes(item)) {
        if (buf.length - at < item.length) return this.stop(i, at, 1);
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
   * Where `encode` stopped, and the room it needs to go on: item `i` at up to
   * `perUnit` bytes per UTF-16 unit (3 once it is known not to be ASCII), the
   * rest at one (a later overflow asks again).
   */
  stop(i, at, perUnit) {
    this.next = i;
    this.at = at;
    let rest = 0;
    for (let j = i + 1; j < this.items.length; j++) rest += this.items[j]?.length ?? 0;
    return at + this.items[i].length * perUnit + rest;
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
   * one, `NEEDS_JOB` when the envelope has no `job`; throws what it threw.
   */
  run(i, handler, body) {
    const item = this.items[i];
    const envelope = JSON.parse(typeof item === 'string' ? item : (decoder ??= new TextDecoder()).decode(body));
    if (typeof envelope.job !== 'string') {
      this.pending = envelope;
      return NEEDS_JOB;
    }
    return thenable(handler(envelope));
  }

  /** `run` for the envelope it left pending, with `job` (from the core) filled in. */
  runWithJob(handler, job) {
    const envelope = this.pending;
    this.pending = undefined;
    envelope.job = job;
    return thenable(handler(envelope));
  }
}

/**
 * A `Uint8Array` (a Node `Buffer` too), also one made in another realm (a `vm`
 * context, a test runner's sandbox), where `instanceof` is false.
 */
function isBytes(item) {
  return item instanceof Uint8Array || (ArrayBuffer.isView(item) && Object.prototype.toString.call(item) === '[object Uint8Array]');
}

/** A lone surrogate: a high one not followed by a low one, or a low one not after a high one. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function wellFormed(text) {
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
  const t = KINDS[kind];
  let text = null;
  if (key !== undefined) text = ascii ? String.fromCharCode.apply(null, key) : (decoder ??= new TextDecoder()).decode(key);
  return { kind: t.kind, disposition: t.disposition, ran: t.ran, key: text };
}

/**
 * The batch's outcome objects: `kinds[i]` indexes `KINDS`, the keys are
 * `keys` cut at `ends` (UTF-16 offsets; `NO_KEY`: a `null` key).
 */
export function outcomes(kinds, keys, ends) {
  const out = new Array(kinds.length);
  let at = 0;
  for (let i = 0; i < kinds.length; i++) {
    const t = KINDS[kinds[i]];
    const end = ends[i];
    let key = null;
    if (end !== NO_KEY) {
      key = keys.slice(at, end);
      at = end;
    }
    out[i] = { kind: t.kind, disposition: t.disposition, ran: t.ran, key };
  }
  return out;
}
