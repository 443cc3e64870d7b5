// Types of @babelqueue/dedupe/workers. The Cloudflare types are structural, so
// `MessageBatch`, `Message`, `DurableObjectState` and the `Env` of
// @cloudflare/workers-types fit them without this package depending on them.

// The package's API, the same in this module as in the web and Node builds.
export { dedupe, dedupeBatch, dedupeKey, forget, validate, wrap, InMemoryStore } from "../pkg/web/bq_dedupe.js";
export type {
  EnvelopeInput, EnvelopeObject, DecodedEnvelope, Handler, MaybePromise, ClaimResult, ClaimRef,
  Settlement, SettleResult, DedupeStore, DedupeOptions, OutcomeKind, Disposition, RejectionCode,
  RejectionInfo, StoreErrorCode, StoreErrorInfo, Outcome, Validation, RejectionError, DedupeError,
  InMemoryStoreOptions, StoreEntry,
} from "../pkg/web/bq_dedupe.js";

/** One queue message, as Cloudflare's `Message` has it. */
export interface QueueMessage {
  readonly id: string;
  readonly timestamp: Date;
  readonly body: unknown;
  readonly attempts: number;
  ack(): void;
  retry(options?: { delaySeconds?: number }): void;
}

/** A Queues batch, as Cloudflare's `MessageBatch` has it. */
export interface QueueBatch {
  readonly queue: string;
  readonly messages: readonly QueueMessage[];
  ackAll(): void;
  retryAll(options?: { delaySeconds?: number }): void;
}

/** The envelope the handler gets: the body itself when it is an object, else the body's JSON parsed. */
export interface BabelQueueEnvelope {
  job: string;
  trace_id: string;
  data: Record<string, unknown>;
  /** `id` is the dedupe key when it is a non-empty string; anything else runs undeduped (fail-open). */
  meta: { id?: unknown; schema_version: number; [field: string]: unknown };
  attempts?: number;
  [field: string]: unknown;
}

/** Runs once per id; throw (or reject) to fail the delivery: it is retried and its id stays unmarked.
 * The message's own `ack()` and `retry()` throw: the consumer calls them, by the outcome. */
export type QueueHandler<M extends QueueMessage = QueueMessage> = (
  envelope: BabelQueueEnvelope,
  message: M,
) => void | Promise<void>;

/** What became of one message. */
export interface QueueMessageReport {
  /** Cloudflare's message id. */
  id: string;
  /** The store key of its meta.id (DEDUPE_KEY_PREFIX + the id); null without a usable id. */
  key: string | null;
  /** The outcome code: "run-ok", "skip", "park", "run-failed", "rejected", ... */
  outcome: string;
  /** What was done with the message. */
  action: "ack" | "retry" | "dead-letter";
  /** Why it failed, was rejected or could not be recorded. */
  reason: string | null;
  /** Cloudflare's delivery count (from 1). */
  attempts: number;
  /** Cloudflare delivered this message before. */
  redelivery: boolean;
  /** A new message whose meta.id was already known. */
  duplicatePublish: boolean;
}

/** The batch's report: each message in delivery order, and counts. */
export interface QueueReport {
  messages: QueueMessageReport[];
  /** How many messages had each outcome code. */
  outcomes: Record<string, number>;
  actions: { ack: number; retry: number; "dead-letter": number };
  redeliveries: number;
  duplicatePublishes: number;
}

/**
 * Overrides of the `DEDUPE_*` vars (the same names, values and defaults as the
 * Rust adapter's; see docs/workers.md), and an observer of each message's report.
 */
export interface DedupeQueueOptions {
  DEDUPE_STORE?: "durable-object" | "kv" | "d1";
  /** The name of the DedupeShard binding (default "DEDUPE_DO"). */
  DEDUPE_DO_BINDING?: string;
  /** The name of the KV namespace binding (default "DEDUPE_KV"). */
  DEDUPE_KV_BINDING?: string;
  /** The name of the D1 database binding (default "DEDUPE_D1"). */
  DEDUPE_D1_BINDING?: string;
  DEDUPE_SHARDS?: string | number;
  DEDUPE_PREVIOUS_SHARDS?: string | number;
  DEDUPE_CLAIMING?: "on" | "off";
  DEDUPE_CLAIM_LEASE_SECONDS?: string | number;
  DEDUPE_PARK_DELAY_SECONDS?: string | number;
  DEDUPE_RETRY_DELAY_SECONDS?: string | number;
  DEDUPE_TTL_SECONDS?: string | number;
  DEDUPE_KEY_PREFIX?: string;
  DEDUPE_DEAD_LETTER?: string;
  DEDUPE_MAX_RETRIES?: string | number;
  DEDUPE_FINGERPRINT?: "on" | "off";
  observer?: (report: QueueMessageReport) => void;
}

/**
 * The Queues consumer: decides the batch with one request per shard, runs the
 * handler once per id (in-batch duplicates follow their leader), records the
 * successes with one request per shard, and acks, retries (with a delay) or
 * dead-letters every message. Rejects with a TypeError on a configuration error
 * (every message is then retried).
 */
export function dedupeQueue<M extends QueueMessage>(
  batch: { readonly queue: string; readonly messages: readonly M[] },
  env: object,
  handler: QueueHandler<M>,
  options?: DedupeQueueOptions,
): Promise<QueueReport>;

/** A D1 prepared statement (`db.prepare(sql).bind(...)`), as workers-types declares it. */
export interface D1Statement {
  bind(...values: unknown[]): D1Statement;
}

