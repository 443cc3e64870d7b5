#!/usr/bin/env python3
"""The Python peer of ``bq-dedupe run --store memory``: the same job in Python.

Reads JSON lines from stdin and, for each line, does what the CLI does: decode it,
dedupe it by ``meta.id`` through babelqueue's idempotency helper
(``babelqueue.idempotency.wrap`` + ``InMemoryStore``, a no-op handler), and print
one JSON verdict line on stdout, in the CLI's format::

    {"decision": "run", "id": "...", "line": 1, "outcome": "run-ok", "reason": null}

A line that is not a JSON object with ``data`` and ``meta`` objects is printed as
``reject``; no ``meta.id`` as ``fail-open``. Output is written through Python's
buffered stdout. A summary goes to stderr. This is deliberately the simple loop a
Python user would write; it validates far less than the CLI does.

Usage: python3 bench/cli_peer.py < target/bench/workload.jsonl > /dev/null
"""

from __future__ import annotations

import json
import sys
import time

from babelqueue.idempotency import InMemoryStore, wrap


def main() -> int:
    ran = False

    def handler(data, meta):
        nonlocal ran
        ran = True

    wrapped = wrap(InMemoryStore(), handler)
    out = sys.stdout
    dumps = json.dumps
    start = time.perf_counter()
    n = 0
    for n, line in enumerate(sys.stdin, 1):
        id_ = None
        try:
            env = json.loads(line)
            data, meta = env["data"], env["meta"]
            if not isinstance(data, dict) or not isinstance(meta, dict):
                raise ValueError("data and meta must be objects")
        except (ValueError, KeyError, TypeError) as e:
            verdict = ("reject", "rejected", str(e))
        else:
            id_ = meta.get("id") if isinstance(meta.get("id"), str) and meta.get("id") else None
            ran = False
            wrapped(data, meta)
            if id_ is None:
                verdict = ("fail-open", "fail-open", None)
            elif ran:
                verdict = ("run", "run-ok", None)
            else:
                verdict = ("skip", "skip", None)
        decision, outcome, reason = verdict
        out.write(
            dumps(
                {"decision": decision, "id": id_, "line": n, "outcome": outcome, "reason": reason},
                separators=(",", ":"),
            )
        )
        out.write("\n")
    out.flush()
    secs = time.perf_counter() - start
    print(f"summary: {n} lines in {secs:.2f}s ({n / max(secs, 1e-9):.0f}/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
