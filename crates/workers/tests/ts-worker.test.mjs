// A user's own TypeScript worker: examples/ts-worker copied to a scratch
// directory outside the repository, @babelqueue/dedupe installed there from
// `npm pack`, its src/handler.ts replaced by one that records each effect in KV
// (ts-worker/handler.ts), `tsc --strict` against @cloudflare/workers-types,
// bundled by wrangler's own bundler, and run on workerd (Miniflare) beside a
// dead-letter reader and the Rust fixture worker, all on one DedupeShard namespace.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { Log, LogLevel, Miniflare } from "miniflare";
import { unstable_getMiniflareWorkerOptions } from "wrangler";
import { ROOT, TOKEN, envelope } from "./harness.mjs";

const BIN = path.join(ROOT, "node_modules/.bin");
const run = (cmd, args, opts = {}) => {
  try {
    return execFileSync(cmd, args, { encoding: "utf8", maxBuffer: 64 << 20, stdio: ["ignore", "pipe", "pipe"], ...opts });
  } catch (e) {
    assert.fail(`${cmd} ${args.join(" ")} failed:\n${e.stdout ?? ""}${e.stderr ?? ""}`);
  }
};

const wasmRule = { type: "CompiledWasm", include: ["**/*.wasm"], fallthrough: true };
let scratch;
let packDir;
let mf;
/** The two workers' options as wrangler reads their wrangler.toml. */
let options;

/** Miniflare's options for a worker wrangler bundled into `dir` (of the scratch project). */
function bundled(name, dir) {
  const root = path.join(scratch, dir);
  const entry = readdirSync(root).find((f) => f.endsWith(".js"));
  return { name, modules: true, scriptPath: path.join(root, entry), modulesRoot: root, modulesRules: [wasmRule], cf: false };
}

/** Miniflare's options for the Rust fixture worker (built by scripts/build-worker.sh). */
function rustExample(bindings) {
  const { rust } = options;
  return {
    ...rust.workerOptions,
    name: "bq-dedupe-example",
    modules: true,
    scriptPath: rust.main,
    modulesRoot: path.dirname(rust.main),
    bindings: { ...rust.workerOptions.bindings, ...bindings },
    cf: false,
  };
}
let seq = 0;
/** Each traced invocation's events, as the streaming tail worker received them. */
const traces = [];

/**
 * The spans of the invocation whose spans carry `id` as messaging.message.id:
 * [{ name, parent, attributes }] (parent: the span's parent id, the invocation's
 * root for a top-level span).
 */
