"""Production windows as observations: from ``verify --json`` reports to journal rows, and pooling.

:func:`production_rows` turns the classes of one or more verify reports into
measurement-table rows of their planned cells (``phase = "production"`` in
the journal, 0 GPU-seconds): per replica, the window's offered and served
rates, the p99s read from the buckets (Prometheus' interpolation inside the
p99's bucket) and the success rate.

A live window is a noisier observation of a cell than a profiling window:
live traffic is not the trace (its mix of prompt and output lengths and its
arrivals differ), and a p99 read from buckets is known only to its bucket
(vLLM's TTFT buckets are 1.3–2.5× apart). :func:`pooled_observation`
enters it with its noise scale multiplied by :data:`PHASE_NOISE_SCALE`:
each cell's observation is the precision-weighted mean, on the model's
transformed scale (log rates and tails, logit success), of its profiling
row (weight 1) and its production windows (weight ``1 / k²`` each, k = 2:
four windows count as one profiling run). A class whose live windows show
its cell missing the SLO moves that cell's observation towards them, and
enough such windows make the cell inadmissible, so the re-planned campaign
no longer certifies the fleet that uses it.

A class of a catalogued plan (its verify entry names ``config``) is an
observation of its ``(workload, config, load)`` cell, the row's ``tp`` the
GPUs of one replica of the configuration and its ``config`` the name, as a
catalogued campaign's journal rows are. For a disaggregated class the verify
entry's metrics are already its roles' (``deploy/verify.py``,
:func:`~fleetsieve_bayes.deploy.verify.combine_roles`): TTFT from the prefill
workers, completion, success and the rates from the decode workers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.errors import InputError

__all__ = [
    "PRODUCTION_PHASE",
    "PHASE_NOISE_SCALE",
    "read_verify",
    "production_rows",
    "pooled_observation",
    "production_inputs",
    "pool_production",
    "production_summary",
    "describe_change",
]

PRODUCTION_PHASE = "production"
# Noise-scale multiplier of an observation by journal phase (profiling phases: 1).
PHASE_NOISE_SCALE: dict[str, float] = {PRODUCTION_PHASE: 2.0}
_METRICS = ("throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate")


def read_verify(path: str | Path) -> dict[str, Any]:
    """Read a ``verify --json`` report.

    Raises:
        InputError: unreadable, not JSON, another version, or a class without
            the fields a production row needs (named).
    """
    p = Path(path)
    try:
        report = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--production {p}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"--production {p}: not JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("version") != 1 or not isinstance(report.get("classes"), list):
        raise InputError(f"--production {p}: not a verify report (expected version 1 with 'classes')")
    for i, c in enumerate(report["classes"]):
        for key in ("workload", "tp", "load", "window_s", "metrics", "offered_rps_per_replica", "served_rps_per_replica"):
            if not isinstance(c, dict) or key not in c:
                raise InputError(f"--production {p}: field 'classes[{i}].{key}' is missing")
        if c.get("config") is not None and not isinstance(c.get("gpus_per_replica"), int):
            raise InputError(f"--production {p}: field 'classes[{i}].gpus_per_replica' is missing (class "
                             f"{c['workload']} names config {c['config']!r})")
    return report


def _tail(m: dict[str, Any]) -> float | None:
    """A p99 from its bucket reading: the interpolated value, else a finite edge."""
    for key in ("interpolated", "hi", "lo"):
        v = m.get(key)
        if v is not None and math.isfinite(float(v)):
            return float(v)
    return None


def production_rows(report: dict[str, Any], source: str) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """``(cell, row, source)`` per class of ``report`` whose window finished a request.

    ``cell`` is ``{workload, tp, load}`` (the planned cell), or ``{workload,
    config, load}`` for a class of a catalogued plan; ``row`` a
    measurement-table row per replica (a catalogued class's with ``config`` and
    ``tp`` its GPUs per replica); ``source`` names the report and class.
    A class with no finished request in its window is left out (it observed
    nothing).
    """
    out = []
    for c in report["classes"]:
        m = c["metrics"]
        s = m.get("success_rate") or {}
        finished = float(s.get("finished") or 0.0)
        if finished <= 0:
            continue
        window = float(c["window_s"])
        served = max(float(c["served_rps_per_replica"]), 0.0)
        # The served rate is never above the offered one (a queue that shrank in the window).
        offered = max(float(c["offered_rps_per_replica"]), served, 1e-9)
        ttft = _tail(m.get("ttft_p99_s") or {})
        comp = _tail(m.get("completion_p99_s") or {})
        conf = c.get("config")
        row = {
            "workload": str(c["workload"]),
            "tp": int(c["tp"]) if conf is None else int(c["gpus_per_replica"]),
            "load": str(c["load"]),
            "offered_rps": offered,
            "throughput_rps": served,
            "ttft_p99_s": math.inf if ttft is None else ttft,
            "completion_p99_s": comp,
            "success_rate": float(s.get("value") if s.get("value") is not None else 0.0),
            "duration_s": window,
        }
        if conf is None:
            cell = {"workload": row["workload"], "tp": row["tp"], "load": row["load"]}
        else:
            row["config"] = str(conf)
            cell = {"workload": row["workload"], "config": row["config"], "load": row["load"]}
        out.append((cell, row, f"{source} class {c['workload']} ({c.get('verdict', '?')})"))
    return out


def pooled_observation(rows: Sequence[tuple[np.ndarray, str]]) -> np.ndarray:
    """One cell's observation from its rows: ``(values (4,), phase)`` each.

    The precision-weighted mean on the model's transformed scale, a row of
    phase ``p`` weighing ``1 / PHASE_NOISE_SCALE[p]²`` (1 for profiling
    phases); a metric missing (NaN) in a row is left out of that metric's
    mean. Returns ``(4,)`` natural units (NaN where no row has the metric).
    """
    from fleetsieve_bayes.model.scales import metric_transform

    vals = np.asarray([r for r, _ in rows], dtype=np.float64).reshape(-1, 4)
    scales = [PHASE_NOISE_SCALE.get(p, 1.0) for _, p in rows]
    if all(k == 1.0 for k in scales):
        return vals[0].copy()  # profiling rows only: the cell's first measurement, as always
    w = (1.0 / np.square(np.asarray(scales)))[:, None]
    have = ~np.isnan(vals)
    z = metric_transform(np.where(have, vals, 1.0), np)
    weight = np.where(have, w, 0.0)
    total = weight.sum(axis=0)
    mean = (z * weight).sum(axis=0) / np.where(total > 0, total, 1.0)
    out = np.concatenate([np.exp(mean[:3]), 1.0 / (1.0 + np.exp(-mean[3:4]))])
    return np.where(total > 0, out, np.nan)


def _cell_label(cell: dict[str, Any]) -> str:
    """``TP4@C64``, or ``2p-tp2+1d-tp4@C64`` for a configuration."""
    return f"{cell['config']}@{cell['load']}" if "config" in cell else f"TP{cell['tp']}@{cell['load']}"


def production_inputs(paths: Sequence[str | Path], candidates: set[tuple[Any, ...]]) -> list[tuple[Any, dict[str, Any], str]]:
    """``(Cell, row, source)`` of every ``--production`` report, checked against the campaign's cells
    (``(workload, tp, load)``, or ``(workload, config, load)`` in a catalogued campaign).

    Raises:
        InputError: an unreadable report, or a class whose planned cell is not
            a candidate of this campaign (named).
    """
    from fleetsieve_bayes.campaign.journal import Cell

    out = []
    for path in paths:
        for cell, row, source in production_rows(read_verify(path), f"production window {Path(path).resolve()}"):
            key = (cell["workload"], cell["config"] if "config" in cell else cell["tp"], cell["load"])
            if key not in candidates:
                raise InputError(f"--production {path}: class {cell['workload']}'s cell "
                                 f"{_cell_label(cell)} is not a candidate of this campaign")
            out.append((Cell(*key), row, source))
    return out


def pool_production(index: dict[tuple[str, int, str], int], records: Sequence[Any], measured: np.ndarray,
                    observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``measured (n_cells,)`` and ``observed (n_cells, 4)`` with the production records pooled in.

    Each cell with production records gets :func:`pooled_observation` of its
    first profiling row (if any) and its production windows; a cell observed
    only in production counts as measured with the pooled windows.
    """
    measured = measured.copy()
    observed = observed.copy()
    windows: dict[int, list[np.ndarray]] = {}
    for rec in records:
        if getattr(rec, "phase", None) != PRODUCTION_PHASE:
            continue
        c = index[tuple(rec.cell)]
        windows.setdefault(c, []).append(
            np.array([np.nan if rec.row.get(m) is None else float(rec.row[m]) for m in _METRICS]))
    for c, ws in windows.items():
        rows = ([(observed[c], "design")] if measured[c] else []) + [(w, PRODUCTION_PHASE) for w in ws]
        observed[c] = pooled_observation(rows)
        measured[c] = True
    return measured, observed


