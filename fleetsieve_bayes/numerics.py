"""The numerical rules that keep a decision the same on every machine (docs/method.md, "Reproducibility").

A campaign's decisions rest on Markov chains, and a Markov chain amplifies the
last bits of its arithmetic: two CPUs that round one product differently
(fused multiply-add or not, another vector width, another reduction order)
start two chains that part after a few hundred transitions. Three rules stop
float rounding from reaching a decision:

- **Precision.** JAX computes in float64 (:func:`use_float64`, called when the
  package is imported). Rounding differences start near 1e-16 instead of 1e-7.
- **A lattice for the sampler.** Every leapfrog increment is rounded to a
  grid before it is added, a reversible shear
  (:mod:`fleetsieve_bayes.model.lattice`), chain starts are rounded to a fine
  grid and step sizes to ``STEP_BITS`` mantissa bits (:func:`snap_step_size`).
  Two machines whose gradients differ in the last bits add the same
  increments, so their chains stay bit-identical and so do their draws. The
  grids are far below any posterior scale, so the lattice moves no posterior
  summary beyond its Monte Carlo error.
- **Ties.** A value compared with a threshold (a probability with ``1 − risk``,
  a gap with ε, an attainment with its level) reaches it when it is no more
  than :data:`DECISION_TOL` (or :data:`DECISION_RTOL` of it) short
  (:func:`at_least`, :func:`at_most`). Acquisition scores within
  :data:`SCORE_TIE` of the best are ties, broken by cost, then by the cell's
  order in the grid.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

__all__ = [
    "POSITION_BITS",
    "STEP_BITS",
    "DECISION_TOL",
    "DECISION_RTOL",
    "use_float64",
    "MOMENTUM_BITS",
    "START_BITS",
    "snap_step_size",
    "tolerance",
    "at_least",
    "at_most",
    "SCORE_TIE",
]

# The sampler's lattice (fleetsieve_bayes/model/lattice.py): leapfrog increments
# rounded to 2^-16 of each coordinate's posterior scale (positions) and 2^-12 of
# its momentum scale; chain starts to an absolute 2^-30; step sizes to 20
# mantissa bits. Gradients computed with other rounding differ by ~1e-15
# relative, so an increment lands on another grid point on two machines with
# probability ~1e-11 per coordinate and leapfrog step.
POSITION_BITS = 16
MOMENTUM_BITS = 12
START_BITS = 30
STEP_BITS = 20

# Acquisition scores within SCORE_TIE·max(1, |best|) of the best are ties, broken
# by the lower profiling cost, then the lower cell index
# (fleetsieve_bayes.decision.strategies.base.select_cell). A score is an
# expected gap reduction averaged over hundreds of fantasies: below 1e-6 of the
# gap's unit it carries no information.
SCORE_TIE = 1e-6

# Decision values (acquisition scores, probabilities, gaps, bounds against an
# SLO) are computed in float64 from bit-identical draws; they differ between
# machines by ~1e-15 relative. Differences below 1e-9 are not information.
DECISION_TOL = 1e-9
DECISION_RTOL = 1e-9


def use_float64() -> None:
    """Make JAX compute in float64, whether or not it is imported yet."""
    jax = sys.modules.get("jax")
    if jax is None:
        os.environ["JAX_ENABLE_X64"] = "1"
    else:
        jax.config.update("jax_enable_x64", True)


def snap_step_size(step: Any) -> Any:
    """A positive step size (JAX array) rounded to ``STEP_BITS`` mantissa bits, exactly
    (frexp/ldexp scale by powers of two): ulp-level differences vanish."""
    import jax.numpy as jnp

    mantissa, exponent = jnp.frexp(step)
    return jnp.ldexp(jnp.round(jnp.ldexp(mantissa, STEP_BITS)), exponent - STEP_BITS)


def tolerance(value: float | np.ndarray) -> np.ndarray | float:
    """The tie tolerance at ``value``: ``max(DECISION_TOL, DECISION_RTOL·|value|)``."""
    return np.maximum(DECISION_TOL, DECISION_RTOL * np.abs(value))


def at_least(value: float, threshold: float) -> bool:
    """``value >= threshold`` up to the tie tolerance (a tie counts as reaching it)."""
    return bool(value >= threshold - tolerance(threshold))


def at_most(value: float, threshold: float) -> bool:
    """``value <= threshold`` up to the tie tolerance (a tie counts as within it)."""
    return bool(value <= threshold + tolerance(threshold))
