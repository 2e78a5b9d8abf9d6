"""Batch acquisition: which cells to start while others are still being measured.

Method ("believer" conditioning, the kriging-believer heuristic of batch
Bayesian optimisation applied to the whole decision state). Cells in flight
are treated as if they had already been measured at their posterior-median
values: their bounds collapse there, the conservative and optimistic tables
are re-allocated, the certificate is re-evaluated, and the unchanged strategy
runs on that *believed* state. The strategy's pick is added to the believed
set and the step repeats while GPUs are free. Because each pick is conditioned
on the ones before it, a batch asks different questions instead of the same
one several times, and it works with every strategy, since each one only sees
a :class:`~fleetsieve_bayes.decision.strategies.RoundState`.

Stopping rule of a batch: a cell is never started when the certificate could
already be issued without it. If the believed state certifies (feasible or
infeasible), nothing more is started: the in-flight cells are awaited, and the
real posterior decides once they are in.

Approximation (stated, not hidden): the posterior is *not* refitted on the
fantasised values. Believed cells are collapsed to a single value (the median
of each metric's marginal, not a joint draw), which ignores the spread of
their outcome; the acquisition kernel then conditions the other cells on them
through its importance reweighting of the posterior draws, as it does for real
measurements. Medians are the least committal single guess, and an in-flight
cell's real value replaces its belief as soon as it finishes (asynchronous
refit and refill: one completion, one refit, one refill).

Packing (which picks can start now) is the caller's ``admit(cell, reserved)``
callback: a pick that does not fit the free GPUs becomes the *reservation*
(it waits for GPUs and is believed meanwhile, so later picks condition on it);
later picks start only if ``admit`` lets them fill the gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    Certificate,
    certify,
)
from fleetsieve_bayes.settings import DecisionSettings

__all__ = ["Belief", "Pick", "BatchPlan", "believed_values", "believe", "plan_batch"]


class Belief(NamedTuple):
    """The decision state with some cells believed measured.

    ``measured (n_cells,)`` bool (real ∪ believed); ``observed (n_cells, 4)``
    (believed rows at their posterior medians); ``bounds`` with ``lo``/``hi``
    ``(n_cells, 4)``; both allocations and the certificate on that state.
    """

    measured: np.ndarray
    observed: np.ndarray
    bounds: Any
    conservative: Allocation
    optimistic: Allocation
    certificate: Certificate


class Pick(NamedTuple):
    """One strategy pick within a batch, with the believed state it was made on."""

    cell: int
    round: int
    start: bool  # started now (else: the reservation, waiting for GPUs)
    believed: tuple[int, ...]  # cells believed measured when it was picked
    certificate: Certificate  # the believed state's certificate
    seconds: float  # believe + select


class BatchPlan(NamedTuple):
    """What one planning step decided."""

    picks: tuple[Pick, ...]
    reserved: int | None  # a pick waiting for GPUs
    stop: str  # why picking stopped (one line)
    believed_certificate: Certificate | None  # the believed state's certificate when it stopped


def believed_values(posterior: Any, cells: Sequence[int]) -> np.ndarray:
    """Posterior medians of ``cells``: ``(len(cells), 4)`` in METRICS order (natural units)."""
    lat = np.asarray(posterior.latent, np.float64)  # (n_draws, n_cells, 4)
    idx = np.asarray(list(cells), np.int64)
    return np.median(lat[:, idx, :], axis=0)


def believe(
    grid: CellGrid,
    problem: AllocationProblem,
    posterior: Any,
    measured: np.ndarray,
    observed: np.ndarray,
    believed: Sequence[int],
    settings: DecisionSettings,
    *,
    allocate: Callable[[np.ndarray], Allocation],
) -> Belief:
    """The decision state with ``believed`` cells collapsed at their posterior medians.

    ``measured (n_cells,)`` bool, ``observed (n_cells, 4)``; ``settings``: the campaign's
    credible level, repeatability, interval rules and ε; ``allocate(values (n_cells, 4))
    -> Allocation`` is the exact allocator.
    """
    from fleetsieve_bayes.decision.bounds import (
        conservative_table,
        optimistic_table,
        rule_bounds,
    )

    m = np.asarray(measured, bool).copy()
    obs = np.asarray(observed, np.float64).copy()
    cells = [int(c) for c in believed if not m[c]]
    if cells:
        obs[cells] = believed_values(posterior, cells)
        m[cells] = True
    bounds = rule_bounds(posterior, obs, m, settings.credible_level, settings.repeatability, grid, settings.rules)
    cons = allocate(conservative_table(bounds))
    opt = allocate(optimistic_table(bounds))
    cert = certify(grid, problem, cons, opt, m, obs, settings.epsilon)
    return Belief(m, obs, bounds, cons, opt, cert)


def plan_batch(
    *,
    believe_fn: Callable[[Sequence[int]], Belief],
    select: Callable[[Belief, int], int],
    candidates: np.ndarray,
    in_flight: Sequence[int],
    admit: Callable[[int, int | None], bool],
    first_round: int,
    max_picks: int,
    real: Belief | None = None,
) -> BatchPlan:
    """Pick cells one at a time, each conditioned on the in-flight cells and the earlier picks.

    Args:
        believe_fn: ``believe_fn(believed) -> Belief`` (see :func:`believe`).
        select: ``select(belief, round_no) -> cell``: the strategy on the
            believed state (it must return a cell not measured in ``belief``).
        candidates: ``(n_cells,)`` bool, cells that may be started (unmeasured,
            not in flight).
        in_flight: cells being measured now.
        admit: ``admit(cell, reserved) -> bool``: whether ``cell`` can start now
            given the current reservation (None: none yet); the caller's GPU
            packing. An admitted cell is counted as started by the caller.
        first_round: round number of the first pick (rounds count started
            acquisitions, so each pick's randomness is its own).
        max_picks: at most this many strategy calls.
        real: the state with nothing believed, when ``in_flight`` is empty
            (saves one allocation).
    """
    believed = [int(c) for c in in_flight]
    cand = np.asarray(candidates, bool).copy()
    picks: list[Pick] = []
    reserved: int | None = None
    round_no = first_round
    stop = "no candidate left to start"
    belief: Belief | None = None
    for _ in range(max_picks):
        if not cand.any():
            stop = "no candidate left to start"
            break
        t0 = time.perf_counter()
        belief = real if (real is not None and not believed) else believe_fn(believed)
        if belief.certificate.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
            stop = (
                f"the believed state is {belief.certificate.status}: waiting for the "
                f"{len(believed)} cell(s) in flight instead of starting more"
            )
            break
        c = int(select(belief, round_no))
        if not cand[c]:
            raise RuntimeError(f"strategy chose cell {c}, which is measured, in flight or believed")
        start = admit(c, reserved)
        picks.append(Pick(c, round_no, start, tuple(believed), belief.certificate, time.perf_counter() - t0))
        cand[c] = False
        believed.append(c)
        if start:
            round_no += 1
        elif reserved is None:
            reserved = c
        else:
            stop = "the next pick waits for GPUs"
            break
    else:
        stop = "batch size reached"
    return BatchPlan(tuple(picks), reserved, stop, None if belief is None else belief.certificate)