/** The D1 database the ids live in, as the handler uses it (workers-types' `D1Database` fits). */
export interface D1Like<S extends D1Statement = D1Statement> {
  prepare(query: string): S;
}

/**
 * Builds the D1 statements of the delivery's effect on `db` without running
 * them; they commit with the id in one `batch()`. Prepare them on `db` (the
 * database the ids live in): a D1 batch runs every statement in the database
 * it is sent to. Throw (or reject) to fail the delivery: nothing is written, it
 * is retried.
 */
export type D1QueueHandler<M extends QueueMessage = QueueMessage, S extends D1Statement = D1Statement> = (
  envelope: BabelQueueEnvelope,
  message: M,
  db: D1Like<S>,
) => S[] | Promise<S[]>;

/**
 * Exactly-once effects on D1: for each message in order, the handler's
 * statements and the message's id commit in one D1 `batch()` (one transaction),
 * so the effect is written once or not at all, even when the consumer dies or
 * a duplicate runs at the same time. An id already done runs nothing. The
 * store is D1 whatever `DEDUPE_STORE` says: the `DEDUPE_D1` binding, or the one
 * `DEDUPE_D1_BINDING` names (point it at your own database, where your effect
 * tables are); the ids live in its `bq_dedupe` table (created if missing).
 * Messages run one after another (a claim and one batch each; with
 * `DEDUPE_CLAIMING: "off"` a read instead of the claim), and are acked,
 * retried or dead-lettered as `dedupeQueue` does. With claiming, a message
 * whose handler ends the isolate leaves its claim: redelivered, it parks until
 * the lease ends and the messages after it run.
 */
export function dedupeQueueD1<M extends QueueMessage, S extends D1Statement>(
  batch: { readonly queue: string; readonly messages: readonly M[] },
  env: object,
  handler: D1QueueHandler<M, S>,
  options?: Omit<DedupeQueueOptions, "DEDUPE_STORE">,
): Promise<QueueReport>;

/**
 * The Durable Object of the seen-set, the same as the Rust adapter's: re-export it
 * from your worker (`export { DedupeShard } from "@babelqueue/dedupe/workers"`) and
 * bind it with `new_sqlite_classes`.
 */
export class DedupeShard {
  constructor(state: object, env: object);
  fetch(request: Request): Promise<Response>;
  alarm(): Promise<unknown>;
}

/** The store protocol's methods every adapter store answers (through the Rust store). */
interface AdapterStore {
  seen(key: string): Promise<boolean>;
  remember(key: string, ttlMs: number | undefined): Promise<void>;
  forget(key: string): Promise<void>;
  seenMany(keys: string[]): Promise<boolean[]>;
  rememberMany(keys: string[], ttlMs: number | undefined): Promise<void>;
}

/**
 * `DEDUPE_*` overrides for a store (the binding names, shards, resharding, the key
 * prefix and the window). The consumer's own settings are refused (to claim, pass
 * `claimLeaseMs` to `dedupe` or `dedupeBatch`).
 */
export type StoreOptions = Omit<
  DedupeQueueOptions,
  | "observer"
  | "DEDUPE_STORE"
  | "DEDUPE_CLAIMING"
  | "DEDUPE_CLAIM_LEASE_SECONDS"
  | "DEDUPE_FINGERPRINT"
  | "DEDUPE_DEAD_LETTER"
  | "DEDUPE_MAX_RETRIES"
  | "DEDUPE_RETRY_DELAY_SECONDS"
  | "DEDUPE_PARK_DELAY_SECONDS"
>;

type ClaimResult = import("../pkg/web/bq_dedupe.js").ClaimResult;

/** Its methods: the protocol's, with claims, leases and fenced commits. */
export interface DurableObjectStore extends AdapterStore {
  claim(key: string, leaseMs: number): Promise<ClaimResult>;
  claimMany(keys: string[], leaseMs: number): Promise<ClaimResult[]>;
  release(key: string, token: string): Promise<void>;
  renew(key: string, token: string, leaseMs: number): Promise<boolean>;
  rememberFenced(key: string, token: string, ttlMs: number | undefined): Promise<boolean>;
  settle(step: import("../pkg/web/bq_dedupe.js").Settlement): Promise<import("../pkg/web/bq_dedupe.js").SettleResult>;
}

/**
 * The Durable Object store as a JS store, for `dedupe` / `dedupeBatch` / `wrap`:
 * the DedupeShard binding named by `DEDUPE_DO_BINDING` (default "DEDUPE_DO"), spread
 * over `DEDUPE_SHARDS`; claims, leases and fenced commits, one request per shard
 * per call. Its keys are the ids under `DEDUPE_KEY_PREFIX` and a write that gives
 * no window lasts `DEDUPE_TTL_SECONDS`, as `dedupeQueue` keeps them (so do not pass
 * `keyPrefix` to `dedupe` as well). Throws a TypeError on a configuration error.
 */
export declare class DurableObjectStore {
  constructor(env: object, options?: StoreOptions);
}

/** Its methods: the protocol's plain ones (KV cannot claim). */
export interface KvStore extends AdapterStore {}

/**
 * The best-effort Workers KV store as a JS store (the binding `DEDUPE_KV_BINDING`
 * names, default "DEDUPE_KV"): no claims (KV cannot take one atomically), TTLs of 60 s or more;
 * keys and window as `DurableObjectStore`'s.
 */
export declare class KvStore {
  constructor(env: object, options?: StoreOptions);
}
