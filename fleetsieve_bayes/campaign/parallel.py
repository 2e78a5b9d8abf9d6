"""The asynchronous driver: a campaign that measures several cells at once.

Used instead of the one-cell-at-a-time loop when the campaign sets
``[measurement] pool_gpus`` or ``executor = "ray"``. The model, bounds,
allocator, certificate and strategies are the loop's; what changes is when
cells start:

1. **Initial design** (shared by every strategy): its cells start as soon as
   they fit in the free GPUs, in design order, first fit (a TP8 cell waits
   for 8 free GPUs while smaller design cells fill the gap).
2. **Refit and refill on every completion.** Once every design cell has
   started and one has finished, each completion (on the simulated clock:
   every cell finishing at that instant) triggers one refit on what is
   measured, then the real certificate: if it is issued (or nothing is left),
   the campaign ends — cells still in flight are cancelled, their GPU-seconds
   so far counted. Otherwise :func:`fleetsieve_bayes.decision.batch.plan_batch`
   fills the free GPUs with picks conditioned on the cells in flight
   ("believer" conditioning; no cell starts when the believed state would
   already certify). A pick that does not fit becomes the reservation: later
   picks may fill the gap only if they do not delay it (EASY backfilling on
   the expected durations).
3. **Journal.** Each start is a ``started`` record (cell, round, phase, GPU
   slots, ``start_s`` on the campaign clock) written before the cell runs;
   each completion a ``measurement`` record then a ``finished`` record
   (``finish_s``, where it ran); a cell stopped at the end a ``cancelled``
   record. An acquisition's ``started`` record lists the cells its pick was
   conditioned on (``believed``); a round record per pick (``chosen``) holds
   the real certificate and allocations.
4. **Resume.** Cells started but not finished are submitted again first
   (on the simulated clock at their original start time, so the replay is
   exact); a measured cell is never started again. Every refit warm-starts
   from the state saved by the latest earlier refit on disk, keyed by the
   number of measured cells, and its seed depends only on (seed, that
   number); every pick's randomness on (seed, round). So the same seed and
   the same completion order give the same decisions, interrupted or not.
5. **A failed cell** (the harness broke: an exception, a Ray task that died
   twice) stops new starts; the cells in flight are awaited and journaled,
   then the campaign stops with a :class:`MeasurementError` naming the cell.
   A resume re-runs it.

``profiling_wall_s`` (:mod:`fleetsieve_bayes.campaign.makespan`) is the union
of the cells' clock intervals; ``gpu_seconds`` adds the cancelled cells'
partial GPU-seconds to the measured ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid, problem_from_campaign
from fleetsieve_bayes.backends import Backend
from fleetsieve_bayes.campaign import loop
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.executor import (
    Done,
    Executor,
    GpuPool,
    Job,
    cell_runner,
    local_executor,
    ray_executor,
)
from fleetsieve_bayes.campaign.journal import atomic_write_text, open_journal
from fleetsieve_bayes.campaign.makespan import cell_key, in_flight_cells, record_dict
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
)
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.errors import InputError, MeasurementError
from fleetsieve_bayes.jax_cache import enable_compilation_cache

__all__ = ["run_parallel", "in_flight_cells", "WARM_START_DIR"]

# Warm starts of the parallel driver, keyed by the number of measured cells.
WARM_START_DIR = "warm_start_pool"
# At most this many strategy calls per completion (bounds planning time).
MAX_PICKS = 8


def _clock_offset(records: list[Any]) -> float:
    """Where the campaign clock stopped: the latest start/finish time in the journal."""
    t = 0.0
    for raw in records:
        rec = record_dict(raw)
        for key in ("start_s", "finish_s"):
            if isinstance(rec.get(key), (int, float)) and rec.get("type") in ("started", "finished", "cancelled"):
                t = max(t, float(rec[key]))
    return t


def _make_executor(
    campaign: Campaign, out: Path, backend: Backend, explicit_backend: bool, offset: float
) -> tuple[Executor, int]:
    pool = campaign.pool
    if pool.executor == "ray":
        return ray_executor(campaign, out, backend.grid, offset_s=offset, pool_gpus=pool.pool_gpus)
    assert pool.pool_gpus is not None  # validated: a local pool has a size
    opts = campaign.measurement.options
    simulated = campaign.measurement.backend == "replay" and not float(opts.get("time_scale", 0.0) or 0.0)
    if explicit_backend or campaign.measurement.backend == "replay":

        def measure(c: int, slots: tuple[int, ...]) -> dict[str, Any]:
            row = backend.preflight(c)
            return backend.measure(c) if row is None else row

    else:
        # A backend per cell, on the devices its slots map to (``[measurement] gpus`` or 0..n-1).
        devices = [int(g) for g in opts.get("gpus", range(pool.pool_gpus))]
        if len(devices) < pool.pool_gpus:
            raise InputError(
                f"{campaign.path}: [measurement] pool_gpus: {pool.pool_gpus} GPUs but [measurement] gpus "
                f"lists {len(devices)} devices"
            )
        run = cell_runner(campaign, out)

        def measure(c: int, slots: tuple[int, ...]) -> dict[str, Any]:
            return run(backend.grid.key(c), tuple(devices[s] for s in slots))

    return local_executor(measure, simulated=simulated, offset_s=offset), int(pool.pool_gpus)


class _Context(NamedTuple):
    """What one invocation of the driver works with and never rebinds (the pool, journal
    and executor are stateful objects; the helpers use them in place)."""

    inputs: Any
    campaign: Campaign
    out: Path
    grid: CellGrid
    problem: Any
    strategy: Any
    tp: np.ndarray  # (n_cells,) int64
    expected: np.ndarray  # (n_cells,) expected seconds per cell
    journal: Any
    executor: Executor
    pool: GpuPool
    on_event: Any


@dataclass
class _Flight:
    """The driver's bookkeeping of starts, mutated by :func:`_start`, :func:`_fill_mandatory`,
    :func:`_admit` and :func:`_absorb` (one place, instead of closures sharing cells)."""

    flight: dict[int, dict[str, Any]]  # cell → its started record, while it runs
    seq: int  # the next started record's sequence number
    next_round: int  # the next acquisition's round number
    restart: list[tuple[int, dict[str, Any]]]  # resumed cells not yet started again
    design: list[int]  # initial-design cells not yet started
    failures: list[tuple[int, str]] = field(default_factory=list)  # (cell, harness error)


class _Step(NamedTuple):
    """One completion's decision: a final status (None: keep going) and what it rests on."""

    status: str | None
    final_alloc: Any
    real: Any  # the real (unconditioned) Belief
    t_fit: float
    t_alloc: float
    joint: dict[str, Any] | None = None  # the certification attempt's joint check, if one ran


