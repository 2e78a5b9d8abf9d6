"""The Quickstart campaign's decision: status, GPU-seconds, allocation and certificate.

Runs ``fleetsieve-bayes run examples/h100_31b_fp8/campaign.toml`` (replay of
the shipped, fully measured H100 grid) in a temporary directory with the
given seed and prints what its ``result.json`` says: the status, the
GPU-seconds against the grid's hindsight floor, the allocation, the joint
check's probabilities and the certifying posterior's diagnostics, and the
planning seconds per round.

    python benchmarks/shipped_campaign.py                 # seed 0
    python benchmarks/shipped_campaign.py --seed 1 --publish

Writes the run's ``result.json`` (default
``benchmarks/results/shipped_campaign.json``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CAMPAIGN = REPO / "examples" / "h100_31b_fp8" / "campaign.toml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "shipped_campaign.json"


def run_campaign(campaign: Path, seed: int, strategy: str | None) -> dict[str, Any]:
    """``fleetsieve-bayes run campaign --seed seed`` in a fresh directory; its result.json."""
    with tempfile.TemporaryDirectory(prefix="fsb-shipped-") as tmp:
        cmd = [sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", tmp,
               "--seed", str(seed), "--quiet"]
        if strategy:
            cmd += ["--strategy", strategy]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads((Path(tmp) / "result.json").read_text())


def published_table(res: dict[str, Any]) -> str:
    """The markdown of one ``result.json`` ``res``: decision, certificate, diagnostics, round times."""
    cert = res.get("certificate") or {}
    diag = cert.get("diagnostics") or {}
    alloc = res.get("allocation") or {}
    fleet = "; ".join(
        f"{w}: {a['replicas']} × TP{a['tp']}@{a['load']}" if a.get("replicas") else f"{w}: none"
        for w, a in alloc.items()
    ) or "none"

    def num(x: Any, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    lines = [
        "| status | GPU-s | cells measured | allocation | P(ε-optimal) | P(SLO met) | r_hat max | bulk ESS min | divergences | draws | rounds |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {res['status']} | {res['gpu_seconds']:,.0f} | {len(res['measured'])} | {fleet} | "
        f"{num(cert.get('p_epsilon_optimal'), '.3f')} | {num(cert.get('p_slo_met'), '.3f')} | "
        f"{num(diag.get('r_hat_max'), '.3f')} | {num(diag.get('ess_bulk_min'), '.0f')} | "
        f"{num(diag.get('divergences'), 'd')} | {num(diag.get('draws'), 'd')} | {res['timings']['rounds']} |",
        "",
        "| round | fit s | allocate s | acquire s | certify s | total s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["timings"].get("per_round", []):
        lines.append(
            f"| {r['round']} | {r['fit_s']:.1f} | {r['allocate_s']:.2f} | {r['acquire_s']:.2f} | "
            f"{r.get('certify_s', 0.0):.1f} | {r['total_s']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaign", nargs="?", type=Path, default=DEFAULT_CAMPAIGN)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategy", default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--publish", action="store_true",
                    help="write benchmarks/published/shipped_campaign.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    res = run_campaign(args.campaign, args.seed, args.strategy)
    md = published_table(res)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("shipped_campaign", res, md, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
