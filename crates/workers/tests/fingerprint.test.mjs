// Payload fingerprints (DEDUPE_FINGERPRINT=on) on real workerd (Miniflare),
// through the fixture worker's queue: an id reused with other data is
// dead-lettered as payload-mismatch and never run; a redelivery is a skip.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { envelope, withWorker } from "./harness.mjs";

describe("payload fingerprints", () => {
  // With shards the marker and record sit in their id's object (one request,
  // one transaction: split across objects, a reader between the parts saw
  // the marker without the record, a mismatch for the same payload: a review).
  for (const shards of ["1", "4"]) test(`on, ${shards} shard(s): same id + same data -> skip; same id + other data -> dead-lettered payload-mismatch, not run`, () =>
    withWorker({ vars: { DEDUPE_FINGERPRINT: "on", DEDUPE_SHARDS: shards } }, async (worker) => {
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

  test("off (the default): the same id with other data is a plain skip", () =>
    withWorker({}, async (worker) => {
      await worker.publishAndWait([envelope("plain-order", { total: 10 })]);
      const stats = await worker.publishAndWait([envelope("plain-order", { total: 99 })]);
      assert.equal(stats.skips, 1, JSON.stringify(stats));
      assert.equal(stats.poison, 0);
      assert.deepEqual((await worker.effects()).effects, { "plain-order": 1 });
    }));
});