class _Outcome(NamedTuple):
    status: str
    final_rec: Any
    cancelled: list[dict[str, Any]]
    plan_times: list[float]  # refit + batch selection, per completion (wall)
    plan_cpu: list[float]  # the same in CPU seconds of this process (all threads)


def run_parallel(
    inputs: Any,
    out: Path,
    backend: Backend,
    on_event: Any,
    *,
    explicit_backend: bool = False,
) -> loop.CampaignOutcome:
    """Run or resume ``campaign`` in ``out`` measuring several cells at once (module docstring).

    Called by :func:`fleetsieve_bayes.campaign.loop.run_campaign` (which holds
    the directory lock) when the campaign asks for a pool or Ray.

    Raises:
        InputError: a pool too small for a candidate cell, Ray missing, a
            journal from another campaign.
        MeasurementError: a cell's harness failed (after the others finished).
    """
    campaign: Campaign = inputs.campaign
    enable_compilation_cache()
    t_start = time.perf_counter()
    grid: CellGrid = backend.grid
    problem = problem_from_campaign(campaign)
    strategy = loop.campaign_strategy(inputs.strategy, campaign, grid, problem, inputs.seed)
    tp = np.asarray(grid.tp, np.int64)

    journal = open_journal(out)
    executor: Executor | None = None
    try:
        resumed = _begin(inputs, out, journal, grid, on_event)
        executor, pool_n = _make_executor(campaign, out, backend, explicit_backend, _clock_offset(journal.records))
        _check_pool_holds_every_cell(campaign, grid, tp, pool_n)
        ctx = _Context(
            inputs=inputs,
            campaign=campaign,
            out=out,
            grid=grid,
            problem=problem,
            strategy=strategy,
            tp=tp,
            expected=np.asarray(backend.expected_duration_s, np.float64),
            journal=journal,
            executor=executor,
            pool=GpuPool(pool_n),
            on_event=on_event,
        )
        measured, observed, _ = loop.measured_state(grid, journal.records)
        fl = _resume_flight(ctx, measured, resumed)
        outcome = _drive(ctx, fl, measured, observed)
        return _finish(ctx, outcome, t_start)
    finally:
        if executor is not None:
            executor.close()
        journal.close()


