// Run in the scratch project (tests/pack.test.mjs): the installed package from
// CommonJS (`require`, the "node" condition).
const { dedupe, dedupeBatch, forget, dedupeKey, InMemoryStore, process: oldName } = require('@babelqueue/dedupe');
const assert = require('node:assert/strict');

(async () => {
  const order = { job: 'orders.created', trace_id: 't-1', data: { order_id: 7 }, meta: { id: 'order-7', schema_version: 1 } };
  const store = new InMemoryStore();
  let runs = 0;
  const kinds = [];
  for (const body of [order, order]) kinds.push((await dedupe(body, store, () => { runs += 1; })).kind);
  await forget('order-7', store);
  kinds.push(...(await dedupeBatch([order, order], store, () => { runs += 1; })).map((o) => o.kind));
  assert.equal(dedupeKey(order, { scope: 'billing' }), 'billing:order-7');
  assert.equal(typeof oldName, 'function');
  console.log(JSON.stringify({ kinds, runs }));
})().catch((e) => { console.error(e); process.exitCode = 1; });
