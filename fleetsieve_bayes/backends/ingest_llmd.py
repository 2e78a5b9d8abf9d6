"""llm-d-benchmark report (YAML, schema v0.1 and v0.2/v0.2.1) → one measurement-table row.

=======================  ==============================================  ===========================================
table column             v0.1                                            v0.2 (``results.request_performance.aggregate``)
=======================  ==============================================  ===========================================
``ttft_p99_s``           ``metrics.latency.time_to_first_token.p99``     ``latency.time_to_first_token.p99``
                         × ``units``                                     × ``units``
``completion_p99_s``     ``metrics.latency.request_latency.p99``         ``latency.request_latency.p99``; empty
                                                                         (unobserved) when it has no percentiles
``success_rate``         (``requests.total`` − ``failures`` −            same, from ``requests``
                         ``incomplete``) / (``total`` − ``incomplete``)
``duration_s``           ``metrics.time.duration``                       ``run.time.duration`` (ISO 8601, ``PT49.9S``)
``offered_rps``          ``scenario.load.args.qps_values`` (open loop)   ``scenario.load.standardized.rate_qps``
                                                                         (open loop); a finite ``concurrency`` and no
                                                                         rate: requests / duration
``throughput_rps``       ``metrics.throughput.requests_per_sec``         ``throughput.request_rate.mean``
TP                       the one engine's ``parallelism.tp``             the one engine's
                                                                         ``standardized.accelerator.parallelism.tp``
=======================  ==============================================  ===========================================

``incomplete`` requests (cut off when the run ended) are neither successes nor
failures, as in GuideLLM. Refused: a latency with percentiles but no p99 (the
v0.1 example has p10/p50/p90 only), a stack that is not one engine replica
(prefill/decode roles or ``replicas`` > 1: the table's cell is one server of
one TP), a rate given as a list (a sweep, one report per rate). ``ignore_eos``
is read from ``scenario.load.native.config.server`` where present and kept in
the docs' hazards, not converted.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends.ingest import _finish, _labels, _row
from fleetsieve_bayes.backends.ingest_common import dig, p99_of, positive, served, with_lengths
from fleetsieve_bayes.errors import InputError

__all__ = ["read_llmd_report", "rows_from_llmd"]


def read_llmd_report(path: Path) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        from fleetsieve_bayes.errors import EnvironmentProblem

        raise EnvironmentProblem("reading an llm-d benchmark report needs PyYAML (pip install pyyaml)") from None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: result file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read result file: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or "version" not in data:
        raise InputError(f"{path}: not an llm-d benchmark report (no 'version' at the top level)")
    return data


def _iso_duration(src: str, v: Any, field: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return positive(src, v, field)
    m = re.fullmatch(r"P(?:(\d+(?:\.\d+)?)D)?(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?",
                     str(v).strip())
    if not m or not any(m.groups()):
        raise InputError(f"{src}: field {field!r}: expected seconds or an ISO 8601 duration, got {v!r}")
    d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s


def _success(src: str, req: Any, where: str) -> tuple[float, float, float]:
    """``(successful, counted, total)`` from ``requests.{total, failures, incomplete}``."""
    if not isinstance(req, dict):
        raise InputError(f"{src}: missing field {where!r}")
    total = positive(src, req.get("total"), f"{where}.total")
    fail = positive(src, req.get("failures", 0), f"{where}.failures")
    inc = positive(src, req.get("incomplete", 0) or 0, f"{where}.incomplete")
    counted = total - inc
    if counted <= 0:
        raise InputError(f"{src}: {where}: no completed or failed request (total {total:g}, incomplete {inc:g})")
    return counted - fail, counted, total


def _one_engine_tp(src: str, engines: list[tuple[str, Any, Any]]) -> int:
    if len(engines) != 1 or (engines[0][2] not in (None, 1)):
        roles = ", ".join(f"{r or 'replica'}×{n or 1}" for r, _, n in engines) or "none"
        raise InputError(f"{src}: the stack is not one engine replica ({roles}); the table's cell is one "
                         "server of one TP, so this report is not converted")
    tp = engines[0][1]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"{src}: engine parallelism.tp: expected an integer >= 1, got {tp!r}")
    return tp


def rows_from_llmd(data: dict[str, Any], src: str, *, workload: str | None = None, tp: int | None = None,
                   load: str | None = None) -> list[dict[str, Any]]:
    """The row of one report (module docstring)."""
    version = str(data.get("version"))
    if version.startswith("0.1"):
        return [_v01(data, src, workload, tp, load)]
    if version.startswith("0.2"):
        return [_v02(data, src, workload, tp, load)]
    raise InputError(f"{src}: llm-d benchmark report version {version!r} is not read (0.1, 0.2, 0.2.1 are)")


def _rate(src: str, v: Any, field: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, list):
        raise InputError(f"{src}: field {field!r} is a list {v!r} (a sweep); one report per rate is read")
    x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    if math.isnan(x) or x <= 0:
        raise InputError(f"{src}: field {field!r}: expected a positive rate, got {v!r}")
    return x


def _v01(data: dict[str, Any], src: str, workload: str | None, tp: int | None, load: str | None) -> dict[str, Any]:
    m = data.get("metrics")
    if not isinstance(m, dict):
        raise InputError(f"{src}: missing field 'metrics'")
    host = dig(data, "scenario", "host") or {}
    types = host.get("type") or []
    accs = host.get("accelerator") or []
    engines = [(t, dig(a, "parallelism", "tp"), None) for t, a in zip(types, accs, strict=False)]
    t = tp if tp is not None else _one_engine_tp(src, engines)
    ok, counted, _ = _success(src, m.get("requests"), "metrics.requests")
    duration = positive(src, dig(m, "time", "duration"), "metrics.time.duration")
    lat = m.get("latency") or {}
    ttft = p99_of(src, lat.get("time_to_first_token"), "metrics.latency.time_to_first_token") if ok else math.inf
    rl = lat.get("request_latency")
    comp = (p99_of(src, rl, "metrics.latency.request_latency") if rl else math.nan) if ok else math.inf
    rate = _rate(src, dig(data, "scenario", "load", "args", "qps_values"), "scenario.load.args.qps_values")
    offered = rate if rate is not None else counted / duration
    thr = positive(src, dig(m, "throughput", "requests_per_sec"), "metrics.throughput.requests_per_sec")
    success = ok / counted
    labels = _labels(src, {"load": f"{rate:g}rps" if rate else "closed"}, workload, t, load)
    thr = served(src, thr, offered, success, duration, "metrics.throughput.requests_per_sec")
    row = _finish(src, _row(labels, offered, thr, ttft, comp, success, duration), ok)
    req = m.get("requests") or {}
    return with_lengths(row, dig(req, "input_length", "mean"), dig(req, "output_length", "mean"))


def _v02(data: dict[str, Any], src: str, workload: str | None, tp: int | None, load: str | None) -> dict[str, Any]:
    agg = dig(data, "results", "request_performance", "aggregate")
    if not isinstance(agg, dict):
        raise InputError(f"{src}: missing field 'results.request_performance.aggregate'")
    stack = dig(data, "scenario", "stack") or []
    engines = [(dig(c, "standardized", "role"), dig(c, "standardized", "accelerator", "parallelism", "tp"),
                dig(c, "standardized", "replicas"))
               for c in stack if dig(c, "standardized", "kind") == "inference_engine"]
    t = tp if tp is not None else _one_engine_tp(src, engines)
    ok, counted, _ = _success(src, agg.get("requests"), "results.request_performance.aggregate.requests")
    duration = _iso_duration(src, dig(data, "run", "time", "duration"), "run.time.duration")
    if duration <= 0:
        raise InputError(f"{src}: field 'run.time.duration': must be positive")
    lat = agg.get("latency") or {}
    base = "results.request_performance.aggregate.latency"
    ttft = p99_of(src, lat.get("time_to_first_token"), f"{base}.time_to_first_token") if ok else math.inf
    rl = lat.get("request_latency")
    has_pct = isinstance(rl, dict) and any(k.startswith("p") and k[1:2].isdigit() for k in rl)
    comp = (p99_of(src, rl, f"{base}.request_latency") if has_pct else math.nan) if ok else math.inf
    std = dig(data, "scenario", "load", "standardized") or {}
    rate = _rate(src, std.get("rate_qps"), "scenario.load.standardized.rate_qps")
    conc = std.get("concurrency")
    finite_conc = isinstance(conc, (int, float)) and not isinstance(conc, bool) and math.isfinite(conc)
    if rate is not None and not finite_conc:
        offered, label = rate, f"{rate:g}rps"
    elif rate is not None:
        offered, label = min(rate, counted / duration), f"{rate:g}rps-C{conc:g}"
    else:
        offered, label = counted / duration, (f"C{conc:g}" if finite_conc else "closed")
    rr = dig(agg, "throughput", "request_rate")
    if isinstance(rr, dict):
        unit = str(rr.get("units", "queries/s"))
        if unit not in ("queries/s", "requests/s", "req/s"):
            raise InputError(f"{src}: throughput.request_rate: unknown unit {unit!r}")
        thr = positive(src, rr.get("mean"), "results.request_performance.aggregate.throughput.request_rate.mean")
    else:
        thr = ok / duration
    success = ok / counted
    thr = served(src, thr, offered, success, duration, "throughput.request_rate.mean")
    labels = _labels(src, {"load": label}, workload, t, load)
    row = _finish(src, _row(labels, offered, thr, ttft, comp, success, duration), ok)
    if dig(data, "scenario", "load", "native", "config", "server", "ignore_eos") is False:
        row["note"] = (f"{src}: ignore_eos is false: outputs stopped at EOS, so their lengths are the "
                       "model's, not the requested ones")
    req = agg.get("requests") or {}
    return with_lengths(row, dig(req, "input_length", "mean"), dig(req, "output_length", "mean"))
