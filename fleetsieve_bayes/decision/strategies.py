"""The strategy seam: which unmeasured cell to measure next.

Every strategy sees the same :class:`RoundState` (shared initial design,
model, bounds, allocator and stopping rule all live in the campaign loop) and
returns the index of one *unmeasured* cell. Randomness comes only from
``state.rng`` / ``state.key``, which the loop derives from (seed, round), so
a campaign is reproducible and resumes exactly. Ties are broken by lower
expected GPU-seconds (``grid.cost_gpu_s``), then lower cell index.

Strategies (the paper's Appendix B):

- ``fleetsieve``: when the certificate's gap is already within ε (no
  critical disagreement, both continuous stages ≤ ε) but A⁻ commits to
  unmeasured cells, measure the cheapest of those; otherwise the argmax of
  the acquisition kernel's expected gap reduction
  (:mod:`fleetsieve_bayes.decision.acquisition`), GPU-seconds as strict tie-breaker.
  If no cell can reduce the gap (all scores ≈ 0) and A⁻ still commits to
  unmeasured cells, those are measured first (the certificate needs them).
- ``random``: uniform over unmeasured cells.
- ``grid``: a fixed order — workload (campaign order), then TP ascending,
  then load ascending (offered rate, then label); the first unmeasured cell.
- ``max-uncertainty``: the widest joint credible interval of the shared model
  (sum over metrics of the interval width on the modelling scale: log for
  throughput and tails, log failure rate for success), no decision impact.
- ``shared-uncertainty``: max predictive std of an RBF Gaussian process over
  (class, log2 TP, log load) fitted to the measured cells
  (:func:`fleetsieve_bayes.decision.surrogates.gp_predictive_std`).
- ``targeted``: targeted active learning on the current decision. From the
  posterior draws, ``p_best(c)`` = share of draws whose own optimal
  allocation (JAX allocator per draw) uses cell c, and ``p_adm(c)`` = share
  of draws in which c is admissible; score = ``p_best(1−p_best)`` +
  ``p_adm(1−p_adm)`` for cells A⁻ or A⁺ commit to — the Bernoulli variance
  of the decision variables. Falls back to ``max-uncertainty`` when every
  score is 0.
- ``voi``: value of information — the expected improvement of the
  conservative objective (``10·feasible + min fulfillment + goodput/Σλ``)
  over the kernel's fantasies, divided by the cell's GPU-seconds; when no
  cell improves it, the cost-normalised expected gap reduction.
- ``constrained-bo``: independent per-cell Gaussians (no sharing,
  :func:`fleetsieve_bayes.decision.surrogates.independent_arms`); expected
  improvement of per-GPU throughput over the class's best measured admissible
  cell (in units of the class's demand per GPU, λ_i/G) times the probability
  that the cell meets its SLO.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import ndtr

from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid, admissible
from fleetsieve_bayes.decision.acquisition import make_acquisition, select_cell
from fleetsieve_bayes.decision.certificate import Certificate
from fleetsieve_bayes.decision.design import STRATEGY_NAMES
from fleetsieve_bayes.decision.surrogates import gp_predictive_std, independent_arms, transform
from fleetsieve_bayes.errors import InputError

__all__ = [
    "STRATEGY_NAMES",
    "RoundState",
    "Strategy",
    "make_strategy",
    "grid_order",
    "interval_widths",
]


# Scores within this (relative to max(1, |best|)) of the best are ties → cheaper cell.
TIE_TOLERANCE = 1e-6
# Draws used by `targeted` for per-draw allocations (evenly thinned).
_TARGETED_MAX_DRAWS = 256


class RoundState(NamedTuple):
    """Everything a strategy may look at in one round.

    ``measured (n_cells,)`` bool; ``observed (n_cells, 4)`` (NaN rows for
    unmeasured cells); ``posterior`` an :class:`fleetsieve_bayes.model.inference.Posterior`
    (``latent (n_draws, n_cells, 4)``, ``noise (n_draws, 4)``); ``bounds``
    with ``lo``/``hi`` ``(n_cells, 4)``.
    """

    grid: CellGrid
    problem: AllocationProblem
    campaign_epsilon: float
    credible_level: float
    repeatability: float
    measured: np.ndarray
    observed: np.ndarray
    posterior: Any
    bounds: Any
    conservative: Allocation
    optimistic: Allocation
    certificate: Certificate
    round: int
    rng: np.random.Generator
    key: jax.Array


class Strategy(NamedTuple):
    name: str
    select: Callable[[RoundState], int]


def _pick(score: np.ndarray, state: RoundState) -> int:
    """Argmax over unmeasured cells, GPU-seconds then index breaking ties."""
    s = np.where(state.measured, -np.inf, np.nan_to_num(np.asarray(score, np.float64), nan=-np.inf))
    if not np.isfinite(s).any():  # nothing scored: the cheapest unmeasured cell
        s = np.where(state.measured, -np.inf, 0.0)
    return select_cell(s, state.grid.cost_gpu_s, tie_tolerance=TIE_TOLERANCE)


def _cheapest(cells: np.ndarray | list[int], grid: CellGrid) -> int:
    cells = np.asarray(cells, np.int64)
    return int(cells[np.lexsort((cells, grid.cost_gpu_s[cells]))[0]])


def _unmeasured(state: RoundState) -> np.ndarray:
    idx = np.flatnonzero(~np.asarray(state.measured, bool))
    if idx.size == 0:
        raise ValueError("no unmeasured cell left to select")
    return idx


def grid_order(grid: CellGrid) -> np.ndarray:
    """The ``grid`` strategy's fixed order: workload, TP ascending, offered load ascending, label; ``(n_cells,)``."""
    labels = np.asarray(grid.load, dtype=object)
    label_rank = np.unique(labels, return_inverse=True)[1]
    return np.lexsort((np.arange(grid.n_cells), label_rank, grid.offered_rps, grid.tp, grid.workload_idx))


