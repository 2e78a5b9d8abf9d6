"""The one-cell-at-a-time driver: a thin loop over :func:`fleetsieve_bayes.round.step`.

Each turn either measures the next initial-design cell, measures the cell a
journaled round chose (a run killed mid-measurement resumes there), returns
the round that stopped the campaign, or runs the next round and journals it.
Everything measured or decided goes to the append-only journal before the next
step, so a kill at any instant loses at most the measurement in flight; running
again on the same directory resumes from the journal, in a fresh process, to
the same decisions: each round's randomness derives from ``(seed, round)``, the
model's warm-start state is saved with the round, and a round whose decision
is journaled is never recomputed.

Why not the pool driver with one slot: the pool decides on every completion
with cells still in flight and keys its refits by the number of measured cells
(:mod:`fleetsieve_bayes.campaign.parallel`); one cell at a time, a round is
exactly one fit and one decision, and its journal (round records keyed by
round, warm starts by round) is what ``status``, ``report`` and resumes of
existing directories read. Both drivers share the round itself and nothing else.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends import Backend
from fleetsieve_bayes.campaign.budget import Budget, next_cells, reopens, spent, stop_json
from fleetsieve_bayes.campaign.directory import finite_or_none
from fleetsieve_bayes.campaign.hooks import RunHooks
from fleetsieve_bayes.campaign.journal import Journal, RoundRecord, open_journal
from fleetsieve_bayes.campaign.outputs import (
    CampaignResult,
    result_json,
    write_measurements,
    write_result,
    write_round_files,
)
from fleetsieve_bayes.campaign.records import (
    Event,
    cell_of,
    journal_measurement,
    round_record,
    sampling_events,
)
from fleetsieve_bayes.campaign.setup import CampaignSetup, begin, build_strategy
from fleetsieve_bayes.campaign.windows import check_window, window_limits
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.interrupts import check as check_interrupt
from fleetsieve_bayes.jax_cache import release_compiled_if_crowded
from fleetsieve_bayes.model.sampling_progress import sampling_progress
from fleetsieve_bayes.round import (
    CampaignState,
    RoundOutcome,
    new_state,
    observe,
    pending_design,
    round_key,
    step,
    stop_undecided,
)

__all__ = ["run_sequential", "WARM_START_DIR"]

# Warm starts of this driver, keyed by round.
WARM_START_DIR = "warm_start"


def run_sequential(setup: CampaignSetup, out: Path, backend: Backend, on_event: Event, hooks: RunHooks) -> CampaignResult:
    """Run or resume the campaign in ``out`` one cell at a time (module docstring); the
    caller holds the directory lock."""
    t_start = time.perf_counter()
    journal = open_journal(out, on_append=hooks.on_append)
    try:
        grid = backend.grid
        begin(setup, out, journal, grid, on_event)
        problem = setup.campaign.problem()
        strategy = build_strategy(setup, grid, problem)
        state = new_state(grid, problem, setup.card, setup.preset, strategy, setup.seed, journal.records,
                          window_limit=window_limits(backend.windows_available, grid.n_cells))
        measure = hooks.wrap(_measure_fn(backend))
        with sampling_progress(sampling_events(on_event)):
            final = _drive(setup, out, journal, state, measure, backend, on_event)
        result = finite_or_none(result_json(setup, grid, journal, final, time.perf_counter() - t_start))
        write_result(out, result)
        on_event("done", result)
        return CampaignResult(result["status"], result)
    finally:
        journal.close()


def _measure_fn(backend: Backend) -> Any:
    def measure(c: int, replicate: int = 0) -> dict[str, Any]:
        row = backend.preflight(c)
        return backend.measure(c, replicate) if row is None else row

    return measure


def _drive(
    setup: CampaignSetup, out: Path, journal: Journal, state: CampaignState, measure: Any, backend: Backend,
    on_event: Event,
) -> RoundRecord:
    """Turns until a round stops the campaign; returns that round's record."""
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start

    grid = state.grid
    budget = Budget.of(setup.campaign)
    while True:
        check_interrupt()  # a Ctrl-C that a finaliser swallowed still stops here
        design = pending_design(state)
        if design:
            _measure(journal, state, measure, backend, design[0], 0, "design", on_event)
            if not pending_design(state := observe(state, journal.records)):
                write_measurements(out, journal)
            continue
        done = [r for r in journal.rounds if r.round == state.round]
        if done and not (done[-1].outcome != "measure" and reopens(done[-1], budget)):
            rec = done[-1]
            if rec.outcome != "measure":
                return rec
            assert rec.chosen is not None
            c = grid.index().get(tuple(rec.chosen))
            if c is None:
                raise InputError(f"{journal.path}: round {state.round} chose {rec.chosen.label}, not a candidate of this campaign")
            _measure(journal, state, measure, backend, c, state.round, "acquire", on_event, repeat=rec.repeat)
            write_measurements(out, journal)
            state = observe(state, journal.records)
            continue
        if state.warm_start is None:
            state = state._replace(warm_start=load_warm_start(out / WARM_START_DIR, before_round=state.round))
        measured = state.measured
        release_compiled_if_crowded()
        before = state
        state, rnd = step(state, setup.settings)
        save_warm_start(out / WARM_START_DIR, rnd.posterior, round_no=rnd.round)
        # Persist this round's view for status/report before the record that commits to it.
        write_round_files(out, grid, rnd.shown, rnd.assessment.view.bounds, measured)
        rnd, stop = _within_budget(setup, journal, before, rnd, budget)
        rec = _round_record(journal, state, rnd, int(measured.sum()), stop)
        journal.append(rec)
        on_event("round", rec.to_json())


