"""The fields and the row of an ingested result, shared by every ingest reader.

Numbers are JSON numbers only, with one line naming the field otherwise; a row
no measurement can produce is refused rather than written.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from fleetsieve_bayes.backends.failures import NO_SUCCESS
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import THROUGHPUT_SLACK, WINDOW_EDGE_REQUESTS, max_throughput_rps


def json_number(src: str, value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = "null" if value is None else f"{type(value).__name__} {value!r}"
        raise InputError(f"{src}: field {field!r}: expected a number, got {what}")
    x = float(value)
    if math.isnan(x) or x < 0:
        raise InputError(f"{src}: field {field!r}: expected a non-negative number, got {value!r}")
    return x


def optional_json_number(src: str, data: dict[str, Any], key: str) -> float | None:
    """A non-negative number, or None when the key is absent or null."""
    v = data.get(key)
    return None if v is None else json_number(src, v, key)


def json_numbers(src: str, data: dict[str, Any], key: str) -> np.ndarray | None:
    """A per-request list of numbers ``(n,)``, or None when absent."""
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, list):
        raise InputError(f"{src}: field {key!r}: expected a list of numbers, got {type(v).__name__}")
    return np.array([json_number(src, x, f"{key}[{i}]") for i, x in enumerate(v)], dtype=np.float64)


def itl_sums(src: str, data: dict[str, Any]) -> np.ndarray | None:
    v = data.get("itls")
    if v is None:
        return None
    if not isinstance(v, list):
        raise InputError(f"{src}: field 'itls': expected a list of lists, got {type(v).__name__}")
    out = []
    for i, x in enumerate(v):
        if not isinstance(x, list):
            raise InputError(f"{src}: field 'itls[{i}]': expected a list of numbers, got {type(x).__name__}")
        out.append(sum(json_number(src, y, f"itls[{i}]") for y in x))
    return np.asarray(out, dtype=np.float64)


def tp_label(src: str, t: Any) -> int:
    """A TP label: ``2``, ``2.0`` or ``"2.0"`` (``--metadata`` values are strings) → 2."""
    try:
        f = float(str(t).strip())
    except ValueError:
        raise InputError(f"{src}: tp label {t!r} is not an integer") from None
    if not math.isfinite(f) or f != int(f):
        raise InputError(f"{src}: tp label {t!r} is not an integer")
    if f < 1:
        raise InputError(f"{src}: tp label must be >= 1, got {t!r}")
    return int(f)


def row_labels(src: str, meta: dict[str, Any], workload: str | None, tp: int | None,
            load: str | None) -> tuple[str, int, str]:
    w = workload if workload is not None else meta.get("workload")
    t = tp if tp is not None else meta.get("tp", meta.get("tensor_parallel_size"))
    ld = load if load is not None else meta.get("load")
    for name, v in (("workload", w), ("tp", t), ("load", ld)):
        if v is None or str(v).strip() == "":
            raise InputError(f"{src}: no {name} label (give --{name} or put {name}=… in the result's metadata)")
    return str(w), tp_label(src, t), str(ld)


# A configuration's name (as [[configs]] names are: fleetsieve_bayes/configs.py).
_CONFIG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$")
# Names that say their layout: `2p-tp2+1d-tp4…` (disaggregated), `TP4` / `agg-tp4…` (aggregated).
_LAYOUT_NAME = re.compile(r"^(\d+)p-tp(\d+)\+(\d+)d-tp(\d+)(?=$|[-_.+])", re.IGNORECASE)
_AGGREGATED_NAME = re.compile(r"^(?:agg-)?tp(\d+)(?=$|[-_.+])", re.IGNORECASE)


def layout_name(prefill_workers: int, prefill_tp: int, decode_workers: int, decode_tp: int) -> str:
    """A disaggregated layout's configuration name, ``{P}p-tp{tp_p}+{D}d-tp{tp_d}``."""
    return f"{prefill_workers}p-tp{prefill_tp}+{decode_workers}d-tp{decode_tp}"


