"""One round of a campaign as pure functions over a state (the BlackJAX/Optax way).

``state = fleetsieve_bayes.init(campaign, seed=0)`` (:func:`fleetsieve_bayes.api.init`,
or :func:`new_state` from its parts) then, until ``state.done``::

    state, out = step(state, settings)       # fit → bounds → allocate both → certify
                                             # → certification attempt → decide → choose
    state = record(state, cell, row)         # the chosen cell's measurement, however obtained

:func:`step` does no I/O: no journal, no files, no clock but its own timings.
Its parts are public because the pool driver composes them differently (it
decides on every completion with cells still in flight):

- :func:`fit_round` — the cheap posterior on what is measured, warm-started;
- :func:`assess` — credible bounds, both allocations, the interval certificate,
  the certification attempt when that certifies, and the stopping rule;
- :func:`choose` — the strategy's next cell on a (possibly believed) view of the
  state, on the attempt's converged draws when the round made one.

Randomness: every seed of a round derives from ``(seed, round)``
(:mod:`fleetsieve_bayes.seeds`), the cheap fit's from :attr:`RoundKey.fit_seed`,
the attempt's from :attr:`RoundKey.attempt_seed`; so a campaign rerun on the
same measurements makes the same decisions.

Both drivers (:mod:`fleetsieve_bayes.campaign.sequential`, one cell at a time,
and :mod:`fleetsieve_bayes.campaign.parallel`, a GPU pool) are thin loops over
these functions and share nothing else but the campaign's records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.backends.failures import MEMORY_GUARD, SERVER_FAILURES, STARTUP_OOM
from fleetsieve_bayes.campaign.journal import Cell, MeasurementRecord
from fleetsieve_bayes.campaign.windows import (
    check_window,
    server_failed_cells,
    window_counts,
    window_limits,
    window_observations,
)
from fleetsieve_bayes.decision.attempt import CertificationAttempt, attempt_certification, thin
from fleetsieve_bayes.decision.batch import Belief, DecisionValues, believe
from fleetsieve_bayes.decision.bounds import repeatable_mask
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    EXHAUSTED,
    UNDECIDED,
    Certificate,
)
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.decision.strategies import RoundState, Strategy
from fleetsieve_bayes.deploy.production import PRODUCTION_PHASE, pool_production
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.seeds import round_jax_key, round_rng, round_seed
from fleetsieve_bayes.settings import DecisionSettings
from fleetsieve_bayes.table import METRICS

__all__ = [
    "CampaignState",
    "RoundKey",
    "RoundFacts",
    "RoundDecision",
    "Assessment",
    "RoundOutcome",
    "LOAD_INDEPENDENT_FAILURES",
    "new_state",
    "observe",
    "record",
    "repeatable",
    "pending_design",
    "round_key",
    "fit_round",
    "window_inputs",
    "at_level",
    "assess",
    "choose",
    "decision_values",
    "open_cells",
    "RepeatOptions",
    "repeat_options",
    "step",
    "decide_round",
    "stop_undecided",
    "with_alternatives",
    "measured_state",
    "server_failures",
    "measured_only_table",
]

# Failures of a server that cannot hold the model at a TP (out of memory at
# start-up, or refused by the memory guard before starting): the server is the
# same at every offered load of that class and TP, so none of them can run.
LOAD_INDEPENDENT_FAILURES = (STARTUP_OOM, MEMORY_GUARD)


class CampaignState(NamedTuple):
    """What a campaign knows between rounds.

    ``records``: the measurement records so far (:class:`~fleetsieve_bayes.campaign.journal.MeasurementRecord`),
    in order; ``measured (n_cells,)`` bool, ``observed (n_cells, 4)`` (NaN where
    unmeasured) and ``server_failed (n_cells,)`` bool are derived from them
    (:func:`observe`). ``warm_start``: the latest cheap fit (the next fit starts
    from it). ``round``: the next round's number (1 + acquisitions so far).
    ``status``: the campaign's final status once a round stopped it (None while
    it goes on), with its ``final`` allocation. ``backend``: what
    :func:`fleetsieve_bayes.api.measure` measures with (never read here).
    ``windows (n_cells,)`` int64: the windows held of each cell (derived);
    ``window_limit (n_cells,)`` float64: the windows the backend can give of
    each (``inf``: no limit; :func:`fleetsieve_bayes.campaign.windows.window_limits`).
    """

    grid: CellGrid
    problem: AllocationProblem
    card: Any
    preset: Any
    strategy: Strategy
    seed: int
    records: tuple[Any, ...]
    measured: np.ndarray
    observed: np.ndarray
    server_failed: np.ndarray
    round: int = 1
    warm_start: Any = None
    status: str | None = None
    final: Allocation | None = None
    backend: Any = None
    windows: np.ndarray | None = None
    window_limit: np.ndarray | None = None

    @property
    def done(self) -> bool:
        """Whether a round has stopped the campaign."""
        return self.status is not None

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds of the measurements so far."""
        return float(sum(r.gpu_seconds for r in self.records))


class RoundKey(NamedTuple):
    """The randomness of one round: everything derives from ``(seed, round)``."""

    seed: int
    round: int

    @property
    def fit_seed(self) -> int:
        """The cheap fit's seed."""
        return round_seed(self.seed, self.round)

    @property
    def attempt_seed(self) -> int:
        """The certification attempt's seed (its converged fit and joint check)."""
        return round_seed(self.seed, self.round) + 1


