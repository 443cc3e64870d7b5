// Type-checked in the scratch project (tsc --strict --noEmit, moduleResolution
// bundler, module preserve): `import x = require(...)`.
import bq = require('@babelqueue/dedupe');

export async function check(): Promise<string> {
  const outcome: bq.Outcome = await bq.dedupe('{}', new bq.InMemoryStore(), () => {});
  return outcome.kind;
}
