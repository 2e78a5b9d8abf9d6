"""Strategies that read the acquisition kernel: ``fleetsieve`` and ``voi``.

- ``fleetsieve``: when the certificate's gap is already within ε (no
  critical disagreement, both continuous stages ≤ ε) but A⁻ commits to
  unmeasured cells, measure the cheapest of those; otherwise the argmax of
  the acquisition kernel's expected gap reduction
  (:mod:`fleetsieve_bayes.decision.acquisition`), profiling cost as strict
  tie-breaker (``profiling_cost``: dollars over several priced pools, where a
  cell on a cheaper GPU type costs less, else GPU-seconds). If no cell can reduce the gap (all scores ≈ 0) and A⁻ still
  commits to unmeasured cells, those are measured first (the certificate
  needs them). Over several GPU pools, when no cell can reduce the gap and A⁻
  commits only to measured cells, the cheapest cell A⁺ commits to and no one
  has measured (:func:`optimistic_unmeasured`).
  After a certification attempt that closed the interval gap but not the
  joint check, the cell expected to reduce the decision's posterior regret
  most (:func:`regret_fallback`; :mod:`fleetsieve_bayes.decision.regret_acquisition`).
  At an SLO-attainment level "measure cell X again" is a candidate next to
  every unmeasured cell, for each cell of ``state.repeatable``: the kernel
  scores it by the same expected gap reduction (a fantasised window of the
  cell narrows its attainment interval through the window-noise posterior),
  the regret fallback by the same expected regret reduction; a repeat is
  chosen only where that value is positive (it can change or secure the
  decision), or, when no candidate has any, where the certificate needs it
  (``state.repeat_hint``: a committed cell whose attainment straddles its
  level, as unmeasured committed cells are measured first).
- ``voi``: value of information — the expected improvement of the
  conservative objective (:func:`fleetsieve_bayes.allocation.objective.objective_value`)
  over the kernel's fantasies, divided by the cell's profiling cost; when no
  cell improves it, the cost-normalised expected gap reduction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetsieve_bayes.allocation.objective import gap_within
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid, profiling_cost
from fleetsieve_bayes.decision.intervals import DEFAULT_RULES, IntervalRules
from fleetsieve_bayes.decision.strategies.base import (
    TIE_TOLERANCE,
    RoundState,
    Select,
    StrategyContext,
    cheapest,
    key_of,
    pick,
    repeat_candidates,
    select_cell,
    unmeasured,
)
from fleetsieve_bayes.jax_cache import on_release
from fleetsieve_bayes.seeds import round_seed

__all__ = [
    "shared_acquisition",
    "run_kernel",
    "regret_fallback",
    "optimistic_unmeasured",
    "build_fleetsieve",
    "build_voi",
    "kernel_level",
    "pick_or_repeat",
    "worth_a_window",
    "EXACT_MAX_CELLS",
    "RELATED_CELLS",
]

# Exact (every cell's interval recomputed per fantasy) up to EXACT_MAX_CELLS;
# beyond, the kernel reweights only the RELATED_CELLS most correlated cells so
# its cost grows linearly, not quadratically, in the number of candidates.
EXACT_MAX_CELLS = 64
RELATED_CELLS = 16

_ACQ_CACHE: list[tuple[CellGrid, AllocationProblem, tuple[Any, ...], Any]] = []


@on_release
def _drop_kernels() -> None:
    """Forget the built acquisition kernels (:func:`fleetsieve_bayes.jax_cache.release_compiled`)."""
    _ACQ_CACHE.clear()


def shared_acquisition(
    grid: CellGrid,
    problem: AllocationProblem,
    n_fantasies: int,
    credible_level: float,
    repeatability: float,
    rules: IntervalRules = DEFAULT_RULES,
) -> Any:
    """One acquisition kernel per (grid, problem, settings) object, built lazily.

    Only fleetsieve and voi pay for the kernel's compile, and strategies run
    back to back on one campaign (benchmarks) share it.
    """
    from fleetsieve_bayes.decision.acquisition import AcquisitionConfig, make_acquisition

    settings = (n_fantasies, credible_level, repeatability, rules)
    for g, p, s, acq in _ACQ_CACHE:
        if g is grid and p is problem and s == settings:
            return acq
    config = AcquisitionConfig(
        n_fantasies=n_fantasies,
        credible_level=credible_level,
        repeatability=repeatability,
        model_margin=rules.tail_margin,
        success_margin=rules.success_margin,
        knee_guard=rules.knee_guard,
        n_related=None if grid.n_cells <= EXACT_MAX_CELLS else RELATED_CELLS,
    )
    acq = make_acquisition(grid, problem, config)
    _ACQ_CACHE.append((grid, problem, settings, acq))
    del _ACQ_CACHE[:-4]  # keep a few; each holds a compiled kernel
    return acq


def run_kernel(ctx: StrategyContext, state: RoundState) -> Any:
    """The kernel's :class:`~fleetsieve_bayes.decision.acquisition.AcquisitionScores` for this round."""
    import jax.numpy as jnp

    acq = shared_acquisition(
        ctx.grid,
        ctx.problem,
        ctx.n_fantasies,
        ctx.credible_level,
        ctx.repeatability,
        ctx.rules,
    )
    observed = np.where(state.measured[:, None], np.nan_to_num(state.observed, nan=1.0), 1.0)
    latent = jnp.asarray(state.posterior.latent)
    args = (
        key_of(state, ctx.seed),
        latent,
        jnp.asarray(state.posterior.noise),
        jnp.asarray(observed, latent.dtype),
        jnp.asarray(state.measured, bool),
    )
    level = kernel_level(ctx, state)
    return acq.score(*args) if level is None else acq.score(*args, level)


