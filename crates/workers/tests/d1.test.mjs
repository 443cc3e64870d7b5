// The D1 store and the transactional mode of the Rust adapter, on workerd
// (Miniflare's local D1): the fixture worker with DEDUPE_STORE = "d1" and
// EXAMPLE_D1_EFFECTS = "on", whose handler's effect is a row in D1's
// `example_effects` (no unique key: a second write would show), committed with
// the id in one batch. The store testkit runs against D1 too
// (crates/workerd-testkit/tests/d1.rs, in make workers-test).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { envelope, sleep, withWorker } from "./harness.mjs";

const TRANSACTIONAL = { vars: { DEDUPE_STORE: "d1", EXAMPLE_D1_EFFECTS: "on" } };

/** Effect rows per id. */
async function effects(worker) {
  const rows = await worker.d1(
    "SELECT id, count(*) AS n FROM example_effects GROUP BY id ORDER BY id",
  );
  return Object.fromEntries(rows.map((r) => [r.id, r.n]));
}

/** The id's row in the dedupe table: state 1 done, 0 claimed; none: unmarked. */
async function record(worker, id) {
  const rows = await worker.d1("SELECT state FROM bq_dedupe WHERE key = ?1", id);
  return rows[0]?.state;
}

describe("D1: the handler's statements and the id in one batch", () => {
  test("duplicates in a batch and across batches: one effect row per id", () =>
    withWorker(TRANSACTIONAL, async (worker) => {
      let stats = await worker.publishAndWait([
        envelope("d1-a"),
        envelope("d1-a"),
        envelope("d1-b"),
      ]);
      assert.equal(stats.runs, 2, JSON.stringify(stats));
      assert.equal(stats.skips, 1);
      stats = await worker.publishAndWait([envelope("d1-a"), envelope("d1-b"), envelope("d1-c")]);
      assert.equal(stats.runs, 3);
      assert.equal(stats.skips, 3);
      assert.deepEqual(await effects(worker), { "d1-a": 1, "d1-b": 1, "d1-c": 1 });
      for (const id of ["d1-a", "d1-b", "d1-c"]) assert.equal(await record(worker, id), 1);
    }));

  test("a thrown handler writes nothing and leaves the id unmarked; its retry writes once", () =>
    withWorker({ ...TRANSACTIONAL, consumer: { maxRetries: 0 } }, async (worker) => {
      // Never succeeds, and Cloudflare gives up after one attempt.
      const stats = await worker.publishAndWait([envelope("d1-throws", { always_fail: true })]);
      assert.equal(stats.failures, 1, JSON.stringify(stats));
      assert.deepEqual(await effects(worker), {});
      assert.equal(await record(worker, "d1-throws"), undefined, "unmarked");
    }));

  test("a failure between the handler and the write (the batch refused) writes nothing; the retry writes once", () =>
    withWorker({ ...TRANSACTIONAL, consumer: { maxRetries: 3 } }, async (worker) => {
      const stats = await worker.publishAndWait(
        [
          envelope("d1-flaky-handler", { fail_attempts: 1 }),
          envelope("d1-flaky-batch", { bad_statement_attempts: 2 }),
        ],
        5,
      );
      assert.equal(stats.runs, 2, JSON.stringify(stats));
      // A batch D1 refused is the run's failure, not the store's (issue #25, finding 4).
      assert.equal(stats.failures, 1 + 2, "the handler's one failure and the two refused batches");
      assert.equal(stats.store_errors, 0, JSON.stringify(stats));
      assert.deepEqual(await effects(worker), { "d1-flaky-batch": 1, "d1-flaky-handler": 1 });
      // Only the attempt that committed wrote its row.
      const rows = await worker.d1("SELECT attempt FROM example_effects WHERE id = ?1", "d1-flaky-batch");
      assert.deepEqual(rows, [{ attempt: 2 }]);
    }));

  test("a batch refused on the last attempt leaves neither effect nor id", () =>
    withWorker({ ...TRANSACTIONAL, consumer: { maxRetries: 0 } }, async (worker) => {
      const stats = await worker.publishAndWait([
        envelope("d1-refused", { bad_statement_attempts: 99 }),
      ]);
      assert.equal(stats.failures, 1, JSON.stringify(stats));
      assert.equal(stats.store_errors, 0, JSON.stringify(stats));
      assert.deepEqual(await effects(worker), {});
      assert.equal(await record(worker, "d1-refused"), undefined, "unmarked");
    }));

  test("two invocations racing on one id: one effect row, the other parked behind its claim", () =>
    withWorker(TRANSACTIONAL, async (worker) => {
      const message = (id) => ({
        id: `cf-${id}-${Math.random()}`,
        timestamp: new Date(),
        attempts: 1,
        body: envelope("d1-race"),
      });
      // Both check the id before either commits (the handler sleeps first).
      // 2 s, and the second sent once the first's claim shows: a loaded machine
      // lost the 300 ms handler and the fixed 50 ms.
      const slow = { ...envelope("d1-race", { sleep_ms: 2000 }) };
      const results = await Promise.all([
        worker.dispatchQueue([{ ...message(1), body: slow }]),
        (async () => {
          const deadline = Date.now() + 20_000;
          while ((await record(worker, "d1-race")) !== 0) {
            assert.ok(Date.now() < deadline, "d1-race never claimed");
            await sleep(25);
          }
          return worker.dispatchQueue([message(2)]);
        })(),
      ]);
      assert.equal(results.length, 2);
      assert.deepEqual(await effects(worker), { "d1-race": 1 });
      const stats = await worker.stats();
      assert.equal(stats.runs, 1, JSON.stringify(stats));
      assert.equal(stats.parked, 1);
    }));

  test("a handler that panics on every attempt: the messages after it run once, it parks behind the claim it left (a trial's finding)", () =>
    withWorker(TRANSACTIONAL, async (worker) => {
      const msg = (id, body, attempts) => ({ id: `${id}-${attempts}`, timestamp: new Date(), attempts, body });
      const batch = (attempts) => [
        msg("crash", envelope("d1-crash", { panic: true }), attempts),
        msg("by-1", envelope("d1-by-1"), attempts),
        msg("by-2", envelope("d1-by-2"), attempts),
      ];
      const first = await worker.dispatchQueue(batch(1)); // the instance aborts
      assert.notEqual(first.outcome, "ok", JSON.stringify(first));
      const again = await worker.dispatchQueue(batch(2));
      assert.deepEqual(await effects(worker), { "d1-by-1": 1, "d1-by-2": 1 });
      assert.deepEqual(again.retryMessages.map((r) => r.msgId), ["crash-2"], JSON.stringify(again));
      assert.ok(again.retryMessages[0].delaySeconds > 60, "until its claim ends");
      await worker.dispatchQueue(batch(3));
      assert.deepEqual(await effects(worker), { "d1-by-1": 1, "d1-by-2": 1 });
    }));

  test("a handler with nothing to write: an id is still recorded once; without an id nothing is sent", () =>
    withWorker(TRANSACTIONAL, async (worker) => {
      // A batch first, so the table exists and the later batches are not an isolate's first.
      await worker.publishAndWait([envelope("d1-warm")]);
      const stats = await worker.publishAndWait([
        envelope("d1-nothing", { no_statements: true }),
        envelope(undefined, { no_statements: true }),
        envelope("d1-nothing", { no_statements: true }),
      ]);
      assert.equal(stats.fail_open, 1, JSON.stringify(stats));
      assert.equal(stats.store_errors, 0);
      assert.equal(stats.skips, 1);
      assert.equal(await record(worker, "d1-nothing"), 1);
      assert.deepEqual(await effects(worker), { "d1-warm": 1 });
    }));

  test("an id a claiming consumer holds parks, and comes back just after that claim ends", () =>
    withWorker(TRANSACTIONAL, async (worker) => {
      await worker.request("POST", "/store/claim", { keys: ["d1-held"], lease_ms: 30_000 });
      const result = await worker.dispatchQueue([
        { id: "cf-held", timestamp: new Date(), attempts: 1, body: envelope("d1-held") },
      ]);
      assert.deepEqual(result.retryMessages.map((r) => r.msgId), ["cf-held"], JSON.stringify(result));
      // Just past the 30 s claim (not the 45 s default park delay).
      const delay = result.retryMessages[0].delaySeconds;
      assert.ok(delay >= 30 && delay <= 32, `park delay ${delay}`);
      assert.deepEqual(await effects(worker), {});
    }));

  test("the transactional mode on a store other than D1 fails the batch before any handler runs", () =>
    withWorker({ vars: { DEDUPE_STORE: "durable-object", EXAMPLE_D1_EFFECTS: "on" } }, async (worker) => {
      const result = await worker.dispatchQueue([
        { id: "cf-wrong-store", timestamp: new Date(), attempts: 1, body: envelope("d1-wrong-store") },
      ]);
      assert.equal(result.outcome, "exception", JSON.stringify(result));
      assert.deepEqual(result.explicitAcks, [], "nothing acked");
      assert.deepEqual(await effects(worker), {}, "nothing written");
    }));

  test("the seen-set and claiming modes on D1: the plain consumer dedupes with claims", () =>
    withWorker({ vars: { DEDUPE_STORE: "d1", DEDUPE_CLAIMING: "on" } }, async (worker) => {
      const stats = await worker.publishAndWait([
        envelope("d1-plain"),
        envelope("d1-plain"),
        envelope("d1-plain-2"),
      ]);
      assert.equal(stats.runs, 2, JSON.stringify(stats));
      assert.equal(stats.skips, 1);
      assert.deepEqual((await worker.effects()).effects, { "d1-plain": 1, "d1-plain-2": 1 });
      assert.equal(await record(worker, "d1-plain"), 1);
    }));
});
