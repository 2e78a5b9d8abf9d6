"""``fleetsieve-bayes ingest``: benchmark results → measurement-table rows.

Reads ``vllm bench serve --save-result`` JSON files (also ``--append-result``
files and the older ``benchmark_serving.py`` results), GuideLLM
``benchmarks.json``, AIPerf ``profile_export_aiperf.json``, inference-perf
``stage_<i>_lifecycle_metrics.json``, SGLang ``bench_serving`` JSONL and
llm-d-benchmark report (``.yaml``) files and writes their cells as table rows, so that
existing measurements can seed a campaign. Labels (workload, TP, load) come
from the command line or the result's metadata. The conversions (which key,
which unit, what "offered" means for a closed-loop run) are in
:mod:`fleetsieve_bayes.backends.ingest` and docs/measuring.md. A row whose source has
no completion timing leaves ``completion_p99_s`` empty (unobserved).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from fleetsieve_bayes.backends.ingest import ingest_file
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS, read_table, validate_table, write_table


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ingest", help="turn vllm bench / GuideLLM / AIPerf / inference-perf / SGLang / llm-d results into table rows",
                              description=__doc__)
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--workload", default=None, help="workload label (default: the result's metadata)")
    p.add_argument("--tp", type=int, default=None, help="TP label (default: the result's metadata)")
    p.add_argument("--load", default=None,
                   help="load label; comma-separated, one per benchmark, for a multi-benchmark GuideLLM file")
    p.add_argument("--trace", type=Path, default=None,
                   help="the workload's replay trace: refuse a result whose mean prompt or output length is "
                        "more than 25 %% away from the trace's (another workload)")
    p.add_argument("--out", type=Path, default=None,
                   help="table to write (.csv/.parquet); rows are appended to an existing one")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loads = [s.strip() for s in args.load.split(",")] if args.load else []
    rows: list[dict[str, Any]] = []
    for f in args.files:
        rows.extend(ingest_file(f, workload=args.workload, tp=args.tp, loads=loads, details=True))
    trace_means = None
    if args.trace is not None:
        from fleetsieve_bayes.backends.traces import read_trace

        tr = read_trace(args.trace)
        trace_means = (float(tr.input_tokens.mean()), float(tr.output_tokens.mean()))
    for r in rows:  # what a reader read differently from the file's own numbers, and why
        note = r.pop("note", "")
        lengths = r.pop("lengths", None)
        if trace_means is not None:
            _check_lengths(r, lengths, trace_means, args.trace)
        if note:
            print(f"note: {note}", file=sys.stderr)
    new = pd.DataFrame(rows, columns=[*COLUMNS, "failure"])
    validate_table(new, source="ingested rows")
    if args.out is not None:
        if args.out.exists():
            old = read_table(args.out)
            merged = pd.concat([old, new], ignore_index=True)
        else:
            merged = new
        merged = validate_table(merged, source=str(args.out))  # duplicate cells are an error
        tmp = args.out.with_name(f".{args.out.name}.tmp{args.out.suffix}")
        write_table(merged, tmp)
        tmp.replace(args.out)  # the old table stays intact if anything above failed
    if args.json:
        # Unobserved (NaN) → null; infinite tails stay the JSON extension `Infinity`.
        print(json.dumps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                          for r in rows]))
    elif args.out is None:
        new.to_csv(sys.stdout, index=False)
    if not rows:
        raise InputError("no rows ingested")
    return 0


def _check_lengths(row: dict[str, Any], lengths: tuple[float, float] | None, trace: tuple[float, float],
                   trace_path: Path) -> None:
    """Refuse a row whose run used other lengths than the class trace (one line naming both)."""
    from fleetsieve_bayes.backends.ingest_common import LENGTH_TOLERANCE

    where = f"row {row['workload']}/tp{row['tp']}/{row['load']}"
    if lengths is None:
        raise InputError(f"{where}: the result file records no mean prompt/output lengths to compare with "
                         f"{trace_path}; ingest it without --trace if it is the same workload")
    for what, got, want in (("prompt", lengths[0], trace[0]), ("output", lengths[1], trace[1])):
        if abs(math.log(got / want)) > math.log(LENGTH_TOLERANCE):
            raise InputError(f"{where}: mean {what} {got:.0f} tokens against {want:.0f} in {trace_path} "
                             f"(more than {100 * (LENGTH_TOLERANCE - 1):.0f} % apart): another workload, not converted")