def _check_pool_holds_every_cell(campaign: Campaign, grid: CellGrid, tp: np.ndarray, pool_n: int) -> None:
    if int(tp.max()) > pool_n:
        big = int(np.argmax(tp))
        raise InputError(
            f"{campaign.path}: [measurement] pool_gpus: {pool_n} GPUs cannot hold cell "
            f"{grid.describe(big)} (TP{int(tp[big])}); use at least {int(tp.max())}"
        )


def _resume_flight(ctx: _Context, measured: np.ndarray, resumed: bool) -> _Flight:
    """The start bookkeeping from the journal: sequence and round numbers continue, cells
    started but never finished run again first, then the design cells not yet measured."""
    grid, records = ctx.grid, ctx.journal.records
    started = [record_dict(r) for r in records if record_dict(r).get("type") == "started"]
    acq_cells = {cell_key(d["cell"]) for d in started if d.get("phase") == "acquire"}
    index = grid.index()
    restart = [(index[cell_key(r["cell"])], r) for r in in_flight_cells(records)]
    restart = [(c, r) for c, r in restart if not measured[c]]
    if resumed and restart:
        ctx.on_event("resume", {"measured": int(measured.sum()), "in_flight": [grid.describe(c) for c, _ in restart]})
    design = [c for c in initial_design(grid) if not measured[c] and c not in dict(restart)]
    return _Flight(flight={}, seq=len(started), next_round=1 + len(acq_cells), restart=restart, design=design)


def _drive(ctx: _Context, fl: _Flight, measured: np.ndarray, observed: Any) -> _Outcome:
    """The event loop: start what must start, decide on every completion, wait for the next."""
    posterior: Any = None
    fitted_at = -1
    plan_times: list[float] = []
    plan_cpu: list[float] = []
    while True:
        if not fl.failures:
            _fill_mandatory(ctx, fl)
        n_measured = int(measured.sum())
        if not fl.failures and not fl.restart and not fl.design and n_measured > 0:
            t_event = time.perf_counter()
            cpu_event = time.process_time()
            t_fit = 0.0
            if fitted_at != n_measured:
                posterior = _refit(ctx, measured, observed, n_measured)
                fitted_at = n_measured
                t_fit = time.perf_counter() - t_event
            step = _decide(ctx, fl, posterior, measured, observed, n_measured, t_fit)
            plan_times.append(time.perf_counter() - t_event)
            plan_cpu.append(time.process_time() - cpu_event)
            # For status/report; written once the free GPUs are refilled (off the critical path).
            loop._write_round_files(ctx.out, ctx.grid, posterior, step.real.bounds, measured)
            late = ctx.executor.ready() if step.status is not None else []
            if late:
                # Cells that finished while this refit ran are measured, not cancelled:
                # decide again with them.
                _absorb(ctx, fl, late)
                measured, observed, _ = loop.measured_state(ctx.grid, ctx.journal.records)
                continue
            if step.status is not None:
                cancelled = _cancel_in_flight(ctx, fl)
                timings = {"fit_s": step.t_fit, "allocate_s": step.t_alloc, "acquire_s": 0.0}
                final_rec = _round_record(
                    ctx.journal, ctx.grid, fl.next_round, step.real, n_measured, step.status, None, timings,
                    step.final_alloc, joint=step.joint,
                )
                ctx.on_event("round", record_dict(final_rec))
                return _Outcome(step.status, final_rec, cancelled, plan_times, plan_cpu)

        if not fl.flight:
            if fl.failures:
                c, err = fl.failures[0]
                raise MeasurementError(
                    f"cell {ctx.grid.describe(c)}: {err} (the other cells in flight were recorded; "
                    f"run again to resume — it re-measures {ctx.grid.describe(c)})"
                )
            raise RuntimeError("parallel driver: nothing in flight, nothing to start and no decision")
        _absorb(ctx, fl, ctx.executor.wait_any())
        measured, observed, _ = loop.measured_state(ctx.grid, ctx.journal.records)


