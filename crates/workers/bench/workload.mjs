// The Workers benchmarks' workload: deterministic, 80% first deliveries and 20%
// repeats of earlier ids, as queue messages for the fixture worker's queue().
import { envelope } from "../tests/harness.mjs";

export const DUPLICATE_SHARE = 0.2;

/** `total` envelopes (20% duplicates), in batches of `batch`; `ids` in order. */
export function workload(total, batch) {
  let seed = 42;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const ids = [];
  for (let i = 0; i < total; i++) {
    const repeat = ids.length > 0 && random() < DUPLICATE_SHARE;
    ids.push(repeat ? ids[Math.floor(random() * ids.length)] : `bench-${i}`);
  }
  return { ids, batches: batchesOf(ids, batch), unique: new Set(ids).size };
}

/** Queue messages carrying an envelope for each id, `batch` to a batch. */
export function batchesOf(ids, batch) {
  const bodies = ids.map((id) => JSON.stringify(envelope(id)));
  const batches = [];
  for (let i = 0; i < bodies.length; i += batch) {
    batches.push(
      bodies.slice(i, i + batch).map((body, j) => ({
        id: `m-${i + j}`,
        timestamp: new Date(),
        attempts: 1,
        body,
      })),
    );
  }
  return batches;
}
