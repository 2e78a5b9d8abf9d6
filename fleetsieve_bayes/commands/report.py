"""``fleetsieve-bayes report DIR [--out FILE] [--campaign FILE]``: a self-contained HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report of a campaign",
        description="Write an HTML report (figures embedded, no network needed) that explains a "
        "campaign's decision: capacity against TP, tails against load with the SLOs, the gap "
        "against GPU-seconds, both allocations, and the posterior diagnostics. Works on a running "
        "or interrupted campaign too.",
    )
    p.add_argument("directory", type=Path, help="campaign directory (run --out)")
    p.add_argument("--out", type=Path, default=None, help="output file (default DIR/report.html)")
    p.add_argument(
        "--campaign",
        type=Path,
        default=None,
        help="campaign TOML, for SLO lines and demands when the journal does not record them",
    )
    p.add_argument("--plan", type=Path, default=None,
                   help="a plan directory (plan --out) of this campaign: adds the deployment and packing")
    p.add_argument("--verify", type=Path, default=None,
                   help="a verify --json report of that plan: adds the live windows against the predictions")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.reporting.report import write_report

    path, report = write_report(args.directory, args.out, campaign_file=args.campaign,
                                plan=args.plan, verify=args.verify)
    print(f"report: {path} ({len(report.figures)} figures)")
    return 0
