"""The modelling scale of the four metrics, shared by the model and the surrogates.

Throughput and the two tails are modelled as logs, success as the logit of
its value clipped to ``[SUCCESS_EPS, 1 − SUCCESS_EPS]``. The clip is the
model's resolution: 0.999 and 1.0 coincide, and a credible interval reaching
within :data:`SUCCESS_EPS` of 0 or 1 reaches the end itself
(:func:`fleetsieve_bayes.decision.intervals.widen_success`). NumPy only, so
light modules (surrogates, reports) can use it without JAX.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from fleetsieve_bayes.arrays import namespace

__all__ = ["SUCCESS_EPS", "TINY", "HUGE", "metric_transform"]

# Success is modelled on the logit scale clipped to [eps, 1 - eps]; 0.999 and
# 1.0 are indistinguishable at this resolution (SLOs are ≤ 0.999 in practice).
SUCCESS_EPS = 1e-3
# Floors/ceilings that keep log transforms finite for degenerate values.
TINY = 1e-9
HUGE = 1e9


def metric_transform(y: Any, xp: ModuleType | None = None) -> Any:
    """Natural units → modelling scale; ``y (..., 4)`` → ``(..., 4)`` (finite).

    log throughput, log TTFT, log completion, logit(clipped success). ``xp``:
    the array namespace (default: that of ``y``).
    """
    xp = xp or namespace(y)
    pos = xp.log(xp.clip(y[..., :3], TINY, HUGE))
    s = xp.clip(y[..., 3], SUCCESS_EPS, 1.0 - SUCCESS_EPS)
    return xp.concatenate([pos, (xp.log(s) - xp.log1p(-s))[..., None]], axis=-1)
