// The package as a user gets it: `npm pack` in a clean copy of the tree (the
// files git tracks or would track, no build output: the prepack step must build
// what ships), the tarball installed into a scratch project outside the
// repository, and there an ES module, a CommonJS script, `tsc --strict --noEmit`
// under node16 / nodenext / bundler with TypeScript 5.x and the newest release
// (the root package.json's), and this package's README examples (the
// Node one in Node, the browser one in headless Chromium).
//
// The copy and its cargo target dir live under target/js-pack/ (kept between runs,
// mtimes preserved, so the copy's build is incremental); the scratch project is a
// temporary directory, removed at the end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync, cpSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const JS = fileURLToPath(new URL('..', import.meta.url));
const ROOT = resolve(JS, '../..');
const TOOLS = join(JS, 'pack-test');
const WORK = join(process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target'), 'js-pack');
const COPY = join(WORK, 'tree');
const NAME = '@babelqueue/dedupe';
// The TypeScript versions (the root package.json's `typescript` and `typescript-7`).
const TYPESCRIPTS = { '5.9.3': 'typescript', '7.0.2': 'typescript-7' };

const run = (cmd, args, opts = {}) => {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, ...opts });
  } catch (e) {
    assert.fail(`${cmd} ${args.join(' ')} (in ${opts.cwd ?? process.cwd()}) failed:\n${e.stdout ?? ''}${e.stderr ?? ''}`);
  }
};

let scratch;
let tarball;
let packOutput;