def _refit(ctx: _Context, measured: np.ndarray, observed: Any, n_measured: int) -> Any:
    """Fit on what is measured, warm-started from the latest earlier refit on disk; the seed
    depends only on (seed, n_measured) so an interrupted campaign replays exactly."""
    from fleetsieve_bayes.model.inference import fit
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start

    inputs = ctx.inputs
    warm = load_warm_start(ctx.out / WARM_START_DIR, before_round=n_measured)
    posterior = fit(
        ctx.grid,
        observed,
        measured,
        inputs.card,
        inputs.preset,
        seed=loop._round_seed(inputs.seed, n_measured),
        warm_start=warm,
        server_failed=loop.server_failures(ctx.grid, ctx.journal.records),
    )
    save_warm_start(ctx.out / WARM_START_DIR, posterior, round_no=n_measured)
    return posterior


def _decide(
    ctx: _Context,
    fl: _Flight,
    posterior: Any,
    measured: np.ndarray,
    observed: Any,
    n_measured: int,
    t_fit: float,
) -> _Step:
    """The real certificate, then either stop (a final status) or fill the free GPUs."""
    allocate, believe_fn = _believer(ctx, posterior, measured, observed)
    t0 = time.perf_counter()
    real = believe_fn([])
    joint = None
    if real.certificate.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
        # As in the sequential loop: a certificate is only issued from the converged
        # certifying posterior, after the decision-level joint check.
        attempt = loop._attempt_certification(
            ctx.inputs, ctx.grid, ctx.problem, observed, measured, fl.next_round, posterior,
            loop.server_failures(ctx.grid, ctx.journal.records),
        )
        real = real._replace(
            bounds=attempt.bounds,
            conservative=attempt.conservative,
            optimistic=attempt.optimistic,
            certificate=attempt.certificate,
        )
        joint = attempt.to_json()
    t_alloc = time.perf_counter() - t0
    candidates = ~measured
    candidates[list(fl.flight)] = False
    # The loop's stopping rule on what is measured; cells in flight count as
    # unmeasured, and only a certificate stops the campaign while some fly.
    decision = loop.decide_round(
        loop.RoundFacts(fl.next_round, real.certificate.status, int((~measured).sum()), ctx.campaign.max_rounds)
    )
    status, final_alloc = None, None
    if not decision.acquire and (not fl.flight or decision.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE)):
        status = decision.status
        if decision.final == "conservative":
            final_alloc = real.conservative
        elif decision.final == "measured-only":
            final_alloc = allocate(loop._measured_only_table(observed, measured))
    elif decision.acquire and candidates.any() and ctx.pool.n_free >= int(ctx.tp[candidates].min()):
        _acquire(ctx, fl, posterior, real, candidates, believe_fn, n_measured, (t_fit, t_alloc))
    return _Step(status, final_alloc, real, t_fit, t_alloc, joint)


def _believer(ctx: _Context, posterior: Any, measured: np.ndarray, observed: Any) -> tuple[Any, Any]:
    """``allocate(values)`` and ``believe_fn(believed)`` bound to this completion's state."""
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.decision.batch import believe

    campaign = ctx.campaign

    def allocate(values: np.ndarray) -> Any:
        return allocate_milp(ctx.grid, values, ctx.problem)

    def believe_fn(believed: Any) -> Any:
        return believe(
            ctx.grid,
            ctx.problem,
            posterior,
            measured,
            observed,
            believed,
            credible_level=campaign.credible_level,
            repeatability=campaign.repeatability,
            rules=campaign.interval_rules,
            epsilon=campaign.epsilon,
            allocate=allocate,
        )

    return allocate, believe_fn


