"""Credible intervals → conservative and optimistic tables: the one owner of these rules.

Both the certificate's bounds (:mod:`fleetsieve_bayes.decision.bounds`, NumPy
float64) and the acquisition kernel (:mod:`fleetsieve_bayes.decision.acquisition`,
inside ``jit``) build their tables with these functions, so the kernel scores
the very table the certificate reads. Every function takes arrays of either
namespace (:func:`fleetsieve_bayes.arrays.namespace`); metrics are the last
axis, in :data:`~fleetsieve_bayes.table.METRICS` order.

The rules, applied in this order:

1. :func:`model_intervals` — the model's interval of a cell, widened twice:
   :func:`widen_success` — a success interval reaching within
   :data:`~fleetsieve_bayes.model.scales.SUCCESS_EPS` of 0 or 1 reaches the end
   itself (the model resolves success only inside that band, so a measured 1.0
   must lie inside the interval); then :func:`widen_by_margin` — TTFT and
   completion ×/÷ ``e^margin`` (:data:`MODEL_MARGIN`: the model's
   discrepancy), and the failure probability ``1 − s`` ×/÷
   ``e^success_margin`` (:data:`SUCCESS_MARGIN`);
2. :func:`collapse_measured` / :func:`with_measured` — a measured cell's
   interval is its measured value ± the relative ``repeatability`` band
   (throughput and tails), the band taken on the *failure* probability
   ``1 − s`` for success (a relative band on 0.99 itself would be meaninglessly
   wide), clipped to ``[0, 1]``;
3. :func:`knee_guard` — an unmeasured cell up to ``steps`` load steps below
   a measured cell of its class, GPU type and TP (:func:`load_ladder`) may be as fast
   as the fastest it can be *without the model*: its optimistic TTFT and
   completion are at most the largest measured ones below it at that TP (0
   when none is measured). Tails only grow with the load, so that is all a
   measurement above says about the loads beneath it; the model's sharp knee
   must not rule such a cell out (see :data:`KNEE_GUARD`);
4. :func:`bound_tables` — conservative: low throughput, high TTFT and
   completion, low success; optimistic: the reverse.
5. :func:`level_tables` — at an SLO-attainment level ``q`` (not
   :data:`POINT`), whether a cell is admissible is no longer read off its
   metrics against the SLOs but off its *attainment* (the probability that one
   window of it meets its class's SLOs, :func:`fleetsieve_bayes.model.joint.window_attainment`):
   :func:`admissible_at_level` — attainment ≥ q. The conservative table takes
   the attainment's lower credible bound, the optimistic table its upper
   bound, and each table is rewritten so that the allocators' metric rule
   (:func:`fleetsieve_bayes.allocation.problem.meets_slo`) reads exactly that:
   an admissible cell's tails are capped at their limits and its success
   raised to its floor, an inadmissible cell gets zero throughput and success.
   The certificate, the joint check (per posterior draw, on the draw's
   attainment) and the acquisition kernel all go through these two functions.
   At :data:`POINT` nothing changes: the metrics against the SLOs.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.model.scales import SUCCESS_EPS
from fleetsieve_bayes.settings import (  # the rules' settings, with the evidence for their defaults
    DEFAULT_RULES,
    KNEE_GUARD,
    MODEL_MARGIN,
    SLO_ATTAINMENT_POINT,
    SUCCESS_MARGIN,
    IntervalRules,
)

__all__ = [
    "MODEL_MARGIN",
    "SUCCESS_MARGIN",
    "credible_quantiles",
    "model_intervals",
    "widen_by_margin",
    "widen_success",
    "collapse_measured",
    "with_measured",
    "KNEE_GUARD",
    "IntervalRules",
    "DEFAULT_RULES",
    "LoadLadder",
    "load_ladder",
    "grid_ladder",
    "guard_state",
    "guard_after_measuring",
    "knee_guard",
    "bound_tables",
    "POINT",
    "DEFAULT_SLO_ATTAINMENT",
    "check_level",
    "admissible_at_level",
    "level_tables",
]


def credible_quantiles(level: float) -> tuple[float, float]:
    """Lower/upper quantile levels of a central interval: 0.9 → (0.05, 0.95)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"credible level must be in (0, 1), got {level}")
    return (1.0 - level) / 2.0, (1.0 + level) / 2.0


def _with_success(x: Any, success: Any, xp: Any) -> Any:
    """``x (..., 4)`` with its success column replaced by ``success (...)``."""
    return xp.concatenate([x[..., :3], success[..., None]], axis=-1)


