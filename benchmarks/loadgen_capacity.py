"""How close the load generator's measured throughput comes to the fake engine's capacity, on this machine.

The fake server (``fleetsieve_bayes.testing.fake_server``) holds ``--slots``
requests at once and emits a request's ``L`` output tokens one ``--token-delay``
step apart, so its capacity is ``slots / (L × step)`` req/s. Offered at a
multiple of that, the load generator (``fleetsieve_bayes.backends.loadgen``)
should measure a throughput at the capacity; how far below it lands is the
client's and the server's overhead on this machine (their event loops, the
HTTP stack, the CPU the two share with everything else). That is a timing, not
a property: tests/test_loadgen.py asserts only what the server's sleeps
guarantee (never above capacity), and this script measures the rest.

    python benchmarks/loadgen_capacity.py                     # 2× and 4× capacity, 3 repeats
    python benchmarks/loadgen_capacity.py --multiples 1,2,4 --repeat 5 --out FILE

Prints a markdown table (throughput / capacity per offered multiple: median,
min and max over the repeats) and writes JSON (default
benchmarks/results/loadgen_capacity.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.backends.loadgen import LoadSpec, run_cell_sync, summarize
from fleetsieve_bayes.backends.traces import Trace, schedule
from fleetsieve_bayes.testing import running_fake_server

# tests/test_loadgen.py's server: 4 slots, 10 ms a token, 20 output tokens → 20 req/s.
SLOTS, STEP, OUT, IN = 4, 0.01, 20, 37


def capacity_rps(slots: int = SLOTS, step: float = STEP, out: int = OUT) -> float:
    return slots / (out * step)


def measure(url: str, multiple: float, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """One window at ``multiple`` × capacity: the summary row and throughput / capacity."""
    cap = capacity_rps()
    gap = 1.0 / cap  # the trace arrives at the capacity at scale 1
    n = int(np.ceil((warmup_s + duration_s) * cap)) + 1
    trace = Trace(np.arange(n) * gap, np.full(n, IN), np.full(n, OUT), "uniform")
    plan = schedule(trace, multiple, warmup_s + duration_s)
    spec = LoadSpec(endpoint=url, model="fake-model", warmup_s=warmup_s, duration_s=duration_s, request_timeout_s=60.0)
    s = summarize(run_cell_sync(spec, plan), warmup_s, duration_s)
    return {"offered_rps": s["offered_rps"], "throughput_rps": s["throughput_rps"],
            "ratio": s["throughput_rps"] / cap, "success_rate": s["success_rate"], "ttft_p99_s": s["ttft_p99_s"]}


def published_table(payload: dict[str, Any]) -> str:
    lines = [
        f"| offered (× capacity {payload['capacity_rps']:g} req/s) | throughput / capacity, median | min | max | repeats |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in payload["results"]:
        lines.append(f"| {r['multiple']:g} | {r['ratio_median']:.3f} | {r['ratio_min']:.3f} | {r['ratio_max']:.3f} | "
                     f"{len(r['runs'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--multiples", default="2,4", help="offered rates, as multiples of the capacity")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "loadgen_capacity.json")
    ap.add_argument("--publish", action="store_true",
                    help="write benchmarks/published/loadgen_capacity.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cap = capacity_rps()
    print(f"cores available: {cores}; load average {os.getloadavg()[0]:.1f}; capacity {cap:g} req/s\n")
    results: list[dict[str, Any]] = []
    with running_fake_server("--slots", str(SLOTS), "--token-delay", str(STEP)) as url:
        for multiple in (float(m) for m in args.multiples.split(",")):
            runs = [measure(url, multiple, args.warmup, args.duration) for _ in range(args.repeat)]
            ratios = [r["ratio"] for r in runs]
            results.append({"multiple": multiple, "ratio_median": float(np.median(ratios)),
                            "ratio_min": min(ratios), "ratio_max": max(ratios), "runs": runs})
    payload = {"cores": cores, "load_average_1min": os.getloadavg()[0], "python": platform.python_version(),
               "machine": platform.machine(), "slots": SLOTS, "token_delay_s": STEP, "output_tokens": OUT,
               "capacity_rps": cap, "warmup_s": args.warmup, "duration_s": args.duration, "results": results}
    print(published_table(payload))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    if args.publish:
        sys.path.insert(0, str(Path(__file__).parent))
        from publish import command_line, publish

        publish("loadgen_capacity", payload, published_table(payload), command_line(__file__, argv))


if __name__ == "__main__":
    main()
