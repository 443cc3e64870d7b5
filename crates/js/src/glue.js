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
/** Set in an `ends` entry whose envelope has no bytes (see `why`). */
const NO_BYTES = 0x80000000;

/** A batch's envelopes as given (JSON text, its bytes, or an object to stringify). */
export class Deliveries {
  constructor(envelopes) {
    // Strings and bytes stay as given; an object is replaced by its JSON text
    // (in a copy, never in the caller's array).
    this.items = envelopes;
    this.whys = null;
    this.next = 0;
    this.at = 0;
    this.pending = undefined;
    for (let i = 0; i < envelopes.length; i++) {
      const item = envelopes[i];
      if (typeof item === 'string' || item instanceof Uint8Array) continue;
      if (this.items === envelopes) this.items = Array.from(envelopes);
      this.items[i] = this.textOf(i, item);
    }
  }

  static one(envelope) {
    return new Deliveries([envelope]);
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
   * other, and each one's end offset into `ends` (`NO_BYTES` set where it has
   * none). Answers 0 when all are written, else how many bytes `buf` must hold
   * for the next call to go on from where this one stopped.
   */
  encode(buf, ends) {
    const items = this.items;
    let at = this.at;
    for (let i = this.next; i < items.length; i++) {
      const item = items[i];
      if (typeof item === 'string') {
        if (buf.length - at < item.length) return this.stop(i, at, 1);
        const { read, written } = encoder.encodeInto(item, buf.subarray(at));
        // Characters past U+007F take two or three bytes: room ran out.
        if (read < item.length) return this.stop(i, at, 3);
        at += written;
      } else if (item instanceof Uint8Array) {
        if (buf.length - at < item.length) return this.stop(i, at, 1);
        buf.set(item, at);
        at += item.length;
      } else {
        ends[i] = at | NO_BYTES;
        continue;
      }
      ends[i] = at;
    }
    this.next = items.length;
    this.at = at;
    return 0;
  }

  stop(i, at, perUnit) {
    this.next = i;
    this.at = at;
    let rest = 0;
    for (let j = i; j < this.items.length; j++) rest += this.items[j]?.length ?? 0;
    return at + rest * perUnit;
  }

  /** Why envelope `i` has no bytes: a message, or `{ thrown }` from JSON.stringify. */
  why(i) {
    return this.whys?.[i];
  }

  /**
   * Runs `handler` on envelope `i`, parsed from its own text. Answers
   * `undefined` when it returned (anything but a thenable), the thenable when it
   * returned one, `NEEDS_JOB` when the envelope has no `job`; throws what it threw.
   */
  run(i, handler) {
    const item = this.items[i];
    const envelope = JSON.parse(typeof item === 'string' ? item : (decoder ??= new TextDecoder()).decode(item));
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

function thenable(value) {
  return value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value.then === 'function'
    ? value
    : undefined;
}

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
 * `keys` cut at `ends` (UTF-16 offsets; `NO_BYTES`: a `null` key).
 */
export function outcomes(kinds, keys, ends) {
  const out = new Array(kinds.length);
  let at = 0;
  for (let i = 0; i < kinds.length; i++) {
    const t = KINDS[kinds[i]];
    const end = ends[i];
    let key = null;
    if (end !== NO_BYTES) {
      key = keys.slice(at, end);
      at = end;
    }
    out[i] = { kind: t.kind, disposition: t.disposition, ran: t.ran, key };
  }
  return out;
}