def production_summary(records: Sequence[Any], allocation: dict[str, Any] | None,
                       slos: dict[str, dict[str, Any]], observed: dict[tuple[str, int, str], np.ndarray]) -> dict[str, Any]:
    """result.json's ``production``: the windows entered, and the planned cells the re-plan changed.

    Args:
        observed: cell key → its pooled observation ``(4,)``.
    """
    prod = [r for r in records if getattr(r, "phase", None) == PRODUCTION_PHASE]
    changed = []
    for key in dict.fromkeys(tuple(r.cell) for r in prod):
        w, tp, load = key[:3]
        a = (allocation or {}).get(w) or {}
        catalogued = isinstance(tp, str)  # a catalogued campaign's cell names its configuration
        now = (a.get("config" if catalogued else "tp"), a.get("load")) if a.get("replicas") else (None, None)
        if now == (tp, load):
            continue
        pooled = observed.get(key)
        misses = []
        slo = slos.get(w) or {}
        if pooled is not None:
            if slo.get("success_min") is not None and pooled[3] < slo["success_min"]:
                misses.append(f"success {pooled[3]:.4f} < {slo['success_min']:g}")
            if slo.get("ttft_p99_s") is not None and pooled[1] > slo["ttft_p99_s"]:
                misses.append(f"TTFT p99 {pooled[1]:.3g} s > {slo['ttft_p99_s']:g} s")
            if slo.get("completion_p99_s") is not None and np.isfinite(pooled[2]) and pooled[2] > slo["completion_p99_s"]:
                misses.append(f"completion p99 {pooled[2]:.3g} s > {slo['completion_p99_s']:g} s")
        planned = {"config": tp, "load": load} if catalogued else {"tp": tp, "load": load}
        moved = {"config": now[0], "tp": a.get("tp")} if catalogued else {"tp": now[0]}
        changed.append({
            "workload": w, "planned": planned,
            "now": None if now[0] is None else {**moved, "load": now[1], "replicas": a.get("replicas")},
            "pooled": None if pooled is None else dict(zip(_METRICS, (float(x) for x in pooled), strict=True)),
            "misses": misses,
        })
    return {"windows": len(prod), "cells": [dict(zip(("workload", "config" if isinstance(k[1], str) else "tp", "load"),
                                                     k[:3], strict=True))
                                            for k in dict.fromkeys(tuple(r.cell) for r in prod)],
            "changed": changed}


def describe_change(entry: dict[str, Any]) -> str:
    """One line naming a class whose planned cell the production windows changed."""
    p = entry["planned"]
    now = entry["now"]
    to = "no replicas" if now is None else f"{_cell_label(now)} ×{now['replicas']}"
    if entry["misses"]:
        return (f"{entry['workload']}: production windows put {_cell_label(p)} outside its SLO "
                f"({'; '.join(entry['misses'])}); change it to {to}")
    return f"{entry['workload']}: after the production windows the re-plan moves {_cell_label(p)} to {to}"
