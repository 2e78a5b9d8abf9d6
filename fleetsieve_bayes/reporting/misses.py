"""Why a class got no replicas: which SLO it misses, by how much, at its best measured cell.

A campaign can certify a fleet that serves nothing for a class ("no
replicas") when no measured cell of that class meets its SLO. That is a
correct certificate and a surprising one; :func:`unserved` says plainly what
is missing. The *best* measured cell of a class is the one whose worst SLO
miss, relative to its limit, is smallest (ties: higher throughput).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["Miss", "slo_misses", "unserved", "describe_unserved"]


class Miss(NamedTuple):
    """One SLO a cell misses: ``measured`` vs ``limit`` (``measured`` NaN = unobserved)."""

    slo: str  # success_min | ttft_p99_s | completion_p99_s
    measured: float
    limit: float

    @property
    def relative(self) -> float:
        """How far past the limit, relative to it (inf when unobserved or infinite)."""
        if math.isnan(self.measured) or math.isinf(self.measured):
            return math.inf
        if self.slo == "success_min":
            return (self.limit - self.measured) / max(self.limit, 1e-12)
        return (self.measured - self.limit) / max(self.limit, 1e-12)

    def text(self) -> str:
        if self.slo == "success_min":
            return f"success {self.measured:.3f} < {self.limit:g}"
        name = "TTFT p99" if self.slo == "ttft_p99_s" else "completion p99"
        if math.isnan(self.measured):
            return f"{name} unobserved (limit {self.limit:g} s; the source had no completion timing)"
        if math.isinf(self.measured):
            return f"{name} inf (no request completed) > {self.limit:g} s"
        return f"{name} {self.measured:.3g} s > {self.limit:g} s (+{100 * self.relative:.0f} %)"


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def slo_misses(row: Mapping[str, Any], slo: Mapping[str, Any]) -> list[Miss]:
    """The SLOs ``row`` misses (empty: the cell is admissible for ``slo``)."""
    out: list[Miss] = []
    s_min = slo.get("success_min")
    success = _f(row.get("success_rate"))
    if s_min is not None and not (success >= float(s_min)):
        out.append(Miss("success_min", success, float(s_min)))
    for key, col in (("ttft_p99_s", "ttft_p99_s"), ("completion_p99_s", "completion_p99_s")):
        lim = slo.get(key)
        if lim is None:
            continue
        v = _f(row.get(col))
        if not (v <= float(lim)):
            out.append(Miss(key, v, float(lim)))
    if _f(row.get("throughput_rps")) <= 0 and not out:
        out.append(Miss("success_min", 0.0, float(s_min or 0.0)))
    return out


def unserved(allocation: Mapping[str, Any] | None, slos: Mapping[str, Mapping[str, Any]],
             rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per class with no replicas: its best measured cell and that cell's misses.

    Args:
        allocation: ``result.json``'s ``allocation`` (None: infeasible → nothing to explain here).
        slos: workload → ``{success_min, ttft_p99_s, completion_p99_s}``.
        rows: measured table rows (dicts with the table columns).

    Returns:
        ``{workload: {"cell": {workload, tp, load} | None, "misses": [Miss…]}}``
        for each class with 0 replicas; ``cell`` None when none was measured.
    """
    if not allocation:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for w, a in allocation.items():
        if a and int(a.get("replicas") or 0) > 0:
            continue
        slo = slos.get(w, {})
        best: tuple[float, float] | None = None
        pick: dict[str, Any] = {"cell": None, "misses": []}
        for r in rows:
            if r.get("workload") != w:
                continue
            misses = slo_misses(r, slo)
            score = (max((m.relative for m in misses), default=-math.inf), -_f(r.get("throughput_rps")))
            if best is None or score < best:
                best = score
                pick = {"cell": {"workload": w, "tp": int(r["tp"]), "load": str(r["load"])}, "misses": misses}
        out[w] = pick
    return out


def describe_unserved(w: str, info: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> str:
    """One line: ``chat: no replicas — best measured cell TP1@x4 misses TTFT p99 …``.

    ``result`` (``result.json``) tells why a class whose best measured window meets
    its SLOs still has no replicas: at an SLO-attainment level, its attainment is not
    shown to reach the level (and the cell to repeat, when the campaign names one);
    in an undecided campaign, the conservative allocation does not count on it yet;
    otherwise the GPU budget went to other classes.
    """
    cell = info.get("cell")
    if cell is None:
        return f"{w}: no replicas — no cell of this class was measured"
    where = f"TP{cell['tp']}@{cell['load']}"
    misses = info.get("misses") or []
    if misses:
        return f"{w}: no replicas — best measured cell {where} misses " + "; ".join(m.text() for m in misses)
    head = f"{w}: no replicas — best measured cell {where} meets the SLO in its windows"
    r = result or {}
    levels = r.get("slo_attainment")
    level = levels.get(w) if isinstance(levels, Mapping) else None
    if isinstance(level, (int, float)) and not isinstance(level, bool):
        line = f"{head}, but no cell of this class is shown to meet it in {100 * float(level):.0f} % of windows"
        rep = r.get("repeat")
        if isinstance(rep, Mapping) and rep.get("workload") == w:
            from fleetsieve_bayes.decision.bounds import repeat_at_limit

            at_limit = repeat_at_limit(rep)
            raise_ = ("its replay table has no more rows of it" if rep.get("limited_by") == "backend"
                      else "raise [stopping] max_windows_per_cell")
            line += (f" (TP{rep['tp']}@{rep['load']} needs another window and has {rep['windows']}, its limit: "
                     f"{raise_})" if at_limit else f" (measure TP{rep['tp']}@{rep['load']} again)")
        return line
    if r.get("status") == "undecided":
        return f"{head}, but the campaign is undecided and the conservative allocation does not count on it yet"
    return f"{head}, but the GPU budget went to other classes"
