"""Profiling cost with a derived prior card vs the hand-written card vs ``generic``.

For each shipped grid (the H100 31B FP8 grid, the synthetic 8B BF16 example) it
runs the same campaign three times per seed, changing only ``[model] family``:
the card derived by ``priors derive`` (``examples/derived_*/card.toml``), the
hand-written card, and ``generic``; and reports GPU-seconds, cells measured,
status and whether the certified allocation equals the hand-written card's.

    python benchmarks/derived_priors.py                 # seed 0
    python benchmarks/derived_priors.py --seeds 0,1,2

Prints a markdown table and writes JSON (default benchmarks/results/derived_priors.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRIDS = {
    "h100_31b_fp8": {
        "campaign": REPO / "examples" / "h100_31b_fp8" / "campaign.toml",
        "cards": {
            "derived": str(REPO / "examples" / "derived_31b_fp8" / "card.toml"),
            "hand-written": "dense-31b-fp8-h100",
            "generic": "generic",
        },
    },
    "h100_8b_bf16": {
        "campaign": REPO / "examples" / "h100_8b_bf16" / "campaign.toml",
        "cards": {
            "derived": str(REPO / "examples" / "derived_8b_bf16" / "card.toml"),
            "hand-written": "dense-8b-bf16-h100",
            "generic": "generic",
        },
    },
}


def run_one(campaign: Path, family: str, seed: int, work: Path) -> dict:
    """One campaign with ``[model] family`` replaced; its result.json plus wall seconds."""
    text = campaign.read_text()
    lines = []
    for line in text.splitlines():
        if line.startswith("family = "):
            line = f"family = {json.dumps(family)}"
        elif line.startswith("table = "):
            table = json.loads(line.split("=", 1)[1].strip())
            line = f"table = {json.dumps(str(campaign.parent / table))}"
        lines.append(line)
    path = work / f"{campaign.parent.name}_{Path(family).stem}_{seed}.toml"
    path.write_text("\n".join(lines) + "\n")
    out = path.with_suffix("")
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fleetsieve_bayes", "run", str(path), "--out", str(out), "--seed", str(seed), "--quiet"],
        check=True, capture_output=True,
    )
    result = json.loads((out / "result.json").read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def published_table(res: dict) -> str:
    """The markdown table of a run's JSON ``res``: GPU-seconds per grid and card."""
    lines = [
        "| grid | card | GPU-seconds per seed | mean | × hand-written | × generic | same allocation as hand-written |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, sm in res["summary"].items():
        grid, label = key.split("/", 1)
        per_seed = " / ".join(f"{r['gpu_seconds']:,.0f}" for r in res["rows"] if r["grid"] == grid and r["card"] == label)
        lines.append(
            f"| {grid} | {label} | {per_seed} | {sm['mean_gpu_seconds']:,.0f} | {sm['vs_hand_written']:.2f} "
            f"| {sm['vs_generic']:.2f} | {'yes' if sm['same_allocation_as_hand_written'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0", help="comma-separated campaign seeds (default 0)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "derived_priors.json"))
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/derived_priors.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for grid, spec in GRIDS.items():
            for label, family in spec["cards"].items():
                for seed in seeds:
                    r = run_one(spec["campaign"], family, seed, Path(tmp))
                    rows.append({
                        "grid": grid, "card": label, "seed": seed, "status": r["status"],
                        "gpu_seconds": r["gpu_seconds"], "cells": len(r["measured"]),
                        "allocation": r["allocation"], "wall_s": round(r["wall_s"], 1),
                    })
                    print(f"{grid} {label} seed {seed}: {r['status']} {r['gpu_seconds']:,.0f} GPU-s", file=sys.stderr)
    summary = {}
    for grid in GRIDS:
        mean = {}
        for label in GRIDS[grid]["cards"]:
            mean[label] = statistics.mean(r["gpu_seconds"] for r in rows if r["grid"] == grid and r["card"] == label)
        for label in GRIDS[grid]["cards"]:
            mine = [r for r in rows if r["grid"] == grid and r["card"] == label]
            hand = {r["seed"]: r["allocation"] for r in rows if r["grid"] == grid and r["card"] == "hand-written"}
            summary[f"{grid}/{label}"] = {
                "mean_gpu_seconds": mean[label],
                "vs_hand_written": mean[label] / mean["hand-written"],
                "vs_generic": mean[label] / mean["generic"],
                "same_allocation_as_hand_written": all(r["allocation"] == hand[r["seed"]] for r in mine),
            }
    res = {
        "seeds": seeds, "rows": rows, "summary": summary,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
    }
    md = published_table(res)
    print(md)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {out}", file=sys.stderr)
    if args.publish:
        from publish import command_line, publish

        publish("derived_priors", res, md, command_line(__file__))


if __name__ == "__main__":
    main()