def kernel_level(ctx: StrategyContext, state: RoundState) -> Any:
    """The kernel's :class:`~fleetsieve_bayes.decision.acquisition.LevelInputs` at an
    SLO-attainment level (None at ``"point"``, or on a posterior without windows)."""
    if state.levels is None or state.attainment is None or getattr(state.posterior, "window", None) is None:
        return None
    from fleetsieve_bayes.decision.acquisition import level_inputs

    return level_inputs(
        state.posterior, state.attainment, ctx.grid, state.problem, state.levels, repeat_candidates(state)
    )


def pick_or_repeat(score: np.ndarray, state: RoundState) -> int:
    """The next cell on ``score (n_cells,)``: the argmax over the unmeasured cells
    (profiling cost then index breaking ties), unless another window of a measured cell
    is worth more per GPU-second (:func:`worth_a_window`). When no candidate's score is
    positive: ``state.repeat_hint`` (the window the certificate needs) if there is one,
    else the cheapest unmeasured cell, else the best-scored repeat.

    Raises:
        ValueError: no unmeasured cell and no repeat to make.
    """
    s = np.nan_to_num(np.asarray(score, np.float64), nan=-np.inf)
    cost = profiling_cost(state.grid, state.problem)
    rep = repeat_candidates(state) & (s > TIE_TOLERANCE)
    new = np.where(~state.measured, s, -np.inf)
    hint = state.repeat_hint
    if hint is not None and repeat_candidates(state)[hint] and not rep.any() and np.max(new, initial=-np.inf) <= TIE_TOLERANCE:
        return int(hint)  # nothing is expected to help: the window the certificate needs
    best_new = None
    if np.isfinite(new).any():
        best_new = select_cell(new, cost, tie_tolerance=TIE_TOLERANCE)
    elif (~state.measured).any():  # nothing scored: the cheapest unmeasured cell
        best_new = pick(np.zeros(len(s)), state)
    window = worth_a_window(s, cost, rep, best_new)
    if window is not None:
        return window
    if best_new is not None:
        return best_new
    # Only repeats none of which is expected to help (a pool whose hinted cell is in flight):
    # the best-scored one.
    rest = np.where(repeat_candidates(state), np.nan_to_num(np.asarray(score, np.float64), nan=-1e300), -np.inf)
    return select_cell(rest, cost, tie_tolerance=TIE_TOLERANCE)


def worth_a_window(score: np.ndarray, cost: np.ndarray, repeats: np.ndarray, best_new: int | None) -> int | None:
    """The window rule: the repeat (of ``repeats (n_cells,)`` bool, each with a positive
    ``score``) whose expected effect on the decision per GPU-second is the highest, if
    it beats ``best_new``'s (the best unmeasured cell; None: no unmeasured cell); else None.

    ``score (n_cells,)`` expected gap reductions and ``cost (n_cells,)`` profiling costs.
    Values are compared in score units at the new cell's cost (``score · cost_new / cost``),
    so :data:`TIE_TOLERANCE` stays the tie rule: the repeat must beat the new cell by more
    than it (a tie goes to the new cell, which also teaches its neighbours), and among
    repeats lower cost then index break ties. A repeat whose own score is a tie with
    nothing (≤ the tolerance) is never worth its window here."""
    if not np.any(repeats):
        return None
    ref = float(cost[best_new]) if best_new is not None else float(np.min(cost[repeats]))
    per = np.full(len(score), -np.inf)
    per[repeats] = score[repeats] * (ref / np.maximum(cost[repeats], 1e-12))
    r = select_cell(per, cost, tie_tolerance=TIE_TOLERANCE)
    if best_new is None:
        return r
    bar = float(score[best_new])
    return r if per[r] > bar + TIE_TOLERANCE * max(1.0, abs(bar)) else None


