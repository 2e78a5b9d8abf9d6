"""Acquisition that serves the joint check: expected reduction of the decision's
posterior expected regret.

When the interval gap is closed but the joint check
(:mod:`fleetsieve_bayes.decision.joint_check`) is not — some joint draws of
the posterior make the candidate allocation more than ε worse than their own
optimum — the gap-reduction score of :mod:`fleetsieve_bayes.decision.acquisition`
is ≈ 0 everywhere: no single interval endpoint moves the conservative or the
optimistic allocation. What is missing is a measurement that tells *which*
of the plausible tables holds. This module scores every unmeasured cell ``e``
by the expected value of measuring it for the decision (EVSI over a finite
set of actions), with the same fantasy machinery as the gap kernel:

* tables ``T_d`` (one per posterior draw) and their optima as in the joint
  check; the actions are the candidate allocation, the most frequent draw
  optima (up to ``max_actions``) and "no allocation" when some draw cannot
  meet the critical floors;
* the regret matrix ``R[a, d]`` of action ``a`` on ``T_d`` (scalar regret,
  as :func:`fleetsieve_bayes.evaluation.regret.scalar_regret`: 10 for a
  wrong critical-feasibility call, else ``max(0, r*−r) + max(0, (g*−g)/Σλ)``);
* fantasies of ``e``: its values in ``n_fantasies`` systematically sampled
  draws' tables (common to every candidate cell); each fantasy reweights
  the draws by its likelihood (:func:`fleetsieve_bayes.model.joint.obs_logpdf`,
  tempered by :func:`fleetsieve_bayes.decision.acquisition.importance_weights`
  when the ESS collapses), and the decision after it is the action of least
  reweighted expected regret;
* ``score(e) = min_a mean_d R[a, d] − E_f[min_a Σ_d w_f(d) R[a, d]]`` (≥ 0 up
  to Monte-Carlo error: what measuring ``e`` is expected to save).

The best cell is chosen by :func:`fleetsieve_bayes.decision.acquisition.select_cell`
(GPU-seconds break ties).

At an SLO-attainment level (``level``: :func:`level_regret_inputs`) a draw is
the curve *and* every cell's departure ``δ`` from it (the window-noise
posterior's, :func:`fleetsieve_bayes.model.joint.cell_offsets`), and a cell is
admissible in a draw's table when that draw's attainment is at its level (the
joint check's rule, :func:`fleetsieve_bayes.decision.intervals.level_tables`),
so the candidate allocation's regret counts the draws in which a committed
cell misses its level. "Measure cell X again" is then a candidate for every
cell of ``level.repeatable``: a fantasy window of X (the draw's curve times
its departure and one window's noise, log-normal on throughput and tails)
reweights the draws by its likelihood under each draw's curve and departure —
the exact update of the augmented draws, so X's attainment per draw needs no
recomputation — and it is scored by the same expected regret reduction. The
success window's burst mixture is not fantasised (a repeat is scored on what
its throughput and tails say).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.decision.acquisition import (
    DEFAULT_ESS_THRESHOLD,
    DEFAULT_MIN_EFFECTIVE_DRAWS,
    importance_weights,
    select_cell,
)
from fleetsieve_bayes.decision.intervals import level_tables
from fleetsieve_bayes.decision.joint_check import joint_tables
from fleetsieve_bayes.model.observation import obs_logpdf

__all__ = [
    "RegretScores",
    "Actions",
    "action_set",
    "LevelRegret",
    "level_regret_inputs",
    "regret_tables",
    "regret_scores",
    "expected_regret",
    "select_by_regret",
]

_CRITICAL_WEIGHT = 10.0


class Actions(NamedTuple):
    """The decisions the regret is taken over: ``A`` allocations (or "none")."""

    cell: np.ndarray  # int32 (A, n_classes): each class's cell, −1 for none
    replicas: np.ndarray  # int32 (A, n_classes)
    present: np.ndarray  # bool (A,): False for "no allocation"


class LevelRegret(NamedTuple):
    """What :func:`regret_scores` reads at an SLO-attainment level (:func:`level_regret_inputs`).

    Shapes: D draws, C cells. ``attainment (D, C)`` each draw's attainment (its own
    departure); ``levels (C,)``; ``limits (3, C)`` success floor, TTFT and
    completion limits of each cell's class; ``delta (D, C, 4)`` the draws'
    departures; ``window (D, C, 6)`` window noise; ``repeatable`` bool ``(C,)``:
    measured cells that may be measured again (scored as repeats).
    """

    attainment: jax.Array
    levels: jax.Array
    limits: jax.Array
    delta: jax.Array
    window: jax.Array
    repeatable: np.ndarray


def level_regret_inputs(
    posterior: Any, grid: CellGrid, problem: AllocationProblem, levels: np.ndarray, repeatable: np.ndarray,
    *, seed: int = 0, measured: np.ndarray | None = None, observed: np.ndarray | None = None,
) -> LevelRegret:
    """:class:`LevelRegret` of a window-noise posterior (``window`` and ``windows`` set):
    one departure per draw (key ``seed``) and the attainment it gives. ``measured (n_cells,)``
    bool and ``observed (n_cells, 4)``: a measured cell none of whose windows served
    attains 0 in every draw (as in :func:`~fleetsieve_bayes.decision.bounds.attainment_bounds`)."""
    from fleetsieve_bayes.model.data import served_nothing
    from fleetsieve_bayes.model.window_noise import cell_offsets, probabilities_given_offsets

    latent = jnp.asarray(posterior.latent)
    dt = latent.dtype
    window = jnp.asarray(posterior.window, dt)
    delta = cell_offsets(jax.random.PRNGKey(seed), latent, jnp.asarray(posterior.noise, dt), window, posterior.windows)
    w = grid.workload_idx
    limits = jnp.asarray(np.stack([problem.success_min[w], problem.ttft_max[w], problem.completion_max[w]]), dt)
    att = probabilities_given_offsets(latent, delta, window, limits[0], limits[1], limits[2]).prod(-1)
    if measured is not None and observed is not None:
        att = jnp.where(jnp.asarray(served_nothing(posterior.windows, measured, observed)), 0.0, att)
    return LevelRegret(att, jnp.asarray(levels, dt), limits, delta, window, np.asarray(repeatable, bool))


class RegretScores(NamedTuple):
    """Per-cell scores ``(n_cells,)`` (−inf for measured cells) and context."""

    score: np.ndarray
    expected_regret_now: float  # min over actions of the posterior expected regret
    n_actions: int
    ess_min: float  # min normalised (untempered) ESS over fantasies and cells
    actions: Actions | None = None  # the action set the scores were taken over


def action_set(
    cells: np.ndarray, reps: np.ndarray, feasible: np.ndarray, candidate: Allocation | None, max_actions: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The action set: ``candidate`` (when feasible), then the ``max_actions`` most frequent
    draw optima (``cells``, ``reps``: ``(D, K)``, a class given nothing at −1 / 0;
    ``feasible (D,)``), most frequent first, then "no allocation" when some draw cannot meet
    the critical floors. Returns ``cell (A, K)``, ``replicas (A, K)``, ``present (A,)``."""
    k = cells.shape[1]
    acts: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = []
    if candidate is not None and candidate.feasible:
        acts.append((tuple(int(c) for c in candidate.cell), tuple(int(r) for r in candidate.replicas), True))
    keys, counts = np.unique(np.concatenate([cells, reps], axis=1)[feasible], axis=0, return_counts=True)
    for j in np.argsort(-counts, kind="stable")[:max_actions]:
        a = (tuple(int(x) for x in keys[j, :k]), tuple(int(x) for x in keys[j, k:]), True)
        if a not in acts:
            acts.append(a)
    if (~feasible).any() or not acts:
        acts.append(((-1,) * k, (0,) * k, False))
    return (
        np.array([a[0] for a in acts], np.int32),
        np.array([a[1] for a in acts], np.int32),
        np.array([a[2] for a in acts], bool),
    )


