// The hand-written types (the typescript_custom_section in src/types.rs, the
// generated .d.ts, conformance.d.ts) compile under `tsc --strict`, mention no
// `any`, and reject wrong uses (types-check.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const tsc = here('../../../node_modules/typescript/bin/tsc'); // the root package.json's

test('the .d.ts files declare no `any`', () => {
  for (const file of ['../pkg/web/bq_dedupe.d.ts', '../pkg/node/bq_dedupe.d.cts', '../pkg/web/bq_dedupe_bg.wasm.d.ts',
    '../conformance.d.ts']) {
    const code = readFileSync(here(file), 'utf8').replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '');
    assert.doesNotMatch(code, /\bany\b/, file);
  }
});

test('types-check.ts type-checks under tsc --strict (and every @ts-expect-error is an error)', { skip: !existsSync(tsc) && 'typescript not installed' }, () => {
  try {
    execFileSync(process.execPath, [tsc, '--noEmit', '--strict', '--skipLibCheck', 'false', '--target', 'es2022',
      '--module', 'nodenext', '--moduleResolution', 'nodenext', '--lib', 'esnext,dom', here('types-check.ts')], { encoding: 'utf8' });
  } catch (e) {
    assert.fail(`tsc failed:\n${e.stdout}${e.stderr}`);
  }
});