def interval_widths(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Joint interval width per cell, ``(n_cells,)``, from ``lo``/``hi`` ``(n_cells, 4)``.

    Sum over metrics of the width on the modelling scale: log for throughput
    and the tails, log failure rate ``log(1 − s)`` for success.
    """
    clip = lambda v: np.clip(np.nan_to_num(np.asarray(v, np.float64), nan=1.0, posinf=1e9), 1e-9, 1e9)  # noqa: E731
    lo, hi = clip(lo), clip(hi)
    w = np.abs(np.log(hi[:, :3]) - np.log(lo[:, :3])).sum(axis=1)
    f_lo, f_hi = np.clip(1.0 - lo[:, 3], 1e-4, 1.0), np.clip(1.0 - hi[:, 3], 1e-4, 1.0)
    return w + np.abs(np.log(f_lo) - np.log(f_hi))


def _bounds_lo_hi(state: RoundState) -> tuple[np.ndarray, np.ndarray]:
    if state.bounds is not None:
        return np.asarray(state.bounds.lo), np.asarray(state.bounds.hi)
    lat = np.asarray(state.posterior.latent, np.float64)
    a = (1.0 - state.credible_level) / 2.0
    return np.quantile(lat, a, axis=0), np.quantile(lat, 1.0 - a, axis=0)


def _committed(alloc: Allocation) -> list[int]:
    return [int(c) for c, n in zip(alloc.cell, alloc.replicas, strict=True) if c >= 0 and n > 0]


_ACQ_CACHE: list[tuple[CellGrid, AllocationProblem, tuple[Any, ...], Any]] = []


EXACT_MAX_CELLS = 64
RELATED_CELLS = 16


def _shared_acquisition(
    grid: CellGrid, problem: AllocationProblem, n_fantasies: int, credible_level: float, repeatability: float
) -> Any:
    """One acquisition kernel per (grid, problem, settings) object, built lazily.

    Only fleetsieve and voi pay for the kernel's compile, and strategies run
    back to back on one campaign (benchmarks) share it.
    """
    settings = (n_fantasies, credible_level, repeatability)
    for g, p, s, acq in _ACQ_CACHE:
        if g is grid and p is problem and s == settings:
            return acq
    # Exact (every cell's interval recomputed per fantasy) up to EXACT_MAX_CELLS;
    # beyond, the kernel reweights only the most correlated cells so its cost
    # grows linearly, not quadratically, in the number of candidates.
    n_related = None if grid.n_cells <= EXACT_MAX_CELLS else RELATED_CELLS
    acq = make_acquisition(
        grid,
        problem,
        n_fantasies=n_fantasies,
        credible_level=credible_level,
        repeatability=repeatability,
        n_related=n_related,
    )
    _ACQ_CACHE.append((grid, problem, settings, acq))
    del _ACQ_CACHE[:-4]  # keep a few; each holds a compiled kernel
    return acq


def make_strategy(
    name: str,
    grid: CellGrid,
    problem: AllocationProblem,
    *,
    credible_level: float,
    repeatability: float,
    seed: int,
    n_fantasies: int = 16,
) -> Strategy:
    """The named strategy for one campaign (see the module docstring).

    ``seed`` only seeds a fallback generator for a state without
    ``rng``/``key``; the loop's per-round ``state.rng``/``state.key`` are used
    otherwise.

    Raises:
        InputError: unknown ``name`` (the message lists the known names).
    """
    if name not in STRATEGY_NAMES:
        raise InputError(f"--strategy: unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}")
    cost = grid.cost_gpu_s

    def rng_of(state: RoundState) -> np.random.Generator:
        return state.rng if state.rng is not None else np.random.default_rng([seed, state.round])

    def key_of(state: RoundState) -> jax.Array:
        return state.key if state.key is not None else jax.random.fold_in(jax.random.PRNGKey(seed), state.round)

    def acquisition() -> Any:
        return _shared_acquisition(grid, problem, n_fantasies, credible_level, repeatability)

    def run_kernel(state: RoundState) -> Any:
        observed = np.where(state.measured[:, None], np.nan_to_num(state.observed, nan=1.0), 1.0)
        return acquisition().score(
            key_of(state),
            jnp.asarray(state.posterior.latent),
            jnp.asarray(state.posterior.noise),
            jnp.asarray(observed, jnp.asarray(state.posterior.latent).dtype),
            jnp.asarray(state.measured, bool),
        )

    def fleetsieve(state: RoundState) -> int:
        _unmeasured(state)
        eps = state.campaign_epsilon
        gap = state.certificate.gap
        pending = [c for c in state.certificate.unmeasured_committed if not state.measured[c]]
        within = float(gap.critical) == 0.0 and float(gap.min_fulfillment) <= eps and float(gap.goodput) <= eps
        if within and pending:
            return _cheapest(pending, grid)
        scores = run_kernel(state)
        s = np.asarray(scores.score, np.float64)
        if pending and np.nanmax(np.where(np.isfinite(s), s, np.nan)) <= TIE_TOLERANCE:
            return _cheapest(pending, grid)
        return _pick(s, state)

    def random(state: RoundState) -> int:
        return int(rng_of(state).choice(_unmeasured(state)))

    order = grid_order(grid)

    def grid_strategy(state: RoundState) -> int:
        _unmeasured(state)
        return int(next(c for c in order if not state.measured[c]))

    def max_uncertainty(state: RoundState) -> int:
        _unmeasured(state)
        return _pick(interval_widths(*_bounds_lo_hi(state)), state)

    def shared_uncertainty(state: RoundState) -> int:
        _unmeasured(state)
        observed = np.where(state.measured[:, None], np.nan_to_num(state.observed, nan=1.0, posinf=1e9), 1.0)
        return _pick(gp_predictive_std(grid, observed, np.asarray(state.measured, bool)), state)

    alloc_cache: dict[str, Any] = {}

    def targeted(state: RoundState) -> int:
        _unmeasured(state)
        if "solve" not in alloc_cache:
            from fleetsieve_bayes.allocation.batched import make_jax_allocator

            alloc_cache["solve"] = make_jax_allocator(grid, problem).solve
        lat = np.asarray(state.posterior.latent)
        step = max(1, -(-lat.shape[0] // _TARGETED_MAX_DRAWS))
        lat = lat[::step]
        # Measured cells are known: every draw sees their measured values.
        obs = np.where(state.measured[:, None], np.nan_to_num(state.observed, nan=1.0), 0.0)
        lat = np.where(state.measured[None, :, None], obs[None].astype(lat.dtype), lat)
        out = alloc_cache["solve"](jnp.asarray(lat))
        cells = np.asarray(out.cell)  # (D, n_classes)
        reps = np.asarray(out.replicas)
        used = np.zeros((lat.shape[0], grid.n_cells))
        rows = np.repeat(np.arange(lat.shape[0])[:, None], cells.shape[1], axis=1)
        ok = (cells >= 0) & (reps > 0)
        used[rows[ok], cells[ok]] = 1.0
        p_best = used.mean(axis=0)
        p_adm = admissible(grid, lat.astype(np.float64), problem).mean(axis=0)
        decision = np.zeros(grid.n_cells, bool)
        decision[_committed(state.conservative) + _committed(state.optimistic)] = True
        score = p_best * (1.0 - p_best) + decision * p_adm * (1.0 - p_adm)
        if np.max(np.where(state.measured, 0.0, score)) <= 0.0:
            return max_uncertainty(state)
        return _pick(score, state)

    def voi(state: RoundState) -> int:
        _unmeasured(state)
        scores = run_kernel(state)
        gain = np.asarray(scores.expected_conservative, np.float64) - float(scores.conservative_now)
        value = np.maximum(np.nan_to_num(gain, nan=0.0), 0.0) / np.maximum(cost, 1e-12)
        if np.max(np.where(state.measured, 0.0, value)) <= 1e-12:
            red = np.maximum(np.nan_to_num(np.asarray(scores.score, np.float64), neginf=0.0), 0.0)
            value = red / np.maximum(cost, 1e-12)
        return _pick(value, state)

    def constrained_bo(state: RoundState) -> int:
        _unmeasured(state)
        measured = np.asarray(state.measured, bool)
        observed = np.where(measured[:, None], np.nan_to_num(state.observed, nan=1.0, posinf=1e9), 1.0)
        arms = independent_arms(grid, observed, measured)
        w = grid.workload_idx
        log_tp = np.log(grid.tp.astype(np.float64))
        # Incumbent: best measured admissible per-GPU throughput of each class.
        adm = admissible(grid, observed, problem) & measured
        per_gpu = observed[:, 0] / grid.tp
        best = np.zeros(grid.n_classes)
        for k in range(grid.n_classes):
            sel = adm & (w == k)
            best[k] = per_gpu[sel].max() if sel.any() else 0.0
        mu, sd = arms.mean[:, 0] - log_tp, arms.sd[:, 0]
        b = best[w]
        with np.errstate(divide="ignore"):
            log_b = np.log(np.maximum(b, 1e-300))
        ei_pos = np.exp(mu + sd**2 / 2) * ndtr((mu + sd**2 - log_b) / sd) - b * ndtr((mu - log_b) / sd)
        ei = np.where(b > 0, ei_pos, np.exp(mu + sd**2 / 2))
        ei = ei / (problem.demand[w] / max(problem.gpus, 1))
        limits = transform(np.stack([np.ones(grid.n_cells), problem.ttft_max[w], problem.completion_max[w], problem.success_min[w]], axis=1))
        z_lim = np.where(np.isfinite(np.stack([problem.ttft_max[w], problem.completion_max[w]], 1)), limits[:, 1:3], np.inf)
        p_tails = ndtr((z_lim - arms.mean[:, 1:3]) / arms.sd[:, 1:3]).prod(axis=1)
        p_succ = ndtr((arms.mean[:, 3] - limits[:, 3]) / arms.sd[:, 3])
        return _pick(np.maximum(ei, 0.0) * p_tails * p_succ, state)

    table: dict[str, Callable[[RoundState], int]] = {
        "fleetsieve": fleetsieve,
        "random": random,
        "grid": grid_strategy,
        "max-uncertainty": max_uncertainty,
        "shared-uncertainty": shared_uncertainty,
        "targeted": targeted,
        "voi": voi,
        "constrained-bo": constrained_bo,
    }
    return Strategy(name=name, select=table[name])
