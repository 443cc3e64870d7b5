// Type-checked in the scratch project (tsc --strict --noEmit, moduleResolution
// bundler): the web build, with its init function.
import init, { dedupe, validate, InMemoryStore } from '@babelqueue/dedupe';
import type { Outcome, Validation } from '@babelqueue/dedupe';
import { runConformance } from '@babelqueue/dedupe/conformance';
import * as bq from '@babelqueue/dedupe';

export async function check(): Promise<string> {
  await init();
  const v: Validation = validate('{}');
  const outcome: Outcome = await dedupe('{}', new InMemoryStore(), () => {});
  const report = await runConformance(bq, '{}', async (path: string) => path);
  return `${v.valid} ${outcome.kind} ${report.passed}`;
}
