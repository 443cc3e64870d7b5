// Run in the scratch project (tests/pack.test.mjs): the installed package from an
// ES module, through the "node" condition (the CommonJS build, named imports) and
// the web build (./web, initialised with the shipped .wasm), and ./conformance.
import { dedupe, dedupeBatch, validate, InMemoryStore, process as oldName } from '@babelqueue/dedupe';
import * as bq from '@babelqueue/dedupe';
import initWeb, * as web from '@babelqueue/dedupe/web';
import { runConformance } from '@babelqueue/dedupe/conformance';
import { readFile } from 'node:fs/promises';
import { strict as assert } from 'node:assert';

const order = { job: 'orders.created', trace_id: 't-1', data: { order_id: 7 }, meta: { id: 'order-7', schema_version: 1 } };
const store = new InMemoryStore();
let runs = 0;
const first = await dedupe(order, store, () => { runs += 1; });
const again = await dedupe(JSON.stringify(order), store, () => { runs += 1; });
const batch = await dedupeBatch([order, { ...order, meta: { ...order.meta, id: 'order-8' } }], store, () => { runs += 1; });
assert.equal((await oldName(order, store, () => { runs += 1; })).kind, 'skip');
assert.equal(validate('{"job":"j"}').rejection.code, 'meta-not-object');

await initWeb({ module_or_path: await readFile(new URL(import.meta.resolve('@babelqueue/dedupe/bq_dedupe_bg.wasm'))) });
const webStore = new web.InMemoryStore();
const viaWeb = await web.dedupe(order, webStore, () => { runs += 1; });

// argv[2]: the conformance directory (manifest.json and its fixtures).
const dir = process.argv[2];
const manifest = await readFile(`${dir}/manifest.json`, 'utf8');
const load = (path) => readFile(`${dir}/${path}`);
const reports = [await runConformance(bq, manifest, load), await runConformance(web, manifest, load)];

console.log(JSON.stringify({ kinds: [first.kind, again.kind, ...batch.map((o) => o.kind), viaWeb.kind], runs,
  conformance: reports.map((r) => `${r.passed} passed, ${r.failed} failed`) }));
