// Payload fingerprints (DEDUPE_FINGERPRINT=on) on real workerd (Miniflare),
// through the fixture worker's queue: an id reused with other data is
// dead-lettered as payload-mismatch and never run; a redelivery is a skip.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { envelope, withWorker } from "./harness.mjs";

describe("payload fingerprints", () => {
  test("on: same id + same data -> skip; same id + other data -> dead-lettered payload-mismatch, not run", () =>
    withWorker({ vars: { DEDUPE_FINGERPRINT: "on" } }, async (worker) => {
      await worker.publishAndWait([envelope("fp-order", { total: 10 })]);
      // The same payload with its keys in another order: a redelivery.
      const { order_id, ...rest } = envelope("fp-order", { total: 10 }).data;
      const reordered = envelope("fp-order");
      reordered.data = { ...rest, order_id };
      let stats = await worker.publishAndWait([reordered]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));

      await worker.publish([envelope("fp-order", { total: 99 })]);
      stats = await worker.waitForStats((s) => s.dead_letters_received >= 1, "the dead letter");
      assert.equal(stats.runs, 1, "only the first delivery ran");
      assert.equal(stats.poison, 1, JSON.stringify(stats));
      const [letter] = (await worker.deadLetters()).dead_letters;
      assert.equal(letter.meta.id, "fp-order");
      assert.equal(letter.data.total, 99, "the reused id's payload is kept for a look");
      assert.equal(letter.dead_letter.reason, "poison");
      assert.equal(letter.dead_letter.exception, "payload-mismatch");
      assert.match(letter.dead_letter.error, /different payload/);
      assert.deepEqual((await worker.effects()).effects, { "fp-order": 1 });
    }));

  test("another payload behind a failed first delivery of its id in one batch waits with it (retried within a second), not dead-lettered as a mismatch (a review)", () =>
    withWorker({ vars: { DEDUPE_FINGERPRINT: "on" } }, async (worker) => {
      const delivery = (msgId, data) => ({ id: msgId, timestamp: new Date(), attempts: 1, body: envelope("mm", data) });
      const result = await worker.dispatchQueue([
        delivery("mm-a", { fail_attempts: 1 }),
        delivery("mm-b", { fail_attempts: 1, total: 2 }),
      ]);
      const retried = Object.fromEntries(result.retryMessages.map((m) => [m.msgId, m.delaySeconds ?? 0]));
      assert.deepEqual(Object.keys(retried).sort(), ["mm-a", "mm-b"], JSON.stringify(result));
      assert.ok(retried["mm-b"] <= 1, `the other payload waits at most a second, as its leader: ${JSON.stringify(result)}`);
      assert.deepEqual((await worker.effects()).effects, {}, "nothing ran to success");
    }));

  test("off (the default): the same id with other data is a plain skip", () =>
    withWorker({}, async (worker) => {
      await worker.publishAndWait([envelope("plain-order", { total: 10 })]);
      const stats = await worker.publishAndWait([envelope("plain-order", { total: 99 })]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));
      assert.equal(stats.poison, 0);
      assert.deepEqual((await worker.effects()).effects, { "plain-order": 1 });
    }));
});