def _within_budget(
    setup: CampaignSetup, journal: Journal, state: CampaignState, rnd: RoundOutcome, budget: Budget
) -> tuple[RoundOutcome, dict[str, Any] | None]:
    """``rnd`` as it stands when its chosen cell fits the budget (or none is set); else the
    round stopped ``undecided`` before it, with the budget stop's record
    (:mod:`fleetsieve_bayes.campaign.budget`)."""
    if rnd.phase != "acquire" or rnd.chosen is None or not budget.is_set:
        return rnd, None
    c = rnd.chosen
    gpu, wall = spent(journal.records)
    if budget.allows(gpu + float(state.grid.cost_gpu_s[c]), wall + float(state.grid.duration_s[c])):
        return rnd, None
    a = rnd.assessment
    assert a is not None
    cells = next_cells(state, setup.settings, a, rnd.posterior, rnd.round, budget, gpu, c)
    seed = round_key(state.seed, rnd.round).attempt_seed
    a = stop_undecided(state, setup.settings, a, rnd.posterior, seed=seed)
    stopped = rnd._replace(phase="final", status=a.decision.status, chosen=None, assessment=a, repeat=False)
    return stopped, stop_json(budget, state.grid, c, gpu, wall, cells)


def _round_record(
    journal: Journal, state: CampaignState, rnd: RoundOutcome, measured_cells: int, stop: dict[str, Any] | None = None,
) -> RoundRecord:
    a = rnd.assessment
    assert a is not None and rnd.timings is not None
    return round_record(
        state.grid,
        rnd.round,
        a.view,
        outcome="measure" if rnd.phase == "acquire" else rnd.status,
        measured_cells=measured_cells,
        gpu_seconds=float(sum(r.gpu_seconds for r in journal.measurements)),
        chosen=rnd.chosen,
        timings=rnd.timings,
        final=a.final,
        joint=a.joint_json(),
        repeat=rnd.repeat,
        stop=stop,
        alternatives=a.alternatives,
    )


def _measure(
    journal: Journal, state: CampaignState, measure: Any, backend: Backend, c: int, round_no: int, phase: str,
    on_event: Event, *, repeat: bool = False,
) -> None:
    """Measure (or preflight-skip) one window of a cell — its next, asked for as a repeat
    when the cell has one already — and journal it durably."""
    replicate = check_window(state.grid, journal.records, c, repeat=repeat)
    cell = cell_of(state.grid, c)
    on_event(
        "measure-start",
        {
            "cell": cell.to_json(),
            "label": cell.label,
            "expected_s": float(backend.expected_duration_s[c]),
            "round": round_no,
            "candidates": state.grid.n_cells,
            "replicate": replicate,
        },
    )
    started = time.time()
    row = measure(c, replicate)
    finished = time.time()
    journal_measurement(
        journal, state.grid, c, row, round_no=round_no, phase=phase, started=started, finished=finished,
        on_event=on_event, replicate=replicate,
    )
