// Benchmark (measures and reports; asserts only the counts that define
// correctness: every distinct id ran once, a done id never runs again): what
// the dedupe store costs on Cloudflare per 1,000 messages and per million, for
// each store the adapter supports (Durable Object, KV, D1), each mode it
// supports, batches of 10 and 100, beside the naive per-message adapter
// (EXAMPLE_NAIVE_STORE=on: one store call per message and step).
//
// The fixture worker runs on local workerd (Miniflare) with a handler that does
// no I/O (EXAMPLE_EFFECT_LOG=off), fed BQ_BENCH_TOTAL envelopes (default 10,000;
// 20% duplicates) straight into queue(). The counts are the store client's
// (`RoundTrips`, summed into the worker's GET /stats): requests it sent, and the
// rows the backend says they read and wrote: the Durable Object's SQL cursors'
// rowsRead/rowsWritten (summed by the shard, sent back with each reply), D1's
// meta.rows_read/rows_written of every statement, and for KV the keys read and
// written (KV bills each key, a bulk get too). After the stream, a pass of
// BQ_BENCH_DONE already-done ids (default 1,000) counts what a duplicate costs,
// rows written included.
//
// Prices: /work/shared/spec/facts.md ("Cloudflare prices and limits"). Writes
// target/bench/workers-cost.md (the table, also printed) and workers-cost.json.
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { ROOT, envelope, startWorker } from "../tests/harness.mjs";
import { DUPLICATE_SHARE, batchesOf, workload } from "./workload.mjs";

const TOTAL = Number(process.env.BQ_BENCH_TOTAL ?? 10_000);
const DONE = Number(process.env.BQ_BENCH_DONE ?? 1_000);
const BATCHES = (process.env.BQ_BENCH_BATCHES ?? "10,100").split(",").map(Number);

/** US$ per million units (facts.md). */
const PRICE = {
  doRequest: 0.15,
  doRowWritten: 1.0,
  doRowRead: 0.001,
  kvRead: 0.5,
  kvWrite: 5.0, // a delete or a list is priced as a write
  d1RowWritten: 1.0,
  queueOp: 0.4,
};
const QUEUE_OPS_PER_MESSAGE = 3;

/** What each store is billed for, per million messages, from counts per message. */
const PRICED = {
  "durable-object": (c) => c.requests * PRICE.doRequest + c.written * PRICE.doRowWritten + c.read * PRICE.doRowRead,
  kv: (c) => c.read * PRICE.kvRead + c.written * PRICE.kvWrite,
  // facts.md gives no price for D1 rows read: left out (see the notes).
  d1: (c) => c.written * PRICE.d1RowWritten,
};

/** The runs: store, mode (its vars), adapter, batch size. */
function scenarios() {
  const modes = [
    { store: "durable-object", mode: "seen-set", vars: { DEDUPE_CLAIMING: "off" } },
    { store: "durable-object", mode: "claiming", vars: { DEDUPE_CLAIMING: "on" } },
    { store: "kv", mode: "seen-set", vars: { DEDUPE_CLAIMING: "off" } },
    { store: "d1", mode: "seen-set", vars: { DEDUPE_CLAIMING: "off" } },
    { store: "d1", mode: "claiming", vars: { DEDUPE_CLAIMING: "on" } },
    // The handler's statements committed with the id in one D1 batch; its effect
    // (one row in example_effects per run) is counted in the rows written.
    { store: "d1", mode: "transactional", vars: { DEDUPE_CLAIMING: "off", EXAMPLE_D1_EFFECTS: "on" }, batchedOnly: true },
    // The same with claims (the default): each id claimed before its handler.
    { store: "d1", mode: "transactional, claiming", vars: { DEDUPE_CLAIMING: "on", EXAMPLE_D1_EFFECTS: "on" }, batchedOnly: true },
  ];
  // BQ_BENCH_MODES: only the modes whose name contains one of these (comma-separated).
  const only = (process.env.BQ_BENCH_MODES ?? "").split(",").filter(Boolean);
  const out = [];
  for (const m of modes.filter((m) => !only.length || only.some((o) => m.mode.includes(o)))) {
    for (const batch of BATCHES) out.push({ ...m, adapter: "batch", batch });
    // The naive adapter makes one call per message whatever the batch: once.
    if (!m.batchedOnly) out.push({ ...m, adapter: "naive", batch: Math.max(...BATCHES) });
  }
  return out;
}