def named_layout(config: str) -> tuple[int, int, int, int] | None:
    """``(P, tp_p, D, tp_d)`` of a name that starts with a disaggregated layout, else None."""
    m = _LAYOUT_NAME.match(config)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]), int(m[4]))


def named_tp(config: str) -> int | None:
    """The TP of a name that starts with an aggregated one (``TP4``, ``agg-tp4-s256``), else None."""
    m = _AGGREGATED_NAME.match(config)
    return None if m is None else int(m[1])


def check_config(config: str, tp: int | None) -> str:
    """``--config NAME`` (and ``--tp``), checked: a configuration's name, and a ``--tp`` only
    where the name does not say another layout. Returns the stripped name.

    Raises:
        InputError: one line: not a name; ``--tp`` with a disaggregated layout's name
            (it has no single TP); ``--tp`` that is not the TP the name says.
    """
    name = str(config).strip()
    if not _CONFIG_NAME.match(name):
        raise InputError(f"--config: expected a configuration name of letters, digits and _ . + - (no spaces), "
                         f"got {config!r}")
    layout = named_layout(name)
    if layout is not None and tp is not None:
        p, tp_p, d, tp_d = layout
        raise InputError(f"--config {name} names a disaggregated layout ({p} prefill TP{tp_p} + {d} decode "
                         f"TP{tp_d}), which has no single TP: leave --tp out")
    agg = named_tp(name)
    if agg is not None and tp is not None and agg != tp:
        raise InputError(f"--config {name} names TP{agg}, but --tp is {tp}: give the configuration's own TP, "
                         "or leave --tp out")
    return name


def with_config(row: dict[str, Any], config: str, tp: int | None) -> dict[str, Any]:
    """``row`` naming configuration ``config``, its ``tp`` the given one (None: empty), ``config`` after ``tp``."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if k == "config":
            continue
        out[k] = tp if k == "tp" else v
        if k == "tp":
            out["config"] = config
    return out


def p99_or_inf(x: np.ndarray) -> float:
    return float(np.percentile(x, 99)) if x.size else math.inf


def check_row(src: str, row: dict[str, Any]) -> dict[str, Any]:
    """Refuse a row no measurement can produce (rather than write it)."""
    s, thr, off = row["success_rate"], row["throughput_rps"], row["offered_rps"]
    if not 0.0 <= s <= 1.0:
        raise InputError(f"{src}: success rate {s:g} outside [0, 1] (more completed than sent?)")
    if not (off > 0 and math.isfinite(off)):
        raise InputError(f"{src}: offered rate {off:g} req/s is not a positive number")
    if thr > max_throughput_rps(off, float(row["duration_s"])):
        raise InputError(f"{src}: throughput {thr:.4g} req/s exceeds the offered {off:.4g} req/s "
                         f"by more than {100 * (THROUGHPUT_SLACK - 1):.0f} % (+{WINDOW_EDGE_REQUESTS} "
                         "requests over the run)")
    return row


def ingest_row(labels: tuple[str, int, str], offered: float, throughput: float, ttft_s: float, comp_s: float,
         success: float, duration: float) -> dict[str, Any]:
    """A measurement-table row of an ingested result (every source's row has this one shape)."""
    w, t, ld = labels
    return {
        "workload": w, "tp": t, "load": ld,
        "offered_rps": offered,
        "throughput_rps": throughput,
        "ttft_p99_s": ttft_s,
        "completion_p99_s": comp_s,
        "success_rate": success,
        "duration_s": duration,
        "failure": "",
    }


def finish_row(src: str, row: dict[str, Any], n_ok: float) -> dict[str, Any]:
    if n_ok <= 0:
        row.update(throughput_rps=0.0, ttft_p99_s=math.inf, completion_p99_s=math.inf, success_rate=0.0,
                   failure=NO_SUCCESS)
    return check_row(src, row)
