// Runs the fixture worker (crates/fixture-worker, built by scripts/build-worker.sh)
// on workerd through Miniflare, configured from the repository's wrangler.toml,
// with per-test overrides of the vars and the queue consumer settings.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Log, LogLevel, Miniflare } from "miniflare";
import { unstable_getMiniflareWorkerOptions } from "wrangler";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
export const QUEUE = "bq-orders";
/** The admin token the tests configure (EXAMPLE_ADMIN_TOKEN) and send. */
export const TOKEN = "test-admin-token-0123456789";
/** The Authorization header every route of the fixture worker needs. */
export const AUTH = { authorization: `Bearer ${TOKEN}` };
export const DLQ = "bq-orders-dlq";

const FIXTURE = JSON.parse(
  readFileSync(path.join(ROOT, "tests/conformance/fixtures/order-created.json"), "utf8"),
);

/** A valid envelope (the conformance fixture) with this meta.id and data. */
export function envelope(id, data = {}) {
  const e = structuredClone(FIXTURE);
  if (id === undefined) delete e.meta.id;
  else e.meta.id = id;
  e.data = { ...e.data, ...data };
  return e;
}

/**
 * Starts the worker. `vars` override wrangler.toml [vars]; `consumer` overrides
 * the bq-orders consumer (maxRetries, maxBatchSize, ...); `assets` serves www/ at /.
 * Deliveries are immediate (maxBatchTimeout 0) and retries undelayed. `persist`: a
 * directory where Durable Object and KV state outlives the worker (a restart with
 * other vars finds it again); otherwise state is in memory. The admin token
 * (TOKEN) and the test directives are on unless `vars` says otherwise (a var
 * set to `undefined` is left out). `port`: also listen on 127.0.0.1 there (0: any
 * free port), for another process (`serve.mjs`).
 */
export async function startWorker({ vars = {}, consumer = {}, assets = false, persist, port } = {}) {
  const { workerOptions, main } = unstable_getMiniflareWorkerOptions(
    path.join(ROOT, "wrangler.toml"),
  );
  if (!assets) delete workerOptions.assets; // the playground (www/), when asked for
  const queueConsumers = {};
  for (const [name, options] of Object.entries(workerOptions.queueConsumers)) {
    queueConsumers[name] = {
      ...options,
      maxBatchTimeout: 0,
      retryDelay: 0,
      ...(name === QUEUE ? consumer : {}),
    };
  }
  const mf = new Miniflare({
    ...workerOptions,
    modules: true,
    cf: false, // no network: skip fetching the Request.cf placeholder
    scriptPath: main,
    bindings: Object.fromEntries(
      Object.entries({
        ...workerOptions.bindings,
        EXAMPLE_ADMIN_TOKEN: TOKEN,
        EXAMPLE_TEST_DIRECTIVES: "1",
        ...vars,
      }).filter(([, v]) => v !== undefined),
    ),
    queueConsumers,
    ...(persist ? { durableObjectsPersist: persist, kvPersist: persist, d1Persist: persist } : {}),
    // A socket for other processes (serve.mjs); dispatchFetch needs none.
    ...(port === undefined ? {} : { host: "127.0.0.1", port }),
    log: new Log(process.env.BQ_WORKER_LOG ? LogLevel.DEBUG : LogLevel.WARN),
  });
  const url = await mf.ready;
  return new Worker(mf, url);
}

class Worker {
  constructor(mf, url) {
    this.mf = mf;
    /** Where the worker listens (with `port`: on that port, 0 for any free one). */
    this.url = url;
  }

  async dispose() {
    await this.mf.dispose();
  }

  async request(method, route, body) {
    const res = await this.mf.dispatchFetch(`http://worker${route}`, {
      method,
      headers: body === undefined ? AUTH : { ...AUTH, "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${route}: HTTP ${res.status}: ${text}`);
    return JSON.parse(text);
  }

  /** POST /publish: envelopes (objects) or raw strings. */
  publish(items) {
    return this.request("POST", "/publish", items);
  }

  stats() {
    return this.request("GET", "/stats");
  }

  effects() {
    return this.request("GET", "/effects");
  }

  deadLetters() {
    return this.request("GET", "/dead-letters");
  }

  forget(ids) {
    return this.request("POST", "/forget", { ids });
  }

  seen(keys) {
    return this.request("POST", "/store/seen", { keys });
  }

  /** Waits until `check(stats)` holds (the consumer runs asynchronously). */
  async waitForStats(check, what, timeoutMs = 20_000) {
    const deadline = Date.now() + timeoutMs;
    let stats;
    while (Date.now() < deadline) {
      stats = await this.stats();
      if (check(stats)) return stats;
      await sleep(25);
    }
    throw new Error(`timed out waiting for ${what}; last stats: ${JSON.stringify(stats)}`);
  }

  /** Publishes and waits until the consumer has seen `n` more deliveries. */
  async publishAndWait(items, n = items.length) {
    const before = (await this.stats()).deliveries;
    await this.publish(items);
    return this.waitForStats((s) => s.deliveries >= before + n, `${n} deliveries`);
  }

  /** Runs `sql` on the D1 database `binding` (default DEDUPE_D1): its rows. */
  async d1(sql, ...args) {
    const db = await this.mf.getD1Database("DEDUPE_D1");
    return (await db.prepare(sql).bind(...args).all()).results;
  }

  /** Calls the worker's queue() handler directly, as the runtime would. */
  async dispatchQueue(messages) {
    const fetcher = await this.mf.getWorker();
    return fetcher.queue(QUEUE, messages);
  }
}

/** Runs `body` with a fresh worker (`startWorker(options)`), disposed after. */
export async function withWorker(options, body) {
  const worker = await startWorker(options);
  try {
    return await body(worker);
  } finally {
    await worker.dispose();
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