def round_key(seed: int, round_no: int) -> RoundKey:
    """The key of round ``round_no`` of a campaign seeded ``seed``."""
    return RoundKey(int(seed), int(round_no))


class RoundFacts(NamedTuple):
    """What the stopping rule looks at after a round's fit, allocations and certificate."""

    round_no: int
    certificate: str  # certified-feasible | certified-infeasible | undecided
    n_unmeasured: int
    max_rounds: int | None

    @property
    def out_of_rounds(self) -> bool:
        """Whether the round is past ``[stopping] max_rounds``."""
        return self.max_rounds is not None and self.round_no > self.max_rounds


class RoundDecision(NamedTuple):
    """What a round decides.

    ``status``: the campaign's status if it stops now (``undecided`` while it
    goes on); ``acquire``: measure one more cell; ``final``: which allocation
    answers — ``"conservative"``, ``"measured-only"`` (best over measured
    cells) or None (infeasible, or still acquiring).
    """

    status: str
    acquire: bool
    final: str | None


def decide_round(facts: RoundFacts) -> RoundDecision:
    """The stopping rule: certified either way, exhausted, out of rounds, or acquire."""
    if facts.certificate == CERTIFIED_FEASIBLE:
        return RoundDecision(CERTIFIED_FEASIBLE, False, "conservative")
    if facts.certificate == CERTIFIED_INFEASIBLE:
        return RoundDecision(CERTIFIED_INFEASIBLE, False, None)
    if facts.n_unmeasured == 0:
        return RoundDecision(EXHAUSTED, False, "measured-only")
    if facts.out_of_rounds:
        return RoundDecision(UNDECIDED, False, "conservative")
    return RoundDecision(UNDECIDED, True, None)


class Assessment(NamedTuple):
    """A round's decision state: the real view (bounds, both allocations and the
    certificate, after the certification attempt if one ran), the attempt, the stopping
    rule's decision and the final allocation when it stops (None otherwise, or infeasible)."""

    view: Belief
    attempt: CertificationAttempt | None
    decision: RoundDecision
    final: Allocation | None
    allocate_s: float
    # At an SLO-attainment level: committed cells' attainment and the cell to repeat
    # (the journal's round record carries it as its ``joint``; None at "point").
    attainment_json: dict[str, Any] | None = None
    # The view acquisition acts on (None: ``view``) and the capped hopes it settles
    # (:func:`settled_view`).
    acting: Belief | None = None
    settled: tuple[int, ...] = ()
    # A stopping round's ranked alternative fleets (:func:`with_alternatives`; the round
    # record's ``alternatives``); None while it acquires, or with ``alternatives = 0``.
    alternatives: dict[str, Any] | None = None

    @property
    def acting_view(self) -> Belief:
        return self.view if self.acting is None else self.acting

    @property
    def certificate(self) -> Certificate:
        return self.view.certificate

    def joint_json(self) -> dict[str, Any] | None:
        """What the round record keeps of the joint check and the attainment (a stopping
        round's committed cells are its answer's)."""
        if self.attempt is not None:
            out = self.attempt.to_json()
            if self.final is not None and self.attainment_json is not None:
                out = {**out, "committed": self.attainment_json["committed"]}
                if self.decision.status in (UNDECIDED, EXHAUSTED):  # the stop's own cell to repeat
                    out["repeat"] = self.attainment_json["repeat"]
                if "answer_choice" in self.attainment_json:
                    out["answer_choice"] = self.attainment_json["answer_choice"]
            return out
        return self.attainment_json


class RoundOutcome(NamedTuple):
    """What one :func:`step` produced.

    ``phase``: ``"design"`` (``chosen`` is the next initial-design cell; nothing
    was fitted), ``"acquire"`` (``chosen`` is the strategy's next cell) or
    ``"final"`` (the round stopped the campaign: ``chosen`` is None).
    ``status``: the campaign's status (``undecided`` while it goes on).
    ``posterior``: the cheap fit; ``shown``: what a campaign directory stores as
    its posterior (the attempt's converged one, when the round made one).
    """

    round: int
    phase: str
    status: str
    chosen: int | None
    assessment: Assessment | None = None
    posterior: Any = None
    timings: dict[str, float] | None = None
    repeat: bool = False  # ``chosen`` is measured already: its next window

    @property
    def certificate(self) -> Certificate | None:
        return None if self.assessment is None else self.assessment.certificate

    @property
    def gap(self) -> Any:
        """The certificate's gap (``critical``, ``min_fulfillment``, ``goodput``), None for a design step."""
        return None if self.assessment is None else self.assessment.certificate.gap

    @property
    def final(self) -> Allocation | None:
        return None if self.assessment is None else self.assessment.final

    @property
    def shown(self) -> Any:
        a = self.assessment
        return self.posterior if a is None or a.attempt is None else a.attempt.posterior


# --- the state from measurement records ------------------------------------------------


def _metric(v: Any) -> float:
    return float("nan") if v is None else float(v)