const delta = (after, before) => ({
  requests: after.store_round_trips - before.store_round_trips,
  read: after.store_rows_read - before.store_rows_read,
  written: after.store_rows_written - before.store_rows_written,
  runs: after.runs - before.runs,
  skips: after.skips - before.skips,
  deliveries: after.deliveries - before.deliveries,
});

async function run(s, stream, done) {
  const worker = await startWorker({
    vars: {
      DEDUPE_STORE: s.store,
      EXAMPLE_NAIVE_STORE: s.adapter === "naive" ? "on" : "off",
      EXAMPLE_EFFECT_LOG: "off",
      EXAMPLE_D1_EFFECTS: "off",
      ...s.vars,
    },
  });
  try {
    const pass = async (batches) => {
      const before = await worker.stats();
      for (const batch of batches) {
        const result = await worker.dispatchQueue(batch);
        if (result.outcome !== "ok") throw new Error(`${label(s)}: batch outcome ${result.outcome}`);
      }
      return delta(await worker.stats(), before);
    };
    // Warm-up on an id outside the workload: the isolate's once-only requests
    // (the shard layout check, D1's CREATE TABLE) are not a message's cost.
    await pass([[{ id: "w", timestamp: new Date(), attempts: 1, body: envelope("warm-up") }]]);
    const main = await pass(stream.batches);
    const again = await pass(done.batches);
    // Correctness, not timing: each distinct id ran once, a done id never again.
    if (main.deliveries !== TOTAL || main.runs !== stream.unique || main.skips !== TOTAL - stream.unique) {
      throw new Error(`${label(s)}: ${JSON.stringify(main)}; expected ${stream.unique} runs of ${TOTAL}`);
    }
    if (again.runs !== 0 || again.skips !== done.ids.length) {
      throw new Error(`${label(s)}: done-only pass ran ids again: ${JSON.stringify(again)}`);
    }
    return { ...s, main, done: again };
  } finally {
    await worker.dispose();
  }
}

const label = (s) => `${s.store} ${s.mode} ${s.adapter} batch ${s.batch}`;
const per = (n, of, unit = 1000) => (n * unit) / of;
const fmt = (x, digits = 1) => (Number.isInteger(x) ? String(x) : x.toFixed(digits));
const usd = (x) => `$${x.toFixed(x < 0.01 ? 4 : 3)}`;

function priced(r) {
  const perMessage = { requests: r.main.requests / TOTAL, read: r.main.read / TOTAL, written: r.main.written / TOTAL };
  return PRICED[r.store](perMessage);
}

function table(results) {
  const rows = [
    "| store | mode | adapter | batch | requests /1k msgs | rows read /1k | rows written /1k | US$ per M msgs | done-only pass: requests /1k | done-only pass: rows written |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const r of results) {
    rows.push(
      `| ${r.store} | ${r.mode} | ${r.adapter === "naive" ? "naive, per message" : "batch RPC"} | ${r.batch} | ` +
        `${fmt(per(r.main.requests, TOTAL))} | ${fmt(per(r.main.read, TOTAL))} | ${fmt(per(r.main.written, TOTAL))} | ` +
        `${usd(priced(r))} | ${fmt(per(r.done.requests, DONE))} | ${r.done.written} |`,
    );
  }
  return rows.join("\n");
}

