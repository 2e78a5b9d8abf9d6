"""``fleetsieve-bayes classes TRACE… --out DIR``: workload classes from a production request log.

Splits the requests by service (each file, or a model/tenant column), then
into classes by (prompt, output) length: k-means in log-length space with K
chosen by the mean silhouette (``--auto``, the default) or given (``--k``).
Writes per class a replay trace (Azure format), its demand (mean rate and the
``--peak`` percentile of the rate over ``--window`` windows) and length
distributions, a suggested SLO family, a campaign skeleton with TODO SLOs, and
figures with an HTML page. The method: :mod:`fleetsieve_bayes.workloads.classes`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from fleetsieve_bayes.errors import InputError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("classes", help="workload classes, demands and replay traces from a request log",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", type=Path, metavar="TRACE",
                   help="request logs; several files: each is a service")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    k = p.add_mutually_exclusive_group()
    k.add_argument("--k", type=int, default=None, help="classes per service")
    k.add_argument("--auto", action="store_true", help="choose K per service by the silhouette (default)")
    p.add_argument("--window", default="60s", help="window of the peak rate, e.g. 60s, 5m (default 60s)")
    p.add_argument("--peak", default="p95", help="percentile of the windowed rate taken as demand (default p95)")
    p.add_argument("--format", dest="fmt", default="auto",
                   choices=("auto", "azure", "burstgpt", "mooncake", "columns"), help="trace format (default: detect)")
    p.add_argument("--columns", default=None,
                   help="named columns of a generic CSV: ts=COL,prompt=COL,output=COL[,service=COL]")
    p.add_argument("--seed", type=int, default=0, help="seed of the k-means starts and samples (default 0)")
    p.add_argument("--no-plots", action="store_true", help="skip the figures and the HTML page")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def parse_window(text: str) -> float:
    """``"60s"``, ``"5m"``, ``"1h"`` or a number of seconds → seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h)?\s*", str(text))
    if not m:
        raise InputError(f"--window: expected a duration like 60s, 5m or 1h, got {text!r}")
    return float(m.group(1)) * {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]


def parse_peak(text: str) -> float:
    """``"p95"``, ``"p99.9"`` or ``"95"`` → 95.0."""
    m = re.fullmatch(r"\s*[pP]?([0-9]*\.?[0-9]+)\s*", str(text))
    if not m or not 0 < float(m.group(1)) <= 100:
        raise InputError(f"--peak: expected a percentile like p95 (in (0, 100]), got {text!r}")
    return float(m.group(1))


def parse_columns(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    out = {}
    for part in text.split(","):
        key, eq, col = part.partition("=")
        if not eq or not key.strip() or not col.strip():
            raise InputError(f"--columns: expected KEY=COLUMN pairs, got {part!r}")
        out[key.strip()] = col.strip()
    return out


def run(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.workloads import classify, read_logs, write_outputs

    window = parse_window(args.window)
    peak = parse_peak(args.peak)
    log = read_logs(args.traces, args.fmt, columns=parse_columns(args.columns))
    cls = classify(log, k=args.k, window_s=window, peak_pct=peak, seed=args.seed)
    summ = write_outputs(log, cls, args.out, plots=not args.no_plots)
    if args.json:
        from fleetsieve_bayes.workloads.output import _jsonable

        print(json.dumps(_jsonable(summ)))
    else:
        print(f"{len(summ['classes'])} classes from {log.n} requests ({len(log.services)} service(s)) -> {args.out}")
        for c in summ["classes"]:
            print(f"  {c['name']:<16} {c['requests']:>7} req  prompt {c['prompt_range'][0]}-{c['prompt_range'][1]}"
                  f"  output {c['output_range'][0]}-{c['output_range'][1]}  mean {c['mean_rps']:.3g} req/s"
                  f"  p{peak:g} {c['peak_rps']:.3g} req/s  {c['slo_family']}")
        print(f"campaign skeleton: {args.out / 'campaign.toml'} (fill in the TODOs)")
    return 0
