#!/usr/bin/env python3
"""Throughput of the Python peer: babelqueue's idempotency helper over the workload.

Reads the JSON-lines workload written by ``cargo run --release --example
gen_workload -- PATH`` and, for each line, does what a Python consumer does per
delivery::

    env = json.loads(line)
    wrapped(env["data"], env["meta"])      # wrapped = wrap(store, handler)

with ``babelqueue.idempotency.InMemoryStore`` (a fresh one per run) and a no-op
handler that counts its calls. The lines are read into a list before timing; the
timed part is the whole loop (time.perf_counter), best of ``--runs`` (default 3).

Prints one JSON object, e.g.::

    {"deliveries_per_sec": 412345.6, "effects": 800000, "lines": 1000000, ...}

``effects`` must equal the number of distinct ``meta.id``s (800,000 for the default
workload); ``bench/compare.py`` reads ``deliveries_per_sec``.

Usage: python3 bench/python_peer.py WORKLOAD.jsonl [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

EXPECTED_BABELQUEUE = "1.24.0"

try:
    from babelqueue.idempotency import InMemoryStore, wrap
except ImportError as exc:  # pragma: no cover - environment problem
    sys.exit(
        f"python_peer: cannot import babelqueue.idempotency ({exc}); "
        f"install it with: pip install babelqueue=={EXPECTED_BABELQUEUE}"
    )


def run_once(lines: list[str]) -> tuple[float, int]:
    """One timed pass over every line with a fresh store; (seconds, handler calls)."""
    store = InMemoryStore()
    calls = 0

    def handler(data, meta):  # no-op side effect: count it
        nonlocal calls
        calls += 1

    wrapped = wrap(store, handler)

    start = time.perf_counter()
    for line in lines:
        env = json.loads(line)
        wrapped(env["data"], env["meta"])
    elapsed = time.perf_counter() - start
    return elapsed, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", type=Path, help="JSON-lines file from gen_workload")
    parser.add_argument("--runs", type=int, default=3, help="timed runs; the best is kept")
    parser.add_argument("--out", type=Path, help="also write the JSON result to this file")
    args = parser.parse_args()

    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not args.workload.is_file():
        sys.exit(
            f"python_peer: workload file {args.workload} not found; generate it with\n"
            f"  cargo run --release --example gen_workload -- {args.workload}"
        )

    try:
        installed = metadata.version("babelqueue")
    except metadata.PackageNotFoundError:
        installed = "unknown"
    if installed != EXPECTED_BABELQUEUE:
        print(
            f"python_peer: warning: measuring babelqueue {installed}, "
            f"the comparison is defined against {EXPECTED_BABELQUEUE}",
            file=sys.stderr,
        )

    with args.workload.open("r", encoding="utf-8") as f:
        lines = f.read().splitlines()
    if not lines:
        sys.exit(f"python_peer: workload file {args.workload} is empty")

    timings = []
    effects = None
    for run in range(args.runs):
        seconds, calls = run_once(lines)
        if effects is not None and calls != effects:
            sys.exit(f"python_peer: run {run + 1} made {calls} effects, run 1 made {effects}")
        effects = calls
        timings.append(seconds)
        print(
            f"python_peer: run {run + 1}/{args.runs}: {seconds:.3f} s, "
            f"{len(lines) / seconds:,.0f} deliveries/s",
            file=sys.stderr,
        )

    best = min(timings)
    result = {
        "deliveries_per_sec": len(lines) / best,
        "effects": effects,
        "lines": len(lines),
        "best_seconds": best,
        "runs_seconds": timings,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "babelqueue": installed,
    }
    text = json.dumps(result)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
