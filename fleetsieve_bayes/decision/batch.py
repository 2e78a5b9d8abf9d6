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

Packing (which picks can start now) is the caller's ``admit(cell, reserved, believed)``
callback: a pick that does not fit the free GPUs becomes the *reservation*
(it waits for GPUs and is believed meanwhile, so later picks condition on it);
later picks start only if ``admit`` lets them fill the gap.

The value gate (:class:`BatchGate`, optional): a batch does not fill every free
GPU. A pick starts only if its *discounted decision value* is at least
``fraction`` of the best value on the real state, or if the certificate needs it
(the believed conservative allocation commits to it); with nothing in flight,
the first pick always starts (one cell at a time would measure it next). The
decision value is the acquisition kernel's expected gap reduction on the
believed state — the score the one-at-a-time strategy ranks cells by — and the
discount is the kernel's expected fraction of the gap left once the cells in
flight and the earlier picks are in, ``prod_j (1 - score_j / gap_j)`` (the cells
in flight scored on the real state, each pick on its believed state): a
speculative cell is worth its GPU-seconds only while the cells before it are
unlikely to settle the question. A pick the gate holds back is *deferred*:
believed (later picks condition on it, so a cell the certificate needs once it
is in can still start now) but not started; the next completion asks again.
Every quantity the gate reads is a function of the measurements, the cells in
flight in start order and the round numbers, so a resumed campaign re-plans an
interrupted batch the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.objective import scalar_gap
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    Certificate,
    certify,
)
from fleetsieve_bayes.settings import DecisionSettings

__all__ = ["Belief", "Pick", "BatchPlan", "BatchGate", "DecisionValues", "GATE_FRACTION", "believed_values", "believe", "plan_batch"]

# A speculative pick starts when its discounted decision value is at least this
# fraction of the best one of its planning step (tuned on the synthetic suite:
# benchmarks/parallel_profiling.py).
GATE_FRACTION = 0.5


class Belief(NamedTuple):
    """The decision state with some cells believed measured.

    ``measured (n_cells,)`` bool (real ∪ believed); ``observed (n_cells, 4)``
    (believed rows at their posterior medians); ``bounds`` with ``lo``/``hi``
    ``(n_cells, 4)``; both allocations and the certificate on that state;
    ``attainment`` every cell's SLO attainment at an attainment level
    (:class:`fleetsieve_bayes.decision.bounds.Attainment`; None at ``"point"``).
    """

    measured: np.ndarray
    observed: np.ndarray
    bounds: Any
    conservative: Allocation
    optimistic: Allocation
    certificate: Certificate
    attainment: Any = None


class Pick(NamedTuple):
    """One strategy pick within a batch, with the believed state it was made on."""

    cell: int
    round: int
    start: bool  # started now (else: the reservation, waiting for GPUs, or deferred)
    believed: tuple[int, ...]  # cells believed measured when it was picked
    certificate: Certificate  # the believed state's certificate
    seconds: float  # believe + select (+ value)
    value: float | None = None  # discounted decision value (None: no gate)
    deferred: bool = False  # held back by the value gate (believed, not started)


class DecisionValues(NamedTuple):
    """The acquisition kernel's view of one (believed) state.

    ``score (n_cells,)``: expected gap reduction of measuring each cell (−inf or NaN
    where measured); ``gap_now``: the state's scalar gap."""

    score: np.ndarray
    gap_now: float


class BatchPlan(NamedTuple):
    """What one planning step decided."""

    picks: tuple[Pick, ...]
    reserved: int | None  # a pick waiting for GPUs
    stop: str  # why picking stopped (one line)
    believed_certificate: Certificate | None  # the believed state's certificate when it stopped


class BatchGate(NamedTuple):
    """Which picks may start (module docstring).

    ``value(belief, round_no) -> DecisionValues``: the kernel on a (believed) state;
    ``real``: the state with nothing believed; ``real_round``: the round whose randomness
    scores it (a function of the measurements only, so a resume scores it the same);
    ``fraction``: the share of the real state's best value a discounted pick must reach
    (0 or less: every pick starts)."""

    value: Callable[[Belief, int], DecisionValues]
    real: Belief
    real_round: int
    fraction: float = GATE_FRACTION


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
    settled: Sequence[int] = (),
) -> Belief:
    """The decision state with ``believed`` cells collapsed at their posterior medians.

    ``measured (n_cells,)`` bool, ``observed (n_cells, 4)``; ``settings``: the campaign's
    credible level, repeatability, interval rules and ε; ``allocate(values (n_cells, 4))
    -> Allocation`` is the exact allocator; ``settled``: at a level, cells the optimistic
    table reads at their lower attainment bound
    (:func:`~fleetsieve_bayes.decision.bounds.settle`).
    """
    from fleetsieve_bayes.decision.bounds import decision_tables, slo_levels

    m = np.asarray(measured, bool).copy()
    obs = np.asarray(observed, np.float64).copy()
    cells = [int(c) for c in believed if not m[c]]
    if cells:
        obs[cells] = believed_values(posterior, cells)
        m[cells] = True
    levels = slo_levels(grid, settings.slo_attainment)
    if levels is not None and getattr(posterior, "window", None) is None:
        levels = None  # a posterior without windows (a point fit) decides the point way
    bounds, att, cons_t, opt_t = decision_tables(
        posterior, grid, problem, obs, m, settings.credible_level, settings.repeatability, settings.rules, levels,
        settled=settled,
    )
    cons = allocate(cons_t)
    opt = allocate(opt_t)
    cert = certify(grid, problem, cons, opt, m, obs if levels is None else cons_t, settings.epsilon, opt_t)
    return Belief(m, obs, bounds, cons, opt, cert, att)


