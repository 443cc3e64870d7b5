// Type-checked in the scratch project (tsc --strict --noEmit): CommonJS
// (`import x = require(...)`) with the installed package.
import bq = require('@babelqueue/dedupe');

export async function check(): Promise<string> {
  const store = new bq.InMemoryStore();
  const outcome: bq.Outcome = await bq.dedupe('{}', store, () => {});
  const batch: bq.Outcome[] = await bq.dedupeBatch(['{}'], store, () => {});
  const key: string | null = bq.dedupeKey('{}');
  // @ts-expect-error: an outcome kind is one of the core's codes
  const wrong: bq.OutcomeKind = 'ran';
  void wrong;
  return `${outcome.kind} ${batch.length} ${key}`;
}
