"""Credible intervals → conservative and optimistic tables: the one owner of these rules.

Both the certificate's bounds (:mod:`fleetsieve_bayes.decision.bounds`, NumPy
float64) and the acquisition kernel (:mod:`fleetsieve_bayes.decision.acquisition`,
inside ``jit``) build their tables with these functions, so the kernel scores
the very table the certificate reads. Every function takes arrays of either
namespace (:func:`fleetsieve_bayes.arrays.namespace`); metrics are the last
axis, in :data:`~fleetsieve_bayes.table.METRICS` order.

The rules, applied in this order:

1. :func:`widen_success` — a success interval reaching within
   :data:`~fleetsieve_bayes.model.scales.SUCCESS_EPS` of 0 or 1 reaches the end
   itself (the model resolves success only inside that band, so a measured 1.0
   must lie inside the interval);
2. :func:`collapse_measured` / :func:`with_measured` — a measured cell's
   interval is its measured value ± the relative ``repeatability`` band
   (throughput and tails), the band taken on the *failure* probability
   ``1 − s`` for success (a relative band on 0.99 itself would be meaninglessly
   wide), clipped to ``[0, 1]``;
3. :func:`bound_tables` — conservative: low throughput, high TTFT and
   completion, low success; optimistic: the reverse.
"""

from __future__ import annotations

from typing import Any

from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.model.scales import SUCCESS_EPS

__all__ = [
    "credible_quantiles",
    "widen_success",
    "collapse_measured",
    "with_measured",
    "bound_tables",
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
