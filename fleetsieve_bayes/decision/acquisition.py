"""The acquisition kernel: expected reduction of the allocation gap, in JAX.

For every cell ``e`` of the grid at once (measured cells are masked, so the
shapes — and the compiled kernel — stay fixed for a whole campaign):

1. draw ``n_fantasies`` fantasy outcomes ``y_f`` of ``e`` from its posterior
   predictive: a systematic sample of posterior draws ``d_f`` and one
   observation per draw from :func:`fleetsieve_bayes.model.joint.sample_obs`.
   The draw indices and the random numbers are *common* to every candidate
   (common random numbers), so score differences between cells are not
   Monte-Carlo noise of independent fantasies;
2. importance-reweight the posterior draws by each fantasy's likelihood
   ``p(y_f | latent_d[e], noise_d)`` (the posterior after observing ``y_f``,
   without refitting);
3. recompute every cell's credible interval as *weighted* quantiles of its
   posterior-predictive draws (latent + one fixed noise draw per posterior
   draw, as :mod:`fleetsieve_bayes.decision.bounds` does) (the draws of each
   cell/metric are sorted once per call — the order does not depend on the
   weights — then weights are accumulated in that order);
4. rebuild the conservative table (low throughput, high tails, low success)
   and the optimistic table (the reverse) with the rules of
   :mod:`fleetsieve_bayes.decision.intervals` — the functions the
   certificate's bounds use: success widened to 0/1 near the ends, measured
   cells and the candidate itself collapsed to their (fantasy) value ± the
   relative repeatability band;
5. solve both tables with the JAX allocator and evaluate the stage-wise gap of
   :mod:`fleetsieve_bayes.allocation.objective` (``stagewise_gap`` /
   ``scalar_gap``, the very same functions the certificate uses);
6. average over fantasies: ``score(e) = gap_now − E_f[gap(e, y_f)]``.

Quantiles here are the inverted empirical CDF (weighted); ``bounds`` uses
NumPy's linear interpolation, so ``gap_now`` can differ slightly from the
certificate's gap when an interval endpoint sits on an allocation boundary.
``gap_now`` is computed by the same kernel — as an extra "measure nothing"
candidate with uniform weights — so the score is a difference of two numbers
obtained with one quantile rule (the inverted empirical CDF) and one
allocator call site (one compile).

Effective sample size. When the measurement is far more precise than the
posterior (the normal case for a cell that matters) the weights can collapse
onto a handful of draws; quantiles of *other* cells computed from them would
shrink spuriously and inflate the score. For every fantasy the kernel
monitors the normalised ESS ``(Σw)²/(D·Σw²)``; when it falls below
the threshold ``max(ess_threshold, min_effective_draws / n_draws)`` (capped
at 0.5) the likelihood is *tempered*, ``w ∝ p(y|θ)^β`` with the
largest ``β ∈ (0, 1]`` (bisection on log β) that restores the threshold.
For Gaussian noise this is the same as widening the measurement noise by
``1/√β`` — the documented approximation: the fantasy is treated as a noisier
measurement, so the update of the *other* cells is under-, never
over-stated (the candidate itself still collapses to its fantasy value).
Such candidates are flagged (``fallback``); the campaign loop may respond by
refitting with more draws. ``ess_min`` reports the *untempered* ESS.

Big grids. The interval recomputation costs ``O(n_fantasies · n_related ·
4 · n_draws)`` per candidate. By default every cell is recomputed (exact).
With ``n_related=k`` only the ``k`` unmeasured cells whose draws are most
correlated with the candidate's (mean |corr| of log-metrics over draws; the
candidate itself always included) get reweighted intervals; the others keep
their current intervals — an approximation that ignores weak, indirect
updates. The candidate axis is processed in chunks (``lax.map`` with a
batch size chosen from a memory budget), so memory stays bounded and time
grows linearly in the number of candidates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.objective import objective_value, scalar_gap, stagewise_gap
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.intervals import (
    KNEE_GUARD,
    MODEL_MARGIN,
    SUCCESS_MARGIN,
    LoadLadder,
    bound_tables,
    collapse_measured,
    credible_quantiles,
    grid_ladder,
    guard_after_measuring,
    guard_state,
    knee_guard,
    level_tables,
    model_intervals,
    with_measured,
)
from fleetsieve_bayes.decision.strategies.base import select_cell

__all__ = [
    "AcquisitionScores",
    "Acquisition",
    "AcquisitionConfig",
    "KernelFunctions",
    "KernelInputs",
    "make_acquisition",
    "prepare_inputs",
    "candidate_tables",
    "credible_quantiles",
    "importance_weights",
    "weighted_intervals",
    "collapse_measured",
    "bound_tables",
    "conservative_value",
    "fantasy_plan",
    "fantasy_outcomes",
    "related_cells",
    "select_cell",
    "DEFAULT_ESS_THRESHOLD",
    "DEFAULT_MIN_EFFECTIVE_DRAWS",
    "LevelInputs",
    "level_inputs",
]

# Normalised ESS below which a fantasy's likelihood is tempered. With 1000
# draws this keeps ≥ 50 effective draws, enough to place 5 %/95 % quantiles.
DEFAULT_ESS_THRESHOLD = 0.05
# ... and never fewer than this many effective draws (the tails of a 90 %
# interval need a few dozen draws beyond each quantile to be stable).
DEFAULT_MIN_EFFECTIVE_DRAWS = 40.0
# Bisection steps on log2 β ∈ [-_LOG2_BETA_MIN, 0] for the tempering exponent.
_N_BISECT = 14
_LOG2_BETA_MIN = 30.0

# The conservative allocation's objective as one number (the certificate's weights).
conservative_value = objective_value


class AcquisitionScores(NamedTuple):
    """Output of :func:`Acquisition.score`. Per-cell arrays have shape ``(n_cells,)``."""

    score: jax.Array  # gap_now − expected_gap; −inf for measured cells
    expected_gap: jax.Array  # E_f[scalar gap after measuring the cell]; nan for measured cells
    gap_now: jax.Array  # () scalar gap of the current intervals
    ess_min: jax.Array  # min over fantasies of the untempered normalised ESS, in (0, 1]
    fallback: jax.Array  # bool: some fantasy of this cell needed tempering
    expected_conservative: jax.Array  # E_f[conservative objective value after]; nan for measured
    conservative_now: jax.Array  # () conservative objective value now


class Acquisition(NamedTuple):
    """The jitted kernel and its selection rule (see :func:`make_acquisition`)."""

    score: Callable[..., AcquisitionScores]
    select: Callable[[AcquisitionScores, np.ndarray], int]
    n_fantasies: int
    credible_level: float


class AcquisitionConfig(NamedTuple):
    """Settings of one acquisition kernel (hashable: fixed for a campaign).

    n_fantasies: fantasy outcomes per candidate.
    credible_level: central interval level of the bounds (0.9 → 5 %/95 %).
    repeatability: relative band around measured (and fantasy) values.
    model_margin: model discrepancy of unmeasured tails
        (:data:`fleetsieve_bayes.decision.intervals.MODEL_MARGIN`).
    success_margin: the same for the failure probability of unmeasured cells
        (:data:`fleetsieve_bayes.decision.intervals.SUCCESS_MARGIN`).
    knee_guard: load steps beneath a measured cell whose optimistic tails the
        model cannot raise (:data:`fleetsieve_bayes.decision.intervals.KNEE_GUARD`).
    cost_normalised: :attr:`Acquisition.select` ranks by score/GPU-seconds.
    ess_threshold: normalised ESS below which the likelihood is tempered.
    min_effective_draws: ... or fewer effective draws than this (the threshold
        used is ``min(0.5, max(ess_threshold, min_effective_draws / n_draws))``;
        set both to 0 to never temper).
    predictive: intervals of the posterior predictive (latent + noise, one
        fixed draw of noise per posterior draw, key ``predictive_seed``) — the
        default of :func:`fleetsieve_bayes.decision.bounds.credible_bounds` —
        rather than of the latent metrics.
    n_related: reweight only this many most-correlated unmeasured cells per
        candidate (None: all cells, exact). See the module docstring.
    memory_budget_mb: rough budget for one chunk of candidates.
    tie_tolerance: see :func:`select_cell`.
    """

    n_fantasies: int = 16
    credible_level: float = 0.9
    repeatability: float = 0.0
    model_margin: float = MODEL_MARGIN
    success_margin: float = SUCCESS_MARGIN
    knee_guard: int = KNEE_GUARD
    cost_normalised: bool = False
    ess_threshold: float = DEFAULT_ESS_THRESHOLD
    min_effective_draws: float = DEFAULT_MIN_EFFECTIVE_DRAWS
    predictive: bool = True
    predictive_seed: int = 0
    n_related: int | None = None
    memory_budget_mb: float = 128.0
    tie_tolerance: float = 1e-6


class KernelFunctions(NamedTuple):
    """What the kernel calls: the allocator and the observation model.

    solve: ``values (..., n_cells, 4) -> JaxAllocation``.
    obs_logpdf: ``(y, latent, noise) -> log p(y | latent, noise)`` summed over metrics.
    sample_obs: ``(key, latent, noise) -> y``.
    total_demand: Σλ, the goodput normaliser of the gap.
    ladder: the grid's :class:`~fleetsieve_bayes.decision.intervals.LoadLadder` (knee guard).
    """

    solve: Callable[[jax.Array], Any]
    obs_logpdf: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
    sample_obs: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
    total_demand: float
    ladder: LoadLadder


class KernelInputs(NamedTuple):
    """Per-call arrays shared by every candidate (see :func:`prepare_inputs`).

    Shapes: C cells, D draws, F fantasies, k related cells per candidate.
    """

    latent: jax.Array  # (D, C, 4)
    noise: jax.Array  # (D, 4)
    observed: jax.Array  # (C, 4), 1.0 where unmeasured
    measured: jax.Array  # bool (C,)
    sorted_vals: jax.Array  # (C, 4, D) predictive draws, sorted per cell/metric
    order: jax.Array  # (C, 4, D) the argsort that produced sorted_vals
    lo_now: jax.Array  # (C, 4) current intervals, measured cells collapsed
    hi_now: jax.Array  # (C, 4)
    d_f: jax.Array  # int (F,) fantasy draw indices (common random numbers)
    k_obs: jax.Array  # the key of every candidate's fantasy observations
    related: jax.Array  # int (C, k) cells reweighted per candidate
    guarded: jax.Array  # bool (C,) cells the knee guard holds open now
    floor: jax.Array  # (C, 2) their model-free tail floors
    level: LevelInputs | None = None  # at an SLO-attainment level (else the metric rule)


class LevelInputs(NamedTuple):
    """What the kernel needs at an SLO-attainment level (:func:`level_inputs`).

    Shapes: D draws, C cells. ``lo``/``hi (C,)`` every cell's attainment bounds
    now (:class:`fleetsieve_bayes.decision.bounds.Attainment`, the
    certificate's); ``levels (C,)``;
    ``limits (3, C)`` success floor, TTFT and completion limits of each cell's
    class; ``window (D, C, 6)`` window noise; ``n (C, 3)`` and ``s1 (D, C, 3)``
    the windows' sufficient statistics and ``z (D, C, 3)`` the normals of the
    cells' departures (:func:`fleetsieve_bayes.model.joint.offset_moments`),
    ``success_offset (D, C)`` their logit-success departures now
    (:func:`fleetsieve_bayes.model.joint.success_offsets`, kept when a
    candidate is measured once more);
    ``repeatable`` bool ``(C,)``: measured cells that may be measured again.
    """

    lo: jax.Array
    hi: jax.Array
    levels: jax.Array
    limits: jax.Array
    window: jax.Array
    n: jax.Array
    s1: jax.Array
    z: jax.Array
    repeatable: jax.Array
    success_offset: jax.Array


def level_inputs(
    posterior: Any, attainment: Any, grid: CellGrid, problem: AllocationProblem, levels: np.ndarray,
    repeatable: np.ndarray, *, seed: int = 0,
) -> LevelInputs:
    """:class:`LevelInputs` from a window-noise posterior and its
    :func:`~fleetsieve_bayes.decision.bounds.attainment_bounds` (same ``seed``:
    the same departures)."""
    from fleetsieve_bayes.model.success import success_offsets
    from fleetsieve_bayes.model.window_noise import offset_moments, offset_normals

    latent = jnp.asarray(posterior.latent)
    n, s1 = offset_moments(latent, jnp.asarray(posterior.noise), posterior.windows)
    w = grid.workload_idx
    limits = np.stack([problem.success_min[w], problem.ttft_max[w], problem.completion_max[w]])
    return LevelInputs(
        lo=jnp.asarray(attainment.lo, latent.dtype),
        hi=jnp.asarray(attainment.hi, latent.dtype),
        levels=jnp.asarray(levels, latent.dtype),
        limits=jnp.asarray(limits, latent.dtype),
        window=jnp.asarray(posterior.window, latent.dtype),
        n=n,
        s1=s1,
        z=offset_normals(jax.random.PRNGKey(seed), latent),
        repeatable=jnp.asarray(repeatable, bool),
        success_offset=success_offsets(
            jax.random.PRNGKey(seed), latent, jnp.asarray(posterior.noise), jnp.asarray(posterior.window, latent.dtype),
            posterior.windows,
        ),
    )


def _weighted_quantile(values: jax.Array, weights: jax.Array, q: float) -> jax.Array:
    """Inverted-CDF weighted quantile of ``values (..., D)`` under ``weights (..., D)`` → ``(...)``."""
    order = jnp.argsort(values, axis=-1)
    v = jnp.take_along_axis(values, order, axis=-1)
    cw = jnp.cumsum(jnp.take_along_axis(weights, order, axis=-1), axis=-1)
    i = jnp.minimum(jnp.sum(cw < q - 1e-6, axis=-1), values.shape[-1] - 1)
    return jnp.take_along_axis(v, i[..., None], axis=-1)[..., 0]


@partial(jax.jit, static_argnames=("ess_threshold",))
def importance_weights(
    loglik: jax.Array, ess_threshold: float = DEFAULT_ESS_THRESHOLD
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Normalised importance weights with likelihood tempering when the ESS collapses.

    Args:
        loglik: ``(..., n_draws)`` log-likelihood of one fantasy under each draw.
        ess_threshold: minimum normalised ESS; below it the likelihood is
            tempered to ``β·loglik`` with the largest β (bisection) meeting it.

    Returns:
        ``(weights (..., n_draws), ess (...), tempered (...))``: weights sum to
        1, ``ess`` is the normalised ESS of the *untempered* weights, and
        ``tempered`` flags fantasies that used β < 1.
    """
    n = loglik.shape[-1]
    # A fantasy impossible under every draw (all −inf) carries no information: uniform.
    finite = jnp.isfinite(loglik)
    any_finite = jnp.any(finite, axis=-1, keepdims=True)
    ll = jnp.where(finite, loglik, -jnp.inf)
    ll = jnp.where(any_finite, ll - jnp.max(jnp.where(finite, ll, -jnp.inf), axis=-1, keepdims=True), 0.0)

    def log_ess(beta: jax.Array) -> jax.Array:
        b = beta[..., None]
        bl = jnp.where(finite | ~any_finite, b * ll, -jnp.inf)
        return 2.0 * jax.nn.logsumexp(bl, axis=-1) - jax.nn.logsumexp(2.0 * bl, axis=-1) - math.log(n)

    log_thr = math.log(max(ess_threshold, 1e-12))
    ones = jnp.ones(ll.shape[:-1], ll.dtype)
    ok_full = log_ess(ones) >= log_thr

    def step(_: int, bounds: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        good = log_ess(jnp.exp2(mid)) >= log_thr
        return jnp.where(good, mid, lo), jnp.where(good, hi, mid)

    lo0 = jnp.full_like(ones, -_LOG2_BETA_MIN)
    lo, _ = jax.lax.fori_loop(0, _N_BISECT, step, (lo0, jnp.zeros_like(ones)))
    beta = jnp.where(ok_full | (ess_threshold <= 0.0), ones, jnp.exp2(lo))
    bl = jnp.where(finite | ~any_finite, beta[..., None] * ll, -jnp.inf)
    w = jnp.exp(bl - jax.nn.logsumexp(bl, axis=-1, keepdims=True))
    return w, jnp.exp(log_ess(ones)), beta < 1.0


def weighted_intervals(
    sorted_vals: jax.Array, order: jax.Array, weights: jax.Array, q_lo: float, q_hi: float
) -> tuple[jax.Array, jax.Array]:
    """Weighted quantiles (inverted CDF) of each cell/metric's draws.

    Args:
        sorted_vals: ``(k, 4, n_draws)`` draws of k cells, sorted along the last axis.
        order: ``(k, 4, n_draws)`` the argsort that produced ``sorted_vals``.
        weights: ``(..., n_draws)`` normalised draw weights.

    Returns:
        ``(lo, hi)`` each ``(..., k, 4)``: the smallest sorted value whose
        cumulative weight reaches ``q_lo`` (resp. ``q_hi``).
    """
    n = sorted_vals.shape[-1]
    w_sorted = jnp.take(weights, order, axis=-1)  # (..., k, 4, n_draws)
    cw = jnp.cumsum(w_sorted, axis=-1)
    # A small slack so that uniform weights hit the textbook index despite float rounding.
    slack = 1e-6
    i_lo = jnp.minimum(jnp.sum(cw < q_lo - slack, axis=-1), n - 1)
    i_hi = jnp.minimum(jnp.sum(cw < q_hi - slack, axis=-1), n - 1)
    sv = jnp.broadcast_to(sorted_vals, cw.shape)
    lo = jnp.take_along_axis(sv, i_lo[..., None], axis=-1)[..., 0]
    hi = jnp.take_along_axis(sv, i_hi[..., None], axis=-1)[..., 0]
    return lo, hi


def fantasy_plan(key: jax.Array, n_draws: int, n_fantasies: int) -> tuple[jax.Array, jax.Array]:
    """Common random numbers shared by every candidate.

    Returns:
        ``(d_f (n_fantasies,), k_obs)``: a systematic sample of posterior draw
        indices (one uniform offset, evenly spaced) and the one key every
        candidate's :func:`sample_obs` call uses.
    """
    k_draw, k_obs = jax.random.split(key)
    u = jax.random.uniform(k_draw, ())
    d_f = ((jnp.arange(n_fantasies) + u) / n_fantasies * n_draws).astype(jnp.int32)
    return jnp.minimum(d_f, n_draws - 1), k_obs


def fantasy_outcomes(
    key: jax.Array,
    latent: jax.Array,
    noise: jax.Array,
    n_fantasies: int,
    sample_obs: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
) -> jax.Array:
    """The fantasy observations the kernel uses, for every cell: ``(n_cells, n_fantasies, 4)``.

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)``.

    Fantasy f of every cell comes from the same draw index and the same
    random numbers (common random numbers).
    """
    d_f, k_obs = fantasy_plan(key, latent.shape[0], n_fantasies)
    return jax.vmap(lambda lat_e: sample_obs(k_obs, lat_e, noise[d_f]))(jnp.moveaxis(latent[d_f], 1, 0))


def related_cells(latent: jax.Array, measured: jax.Array, k: int) -> jax.Array:
    """``(n_cells, k)`` for each candidate, the k unmeasured cells most correlated with it.

    Correlation: mean over metrics of |corr| of log(|x|+tiny) across draws;
    the candidate itself is always first.
    """
    x = jnp.log(jnp.abs(latent) + 1e-12)  # (D, C, 4)
    x = (x - x.mean(0)) / (x.std(0) + 1e-12)
    corr = jnp.abs(jnp.einsum("dcm,dem->ce", x, x)) / (x.shape[0] * x.shape[2])  # (C, C)
    c = corr.shape[0]
    corr = jnp.where(measured[None, :], -1.0, corr)
    corr = jnp.where(jnp.eye(c, dtype=bool), 2.0, corr)
    _, idx = jax.lax.top_k(corr, k)
    return idx


def n_related_cells(config: AcquisitionConfig, n_cells: int) -> int:
    """How many cells each candidate reweights (all of them unless ``n_related`` caps it)."""
    return n_cells if config.n_related is None else max(1, min(int(config.n_related), n_cells))


def tempering_threshold(config: AcquisitionConfig, n_draws: int) -> float:
    """The normalised ESS below which a fantasy's likelihood is tempered."""
    return float(min(0.5, max(config.ess_threshold, config.min_effective_draws / n_draws)))


def chunk_plan(n_candidates: int, per_candidate_bytes: int, memory_budget_mb: float) -> tuple[int, int]:
    """``(n_chunks, chunk)`` covering ``n_candidates`` in balanced chunks within the budget.

    Balanced so that padding wastes less than one candidate per chunk.
    """
    chunk_max = int(max(1, min(n_candidates, memory_budget_mb * 2**20 // max(per_candidate_bytes, 1))))
    n_chunks = -(-n_candidates // chunk_max)
    return n_chunks, -(-n_candidates // n_chunks)


def prepare_inputs(
    key: jax.Array,
    latent: jax.Array,
    noise: jax.Array,
    observed: jax.Array,
    measured: jax.Array,
    fns: KernelFunctions,
    config: AcquisitionConfig,
    level: LevelInputs | None = None,
) -> KernelInputs:
    """Everything every candidate shares: sorted predictive draws, current intervals, the fantasy plan.

    Intervals are of the posterior *predictive* (latent + observation noise),
    like :func:`fleetsieve_bayes.decision.bounds.credible_bounds`, with the same
    fixed key; weights attach to draw d. ``observed`` rows of unmeasured cells
    are ignored (may be NaN).
    """
    n_draws, n_cells, _ = latent.shape
    measured = jnp.asarray(measured, bool)
    observed = jnp.where(measured[:, None], jnp.asarray(observed, latent.dtype), 1.0)
    draws = latent
    if config.predictive:
        draws = fns.sample_obs(jax.random.PRNGKey(config.predictive_seed), latent, noise[:, None, :])
    # Sort every cell/metric's draws once: the order is weight-independent.
    lat_t = jnp.moveaxis(draws.astype(latent.dtype), 0, -1)  # (C, 4, D)
    order = jnp.argsort(lat_t, axis=-1)
    sorted_vals = jnp.take_along_axis(lat_t, order, axis=-1)
    uniform = jnp.full((n_draws,), 1.0 / n_draws, latent.dtype)
    q_lo, q_hi = credible_quantiles(config.credible_level)
    lo0, hi0 = model_intervals(*weighted_intervals(sorted_vals, order, uniform, q_lo, q_hi), config.model_margin, config.success_margin)
    lo_now, hi_now = with_measured(lo0, hi0, observed, measured, config.repeatability)
    guarded, floor = guard_state(observed, measured, fns.ladder, config.repeatability)
    lo_now = knee_guard(lo_now, guarded, floor)
    d_f, k_obs = fantasy_plan(key, n_draws, config.n_fantasies)
    k = n_related_cells(config, n_cells)
    if k >= n_cells:
        related = jnp.broadcast_to(jnp.arange(n_cells), (n_cells, n_cells))
    else:
        related = related_cells(latent, measured, k)
    return KernelInputs(
        latent, noise, observed, measured, sorted_vals, order, lo_now, hi_now, d_f, k_obs, related, guarded, floor,
        level,
    )


def candidate_tables(
    e: jax.Array, inp: KernelInputs, fns: KernelFunctions, config: AcquisitionConfig
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Conservative and optimistic tables after each fantasy measurement of cell ``e``.

    ``e == n_cells`` is the "measure nothing" candidate: uniform weights,
    nothing collapses — the current tables, the very ones the certificate's
    bounds give (up to the quantile rule).

    Returns:
        ``(cons (F, C, 4), opt (F, C, 4), ess (F,), tempered (F,))``.
    """
    n_draws, n_cells, _ = inp.latent.shape
    n_f = config.n_fantasies
    null = e == n_cells
    e_ = jnp.minimum(e, n_cells - 1)
    y = fns.sample_obs(inp.k_obs, inp.latent[inp.d_f, e_], inp.noise[inp.d_f])  # (F, 4), same randomness for every e
    if inp.level is not None:
        y = _window_fantasy(inp, e_, y)
    loglik = fns.obs_logpdf(y[:, None, :], inp.latent[None, :, e_, :], inp.noise[None, :, :])  # (F, D)
    w, ess, tempered = importance_weights(loglik, tempering_threshold(config, n_draws))
    w = jnp.where(null, jnp.full((n_draws,), 1.0 / n_draws, w.dtype)[None, :], w)
    nb = inp.related[e_]  # (k,)
    q_lo, q_hi = credible_quantiles(config.credible_level)
    lo_nb, hi_nb = model_intervals(  # (F, k, 4)
        *weighted_intervals(inp.sorted_vals[nb], inp.order[nb], w, q_lo, q_hi), config.model_margin, config.success_margin
    )
    lo = jnp.broadcast_to(inp.lo_now, (n_f, n_cells, 4)).at[:, nb].set(lo_nb)
    hi = jnp.broadcast_to(inp.hi_now, (n_f, n_cells, 4)).at[:, nb].set(hi_nb)
    is_e = jnp.arange(n_cells) == e
    # A first window sets the cell's values; a repeat (a measured candidate, at a level)
    # keeps its measured ones in the metric tables and moves its attainment alone.
    obs_f = jnp.where((is_e & ~inp.measured)[None, :, None], y[:, None, :], inp.observed[None])  # (F, C, 4)
    fixed = jnp.broadcast_to(inp.measured | is_e, (n_f, n_cells))
    lo, hi = with_measured(lo, hi, obs_f, fixed, config.repeatability)
    guarded, floor = guard_after_measuring(inp.guarded, inp.floor, inp.measured, e, y, fns.ladder, config.repeatability)
    lo = knee_guard(lo, guarded, floor)
    cons, opt = bound_tables(lo, hi)
    if inp.level is not None:
        cons, opt = _level_candidate_tables(e, y, w, inp, cons, opt, config)
    return cons, opt, ess, tempered


def _level_candidate_tables(
    e: jax.Array, y: jax.Array, w: jax.Array, inp: KernelInputs, cons: jax.Array, opt: jax.Array, config: AcquisitionConfig
) -> tuple[jax.Array, jax.Array]:
    """The tables of :func:`candidate_tables` at the SLO-attainment level. The
    candidate ``e`` (fantasy windows ``y (F, 4)``, draw weights ``w (F, D)``)
    gets the attainment its windows plus the fantasy one give: its departure's
    posterior updated per draw, no margins (it is then measured), bounds as
    weighted quantiles. Every other cell keeps its attainment bounds now: a
    window of ``e`` moves the other cells' attainment only through the shared
    curve, and the lower 5 % quantile of a two-humped attainment (near 0 or
    near 1 per draw) flips on the slightest reweighting — noise, not
    information. Returns ``(cons, opt)`` each ``(F, C, 4)`` through
    :func:`fleetsieve_bayes.decision.intervals.level_tables`."""
    from fleetsieve_bayes.model.window_noise import (
        offsets_from_moments,
        probabilities_given_offsets,
    )

    lv = inp.level
    n_cells = inp.latent.shape[1]
    n_f = y.shape[0]
    q_lo, q_hi = credible_quantiles(config.credible_level)
    att_lo = jnp.broadcast_to(lv.lo, (n_f, n_cells))
    att_hi = jnp.broadcast_to(lv.hi, (n_f, n_cells))
    e_ = jnp.minimum(e, n_cells - 1)
    lat_e = inp.latent[:, e_]  # (D, 4)
    r = jnp.log(jnp.maximum(y[:, None, :3], 1e-9)) - jnp.log(jnp.maximum(lat_e[None, :, :3], 1e-9))  # (F, D, 3)
    delta = offsets_from_moments(
        lv.n[e_] + 1.0, lv.s1[None, :, e_] + r, inp.noise[None, :, :3], lv.window[None, :, e_, :3], lv.z[None, :, e_]
    )
    delta = jnp.concatenate([delta, jnp.broadcast_to(lv.success_offset[None, :, e_, None], (*delta.shape[:2], 1))], axis=-1)
    lim = lv.limits[:, e_]
    p = probabilities_given_offsets(lat_e[None], delta, lv.window[None, :, e_], lim[0], lim[1], lim[2]).prod(-1)  # (F, D)
    is_e = (jnp.arange(n_cells) == e)[None, :]
    att_lo = jnp.where(is_e, _weighted_quantile(p, w, q_lo)[:, None], att_lo)
    att_hi = jnp.where(is_e, _weighted_quantile(p, w, q_hi)[:, None], att_hi)
    return level_tables(cons, opt, att_lo, att_hi, lv.levels, lv.limits[0], lv.limits[1], lv.limits[2])


def _window_fantasy(inp: KernelInputs, e: jax.Array, y: jax.Array) -> jax.Array:
    """Fantasy windows ``(F, 4)`` of cell ``e`` at the level: throughput and tails
    the draw's curve times its current departure and one window's noise (the
    window-noise model's predictive of a new window), success ``y``'s own."""
    from fleetsieve_bayes.model.window_noise import offsets_from_moments

    lv = inp.level
    d = inp.d_f
    delta = offsets_from_moments(lv.n[e], lv.s1[d, e], inp.noise[d, :3], lv.window[d, e, :3], lv.z[d, e])  # (F, 3)
    eps = jax.random.normal(jax.random.fold_in(inp.k_obs, 1), delta.shape, delta.dtype)
    tails = inp.latent[d, e, :3] * jnp.exp(delta + lv.window[d, e, :3] * eps)
    return jnp.concatenate([tails, y[:, 3:]], axis=-1)


def gap_and_value(fns: KernelFunctions, cons: jax.Array, opt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``cons``/``opt`` ``(..., n_cells, 4)`` → scalar gap and conservative value ``(...)``."""
    a = fns.solve(jnp.stack([cons, opt], axis=-3))  # fields (..., 2, ...)
    f, r, g = a.feasible, a.min_fulfillment, a.goodput
    gap = stagewise_gap(f[..., 0], r[..., 0], g[..., 0], f[..., 1], r[..., 1], g[..., 1], fns.total_demand)
    return scalar_gap(gap), objective_value(f[..., 0], r[..., 0], g[..., 0], fns.total_demand)


def score_candidates(inp: KernelInputs, fns: KernelFunctions, config: AcquisitionConfig) -> AcquisitionScores:
    """Every candidate's expected gap, chunked along candidates (``lax.map`` of ``vmap``)."""
    n_draws, n_cells, _ = inp.latent.shape
    n_f = config.n_fantasies

    def one(e: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        cons, opt, ess, tempered = candidate_tables(e, inp, fns, config)
        gap, value = gap_and_value(fns, cons, opt)  # (F,)
        return gap.mean(), value.mean(), ess.min(), tempered.any()

    # One chunk's (chunk, F, k, 4, D) cumulative weights fit the budget (~4 live arrays).
    per_candidate = n_f * n_related_cells(config, n_cells) * 4 * n_draws * 4 * 4
    n_chunks, chunk = chunk_plan(n_cells + 1, per_candidate, config.memory_budget_mb)
    # Candidates 0..n_cells-1 plus the null candidate n_cells, padded (repeating the
    # null one) to whole chunks so one loop body compiles.
    padded = jnp.minimum(jnp.arange(n_chunks * chunk), n_cells)
    outs = jax.lax.map(jax.vmap(one), padded.reshape(n_chunks, chunk))
    exp_gap, exp_val, ess_min, fallback = (x.reshape(-1)[:n_cells] for x in outs)
    gap_now, cons_now = (x.reshape(-1)[n_cells] for x in outs[:2])
    # At a level, a measured cell that may be measured again is a candidate too
    # ("measure it again"), scored by the same expected gap.
    measured = inp.measured if inp.level is None else inp.measured & ~inp.level.repeatable
    return AcquisitionScores(
        score=jnp.where(measured, -jnp.inf, gap_now - exp_gap),
        expected_gap=jnp.where(measured, jnp.nan, exp_gap),
        gap_now=gap_now,
        ess_min=jnp.where(measured, 1.0, ess_min),
        fallback=fallback & ~measured,
        expected_conservative=jnp.where(measured, jnp.nan, exp_val),
        conservative_now=cons_now,
    )


def kernel_functions(
    grid: CellGrid,
    problem: AllocationProblem,
    *,
    allocator_solve: Callable[[jax.Array], Any] | None = None,
    obs_logpdf: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    sample_obs: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    knee_guard: int = KNEE_GUARD,
) -> KernelFunctions:
    """The kernel's functions; defaults: the JAX allocator and :mod:`fleetsieve_bayes.model.observation`'s noise.

    ``knee_guard``: steps of the grid's :func:`~fleetsieve_bayes.decision.intervals.load_ladder`.
    """
    if allocator_solve is None:
        from fleetsieve_bayes.allocation.batched import make_jax_allocator

        allocator_solve = make_jax_allocator(grid, problem).solve
    if obs_logpdf is None or sample_obs is None:
        from fleetsieve_bayes.model import observation as _observation

        obs_logpdf = obs_logpdf or _observation.obs_logpdf
        sample_obs = sample_obs or _observation.sample_obs
    ladder = grid_ladder(grid, knee_guard)
    return KernelFunctions(
        allocator_solve, obs_logpdf, sample_obs, float(np.sum(problem.demand)), LoadLadder(*map(jnp.asarray, ladder))
    )


def make_acquisition(
    grid: CellGrid,
    problem: AllocationProblem,
    config: AcquisitionConfig | None = None,
    *,
    allocator_solve: Callable[[jax.Array], Any] | None = None,
    obs_logpdf: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    sample_obs: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    **settings: Any,
) -> Acquisition:
    """Build the jitted acquisition kernel for one campaign.

    Args:
        grid, problem: the campaign's cells and allocation problem.
        config: an :class:`AcquisitionConfig`; ``settings`` override its fields
            by name (``make_acquisition(grid, problem, n_fantasies=8)``).
        allocator_solve, obs_logpdf, sample_obs: see :func:`kernel_functions`.

    Returns:
        An :class:`Acquisition`. ``score(key, latent, noise, observed,
        measured)`` takes ``latent (n_draws, n_cells, 4)`` natural units,
        ``noise (n_draws, 4)``, ``observed (n_cells, 4)`` (rows of unmeasured
        cells ignored, may be NaN) and ``measured (n_cells,)`` bool, and at an
        SLO-attainment level ``level`` (:func:`level_inputs`: admissibility
        is attainment against the level, and measured cells in
        ``level.repeatable`` are scored as repeats); inside, the
        work is shaped ``(n_candidates=n_cells, n_fantasies, n_draws, n_cells)``
        (chunked along candidates). It is jitted once per input shape.

    Raises:
        TypeError: a setting that is not a field of :class:`AcquisitionConfig`.
    """
    config = (config or AcquisitionConfig())._replace(**settings)
    config = config._replace(n_fantasies=int(config.n_fantasies))
    credible_quantiles(config.credible_level)  # fail early on a bad level
    fns = kernel_functions(
        grid,
        problem,
        allocator_solve=allocator_solve,
        obs_logpdf=obs_logpdf,
        sample_obs=sample_obs,
        knee_guard=config.knee_guard,
    )

    @jax.jit
    def score(
        key: jax.Array, latent: jax.Array, noise: jax.Array, observed: jax.Array, measured: jax.Array,
        level: LevelInputs | None = None,
    ) -> AcquisitionScores:
        inp = prepare_inputs(key, latent, noise, observed, measured, fns, config, level)
        return score_candidates(inp, fns, config)

    def select(scores: AcquisitionScores, cost_gpu_s: np.ndarray) -> int:
        return select_cell(
            scores, cost_gpu_s, cost_normalised=config.cost_normalised, tie_tolerance=config.tie_tolerance
        )

    return Acquisition(score=score, select=select, n_fantasies=config.n_fantasies, credible_level=config.credible_level)
