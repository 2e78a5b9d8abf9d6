"""AIPerf ``profile_export_aiperf.json`` → one measurement-table row.

Three layouts: metric objects at the top level (``time_to_first_token``,
``request_latency``, … each ``{unit, avg, p50, p90, p99, …}``), the same under
``metrics``, or, in older AIPerf releases, under ``records`` with short tags
(``ttft``).

=======================  ===================================================================
table column             from the file
=======================  ===================================================================
``ttft_p99_s``           ``time_to_first_token.p99`` (``records.ttft.p99``) × its ``unit``
``completion_p99_s``     ``request_latency.p99`` × its ``unit``
``success_rate``         ``request_count`` / (``request_count`` + ``error_request_count``);
                         ``request_count`` counts the successful requests, a null error
                         count is 0
``duration_s``           ``benchmark_duration`` (s)
``offered_rps``          ``input_config.loadgen.request_rate`` for an open-loop run (a rate
                         and no ``concurrency``); a closed-loop run (``concurrency``) offers
                         what it sent: requests / duration (with both, the smaller)
``throughput_rps``       ``request_count`` / duration, capped at offered × success
load label               ``<rate>rps`` or ``C<concurrency>``
=======================  ===================================================================

Refused: a metric with no p99 (a p90 is not converted), a run with
``request_cancellation_rate`` (it cancels requests on purpose, so its error
count is not the server's), a ``was_cancelled`` run. AIPerf leaves warm-up
requests (``loadgen.warmup_request_count``) out of its metrics, so nothing is
subtracted. ``input_config.input.extra`` ``ignore_eos`` is recorded by the
file only; lengths are the user's to match against a class.
"""

from __future__ import annotations

import math
from typing import Any

from fleetsieve_bayes.backends.ingest import _finish, _labels, _row
from fleetsieve_bayes.backends.ingest_common import (
    dig,
    p99_of,
    positive,
    seconds,
    served,
    with_lengths,
)
from fleetsieve_bayes.errors import InputError

__all__ = ["is_aiperf", "rows_from_aiperf"]

_TAGS = {"time_to_first_token": "ttft"}


def is_aiperf(obj: Any) -> bool:
    return isinstance(obj, dict) and ("input_config" in obj or "aiperf_version" in obj) and any(
        k in obj for k in ("records", "metrics", "time_to_first_token", "request_latency", "request_count"))


def _metric(data: dict[str, Any], name: str) -> tuple[Any, str]:
    if isinstance(data.get("records"), dict):
        tag = _TAGS.get(name, name)
        return data["records"].get(tag), f"records.{tag}"
    if isinstance(data.get("metrics"), dict) and name not in data:
        return data["metrics"].get(name), f"metrics.{name}"
    return data.get(name), name


def _scalar(src: str, data: dict[str, Any], name: str, *, required: bool) -> float | None:
    m, field = _metric(data, name)
    if m is None:
        if required:
            raise InputError(f"{src}: missing field {field!r}")
        return None
    v = m.get("avg") if isinstance(m, dict) else m
    return None if v is None and not required else positive(src, v, f"{field}.avg")


def rows_from_aiperf(data: dict[str, Any], src: str, *, workload: str | None = None, tp: int | None = None,
                     load: str | None = None) -> list[dict[str, Any]]:
    """The row of one AIPerf export (module docstring)."""
    if data.get("was_cancelled"):
        raise InputError(f"{src}: the run was cancelled before it finished (was_cancelled = true)")
    lg = dig(data, "input_config", "loadgen") or {}
    if lg.get("request_cancellation_rate"):
        raise InputError(f"{src}: request_cancellation_rate = {lg['request_cancellation_rate']!r}: the client "
                         "cancelled requests on purpose, so the error count is not the server's")
    ok = _scalar(src, data, "request_count", required=True) or 0.0
    err = _scalar(src, data, "error_request_count", required=False) or 0.0
    sent = ok + err
    if sent <= 0:
        raise InputError(f"{src}: no requests (request_count + error_request_count is 0)")
    dur_m, dur_field = _metric(data, "benchmark_duration")
    if not isinstance(dur_m, dict) or dur_m.get("avg") is None:
        raise InputError(f"{src}: missing field {dur_field!r}")
    duration = positive(src, dur_m["avg"], f"{dur_field}.avg") * seconds(src, dur_m.get("unit", "sec"),
                                                                         f"{dur_field}.unit")
    if duration <= 0:
        raise InputError(f"{src}: field {dur_field!r}: must be positive")
    success = ok / sent
    if ok > 0:
        ttft_m, ttft_field = _metric(data, "time_to_first_token")
        ttft = p99_of(src, ttft_m, ttft_field)
        lat_m, lat_field = _metric(data, "request_latency")
        comp = p99_of(src, lat_m, lat_field) if lat_m is not None else math.nan
    else:
        ttft = comp = math.inf
    rate = lg.get("request_rate")
    conc = lg.get("concurrency")
    achieved = sent / duration
    if rate is not None:
        rate = positive(src, rate, "input_config.loadgen.request_rate")
    if conc is not None:
        conc = positive(src, conc, "input_config.loadgen.concurrency")
    if rate and conc is None:
        offered, label = rate, f"{rate:g}rps"
    elif rate:
        offered, label = min(rate, achieved), f"{rate:g}rps-C{conc:g}"
    else:
        offered, label = achieved, (f"C{conc:g}" if conc is not None else "max")
    labels = _labels(src, {"load": label}, workload, tp, load)
    thr = served(src, ok / duration, offered, success, duration, "request_count / benchmark_duration")
    row = _finish(src, _row(labels, offered, thr, ttft, comp, success, duration), ok)
    isl, _ = _metric(data, "input_sequence_length")
    osl, _ = _metric(data, "output_sequence_length")
    return [with_lengths(row, dig(isl, "avg"), dig(osl, "avg"))]
