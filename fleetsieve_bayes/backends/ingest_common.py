"""Helpers the benchmark-result readers share: units, metric objects, nested fields."""

from __future__ import annotations

import math
from typing import Any

from fleetsieve_bayes.errors import InputError

__all__ = ["seconds", "dig", "p99_of", "positive", "served", "with_lengths", "LENGTH_TOLERANCE"]

_TO_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0, "ms": 1e-3, "millisecond": 1e-3,
         "milliseconds": 1e-3, "us": 1e-6, "ns": 1e-9}


def seconds(src: str, unit: Any, field: str) -> float:
    """Seconds per ``unit`` (``"ms"``, ``"s"``, …); an unknown unit is refused, never guessed."""
    u = str(unit).strip().lower() if unit is not None else ""
    if u not in _TO_S:
        raise InputError(f"{src}: field {field!r}: unknown time unit {unit!r} (expected s, ms, us or ns)")
    return _TO_S[u]


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]…``, or None where a level is missing or not a mapping."""
    cur = obj
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def positive(src: str, value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{src}: field {field!r}: expected a non-negative number, got {value!r}")
    return float(value)


def p99_of(src: str, metric: Any, field: str, *, unit: Any = None, default_unit: str | None = None) -> float:
    """The p99 of a metric object ``{unit|units, p99, …}`` in seconds.

    A metric with other percentiles but no p99 (e.g. p90 only) is refused: a p90 is
    not a p99 and is never converted into one.
    """
    if not isinstance(metric, dict):
        raise InputError(f"{src}: missing field {field!r} (a metric object with a p99)")
    if metric.get("p99") is None:
        have = sorted(k for k, v in metric.items() if k.startswith("p") and k[1:2].isdigit() and v is not None)
        raise InputError(f"{src}: field {field!r} has no p99" + (f" (only {', '.join(have)}); a lower percentile "
                                                                   "is not comparable with a p99 and is not converted"
                                                                   if have else ""))
    u = metric.get("unit", metric.get("units", unit if unit is not None else default_unit))
    return positive(src, metric["p99"], f"{field}.p99") * seconds(src, u, f"{field}.unit")


def served(src: str, throughput: float, offered: float, success: float, duration: float, field: str) -> float:
    """The file's served rate, capped at ``offered × success``; refused when it exceeds the
    offered rate beyond the table's slack (the file contradicts itself: nothing is converted)."""
    from fleetsieve_bayes.table import max_throughput_rps

    if throughput > max_throughput_rps(offered, duration):
        raise InputError(f"{src}: field {field!r}: {throughput:.4g} req/s served but {offered:.4g} req/s offered; "
                         "the file contradicts itself and is not converted")
    return min(throughput, offered * success)


# A result's mean prompt or output length more than this factor away from a class
# trace's is another workload (the table's cells are per class), so it is refused.
LENGTH_TOLERANCE = 1.25


def with_lengths(row: dict[str, Any], prompt: Any, output: Any) -> dict[str, Any]:
    """Attach the run's mean ``(prompt, output)`` tokens (``row["lengths"]``) when the file has them."""
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
             for v in (prompt, output))
    if ok:
        row["lengths"] = (float(prompt), float(output))
    return row