const stream = workload(TOTAL, 1); // ids only; batched per scenario below
const doneIds = [...new Set(stream.ids)].slice(0, DONE);
const results = [];
for (const s of scenarios()) {
  const r = await run(
    s,
    { batches: batchesOf(stream.ids, s.batch), unique: stream.unique },
    { batches: batchesOf(doneIds, s.batch), ids: doneIds },
  );
  results.push(r);
  console.error(`${label(s)}: ${JSON.stringify(r.main)} done-only: ${JSON.stringify(r.done)}`);
}

const queues = QUEUE_OPS_PER_MESSAGE * PRICE.queueOp;
const markdown = `# Workers: what deduplication costs per message

${TOTAL.toLocaleString("en")} envelopes, ${stream.unique.toLocaleString("en")} distinct \`meta.id\` (${DUPLICATE_SHARE * 100} % duplicates), \
through the fixture worker's queue consumer on local workerd (Miniflare), a handler without I/O; \
then a pass of ${DONE.toLocaleString("en")} ids already done. Reproduce: \`make workers-cost\` \
(\`node crates/workers/bench/cost.mjs\` after \`scripts/build-worker.sh\`).

${table(results)}

- **requests**: what the store client sent: Durable Object fetches (each one a billed request), \
KV operations (a get, a bulk get of up to 100 keys, a put), D1 \`batch()\` calls (D1 bills rows, not calls).
- **rows read / written**: the backend's own counts. Durable Object: the SQL cursors' \`rowsRead\` / \`rowsWritten\` \
of every statement of the request, summed by the shard; D1: \`meta.rows_read\` / \`meta.rows_written\` of every \
statement of a batch; KV: keys read and keys written (KV bills each key, a bulk get too).
- **US$ per M msgs** at the list prices (facts.md): Durable Object requests $${PRICE.doRequest}/M, rows written \
$${PRICE.doRowWritten.toFixed(2)}/M, rows read $${PRICE.doRowRead}/M; KV reads $${PRICE.kvRead.toFixed(2)}/M, writes \
$${PRICE.kvWrite.toFixed(2)}/M; D1 rows written $${PRICE.d1RowWritten.toFixed(2)}/M. facts.md gives no price for D1 rows \
read, so they are shown and not priced (at the Durable Object's $${PRICE.doRowRead}/M they would add under \
$${(Math.max(...results.filter((r) => r.store === "d1").map((r) => r.main.read / TOTAL)) * PRICE.doRowRead).toFixed(4)} per M messages). \
Queues cost the same for every row: about ${QUEUE_OPS_PER_MESSAGE} operations a message at $${PRICE.queueOp.toFixed(2)}/M, \
$${queues.toFixed(2)} per M messages, not included. Workers CPU is not included.
- **naive, per message**: the same store behind the core's per-key wrapper (\`PerKey(Unbatched(&store))\`): seen-set \
is a \`seen\` then a \`remember\` per message (KV: a get and a put), claiming a \`claim\` then a \`settle\` per message.
- **transactional** (D1): the handler's own statement commits with the id in one batch; its effect row \
(one per run) is in the rows written. With claiming (the default) each id is claimed first, the claim \
replaced in that batch.
- Not counted: the fixture's own bookkeeping (one request per batch to its EffectLog object for \`/stats\`), \
once-per-isolate requests (the shard layout check, D1's \`CREATE TABLE IF NOT EXISTS\`: made by the warm-up), \
and the Durable Object sweep alarm (one \`setAlarm\` per object when the first expiring row is written, one \
alarm request when it fires).
`;

console.log(markdown);
const dir = path.join(ROOT, "target/bench");
mkdirSync(dir, { recursive: true });
writeFileSync(path.join(dir, "workers-cost.md"), markdown);
writeFileSync(
  path.join(dir, "workers-cost.json"),
  JSON.stringify({ total: TOTAL, unique: stream.unique, done: DONE, prices: PRICE, results }, null, 2),
);
