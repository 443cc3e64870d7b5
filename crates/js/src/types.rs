//! The TypeScript interfaces of the package, emitted into the generated `.d.ts`
//! (wasm-bindgen's `typescript_custom_section`); the exported functions refer to
//! them through `unchecked_param_type` / `unchecked_return_type`. Checked by
//! `crates/js/tests/types-check.ts` (`tsc --noEmit --strict`, in `tests/types.test.mjs`).

use wasm_bindgen::prelude::*;

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &'static str = r#"
/** A BabelQueue envelope: JSON text, its UTF-8 bytes (a `Uint8Array`, a `DataView`, an `ArrayBuffer` or a `SharedArrayBuffer`), or a plain object (serialised with JSON.stringify). */
export type EnvelopeInput = string | Uint8Array | DataView | ArrayBufferLike | EnvelopeObject;

/** The schema_version-1 wire envelope (unknown fields are allowed and kept). */
export interface EnvelopeObject {
  job?: string;
  /** Inbound alias of `job`. */
  urn?: string;
  trace_id?: string;
  data?: Record<string, unknown>;
  meta?: { id?: string | null; schema_version?: number; queue?: string; lang?: string; created_at?: number; [field: string]: unknown };
  attempts?: number;
  dead_letter?: Record<string, unknown>;
  [field: string]: unknown;
}

/** What the handler receives: the delivered envelope, parsed, with `job` always set. */
export interface DecodedEnvelope {
  job: string;
  urn?: string;
  trace_id: string;
  data: Record<string, unknown>;
  /**
   * `id` is a non-empty string when the delivery was deduped; a fail-open handler
   * (no usable id) may see it absent, null, empty or of any other JSON type.
   */
  meta: { id?: unknown; schema_version: number; [field: string]: unknown };
  /** Absent when the producer did not set it. */
  attempts?: number;
  dead_letter?: Record<string, unknown>;
  [field: string]: unknown;
}

/** Your side effect. Throw (or reject) to fail: the id stays unmarked and the delivery is retried. */
export type Handler = (envelope: DecodedEnvelope) => unknown | Promise<unknown>;

/** A value or a promise of it: every store method may be sync or async. */
export type MaybePromise<T> = T | PromiseLike<T>;

/** The answer to a claim. */
export type ClaimResult = { state: "acquired"; token: string } | { state: "seen" } | { state: "held" };

/** A claim to give up or renew in a `Settlement`. */
export interface ClaimRef { key: string; token: string }

/**
 * One batch step for `DedupeStore.settle`: remember the ids whose handler succeeded
 * (fenced: with a `token`, only while that token still owns the claim), give up the
 * `release` claims, extend the `renew` claims to `leaseMs` from now where their
 * token still owns them.
 */
export interface Settlement {
  /** With `token`: see `rememberFenced`. Without: a plain `remember`. */
  remember: Array<{ key: string; token?: string }>;
  ttlMs: number | undefined;
  /** Never fail the step for a release that fails: the lease runs out by itself. */
  release: ClaimRef[];
  renew: ClaimRef[];
  leaseMs: number;
}

/** One flag per `remember` entry (`false`: its claim was lost) and per `renew` entry (`false`: lost). */
export interface SettleResult { kept: boolean[]; renewed: boolean[] }

/**
 * A seen-set. `seen` / `remember` / `forget` are required; the batch methods, the
 * claim pair (`claim` + `release`, needed for `claimLeaseMs`) and the lease methods
 * are optional.
 *
 * Leases (claims renewed while a slow handler runs, fenced commits that report
 * `run-ok-lease-lost`) need `claim` + `release` and either `settle` (one call per
 * batch step) or both `renew` and `rememberFenced` (one call per key). A store
 * without them works as before: claims are not renewed (keep the lease above the
 * whole batch's time), the commit is a plain `remember` (`rememberMany` when present),
 * and a success written a lease or more after its claim is `run-ok-lease-lost`.
 *
 * Throw (or reject) to report a failure; an error with `kind` (or `code`) set to
 * "unavailable" | "unsupported" | "invalid" | "internal" keeps that kind. A yes or
 * no (`seen`, `seenMany`, `renew`, `rememberFenced`, `settle`'s flags) is `true` /
 * `false` or 1 / 0; anything else (`"0"`, `null`) is an "internal" store error and
 * the delivery is retried, never read as truthy.
 */
export interface DedupeStore {
  seen(key: string): MaybePromise<boolean>;
  remember(key: string, ttlMs: number | undefined): MaybePromise<unknown>;
  forget(key: string): MaybePromise<unknown>;
  seenMany?(keys: string[]): MaybePromise<boolean[]>;
  rememberMany?(keys: string[], ttlMs: number | undefined): MaybePromise<unknown>;
  claim?(key: string, leaseMs: number): MaybePromise<ClaimResult | "seen" | "held">;
  release?(key: string, token: string): MaybePromise<unknown>;
  claimMany?(keys: string[], leaseMs: number): MaybePromise<Array<ClaimResult | "seen" | "held">>;
  /** Extends the claim to `leaseMs` from now if `token` still owns it; `false`: lost. */
  renew?(key: string, token: string, leaseMs: number): MaybePromise<boolean>;
  /**
   * The fenced commit: remembers `key` and answers `true` if `token` still owns its
   * claim; otherwise answers `false`, and remembers `key` only if it is free (never
   * over another consumer's live claim).
   */
  rememberFenced?(key: string, token: string, ttlMs: number | undefined): MaybePromise<boolean>;
  /** A whole batch step in one call (see `Settlement`); takes precedence over the single-key methods. */
  settle?(step: Settlement): MaybePromise<SettleResult>;
}

