"""``fleetsieve-bayes measure``: one cell against an already running server.

Replays a trace open-loop (``--scale`` multiplies its arrival rate) for
``--warmup`` + ``--duration`` seconds against an OpenAI-compatible endpoint
and prints one measurement-table row (``--json``: as a JSON object). The
measurement window is ``--duration`` seconds after the warm-up; the row's
``duration_s`` is warm-up + window, the wall time the cell holds its GPUs.

The cell goes through :func:`fleetsieve_bayes.backends.cell.measure_cell`, the
same path as a campaign's vLLM backend: prompt token ids are drawn inside the
served model's vocabulary (``--vocab-size``, else the ``config.json`` of the
model ``/v1/models`` reports) and fitted into its ``max_model_len``. A window
in which some requests failed is a success measurement: ``success_rate`` =
succeeded / sent, throughput and tails from the requests that succeeded, and
the count of failed requests with the server's first error goes to stderr. A
window in which the server served nothing is printed with a ``failure`` label.
``--error-tolerance`` is deprecated and has no effect.

``--replicate K`` measures the cell's K-th repeated window the way a campaign
repeats one: the trace from K windows' worth of trace time further on, with
the prompt seed derived from ``--seed`` and K (the row's ``seed``); the row
then also has ``replicate``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends.cell import CellSpec, measure_cell, served_model_info
from fleetsieve_bayes.backends.server import probe
from fleetsieve_bayes.backends.traces import read_trace, replicate_seed, window_offset_s
from fleetsieve_bayes.errors import InputError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("measure", help="measure one cell against a running OpenAI-compatible server",
                              description=__doc__)
    p.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="served model name (the request's `model` field)")
    p.add_argument("--trace", required=True, type=Path, help="Azure or BurstGPT trace CSV")
    p.add_argument("--trace-format", default="auto", choices=("auto", "azure", "burstgpt"))
    p.add_argument("--scale", required=True, type=float, help="arrival-rate multiplier")
    p.add_argument("--duration", required=True, type=float, help="measurement window (s) after the warm-up")
    p.add_argument("--warmup", required=True, type=float, help="warm-up (s); its arrivals are excluded")
    p.add_argument("--request-timeout", type=float, default=300.0, help="per-request timeout (s); counts as failure")
    p.add_argument("--workload", default=None, help="workload label of the row (default: trace file stem)")
    p.add_argument("--tp", type=int, default=1, help="TP label of the row")
    p.add_argument("--load", default=None, help="load label of the row (default: x<scale>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicate", type=int, default=None,
                   help="measure repeated window K of the cell (another stretch of the trace, other prompts)")
    p.add_argument("--max-input-tokens", type=int, default=None)
    p.add_argument("--max-output-tokens", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=None,
                   help="prompt token ids are drawn below this (default: the served model's config.json, "
                        "found through /v1/models)")
    p.add_argument("--error-tolerance", type=float, default=None,
                   help="deprecated, no effect: a window with failed requests is a success measurement")
    p.add_argument("--records", type=Path, default=None, help="write per-request records here (Parquet, new file)")
    p.add_argument("--json", action="store_true", help="print the row as one JSON object")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    for name in ("scale", "duration"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v > 0):
            raise InputError(f"--{name}: must be a positive number, got {v!r}")
    if not (math.isfinite(args.warmup) and args.warmup >= 0):
        raise InputError(f"--warmup: must be >= 0, got {args.warmup!r}")
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        raise InputError(f"--request-timeout: must be a positive number, got {args.request_timeout!r}")
    if args.vocab_size is not None and args.vocab_size < 8:
        raise InputError(f"--vocab-size: must be an integer >= 8, got {args.vocab_size}")
    if args.error_tolerance is not None and not (0.0 <= args.error_tolerance <= 1.0):
        raise InputError(f"--error-tolerance: must be in [0, 1], got {args.error_tolerance!r}")
    if args.replicate is not None and args.replicate < 0:
        raise InputError(f"--replicate: must be an integer >= 0, got {args.replicate}")
    if args.tp < 1:
        raise InputError(f"--tp: must be a positive integer, got {args.tp}")
    if args.records is not None and args.records.exists():
        raise InputError(f"--records {args.records}: file exists; raw records are never overwritten")
    if not args.endpoint.startswith(("http://", "https://")):
        raise InputError(f"--endpoint {args.endpoint!r}: expected an http:// or https:// URL")


def health_ok(endpoint: str) -> bool:
    """True if ``/health`` answers 200, or — for servers without it — ``/v1/models`` does."""
    base = endpoint.rstrip("/")
    base = base[: -len("/v1")] if base.endswith("/v1") else base
    status = probe(base + "/health", timeout_s=5.0)
    if status == 200:
        return True
    if status == 404:
        return probe(base + "/v1/models", timeout_s=5.0) == 200
    return False


DEPRECATED_TOLERANCE = (
    "measure: --error-tolerance is deprecated and has no effect: a window with failed requests is a "
    "success measurement (success = succeeded / sent); only a window in which nothing was served is a failure"
)


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.error_tolerance is not None:
        print(DEPRECATED_TOLERANCE, file=sys.stderr)
    trace = read_trace(args.trace, args.trace_format)
    if not health_ok(args.endpoint):
        raise InputError(f"--endpoint {args.endpoint}: server is not healthy (GET /health did not answer 200)")
    rep = args.replicate or 0
    spec = CellSpec(workload=args.workload or args.trace.stem, tp=args.tp, load=args.load or f"x{args.scale:g}",
                    scale=args.scale, warmup_s=args.warmup, duration_s=args.duration,
                    request_timeout_s=args.request_timeout, seed=replicate_seed(args.seed, rep),
                    max_input_tokens=args.max_input_tokens, max_output_tokens=args.max_output_tokens,
                    trace_offset_s=window_offset_s(trace, args.scale, args.warmup + args.duration, rep))
    served = served_model_info(args.endpoint, args.model, vocab_size=args.vocab_size)
    result = measure_cell(args.endpoint, args.model, trace, spec, served=served, records_path=args.records)
    row = dict(result.row)
    detail = row.pop("detail", "")
    if args.replicate is not None:
        row["replicate"] = rep
    if row["failure"]:
        # A failed cell is an observation (the row is printed); say why on stderr.
        print(f"measure: cell failed ({row['failure']}): {detail}", file=sys.stderr)
    elif detail:
        print(f"measure: success_rate {row['success_rate']:.4g}: {detail}", file=sys.stderr)
    if args.json:
        # inf tails (no request succeeded) are written as the JSON extension `Infinity`.
        print(json.dumps(row))
    else:
        print(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return 0
