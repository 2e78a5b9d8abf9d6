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
   discrepancy);
2. :func:`collapse_measured` / :func:`with_measured` — a measured cell's
   interval is its measured value ± the relative ``repeatability`` band
   (throughput and tails), the band taken on the *failure* probability
   ``1 − s`` for success (a relative band on 0.99 itself would be meaninglessly
   wide), clipped to ``[0, 1]``;
3. :func:`bound_tables` — conservative: low throughput, high TTFT and
   completion, low success; optimistic: the reverse.
"""

from __future__ import annotations

import math
from typing import Any

from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.model.scales import SUCCESS_EPS

__all__ = [
    "MODEL_MARGIN",
    "credible_quantiles",
    "model_intervals",
    "widen_by_margin",
    "widen_success",
    "collapse_measured",
    "with_measured",
    "bound_tables",
]


# Model discrepancy of the tails (natural-log units): an unmeasured cell's TTFT
# and completion intervals are widened by ×/÷ e^MODEL_MARGIN (≈ 10.5 %) beyond
# the posterior predictive. Why: the posterior is calibrated *on average*
# (simulated-fleet coverage 0.89 at 90 %), but the curves are smooth shapes and
# real ones are not; the misses concentrate exactly where decisions are made —
# the last load below a sharp knee, whose neighbour above was measured deep in
# overload. There the model's lower bound lands a few percent above a truth
# sitting just under its SLO, the optimistic table rules the cell out, the gap
# closes and the certificate is false (suite fleet c037: TTFT 1.273 s against
# an SLO of 1.28 s, 90 % interval [1.39, 5.7] s). With the margin such a cell
# stays in the optimistic table until it is measured. Throughput and success
# are not widened: their misses were not decision-relevant on the suite.
MODEL_MARGIN = 0.1


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


def widen_by_margin(lo: Any, hi: Any, margin: float) -> tuple[Any, Any]:
    """Tail intervals (TTFT, completion) widened to ``lo·e^-margin, hi·e^margin``; ``(..., 4)`` each."""
    if margin == 0.0:
        return lo, hi
    xp = namespace(lo, hi)
    e = math.exp(float(margin))
    f = xp.asarray([1.0, e, e, 1.0], dtype=lo.dtype)
    return lo / f, hi * f


def model_intervals(lo: Any, hi: Any, margin: float = MODEL_MARGIN) -> tuple[Any, Any]:
    """The intervals the decision reads for a cell the model predicts: raw
    quantiles ``lo, hi (..., 4)`` → :func:`widen_success`, then
    :func:`widen_by_margin`."""
    return widen_by_margin(*widen_success(lo, hi), margin)


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


def bound_tables(lo: Any, hi: Any) -> tuple[Any, Any]:
    """Conservative and optimistic tables from intervals; ``(..., 4)`` each.

    Conservative: low throughput, high TTFT and completion, low success;
    optimistic: the reverse.
    """
    xp = namespace(lo, hi)
    cons = xp.stack([lo[..., 0], hi[..., 1], hi[..., 2], lo[..., 3]], axis=-1)
    opt = xp.stack([hi[..., 0], lo[..., 1], lo[..., 2], hi[..., 3]], axis=-1)
    return cons, opt
