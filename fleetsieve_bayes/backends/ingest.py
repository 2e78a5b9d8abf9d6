"""Existing benchmark results → measurement-table rows.

Two formats:

- ``vllm bench serve --save-result`` JSON: one cell per file. ``offered_rps``
  = ``request_rate`` (or ``num_prompts / duration`` when the rate was
  ``inf``), ``throughput_rps`` = ``completed / duration``, ``success_rate`` =
  ``completed / num_prompts``, TTFT p99 = ``p99_ttft_ms`` and completion p99 =
  ``p99_e2el_ms`` (``--percentile-metrics ttft,e2el``), falling back to the
  per-request ``ttfts`` / ``latencies`` of ``--save-detailed``. Labels come
  from the command line or from ``--metadata workload=… tp=… load=…``.
- GuideLLM ``benchmarks.json``: one cell per benchmark. Counts from
  ``metrics.request_totals`` (successful/errored/incomplete/total),
  ``offered_rps`` = total / duration, ``throughput_rps`` = successful /
  duration, TTFT p99 from ``time_to_first_token_ms.successful.percentiles.p99``,
  completion p99 from ``request_latency.successful.percentiles.p99`` (seconds).
  The load label defaults to the benchmark's strategy (e.g. ``constant@2.5``).

Every problem is an :class:`~fleetsieve_bayes.errors.InputError` naming the
file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ingest_file", "rows_from_vllm_bench", "rows_from_guidellm"]

from fleetsieve_bayes.errors import InputError


def ingest_file(path: str | Path, *, workload: str | None = None, tp: int | None = None,
                loads: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of one result file (format detected from its content).

    Args:
        loads: load labels, one per cell of the file in order (a single label
            for a vLLM result); empty to take them from metadata/strategy.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: result file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read result file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("benchmarks"), list):
        return rows_from_guidellm(data, str(path), workload=workload, tp=tp, loads=loads)
    if isinstance(data, dict) and "completed" in data and "duration" in data:
        if len(loads) > 1:
            raise InputError(f"{path}: a vllm bench result is one cell; got {len(loads)} load labels")
        return [rows_from_vllm_bench(data, str(path), workload=workload, tp=tp, load=loads[0] if loads else None)]
    raise InputError(f"{path}: not a vllm bench serve result (no 'completed'/'duration') "
                     f"nor a GuideLLM benchmarks.json (no 'benchmarks' list)")


def _num(src: str, data: dict[str, Any], key: str, *, required: bool = True) -> float | None:
    v = data.get(key)
    if v is None:
        if required:
            raise InputError(f"{src}: missing field {key!r}")
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise InputError(f"{src}: field {key!r}: not a number: {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)) or float(v) < 0:
        raise InputError(f"{src}: field {key!r}: expected a non-negative number, got {v!r}")
    return float(v)


def _labels(src: str, meta: dict[str, Any], workload: str | None, tp: int | None,
            load: str | None) -> tuple[str, int, str]:
    w = workload if workload is not None else meta.get("workload")
    t = tp if tp is not None else meta.get("tp", meta.get("tensor_parallel_size"))
    ld = load if load is not None else meta.get("load")
    for name, v in (("workload", w), ("tp", t), ("load", ld)):
        if v is None or str(v).strip() == "":
            raise InputError(f"{src}: no {name} label (give --{name} or put {name}=… in the result's metadata)")
    try:
        t_int = int(str(t))
    except ValueError:
        raise InputError(f"{src}: tp label {t!r} is not an integer") from None
    if t_int < 1:
        raise InputError(f"{src}: tp label must be >= 1, got {t_int}")
    return str(w), t_int, str(ld)


def _p99(values: Any) -> float:
    x = np.asarray([v for v in values if v is not None and v > 0], dtype=np.float64)
    return float(np.percentile(x, 99)) if x.size else math.inf


def rows_from_vllm_bench(data: dict[str, Any], src: str, *, workload: str | None = None,
                         tp: int | None = None, load: str | None = None) -> dict[str, Any]:
    """One row from a ``vllm bench serve --save-result`` JSON object."""
    w, t, ld = _labels(src, data, workload, tp, load)
    duration = _num(src, data, "duration")
    assert duration is not None
    if duration <= 0:
        raise InputError(f"{src}: field 'duration': must be positive, got {duration:g}")
    completed = _num(src, data, "completed")
    assert completed is not None
    failed = _num(src, data, "failed", required=False)
    n = _num(src, data, "num_prompts", required=False)
    if n is None:
        n = completed + (failed or 0.0)
    rate = data.get("request_rate")
    try:
        rate_f = float(rate) if rate is not None else math.inf
    except (TypeError, ValueError):
        raise InputError(f"{src}: field 'request_rate': not a number: {rate!r}") from None
    offered = rate_f if math.isfinite(rate_f) and rate_f > 0 else n / duration
    ok_mask = None
    if isinstance(data.get("errors"), list):
        ok_mask = [not e for e in data["errors"]]
    ttft_s = _p99_seconds(
        src, data, "p99_ttft_ms", "ttfts", ok_mask,
        "missing field 'p99_ttft_ms' (and no per-request 'ttfts')",
    )
    comp_s = _p99_seconds(
        src, data, "p99_e2el_ms", "latencies", ok_mask,
        "missing field 'p99_e2el_ms' (run vllm bench serve with "
        "--percentile-metrics ttft,e2el, or --save-detailed for per-request latencies)",
    )
    if n <= 0:
        raise InputError(f"{src}: field 'num_prompts': no requests")
    return {
        "workload": w, "tp": t, "load": ld,
        "offered_rps": offered,
        "throughput_rps": completed / duration,
        "ttft_p99_s": ttft_s if completed else math.inf,
        "completion_p99_s": comp_s if completed else math.inf,
        "success_rate": min(1.0, completed / n),
        "duration_s": duration,
        "failure": "",
    }


def _get(src: str, obj: Any, *keys: str) -> Any:
    cur = obj
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            raise InputError(f"{src}: missing field {'.'.join(keys)!r}")
        cur = cur[k]
    return cur


def _count(v: Any) -> float:
    return float(v["count"]) if isinstance(v, dict) else float(v)


def rows_from_guidellm(data: dict[str, Any], src: str, *, workload: str | None = None,
                       tp: int | None = None, loads: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per benchmark of a GuideLLM ``benchmarks.json`` object."""
    benches = data["benchmarks"]
    if not benches:
        raise InputError(f"{src}: 'benchmarks' is empty")
    if loads and len(loads) != len(benches):
        raise InputError(f"{src}: {len(benches)} benchmarks but {len(loads)} load labels")
    rows = []
    for i, b in enumerate(benches):
        where = f"{src}: benchmarks[{i}]"
        metrics = _get(where, b, "metrics")
        totals = metrics.get("request_totals", b.get("request_totals"))
        if not isinstance(totals, dict):
            raise InputError(f"{where}: missing field 'metrics.request_totals'")
        try:
            ok, total = _count(totals["successful"]), _count(totals["total"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{where}: 'metrics.request_totals' needs 'successful' and 'total' counts") from None
        duration = b.get("duration")
        if duration is None and isinstance(b.get("run_stats"), dict):
            rs = b["run_stats"]
            if "start_time" in rs and "end_time" in rs:
                duration = float(rs["end_time"]) - float(rs["start_time"])
        if duration is None and "start_time" in b and "end_time" in b:
            duration = float(b["end_time"]) - float(b["start_time"])
        if not isinstance(duration, (int, float)) or not duration > 0:
            raise InputError(f"{where}: missing or non-positive 'duration'")
        ttft_ms = _get(where, metrics, "time_to_first_token_ms", "successful", "percentiles", "p99") if ok else math.inf
        lat_s = _get(where, metrics, "request_latency", "successful", "percentiles", "p99") if ok else math.inf
        label = loads[i] if loads else _strategy_label(b, i)
        w, t, ld = _labels(where, {}, workload, tp, label)
        if total <= 0:
            raise InputError(f"{where}: 'metrics.request_totals.total' is 0")
        rows.append({
            "workload": w, "tp": t, "load": ld,
            "offered_rps": total / float(duration),
            "throughput_rps": ok / float(duration),
            "ttft_p99_s": float(ttft_ms) / 1000.0,
            "completion_p99_s": float(lat_s),
            "success_rate": min(1.0, ok / total),
            "duration_s": float(duration),
            "failure": "",
        })
    return rows


def _strategy_label(b: dict[str, Any], i: int) -> str:
    """``type@rate`` of a benchmark's scheduling strategy (e.g. ``constant@2.5``), else ``bench<i>``."""
    for holder in (b.get("args"), b.get("config"), b):
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            s = holder["strategy"]
            kind = str(s.get("type_", s.get("type", "strategy")))
            rate = s.get("rate", s.get("streams"))
            return f"{kind}@{rate:g}" if isinstance(rate, (int, float)) else kind
    return f"bench{i}"


def _p99_seconds(
    src: str, data: dict, summary_key: str, per_request_key: str, ok_mask: list[bool] | None, missing: str
) -> float:
    """A p99 in seconds: the summary field (ms) if present, else the p99 of the
    successful per-request values; ``InputError`` naming the file if neither."""
    summary = _num(src, data, summary_key, required=False)
    if summary is not None:
        return summary / 1000.0
    values = data.get(per_request_key)
    if isinstance(values, list):
        if ok_mask is not None:
            values = [v for v, ok in zip(values, ok_mask, strict=False) if ok]
        return _p99(values)
    raise InputError(f"{src}: {missing}")
