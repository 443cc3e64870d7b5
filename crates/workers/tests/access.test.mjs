// The fixture worker is locked: every route but the static playground needs
// `Authorization: Bearer <EXAMPLE_ADMIN_TOKEN>`; with no token configured every
// route refuses; bodies are size-limited; test directives in a body work only
// with EXAMPLE_TEST_DIRECTIVES=1. On workerd, as the other tests.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { TOKEN, envelope, startWorker } from "./harness.mjs";

/** Every route of the fixture worker, with a body it would accept. */
const ROUTES = [
  ["POST", "/publish", []],
  ["GET", "/effects"],
  ["GET", "/stats"],
  ["GET", "/dead-letters"],
  ["POST", "/forget", { ids: ["a"] }],
  ["POST", "/store/seen", { keys: ["a"] }],
  ["POST", "/store/remember", { keys: ["a"] }],
  ["POST", "/store/forget", { keys: ["a"] }],
  ["POST", "/store/claim", { keys: ["a"], lease_ms: 1000 }],
  ["POST", "/store/release", { releases: [] }],
  ["POST", "/store/settle", {}],
  ["GET", "/store/entries"],
  ["GET", "/no-such-route"],
];

async function call(worker, method, route, body, authorization) {
  const headers = authorization === undefined ? {} : { authorization };
  if (body !== undefined) headers["content-type"] = "application/json";
  const res = await worker.mf.dispatchFetch(`http://worker${route}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, text: await res.text(), res };
}

describe("a token configured", () => {
  let worker;
  before(async () => {
    worker = await startWorker({ assets: true });
  });
  after(() => worker?.dispose());

  for (const [method, route, body] of ROUTES) {
    test(`${method} ${route}: 401 without a token, 401 with a wrong one, answered with the right one`, async () => {
      const none = await call(worker, method, route, body);
      assert.equal(none.status, 401, none.text);
      assert.match(none.text, /EXAMPLE_ADMIN_TOKEN/);
      assert.equal(none.res.headers.get("www-authenticate"), "Bearer");
      for (const wrong of [`Bearer ${TOKEN}x`, `Bearer ${TOKEN.slice(1)}`, TOKEN, `Basic ${TOKEN}`, "Bearer "]) {
        const r = await call(worker, method, route, body, wrong);
        assert.equal(r.status, 401, `${wrong}: ${r.text}`);
      }
      const right = await call(worker, method, route, body, `Bearer ${TOKEN}`);
      const want = route === "/no-such-route" ? 404 : 200;
      assert.equal(right.status, want, right.text);
    });
  }

  test("the playground is served without a token", async () => {
    const page = await call(worker, "GET", "/");
    assert.equal(page.status, 200);
    assert.match(page.text, /Run conformance/);
    const script = await call(worker, "GET", "/stores.js");
    assert.equal(script.status, 200);
  });

  test("a request body over the limit is refused with 413, before it is read or parsed", async () => {
    const big = JSON.stringify({ keys: ["k".repeat(1 << 20)] });
    const r = await call(worker, "POST", "/store/seen", undefined, `Bearer ${TOKEN}`);
    assert.equal(r.status, 400, "no body: bad request");
    const res = await worker.mf.dispatchFetch("http://worker/store/seen", {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
      body: big,
    });
    assert.equal(res.status, 413, await res.text());
    const publish = await worker.mf.dispatchFetch("http://worker/publish", {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify(Array.from({ length: 3 }, () => "x".repeat(400_000))),
    });
    assert.equal(publish.status, 413, await publish.text());
    assert.equal((await worker.stats()).deliveries, 0, "nothing was published");
  });
});

describe("no token configured", () => {
  for (const vars of [{ EXAMPLE_ADMIN_TOKEN: undefined }, { EXAMPLE_ADMIN_TOKEN: "" }, { EXAMPLE_ADMIN_TOKEN: "  " }]) {
    test(`EXAMPLE_ADMIN_TOKEN=${JSON.stringify(vars.EXAMPLE_ADMIN_TOKEN)}: every route refuses with 403 naming the setting, with or without a token`, async () => {
      const worker = await startWorker({ vars, assets: true });
      try {
        for (const [method, route, body] of ROUTES) {
          for (const auth of [undefined, `Bearer ${TOKEN}`, "Bearer ", "Bearer undefined"]) {
            const r = await call(worker, method, route, body, auth);
            assert.equal(r.status, 403, `${method} ${route} (${auth}): ${r.text}`);
            assert.match(r.text, /EXAMPLE_ADMIN_TOKEN is not set/);
          }
        }
        const page = await call(worker, "GET", "/");
        assert.equal(page.status, 200, "the playground is still served");
      } finally {
        await worker.dispose();
      }
    });
  }
});

describe("test directives", () => {
  test("without EXAMPLE_TEST_DIRECTIVES a body's directives are ignored (always_fail runs and succeeds)", async () => {
    const worker = await startWorker({ vars: { EXAMPLE_TEST_DIRECTIVES: undefined } });
    try {
      const stats = await worker.publishAndWait([
        envelope("directive-fail", { always_fail: true }),
        envelope("directive-sleep", { sleep_ms: 60_000 }),
      ]);
      assert.equal(stats.runs, 2);
      assert.equal(stats.failures, 0);
      assert.deepEqual((await worker.effects()).effects, { "directive-fail": 1, "directive-sleep": 1 });
    } finally {
      await worker.dispose();
    }
  });

  test("with EXAMPLE_TEST_DIRECTIVES=1 they are obeyed", async () => {
    const worker = await startWorker({ consumer: { maxRetries: 0 } });
    try {
      const stats = await worker.publishAndWait([envelope("directive-on", { always_fail: true })]);
      assert.equal(stats.failures, 1);
      assert.deepEqual((await worker.effects()).effects, {});
    } finally {
      await worker.dispose();
    }
  });
});

describe("the store routes in a deployment", () => {
  test("write in a key space of their own: a playground remember or claim never makes the consumer skip or park a real id (issue #29)", async () => {
    // No test directives: as deployed.
    const worker = await startWorker({ vars: { EXAMPLE_TEST_DIRECTIVES: undefined } });
    try {
      const remembered = await worker.request("POST", "/store/remember", { keys: ["real-1"] });
      assert.ok(remembered, "the playground's remember answered");
      await worker.request("POST", "/store/claim", { keys: ["real-2"], lease_ms: 60_000 });
      // The store routes see their own writes...
      assert.deepEqual((await worker.request("POST", "/store/seen", { keys: ["real-1"] })).seen, [true]);
      // ...under their own prefix, which the read-only listing shows.
      const { entries } = await worker.request("GET", "/store/entries");
      assert.ok(entries.some((e) => String(e.key).startsWith("playground:")), JSON.stringify(entries));
      // The consumer runs both real ids.
      const stats = await worker.publishAndWait([envelope("real-1"), envelope("real-2")]);
      assert.equal(stats.runs, 2, JSON.stringify(stats));
      assert.deepEqual((await worker.effects()).effects, { "real-1": 1, "real-2": 1 });
    } finally {
      await worker.dispose();
    }
  });
});