def widen_success(lo: Any, hi: Any) -> tuple[Any, Any]:
    """Success endpoints within ``SUCCESS_EPS`` of 0 (resp. 1) become 0 (resp. 1); ``(..., 4)`` each."""
    xp = namespace(lo, hi)
    s_lo = xp.where(lo[..., 3] <= SUCCESS_EPS, 0.0, lo[..., 3])
    s_hi = xp.where(hi[..., 3] >= 1.0 - SUCCESS_EPS, 1.0, hi[..., 3])
    return _with_success(lo, s_lo, xp), _with_success(hi, s_hi, xp)


def widen_by_margin(lo: Any, hi: Any, margin: float, success_margin: float = 0.0) -> tuple[Any, Any]:
    """Tail intervals (TTFT, completion) widened to ``lo·e^-margin, hi·e^margin``,
    and the failure probability ``1 − s`` to ``(1 − s_hi)·e^-success_margin,
    (1 − s_lo)·e^success_margin`` (success clipped to [0, 1]); ``(..., 4)`` each."""
    if margin == 0.0 and success_margin == 0.0:
        return lo, hi
    xp = namespace(lo, hi)
    e = math.exp(float(margin))
    f = xp.asarray([1.0, e, e, 1.0], dtype=lo.dtype)
    lo, hi = lo / f, hi * f
    if success_margin == 0.0:
        return lo, hi
    es = math.exp(float(success_margin))
    s_lo = xp.clip(1.0 - (1.0 - lo[..., 3]) * es, 0.0, 1.0)
    s_hi = 1.0 - (1.0 - hi[..., 3]) / es
    return _with_success(lo, s_lo, xp), _with_success(hi, s_hi, xp)


def model_intervals(
    lo: Any, hi: Any, margin: float = MODEL_MARGIN, success_margin: float = SUCCESS_MARGIN
) -> tuple[Any, Any]:
    """The intervals the decision reads for a cell the model predicts: raw
    quantiles ``lo, hi (..., 4)`` → :func:`widen_success`, then
    :func:`widen_by_margin`."""
    return widen_by_margin(*widen_success(lo, hi), margin, success_margin)


def collapse_measured(values: Any, repeatability: float) -> tuple[Any, Any]:
    """A measured cell's interval: ``values (..., 4)`` → ``(lo, hi)`` each ``(..., 4)``.

    Throughput and tails: value ± the relative repeatability band; success: the
    band is relative on the failure probability ``1 − s``, clipped to [0, 1].
    Failed cells keep their values (0 throughput, 0 success, tails possibly
    +inf). An unobserved tail (NaN: the source had no such timing) is +inf on
    both sides, so a class whose SLO names it cannot commit to the cell.
    """
    xp = namespace(values)
    r = repeatability
    tails = values[..., 1:3]
    values = xp.concatenate([values[..., :1], xp.where(xp.isnan(tails), xp.inf, tails), values[..., 3:]], axis=-1)
    fail = 1.0 - values[..., 3]
    lo = _with_success(values * (1.0 - r), xp.clip(1.0 - fail * (1.0 + r), 0.0, 1.0), xp)
    hi = _with_success(values * (1.0 + r), xp.clip(1.0 - fail * (1.0 - r), 0.0, 1.0), xp)
    return lo, hi


def with_measured(
    lo: Any, hi: Any, observed: Any, measured: Any, repeatability: float
) -> tuple[Any, Any]:
    """Intervals ``(..., n_cells, 4)`` with measured cells collapsed to ``observed``.

    Args:
        lo, hi: ``(..., n_cells, 4)`` model intervals.
        observed: ``(..., n_cells, 4)`` measured values (read where measured).
        measured: bool ``(..., n_cells)``.
    """
    xp = namespace(lo, hi, observed, measured)
    m_lo, m_hi = collapse_measured(observed, repeatability)
    m = measured[..., None]
    return xp.where(m, m_lo, lo), xp.where(m, m_hi, hi)


class LoadLadder(NamedTuple):
    """The load order of each (class, GPU type, TP): bool ``(n_cells, n_cells)`` each.

    ``below[c, c2]``: ``c2`` is the same class, GPU type and TP at a lower
    offered load; ``near_above[c, c2]``: ``c2`` is the same class, GPU type and
    TP, 1 to ``steps`` load steps above ``c``. (Another GPU type's cells are
    another curve: a fast GPU's tails say nothing of a slow one's floor.)
    """

    below: Any
    near_above: Any