before(() => {
  // The tree's own build (a no-op after `make js-build`), to compare the copy's with.
  run(join(ROOT, 'scripts/build-js.sh'), [], { stdio: ['ignore', 'pipe', 'pipe'] });
  // The TypeScript versions, pinned by the root package.json and its lock file (npm ci).
  run(join(ROOT, 'scripts/ensure-tools.sh'), ['npm', ROOT]);
  // A clean copy: tracked and untracked-but-not-ignored files, mtimes kept.
  rmSync(COPY, { recursive: true, force: true });
  mkdirSync(COPY, { recursive: true });
  const files = run('git', ['ls-files', '-z', '--cached', '--others', '--exclude-standard'], { cwd: ROOT })
    .split('\0').filter((f) => f && existsSync(join(ROOT, f)));
  execFileSync('bash', ['-c', `tar --null -T - -cf - | tar -xf - -C ${JSON.stringify(COPY)}`],
    { cwd: ROOT, input: files.join('\0'), maxBuffer: 64 << 20 });
  assert.ok(!existsSync(join(COPY, 'crates/js/pkg')), 'the copy has no build output');
  // The root package.json's npm tools (binaryen, for the prepack build) as the tree
  // installed them: tools, not build output.
  symlinkSync(join(ROOT, 'node_modules'), join(COPY, 'node_modules'));
  const dest = mkdtempSync(join(tmpdir(), 'bq-dedupe-tgz-'));
  packOutput = run('npm', ['pack', '--pack-destination', dest], {
    cwd: join(COPY, 'crates/js'),
    env: { ...process.env, CARGO_TARGET_DIR: join(WORK, 'target') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const [name] = readdirSync(dest).filter((f) => f.endsWith('.tgz'));
  assert.ok(name, `npm pack wrote no tarball:\n${packOutput}`);
  tarball = join(dest, name);

  scratch = mkdtempSync(join(tmpdir(), 'bq-dedupe-scratch-'));
  writeFileSync(join(scratch, 'package.json'), JSON.stringify({ name: 'scratch', private: true, version: '0.0.0' }));
  run('npm', ['install', '--no-audit', '--no-fund', '--offline', '--no-package-lock', tarball], { cwd: scratch });
  cpSync(join(TOOLS, 'scratch'), scratch, { recursive: true });
});

after(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  if (tarball) rmSync(dirname(tarball), { recursive: true, force: true });
});

test('npm pack in a clean copy builds the module and ships it once, with the CJS types', () => {
  // The glue's JS half and the tracer's (otel) ship in each build (ES modules for web and workers,
  // CommonJS for node), under wasm-bindgen's directory for the crate (named by a hash).
  const files = run('tar', ['-tzf', tarball]).trim().split('\n').sort()
    .map((f) => f.replace(/\/snippets\/babelqueue-dedupe-(js|workers)-[0-9a-f]{16}\//, '/snippets/babelqueue-dedupe-$1-HASH/'));
  assert.deepEqual(files, [
    'package/README.md', 'package/conformance.d.ts', 'package/conformance.js', 'package/package.json',
    'package/pkg/node/bq_dedupe.cjs', 'package/pkg/node/bq_dedupe.d.cts',
    'package/pkg/node/snippets/babelqueue-dedupe-js-HASH/src/glue.cjs',
    'package/pkg/node/snippets/babelqueue-dedupe-js-HASH/src/otel.cjs',
    'package/pkg/web/bq_dedupe.d.ts', 'package/pkg/web/bq_dedupe.js', 'package/pkg/web/bq_dedupe_bg.wasm',
    'package/pkg/web/bq_dedupe_bg.wasm.d.ts',
    'package/pkg/web/snippets/babelqueue-dedupe-js-HASH/src/glue.js',
    'package/pkg/web/snippets/babelqueue-dedupe-js-HASH/src/otel.js',
    'package/workerd.js',
    'package/workers/bq_dedupe_workers.js', 'package/workers/bq_dedupe_workers_bg.wasm',
    'package/workers/snippets/babelqueue-dedupe-js-HASH/src/glue.js',
    'package/workers/snippets/babelqueue-dedupe-js-HASH/src/otel.js',
    'package/workers/snippets/babelqueue-dedupe-workers-HASH/src/spans.js',
    'package/workers/snippets/worker-64cc4b2d035528c7/inline0.js',
    'package/workers/workers.d.ts', 'package/workers/workers.js',
  ]);
  // The copy built the same bytes as the tree the other tests use.
  const shipped = readFileSync(join(scratch, 'node_modules', NAME, 'pkg/web/bq_dedupe_bg.wasm'));
  assert.ok(shipped.equals(readFileSync(join(JS, 'pkg/web/bq_dedupe_bg.wasm'))), 'the packed .wasm equals crates/js/pkg/web/');
  // The budget: row `js` of mk/artifacts.tsv (artifact, profile, wasm-opt, budget, ...).
  const budget = Number(readFileSync(join(ROOT, 'mk/artifacts.tsv'), 'utf8').split('\n').find((l) => l.startsWith('js\t')).split('\t')[3]);
  assert.ok(shipped.length <= budget, `${shipped.length} B is over the ${budget} B budget (mk/artifacts.tsv)`);
});

test('ESM in the scratch project: the node build (named imports), the web build, ./conformance', () => {
  const out = JSON.parse(run('node', ['esm.mjs', join(ROOT, 'tests/conformance')], { cwd: scratch }));
  assert.deepEqual(out, {
    kinds: ['run-ok', 'skip', 'skip', 'run-ok', 'run-ok'],
    runs: 3,
    conformance: ['13 passed, 0 failed', '13 passed, 0 failed'],
  });
});

test('CommonJS in the scratch project: require(), also where require() cannot load an ES module (Node 18)', () => {
  const expected = { kinds: ['run-ok', 'skip', 'run-ok', 'skip'], runs: 2 };
  assert.deepEqual(JSON.parse(run('node', ['cjs.cjs'], { cwd: scratch })), expected);
  // The node build's glue and its JS half are CommonJS throughout.
  assert.deepEqual(JSON.parse(run('node', ['--no-experimental-require-module', 'cjs.cjs'], { cwd: scratch })), expected);
});

// Each case: compiler flags and files. No `lib`, no `types`; `skipLibCheck` off, so
// the package's own declarations are checked too.
const TSC_CASES = [
  ...['node16', 'nodenext'].flatMap((r) => [
    { name: `${r}`, flags: ['--module', r, '--moduleResolution', r], files: ['check-esm.mts', 'check-cjs.cts'] },
    { name: `${r}, target es2015`, flags: ['--module', r, '--moduleResolution', r, '--target', 'es2015'], files: ['check-esm.mts', 'check-cjs.cts'] },
  ]),
  { name: 'bundler, target es2015', flags: ['--module', 'preserve', '--moduleResolution', 'bundler', '--target', 'es2015'], files: ['check-bundler.ts', 'check-bundler-require.cts'] },
  // The package's Symbol.dispose declaration merges with the lib's own.
  { name: 'nodenext, lib esnext', flags: ['--module', 'nodenext', '--lib', 'esnext,dom'], files: ['check-esm.mts', 'check-cjs.cts'] },
];

for (const [version, dir] of Object.entries(TYPESCRIPTS)) {
  test(`tsc ${version} --strict --noEmit in the scratch project`, async (t) => {
    const tsc = join(ROOT, 'node_modules', dir, 'bin/tsc');
    assert.equal(run('node', [tsc, '--version']).trim(), `Version ${version}`);
    for (const { name, flags, files } of TSC_CASES) {
      await t.test(name, () => {
        run('node', [tsc, '--strict', '--noEmit', '--skipLibCheck', 'false', ...flags, ...files], { cwd: scratch });
      });
    }
  });
}

/** The first fenced block of `lang` after the heading `## section` of the installed README. */
function readmeBlock(section, lang) {
  const readme = readFileSync(join(scratch, 'node_modules', NAME, 'README.md'), 'utf8');
  const at = readme.indexOf(`\n## ${section}\n`);
  assert.ok(at >= 0, `README has a "${section}" section`);
  const m = readme.slice(at).match(new RegExp('```' + lang + '\\n([\\s\\S]*?)```'));
  assert.ok(m, `README's ${section} section has a ${lang} block`);
  return m[1];
}

test("the README's Node example runs as written (ten lines)", () => {
  const code = readmeBlock('Node', 'js');
  assert.ok(code.trimEnd().split('\n').length <= 10, 'ten lines at most');
  writeFileSync(join(scratch, 'readme-node.mjs'), code);
  assert.deepEqual(run('node', ['readme-node.mjs'], { cwd: scratch }).trim().split('\n'),
    ['charging order 7', 'run-ok ack', 'skip ack']);
});

test("the README's OpenTelemetry example runs as written: the consumer span under trace_id's parent", () => {
  // The API, SDK and context manager as the root package.json pins them (npm ci).
  symlinkSync(join(ROOT, 'node_modules/@opentelemetry'), join(scratch, 'node_modules/@opentelemetry'));
  writeFileSync(join(scratch, 'readme-otel.mjs'), readmeBlock('OpenTelemetry', 'js'));
  const out = run('node', ['readme-otel.mjs'], { cwd: scratch });
  assert.match(out, /name: 'process urn:babel:orders:created'/);
  assert.match(out, /traceId: '7b3f9c2ae41d4f889b2a1c0d5e6f7a8b'/);
  assert.match(out, /spanId: '980c512d6f4a8fba'/, "the parent the Node SDK derives");
  assert.match(out, /'messaging\.babelqueue\.dedupe\.outcome': 'run-ok'/);
});

test("the README's browser example runs as written (headless Chromium)", async () => {
  run(join(ROOT, 'scripts/ensure-tools.sh'), ['chromium']);
  run(join(ROOT, 'scripts/ensure-tools.sh'), ['npm', ROOT]); // playwright-core
  const { launchChromium } = await import('../../../tests/browser/chromium.mjs');
  const { serveWww } = await import('../../../scripts/serve-www.mjs');
  writeFileSync(join(scratch, 'index.html'),
    `<!doctype html>\n<html><head><meta charset="utf-8">\n${readmeBlock('Browser', 'html')}</head><body></body></html>\n`);
  const server = await serveWww({ port: 0, root: scratch });
  const browser = await launchChromium();
  try {
    const page = await browser.context.newPage();
    const logs = [];
    const errors = [];
    page.on('console', (m) => { if (m.type() === 'log') logs.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('response', (r) => { if (!r.ok() && !r.url().endsWith('/favicon.ico')) errors.push(`${r.status()} ${r.url()}`); });
    await page.goto(`${server.url}index.html`);
    await page.waitForFunction(() => document.body.textContent.includes('order'), null, { timeout: 10_000 })
      .catch(() => assert.fail(`the example did not run: ${errors.join('; ')} ${logs.join('; ')}`));
    await page.waitForTimeout(100);
    assert.deepEqual(errors, []);
    assert.deepEqual(logs, ['meta-not-object', 'run-ok', 'skip']);
    assert.equal((await page.evaluate(() => document.body.textContent)).trim(), 'order order-7'); // ran once
  } finally {
    await browser.close();
    await server.close();
  }
});