def _regret_matrix(
    t: jax.Array, opt: Any, cell: jax.Array, reps: jax.Array, present: jax.Array, problem: AllocationProblem
) -> jax.Array:
    """``R (A, D)``: scalar regret of each action on each table ``t (D, C, 4)``."""
    dt = t.dtype
    lam = jnp.asarray(problem.demand, dt)
    floor = jnp.asarray(np.where(problem.critical, problem.floor, 0.0), dt)
    smin = jnp.asarray(problem.success_min, dt)
    tmax = jnp.asarray(problem.ttft_max, dt)
    cmax = jnp.asarray(problem.completion_max, dt)
    total = float(np.sum(problem.demand))

    def one(c: jax.Array, n: jax.Array, pres: jax.Array) -> jax.Array:
        has = (c >= 0) & (n > 0)
        v = t[:, jnp.maximum(c, 0), :]  # (D, K, 4)
        adm = (v[..., 3] >= smin - 1e-9) & (v[..., 1] <= tmax + 1e-9) & (v[..., 2] <= cmax + 1e-9) & (v[..., 0] > 0)
        served = jnp.where(has & adm, jnp.minimum(lam, n * v[..., 0]), 0.0)
        r = served / lam
        meets = jnp.all(r >= floor - 1e-6, axis=-1)
        dr = jnp.maximum(opt.min_fulfillment - jnp.min(r, axis=-1), 0.0)
        dg = jnp.maximum((opt.goodput - jnp.sum(served, axis=-1)) / total, 0.0)
        wrong_present = ~opt.feasible | ~meets
        reg_present = jnp.where(wrong_present, _CRITICAL_WEIGHT, dr + dg)
        reg_none = jnp.where(opt.feasible, _CRITICAL_WEIGHT, 0.0)
        return jnp.where(pres, reg_present, reg_none)

    return jax.vmap(one)(cell, reps, present)