async function spansOf(id) {
  // A time-based 20 s deadline, as the harness's: 200 x 25 ms lost to a loaded machine.
  for (const deadline = Date.now() + 20_000; Date.now() < deadline; ) {
    for (const events of traces) {
      const spans = new Map();
      for (const { spanContext, event } of events) {
        if (event.type === "spanOpen") spans.set(event.spanId, { name: event.name, parent: spanContext.spanId, attributes: {} });
        if (event.type === "attributes") for (const { name, value } of event.info) spans.get(spanContext.spanId).attributes[name] = value;
        if (event.type === "spanClose") spans.get(spanContext.spanId).closed = event.outcome;
      }
      const all = [...spans.values()];
      if (all.some((s) => s.attributes["messaging.message.id"] === id)) return { root: events[0].event.spanId, spans: all };
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.fail(`no traced invocation carried ${id}`);
}
const msg = (body, attempts = 1, id = `ts-${++seq}`) => ({ id, timestamp: new Date(), attempts, body });

/** How many effects the TS handler recorded for each id. */
async function effects() {
  const kv = await mf.getKVNamespace("EFFECTS", "ts");
  const counts = {};
  for (const { name } of (await kv.list({ prefix: "effect:" })).keys) {
    const id = name.split(":")[1];
    counts[id] = (counts[id] ?? 0) + 1;
  }
  return counts;
}

before(async () => {
  packDir = mkdtempSync(path.join(tmpdir(), "bq-dedupe-tgz-"));
  run("npm", ["pack", "--pack-destination", packDir], { cwd: path.join(ROOT, "crates/js") });
  const [tarball] = readdirSync(packDir).filter((f) => f.endsWith(".tgz"));
  scratch = mkdtempSync(path.join(tmpdir(), "bq-ts-worker-"));
  cpSync(path.join(ROOT, "examples/ts-worker"), scratch, { recursive: true });
  cpSync(path.join(ROOT, "crates/workers/tests/ts-worker/handler.ts"), path.join(scratch, "src/handler.ts"));
  // The package from the tarball; the tools (tsc, wrangler, workers-types) are the repository's.
  const pkg = JSON.parse(readFileSync(path.join(scratch, "package.json"), "utf8"));
  const tools = pkg.devDependencies;
  delete pkg.devDependencies;
  pkg.dependencies["@babelqueue/dedupe"] = `file:${path.join(packDir, tarball)}`;
  writeFileSync(path.join(scratch, "package.json"), JSON.stringify(pkg, null, 2));
  run("npm", ["install", "--no-audit", "--no-fund", "--offline", "--no-package-lock"], { cwd: scratch });
  const installed = JSON.parse(readFileSync(path.join(ROOT, "node_modules/@cloudflare/workers-types/package.json"), "utf8"));
  assert.equal(installed.version, tools["@cloudflare/workers-types"], "the template pins the workers-types the tests use");
  cpSync(path.join(ROOT, "node_modules/@cloudflare/workers-types"), path.join(scratch, "node_modules/@cloudflare/workers-types"), { recursive: true });
  run(path.join(BIN, "tsc"), ["-p", "."], { cwd: scratch });
  const wrangler = (...args) =>
    run(path.join(BIN, "wrangler"), ["deploy", "--dry-run", ...args], {
      cwd: scratch,
      env: { ...process.env, WRANGLER_SEND_METRICS: "false" },
    });
  wrangler("--outdir", "dist");
  // The package's main export in a worker, a store made at module scope (which
  // killed the isolate at start-up when the web build needed an init step).
  writeFileSync(path.join(scratch, "plain.js"), `import { InMemoryStore, dedupe } from "@babelqueue/dedupe";
const store = new InMemoryStore();
export default { async fetch(request) {
  const outcome = await dedupe(await request.json(), store, () => {});
  return Response.json(outcome.kind);
} };
`);
  writeFileSync(path.join(scratch, "wrangler.plain.toml"), 'name = "plain"\nmain = "plain.js"\ncompatibility_date = "2025-06-01"\n');
  wrangler("--config", "wrangler.plain.toml", "--outdir", "dist-plain");
  // DurableObjectStore and KvStore for calling dedupeBatch yourself.
  writeFileSync(path.join(scratch, "stores.ts"), `import { DurableObjectStore, KvStore, dedupeBatch, dedupeQueue, forget, type EnvelopeInput, type QueueMessageReport, type StoreOptions } from "@babelqueue/dedupe/workers";
export default { async fetch(request: Request, env: object): Promise<Response> {
  if (new URL(request.url).pathname === "/queue") {
    // dedupeQueue with options in code: an observer, or a setting it refuses.
    const { bodies, options } = (await request.json()) as { bodies: unknown[]; options: Record<string, string> };
    const acted: string[] = [];
    const messages = bodies.map((body, i) => ({
      id: "q" + i, timestamp: new Date(), body, attempts: 1,
      ack: () => { acted.push("ack q" + i); }, retry: () => { acted.push("retry q" + i); },
    }));
    const observed: QueueMessageReport[] = [];
    try {
      const batch = { queue: "orders", messages, retryAll: () => { acted.push("retryAll"); } } as unknown as MessageBatch;
      const report = await dedupeQueue(batch, env, () => {}, { ...options, observer: (r) => { observed.push(r); } });
      const keys: (string | null)[] = report.messages.map((m) => m.key);
      return Response.json({ acted, observed: observed.map((r) => r.outcome), outcomes: report.outcomes, keys });
    } catch (e) {
      return Response.json({ error: String(e), type: e instanceof TypeError ? "TypeError" : typeof e, acted });
    }
  }
  const { envelopes, store, storeOptions, forgotten } = (await request.json()) as { envelopes: EnvelopeInput[]; store: "kv" | "do"; storeOptions?: StoreOptions; forgotten?: string };
  try {
    const s = store === "kv" ? new KvStore(env, storeOptions) : new DurableObjectStore(env, storeOptions);
    if (forgotten) await forget(forgotten, s);
    const options = store === "kv" ? undefined : { claimLeaseMs: 60_000 };
    const outcomes = await dedupeBatch(envelopes, s, () => {}, options);
    return Response.json(outcomes.map((o) => o.kind));
  } catch (e) {
    return Response.json({ error: String(e) });
  }
} };
`);
  writeFileSync(path.join(scratch, "wrangler.stores.toml"), 'name = "stores"\nmain = "stores.ts"\ncompatibility_date = "2025-06-01"\n');
  run(path.join(BIN, "tsc"), ["--strict", "--noEmit", "--module", "es2022", "--moduleResolution", "bundler", "--target", "es2022", "--lib", "es2022", "--types", "@cloudflare/workers-types", "stores.ts"], { cwd: scratch });
  wrangler("--config", "wrangler.stores.toml", "--outdir", "dist-stores");

  // dedupeQueueD1: the handler's D1 statements committed with the id.
  writeFileSync(path.join(scratch, "d1.ts"), `import { dedupeQueueD1 } from "@babelqueue/dedupe/workers";
interface Env { DEDUPE_D1: D1Database }
interface Directives { fail?: boolean; bad_statement_attempts?: number; odd_error?: boolean; trap_array?: boolean; delete_own_row?: boolean; expire_own_row?: boolean; batch_ack?: boolean; ack_all?: boolean; own_then?: boolean; snowflake?: string }
export default {
  async queue(batch: MessageBatch, env: Env): Promise<void> {
    await env.DEDUPE_D1.prepare("CREATE TABLE IF NOT EXISTS effects (id TEXT NOT NULL, attempt INTEGER NOT NULL)").run();
    await env.DEDUPE_D1.prepare("CREATE TABLE IF NOT EXISTS snow (id INTEGER PRIMARY KEY)").run();
    // db: the database the ids live in (env.DEDUPE_D1 here): the statements are prepared on it.
    await dedupeQueueD1(batch, env, (envelope, message, db) => {
      const data = envelope.data as Directives;
      // The batch's own settling methods (refused while a handler runs), then a failure.
      try {
        if (data.batch_ack) batch.messages.find((m) => m.id === message.id)?.ack();
        if (data.ack_all) batch.ackAll();
      } catch {
        // refused: the failure below stands
      }
      if (data.fail) throw new Error("told to fail");
      if (data.odd_error) {
        const odd = new Error("odd");
        (odd as { message: unknown }).message = null;
        throw odd;
      }
      if (data.trap_array) {
        return new Proxy([] as D1PreparedStatement[], { get(target, key) {
          if (key === "length") return 1;
          if (key === "0") throw new Error("no statement for you");
          return Reflect.get(target, key);
        } });
      }
      const statements = [db.prepare("INSERT INTO effects (id, attempt) VALUES (?1, ?2)").bind(envelope.meta.id, message.attempts)];
      // A promise of them with a \`then\` of its own that never calls back.
      if (data.own_then) {
        const p = Promise.resolve(statements);
        (p as unknown as { then: () => void }).then = () => {};
        return p;
      }
      // A failure between the handler and the write: the batch is refused.
      if (message.attempts <= (data.bad_statement_attempts ?? 0)) {
        statements.push(db.prepare("INSERT INTO no_such_table (id) VALUES (?1)").bind(envelope.meta.id));
      }
      // A statement that deletes the id's own row (a clean-up of the dedupe table).
      if (data.delete_own_row) statements.push(db.prepare("DELETE FROM bq_dedupe WHERE key = ?1").bind(envelope.meta.id));
      // ...or expires it (the row is still there, done by this run).
      if (data.expire_own_row) statements.push(db.prepare("UPDATE bq_dedupe SET expires_at = 1 WHERE key = ?1").bind(envelope.meta.id));
      // A row whose rowid is past 2^53 (a snowflake id as the primary key).
      if (data.snowflake) statements.push(db.prepare("INSERT INTO snow (id) VALUES (?1)").bind(data.snowflake));
      return statements;
    });
  },
};
`);
  writeFileSync(path.join(scratch, "wrangler.d1.toml"), 'name = "d1"\nmain = "d1.ts"\ncompatibility_date = "2025-06-01"\n');
  run(path.join(BIN, "tsc"), ["--strict", "--noEmit", "--module", "es2022", "--moduleResolution", "bundler", "--target", "es2022", "--lib", "es2022", "--types", "@cloudflare/workers-types", "d1.ts"], { cwd: scratch });
  wrangler("--config", "wrangler.d1.toml", "--outdir", "dist-d1");

  // The workers entry instantiates its module on first use: the exports keep
  // their names and arity; a module that cannot be instantiated (here the web
  // build's .wasm in place of the workers one) fails every call, the same way.
  writeFileSync(path.join(scratch, "lazy.js"), `import { validate, dedupeKey, dedupe, InMemoryStore, DedupeShard } from "@babelqueue/dedupe/workers";
export default { async fetch() {
  const shape = [validate, dedupeKey, dedupe, InMemoryStore, DedupeShard].map((f) => f.name + "/" + f.length);
  // An async export answers a promise whatever happens (a rejected one here).
  let answered;
  try {
    const p = dedupe(undefined, undefined, undefined);
    p.catch(() => {});
    answered = p instanceof Promise ? "promise" : typeof p;
  } catch {
    answered = "threw";
  }
  try {
    const outcome = await dedupe({ job: "j", trace_id: "t", data: {}, meta: { id: "lazy-1", schema_version: 1 } }, new InMemoryStore(), () => {});
    return Response.json({ shape, answered, kind: outcome.kind });
  } catch (e) {
    return Response.json({ shape, answered, error: String(e), type: e.constructor.name, cause: String(e.cause) });
  }
} };
`);
  writeFileSync(path.join(scratch, "wrangler.lazy.toml"), 'name = "lazy"\nmain = "lazy.js"\ncompatibility_date = "2025-06-01"\n');
  wrangler("--config", "wrangler.lazy.toml", "--outdir", "dist-lazy");
  cpSync(path.join(scratch, "dist-lazy"), path.join(scratch, "dist-lazy-bad"), { recursive: true });
  const lazyWasm = readdirSync(path.join(scratch, "dist-lazy-bad")).find((f) => f.endsWith(".wasm"));
  cpSync(path.join(ROOT, "crates/js/pkg/web/bq_dedupe_bg.wasm"), path.join(scratch, "dist-lazy-bad", lazyWasm));

  const ts = unstable_getMiniflareWorkerOptions(path.join(scratch, "wrangler.toml")).workerOptions;
  const rust = unstable_getMiniflareWorkerOptions(path.join(ROOT, "wrangler.toml"));
  delete rust.workerOptions.assets;
  options = { ts, rust };
  mf = new Miniflare({
    workers: [
      {
        ...ts,
        ...bundled("ts", "dist"),
        // The Rust worker's shards: one namespace for both languages.
        durableObjects: { DEDUPE_DO: { className: "DedupeShard", scriptName: "bq-dedupe-example", useSQLite: true } },
        bindings: { ...ts.bindings, DEDUPE_CLAIM_LEASE_SECONDS: "2" },
        kvNamespaces: { EFFECTS: "ts-effects" },
        queueConsumers: { orders: { maxBatchTimeout: 0, retryDelay: 0 } },
        queueProducers: { DEAD_LETTERS: { queueName: "orders-dlq" }, ORDERS: { queueName: "orders" } },
        streamingTails: ["tail"],
      },
      {
        // A streaming tail worker: every invocation of "ts" and the Rust worker
        // as the runtime reports it (its spans, their attributes), into `traces`.
        name: "tail",
        modules: true,
        script: `export default { tailStream(onset, env, ctx) {
          const events = [onset];
          return (e) => {
            events.push(e);
            if (e.event.type === "outcome") ctx.waitUntil(env.SINK.fetch("http://sink/", { method: "POST", body: JSON.stringify(events) }));
          };
        } };`,
        serviceBindings: {
          SINK: async (request) => {
            traces.push(await request.json());
            return new Response("ok");
          },
        },
        cf: false,
      },
      {
        // Reads the dead-letter queue into the same KV namespace.
        name: "dlq",
        modules: true,
        script: `export default { async queue(batch, env) {
          for (const m of batch.messages) { await env.EFFECTS.put("dead:" + m.id, JSON.stringify(m.body)); m.ack(); }
        } };`,
        kvNamespaces: { EFFECTS: "ts-effects" },
        queueConsumers: { "orders-dlq": { maxBatchTimeout: 0 } },
        cf: false,
      },
      {
        ...bundled("stores", "dist-stores"),
        durableObjects: { DEDUPE_DO: { className: "DedupeShard", scriptName: "bq-dedupe-example", useSQLite: true } },
        kvNamespaces: { DEDUPE_KV: "stores-kv" },
        // The consumer's setting, which a KvStore on the same env must ignore
        // (it was refused: a review).
        bindings: { DEDUPE_CLAIMING: "on" },
      },
      bundled("plain", "dist-plain"),
      bundled("lazy", "dist-lazy"),
      bundled("lazy-bad", "dist-lazy-bad"),
      {
        // A producer of string bodies as a structured clone ("v8"), which keeps
        // a lone surrogate ("text" would have made it U+FFFD already).
        name: "v8-producer",
        modules: true,
        script: `export default { async fetch(request, env) {
          for (const body of await request.json()) await env.ORDERS.send(body.replace("LONE", "\\ud800"), { contentType: "v8" });
          return new Response("sent");
        } };`,
        queueProducers: { ORDERS: { queueName: "orders" } },
        cf: false,
      },
      {
        ...bundled("d1", "dist-d1"),
        d1Databases: { DEDUPE_D1: "ts-d1" },
        bindings: { DEDUPE_DEAD_LETTER: "DEAD_LETTERS", DEDUPE_MAX_RETRIES: "1" },
        queueProducers: { DEAD_LETTERS: { queueName: "orders-dlq" } },
      },
      // The same worker with fingerprints on, which D1's exactly-once mode does not keep.
      {
        ...bundled("d1-fingerprints", "dist-d1"),
        d1Databases: { DEDUPE_D1: "ts-d1" },
        bindings: { DEDUPE_FINGERPRINT: "on" },
      },
      { ...rustExample({ EXAMPLE_ADMIN_TOKEN: "t0ken-for-the-ts-worker-test", EXAMPLE_TEST_DIRECTIVES: "1" }), streamingTails: ["tail"] },
    ],
    log: new Log(process.env.BQ_WORKER_LOG ? LogLevel.DEBUG : LogLevel.WARN),
  });
  await mf.ready;
});

after(async () => {
  await mf?.dispose();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
  if (packDir) rmSync(packDir, { recursive: true, force: true });
});

/** Hands `messages` to a worker's queue() as the runtime would: "ts" or "rust". */
const queue = async (who, messages) =>
  who === "ts"
    ? (await mf.getWorker("ts")).queue("orders", messages)
    : (await mf.getWorker("bq-dedupe-example")).queue("bq-orders", messages);

describe("a TypeScript worker from examples/ts-worker and the packed package", () => {
  test("the main export needs no init step in a worker: a store at module scope, dedupe runs then skips", async () => {
    const plain = await mf.getWorker("plain");
    const ask = async () => (await plain.fetch("http://x/", { method: "POST", body: JSON.stringify(envelope("plain-1")) })).json();
    assert.equal(await ask(), "run-ok");
    assert.equal(await ask(), "skip");
  });

  test("@babelqueue/dedupe/workers instantiates on first use: names and arity kept; a module that cannot be instantiated fails every call with its cause", async () => {
    const shape = ["validate/2", "dedupeKey/2", "dedupe/4", "InMemoryStore/1", "DedupeShard/2"];
    const lazy = await mf.getWorker("lazy");
    assert.deepEqual(await (await lazy.fetch("http://x/")).json(), { shape, answered: "promise", kind: "run-ok" });
    // The worker started (the module is not instantiated at start-up); each call fails alike.
    const bad = await mf.getWorker("lazy-bad");
    for (let i = 0; i < 2; i++) {
      const answer = await (await bad.fetch("http://x/")).json();
      assert.equal(answer.type, "Error", JSON.stringify(answer));
      assert.equal(answer.answered, "promise", "an async export rejects, it does not throw");
      assert.match(answer.error, /its WebAssembly module could not be instantiated/);
      assert.match(answer.cause, /Import/);
    }
  });

  test("object, text and bytes bodies; duplicates in one batch and across batches run once", async () => {
    const bodies = [
      envelope("ts-obj"),
      JSON.stringify(envelope("ts-text")),
      new TextEncoder().encode(JSON.stringify(envelope("ts-bytes"))),
      envelope("ts-obj"),
    ];
    const first = await queue("ts", bodies.map((b) => msg(b)));
    assert.equal(first.explicitAcks.length, 4, JSON.stringify(first));
    const again = await queue("ts", bodies.map((b) => msg(b)));
    assert.equal(again.explicitAcks.length, 4, JSON.stringify(again));
    const counts = await effects();
    assert.deepEqual(
      { obj: counts["ts-obj"], text: counts["ts-text"], bytes: counts["ts-bytes"] },
      { obj: 1, text: 1, bytes: 1 },
    );
  });

  test("a blank job gives way to urn: the handler's envelope carries it as job, the body as sent (a review)", async () => {
    const blank = { ...envelope("ts-blank-job"), job: "", urn: "urn:babel:orders:paid" };
    const first = await queue("ts", [msg(blank), msg(JSON.stringify({ ...blank, meta: { ...blank.meta, id: "ts-blank-text" } }))]);
    assert.equal(first.explicitAcks.length, 2, JSON.stringify(first));
    const kv = await mf.getKVNamespace("EFFECTS", "ts");
    assert.equal(await kv.get("job:ts-blank-job"), "urn:babel:orders:paid");
    assert.equal(await kv.get("job:ts-blank-text"), "urn:babel:orders:paid");
    assert.equal(blank.job, "", "the producer's object is left as it was");
  });

  const A_ = "messaging.babelqueue.dedupe.";
  for (const who of ["ts", "rust"]) {
    test(`${who}: each delivery is a span in the runtime's traces, with BabelQueue's attributes and the dedupe outcome`, async () => {
      const fresh = { ...envelope(`${who}-span-1`), trace_id: "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b", attempts: 1 };
      fresh.meta.queue = "orders";
      await queue(who, [msg(fresh)]);
      const failing = envelope(`${who}-span-2`, { fail_attempts: 5 });
      // Its last attempt (max_retries 3): dead-lettered, so the span says
      // `poison`, what the queue was told (it said `retry`: a review).
      const last = envelope(`${who}-span-3`, { fail_attempts: 9 });
      const result = await queue(who, [msg(fresh), msg(failing), msg(fresh), msg("not json"), msg(last, 4)]);
      assert.equal(result.explicitAcks.length + result.retryMessages.length, 5, JSON.stringify(result));
      const { root, spans } = await spansOf(`${who}-span-2`);
      const deliveries = spans.filter((s) => s.name.startsWith("process "));
      assert.equal(deliveries.length, 5, JSON.stringify(spans));
      const [skipped, failed, follower, rejected, lastAttempt] = deliveries;
      assert.equal(lastAttempt.attributes[A_ + "outcome"], "run-failed");
      assert.equal(lastAttempt.attributes[A_ + "disposition"], "poison");
      assert.equal(failed.attributes[A_ + "disposition"], "retry");
      const A = "messaging.babelqueue.dedupe.";
      assert.equal(skipped.name, "process urn:babel:orders:created");
      assert.deepEqual(skipped.attributes, {
        "messaging.system": "babelqueue",
        "messaging.operation": "process",
        "messaging.destination.name": "orders",
        "messaging.message.id": `${who}-span-1`,
        "messaging.message.conversation_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
        "messaging.babelqueue.attempts": 1,
        [A + "outcome"]: "skip",
        [A + "disposition"]: "ack",
        [A + "duplicate"]: true,
        [A + "mode"]: "claiming",
        [A + "claimed"]: false,
      });
      assert.equal(failed.attributes[A + "outcome"], "run-failed");
      assert.equal(failed.attributes[A + "claimed"], true);
      assert.equal(failed.attributes["error.type"], "run-failed");
      assert.equal(follower.attributes[A + "duplicate"], true);
      assert.equal(rejected.name, "process ");
      assert.equal(rejected.attributes[A + "outcome"], "rejected");
      assert.equal(rejected.attributes[A + "disposition"], "poison");
      for (const s of deliveries) {
        assert.equal(s.parent, root, "a child of the queue invocation");
        assert.equal(s.closed, "ok");
      }
    });
  }

  // A structured-clone body holding Maps (a serde map sent with contentType
  // "v8") was deduped as the object it stands for, but the handler got the
  // Map itself: `envelope.meta.id` undefined (a trial). It gets the object.
  // A handler that acked through the batch (its own message objects, or
  // ackAll) and then failed lost its message, the report saying retry (a
  // trial): those throw in a handler too, and the message is retried.
  test("the batch's own ack() and ackAll() refuse in a handler: the failed message is retried, not acked", async () => {
    const d1 = async (messages) => (await mf.getWorker("d1")).queue("orders", messages);
    const one = await d1([msg(envelope("ts-batch-ack", { batch_ack: true, fail: true }), 1, "ba-1")]);
    assert.deepEqual(one.explicitAcks, [], JSON.stringify(one));
    assert.deepEqual(one.retryMessages.map((r) => r.msgId), ["ba-1"], JSON.stringify(one));
    const all = await d1([msg(envelope("ts-ack-all", { ack_all: true, fail: true }), 1, "aa-1")]);
    assert.equal(all.ackAll, false, JSON.stringify(all));
    assert.deepEqual(all.retryMessages.map((r) => r.msgId), ["aa-1"], JSON.stringify(all));
    // The consumer's own acks still reach the queue once the handlers are done,
    // after a handler whose promise has a `then` of its own too (it is awaited).
    const ok = await d1([msg(envelope("ts-own-then", { own_then: true }), 1, "ot-1"), msg(envelope("ts-batch-ok"), 1, "ok-1")]);
    assert.deepEqual(ok.explicitAcks.sort(), ["ok-1", "ot-1"], JSON.stringify(ok));
  });

  test("a v8 body of Maps: the handler gets the object the Maps stand for, once", async () => {
    const asMap = (o) => new Map(Object.entries(o));
    const e = envelope("ts-map");
    const body = asMap({ ...e, meta: asMap(e.meta), data: asMap(e.data) });
    const first = await queue("ts", [msg(body)]);
    assert.equal(first.explicitAcks.length, 1, JSON.stringify(first));
    const again = await queue("ts", [msg(body)]);
    assert.equal(again.explicitAcks.length, 1, JSON.stringify(again));
    assert.equal((await effects())["ts-map"], 1);
  });

  test("the template's POST /publish puts envelopes on its queue: each runs once, a duplicate is skipped", async () => {
    const ts = await mf.getWorker("ts");
    const published = [envelope("ts-pub-1"), envelope("ts-pub-2"), envelope("ts-pub-1")];
    const sent = await (await ts.fetch("http://x/publish", { method: "POST", body: JSON.stringify(published) })).json();
    assert.deepEqual(sent, { sent: 3 });
    assert.equal((await ts.fetch("http://x/")).status, 404);
    // Not JSON: a 400 that says so (it was a 500 with a stack trace); over
    // sendBatch's 100 messages: sent in batches (it was the platform's error).
    const notJson = await ts.fetch("http://x/publish", { method: "POST", body: "{nope" });
    assert.equal(notJson.status, 400);
    assert.match(await notJson.text(), /not JSON/);
    const many = Array.from({ length: 150 }, (_, i) => envelope(`ts-pub-many-${i}`));
    const sentMany = await (await ts.fetch("http://x/publish", { method: "POST", body: JSON.stringify(many) })).json();
    assert.deepEqual(sentMany, { sent: 150 });
    const both = async () => { const c = await effects(); return c["ts-pub-1"] && c["ts-pub-2"]; };
    // A time-based 20 s deadline: 200 x 25 ms lost to a loaded machine.
    for (const deadline = Date.now() + 20_000; Date.now() < deadline && !(await both()); ) await new Promise((r) => setTimeout(r, 25));
    await new Promise((r) => setTimeout(r, 300)); // a late duplicate would show by now
    const counts = await effects();
    assert.deepEqual([counts["ts-pub-1"], counts["ts-pub-2"]], [1, 1], JSON.stringify(counts));
  });

  test("a thrown handler is retried, and the redelivery runs it once", async () => {
    const body = envelope("ts-retry", { fail_attempts: 1 });
    const first = await queue("ts", [msg(body, 1, "r-1")]);
    assert.deepEqual(first.retryMessages.map((r) => r.msgId), ["r-1"], JSON.stringify(first));
    assert.equal((await effects())["ts-retry"], undefined);
    const second = await queue("ts", [msg(body, 2, "r-1")]);
    assert.deepEqual(second.explicitAcks, ["r-1"], JSON.stringify(second));
    assert.equal((await effects())["ts-retry"], 1);
  });

  // A trial's finding: Cloudflare keeps a message's first ack() or retry(), so a
  // handler's own ack() then a throw lost the message (the consumer's retry
  // ignored), and its retry() then a return was recorded done (its redelivery
  // skipped). The handler's message refuses both: a failed run, retried.
  test("a handler that calls the message's own ack() or retry() fails, retried, its effect never recorded", async () => {
    for (const settle of ["ack", "retry"]) {
      const id = `ts-settle-${settle}`;
      const result = await queue("ts", [msg(envelope(id, { settle }), 1, `s-${settle}`)]);
      assert.deepEqual(result.retryMessages.map((r) => r.msgId), [`s-${settle}`], JSON.stringify(result));
      assert.deepEqual(result.explicitAcks, [], JSON.stringify(result));
      assert.equal((await effects())[id], undefined, settle);
    }
  });

  test("poison goes to the dead-letter queue with the BabelQueue dead_letter block", async () => {
    const poison = { meta: { id: "ts-poison", schema_version: 1 } }; // no job
    const result = await queue("ts", [msg(poison, 1, "p-1")]);
    assert.deepEqual(result.explicitAcks, ["p-1"], JSON.stringify(result));
    const kv = await mf.getKVNamespace("EFFECTS", "dlq");
    let dead;
    // Its own dead letter: other tests' poison goes to the same queue. A 20 s
    // deadline: 100 x 50 ms lost to a loaded machine.
    for (const deadline = Date.now() + 20_000; Date.now() < deadline && !dead; ) {
      const { keys } = await kv.list({ prefix: "dead:" });
      for (const { name } of keys) {
        const letter = JSON.parse(await kv.get(name));
        if (letter?.meta?.id === "ts-poison") dead = letter;
      }
      if (!dead) await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(dead, "a dead letter arrived");
    assert.equal(dead.dead_letter.reason, "poison");
    assert.equal(dead.dead_letter.original_queue, "orders");
    assert.equal(dead.meta.id, "ts-poison");
  });

  test("a handler slower than its 2 s lease keeps its claims (renewed): a second queue() parks, one effect per id", async () => {
    const ids = ["ts-slow-0", "ts-slow-1"];
    // (Each handler 4 s: the second queue() comes before the first handler
    // ends, with room for a loaded machine; at 2.6 s the margin was 300 ms.)
    const batch = () => ids.map((id) => msg(envelope(id, { sleep_ms: 4000 })));
    const first = queue("ts", batch());
    await new Promise((r) => setTimeout(r, 2300)); // past the lease the claims began with
    const second = await queue("ts", batch());
    assert.equal(second.retryMessages.length, ids.length, `parked: ${JSON.stringify(second)}`);
    assert.equal((await first).explicitAcks.length, ids.length);
    const counts = await effects();
    assert.deepEqual(ids.map((id) => counts[id]), [1, 1]);
  });

  test("two consumers racing over the same ids: one effect each", async () => {
    const ids = Array.from({ length: 8 }, (_, i) => `ts-race-${i}`);
    const batch = () => ids.map((id) => msg(envelope(id, { sleep_ms: 50 })));
    const [a, b] = await Promise.all([queue("ts", batch()), queue("ts", batch())]);
    assert.equal(a.explicitAcks.length + b.explicitAcks.length + a.retryMessages.length + b.retryMessages.length, 16);
    const counts = await effects();
    assert.deepEqual(ids.map((id) => counts[id]), ids.map(() => 1));
  });

  test("claims left by a dead invocation park the ids; once they lapse each runs once", async () => {
    const ids = ["ts-dead-0", "ts-dead-1"];
    // A consumer that claimed the ids and died (through the Rust worker's store route: one namespace).
    const claimed = await (await mf.getWorker("bq-dedupe-example")).fetch("http://x/store/claim", {
      method: "POST",
      headers: { authorization: "Bearer t0ken-for-the-ts-worker-test", "content-type": "application/json" },
      body: JSON.stringify({ keys: ids, lease_ms: 1500 }),
    });
    assert.ok((await claimed.json()).claims.every((c) => c.state === "acquired"));
    const parked = await queue("ts", ids.map((id) => msg(envelope(id))));
    assert.equal(parked.retryMessages.length, ids.length, JSON.stringify(parked));
    assert.ok(parked.retryMessages.every((r) => r.delaySeconds >= 1), "parked until the claim ends");
    await new Promise((r) => setTimeout(r, 1600));
    const ran = await queue("ts", ids.map((id) => msg(envelope(id), 2)));
    assert.equal(ran.explicitAcks.length, ids.length, JSON.stringify(ran));
    const counts = await effects();
    assert.deepEqual(ids.map((id) => counts[id]), [1, 1]);
  });

  test("DurableObjectStore and KvStore as the store of dedupeBatch: in-batch and later duplicates skipped; one namespace with the queue consumer", async () => {
    const stores = await mf.getWorker("stores");
    const ask = async (store, ids) =>
      (await stores.fetch("http://x/", { method: "POST", body: JSON.stringify({ store, envelopes: ids.map((id) => envelope(id)) }) })).json();
    assert.deepEqual(await ask("do", ["st-1", "st-2", "st-1"]), ["run-ok", "run-ok", "skip"]);
    assert.deepEqual(await ask("do", ["st-1", "st-2"]), ["skip", "skip"]);
    await queue("ts", [msg(envelope("st-3"))]); // run by the queue consumer
    assert.deepEqual(await ask("do", ["st-3"]), ["skip"]);
    assert.deepEqual(await ask("kv", ["kv-1", "kv-1"]), ["run-ok", "skip"]);
    assert.deepEqual(await ask("kv", ["kv-1"]), ["skip"]);
  });

  test("a store object keeps dedupeQueue's keys and window: DEDUPE_KEY_PREFIX and DEDUPE_TTL_SECONDS applied, forget reaches the consumer's id, the consumer's own settings refused (a trial: ids run twice)", async () => {
    const stores = await mf.getWorker("stores");
    const post = async (path, body) => (await stores.fetch("http://x" + path, { method: "POST", body: JSON.stringify(body) })).json();
    const storeOptions = { DEDUPE_KEY_PREFIX: "pfx:" };
    const consumed = async (id) => (await post("/queue", { bodies: [envelope(id)], options: storeOptions })).observed;
    assert.deepEqual(await consumed("pfx-1"), ["run-ok"]);
    assert.deepEqual(await post("/", { store: "do", storeOptions, envelopes: [envelope("pfx-1"), envelope("pfx-2")] }), ["skip", "run-ok"]);
    assert.deepEqual(await consumed("pfx-2"), ["skip"]);
    // forget(id, store) forgets the id the consumer ran.
    assert.deepEqual(await post("/", { store: "do", storeOptions, forgotten: "pfx-1", envelopes: [] }), []);
    assert.deepEqual(await consumed("pfx-1"), ["run-ok"]);
    // A write without ttlMs lasts the configured window (it was kept for ever).
    const ttl = { DEDUPE_TTL_SECONDS: "1" };
    assert.deepEqual(await post("/", { store: "do", storeOptions: ttl, envelopes: [envelope("ttl-1"), envelope("ttl-1")] }), ["run-ok", "skip"]);
    await new Promise((r) => setTimeout(r, 1500));
    assert.deepEqual(await post("/", { store: "do", storeOptions: ttl, envelopes: [envelope("ttl-1")] }), ["run-ok"], "remembered 1 s");
    for (const name of ["DEDUPE_CLAIMING", "DEDUPE_FINGERPRINT", "DEDUPE_DEAD_LETTER"]) {
      const refused = await post("/", { store: "do", storeOptions: { [name]: "off" }, envelopes: [] });
      assert.match(refused.error ?? "", new RegExp(`${name} is dedupeQueue's`), JSON.stringify(refused));
    }
  });

  test("dedupeQueue options in code: the observer sees each message's report; a setting it refuses is a TypeError naming it", async () => {
    const stores = await mf.getWorker("stores");
    const post = async (body) => (await stores.fetch("http://x/queue", { method: "POST", body: JSON.stringify(body) })).json();
    const ok = await post({ bodies: [envelope("opt-1"), envelope("opt-1")], options: { DEDUPE_KEY_PREFIX: "opts:" } });
    assert.deepEqual(ok.observed, ["run-ok", "skip"]);
    assert.deepEqual(ok.acted, ["ack q0", "ack q1"]);
    // Each message's store key, its meta.id under the prefix (a trial's
    // finding: the log could name only Cloudflare's id); null without one.
    assert.deepEqual(ok.keys, ["opts:opt-1", "opts:opt-1"]);
    assert.deepEqual(ok.outcomes, { "run-ok": 1, skip: 1 });
    const refused = await post({ bodies: [envelope("opt-2")], options: { DEDUPE_CLAIMING: "maybe" } });
    assert.equal(refused.type, "TypeError", JSON.stringify(refused));
    assert.match(refused.error, /DEDUPE_CLAIMING/);
    // Each message marked for retry before the rejection: a queue() that
    // catches it and returns had the whole batch acked, unrun (a trial).
    assert.deepEqual(refused.acted, ["retryAll"], JSON.stringify(refused));
    // A misspelt setting is refused too, not ignored (a trial's finding).
    const misspelt = await post({ bodies: [envelope("opt-2")], options: { DEDUPE_CLAIMNG: "off" } });
    assert.equal(misspelt.type, "TypeError", JSON.stringify(misspelt));
    assert.match(misspelt.error, /DEDUPE_CLAIMNG is no setting/);
    // A store whose binding is missing says which wrangler.toml lines bind it
    // (the dead-letter producer too), without workers-rs's own words ("invalid
    // kv store": a trial's finding).
    for (const [options, lines] of [
      [{ DEDUPE_STORE: "kv", DEDUPE_CLAIMING: "off", DEDUPE_KV_BINDING: "NO_KV" }, /\[\[kv_namespaces\]\] binding = "NO_KV"/],
      [{ DEDUPE_STORE: "d1", DEDUPE_D1_BINDING: "NO_D1" }, /\[\[d1_databases\]\] binding = "NO_D1"/],
      [{ DEDUPE_DO_BINDING: "NO_DO" }, /\[\[durable_objects\.bindings\]\] name = "NO_DO"/],
      [{ DEDUPE_DEAD_LETTER: "NO_DLQ" }, /\[\[queues\.producers\]\] binding = "NO_DLQ"/],
    ]) {
      const unbound = await post({ bodies: [envelope("opt-3")], options });
      assert.match(unbound.error ?? "", lines, JSON.stringify(unbound));
      assert.match(unbound.error, /is missing, or is not a/, JSON.stringify(unbound));
      assert.deepEqual(unbound.acted, ["retryAll"], JSON.stringify(unbound));
      assert.doesNotMatch(unbound.error, /invalid kv store|Binding `/, JSON.stringify(unbound));
    }
    // Claiming on KV names both stores that claim (it named the Durable Object alone).
    const kvClaims = await post({ bodies: [envelope("opt-4")], options: { DEDUPE_STORE: "kv", DEDUPE_CLAIMING: "on" } });
    assert.match(kvClaims.error ?? "", /durable-object or d1/, JSON.stringify(kvClaims));
  });

  test("the Rust fixture worker and the TypeScript worker dedupe together on one DedupeShard namespace", async () => {
    const stats = async () => (await (await mf.getWorker("bq-dedupe-example")).fetch("http://x/stats", {
      headers: { authorization: "Bearer t0ken-for-the-ts-worker-test" },
    })).json();
    // Run by the TypeScript worker, skipped by the Rust one.
    await queue("ts", [msg(envelope("both-1"))]);
    const before = await stats();
    const rust = await queue("rust", [msg(envelope("both-1"), 1, "b-1")]);
    assert.deepEqual(rust.explicitAcks, ["b-1"], JSON.stringify(rust));
    const mid = await stats();
    assert.equal(mid.runs - before.runs, 0, "the Rust worker skipped the id the TS worker ran");
    assert.equal(mid.skips - before.skips, 1);
    // Run by the Rust worker, skipped by the TypeScript one.
    await queue("rust", [msg(envelope("both-2"), 1, "b-2")]);
    assert.equal((await stats()).runs - mid.runs, 1);
    await queue("ts", [msg(envelope("both-2"))]);
    const counts = await effects();
    assert.equal(counts["both-1"], 1);
    assert.equal(counts["both-2"], undefined, "the TS worker skipped the id the Rust worker ran");
  });
});

describe("dedupeQueueD1: the handler's D1 statements and the id in one batch", () => {
  const d1 = async (sql, ...args) => (await (await mf.getD1Database("DEDUPE_D1", "d1")).prepare(sql).bind(...args).all()).results;
  const d1Effects = async () =>
    Object.fromEntries((await d1("SELECT id, count(*) AS n FROM effects GROUP BY id")).map((r) => [r.id, r.n]));
  const marked = async (id) => (await d1("SELECT state FROM bq_dedupe WHERE key = ?1", id))[0]?.state;
  const queueD1 = async (messages) => (await mf.getWorker("d1")).queue("orders", messages);

  test("duplicates in a batch and across batches: one effect row per id", async () => {
    const first = await queueD1([msg(envelope("d1ts-a")), msg(envelope("d1ts-a")), msg(envelope("d1ts-b"))]);
    assert.equal(first.explicitAcks.length, 3, JSON.stringify(first));
    const again = await queueD1([msg(envelope("d1ts-a")), msg(envelope("d1ts-b"))]);
    assert.equal(again.explicitAcks.length, 2, JSON.stringify(again));
    const counts = await d1Effects();
    assert.deepEqual([counts["d1ts-a"], counts["d1ts-b"]], [1, 1]);
    assert.equal(await marked("d1ts-a"), 1);
  });

  test("a thrown handler writes nothing and leaves the id unmarked (retried)", async () => {
    const result = await queueD1([msg(envelope("d1ts-throws", { fail: true }), 1, "t-1")]);
    assert.deepEqual(result.retryMessages.map((r) => r.msgId), ["t-1"], JSON.stringify(result));
    assert.equal((await d1Effects())["d1ts-throws"], undefined);
    assert.equal(await marked("d1ts-throws"), undefined);
  });

  test("an Error whose message is null, or statements that throw when read, fail that delivery alone", async () => {
    // Both used to panic in the module: the batch never settled, and its
    // successes ran again unreported on the redelivery.
    const bodies = [envelope("d1ts-ok-1"), envelope("d1ts-odd", { odd_error: true }), envelope("d1ts-trap", { trap_array: true }), envelope("d1ts-ok-2")];
    const first = await queueD1(bodies.map((b, i) => msg(b, 1, `o-${i}`)));
    assert.deepEqual(first.retryMessages.map((r) => r.msgId).sort(), ["o-1", "o-2"], JSON.stringify(first));
    assert.deepEqual(first.explicitAcks.sort(), ["o-0", "o-3"], JSON.stringify(first));
    const again = await queueD1([msg(bodies[0], 2, "o-0"), msg(bodies[3], 2, "o-3")]);
    assert.deepEqual(again.explicitAcks.sort(), ["o-0", "o-3"], JSON.stringify(again));
    const counts = await d1Effects();
    assert.deepEqual([counts["d1ts-ok-1"], counts["d1ts-ok-2"], counts["d1ts-odd"], counts["d1ts-trap"]], [1, 1, undefined, undefined]);
  });

  test("a rowid past 2^53 in the batch, or left on the connection: the run is run-ok, and so are the next (a review)", async () => {
    // D1's meta said last_row_id 1790000000000000000 (past a JS number's
    // exact integers), which workers-rs could not read: every call failed
    // after it had committed, a committed run retried for ever.
    const first = await queueD1([msg(envelope("d1ts-snow", { snowflake: "1790000000000000000" }), 1, "s-1")]);
    assert.deepEqual(first.explicitAcks, ["s-1"], JSON.stringify(first));
    const next = await queueD1([msg(envelope("d1ts-after-snow"), 1, "s-2")]);
    assert.deepEqual(next.explicitAcks, ["s-2"], JSON.stringify(next));
    assert.deepEqual(await d1("SELECT count(*) AS n FROM effects WHERE id IN ('d1ts-snow', 'd1ts-after-snow')"), [{ n: 2 }]);
    assert.equal(await marked("d1ts-snow"), 1);
  });

  test("a failure between the handler and the write writes nothing; the redelivery writes once", async () => {
    const body = envelope("d1ts-refused", { bad_statement_attempts: 1 });
    const first = await queueD1([msg(body, 1, "f-1")]);
    assert.deepEqual(first.retryMessages.map((r) => r.msgId), ["f-1"], JSON.stringify(first));
    assert.equal((await d1Effects())["d1ts-refused"], undefined);
    assert.equal(await marked("d1ts-refused"), undefined, "unmarked");
    const second = await queueD1([msg(body, 2, "f-1")]);
    assert.deepEqual(second.explicitAcks, ["f-1"], JSON.stringify(second));
    assert.deepEqual(await d1("SELECT attempt FROM effects WHERE id = ?1", "d1ts-refused"), [{ attempt: 2 }]);
    assert.equal(await marked("d1ts-refused"), 1);
  });
});

describe("dedupeQueueD1: a statement D1 refuses, fingerprints (issue #25, finding 4; failed on 78431e6)", () => {
  const d1 = async (sql, ...args) => (await (await mf.getD1Database("DEDUPE_D1", "d1")).prepare(sql).bind(...args).all()).results;
  const marked = async (id) => (await d1("SELECT state FROM bq_dedupe WHERE key = ?1", id))[0]?.state;
  const queueD1 = async (messages) => (await mf.getWorker("d1")).queue("orders", messages);
  // The dead letter of meta.id `id`, as the DLQ consumer stored it (waited for).
  const deadLetterOf = async (id) => {
    const kv = await mf.getKVNamespace("EFFECTS", "dlq");
    // A time-based 20 s deadline: 100 x 50 ms lost to a loaded machine.
    for (const deadline = Date.now() + 20_000; Date.now() < deadline; ) {
      for (const { name } of (await kv.list({ prefix: "dead:" })).keys) {
        const letter = JSON.parse(await kv.get(name));
        if (letter.meta?.id === id) return letter;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    return undefined;
  };

  test("refused on the last attempt: dead-lettered as the run's failure with D1's message, not dropped", async () => {
    const body = envelope("d1ts-refused-always", { bad_statement_attempts: 99 });
    const result = await queueD1([msg(body, 2, "r-2")]);
    assert.deepEqual(result.explicitAcks, ["r-2"], `dead-lettered, then acked: ${JSON.stringify(result)}`);
    const dead = await deadLetterOf("d1ts-refused-always");
    assert.ok(dead, "a dead letter arrived");
    assert.equal(dead.dead_letter.reason, "failed");
    assert.equal(dead.dead_letter.exception, "transaction-aborted", JSON.stringify(dead.dead_letter));
    assert.match(dead.dead_letter.error, /no such table: no_such_table/);
    // D1's words, not workers-rs's debug dump with a JS stack (a trial's finding).
    assert.doesNotMatch(dead.dead_letter.error, /D1Error|JsValue|\n\s+at /, dead.dead_letter.error);
    assert.equal(await marked("d1ts-refused-always"), undefined, "nothing written");
  });

  test("a statement that deletes the id's own row: the batch is refused, not run-ok with the id unrecorded (its effect ran again on every delivery)", async () => {
    const body = envelope("d1ts-own-row", { delete_own_row: true });
    const first = await queueD1([msg(body, 1, "d-1")]);
    assert.deepEqual(first.retryMessages.map((m) => m.msgId), ["d-1"], JSON.stringify(first));
    // The last attempt: dead-lettered as the run's failure, saying why.
    const last = await queueD1([msg(body, 2, "d-2")]);
    assert.deepEqual(last.explicitAcks, ["d-2"], JSON.stringify(last));
    const dead = await deadLetterOf("d1ts-own-row");
    assert.equal(dead?.dead_letter.reason, "failed", JSON.stringify(dead));
    assert.match(dead.dead_letter.error, /deleted or changed this id's row/);
    assert.deepEqual(await d1("SELECT attempt FROM effects WHERE id = ?1", "d1ts-own-row"), [], "no effect committed");
    assert.equal(await marked("d1ts-own-row"), undefined);
    // Expiring the row is refused the same way (it committed, the id read as
    // free: a review's finding).
    const expired = await queueD1([msg(envelope("d1ts-own-expired", { expire_own_row: true }), 1, "e-1")]);
    assert.deepEqual(expired.retryMessages.map((m) => m.msgId), ["e-1"], JSON.stringify(expired));
    assert.deepEqual(await d1("SELECT attempt FROM effects WHERE id = ?1", "d1ts-own-expired"), [], "no effect committed");
  });

  test("DEDUPE_FINGERPRINT on: the batch is refused before any handler runs, not each message after", async () => {
    const result = await (await mf.getWorker("d1-fingerprints")).queue("orders", [msg(envelope("d1ts-fp"), 1, "fp-1")]);
    assert.equal(result.outcome, "exception", JSON.stringify(result));
    // Marked for retry by the consumer itself, so a queue() that swallows the
    // error loses nothing either (a trial).
    assert.equal(result.retryBatch.retry, true, JSON.stringify(result));
    assert.deepEqual(await d1("SELECT id FROM effects WHERE id = ?1", "d1ts-fp"), []);
    assert.equal(await marked("d1ts-fp"), undefined);
  });
});

describe("a text body with a lone surrogate (issue #25, finding 8; failed on 78431e6)", () => {
  test("sent as a structured clone: poison (dead-lettered, never run), never another id's duplicate", async () => {
    // Read as U+FFFD, "lone-\ud800-1" and "lone-\ufffd-1" were one id: the
    // second was skipped as a duplicate of the first without ever running.
    const text = (id) => JSON.stringify(envelope(id));
    const producer = await mf.getWorker("v8-producer");
    await producer.fetch("http://producer/", { method: "POST", body: JSON.stringify([text("lone-LONE-1")]) });
    const kv = await mf.getKVNamespace("EFFECTS", "dlq");
    let dead;
    // A time-based 20 s deadline: 100 x 50 ms lost to a loaded machine.
    for (const deadline = Date.now() + 20_000; Date.now() < deadline && !dead; ) {
      for (const { name } of (await kv.list({ prefix: "dead:" })).keys) {
        const letter = JSON.parse(await kv.get(name));
        if (String(letter.body ?? "").includes("lone-")) dead = letter;
      }
      if (!dead) await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(dead, "a dead letter arrived");
    assert.equal(dead.dead_letter.reason, "poison", JSON.stringify(dead.dead_letter));
    assert.match(dead.dead_letter.error, /UTF-8/);
    // The well-formed id it used to be confused with still runs.
    const result = await queue("ts", [msg(envelope("lone-\ufffd-1"))]);
    assert.equal(result.explicitAcks.length, 1, JSON.stringify(result));
    assert.equal((await effects())["lone-\ufffd-1"], 1);
  });
});

describe("the store testkit against the JavaScript DedupeShard", () => {
  test("the Rust store client over the TypeScript worker's DedupeShard follows the record model (crates/workerd-testkit)", async () => {
    const { ts, rust } = options;
    // The Rust fixture worker's /store routes, its DEDUPE_DO bound to the class the
    // TypeScript worker exports from the package: every shard request is answered
    // by the package's DedupeShard.
    const served = new Miniflare({
      host: "127.0.0.1",
      port: 0,
      workers: [
        {
          ...rustExample({ EXAMPLE_ADMIN_TOKEN: TOKEN }),
          durableObjects: {
            ...rust.workerOptions.durableObjects,
            DEDUPE_DO: { className: "DedupeShard", scriptName: "ts", useSQLite: true },
          },
        },
        {
          ...ts,
          ...bundled("ts", "dist"),
          queueConsumers: {},
          queueProducers: {},
          kvNamespaces: { EFFECTS: "ts-effects" },
        },
      ],
      log: new Log(process.env.BQ_WORKER_LOG ? LogLevel.DEBUG : LogLevel.WARN),
    });
    try {
      const url = String(await served.ready).replace(/\/$/, "");
      run("cargo", ["test", "-p", "babelqueue-dedupe-workerd-testkit", "--test", "durable_object"], {
        cwd: ROOT,
        env: { ...process.env, BQ_TEST_WORKER_URL: url },
      });
    } finally {
      await served.dispose();
    }
  });
});