def measured_state(grid: CellGrid, records: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Rebuild what is measured from journal records (typed).

    A failure that does not depend on the load (:data:`LOAD_INDEPENDENT_FAILURES`)
    is known for every load of its class, GPU type and TP: those cells count as measured
    with the failed cell's values, at no cost and without a record of their own
    (the journal, ``measurements.csv`` and the GPU-seconds hold only what ran).
    Measuring them one by one would cost 26 runs over the 40-fleet suite.

    Returns:
        ``measured (n_cells,) bool``, ``observed (n_cells, 4)`` (NaN where
        unmeasured) and the measured cell indices in measurement order (cells
        that ran, not the inferred ones).
    """
    index = grid.index()
    measured = np.zeros(grid.n_cells, dtype=bool)
    observed = np.full((grid.n_cells, len(METRICS)), np.nan)
    order: list[int] = []
    cant_start: list[int] = []
    for rec in records:
        if not isinstance(rec, MeasurementRecord):
            continue
        key = tuple(rec.cell)
        if key not in index:
            raise InputError(f"journal: measured cell {rec.cell.label} is not a candidate of this campaign")
        if rec.phase == PRODUCTION_PHASE:
            continue  # pooled below (fleetsieve_bayes/deploy/production.py)
        c = index[key]
        if measured[c]:
            continue  # never measured twice by us; tolerate a duplicate record
        measured[c] = True
        observed[c] = [_metric(rec.row.get(m)) for m in METRICS]
        order.append(c)
        if rec.row.get("failure") in LOAD_INDEPENDENT_FAILURES:
            cant_start.append(c)
    for c in cant_start:
        same = grid.same_curve(c) & ~measured
        observed[same] = observed[c]
        measured |= same
    measured, observed = pool_production(index, records, measured, observed)
    return measured, observed, order


def server_failures(grid: CellGrid, records: Sequence[Any]) -> np.ndarray:
    """bool ``(n_cells,)``: cells measured as a failure of the server itself
    (:data:`~fleetsieve_bayes.backends.failures.SERVER_FAILURES`: it never
    served, so the failure says nothing about the load), and the cells
    :func:`measured_state` marks from a load-independent one. The model reads
    every other failed run above a working load of its TP as overload
    (:func:`fleetsieve_bayes.model.joint.load_failures`)."""
    measured, _, order = measured_state(grid, records)  # raises on a cell not in the grid
    inferred = measured.copy()
    inferred[order] = False  # measured without running: marked from a load-independent failure
    index = grid.index()
    server = [
        index[tuple(rec.cell)]
        for rec in records
        if isinstance(rec, MeasurementRecord) and rec.row.get("failure") in SERVER_FAILURES
    ]
    inferred[server] = True
    return inferred


def measured_only_table(
    observed: np.ndarray,
    measured: np.ndarray,
    grid: CellGrid | None = None,
    problem: AllocationProblem | None = None,
    attainment_lo: np.ndarray | None = None,
    levels: np.ndarray | None = None,
) -> np.ndarray:
    """``(n_cells, 4)`` values where unmeasured cells are inadmissible (zero throughput and success).

    At an SLO-attainment level (``attainment_lo (n_cells,)``, the lower credible bound of
    each cell's attainment, and ``levels (n_cells,)``, with ``grid`` and ``problem``) a
    measured cell is admissible only where its attainment clears its level, as in the
    conservative table (:func:`fleetsieve_bayes.decision.intervals.level_tables`), not
    where its first window happened to meet the SLOs.
    """
    vals = np.where(measured[:, None], observed, 0.0)
    vals[~measured, 1:3] = np.inf
    if attainment_lo is None or levels is None or grid is None or problem is None:
        return vals
    from fleetsieve_bayes.decision.intervals import level_tables

    w = grid.workload_idx
    lim = (problem.success_min[w], problem.ttft_max[w], problem.completion_max[w])
    out, _ = level_tables(vals, vals, attainment_lo, attainment_lo, levels, *lim)
    return np.asarray(out)


def new_state(
    grid: CellGrid,
    problem: AllocationProblem,
    card: Any,
    preset: Any,
    strategy: Strategy,
    seed: int,
    records: Sequence[Any] = (),
    *,
    backend: Any = None,
    window_limit: np.ndarray | None = None,
) -> CampaignState:
    """A state from its parts and the measurement records so far (other record types are skipped).

    ``window_limit (n_cells,)``: the windows the backend can give of each cell (default:
    ``backend.windows_available`` when a backend is given, else no limit)."""
    empty = np.zeros(grid.n_cells, bool)
    if window_limit is None and backend is not None:
        window_limit = window_limits(backend.windows_available, grid.n_cells)
    state = CampaignState(
        grid=grid, problem=problem, card=card, preset=preset, strategy=strategy, seed=int(seed),
        records=(), measured=empty, observed=np.full((grid.n_cells, len(METRICS)), np.nan),
        server_failed=empty, backend=backend,
        window_limit=np.full(grid.n_cells, np.inf) if window_limit is None else np.asarray(window_limit, float),
    )
    return observe(state, records)


def observe(state: CampaignState, records: Sequence[Any]) -> CampaignState:
    """``state`` on these measurement records (what is measured, the round number)."""
    meas = tuple(r for r in records if isinstance(r, MeasurementRecord))
    measured, observed, _ = measured_state(state.grid, meas)
    return state._replace(
        records=meas,
        measured=measured,
        observed=observed,
        server_failed=server_failures(state.grid, meas),
        round=1 + sum(1 for r in meas if r.phase == "acquire"),
        windows=window_counts(state.grid, meas),
    )


def repeatable(state: CampaignState, max_windows_per_cell: int) -> np.ndarray:
    """``(n_cells,)`` bool: the measured cells a strategy may measure again now
    (:func:`fleetsieve_bayes.campaign.windows.repeatable`)."""
    assert state.windows is not None and state.window_limit is not None  # set by new_state / observe
    return repeatable_mask(state.windows, state.window_limit, server_failed_cells(state.grid, state.records),
                           max_windows_per_cell)


def record(
    state: CampaignState, cell: int, row: dict[str, Any], *, phase: str | None = None, repeat: bool = False
) -> CampaignState:
    """``state`` with one more window of ``cell`` (``row``: a table row of
    :data:`fleetsieve_bayes.table.COLUMNS`). ``phase``: ``"design"`` or ``"acquire"``
    (by default: design while the initial design is not complete). ``repeat``: the
    window is another of a measured cell (asked for explicitly: a measured cell is
    never recorded again by accident).

    Raises:
        RuntimeError: a measured cell without ``repeat``, or ``repeat`` of an unmeasured one.
    """
    if phase is None:
        phase = "design" if pending_design(state) else "acquire"
    replicate = check_window(state.grid, state.records, int(cell), repeat=repeat)
    now = time.time()
    rec = MeasurementRecord(
        seq=len(state.records), round=0 if phase == "design" else state.round, phase=phase,
        cell=Cell(*state.grid.key(int(cell))), row=dict(row), gpu_seconds=float(row["duration_s"]) * int(row["tp"]),
        started_at=now, finished_at=now, wall_s=0.0, replicate=replicate,
    )
    return observe(state, (*state.records, rec))


def pending_design(state: CampaignState) -> list[int]:
    """The initial-design cells not yet measured, in measurement order."""
    return [c for c in initial_design(state.grid) if not state.measured[c]]


# --- the round ---------------------------------------------------------------------------


def window_inputs(state: CampaignState) -> tuple[np.ndarray, np.ndarray]:
    """Every measurement window of the campaign as model input: ``rows (n_rows, 4)``
    and ``row_cell (n_rows,)``, in record order (:func:`~fleetsieve_bayes.campaign.windows.window_observations`:
    a ``(cell, replicate)`` recorded twice counts once; production windows are pooled apart)."""
    obs = window_observations(state.grid, state.records)
    return obs.rows, obs.cell


def at_level(settings: DecisionSettings) -> bool:
    """Whether the campaign decides on SLO attainment (not ``"point"``)."""
    return not isinstance(settings.slo_attainment, str)


def fit_round(state: CampaignState, seed: int, settings: DecisionSettings | None = None) -> Any:
    """The cheap posterior on what is measured, warm-started from ``state.warm_start``
    (at an SLO-attainment level: the window-noise model on every window)."""
    from fleetsieve_bayes.model.inference import fit

    rows, row_cell = window_inputs(state) if settings is not None and at_level(settings) else (None, None)
    return fit(
        state.grid, state.observed, state.measured, state.card, state.preset, seed=seed,
        warm_start=state.warm_start, server_failed=state.server_failed, rows=rows, row_cell=row_cell,
        prime_warm_refit=True,
    )


def assess(
    state: CampaignState, settings: DecisionSettings, posterior: Any, *, attempt_seed: int
) -> Assessment:
    """Bounds, both allocations and the certificate on the real state; when the interval
    certificate certifies, the certification attempt (a certified state is only issued from
    the converged posterior, after the joint check); then the stopping rule."""
    grid, problem = state.grid, state.problem

    def allocate(values: np.ndarray) -> Allocation:
        return allocate_milp(grid, values, problem)

    t0 = time.perf_counter()
    view = believe(grid, problem, posterior, state.measured, state.observed, [], settings, allocate=allocate)
    allocate_s = time.perf_counter() - t0
    attempt = None
    if view.certificate.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
        attempt = attempt_certification(
            grid, problem, state.card, state.observed, state.measured, settings, seed=attempt_seed,
            mass_from=posterior, server_failed=state.server_failed,
            windows=window_inputs(state) if at_level(settings) else None,
            window_limit=state.window_limit,
        )
        view = view._replace(
            bounds=attempt.bounds, conservative=attempt.conservative, optimistic=attempt.optimistic,
            certificate=attempt.certificate, attainment=attempt.attainment,
        )
    # At a level, a committed cell whose attainment straddles its level and that may be
    # measured again is one more thing to measure (decide_round's "cells left"); after a
    # certification attempt, so is any committed cell some draw of which misses its level
    # (P(SLO met) is what held the verdict back). Acquisition acts on the view whose
    # optimistic table reads capped hopes at their lower bound (settled_view).
    acting, settled = view, ()
    if attempt is None and view.certificate.status == UNDECIDED:
        acting, settled = settled_view(state, settings, posterior, view, allocate)
    opts = repeat_options(state, settings, acting)
    can_repeat = opts.repeat_hint is not None or bool(
        (attempt is not None or settled) and opts.repeatable is not None and opts.repeatable.any()
    )
    n_open = int((~state.measured).sum()) + int(can_repeat)
    facts = RoundFacts(state.round, view.certificate.status, n_open, settings.max_rounds)
    decision = decide_round(facts)
    if decision.acquire and settled and not _leads(state, acting, opts):
        # The gap lies in hopes no window can test (capped cells whose attainment
        # straddles their level); without them no unmeasured cell and no repeat is
        # left to try.
        decision = RoundDecision(UNDECIDED, False, "conservative")
    shown = posterior if attempt is None else attempt.posterior
    final, choice = _final_allocation(state, settings, view, decision, allocate, shown, attempt_seed)
    att_json = None
    if view.attainment is not None:
        # A round that stops undecided (or exhausted) with rounds left would have measured
        # any cell a window could settle: the cell it names is one at its window limit.
        capped_first = decision.status in (UNDECIDED, EXHAUSTED) and not decision.acquire and not facts.out_of_rounds
        att_json = _attainment_state(state, settings, view, final, capped_first=capped_first)
        if choice is not None:
            att_json["answer_choice"] = choice
    return Assessment(view, attempt, decision, final, allocate_s, att_json, acting, settled)


def stop_undecided(
    state: CampaignState, settings: DecisionSettings, a: Assessment, posterior: Any, *, seed: int
) -> Assessment:
    """``a`` (a round that would acquire) stopped ``undecided`` before its chosen cell, as the
    profiling budget stops it (:mod:`fleetsieve_bayes.campaign.budget`): it answers with the
    usual uncertified answer (:func:`answer_rule`) on the round's own view and draws."""
    grid, problem = state.grid, state.problem

    def allocate(values: np.ndarray) -> Allocation:
        return allocate_milp(grid, values, problem)

    decision = RoundDecision(UNDECIDED, False, "conservative")
    shown = posterior if a.attempt is None else a.attempt.posterior
    final, choice = _final_allocation(state, settings, a.view, decision, allocate, shown, seed)
    att_json = None
    if a.view.attainment is not None:
        att_json = _attainment_state(state, settings, a.view, final)
        if choice is not None:
            att_json["answer_choice"] = choice
    a = a._replace(decision=decision, final=final, attainment_json=att_json, alternatives=None)
    return with_alternatives(state, settings, a, posterior, seed=seed)


def with_alternatives(
    state: CampaignState, settings: DecisionSettings, a: Assessment, posterior: Any, *, seed: int
) -> Assessment:
    """``a`` (a stopping round) with its ranked alternative fleets
    (:func:`~fleetsieve_bayes.decision.alternatives.rank_alternatives`): the answer, both
    allocations and the most frequent per-draw optima, checked on one set of draws — the
    certification attempt's when the round made one, else ``posterior`` (the round's cheap
    fit) — with the attempt's ``seed``, so the answer's chances are the joint check's.
    ``a`` itself when it has them already or ``settings.alternatives`` is 0.

    The result (the round record's ``alternatives``): ``{"posterior": "certifying" |
    "round", "draws": n, "ranked": [entry, ...]}``, each entry as result.json's
    ``alternatives`` (docs/contracts.md)."""
    if a.alternatives is not None or settings.alternatives <= 0:
        return a
    from fleetsieve_bayes.allocation.problem import allocation_to_json
    from fleetsieve_bayes.decision.alternatives import rank_alternatives
    from fleetsieve_bayes.decision.attempt import joint_kernel
    from fleetsieve_bayes.decision.bounds import slo_levels

    grid, problem, view = state.grid, state.problem, a.view
    shown = posterior if a.attempt is None else a.attempt.posterior
    levels = slo_levels(grid, settings.slo_attainment)
    at = levels is not None and view.attainment is not None
    ranked, draws = rank_alternatives(
        grid, problem, [a.final, view.conservative, view.optimistic], shown.latent, shown.noise, state.observed,
        state.measured, settings.epsilon, count=settings.alternatives, seed=seed, kernel=joint_kernel(grid, problem),
        attainment=view.attainment.draws if at else None, levels=levels if at else None,
    )
    entries = []
    for i, alt in enumerate(ranked):
        cells = alt.allocation.committed()
        entries.append({
            "rank": i + 1,
            "allocation": allocation_to_json(alt.allocation, grid),
            "p_epsilon_optimal": alt.p_epsilon_optimal,
            "p_slo_met": alt.p_slo_met,
            "gpus": int(alt.allocation.gpus_used),
            **({} if alt.allocation.usd_per_hour is None else {"usd_per_hour": float(alt.allocation.usd_per_hour)}),
            "measured_cells": [Cell(*grid.key(c)).to_json() for c in cells if state.measured[c]],
            "predicted_cells": [Cell(*grid.key(c)).to_json() for c in cells if not state.measured[c]],
        })
    source = "round" if a.attempt is None else "certifying"
    return a._replace(alternatives={"posterior": source, "draws": draws, "ranked": entries})


def answer_rule(status: str, settings: DecisionSettings) -> str | None:
    """Which table a campaign that stopped with ``status`` answers on (result.json's
    ``answer``): ``"conservative"`` (certified-feasible, or undecided by the metric rule or
    with ``uncertified_answer = "conservative"``), ``"measured-only"`` (exhausted, the same
    way), ``"credible"`` / ``"best-estimate"`` (at an attainment level, undecided or
    exhausted: :func:`~fleetsieve_bayes.decision.bounds.best_estimate_table`; a number
    setting answers ``"credible"``), ``"probable"`` (the most probably ε-optimal of those
    answers, :func:`probable_answer`), None (certified-infeasible)."""
    if status == CERTIFIED_INFEASIBLE:
        return None
    if status == CERTIFIED_FEASIBLE:
        return "conservative"
    if at_level(settings) and settings.uncertified_answer != "conservative":
        if settings.uncertified_answer in ("best-estimate", "probable"):
            return str(settings.uncertified_answer)
        return "credible"
    return "measured-only" if status == EXHAUSTED else "conservative"


def _final_allocation(
    state: CampaignState, settings: DecisionSettings, view: Belief, decision: RoundDecision,
    allocate: Callable[[np.ndarray], Allocation], posterior: Any, seed: int,
) -> tuple[Allocation | None, dict[str, Any] | None]:
    """The allocation a stopping round answers with (:func:`answer_rule`; None while it
    acquires) and, for ``"probable"``, the choice (:func:`probable_answer`)."""
    if decision.acquire or decision.final is None:
        return None, None
    rule = answer_rule(decision.status, settings)
    if rule == "probable" and view.attainment is not None:
        return probable_answer(state, settings, view, posterior, allocate, seed=seed)
    return _rule_allocation(state, settings, view, decision, allocate, rule), None


def _rule_allocation(
    state: CampaignState, settings: DecisionSettings, view: Belief, decision: RoundDecision,
    allocate: Callable[[np.ndarray], Allocation], rule: str | None,
) -> Allocation:
    """The stopping round's allocation under every rule but ``"probable"``."""
    if rule in ("credible", "best-estimate") and view.attainment is not None:
        from fleetsieve_bayes.decision.bounds import (
            answer_confidence,
            best_estimate_table,
            slo_levels,
        )

        levels = slo_levels(state.grid, settings.slo_attainment)
        assert levels is not None  # at a level
        conf = answer_confidence(settings.uncertified_answer, levels)
        return allocate(best_estimate_table(state.grid, state.problem, view.bounds, view.attainment,
                                            state.measured, levels, conf))
    if rule == "measured-only" or decision.final == "measured-only":
        return allocate(_measured_only(state, settings, view))
    return view.conservative


def probable_answer(
    state: CampaignState, settings: DecisionSettings, view: Belief, posterior: Any,
    allocate: Callable[[np.ndarray], Allocation], *, seed: int = 0,
) -> tuple[Allocation, dict[str, Any]]:
    """``[stopping] uncertified_answer = "probable"``: of the conservative answer and the
    answers at each confidence of :data:`~fleetsieve_bayes.settings.PROBABLE_CONFIDENCES`
    (:func:`~fleetsieve_bayes.decision.bounds.best_estimate_table`), the one whose
    posterior probability of being ε-optimal at the level is the highest
    (:func:`~fleetsieve_bayes.decision.joint_check.answer_chances`, on ``posterior``'s
    draws: those of ``view.attainment``); of equal ones the most cautious.

    Returns:
        the allocation and ``{"candidate": "conservative" | c, "p_epsilon_optimal": p,
        "chances": {candidate: p}}`` (result.json's ``answer_choice``).
    """
    from fleetsieve_bayes.decision.attempt import joint_kernel
    from fleetsieve_bayes.decision.bounds import best_estimate_table, slo_levels
    from fleetsieve_bayes.decision.joint_check import answer_chances
    from fleetsieve_bayes.settings import PROBABLE_CONFIDENCES

    grid, problem = state.grid, state.problem
    levels = slo_levels(grid, settings.slo_attainment)
    assert levels is not None and view.attainment is not None  # at a level
    names: list[str | float] = ["conservative", *PROBABLE_CONFIDENCES]
    cands = [view.conservative] + [
        allocate(best_estimate_table(grid, problem, view.bounds, view.attainment, state.measured, levels, c))
        for c in PROBABLE_CONFIDENCES
    ]
    p = answer_chances(grid, problem, cands, posterior.latent, posterior.noise, state.observed, state.measured,
                       settings.epsilon, attainment=view.attainment.draws, levels=levels, seed=seed,
                       kernel=joint_kernel(grid, problem))
    i = int(np.argmax(p))  # the first of the best: the most cautious
    chances = {str(n): round(float(x), 4) for n, x in zip(names, p, strict=True)}
    return cands[i], {"candidate": names[i], "p_epsilon_optimal": round(float(p[i]), 4), "chances": chances}


def settled_view(
    state: CampaignState, settings: DecisionSettings, posterior: Any, view: Belief,
    allocate: Callable[[np.ndarray], Allocation],
) -> tuple[Belief, tuple[int, ...]]:
    """At an SLO-attainment level: the view acquisition acts on, and the cells it settles.

    A hope of the optimistic allocation that no window can test (a capped cell whose
    attainment straddles its level, :func:`~fleetsieve_bayes.decision.bounds.capped_hopes`)
    would hold the gap open for good and hide the next hope, which a measurement can test.
    Such cells are read at their lower attainment bound in the optimistic table
    (:func:`~fleetsieve_bayes.decision.bounds.settle`), and the optimistic allocation is
    solved again until it leans on none; ``view`` itself when it leans on none (or at
    ``"point"``)."""
    from fleetsieve_bayes.decision.bounds import capped_hopes, slo_levels

    if view.attainment is None or not at_level(settings):
        return view, ()
    levels = slo_levels(state.grid, settings.slo_attainment)
    rep = repeatable(state, settings.max_windows_per_cell)
    assert state.windows is not None  # set by new_state / observe
    cells: list[int] = []
    acting = view
    while True:
        opt = acting.optimistic.committed() if acting.optimistic.feasible else []
        new = [c for c in capped_hopes(opt, view.attainment, levels, rep, state.windows) if c not in cells]
        if not new:
            return acting, tuple(sorted(cells))
        cells += new
        acting = believe(state.grid, state.problem, posterior, state.measured, state.observed, [], settings,
                         allocate=allocate, settled=cells)


def _leads(state: CampaignState, acting: Belief, opts: RepeatOptions) -> bool:
    """Whether the settled view leaves something to measure: its certificate's gap open
    with an unmeasured cell either allocation commits to, or a repeat to make."""
    if acting.certificate.status != UNDECIDED:
        return False
    unmeasured = any(not state.measured[c] for c in _decision_ends(acting))
    return unmeasured or bool(opts.repeatable is not None and opts.repeatable.any())


def _measured_only(state: CampaignState, settings: DecisionSettings, view: Belief) -> np.ndarray:
    """The exhausted campaign's table (:func:`measured_only_table`; at a level, read at it)."""
    if view.attainment is None or not at_level(settings):
        return measured_only_table(state.observed, state.measured)
    from fleetsieve_bayes.decision.bounds import slo_levels

    levels = slo_levels(state.grid, settings.slo_attainment)
    return measured_only_table(state.observed, state.measured, state.grid, state.problem, view.attainment.lo, levels)


def _attainment_state(
    state: CampaignState, settings: DecisionSettings, view: Belief, final: Allocation | None = None,
    *, capped_first: bool = False,
) -> dict[str, Any]:
    """At an attainment level: result.json's committed cells (of ``final`` when the round
    stops, else of the conservative allocation) and cell to repeat (``capped_first``:
    :func:`~fleetsieve_bayes.decision.bounds.cell_to_repeat`'s)."""
    from fleetsieve_bayes.decision.bounds import (
        cell_to_repeat,
        committed_attainment,
        repeat_entry,
        slo_levels,
    )

    grid, att = state.grid, view.attainment
    levels = slo_levels(grid, settings.slo_attainment)
    _, row_cell = window_inputs(state)
    counts = np.bincount(row_cell, minlength=grid.n_cells)
    shown = view.conservative if final is None else final
    committed = shown.committed() if shown.feasible else []
    repeat_cell = cell_to_repeat(_decision_ends(view), att, levels, repeatable(state, settings.max_windows_per_cell),
                                 counts, capped_first=capped_first)
    repeat = None
    if repeat_cell is not None:
        repeat = repeat_entry(grid, repeat_cell, counts, settings.max_windows_per_cell, state.window_limit)
    return {"committed": committed_attainment(grid, committed, att, counts, levels), "repeat": repeat}


def choose(
    state: CampaignState,
    settings: DecisionSettings,
    view: Belief,
    posterior: Any,
    round_no: int,
    attempt: CertificationAttempt | None = None,
    *,
    busy: Collection[int] = (),
) -> int:
    """The strategy's next cell on ``view`` (the real state, or one with cells believed
    measured), its randomness from ``(seed, round_no)``. After a certification attempt the
    strategy reads the attempt's converged draws, thinned to the cheap fit's shape.

    At an SLO-attainment level the strategy may also choose a measured cell of
    :func:`repeat_options` (its next window: ``state.measured[chosen]`` says it is
    a repeat); ``busy``: cells being measured or already picked in this batch
    (the pool driver's), never repeated now.

    Raises:
        RuntimeError: the strategy chose a measured cell it may not repeat.
    """
    if attempt is not None:
        posterior = thin(attempt.posterior, posterior.latent.shape[0])
    level = repeat_options(state, settings, view, busy=busy)
    rs = RoundState(
        grid=state.grid,
        problem=state.problem,
        campaign_epsilon=settings.epsilon,
        credible_level=settings.credible_level,
        repeatability=settings.repeatability,
        measured=view.measured.copy(),
        observed=view.observed.copy(),
        posterior=posterior,
        bounds=view.bounds,
        conservative=view.conservative,
        optimistic=view.optimistic,
        certificate=view.certificate,
        round=round_no,
        rng=round_rng(state.seed, round_no),
        key=round_jax_key(state.seed, round_no),
        attempt=attempt,
        **level._asdict(),
    )
    chosen = int(state.strategy.select(rs))
    if view.measured[chosen] and not (level.repeatable is not None and level.repeatable[chosen]):
        raise RuntimeError(f"strategy {state.strategy.name!r} chose measured cell {state.grid.describe(chosen)}")
    return chosen


def open_cells(
    state: CampaignState, settings: DecisionSettings, view: Belief, *, busy: Collection[int] = ()
) -> np.ndarray:
    """``(n_cells,)`` bool: the cells :func:`choose` may return on ``view`` with ``busy``
    cells taken — the unmeasured ones and, at an SLO-attainment level, the
    repeatable ones (what the pool driver hands :func:`~fleetsieve_bayes.decision.batch.plan_batch`)."""
    out = ~np.asarray(state.measured, bool)
    rep = repeat_options(state, settings, view, busy=busy).repeatable
    if rep is not None:
        out |= rep
    out[[int(c) for c in busy]] = False
    return out


class RepeatOptions(NamedTuple):
    """What a strategy reads of repeats in one round (:func:`repeat_options`; all None at ``"point"``).

    ``repeatable (n_cells,)`` bool: measured cells that may be measured again now, where
    another window can change the decision;
    ``levels (n_cells,)`` each cell's attainment level; ``attainment`` the view's
    :class:`~fleetsieve_bayes.decision.bounds.Attainment`; ``repeat_hint`` the
    committed cell the certificate needs another window of (repeatable), or None.
    """

    repeatable: np.ndarray | None = None
    levels: np.ndarray | None = None
    attainment: Any = None
    repeat_hint: int | None = None


def repeat_options(
    state: CampaignState, settings: DecisionSettings, view: Belief, *, busy: Collection[int] = ()
) -> RepeatOptions:
    """At an SLO-attainment level: the repeats a strategy may choose on ``view`` — the
    :func:`repeatable` cells (``[stopping] max_windows_per_cell``, the backend's
    windows: a replayed cell whose rows are used up is never offered) that are
    measured in ``view``, not ``busy``, and committed to by the conservative or the
    optimistic allocation with an attainment interval that straddles their level
    (elsewhere another window cannot change the decision) — and the cell the
    certificate needs another window of; nothing at ``"point"`` or on a view
    without attainment."""
    from fleetsieve_bayes.decision.bounds import cell_to_repeat, slo_levels

    if not at_level(settings) or view.attainment is None:
        return RepeatOptions()
    att = view.attainment
    levels = slo_levels(state.grid, settings.slo_attainment)
    ends = _decision_ends(view)
    # Only where a window can change or secure the decision: a cell an allocation
    # commits to that may meet its level and may miss it (its interval straddles the
    # level, or some draw of it misses: the joint check's P(SLO met)); a settled
    # cell, or one no allocation wants, cannot move the certificate.
    doubt = np.zeros(state.grid.n_cells, bool)
    doubt[ends] = True
    misses = (att.lo < levels) | np.any(np.asarray(att.draws) < levels[None, :], axis=0)
    doubt &= misses & (levels <= att.hi + 1e-12)
    rep = repeatable(state, settings.max_windows_per_cell) & np.asarray(view.measured, bool) & doubt
    rep[[int(c) for c in busy]] = False
    hint = cell_to_repeat(ends, att, levels, rep, state.windows)
    return RepeatOptions(rep, levels, att, hint if hint is not None and rep[hint] else None)


def _decision_ends(view: Belief) -> list[int]:
    """The cells the conservative and the optimistic allocation commit to (conservative first)."""
    cons, opt = view.conservative, view.optimistic
    return (cons.committed() if cons.feasible else []) + (opt.committed() if opt.feasible else [])


def step(
    state: CampaignState, settings: DecisionSettings, key: RoundKey | None = None
) -> tuple[CampaignState, RoundOutcome]:
    """One round: the next initial-design cell while the design is incomplete; else fit →
    bounds → both allocations → certify → certification attempt → decide → choose.

    ``key``: the round's randomness (default: :func:`round_key` of the state's seed and
    round). The returned state carries the fit as its next warm start and, when the
    round stopped the campaign, its ``status`` and ``final`` allocation; a chosen cell
    is measured by the caller and entered with :func:`record` (or
    :func:`fleetsieve_bayes.api.measure`).

    Raises:
        ValueError: the campaign is already done.
    """
    if state.done:
        raise ValueError(f"the campaign is done ({state.status}); nothing to step")
    design = pending_design(state)
    if design:
        return state, RoundOutcome(0, "design", UNDECIDED, design[0])
    key = key or round_key(state.seed, state.round)
    t0 = time.perf_counter()
    posterior = fit_round(state, key.fit_seed, settings)
    fit_s = time.perf_counter() - t0
    a = assess(state, settings, posterior, attempt_seed=key.attempt_seed)
    if not a.decision.acquire:
        a = with_alternatives(state, settings, a, posterior, seed=key.attempt_seed)
    chosen: int | None = None
    acquire_s = 0.0
    if a.decision.acquire:
        t0 = time.perf_counter()
        chosen = choose(state, settings, a.acting_view, posterior, state.round, a.attempt)
        acquire_s = time.perf_counter() - t0
    timings = {
        "fit_s": fit_s,
        "allocate_s": a.allocate_s,
        "acquire_s": acquire_s,
        "certify_s": 0.0 if a.attempt is None else float(a.attempt.wall_s),
    }
    outcome = RoundOutcome(
        round=state.round,
        phase="acquire" if a.decision.acquire else "final",
        status=a.decision.status,
        chosen=chosen,
        assessment=a,
        posterior=posterior,
        timings=timings,
        repeat=chosen is not None and bool(state.measured[chosen]),
    )
    new = state._replace(warm_start=posterior)
    if not a.decision.acquire:
        new = new._replace(status=a.decision.status, final=a.final)
    return new, outcome


def decision_values(
    state: CampaignState,
    settings: DecisionSettings,
    view: Belief,
    posterior: Any,
    round_no: int,
    attempt: CertificationAttempt | None = None,
    *,
    busy: Collection[int] = (),
) -> DecisionValues:
    """The acquisition kernel's expected gap reduction of every cell on ``view`` (the
    real state or a believed one): the score the ``fleetsieve`` strategy ranks cells
    by, on the same draws, randomness and repeat candidates as :func:`choose` with
    these arguments (at an SLO-attainment level a repeatable measured cell is scored
    as "measure it again"). The pool's value gate
    (:class:`fleetsieve_bayes.decision.batch.BatchGate`) reads it whatever the
    strategy, to judge whether a speculative cell is worth starting."""
    from fleetsieve_bayes.decision.strategies.base import StrategyContext
    from fleetsieve_bayes.decision.strategies.gap import run_kernel

    if attempt is not None:
        posterior = thin(attempt.posterior, posterior.latent.shape[0])
    rs = RoundState(
        grid=state.grid, problem=state.problem, campaign_epsilon=settings.epsilon,
        credible_level=settings.credible_level, repeatability=settings.repeatability,
        measured=view.measured.copy(), observed=view.observed.copy(), posterior=posterior,
        bounds=view.bounds, conservative=view.conservative, optimistic=view.optimistic,
        certificate=view.certificate, round=round_no, rng=round_rng(state.seed, round_no),
        key=round_jax_key(state.seed, round_no), attempt=attempt,
        **repeat_options(state, settings, view, busy=busy)._asdict(),
    )
    ctx = StrategyContext(state.grid, state.problem, settings.credible_level, settings.repeatability,
                          state.seed, rules=settings.rules)
    scores = run_kernel(ctx, rs)
    return DecisionValues(np.asarray(scores.score, np.float64), float(scores.gap_now))