def load_ladder(
    workload_idx: Any, tp: Any, offered_rps: Any, steps: int = KNEE_GUARD, gpu_idx: Any = None
) -> LoadLadder:
    """:class:`LoadLadder` of a grid's cells (each array argument ``(n_cells,)``; NumPy).
    ``gpu_idx``: each cell's GPU pool (None: one pool)."""
    if steps < 0:
        raise ValueError(f"knee guard steps must be >= 0, got {steps}")
    w = np.asarray(workload_idx)
    t = np.asarray(tp)
    g = np.zeros_like(w) if gpu_idx is None else np.asarray(gpu_idx)
    x = np.asarray(offered_rps, dtype=np.float64)
    same = (w[:, None] == w[None, :]) & (t[:, None] == t[None, :]) & (g[:, None] == g[None, :])
    below = same & (x[None, :] < x[:, None])
    # rank of each cell's load within its (class, TP): the number of loads beneath it
    rank = below.sum(axis=1)
    gap = rank[None, :] - rank[:, None]
    near_above = same & (gap >= 1) & (gap <= steps)
    return LoadLadder(below=below, near_above=near_above)


def grid_ladder(grid: Any, steps: int = KNEE_GUARD) -> LoadLadder:
    """:func:`load_ladder` of a :class:`~fleetsieve_bayes.allocation.problem.CellGrid`
    (its classes, configurations, loads and GPU pools)."""
    return load_ladder(grid.workload_idx, grid.config_idx, grid.offered_rps, steps, grid.gpu_idx)


def guard_state(observed: Any, measured: Any, ladder: LoadLadder, repeatability: float) -> tuple[Any, Any]:
    """Which cells the knee guard holds open, and their model-free tail floors.

    Args:
        observed: ``(..., n_cells, 4)`` measured values (read where measured).
        measured: bool ``(..., n_cells)``.
        ladder: the grid's :class:`LoadLadder`.

    Returns:
        ``guarded`` bool ``(..., n_cells)`` (unmeasured, a measured cell of its
        class and TP within ``steps`` loads above) and ``floor (..., n_cells,
        2)``: the largest measured TTFT and completion (lower end of their
        repeatability band) at a lower load of its class and TP, 0 where none
        is usable (a failed cell — 0 throughput or success, or a non-finite
        tail — tells nothing about the curve beneath it).
    """
    xp = namespace(observed, measured)
    near = xp.asarray(ladder.near_above)
    below = xp.asarray(ladder.below)
    guarded = ~measured & xp.any(near & measured[..., None, :], axis=-1)
    tails = observed[..., 1:3]
    ok = measured[..., None] & (observed[..., 0:1] > 0) & (observed[..., 3:4] > 0) & xp.isfinite(tails) & (tails > 0)
    usable = xp.where(ok, tails * (1.0 - repeatability), 0.0)  # (..., C, 2)
    floor = xp.max(xp.where(below[..., None], usable[..., None, :, :], 0.0), axis=-2)
    return guarded, floor


def guard_after_measuring(
    guarded: Any, floor: Any, measured: Any, e: Any, y: Any, ladder: LoadLadder, repeatability: float
) -> tuple[Any, Any]:
    """:func:`guard_state` after one more measurement, updated rather than recomputed.

    Args:
        guarded: bool ``(n_cells,)`` and ``floor (n_cells, 2)``: the guard now.
        measured: bool ``(n_cells,)``: what is measured now.
        e: the cell measured next (a scalar index; ``n_cells``: none).
        y: ``(..., 4)`` its measured values (fantasies).

    Returns:
        ``guarded (n_cells,)`` and ``floor (..., n_cells, 2)``, equal to
        :func:`guard_state` of the state with ``e`` measured at ``y``.
    """
    xp = namespace(guarded, floor, y)
    n = guarded.shape[-1]
    real = e < n
    e_ = xp.minimum(e, n - 1)
    near = xp.asarray(ladder.near_above)[:, e_] & real  # cells that e now sits near above
    is_e = xp.arange(n) == e
    guarded = (guarded | (near & ~measured)) & ~is_e
    tails = y[..., 1:3]
    ok = (y[..., 0:1] > 0) & (y[..., 3:4] > 0) & xp.isfinite(tails) & (tails > 0)
    val = xp.where(ok, tails * (1.0 - repeatability), 0.0)  # (..., 2)
    below_e = (xp.asarray(ladder.below)[:, e_] & real)[:, None]  # cells above e: e is beneath them
    floor = xp.where(below_e, xp.maximum(floor, val[..., None, :]), floor)
    return guarded, floor


def knee_guard(lo: Any, guarded: Any, floor: Any) -> Any:
    """``lo (..., n_cells, 4)`` with guarded cells' TTFT and completion lowered to ``floor``.

    ``guarded (..., n_cells)`` and ``floor (..., n_cells, 2)`` from
    :func:`guard_state`. Only the optimistic side moves: the guard says what
    the model cannot exclude, not what it cannot promise.
    """
    xp = namespace(lo, floor)
    tails = xp.where(guarded[..., None], xp.minimum(lo[..., 1:3], floor), lo[..., 1:3])
    return xp.concatenate([lo[..., :1], tails, lo[..., 3:]], axis=-1)