export interface DedupeOptions {
  /** Remembered ids expire after this many milliseconds (default: never). */
  ttlMs?: number;
  /**
   * Claiming mode: take an in-flight claim with this lease before running (the store
   * needs claim/release). With a lease-capable store the claims are renewed every
   * third of the lease while handlers run (on `setTimeout`), so a slow handler keeps
   * its claim.
   */
  claimLeaseMs?: number;
  /** Prepended to every store key. */
  keyPrefix?: string;
  /** A per-handler namespace: key = keyPrefix + scope + ":" + id. Non-empty, no ":". */
  scope?: string;
  /** Largest accepted envelope in bytes (default 1 MiB). */
  maxBytes?: number;
  /**
   * An OpenTelemetry `Tracer` (from `@opentelemetry/api` 1.x, an optional peer): one
   * CONSUMER span `process <job>` per delivery by BabelQueue's convention, with the
   * dedupe outcome as attributes, the handler run inside it, and each call to a JS
   * store as a CLIENT span (docs/observability.md). Needs `crypto.subtle`.
   */
  tracer?: OtelTracer;
  /**
   * With `tracer`: the W3C trace headers the transport carried beside the envelope
   * (never inside it), so a delivery's span is the child of the producer's span, as
   * the BabelQueue SDKs' `traceparent` (a malformed or absent one: the parent
   * `trace_id` names). One carrier, an array of them (one per envelope of a
   * `dedupeBatch`), or a function of the envelope's index returning one (or a
   * promise of one); a function that throws counts as no headers.
   */
  headers?: TraceHeaders | readonly (TraceHeaders | undefined)[] | ((index: number) => TraceHeaders | undefined | Promise<TraceHeaders | undefined>);
}

/** W3C trace headers, keys in lowercase. */
export interface TraceHeaders {
  traceparent?: string;
  tracestate?: string;
}

/** The part of an `@opentelemetry/api` `Tracer` the `tracer` option uses. */
export interface OtelTracer {
  startSpan(name: string, options?: object, context?: object): unknown;
}

export type OutcomeKind =
  | "run-ok" | "run-ok-unrecorded" | "run-ok-lease-lost" | "run-failed" | "run-panicked" | "skip"
  | "fail-open" | "fail-open-failed" | "park" | "rejected" | "store-unavailable";

export type Disposition = "ack" | "retry" | "poison";

export type RejectionCode =
  | "not-json" | "not-an-object" | "too-large" | "too-deep" | "missing-job" | "meta-not-object"
  | "unsupported-schema-version" | "data-not-object" | "blank-trace-id" | "bad-attempts";

export interface RejectionInfo { code: RejectionCode; message: string }

export type StoreErrorCode = "unavailable" | "unsupported" | "invalid" | "internal";

export interface StoreErrorInfo { code: StoreErrorCode; message: string }

/** What happened to one delivery, and what the transport should do with it. */
export interface Outcome {
  kind: OutcomeKind;
  disposition: Disposition;
  /** Did the handler run for this delivery? */
  ran: boolean;
  /** The store key, or null when the envelope has no usable id (or is rejected). */
  key: string | null;
  /** A human-readable reason for anything but a plain run or skip. */
  reason?: string;
  /** What the handler threw (run-failed, fail-open-failed), unchanged. */
  error?: unknown;
  /** The store failure (store-unavailable, run-ok-unrecorded). */
  storeError?: StoreErrorInfo;
  /** Why the envelope is not valid (rejected). */
  rejection?: RejectionInfo;
}

export type Validation =
  | { valid: true; failOpen: boolean; id: string | null; key: string | null; job: string; traceId: string; attempts: number }
  | { valid: false; rejection: RejectionInfo };

/** Thrown by dedupeKey (and rejected by a wrapped handler) for an invalid envelope: an `Error` with this `name`. */
export interface RejectionError extends Error { name: "RejectionError"; code: RejectionCode; rejection: RejectionInfo }

/** Rejected by a wrapped handler (`wrap`) that did not run: an `Error` with this `name`; `kind` says why. */
export interface DedupeError extends Error { name: "DedupeError"; kind: "store-unavailable" | "park" | "run-panicked" }

export interface InMemoryStoreOptions {
  /** Use a clock that only moves with advance(ms) (starting at `now`, default 0). */
  manualClock?: boolean;
  /** The manual clock's start (ms); a TypeError without `manualClock: true`. */
  now?: number;
  /** Keep at most this many ids, evicting the oldest. */
  capacity?: number;
}

/** `expiresAt`: when a done id's TTL ends (ms), null without one; null for a claim too (its lease ends all the same: not shown). */
export interface StoreEntry { key: string; state: "done" | "claimed"; expiresAt: number | null }

"#;
