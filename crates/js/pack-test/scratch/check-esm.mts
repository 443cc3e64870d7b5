// Type-checked in the scratch project (tsc --strict --noEmit): an ES module
// importing the installed package (node16/nodenext: the "node" condition's .d.cts).
import { dedupe, dedupeBatch, InMemoryStore } from '@babelqueue/dedupe';
import * as bq from '@babelqueue/dedupe';
import type { DedupeStore, Outcome, OutcomeKind } from '@babelqueue/dedupe';
import { runConformance } from '@babelqueue/dedupe/conformance';
import type { ConformanceReport } from '@babelqueue/dedupe/conformance';

const seen = new Set<string>();
const store: DedupeStore = {
  seen: (key) => seen.has(key),
  remember: (key) => { seen.add(key); },
  forget: (key) => seen.delete(key),
};
export async function check(): Promise<OutcomeKind[]> {
  const one: Outcome = await dedupe('{}', store, async (env) => env.job, { ttlMs: 1000 });
  const many: Outcome[] = await dedupeBatch([{ job: 'j' }], new InMemoryStore({ manualClock: true }), () => {});
  const old: Outcome = await bq.process('{}', store, () => {});
  const disposable = new InMemoryStore();
  disposable[Symbol.dispose]();
  const report: ConformanceReport = await runConformance(bq, '{}', async (path: string) => path);
  void report;
  // @ts-expect-error: the handler must be a function
  await dedupe('{}', store, 'handler');
  return [one.kind, ...many.map((o) => o.kind), old.kind];
}
