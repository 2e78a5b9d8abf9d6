"""SGLang ``python -m sglang.bench_serving --output-file X.jsonl`` → rows (one per line).

=======================  ===================================================================
table column             from one JSON line
=======================  ===================================================================
``ttft_p99_s``           ``p99_ttft_ms`` / 1000
``completion_p99_s``     ``p99_e2e_latency_ms`` / 1000; empty (unobserved) when absent
``success_rate``         1.0: the file records ``completed`` but neither the requests sent
                         nor the failed ones, so success here means "the requests the file
                         counts completed"; a run whose requests failed is not visible in it
``duration_s``           ``duration`` (s, until the last request finished)
``offered_rps``          ``request_rate`` for an open-loop run (finite, no
                         ``max_concurrency``); a closed-loop run (``inf``, or a
                         ``max_concurrency``) offers what it completed: ``completed`` /
                         ``duration`` (with a finite rate and a cap, the smaller)
``throughput_rps``       ``completed`` / ``duration``, capped at offered × success
load label               ``<rate>rps``, ``C<max_concurrency>`` or ``max``
=======================  ===================================================================

Refused: a line with no ``p99_ttft_ms`` (older releases write means and
medians only; a median is not a p99). SGLang writes a ramp (``--request-rate``
list) as one line per rate, each read on its own.
"""

from __future__ import annotations

import math
from typing import Any

from fleetsieve_bayes.backends.ingest import _finish, _labels, _number, _row
from fleetsieve_bayes.backends.ingest_common import served, with_lengths
from fleetsieve_bayes.errors import InputError

__all__ = ["is_sglang", "rows_from_sglang"]


def is_sglang(obj: Any) -> bool:
    return isinstance(obj, dict) and "completed" in obj and "duration" in obj and (
        "median_e2e_latency_ms" in obj or "total_output_tokens_retokenized" in obj or "mean_e2e_latency_ms" in obj)


def rows_from_sglang(data: dict[str, Any], src: str, *, workload: str | None = None, tp: int | None = None,
                     load: str | None = None) -> list[dict[str, Any]]:
    """The row of one bench_serving result line (module docstring)."""
    completed = _number(src, data.get("completed"), "completed")
    duration = _number(src, data.get("duration"), "duration")
    if duration <= 0:
        raise InputError(f"{src}: field 'duration': must be positive, got {duration:g}")
    if completed > 0 and data.get("p99_ttft_ms") is None:
        have = [k for k in ("mean_ttft_ms", "median_ttft_ms") if data.get(k) is not None]
        raise InputError(f"{src}: no p99_ttft_ms (this bench_serving writes {', '.join(have) or 'no TTFT'} only); "
                         "a mean or median is not comparable with a p99 and is not converted")
    rate_raw = data.get("request_rate")
    rate = math.inf if rate_raw is None or (isinstance(rate_raw, float) and math.isinf(rate_raw)) \
        or (isinstance(rate_raw, str) and rate_raw.strip().lower() in ("inf", "infinity")) \
        else _number(src, rate_raw, "request_rate")
    conc = data.get("max_concurrency")
    if conc is not None:
        conc = _number(src, conc, "max_concurrency")
    achieved = completed / duration
    if math.isfinite(rate) and rate > 0 and conc is None:
        offered, label = rate, f"{rate:g}rps"
    elif math.isfinite(rate) and rate > 0:
        offered, label = min(rate, achieved), f"{rate:g}rps-C{conc:g}"
    else:
        offered, label = achieved, (f"C{conc:g}" if conc is not None else "max")
    if offered <= 0:
        raise InputError(f"{src}: no request completed in a closed-loop run: no offered rate to read")
    ttft = _number(src, data["p99_ttft_ms"], "p99_ttft_ms") / 1000.0 if completed > 0 else math.inf
    p99_e2e = data.get("p99_e2e_latency_ms")
    comp = _number(src, p99_e2e, "p99_e2e_latency_ms") / 1000.0 if p99_e2e is not None else math.nan
    labels = _labels(src, {"load": label}, workload, tp, load)
    row = _row(labels, offered, served(src, achieved, offered, 1.0, duration, "completed / duration"), ttft, comp, 1.0,
               duration)
    row = _finish(src, row, completed)
    if completed > 0:
        with_lengths(row, (data.get("total_input_tokens") or 0) / completed,
                     (data.get("total_output_tokens") or 0) / completed)
    return [row]
