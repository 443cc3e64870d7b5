// Type-checked (never run) by types.test.mjs with `tsc --noEmit --strict`: the
// package's .d.ts describes real shapes, and wrong uses are errors (each
// expect-error directive at the end must meet an error, or tsc fails).
import init, { dedupe, dedupeBatch, forget, dedupeKey, validate, InMemoryStore } from '../pkg/web/bq_dedupe.js';
import type { DedupeStore, Outcome, OutcomeKind, Disposition, Validation, StoreEntry, ClaimResult, DecodedEnvelope, Settlement, SettleResult } from '../pkg/web/bq_dedupe.js';
import { runConformance, conformanceCount } from '../conformance.js';
import { trace } from '@opentelemetry/api';
import type { ConformanceReport } from '../conformance.js';

export async function check(): Promise<void> {
  await init();
  const memory = new InMemoryStore({ manualClock: true, now: 0 });
  const plain = new InMemoryStore();
  const seen = new Set<string>();
  const store: DedupeStore = {
    seen: (key) => seen.has(key),
    remember: async (key, ttlMs) => { seen.add(key); return ttlMs; },
    forget: (key) => seen.delete(key),
    claim: async (): Promise<ClaimResult> => ({ state: 'acquired', token: 't' }),
    release: () => undefined,
  };

  const leased: DedupeStore = {
    ...store,
    renew: async (_key, _token, leaseMs) => leaseMs > 0,
    rememberFenced: (_key, token, _ttlMs) => token === 't',
    settle: async (step: Settlement): Promise<SettleResult> => ({
      kept: step.remember.map((r) => r.token === undefined || r.token === 't'),
      renewed: step.renew.map(({ token }) => token === 't'),
    }),
  };
  const lost: OutcomeKind = 'run-ok-lease-lost';
  await dedupeBatch(['{}'], leased, () => {}, { claimLeaseMs: 300 });

  const outcome: Outcome = await dedupe('{}', store, async (env: DecodedEnvelope) => {
    const job: string = env.job;
    // Any JSON value for a fail-open delivery: narrow before use.
    const id: string | null = typeof env.meta.id === 'string' ? env.meta.id : null;
    return [job, id];
  }, { ttlMs: 1000, claimLeaseMs: 500, keyPrefix: 'p:', scope: 's', maxBytes: 10 });
  const kind: OutcomeKind = outcome.kind;
  const disposition: Disposition = outcome.disposition;
  const key: string | null = outcome.key;
  const code: string | undefined = outcome.rejection?.code ?? outcome.storeError?.code;
  const batch: Outcome[] = await dedupeBatch([{ job: 'j' }, '{}', new Uint8Array(2)], memory, () => {});
  // A readonly array is taken as it is (it was a type error: a trial).
  const frozen: readonly string[] = ['{}'];
  await dedupeBatch(frozen, memory, () => {});
  await forget('id', plain);
  const k: string | null = dedupeKey('{}');
  const v: Validation = validate({ meta: { id: 'x' } });
  if (v.valid) {
    const fo: boolean = v.failOpen;
    void fo;
  } else {
    const why: string = v.rejection.message;
    void why;
  }
  const entries: StoreEntry[] = memory.entries();
  memory.advance(1000);
  const claim: ClaimResult = memory.claim('k', 1000);
  if (claim.state === 'acquired') memory.release('k', claim.token);
  const report: ConformanceReport = await runConformance(
    { dedupe, forget, dedupeKey, validate, InMemoryStore },
    '{}',
    async (path: string) => path,
    { claimLeaseMs: 10 },
  );
  const n: number = conformanceCount({}) + report.passed;
  await dedupeBatch(['{}'], store, () => {}, { tracer: trace.getTracer('orders'), claimLeaseMs: 10 });

  // @ts-expect-error: settle answers { kept, renewed }
  await dedupe('{}', { ...store, settle: () => [true] }, () => {});
  // @ts-expect-error: not an outcome code
  const badKind: OutcomeKind = 'ran';
  // @ts-expect-error: the handler must be a function
  await dedupe('{}', store, 'handler');
  // @ts-expect-error: a store needs seen/remember/forget
  await dedupe('{}', { seen: () => true }, () => {});
  // @ts-expect-error: a tracer has startSpan
  await dedupe('{}', store, () => {}, { tracer: { startActiveSpan: () => 1 } });
  // @ts-expect-error: unknown option
  await dedupe('{}', store, () => {}, { ttl: 5 });
  // @ts-expect-error: the key may be null
  const notNull: string = dedupeKey('{}');
  // @ts-expect-error: a rejection carries no failOpen
  validate('{}').failOpen;

  void [lost, kind, disposition, key, code, batch, k, entries, n, badKind, notNull];
}
