#!/usr/bin/env python3
"""Native vs Python dedupe throughput, as a markdown table.

Reads criterion's estimates for the ``throughput`` bench (group ``dedupe_1m``)::

    target/criterion/dedupe_1m/<bench>/new/estimates.json   # mean.point_estimate, ns per iteration
    target/criterion/dedupe_1m/<bench>/new/benchmark.json   # throughput: elements per iteration

and the JSON printed by ``bench/python_peer.py`` (``deliveries_per_sec``), then
prints: path, deliveries/s, ns/delivery, ratio vs Python.

Usage: python3 bench/compare.py [--criterion-dir DIR] [--group NAME] [--python FILE]

Exits with status 1 and says what to run when an input is missing or unreadable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NoReturn

# (criterion bench id, row label), in table order.
GROUPS = {
    "dedupe_1m": [
        ("process", "native `Guard::process` (one at a time)"),
        ("process_batch_100", "native `Guard::process_batch` (chunks of 100)"),
        ("decode_only", "native `Message::parse` only (no dedupe)"),
        ("validate_floor", "the validating floor: UTF-8 + serde_json syntax check, nothing kept"),
    ],
    "component_1m": [
        ("process", "component under wasmtime, `consumer.process` (one call per delivery)"),
        ("process_batch_100", "component under wasmtime, `consumer.process-batch` (100 per call)"),
    ],
}
DEFAULT_ELEMENTS = 1_000_000


def fail(message: str) -> NoReturn:
    print(f"compare.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def load_json(path: Path, how_to_make: str) -> dict:
    if not path.is_file():
        fail(f"missing input {path}\n  produce it with: {how_to_make}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"cannot read {path}: {exc}\n  regenerate it with: {how_to_make}")


def native_row(criterion_dir: Path, group: str, bench: str) -> tuple[float, int]:
    """(mean ns per iteration, deliveries per iteration) for one criterion bench."""
    new = criterion_dir / group / bench / "new"
    how = f"cargo bench --bench throughput -- '{group}/{bench}$'"
    estimates = load_json(new / "estimates.json", how)
    try:
        mean_ns = float(estimates["mean"]["point_estimate"])
    except (KeyError, TypeError, ValueError):
        fail(f"{new / 'estimates.json'} has no numeric mean.point_estimate")
    if mean_ns <= 0:
        fail(f"{new / 'estimates.json'}: mean.point_estimate is {mean_ns}, expected > 0")

    elements = DEFAULT_ELEMENTS
    meta_path = new / "benchmark.json"
    if meta_path.is_file():
        throughput = load_json(meta_path, how).get("throughput") or {}
        if "Elements" in throughput:
            elements = int(throughput["Elements"])
    return mean_ns, elements


def fmt_rate(per_sec: float) -> str:
    return f"{per_sec:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    parser.add_argument("--criterion-dir", type=Path, default=target / "criterion")
    parser.add_argument("--group", default="dedupe_1m")
    parser.add_argument("--python", type=Path, default=target / "bench" / "python.json")
    args = parser.parse_args()

    rows = []
    if args.group not in GROUPS:
        fail(f"unknown group {args.group}; known: {', '.join(GROUPS)}")
    for bench, label in GROUPS[args.group]:
        mean_ns, elements = native_row(args.criterion_dir, args.group, bench)
        ns_per = mean_ns / elements
        rows.append((label, 1e9 / ns_per, ns_per, elements))

    py = load_json(
        args.python,
        f"python3 bench/python_peer.py target/bench/workload.jsonl --out {args.python}",
    )
    try:
        py_rate = float(py["deliveries_per_sec"])
    except (KeyError, TypeError, ValueError):
        fail(f"{args.python} has no numeric deliveries_per_sec")
    if py_rate <= 0:
        fail(f"{args.python}: deliveries_per_sec is {py_rate}, expected > 0")
    py_lines = py.get("lines")
    for label, _, _, elements in rows:
        if py_lines is not None and py_lines != elements:
            print(
                f"compare.py: warning: Python measured {py_lines} lines, criterion "
                f"{elements} per iteration ({label}); per-delivery figures still compare, "
                "but the workloads differ",
                file=sys.stderr,
            )
            break
    py_label = f"Python `babelqueue` {py.get('babelqueue', '?')} `wrap` + `json.loads`"

    print("| path | deliveries/s | ns/delivery | vs Python |")
    print("|---|---:|---:|---:|")
    for label, rate, ns_per, _ in rows:
        print(f"| {label} | {fmt_rate(rate)} | {ns_per:,.0f} | {rate / py_rate:.1f}x |")
    print(f"| {py_label} | {fmt_rate(py_rate)} | {1e9 / py_rate:,.0f} | 1.0x |")
    effects = py.get("effects")
    if effects is not None:
        print(f"\nPython effects: {effects:,} (must equal the workload's distinct ids).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
