"""inference-perf lifecycle reports → measurement-table rows (one per stage file).

inference-perf (kubernetes-sigs/inference-perf) writes ``stage_<i>_lifecycle_metrics.json``
per load stage and ``summary_lifecycle_metrics.json`` over all of them.

=======================  ===================================================================
table column             from a stage file
=======================  ===================================================================
``ttft_p99_s``           ``successes.latency.time_to_first_token.p99`` (s)
``completion_p99_s``     ``successes.latency.request_latency.p99`` (s)
``success_rate``         ``successes.count`` / (``successes.count`` + ``failures.count``)
``duration_s``           ``load_summary.send_duration`` (s, the time the stage was sending)
``offered_rps``          ``load_summary.requested_rate`` (the stage's open-loop rate), or
                         ``load_summary.achieved_rate`` when the client sent more than 5 %
                         below it (it fell behind its schedule; the row's ``note`` says
                         so); a stage without a requested rate (a concurrency stage)
                         offers what it sent: ``achieved_rate``
``throughput_rps``       ``successes.throughput.requests_per_sec``, capped at offered × success
load label               ``<requested_rate>rps`` (or ``stage<i>`` from the file name)
=======================  ===================================================================

Refused: the summary file (its requests come from every stage, at different
rates: no single offered rate; ingest the stage files), and a latency with no
p99. Closed against open loop is read from ``requested_rate``. inference-perf
records ``ignore_eos`` in its config, not in these files; warm-up stages are
stages like any other, so leave their files out.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends.ingest import _finish, _labels, _row
from fleetsieve_bayes.backends.ingest_common import dig, p99_of, positive, served, with_lengths
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import THROUGHPUT_SLACK

__all__ = ["is_inference_perf", "rows_from_inference_perf"]


def is_inference_perf(obj: Any) -> bool:
    return isinstance(obj, dict) and "load_summary" in obj and "successes" in obj


def rows_from_inference_perf(data: dict[str, Any], src: str, *, workload: str | None = None,
                             tp: int | None = None, load: str | None = None) -> list[dict[str, Any]]:
    """The row of one stage file (module docstring)."""
    ls = data.get("load_summary")
    if not isinstance(ls, dict):
        raise InputError(f"{src}: field 'load_summary': expected an object")
    if "send_duration" not in ls and "requested_rate" not in ls:
        raise InputError(f"{src}: a summary over all stages (no load_summary.send_duration or requested_rate) "
                         "mixes their rates; ingest the stage_<i>_lifecycle_metrics.json files")
    ok = positive(src, dig(data, "successes", "count"), "successes.count")
    fail_count = dig(data, "failures", "count")
    fail = positive(src, fail_count, "failures.count") if fail_count is not None else 0.0
    sent = ok + fail
    if sent <= 0:
        raise InputError(f"{src}: no requests (successes.count + failures.count is 0)")
    duration = positive(src, ls.get("send_duration"), "load_summary.send_duration")
    if duration <= 0:
        raise InputError(f"{src}: field 'load_summary.send_duration': must be positive")
    success = ok / sent
    rate = ls.get("requested_rate")
    note = ""
    if rate is not None:
        offered = positive(src, rate, "load_summary.requested_rate")
        label = f"{offered:g}rps"
        achieved = ls.get("achieved_rate")
        if achieved is not None and positive(src, achieved, "load_summary.achieved_rate") < offered / THROUGHPUT_SLACK:
            # The client fell behind its schedule: the server was offered what was sent.
            note = (f"{src}: the client sent {achieved:.4g} req/s, below the requested {offered:.4g} req/s; "
                    "offered_rps is the rate it sent")
            offered = float(achieved)
    else:
        offered = positive(src, ls.get("achieved_rate"), "load_summary.achieved_rate")
        m = re.search(r"stage_(\d+)", Path(src.split(":")[0]).name)
        label = f"stage{m.group(1)}" if m else "closed"
    if offered <= 0:
        raise InputError(f"{src}: offered rate is 0")
    if ok > 0:
        lat = dig(data, "successes", "latency") or {}
        ttft = p99_of(src, lat.get("time_to_first_token"), "successes.latency.time_to_first_token",
                      default_unit="s")
        rl = lat.get("request_latency")
        comp = p99_of(src, rl, "successes.latency.request_latency", default_unit="s") if rl else math.nan
        thr_raw = dig(data, "successes", "throughput", "requests_per_sec")
        thr = positive(src, thr_raw, "successes.throughput.requests_per_sec") if thr_raw is not None \
            else ok / duration
    else:
        ttft = comp = math.inf
        thr = 0.0
    labels = _labels(src, {"load": label}, workload, tp, load)
    thr = served(src, thr, offered, success, duration, "successes.throughput.requests_per_sec")
    row = _finish(src, _row(labels, offered, thr, ttft, comp, success, duration), ok)
    if note:
        row["note"] = note
    return [with_lengths(row, dig(data, "successes", "prompt_len", "mean"), dig(data, "successes", "output_len", "mean"))]
