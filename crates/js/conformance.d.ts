// Types of conformance.js (hand-written; checked by tests/types-check.ts).
import type { DedupeStore, InMemoryStore, dedupe, forget, dedupeKey, validate } from './pkg/web/bq_dedupe.js';

/** The package's exports the runner drives. */
export interface DedupeApi {
  dedupe: typeof dedupe;
  forget: typeof forget;
  dedupeKey: typeof dedupeKey;
  validate: typeof validate;
  InMemoryStore: new () => InMemoryStore;
}

export interface ConformanceResult {
  name: string;
  passed: boolean;
  /** Why it failed; null when it passed. */
  failure: string | null;
}

export interface ConformanceReport {
  results: ConformanceResult[];
  passed: number;
  failed: number;
  /** "N passed, N failed" */
  summary: string;
}

export interface ConformanceOptions {
  /** The store for each sequence (each must start empty); default: a new InMemoryStore. */
  store?: (index: number, name: string) => DedupeStore | InMemoryStore | Promise<DedupeStore | InMemoryStore>;
  /** Run the sequences in claiming mode. */
  claimLeaseMs?: number;
}

export type FixtureData = string | Uint8Array | ArrayBuffer;

/** cases + dedup-key + sequences of a manifest. */
export function conformanceCount(manifest: string | object): number;

export function runConformance(
  api: DedupeApi,
  manifest: string | object,
  loadFixture: (path: string) => FixtureData | Promise<FixtureData>,
  options?: ConformanceOptions,
  onResult?: (result: ConformanceResult) => void,
): Promise<ConformanceReport>;
