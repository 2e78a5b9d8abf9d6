"""What every strategy shares: the round's state, the interface, and the selection rule.

A strategy family is a module of this package exposing one builder per
strategy, ``build(ctx: StrategyContext) -> Select``, where ``Select`` maps the
round's :class:`RoundState` to the index of one *unmeasured* cell, or, at an
SLO-attainment level, of a measured cell in ``state.repeatable`` ("measure it
again", its next window) (the BoTorch way: one small interface, many
acquisition functions). A strategy that never repeats ignores
``state.repeatable``; :func:`pick` and :func:`unmeasured` keep it to unmeasured
cells. Randomness
comes only from ``state.rng`` / ``state.key``, which the loop derives from
(seed, round), so a campaign is reproducible and resumes exactly. Ties are
broken by lower expected profiling cost (``profiling_cost``: dollars over several
priced pools, GPU-seconds otherwise), then lower cell index. NumPy only: the CLI lists strategy names without importing JAX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import (
    Allocation,
    AllocationProblem,
    CellGrid,
    profiling_cost,
)
from fleetsieve_bayes.decision.certificate import Certificate
from fleetsieve_bayes.decision.intervals import DEFAULT_RULES, IntervalRules
from fleetsieve_bayes.numerics import SCORE_TIE

__all__ = [
    "RoundState",
    "Strategy",
    "StrategyContext",
    "Select",
    "TIE_TOLERANCE",
    "select_cell",
    "pick",
    "cheapest",
    "unmeasured",
    "repeat_candidates",
    "rng_of",
    "key_of",
]

# Scores within this (relative to max(1, |best|)) of the best are ties → cheaper cell
# (the rule's owner: fleetsieve_bayes.numerics).
TIE_TOLERANCE = SCORE_TIE


class RoundState(NamedTuple):
    """Everything a strategy may look at in one round.

    ``measured (n_cells,)`` bool; ``observed (n_cells, 4)`` (NaN rows for
    unmeasured cells); ``posterior`` an :class:`fleetsieve_bayes.model.inference.Posterior`
    (``latent (n_draws, n_cells, 4)``, ``noise (n_draws, 4)``); ``bounds``
    with ``lo``/``hi`` ``(n_cells, 4)``; ``key`` a JAX PRNG key. ``attempt``: the
    round's certification attempt (:class:`fleetsieve_bayes.decision.attempt.CertificationAttempt`)
    when the interval certificate closed but the attempt did not certify, else None.

    At an SLO-attainment level (else None): ``repeatable (n_cells,)`` bool, the
    measured cells that may be measured again now (below the campaign's
    ``max_windows_per_cell``, the backend has another window, not in flight);
    ``levels (n_cells,)`` each cell's attainment level; ``attainment`` every
    cell's :class:`fleetsieve_bayes.decision.bounds.Attainment` (the
    certificate's); ``repeat_hint``: the committed cell whose attainment
    straddles its level the most and that may be repeated (the cell the
    certificate needs another window of, like an unmeasured committed cell),
    None when there is none.
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
    key: Any
    attempt: Any = None
    repeatable: np.ndarray | None = None
    levels: np.ndarray | None = None
    attainment: Any = None
    repeat_hint: int | None = None


Select = Callable[[RoundState], int]


class Strategy(NamedTuple):
    name: str
    select: Select


class StrategyContext(NamedTuple):
    """What a builder knows before the first round: the campaign's fixed parts.

    ``seed`` only seeds a fallback generator for a state without
    ``rng``/``key``; ``n_fantasies`` sizes the acquisition kernel.
    """

    grid: CellGrid
    problem: AllocationProblem
    credible_level: float
    repeatability: float
    seed: int
    n_fantasies: int = 16
    rules: IntervalRules = DEFAULT_RULES


def select_cell(
    scores: Any,
    cost_gpu_s: np.ndarray,
    *,
    cost_normalised: bool = False,
    tie_tolerance: float = SCORE_TIE,
) -> int:
    """The next cell to measure.

    Args:
        scores: the acquisition kernel's output (its ``score`` field), or a
            plain ``(n_cells,)`` score array (−inf, e.g. for measured cells, is
            never selected).
        cost_gpu_s: ``(n_cells,)`` expected GPU-seconds of each cell.
        cost_normalised: rank by ``max(score, 0) / cost`` instead of score.
        tie_tolerance: scores within ``tie_tolerance·max(1, |best|)`` of the
            best are ties, broken by lower cost, then lower index (cost is a
            strict tie-breaker, not a divisor, unless ``cost_normalised``).

    Raises:
        ValueError: no unmeasured cell is left.
    """
    s = np.asarray(getattr(scores, "score", scores), dtype=np.float64)
    cost = np.asarray(cost_gpu_s, dtype=np.float64)
    valid = np.isfinite(s)
    if not valid.any():
        raise ValueError("no unmeasured cell left to select")
    if cost_normalised:
        s = np.where(valid, np.maximum(s, 0.0) / np.maximum(cost, 1e-12), -np.inf)
    best = s[valid].max()
    tie = valid & (s >= best - tie_tolerance * max(1.0, abs(best)))
    idx = np.flatnonzero(tie)
    return int(idx[np.lexsort((idx, cost[idx]))[0]])


def pick(score: np.ndarray, state: RoundState) -> int:
    """Argmax of ``score (n_cells,)`` over unmeasured cells, profiling cost then index breaking ties."""
    s = np.where(state.measured, -np.inf, np.nan_to_num(np.asarray(score, np.float64), nan=-np.inf))
    if not np.isfinite(s).any():  # nothing scored: the cheapest unmeasured cell
        s = np.where(state.measured, -np.inf, 0.0)
    return select_cell(s, profiling_cost(state.grid, state.problem), tie_tolerance=TIE_TOLERANCE)


def repeat_candidates(state: RoundState) -> np.ndarray:
    """``(n_cells,)`` bool: the measured cells this round may measure again (none at ``"point"``)."""
    if state.repeatable is None:
        return np.zeros(len(state.measured), bool)
    return np.asarray(state.repeatable, bool) & np.asarray(state.measured, bool)


def cheapest(cells: np.ndarray | list[int], grid: CellGrid, problem: AllocationProblem | None = None) -> int:
    """The cell of ``cells`` with the lowest expected profiling cost (then index):
    dollars when ``problem`` prices the grid's several pools, else GPU-seconds."""
    cells = np.asarray(cells, np.int64)
    return int(cells[np.lexsort((cells, profiling_cost(grid, problem)[cells]))[0]])


def unmeasured(state: RoundState, *, or_repeats: bool = False) -> np.ndarray:
    """Indices of the unmeasured cells (and, with ``or_repeats``, of the cells that
    may be measured again); raises ``ValueError`` when none is left."""
    open_ = ~np.asarray(state.measured, bool)
    if or_repeats:
        open_ |= repeat_candidates(state)
    idx = np.flatnonzero(open_)
    if idx.size == 0:
        raise ValueError("no unmeasured cell left to select")
    return idx


def rng_of(state: RoundState, seed: int) -> np.random.Generator:
    """The round's NumPy generator (a fallback seeded by ``(seed, round)``)."""
    return state.rng if state.rng is not None else np.random.default_rng([seed, state.round])


def key_of(state: RoundState, seed: int) -> Any:
    """The round's JAX key (a fallback folded from ``(seed, round)``)."""
    if state.key is not None:
        return state.key
    import jax

    return jax.random.fold_in(jax.random.PRNGKey(seed), state.round)