def regret_fallback(ctx: StrategyContext, state: RoundState) -> int | None:
    """When the round's certification attempt closed the interval gap but not the joint
    check (or convergence): the cell expected to reduce the decision's posterior regret
    most, on the attempt's converged draws (None: no cell reduces it enough)."""
    attempt = state.attempt
    if attempt is None or not attempt.gap_closed:
        return None
    from fleetsieve_bayes.decision.regret_acquisition import (
        level_regret_inputs,
        regret_scores,
        select_by_regret,
    )

    level = None
    if state.levels is not None and getattr(attempt.posterior, "window", None) is not None:
        # At a level: admissibility by each draw's attainment; repeats are candidates.
        level = level_regret_inputs(
            attempt.posterior, ctx.grid, state.problem, state.levels, repeat_candidates(state),
            seed=round_seed(ctx.seed, state.round) + 3, measured=state.measured, observed=state.observed,
        )
    scores = regret_scores(
        ctx.grid,
        state.problem,
        state.conservative,
        attempt.posterior.latent,
        attempt.posterior.noise,
        state.observed,
        state.measured,
        seed=round_seed(ctx.seed, state.round) + 2,
        level=level,
    )
    return select_by_regret(scores, profiling_cost(ctx.grid, state.problem))


def build_fleetsieve(ctx: StrategyContext) -> Select:
    def select(state: RoundState) -> int:
        unmeasured(state, or_repeats=True)
        fallback = regret_fallback(ctx, state)
        if fallback is not None:
            return fallback
        pending = [c for c in state.certificate.unmeasured_committed if not state.measured[c]]
        if pending and gap_within(state.certificate.gap, state.campaign_epsilon):
            return cheapest(pending, ctx.grid, state.problem)
        s = np.asarray(run_kernel(ctx, state).score, np.float64)
        if pending and np.nanmax(np.where(np.isfinite(s), s, np.nan)) <= TIE_TOLERANCE:
            return cheapest(pending, ctx.grid, state.problem)
        if ctx.grid.n_pools > 1 and not np.any(np.nan_to_num(s, nan=-np.inf) > TIE_TOLERANCE):
            hoped = optimistic_unmeasured(state)
            hint = state.repeat_hint
            if hoped and (hint is None or not repeat_candidates(state)[hint]):
                return cheapest(hoped, ctx.grid, state.problem)
        return pick_or_repeat(s, state)

    return select


def optimistic_unmeasured(state: RoundState) -> list[int]:
    """The unmeasured cells the optimistic allocation commits to (its hopes).

    Over several GPU pools, when no single cell is expected to reduce the gap
    (every kernel score 0: the optimistic side rests on several hopes, any one
    of which, if it fails, another replaces), the ``fleetsieve`` strategy
    measures the cheapest of these, not the cheapest cell of the grid: the
    cheapest cell is a slow type's TP1, and measuring the grid cheapest-first
    sweeps cells no allocation wants (docs/results.md, "Several GPU types").
    """
    opt = state.optimistic
    if opt is None or not opt.feasible:
        return []
    return [int(c) for c in opt.committed() if not state.measured[c]]


def build_voi(ctx: StrategyContext) -> Select:
    def select(state: RoundState) -> int:
        unmeasured(state)
        cost = profiling_cost(state.grid, state.problem)
        scores = run_kernel(ctx, state)
        gain = np.asarray(scores.expected_conservative, np.float64) - float(scores.conservative_now)
        value = np.maximum(np.nan_to_num(gain, nan=0.0), 0.0) / np.maximum(cost, 1e-12)
        if np.max(np.where(state.measured, 0.0, value)) <= 1e-12:
            red = np.maximum(np.nan_to_num(np.asarray(scores.score, np.float64), neginf=0.0), 0.0)
            value = red / np.maximum(cost, 1e-12)
        return pick(value, state)

    return select
