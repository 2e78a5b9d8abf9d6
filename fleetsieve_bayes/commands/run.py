"""``fleetsieve-bayes run CAMPAIGN.toml --out DIR [--strategy NAME] [--seed N] [--quiet]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.decision.strategies.registry import STRATEGY_NAMES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run or resume a profiling campaign",
        description="Run (or resume) a campaign and write DIR/result.json. Exit 0 for every "
        "completed campaign, whatever its certificate.",
    )
    p.add_argument("campaign", type=Path, help="campaign TOML file")
    p.add_argument("--out", type=Path, required=True, help="campaign directory (created; resumed if it exists)")
    p.add_argument("--strategy", default="fleetsieve", choices=STRATEGY_NAMES, help="acquisition strategy")
    p.add_argument("--seed", type=int, default=0, help="seed for every round's randomness")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--json", action="store_true", help="print result.json to stdout at the end")
    p.add_argument(
        "--reuse-measurements",
        type=Path,
        default=None,
        metavar="OLD_DIR",
        help="start a new decision (in a new --out) from OLD_DIR's measurements: allowed when only "
        "demands, SLOs, floors, the GPU budget or the stopping rule changed",
    )
    p.add_argument(
        "--production",
        type=Path,
        action="append",
        default=[],
        metavar="VERIFY.json",
        help="a `verify --json` report (repeatable): its live windows enter the new campaign as "
        "production observations of their planned cells, with a wider noise",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.reporting.progress import make_progress

    campaign = load_campaign(args.campaign)
    quiet = args.quiet or args.json
    with make_progress(quiet=quiet, stream=sys.stderr) as on_event:
        outcome = run_campaign(
            campaign,
            args.out,
            strategy=args.strategy,
            seed=args.seed,
            on_event=on_event,
            reuse_measurements=args.reuse_measurements,
            production=args.production,
        )
    if args.json:
        print(json.dumps(outcome.result, indent=2))
    elif not args.quiet:
        from fleetsieve_bayes.campaign.journal import MeasurementRecord, read_records
        from fleetsieve_bayes.reporting.misses import describe_unserved, unserved

        r = outcome.result
        seeded = len(r.get("seeded") or [])
        startup = r.get("startup_gpu_seconds") or 0.0
        extra = f" (+ {startup:.0f} start-up GPU-seconds)" if startup else ""
        extra_cells = f" ({seeded} of them seeded at no cost)" if seeded else ""
        print(
            f"{r['status']}: {r['gpu_seconds']:.0f} GPU-seconds{extra}, "
            f"{len(r['measured'])} cells measured{extra_cells}"
        )
        rows = [rec.row for rec in read_records(Path(args.out) / "journal.jsonl")[0] if isinstance(rec, MeasurementRecord)]
        slos = {w.name: {"success_min": w.slo.success_min, "ttft_p99_s": w.slo.ttft_p99_s,
                         "completion_p99_s": w.slo.completion_p99_s} for w in campaign.workloads}
        why = unserved(r["allocation"], slos, rows)
        if r.get("answer") in ("credible", "best-estimate"):
            conf = ", ".join(f"{w} {c:g}" for w, c in (r.get("answer_confidence") or {}).items())
            print("  not certified: its best estimate (each measured cell admitted where its attainment "
                  f"reaches its level with posterior probability at least {conf})")
        elif r.get("answer") == "probable" and r.get("answer_choice"):
            ch = r["answer_choice"]
            which = ("the conservative answer" if ch["candidate"] == "conservative"
                     else f"the answer at confidence {float(ch['candidate']):g}")
            print(f"  not certified: {which}, the most probably ε-optimal of those weighed "
                  f"(P = {ch['p_epsilon_optimal']:.2f})")
        for name, a in (r["allocation"] or {}).items():
            if a["replicas"]:
                conf = f"{a['config']} ({a['gpus_per_replica']} GPUs)" if a.get("config") else f"TP{a['tp']}"
                print(f"  {name}: {conf} @ {a['load']} x{a['replicas']}")
            else:
                print(f"  {describe_unserved(name, why.get(name, {}), r)}")
        if r.get("production"):
            from fleetsieve_bayes.deploy.production import describe_change

            prod = r["production"]
            print(f"  production: {prod['windows']} live window(s) of {len(prod['cells'])} cell(s)")
            for entry in prod["changed"]:
                print(f"  {describe_change(entry)}")
        from fleetsieve_bayes.decision.bounds import attainment_lines

        for line in attainment_lines({"committed": r.get("committed"), "repeat": r.get("repeat")}):
            print(f"  {line}")
        print(f"result: {Path(args.out) / 'result.json'}")
    return 0
