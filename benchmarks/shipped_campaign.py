"""The Quickstart campaign's decision: status, GPU-seconds, allocation and certificate.

Runs ``fleetsieve-bayes run examples/h100_31b_fp8/campaign.toml`` (replay of
the shipped, fully measured H100 grid) in a temporary directory with the
given seed, at the file's own level (the package default, 0.9, when the
file names none), again with ``[stopping] uncertified_answer = "conservative"``
and once with ``[stopping] slo_attainment = "point"``, and
prints what each ``result.json`` says: the status, the GPU-seconds, the
allocation, each committed cell's attainment, the cell to repeat, the joint
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


def run_campaign(
    campaign: Path, seed: int, strategy: str | None, point: bool = False, stopping: str = ""
) -> dict[str, Any]:
    """``fleetsieve-bayes run campaign --seed seed`` in a fresh directory; its result.json.
    ``point``: a copy of the file deciding by the metric rule (``slo_attainment = "point"``);
    ``stopping``: a line added to a copy's ``[stopping]``."""
    with tempfile.TemporaryDirectory(prefix="fsb-shipped-") as tmp:
        if point or stopping:
            campaign = point_copy(campaign, Path(tmp) / "campaign.toml",
                                  'slo_attainment = "point"' if point else stopping)
        out = str(Path(tmp) / "run")
        cmd = [sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", out,
               "--seed", str(seed), "--quiet"]
        if strategy:
            cmd += ["--strategy", strategy]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads((Path(out) / "result.json").read_text())


def point_copy(campaign: Path, dest: Path, line: str = 'slo_attainment = "point"') -> Path:
    """``campaign`` with ``line`` in its ``[stopping]`` (default: at ``"point"``) written to
    ``dest`` (its table by absolute path)."""
    import tomllib

    raw = tomllib.loads(campaign.read_text())
    if "slo_attainment" in raw.get("stopping", {}) or any("slo_attainment" in w for w in raw.get("workloads", [])):
        raise SystemExit(f"{campaign}: names its own slo_attainment; the point run needs a file without one")
    table = (campaign.parent / raw["measurement"]["table"]).resolve()
    text = campaign.read_text().replace(f'table = "{raw["measurement"]["table"]}"', f'table = "{table}"', 1)
    dest.write_text(text.replace("[stopping]\n", f"[stopping]\n{line}\n", 1))
    return dest


def published_table(runs: dict[str, dict[str, Any]]) -> str:
    """The markdown of ``runs`` (``{level: result.json}``): decision, certificate, attainment,
    diagnostics, then the round times of each."""
    head = [
        "| run | status | answer | GPU-s | cells measured | allocation | P(ε-optimal) | P(SLO met) | r_hat max "
        "| bulk ESS min | divergences | draws | rounds |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows, rest = [], []
    for level, res in runs.items():
        row, more = _one_run(level, res)
        rows.append(row)
        rest += ["", f"**{level}**", "", *more]
    return "\n".join(head + rows + rest)


def _one_run(level: str, res: dict[str, Any]) -> tuple[str, list[str]]:
    """One ``result.json``: its summary row, then its attainment and round-time tables."""
    cert = res.get("certificate") or {}
    diag = cert.get("diagnostics") or {}
    alloc = res.get("allocation") or {}
    fleet = "; ".join(
        f"{w}: {a['replicas']} × TP{a['tp']}@{a['load']}" if a.get("replicas") else f"{w}: none"
        for w, a in alloc.items()
    ) or "none"

    def num(x: Any, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    row = (
        f"| {level} | {res['status']} | {res.get('answer') or '—'} | {res['gpu_seconds']:,.0f} | "
        f"{len(res['measured'])} | {fleet} | "
        f"{num(cert.get('p_epsilon_optimal'), '.3f')} | {num(cert.get('p_slo_met'), '.3f')} | "
        f"{num(diag.get('r_hat_max'), '.3f')} | {num(diag.get('ess_bulk_min'), '.0f')} | "
        f"{num(diag.get('divergences'), 'd')} | {num(diag.get('draws'), 'd')} | {res['timings']['rounds']} |"
    )
    lines: list[str] = []
    if res.get("committed"):
        lines += ["| class | cell | windows | attainment median [lo, hi] | level | binding |",
                  "|---|---|---:|---|---:|---|"]
        for c in res["committed"]:
            a = c["attainment"]
            lines.append(f"| {c['workload']} | TP{c['tp']}@{c['load']} | {c['windows']} | "
                         f"{a['median']:.3f} [{a['lo']:.3f}, {a['hi']:.3f}] | {c['level']} | {c['binding']} |")
        lines.append("")
    if res.get("repeat"):
        r = res["repeat"]
        lines += [f"Cell to measure again: {r['workload']} TP{r['tp']}@{r['load']} ({r['windows']} window so far).", ""]
    lines += [
        "| round | fit s | allocate s | acquire s | certify s | total s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["timings"].get("per_round", []):
        lines.append(
            f"| {r['round']} | {r['fit_s']:.1f} | {r['allocate_s']:.2f} | {r['acquire_s']:.2f} | "
            f"{r.get('certify_s', 0.0):.1f} | {r['total_s']:.1f} |"
        )
    return row, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaign", nargs="?", type=Path, default=DEFAULT_CAMPAIGN)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategy", default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--publish", action="store_true",
                    help="write benchmarks/published/shipped_campaign.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    res = {
        "default": run_campaign(args.campaign, args.seed, args.strategy),
        "conservative answer": run_campaign(args.campaign, args.seed, args.strategy,
                                            stopping='uncertified_answer = "conservative"'),
        "point": run_campaign(args.campaign, args.seed, args.strategy, point=True),
    }
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
