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
(``replicas`` > 1, or prefill/decode roles in a v0.1 report: the table's cell
is one server of one TP), a rate given as a list (a sweep, one report per
rate). ``ignore_eos`` is read from ``scenario.load.native.config.server``
where present and kept in the docs' hazards, not converted.

Configurations (``--config``, docs/ingest.md): a v0.2 stack of ``prefill``
and ``decode`` engines (``standardized.role``; ``replicas`` workers of
``accelerator.parallelism.tp`` each, every engine of a role of one TP) is one
replica of a disaggregated configuration, the layout
``{P}p-tp{tp_p}+{D}d-tp{tp_d}``. Its row names that layout as its ``config``,
``tp`` empty, unless ``--config NAME`` names the campaign's own entry (whose
name, where it says a layout, must say this one); ``--tp`` with ``--config``
on such a stack is refused (no single TP), ``--tp`` alone reads it as that
TP, as before. A one-engine stack with ``--config`` names it, ``tp`` empty
(or ``--tp``, which must be the engine's TP).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends.ingest_common import dig, p99_of, positive, served, with_lengths
from fleetsieve_bayes.backends.ingest_rows import (
    finish_row,
    ingest_row,
    layout_name,
    named_layout,
    named_tp,
    row_labels,
    with_config,
)
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


def _layout(src: str, engines: list[tuple[Any, Any, Any]]) -> tuple[int, int, int, int] | None:
    """``(P, tp_p, D, tp_d)`` of a v0.2 stack of prefill and decode engines, None for another stack.

    Raises:
        InputError: a stack of both roles that is not one layout (a role's engines of
            several TPs, a bad TP or replica count, or a ``replica`` engine beside them).
    """
    roles = {str(r).lower() if r is not None else "replica" for r, _, _ in engines}
    if not {"prefill", "decode"} <= roles:
        return None
    if roles != {"prefill", "decode"}:
        raise InputError(f"{src}: the stack has prefill and decode engines beside {', '.join(sorted(roles - {'prefill', 'decode'}))} "
                         "ones: not one disaggregated layout, so this report is not converted")
    out: list[int] = []
    for role in ("prefill", "decode"):
        tps = {t for r, t, _ in engines if str(r).lower() == role}
        if len(tps) != 1 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in tps):
            raise InputError(f"{src}: the {role} engines' parallelism.tp: expected one integer >= 1, got "
                             f"{', '.join(map(repr, sorted(tps, key=repr)))}")
        workers = 0
        for r, _, n in engines:
            if str(r).lower() != role:
                continue
            n = 1 if n is None else n
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InputError(f"{src}: a {role} engine's replicas: expected an integer >= 1, got {n!r}")
            workers += n
        out += [workers, next(iter(tps))]
    return out[0], out[1], out[2], out[3]


def _configured(src: str, engines: list[tuple[Any, Any, Any]], tp: int | None,
                config: str | None) -> tuple[int | None, str | None]:
    """``(tp, config)`` of a v0.2 report's row: the TP label the reader uses (None: the stack's one
    engine's) and the configuration the row names (None: none, as before configurations)."""
    layout = _layout(src, engines)
    if layout is not None:
        name = layout_name(*layout)
        if config is None:
            return (tp, None) if tp is not None else (1, name)  # --tp alone: that TP, as before
        if tp is not None:
            raise InputError(f"{src}: the stack is disaggregated ({name}), which has no single TP: give --config "
                             "without --tp")
        said = named_layout(config)
        if (said is not None and said != layout) or named_tp(config) is not None:
            raise InputError(f"{src}: --config {config} says another layout than the report's stack ({name})")
        return 1, config
    if config is None:
        return tp, None
    if tp is not None:  # --tp reads the report as that TP, as without --config; the stack must not contradict it
        one = engines[0][1] if len(engines) == 1 and engines[0][2] in (None, 1) else None
        if isinstance(one, int) and not isinstance(one, bool) and one != tp:
            raise InputError(f"{src}: --tp {tp} but the report's one engine has tp {one}")
        return tp, config
    stack_tp = _one_engine_tp(src, engines)
    if named_layout(config) is not None or named_tp(config) not in (None, stack_tp):
        raise InputError(f"{src}: --config {config} says another layout than the report's stack "
                         f"(one engine of TP{stack_tp})")
    return 1, config


def rows_from_llmd(data: dict[str, Any], src: str, *, workload: str | None = None, tp: int | None = None,
                   load: str | None = None, config: str | None = None) -> list[dict[str, Any]]:
    """The row of one report (module docstring); ``config``: ``--config``, checked by
    :func:`~.ingest_rows.check_config` against ``tp`` already."""
    version = str(data.get("version"))
    if version.startswith("0.1"):
        row = _v01(data, src, workload, tp, load)
        return [row if config is None else with_config(row, config, tp)]
    if version.startswith("0.2"):
        return [_v02(data, src, workload, tp, load, config)]
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
    labels = row_labels(src, {"load": f"{rate:g}rps" if rate else "closed"}, workload, t, load)
    thr = served(src, thr, offered, success, duration, "metrics.throughput.requests_per_sec")
    row = finish_row(src, ingest_row(labels, offered, thr, ttft, comp, success, duration), ok)
    req = m.get("requests") or {}
    return with_lengths(row, dig(req, "input_length", "mean"), dig(req, "output_length", "mean"))


def _v02(data: dict[str, Any], src: str, workload: str | None, tp: int | None, load: str | None,
         config: str | None = None) -> dict[str, Any]:
    agg = dig(data, "results", "request_performance", "aggregate")
    if not isinstance(agg, dict):
        raise InputError(f"{src}: missing field 'results.request_performance.aggregate'")
    stack = dig(data, "scenario", "stack") or []
    engines = [(dig(c, "standardized", "role"), dig(c, "standardized", "accelerator", "parallelism", "tp"),
                dig(c, "standardized", "replicas"))
               for c in stack if dig(c, "standardized", "kind") == "inference_engine"]
    label_tp, conf = _configured(src, engines, tp, config)
    t = label_tp if label_tp is not None else _one_engine_tp(src, engines)
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
    labels = row_labels(src, {"load": label}, workload, t, load)
    row = finish_row(src, ingest_row(labels, offered, thr, ttft, comp, success, duration), ok)
    if conf is not None:  # the configuration is the row's label; tp is the given one, or empty
        row = with_config(row, conf, tp)
    if dig(data, "scenario", "load", "native", "config", "server", "ignore_eos") is False:
        row["note"] = (f"{src}: ignore_eos is false: outputs stopped at EOS, so their lengths are the "
                       "model's, not the requested ones")
    req = agg.get("requests") or {}
    return with_lengths(row, dig(req, "input_length", "mean"), dig(req, "output_length", "mean"))
