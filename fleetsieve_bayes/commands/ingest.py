"""``fleetsieve-bayes ingest``: benchmark results → measurement-table rows.

Reads ``vllm bench serve --save-result`` JSON files (also ``--append-result``
files and the older ``benchmark_serving.py`` results), GuideLLM
``benchmarks.json``, AIPerf ``profile_export_aiperf.json``, inference-perf
``stage_<i>_lifecycle_metrics.json``, SGLang ``bench_serving`` JSONL and
llm-d-benchmark report (``.yaml``) files and writes their cells as table rows, so that
existing measurements can seed a campaign. Labels (workload, TP, load) come
from the command line or the result's metadata. Several results of one cell
(in the files given, or already in ``--out``) are its repeated windows: the
rows then carry ``replicate`` 0, 1, … in order; the same result twice is an
error. The conversions (which key,
which unit, what "offered" means for a closed-loop run) are in
:mod:`fleetsieve_bayes.backends.ingest` and docs/measuring.md. A row whose source has
no completion timing leaves ``completion_p99_s`` empty (unobserved).
``--config NAME`` labels the rows with a configuration of a campaign's
``[[configs]]`` catalogue in place of ``--tp`` (``tp`` left empty, or the
``--tp`` given too for an aggregated configuration); an llm-d report whose
stack is prefill and decode engines names its layout ``{P}p-tp{tp_p}+{D}d-tp{tp_d}``
by itself (docs/ingest.md, "Configurations").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from fleetsieve_bayes.backends.ingest import ingest_file, number_replicates
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS, read_table, validate_table, write_table


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ingest", help="turn vllm bench / GuideLLM / AIPerf / inference-perf / SGLang / llm-d results into table rows",
                              description=__doc__)
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--workload", default=None, help="workload label (default: the result's metadata)")
    p.add_argument("--tp", type=int, default=None, help="TP label (default: the result's metadata)")
    p.add_argument("--config", default=None, metavar="NAME",
                   help="configuration label, a name of the campaign's [[configs]], in place of --tp: the rows "
                        "name it and leave tp empty (with --tp too: that TP, for an aggregated configuration; "
                        "refused where the name says another layout)")
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
    sources: list[str] = []
    for f in args.files:
        got = ingest_file(f, workload=args.workload, tp=args.tp, loads=loads, details=True, config=args.config)
        rows.extend(got)
        sources.extend([str(f)] * len(got))
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
    old = read_table(args.out) if args.out is not None and args.out.exists() else None
    # Several results of one cell are its windows 0, 1, … (after those the table holds).
    rows = number_replicates(rows, sources, existing=old, existing_source=str(args.out))
    with_replicates = any(r["replicate"] for r in rows) or (old is not None and "replicate" in old.columns)
    if not with_replicates:
        rows = [{k: v for k, v in r.items() if k != "replicate"} for r in rows]
    # Rows naming a configuration (--config, an llm-d layout) add the column, their tp maybe empty.
    with_config = any(r.get("config") for r in rows) or (old is not None and "config" in old.columns)
    new = pd.DataFrame(rows, columns=[*COLUMNS, "failure", *(["config"] if with_config else []),
                                      *(["replicate"] if with_replicates else [])])
    if with_config:
        new = _empty_tp(new.assign(config=new["config"].fillna("")))
    # The new rows on their own (numbered from 0 here: the table's windows come first).
    local = new
    if with_replicates:
        local = new.assign(replicate=_local_replicates(new) if with_config
                           else new.groupby(["workload", "tp", "load"], sort=False).cumcount())
    validate_table(local, source="ingested rows")
    if args.out is not None:
        if old is not None:
            if with_replicates and "replicate" not in old.columns:
                old = old.assign(replicate=0)  # a table without the column: one window per cell
            merged = pd.concat([_empty_tp(old) if with_config else old, new], ignore_index=True)
        else:
            merged = new
        merged = validate_table(merged, source=str(args.out))
        if with_config:
            merged = _empty_tp(merged)  # a row naming a configuration without a tp keeps it empty
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


def _empty_tp(df: pd.DataFrame) -> pd.DataFrame:
    """``tp`` as nullable integers, empty where a row names a configuration and gives no TP
    (None, NaN, or the 0 a validated table reads an empty one as)."""
    def tp(v: Any, conf: Any) -> int | None:
        if v is None or pd.isna(v):
            return None
        return None if int(v) == 0 and str(conf or "").strip() else int(v)

    confs = df["config"] if "config" in df.columns else [""] * len(df)
    return df.assign(tp=pd.array([tp(v, c) for v, c in zip(df["tp"], confs, strict=True)], dtype="Int64"))


def _local_replicates(df: pd.DataFrame) -> list[int]:
    """Each row's window among the rows of its cell here, 0, 1, … in order; a cell names its
    configuration where the row names one, else its TP (as the table tells cells apart)."""
    seen: dict[tuple[str, Any, str], int] = {}
    out = []
    for w, t, load, conf in zip(df["workload"], df["tp"], df["load"], df["config"], strict=True):
        key = (str(w), str(conf).strip().lower() if str(conf or "").strip() else int(t), str(load))
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return out


def _check_lengths(row: dict[str, Any], lengths: tuple[float, float] | None, trace: tuple[float, float],
                   trace_path: Path) -> None:
    """Refuse a row whose run used other lengths than the class trace (one line naming both)."""
    from fleetsieve_bayes.backends.ingest_common import LENGTH_TOLERANCE

    cell = row["config"] if row.get("config") else f"tp{row['tp']}"
    where = f"row {row['workload']}/{cell}/{row['load']}"
    if lengths is None:
        raise InputError(f"{where}: the result file records no mean prompt/output lengths to compare with "
                         f"{trace_path}; ingest it without --trace if it is the same workload")
    for what, got, want in (("prompt", lengths[0], trace[0]), ("output", lengths[1], trace[1])):
        if abs(math.log(got / want)) > math.log(LENGTH_TOLERANCE):
            raise InputError(f"{where}: mean {what} {got:.0f} tokens against {want:.0f} in {trace_path} "
                             f"(more than {100 * (LENGTH_TOLERANCE - 1):.0f} % apart): another workload, not converted")
