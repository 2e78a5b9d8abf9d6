"""The same decision under several of XLA's CPU code paths: the decision trail of each campaign.

Runs each campaign once per XLA instruction-set setting, as separate processes
on this machine, and compares their decision trails: the measured cells in
order (with their replicate), the status, the allocation and the GPU-seconds.
The settings are the host's default, ``XLA_FLAGS=--xla_cpu_max_isa=AVX2`` and
``XLA_FLAGS=--xla_cpu_max_isa=SSE4_2`` (no fused multiply-add, 128-bit
vectors): three compilations of every kernel that round differently.

Campaigns: the Quickstart's (``examples/h100_31b_fp8``) at its own level and at
``"point"``, and fleets of the 40-fleet hard suite (``profiling_cost.py
--suite``: :func:`fleetsieve_bayes.evaluation.synthetic.random_spec` with
``hard=True``, suite seed 0, at the suite's ``"point"``); ``--noisy`` takes
the noisy suite's fleets instead (:mod:`fleetsieve_bayes.evaluation.noisy`, at
level 0.9, tens of rounds each).

    python benchmarks/reproducibility.py                  # suite fleets 0, 1, 2
    python benchmarks/reproducibility.py --fleets 0,1,2 --publish

Prints a markdown table and writes JSON (default
``benchmarks/results/reproducibility.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "examples" / "h100_31b_fp8" / "campaign.toml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "reproducibility.json"
ISA_SETTINGS = {"default": None, "AVX2": "--xla_cpu_max_isa=AVX2", "SSE4_2": "--xla_cpu_max_isa=SSE4_2"}


def trail(run_dir: Path) -> dict[str, Any]:
    """A run directory's decision trail: measured cells in order, status, allocation, GPU-seconds."""
    result = json.loads((run_dir / "result.json").read_text())
    cells = []
    for line in (run_dir / "journal.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "measurement":
            c = rec["cell"]
            cells.append(f"{c['workload']} TP{c['tp']}@{c['load']}#{rec.get('replicate', 0)}")
    t = {"cells": cells, "status": result["status"], "allocation": result["allocation"],
         "gpu_seconds": result["gpu_seconds"]}
    t["digest"] = hashlib.sha256(json.dumps(t, sort_keys=True).encode()).hexdigest()[:12]
    return t


def _campaigns(root: Path, fleets: list[int], noisy: bool) -> dict[str, Path]:
    import numpy as np

    from benchmarks.shipped_campaign import point_copy
    from fleetsieve_bayes.evaluation.noisy import noisy_suite_fleet
    from fleetsieve_bayes.evaluation.synthetic import random_spec, synthetic_fleet, write_synthetic

    out = {"shipped (level 0.9)": SHIPPED,
           "shipped (point)": point_copy(SHIPPED, root / "shipped_point.toml", 'slo_attainment = "point"')}
    for k in fleets:
        if noisy:
            _, table, camp = noisy_suite_fleet(0, k)
            name = f"noisy suite n{k:03d} (level 0.9)"
        else:  # as profiling_cost.py --suite builds fleet k of suite seed 0
            rng = np.random.default_rng([0, k])
            table, camp = synthetic_fleet(rng, random_spec(rng, hard=True))
            camp["name"] = f"synthetic-{k}"
            name = f"hard suite c{k:03d} (point)"
        write_synthetic(root / f"f{k:03d}", table, camp)
        out[name] = root / f"f{k:03d}" / "campaign.toml"
    return out


def run_one(campaign: Path, isa: str, where: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if ISA_SETTINGS[isa]:
        env["XLA_FLAGS"] = ISA_SETTINGS[isa]
    cmd = [sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(where), "--quiet"]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return trail(where)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", default="0,1,2", help="suite fleets (comma-separated; '' for none)")
    ap.add_argument("--noisy", action="store_true", help="the noisy suite's fleets, at level 0.9")
    ap.add_argument("--jobs", type=int, default=2, help="campaigns run side by side")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--publish", action="store_true")
    args = ap.parse_args(argv)
    fleets = [int(k) for k in args.fleets.split(",") if k.strip()]
    with tempfile.TemporaryDirectory(prefix="fsb-repro-") as tmp:
        root = Path(tmp)
        campaigns = _campaigns(root, fleets, args.noisy)
        jobs = [(name, isa) for name in campaigns for isa in ISA_SETTINGS]
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {
                (name, isa): pool.submit(run_one, campaigns[name], isa, root / "runs" / f"{i}-{isa}")
                for i, (name, isa) in enumerate(jobs)
            }
            trails = {key: f.result() for key, f in futures.items()}
    rows = []
    for name in campaigns:
        per = {isa: trails[(name, isa)] for isa in ISA_SETTINGS}
        ref = per["default"]
        rows.append({
            "campaign": name, "identical": len({t["digest"] for t in per.values()}) == 1,
            "status": ref["status"], "gpu_seconds": ref["gpu_seconds"], "cells": len(ref["cells"]),
            "trails": per,
        })
    payload = {"settings": ISA_SETTINGS, "rows": rows,
               "identical": sum(r["identical"] for r in rows), "campaigns": len(rows)}
    table = published_table(payload)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1))
    if args.publish:
        from benchmarks.publish import command_line, publish

        publish("reproducibility", payload, table, command_line(__file__, argv))
    return 0 if payload["identical"] == payload["campaigns"] else 1


def published_table(payload: dict[str, Any]) -> str:
    lines = [
        f"{payload['identical']} of {payload['campaigns']} campaigns have one decision trail under the "
        "three XLA settings (host default, `--xla_cpu_max_isa=AVX2`, `--xla_cpu_max_isa=SSE4_2`):\n",
        "| campaign | identical trails | trail (default / AVX2 / SSE4_2) | status | GPU-s | cells measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in payload["rows"]:
        digests = " / ".join(r["trails"][isa]["digest"] for isa in payload["settings"])
        lines.append(f"| {r['campaign']} | {'yes' if r['identical'] else '**no**'} | `{digests}` | "
                     f"{r['status']} | {r['gpu_seconds']:,.0f} | {r['cells']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