def regret_tables(
    latent: np.ndarray, noise: np.ndarray, observed: np.ndarray, measured: np.ndarray, *, seed: int = 0
) -> jax.Array:
    """The per-draw tables the regret is taken on, ``(n_draws, n_cells, 4)``:
    :func:`fleetsieve_bayes.decision.joint_check.joint_tables` with measured cells
    at their measured values (non-finite entries made finite) and the others at
    the draw's posterior-predictive values.

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)``;
        observed: ``(n_cells, 4)`` (read where measured); measured: bool ``(n_cells,)``.
    """
    latent = jnp.asarray(latent)
    dt = latent.dtype
    m = np.asarray(measured, bool)
    obs = np.where(m[:, None], np.nan_to_num(np.asarray(observed, np.float64), nan=1.0, posinf=1e9), 1.0)
    t, _ = joint_tables(jax.random.PRNGKey(seed), latent, jnp.asarray(noise, dt), jnp.asarray(obs, dt), jnp.asarray(m))
    return t


def regret_scores(
    grid: CellGrid,
    problem: AllocationProblem,
    candidate: Allocation | None,
    latent: np.ndarray,
    noise: np.ndarray,
    observed: np.ndarray,
    measured: np.ndarray,
    *,
    seed: int = 0,
    n_fantasies: int = 32,
    max_actions: int = 16,
    solve: Any = None,
    level: LevelRegret | None = None,
) -> RegretScores:
    """Score every unmeasured cell (and, at a ``level``, every repeatable one) by the
    expected reduction of the posterior expected regret.

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)``;
        observed: ``(n_cells, 4)`` (read where measured); measured: bool ``(n_cells,)``.
        solve: batched allocator ``values (..., n_cells, 4) -> JaxAllocation``
            (default: :func:`fleetsieve_bayes.allocation.batched.make_jax_allocator`).
    """
    if solve is None:
        from fleetsieve_bayes.allocation.batched import make_jax_allocator

        solve = make_jax_allocator(grid, problem).solve
    latent = jnp.asarray(latent)
    noise = jnp.asarray(noise, latent.dtype)
    m = np.asarray(measured, bool)
    t = regret_tables(latent, noise, observed, m, seed=seed)
    if level is not None:  # admissible where the draw's attainment is at its level
        t_dec, _ = level_tables(t, t, level.attainment, level.attainment, level.levels, *level.limits)
    else:
        t_dec = t
    opt = solve(t_dec)
    cells = np.where(np.asarray(opt.replicas) > 0, np.asarray(opt.cell), -1)
    a_cell, a_reps, a_present = action_set(cells, np.asarray(opt.replicas), np.asarray(opt.feasible), candidate, max_actions)
    reg = _regret_matrix(t_dec, opt, jnp.asarray(a_cell), jnp.asarray(a_reps), jnp.asarray(a_present), problem)  # (A, D)
    n_draws = int(latent.shape[0])
    threshold = float(min(0.5, max(DEFAULT_ESS_THRESHOLD, DEFAULT_MIN_EFFECTIVE_DRAWS / n_draws)))
    d_f = jnp.asarray(((np.arange(n_fantasies) + 0.5) / n_fantasies * n_draws).astype(np.int32))
    scores, ess = _score_cells(t, latent, noise, reg, d_f, threshold)
    now = float(jnp.min(jnp.mean(reg, axis=1)))
    score = np.where(m, -np.inf, now - np.asarray(scores, np.float64))
    if level is not None and (level.repeatable & m).any():
        eps = jax.random.normal(jax.random.PRNGKey(seed + 1), (n_fantasies, 3), latent.dtype)
        rep, rep_ess = _score_repeats(latent, level.delta, level.window, reg, d_f, eps, threshold)
        again = level.repeatable & m
        score = np.where(again, now - np.asarray(rep, np.float64), score)
        ess = jnp.where(jnp.asarray(again), rep_ess, ess)
    return RegretScores(
        score=score,
        expected_regret_now=now,
        n_actions=int(a_cell.shape[0]),
        ess_min=float(np.min(np.where(np.isfinite(score), np.asarray(ess), 1.0))),
        actions=Actions(a_cell, a_reps, a_present),
    )