def bound_tables(lo: Any, hi: Any) -> tuple[Any, Any]:
    """Conservative and optimistic tables from intervals; ``(..., 4)`` each.

    Conservative: low throughput, high TTFT and completion, low success;
    optimistic: the reverse.
    """
    xp = namespace(lo, hi)
    cons = xp.stack([lo[..., 0], hi[..., 1], hi[..., 2], lo[..., 3]], axis=-1)
    opt = xp.stack([hi[..., 0], lo[..., 1], lo[..., 2], hi[..., 3]], axis=-1)
    return cons, opt


# The SLO-attainment setting that keeps the metric rule (a cell's measured or
# predicted value against its SLOs), and what a campaign gets when its file
# names none: nine windows in ten, what an operator means by "meets its SLO".
# Evidence (docs/results.md, "Window noise"): on the noisy suite the metric rule
# applied to a fully measured grid picks a fleet that meets its SLOs in 90 % of
# windows in under a third of fleets, one window per cell or the median of three;
# and on the shipped grid it certifies chat TP4@C96 beside a P(SLO met) near one half
# (docs/results.md, "The Quickstart campaign").
POINT = SLO_ATTAINMENT_POINT
DEFAULT_SLO_ATTAINMENT: float | str = 0.9


def check_level(value: Any, field: str) -> float | str:
    """A valid SLO-attainment setting: ``"point"`` or a number strictly inside (0, 1).

    Raises:
        ValueError: one line naming ``field``.
    """
    if isinstance(value, str):
        if value == POINT:
            return POINT
        raise ValueError(f"{field} must be a number in (0, 1) or \"point\", got {value!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number in (0, 1) or \"point\", got {value!r}")
    q = float(value)
    if not (math.isfinite(q) and 0.0 < q < 1.0):
        raise ValueError(f"{field} must be in (0, 1) (or \"point\"), got {value!r}")
    return q


def admissible_at_level(attainment: Any, level: Any) -> Any:
    """THE admissibility rule at an attainment level: ``attainment (..., n) ≥ level``
    (``level`` a float or ``(n,)`` per cell, e.g. per-class overrides)."""
    xp = namespace(attainment)
    return attainment >= xp.asarray(level, dtype=attainment.dtype) - 1e-12


def _as_admissible(table: Any, ok: Any, success_min: Any, ttft_max: Any, completion_max: Any) -> Any:
    """``table (..., n, 4)`` rewritten so that :func:`meets_slo` reads ``ok (..., n)``."""
    xp = namespace(table, ok)
    thr = xp.where(ok, table[..., 0], 0.0)
    ttft = xp.where(ok, xp.minimum(xp.where(xp.isnan(table[..., 1]), xp.inf, table[..., 1]), ttft_max), table[..., 1])
    comp = xp.where(ok, xp.minimum(xp.where(xp.isnan(table[..., 2]), xp.inf, table[..., 2]), completion_max), table[..., 2])
    succ = xp.where(ok, xp.maximum(table[..., 3], success_min), 0.0)
    return xp.stack([thr, ttft, comp, succ], axis=-1)


def level_tables(
    cons: Any,
    opt: Any,
    attainment_lo: Any,
    attainment_hi: Any,
    level: Any,
    success_min: Any,
    ttft_max: Any,
    completion_max: Any,
) -> tuple[Any, Any]:
    """Conservative and optimistic tables at an attainment level (rule 5).

    Args:
        cons, opt: ``(..., n_cells, 4)`` from :func:`bound_tables`.
        attainment_lo, attainment_hi: ``(..., n_cells)`` credible bounds of
            each cell's attainment (a posterior draw's own attainment for both
            in the joint check).
        level: the level ``q`` (float or ``(n_cells,)``).
        success_min, ttft_max, completion_max: ``(n_cells,)`` each cell's
            class limits (``+inf``: none named).

    Returns:
        ``(cons, opt)`` each ``(..., n_cells, 4)``: a cell admissible at the
        level (:func:`admissible_at_level` of the lower bound, resp. the upper)
        keeps its throughput, with tails capped at the limits and success
        raised to its floor; any other cell has zero throughput and success.
    """
    lim = (success_min, ttft_max, completion_max)
    return (
        _as_admissible(cons, admissible_at_level(attainment_lo, level), *lim),
        _as_admissible(opt, admissible_at_level(attainment_hi, level), *lim),
    )