def _acquire(
    ctx: _Context,
    fl: _Flight,
    posterior: Any,
    real: Any,
    candidates: np.ndarray,
    believe_fn: Any,
    n_measured: int,
    t_fit_alloc: tuple[float, float],
) -> None:
    """Plan a batch of picks conditioned on the cells in flight, start those that fit
    (via :func:`_admit`) and journal a round record per started pick."""
    from fleetsieve_bayes.decision.batch import plan_batch

    campaign = ctx.campaign
    free_cells = max(1, ctx.pool.n_free // max(1, int(ctx.tp[candidates].min())))
    if campaign.max_rounds is not None:
        free_cells = min(free_cells, campaign.max_rounds - fl.next_round + 1)
    plan = plan_batch(
        believe_fn=believe_fn,
        select=lambda belief, round_no: _select(ctx, posterior, belief, round_no),
        candidates=candidates,
        in_flight=list(fl.flight),
        admit=lambda c, reserved: _admit(ctx, fl, c, reserved),
        first_round=fl.next_round,
        max_picks=min(MAX_PICKS, free_cells + 1),
        real=real,
    )
    t_fit, t_alloc = t_fit_alloc
    first = True
    for pick in plan.picks:
        if not pick.start:
            continue
        # The refit and the real allocation are charged to the first pick only.
        timings = {
            "fit_s": t_fit if first else 0.0,
            "allocate_s": t_alloc if first else 0.0,
            "acquire_s": pick.seconds,
        }
        first = False
        rec = _round_record(ctx.journal, ctx.grid, pick.round, real, n_measured, "measure", pick.cell, timings, None)
        ctx.on_event("round", record_dict(rec))


def _select(ctx: _Context, posterior: Any, belief: Any, round_no: int) -> int:
    """The strategy's pick on a believed state; its randomness depends on (seed, round) only."""
    from fleetsieve_bayes.decision.strategies import RoundState

    campaign, seed = ctx.campaign, ctx.inputs.seed
    state = RoundState(
        grid=ctx.grid,
        problem=ctx.problem,
        campaign_epsilon=campaign.epsilon,
        credible_level=campaign.credible_level,
        repeatability=campaign.repeatability,
        measured=belief.measured.copy(),
        observed=belief.observed.copy(),
        posterior=posterior,
        bounds=belief.bounds,
        conservative=belief.conservative,
        optimistic=belief.optimistic,
        certificate=belief.certificate,
        round=round_no,
        rng=np.random.default_rng([seed, round_no]),
        key=loop._jax_key(seed, round_no),
    )
    return int(ctx.strategy.select(state))


def _start(
    ctx: _Context,
    fl: _Flight,
    c: int,
    *,
    phase: str,
    round_no: int,
    slots: tuple[int, ...],
    start_s: float,
    resumed: bool = False,
    believed: list[int] | None = None,
) -> None:
    """Journal a ``started`` record (durable before the cell runs), then submit the cell."""
    grid = ctx.grid
    rec = {
        "type": "started",
        "seq": fl.seq,
        "round": round_no,
        "phase": phase,
        "cell": _cell_json(grid, c),
        "gpus": list(slots),
        "start_s": float(start_s),
        "started_at": time.time(),
    }
    if resumed:
        rec["resumed"] = True
    if believed is not None:  # what the pick was conditioned on
        rec["believed"] = [_cell_json(grid, k) for k in believed]
    ctx.journal.append(_Raw(rec))
    fl.flight[c] = rec
    ctx.executor.submit(Job(c, int(ctx.tp[c]), slots, float(start_s), fl.seq))
    fl.seq += 1
    ctx.on_event(
        "measure-start",
        {
            "cell": rec["cell"],
            "label": grid.describe(c),
            "expected_s": float(ctx.expected[c]),
            "round": round_no,
            "candidates": grid.n_cells,
            "gpus": list(slots),
            "in_flight": [grid.describe(k) for k in fl.flight],
        },
    )


def _fill_mandatory(ctx: _Context, fl: _Flight) -> None:
    """Start resumed cells (on their old GPUs if free) then design cells, first fit."""
    for c, r in list(fl.restart):
        slots = ctx.pool.take(int(ctx.tp[c]), prefer=tuple(r.get("gpus", ())))
        if slots is None:
            continue
        # On the simulated clock a resumed cell keeps its start time, so the replay is exact.
        s = float(r["start_s"]) if ctx.executor.simulated else ctx.executor.now()
        _start(ctx, fl, c, phase=r.get("phase", "acquire"), round_no=int(r.get("round", 0)), slots=slots, start_s=s, resumed=True)
        fl.restart.remove((c, r))
    for c in list(fl.design):
        slots = ctx.pool.take(int(ctx.tp[c]))
        if slots is None:
            continue  # waits; a smaller design cell may fill the gap
        _start(ctx, fl, c, phase="design", round_no=0, slots=slots, start_s=ctx.executor.now())
        fl.design.remove(c)


def _admit(ctx: _Context, fl: _Flight, c: int, reserved: int | None) -> bool:
    """Start ``c`` now if it fits and (with a reservation) does not delay it."""
    need = int(ctx.tp[c])
    if not ctx.pool.fits(need):
        return False
    now = ctx.executor.now()
    if reserved is not None:
        shadow, extra = _reservation_window(ctx, fl, now, int(ctx.tp[reserved]))
        if not (now + ctx.expected[c] <= shadow + 1e-9 or need <= extra):
            return False
    slots = ctx.pool.take(need)
    assert slots is not None
    _start(
        ctx,
        fl,
        c,
        phase="acquire",
        round_no=fl.next_round,
        slots=slots,
        start_s=now,
        believed=list(fl.flight) + ([] if reserved is None else [reserved]),
    )
    fl.next_round += 1
    return True


def _reservation_window(ctx: _Context, fl: _Flight, now: float, need_reserved: int) -> tuple[float, int]:
    """EASY backfilling: ``(shadow, extra)`` — when the reservation can start (cells in flight
    finishing at their expected times) and the GPUs it leaves spare then."""
    free = ctx.pool.n_free
    shadow = now
    for f, k in sorted((float(r["start_s"]) + ctx.expected[k], k) for k, r in fl.flight.items()):
        if free >= need_reserved:
            break
        free += int(ctx.tp[k])
        shadow = max(shadow, f)
    return shadow, free - need_reserved


def _absorb(ctx: _Context, fl: _Flight, dones: list[Done]) -> None:
    """Journal finished cells (or their harness failures) and free their GPUs."""
    for done in dones:
        c = done.job.cell
        r = fl.flight.pop(c)
        ctx.pool.give(tuple(r["gpus"]))
        if done.error is not None or done.row is None:
            ctx.journal.append(
                _Raw(
                    type="failed",
                    cell=r["cell"],
                    start_s=r["start_s"],
                    finish_s=float(done.finish_s),
                    error=done.error,
                )
            )
            fl.failures.append((c, str(done.error)))
            continue
        _record(ctx.journal, ctx.grid, c, done, r, ctx.on_event)
    loop._write_measurements(ctx.out, ctx.journal)


def _cancel_in_flight(ctx: _Context, fl: _Flight) -> list[dict[str, Any]]:
    """Stop every cell still running; its GPU-seconds so far are journaled and counted."""
    cancelled = []
    for c, r in list(fl.flight.items()):
        t = ctx.executor.cancel(c)
        rec = {
            "type": "cancelled",
            "cell": r["cell"],
            "gpus": r["gpus"],
            "start_s": r["start_s"],
            "finish_s": float(t),
            "gpu_seconds": max(0.0, float(t) - float(r["start_s"])) * int(ctx.tp[c]),
        }
        ctx.journal.append(_Raw(rec))
        cancelled.append(rec)
        ctx.pool.give(tuple(r["gpus"]))
        del fl.flight[c]
    return cancelled


def _finish(ctx: _Context, outcome: _Outcome, t_start: float) -> loop.CampaignOutcome:
    """The loop's result.json plus the cancelled cells, per-completion timings and the pool."""
    journal = ctx.journal
    result = _result(ctx.inputs, ctx.grid, journal, outcome.final_rec, t_start)
    result["gpu_seconds"] = float(result["gpu_seconds"] + sum(r["gpu_seconds"] for r in _of(journal.records, "cancelled")))
    result["cancelled"] = [r["cell"] for r in outcome.cancelled]
    # This invocation's refit + batch selection per completion: wall and CPU seconds.
    result["timings"]["per_completion_s"] = outcome.plan_times
    result["timings"]["per_completion_cpu_s"] = outcome.plan_cpu
    result["pool"] = {
        "pool_gpus": ctx.pool.n,
        "executor": ctx.campaign.pool.executor,
        "clock": "simulated" if ctx.executor.simulated else "real",
    }
    atomic_write_text(ctx.out / "result.json", json.dumps(result, indent=2) + "\n")
    ctx.on_event("done", result)
    return loop.CampaignOutcome(outcome.status, result, result["allocation"])


class _Raw(dict):
    """A journal record of this driver's own types (``started``, ``finished``, ``cancelled``,
    ``failed``): a plain JSON object that also answers ``to_json`` like the typed records."""

    def to_json(self) -> dict[str, Any]:
        return dict(self)


def _of(records: list[Any], kind: str) -> list[dict[str, Any]]:
    return [d for d in (record_dict(r) for r in records) if d.get("type") == kind]


def _spent(records: list[Any]) -> float:
    return float(sum(r["gpu_seconds"] for r in _of(records, "measurement")) + sum(r["gpu_seconds"] for r in _of(records, "cancelled")))


def _record(journal: Any, grid: CellGrid, c: int, done: Done, started: dict[str, Any], on_event: Any) -> None:
    """The measurement record (the loop's), then the ``finished`` record with the clock time."""
    loop._journal_measurement(
        journal,
        grid,
        c,
        done.row,
        round_no=int(started.get("round", 0)),
        phase=str(started.get("phase", "acquire")),
        started=done.started_at,
        finished=done.finished_at,
        on_event=on_event,
    )
    journal.append(
        _Raw(
            type="finished",
            cell=started["cell"],
            gpus=started["gpus"],
            start_s=started["start_s"],
            finish_s=float(done.finish_s),
            **({"where": done.info} if done.info else {}),
        )
    )


# --- what depends on the journal's record types and the loop's helpers ---------------


def _cell_json(grid: CellGrid, c: int) -> dict[str, Any]:
    return loop._cell(grid, c).to_json()


def _begin(inputs: Any, out: Path, journal: Any, grid: CellGrid, on_event: Any) -> bool:
    """The loop's start or resume (header, fingerprint check, seeded rows); True when resuming."""
    resumed = journal.header is not None
    loop._begin(inputs, out, journal, grid, on_event)
    return resumed


def _round_record(
    journal: Any,
    grid: CellGrid,
    round_no: int,
    real: Any,
    n_measured: int,
    outcome: str,
    chosen: int | None,
    timings: dict[str, float],
    final: Any,
    joint: dict[str, Any] | None = None,
) -> Any:
    """Append one round record (the real state's certificate and allocations) and return it."""
    from fleetsieve_bayes.campaign.journal import RoundRecord

    cert = real.certificate
    rec = RoundRecord(
        round=round_no,
        certificate=cert.status,
        outcome=outcome,
        reason=cert.reason,
        gap={k: float(v) for k, v in cert.gap._asdict().items()},
        conservative=loop._side(real.conservative, grid),
        optimistic=loop._side(real.optimistic, grid),
        measured_cells=n_measured,
        candidates=grid.n_cells,
        gpu_seconds=_spent(journal.records),
        chosen=None if chosen is None else loop._cell(grid, chosen),
        timings=timings,
        final=None if final is None else loop._side(final, grid),
        joint=joint,
    )
    journal.append(rec)
    return rec


def _result(inputs: Any, grid: CellGrid, journal: Any, final_rec: Any, t_start: float) -> dict[str, Any]:
    """The loop's result.json, from the journal."""
    return loop._result_json(inputs, grid, journal, final_rec, time.perf_counter() - t_start)