def expected_regret(
    grid: CellGrid,
    problem: AllocationProblem,
    actions: Actions,
    latent: np.ndarray,
    noise: np.ndarray,
    observed: np.ndarray,
    measured: np.ndarray,
    *,
    seed: int = 0,
    solve: Any = None,
) -> np.ndarray:
    """Posterior expected regret of each action, ``(A,)``, on a posterior's joint tables.

    What :func:`regret_scores` estimates *after* a fantasy measurement by
    reweighting today's draws, computed here on a posterior actually refitted
    with that measurement (``benchmarks/regret_score_accuracy.py`` compares the two).

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)``;
        observed: ``(n_cells, 4)`` (read where measured); measured: bool ``(n_cells,)``.
    """
    if solve is None:
        from fleetsieve_bayes.allocation.batched import make_jax_allocator

        solve = make_jax_allocator(grid, problem).solve
    t = regret_tables(latent, noise, observed, measured, seed=seed)
    reg = _regret_matrix(
        t, solve(t), jnp.asarray(actions.cell), jnp.asarray(actions.replicas), jnp.asarray(actions.present), problem
    )
    return np.asarray(jnp.mean(reg, axis=1), np.float64)


@partial(jax.jit, static_argnames=("threshold",))
def _score_cells(
    t: jax.Array, latent: jax.Array, noise: jax.Array, reg: jax.Array, d_f: jax.Array, threshold: float
) -> tuple[jax.Array, jax.Array]:
    """Per cell: ``E_f[min_a Σ_d w_f(d) R[a, d]]`` and the min ESS over fantasies; ``(n_cells,)`` each."""

    def one(e: jax.Array) -> tuple[jax.Array, jax.Array]:
        y = t[d_f, e]  # (F, 4): the cell's value in the fantasy draws' tables
        ll = obs_logpdf(y[:, None, :], latent[None, :, e, :], noise[None])  # (F, D)
        w, ess, _ = importance_weights(ll, threshold)
        exp_reg = w @ reg.T  # (F, A)
        return jnp.mean(jnp.min(exp_reg, axis=-1)), jnp.min(ess)

    return jax.lax.map(one, jnp.arange(t.shape[1]))


@partial(jax.jit, static_argnames=("threshold",))
def _score_repeats(
    latent: jax.Array, delta: jax.Array, window: jax.Array, reg: jax.Array, d_f: jax.Array, eps: jax.Array,
    threshold: float,
) -> tuple[jax.Array, jax.Array]:
    """Per cell, measured once more: ``E_f[min_a Σ_d w_f(d) R[a, d]]`` and the min ESS,
    ``(n_cells,)`` each. Fantasy ``f``'s log window is draw ``d_f``'s curve plus its
    departure plus window noise (``eps (F, 3)``); its likelihood under draw ``d`` the
    normal of draw ``d``'s."""

    def one(e: jax.Array) -> tuple[jax.Array, jax.Array]:
        mu = jnp.log(jnp.maximum(latent[:, e, :3], 1e-12)) + delta[:, e, :3]  # (D, 3)
        sd = jnp.maximum(window[:, e, :3], 1e-6)
        y = mu[d_f] + sd[d_f] * eps  # (F, 3)
        ll = jax.scipy.stats.norm.logpdf(y[:, None, :], mu[None], sd[None]).sum(-1)  # (F, D)
        w, ess, _ = importance_weights(ll, threshold)
        return jnp.mean(jnp.min(w @ reg.T, axis=-1)), jnp.min(ess)

    return jax.lax.map(one, jnp.arange(latent.shape[1]))


def select_by_regret(scores: RegretScores, cost_gpu_s: np.ndarray, *, min_score: float = 1e-4) -> int | None:
    """The cell of largest expected regret reduction (ties → fewer GPU-seconds), or None
    when no cell is expected to reduce it by at least ``min_score``."""
    s = np.asarray(scores.score, np.float64)
    if not np.isfinite(s).any() or np.nanmax(np.where(np.isfinite(s), s, -np.inf)) < min_score:
        return None
    return select_cell(s, cost_gpu_s, tie_tolerance=1e-3)