def _best(values: DecisionValues, cand: np.ndarray) -> float:
    """The best finite score over the candidate cells (0 when none is positive)."""
    sc = np.where(cand, np.nan_to_num(np.asarray(values.score, np.float64), nan=-np.inf, posinf=-np.inf), -np.inf)
    return max(0.0, float(sc.max())) if sc.size else 0.0


def _discount(values: DecisionValues, c: int) -> float:
    """The kernel's expected fraction of the gap left after measuring ``c``, in [0, 1]."""
    s = float(np.nan_to_num(np.asarray(values.score, np.float64)[c], nan=0.0, neginf=0.0, posinf=0.0))
    if values.gap_now <= 0.0:
        return 0.0
    return float(np.clip(1.0 - s / values.gap_now, 0.0, 1.0))


class _Gating(NamedTuple):
    """The value gate's running state within one planning step."""

    reference: float  # the best decision value on the real state
    left: float  # expected fraction of the gap the cells in flight and earlier picks leave


def _open_gate(gate: BatchGate, in_flight: Sequence[int], candidates: np.ndarray) -> _Gating:
    """The reference value (the best over the candidates and the cells in flight, on the
    real state) and the discount of the cells in flight (in start order)."""
    values = gate.value(gate.real, gate.real_round)
    left = 1.0
    for f in in_flight:
        left *= _discount(values, int(f))
    open_ = np.asarray(candidates, bool).copy()
    open_[[int(f) for f in in_flight]] = True
    return _Gating(_best(values, open_), left)


def _gate(
    gate: BatchGate, gating: _Gating, belief: Belief, c: int, round_no: int, fresh: bool
) -> tuple[bool, float, _Gating]:
    """``(passes, discounted value, gating after c)`` for pick ``c`` on ``belief``;
    ``fresh``: nothing is in flight or picked before it (it starts whatever its value)."""
    values = gate.value(belief, round_no)
    s = float(np.nan_to_num(np.asarray(values.score, np.float64)[c], nan=0.0, neginf=0.0, posinf=0.0))
    v = s * gating.left
    needed = c in belief.certificate.unmeasured_committed
    passes = (
        fresh or needed or gate.fraction <= 0.0
        or (gating.reference > 0.0 and v >= gate.fraction * gating.reference)
    )
    return passes, v, gating._replace(left=gating.left * _discount(values, c))


def _spent(gate: BatchGate | None, gating: _Gating, belief: Belief, cand: np.ndarray) -> bool:
    """Whether no later pick can pass the gate: none can be worth ``fraction`` of the
    reference (a cell removes at most the believed gap, discounted), and the believed
    certificate needs no candidate."""
    if gate is None or gate.fraction <= 0.0:
        return False
    if any(cand[int(c)] for c in belief.certificate.unmeasured_committed):
        return False
    bound = gating.left * float(scalar_gap(belief.certificate.gap))
    return gating.reference <= 0.0 or bound < gate.fraction * gating.reference


def plan_batch(
    *,
    believe_fn: Callable[[Sequence[int]], Belief],
    select: Callable[[Belief, int], int],
    candidates: np.ndarray,
    in_flight: Sequence[int],
    admit: Callable[[int, int | None, tuple[int, ...]], bool],
    first_round: int,
    max_picks: int,
    real: Belief | None = None,
    gate: BatchGate | None = None,
) -> BatchPlan:
    """Pick cells one at a time, each conditioned on the in-flight cells and the earlier picks.

    Args:
        believe_fn: ``believe_fn(believed) -> Belief`` (see :func:`believe`).
        select: ``select(belief, round_no) -> cell``: the strategy on the
            believed state (it must return a cell not measured in ``belief``).
        candidates: ``(n_cells,)`` bool, cells that may be started (unmeasured,
            not in flight).
        in_flight: cells being measured now.
        admit: ``admit(cell, reserved, believed) -> bool``: whether ``cell`` can
            start now given the current reservation (None: none yet); the
            caller's GPU packing. An admitted cell is counted as started by the
            caller; ``believed``: the cells its pick was conditioned on (in
            flight, reserved or deferred).
        first_round: round number of the first pick (rounds count started
            acquisitions, so each pick's randomness is its own).
        max_picks: at most this many strategy calls.
        real: the state with nothing believed, when ``in_flight`` is empty
            (saves one allocation).
        gate: the value gate (None: every pick that fits starts).
    """
    believed = [int(c) for c in in_flight]
    cand = np.asarray(candidates, bool).copy()
    picks: list[Pick] = []
    reserved: int | None = None
    round_no = first_round
    stop = "no candidate left to start"
    belief: Belief | None = None
    gating = None if gate is None else _open_gate(gate, believed, cand)
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
        if gating is not None and believed and _spent(gate, gating, belief, cand):
            stop = "no further pick can be worth starting now"
            break
        c = int(select(belief, round_no))
        if not cand[c]:
            raise RuntimeError(f"strategy chose cell {c}, which is measured, in flight or believed")
        value = None
        if gate is not None and gating is not None:
            passes, value, gating = _gate(gate, gating, belief, c, round_no, fresh=not believed)
            if not passes:
                picks.append(Pick(c, round_no, False, tuple(believed), belief.certificate,
                                  time.perf_counter() - t0, value, deferred=True))
                cand[c] = False
                believed.append(c)
                stop = "the remaining picks are not worth starting yet"
                continue
        start = admit(c, reserved, tuple(believed))
        picks.append(Pick(c, round_no, start, tuple(believed), belief.certificate, time.perf_counter() - t0, value))
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
