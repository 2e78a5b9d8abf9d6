"""The asynchronous driver: a campaign that measures several cells at once.

Used instead of the one-cell-at-a-time driver when the campaign sets
``[measurement] pool_gpus`` or ``executor = "ray"``. The round — fit, bounds,
both allocations, certificate, certification attempt, stopping rule and the
strategy's choice — is :mod:`fleetsieve_bayes.round`'s, as one cell at a time;
what changes is when cells start:

1. **Initial design** (shared by every strategy): its cells start as soon as
   they fit in the free GPUs, in design order, first fit (a TP8 cell waits
   for 8 free GPUs while smaller design cells fill the gap).
2. **Refit and refill on every completion.** Once every design cell has
   started and one has finished, each completion (on the simulated clock:
   every cell finishing at that instant) triggers one refit on what is
   measured, then the real certificate: if it is issued (or nothing is left),
   the campaign ends — cells still in flight are cancelled, their GPU-seconds
   so far counted. Otherwise :func:`fleetsieve_bayes.decision.batch.plan_batch`
   picks cells conditioned on the cells in flight ("believer" conditioning; no
   cell starts when the believed state would already certify), and its value
   gate starts only those worth their GPU-seconds: with nothing in flight the
   strategy's pick (one cell at a time would measure it next), then a cell the
   believed certificate needs, or one whose decision value (the kernel's
   expected gap reduction, discounted by what the cells before it are expected
   to settle) is at least :data:`~fleetsieve_bayes.decision.batch.GATE_FRACTION`
   of the best on the real state (:func:`fleetsieve_bayes.round.decision_values`).
   Free GPUs may stay idle until the next completion. A pick that does not fit
   becomes the reservation: later picks may fill the gap only if they do not
   delay it (EASY backfilling on the expected durations).
3. **Journal.** Each start is a ``started`` record (cell, round, phase, GPU
   slots, ``start_s`` on the campaign clock) written before the cell runs;
   each completion a ``measurement`` record then a ``finished`` record
   (``finish_s``, where it ran); a cell stopped at the end a ``cancelled``
   record. An acquisition's ``started`` record lists the cells its pick was
   conditioned on (``believed``: in flight, reserved or deferred by the gate);
   a round record per started pick (``chosen``) holds
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

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.backends import Backend
from fleetsieve_bayes.campaign.budget import Budget, next_cells, spent, stop_json
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
from fleetsieve_bayes.campaign.hooks import RunHooks
from fleetsieve_bayes.campaign.journal import RoundRecord, open_journal
from fleetsieve_bayes.campaign.makespan import cell_key, in_flight_cells, record_dict
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
from fleetsieve_bayes.campaign.windows import next_replicate, window_limits
from fleetsieve_bayes.decision.batch import Belief, believe
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
)
from fleetsieve_bayes.errors import InputError, MeasurementError
from fleetsieve_bayes.interrupts import check as check_interrupt
from fleetsieve_bayes.jax_cache import release_compiled_if_crowded
from fleetsieve_bayes.model.sampling_progress import sampling_progress
from fleetsieve_bayes.round import (
    Assessment,
    CampaignState,
    assess,
    choose,
    decision_values,
    fit_round,
    new_state,
    observe,
    open_cells,
    pending_design,
    round_key,
    stop_undecided,
    with_alternatives,
)
from fleetsieve_bayes.seeds import round_seed

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
    campaign: Campaign, out: Path, backend: Backend, explicit_backend: bool, offset: float, hooks: RunHooks
) -> tuple[Executor, GpuPool]:
    pool = campaign.pool
    if pool.executor == "ray":
        ex, n = ray_executor(campaign, out, backend.grid, offset_s=offset, pool_gpus=pool.pool_gpus,
                             per_gpu=pool.per_gpu)
        return ex, GpuPool(n, pool.per_gpu)
    assert pool.pool_gpus is not None  # validated: a local pool has a size
    slots = GpuPool(pool.pool_gpus, pool.per_gpu)
    opts = campaign.measurement.options
    simulated = campaign.measurement.backend == "replay" and not float(opts.get("time_scale", 0.0) or 0.0)
    if explicit_backend or campaign.measurement.backend == "replay":

        def measure(c: int, slots: tuple[int, ...], replicate: int = 0) -> dict[str, Any]:
            row = backend.preflight(c)
            return backend.measure(c, replicate) if row is None else row

    else:
        devices = _slot_devices(campaign, slots)
        run = cell_runner(campaign, out)

        def measure(c: int, slots: tuple[int, ...], replicate: int = 0) -> dict[str, Any]:
            return run(backend.grid.key(c), tuple(devices[s] for s in slots), replicate)

    return local_executor(hooks.wrap(measure), simulated=simulated, offset_s=offset), slots


def _slot_devices(campaign: Campaign, pool: GpuPool) -> list[int]:
    """The device id of each slot: ``[measurement] gpus`` (or 0..n-1) in order; with a count
    per GPU type, each group's slots are the first devices of its pool's ``gpus`` entry."""
    where = f"{campaign.path}: [measurement] pool_gpus"
    if campaign.pool.per_gpu is not None:
        from fleetsieve_bayes.backends.vllm import parse_vllm_options

        per_pool = parse_vllm_options(campaign).pool_devices
        names = campaign.pool_names or ()
        for name, n, ids in zip(names, pool.sizes, per_pool, strict=True):
            if n > len(ids):
                raise InputError(f"{where}.{name}: {n} GPUs but [measurement] gpus.{name} lists {len(ids)} devices")
        return [int(g) for n, ids in zip(pool.sizes, per_pool, strict=True) for g in ids[:n]]
    devices = [int(g) for g in campaign.measurement.options.get("gpus", range(pool.n))]
    if len(devices) < pool.n:
        raise InputError(f"{where}: {pool.n} GPUs but [measurement] gpus lists {len(devices)} devices")
    return devices


class _Context(NamedTuple):
    """What one invocation of the driver works with and never rebinds (the pool, journal
    and executor are stateful objects; the helpers use them in place)."""

    setup: CampaignSetup
    campaign: Campaign
    out: Path
    grid: CellGrid
    tp: np.ndarray  # (n_cells,) int64
    group: np.ndarray  # (n_cells,) int64: the slot group (GPU type) a cell runs on; all 0 without
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
    blocked: int | None = None  # this decision's first pick the profiling budget refused


class _Step(NamedTuple):
    """One completion's decision: a final status (None: keep going) and what it rests on."""

    status: str | None
    assessment: Assessment  # the real (unconditioned) state, the attempt, the stopping rule
    t_fit: float
    t_alloc: float
    stop: dict[str, Any] | None = None  # a stop by the profiling budget (campaign/budget.py)

    @property
    def real(self) -> Belief:
        return self.assessment.view

    @property
    def joint(self) -> dict[str, Any] | None:
        return self.assessment.joint_json()


class _Outcome(NamedTuple):
    status: str
    final_rec: Any
    cancelled: list[dict[str, Any]]
    plan_times: list[float]  # refit + batch selection, per completion (wall)
    plan_cpu: list[float]  # the same in CPU seconds of this process (all threads)


def run_parallel(
    setup: CampaignSetup,
    out: Path,
    backend: Backend,
    on_event: Event,
    hooks: RunHooks,
    *,
    explicit_backend: bool = False,
) -> CampaignResult:
    """Run or resume the campaign in ``out`` measuring several cells at once (module docstring).

    Called by :func:`fleetsieve_bayes.campaign.runner.run_campaign` (which holds
    the directory lock) when the campaign asks for a pool or Ray.

    Raises:
        InputError: a pool too small for a candidate cell, Ray missing, a
            journal from another campaign.
        MeasurementError: a cell's harness failed (after the others finished).
    """
    campaign = setup.campaign
    t_start = time.perf_counter()
    grid: CellGrid = backend.grid
    problem = campaign.problem()
    tp = np.asarray(grid.tp, np.int64)

    journal = open_journal(out, on_append=hooks.on_append)
    executor: Executor | None = None
    try:
        resumed = begin(setup, out, journal, grid, on_event)
        offset = _clock_offset(journal.records)
        executor, slots = _make_executor(campaign, out, backend, explicit_backend, offset, hooks)
        group = grid.gpu_idx if slots.sizes != (slots.n,) else np.zeros(grid.n_cells, np.int64)
        _check_pool_holds_every_cell(campaign, grid, tp, group, slots)
        ctx = _Context(
            setup=setup,
            campaign=campaign,
            out=out,
            grid=grid,
            tp=tp,
            group=group,
            expected=np.asarray(backend.expected_duration_s, np.float64),
            journal=journal,
            executor=executor,
            pool=slots,
            on_event=on_event,
        )
        strategy = build_strategy(setup, grid, problem)
        state = new_state(grid, problem, setup.card, setup.preset, strategy, setup.seed, journal.records,
                          window_limit=window_limits(backend.windows_available, grid.n_cells))
        fl = _resume_flight(ctx, state, resumed)
        with sampling_progress(sampling_events(ctx.on_event)):
            outcome = _drive(ctx, fl, state)
        return _finish(ctx, outcome, t_start)
    finally:
        if executor is not None:
            executor.close()
        journal.close()


def _check_pool_holds_every_cell(
    campaign: Campaign, grid: CellGrid, tp: np.ndarray, group: np.ndarray, pool: GpuPool
) -> None:
    for j, n in enumerate(pool.sizes):
        mine = np.flatnonzero(group == j)
        if mine.size and int(tp[mine].max()) > n:
            big = int(mine[np.argmax(tp[mine])])
            key = "pool_gpus" if len(pool.sizes) == 1 else f"pool_gpus.{grid.pools[j]}"
            raise InputError(
                f"{campaign.path}: [measurement] {key}: {n} GPUs cannot hold cell "
                f"{grid.describe(big)} (TP{int(tp[big])}); use at least {int(tp[mine].max())}"
            )


def _resume_flight(ctx: _Context, state: CampaignState, resumed: bool) -> _Flight:
    """The start bookkeeping from the journal: sequence and round numbers continue, cells
    started but never finished run again first, then the design cells not yet measured."""
    grid, records, measured = ctx.grid, ctx.journal.records, state.measured
    started = [record_dict(r) for r in records if record_dict(r).get("type") == "started"]
    acq_cells = {cell_key(d["cell"]) for d in started if d.get("phase") == "acquire"}
    index = grid.index()
    restart = [(index[cell_key(r["cell"])], r) for r in in_flight_cells(records)]
    # A window in flight whose measurement is not journaled (its cell holds fewer windows).
    held = state.windows if state.windows is not None else measured.astype(np.int64)
    restart = [(c, r) for c, r in restart if held[c] <= int(r.get("replicate", 0))]
    if resumed and restart:
        ctx.on_event("resume", {"measured": int(measured.sum()), "in_flight": [grid.describe(c) for c, _ in restart]})
    design = [c for c in pending_design(state) if c not in dict(restart)]
    return _Flight(flight={}, seq=len(started), next_round=1 + len(acq_cells), restart=restart, design=design)


def _drive(ctx: _Context, fl: _Flight, state: CampaignState) -> _Outcome:
    """The event loop: start what must start, decide on every completion, wait for the next."""
    posterior: Any = None
    fitted_at = -1
    plan_times: list[float] = []
    plan_cpu: list[float] = []
    while True:
        check_interrupt()  # a Ctrl-C that a finaliser swallowed still stops here
        if not fl.failures:
            _fill_mandatory(ctx, fl)
        n_measured = int(state.measured.sum())
        if not fl.failures and not fl.restart and not fl.design and n_measured > 0:
            t_event = time.perf_counter()
            cpu_event = time.process_time()
            t_fit = 0.0
            if fitted_at != n_measured:
                release_compiled_if_crowded()
                posterior = _refit(ctx, state, n_measured)
                fitted_at = n_measured
                t_fit = time.perf_counter() - t_event
            step = _decide(ctx, fl, state, posterior, t_fit)
            plan_times.append(time.perf_counter() - t_event)
            plan_cpu.append(time.process_time() - cpu_event)
            # For status/report; written once the free GPUs are refilled (off the critical path).
            write_round_files(ctx.out, ctx.grid, posterior, step.real.bounds, state.measured)
            late = ctx.executor.ready() if step.status is not None else []
            if late:
                # Cells that finished while this refit ran are measured, not cancelled:
                # decide again with them.
                _absorb(ctx, fl, late)
                state = observe(state, ctx.journal.records)
                continue
            if step.status is not None:
                cancelled = _cancel_in_flight(ctx, fl)
                timings = {"fit_s": step.t_fit, "allocate_s": step.t_alloc, "acquire_s": 0.0}
                ranked = with_alternatives(state, ctx.setup.settings, step.assessment, posterior,
                                           seed=round_key(state.seed, fl.next_round).attempt_seed)
                final_rec = _round_record(
                    ctx, fl.next_round, step.real, n_measured, step.status, None, timings,
                    step.assessment.final, joint=step.joint, stop=step.stop, alternatives=ranked.alternatives,
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
        state = observe(state, ctx.journal.records)


def _refit(ctx: _Context, state: CampaignState, n_measured: int) -> Any:
    """Fit on what is measured, warm-started from the latest earlier refit on disk; the seed
    depends only on (seed, n_measured) so an interrupted campaign replays exactly."""
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start

    warm = load_warm_start(ctx.out / WARM_START_DIR, before_round=n_measured)
    posterior = fit_round(state._replace(warm_start=warm), round_seed(ctx.setup.seed, n_measured), ctx.setup.settings)
    save_warm_start(ctx.out / WARM_START_DIR, posterior, round_no=n_measured)
    return posterior


def _decide(ctx: _Context, fl: _Flight, state: CampaignState, posterior: Any, t_fit: float) -> _Step:
    """The round's assessment of the real state, then either stop (a final status) or fill
    the free GPUs."""
    settings = ctx.setup.settings
    state = state._replace(round=fl.next_round)
    a = assess(state, settings, posterior, attempt_seed=round_key(state.seed, fl.next_round).attempt_seed)
    t_alloc = a.allocate_s + (0.0 if a.attempt is None else float(a.attempt.wall_s))
    # Unmeasured cells and, at an SLO-attainment level, repeats; none in flight.
    candidates = open_cells(state, settings, a.acting_view, busy=list(fl.flight))
    # The round's stopping rule on what is measured; cells in flight count as
    # unmeasured, and only a certificate stops the campaign while some fly.
    decision = a.decision
    status = None
    fl.blocked = None
    if not decision.acquire and (not fl.flight or decision.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE)):
        status = decision.status
    elif decision.acquire and candidates.any() and _free_cells(ctx, candidates) > 0:
        _acquire(ctx, fl, state, posterior, a, candidates, (t_fit, t_alloc))
    if status is None and decision.acquire and not fl.flight and fl.blocked is not None:
        # Nothing in flight and the next pick does not fit the budget: stop undecided.
        budget = Budget.of(ctx.campaign)
        gpu, wall = spent(ctx.journal.records)
        cells = next_cells(state, settings, a, posterior, fl.next_round, budget, gpu, fl.blocked)
        a = stop_undecided(state, settings, a, posterior, seed=round_key(state.seed, fl.next_round).attempt_seed)
        stop = stop_json(budget, ctx.grid, fl.blocked, gpu, wall, cells)
        return _Step(a.decision.status, a, t_fit, t_alloc, stop)
    return _Step(status, a, t_fit, t_alloc)


def _fits_budget(ctx: _Context, fl: _Flight, c: int) -> bool:
    """Whether starting ``c`` now keeps the campaign within its profiling budget: GPU-seconds
    spent, those the cells in flight will spend and ``c``'s; on the campaign clock, ``c``'s
    expected finish (:mod:`fleetsieve_bayes.campaign.budget`)."""
    budget = Budget.of(ctx.campaign)
    if not budget.is_set:
        return True
    cost = ctx.grid.cost_gpu_s
    gpu, _ = spent(ctx.journal.records)
    committed = float(sum(cost[k] for k in fl.flight))
    return budget.allows(gpu + committed + float(cost[c]), ctx.executor.now() + float(ctx.expected[c]))


def _acquire(
    ctx: _Context,
    fl: _Flight,
    state: CampaignState,
    posterior: Any,
    a: Assessment,
    candidates: np.ndarray,
    t_fit_alloc: tuple[float, float],
) -> None:
    """Plan a batch of picks conditioned on the cells in flight, start those that fit
    (via :func:`_admit`) and journal a round record per started pick."""
    from fleetsieve_bayes.decision.batch import GATE_FRACTION, BatchGate, plan_batch

    campaign, settings = ctx.campaign, ctx.setup.settings
    free_cells = max(1, _free_cells(ctx, candidates))
    if campaign.max_rounds is not None:
        free_cells = min(free_cells, campaign.max_rounds - fl.next_round + 1)

    def believe_fn(believed: Any) -> Belief:
        return believe(
            state.grid, state.problem, posterior, state.measured, state.observed, believed, settings,
            allocate=lambda values: allocate_milp(state.grid, values, state.problem), settled=a.settled,
        )

    taken = set(fl.flight)  # in flight or picked in this batch: never repeated now

    def _select(belief: Belief, round_no: int) -> int:
        c = choose(state, settings, belief, posterior, round_no, a.attempt, busy=taken)
        taken.add(c)
        return c

    plan = plan_batch(
        believe_fn=believe_fn,
        select=_select,
        candidates=candidates,
        in_flight=list(fl.flight),
        admit=lambda c, reserved, believed: _admit(ctx, fl, c, reserved, believed),
        first_round=fl.next_round,
        max_picks=min(MAX_PICKS, free_cells + 1),
        real=a.acting_view,
        gate=BatchGate(
            value=lambda belief, round_no: decision_values(state, settings, belief, posterior, round_no, a.attempt),
            real=a.acting_view,
            # Scored with the randomness of a round the measurements alone fix (a resume replays it).
            real_round=1 + sum(1 for r in state.records if r.phase == "acquire"),
            fraction=GATE_FRACTION,
        ),
    )
    t_fit, t_alloc = t_fit_alloc
    first = True
    n_measured = int(state.measured.sum())
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
        repeat = next_replicate(ctx.grid, ctx.journal.records, pick.cell) > 0
        rec = _round_record(ctx, pick.round, a.view, n_measured, "measure", pick.cell, timings, None,
                            repeat=repeat)
        ctx.on_event("round", record_dict(rec))


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
    replicate: int = 0,
) -> None:
    """Journal a ``started`` record (durable before the cell runs), then submit the cell's
    window ``replicate`` (written in the record only for a repeat)."""
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
    if replicate:
        rec["replicate"] = int(replicate)
    if resumed:
        rec["resumed"] = True
    if believed is not None:  # what the pick was conditioned on
        rec["believed"] = [_cell_json(grid, k) for k in believed]
    ctx.journal.append(_Raw(rec))
    fl.flight[c] = rec
    ctx.executor.submit(Job(c, int(ctx.tp[c]), slots, float(start_s), fl.seq, int(replicate)))
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
        slots = ctx.pool.take(int(ctx.tp[c]), prefer=tuple(r.get("gpus", ())), group=int(ctx.group[c]))
        if slots is None:
            continue
        # On the simulated clock a resumed cell keeps its start time, so the replay is exact.
        s = float(r["start_s"]) if ctx.executor.simulated else ctx.executor.now()
        _start(ctx, fl, c, phase=r.get("phase", "acquire"), round_no=int(r.get("round", 0)), slots=slots, start_s=s,
               resumed=True, replicate=int(r.get("replicate", 0)))
        fl.restart.remove((c, r))
    for c in list(fl.design):
        slots = ctx.pool.take(int(ctx.tp[c]), group=int(ctx.group[c]))
        if slots is None:
            continue  # waits; a smaller design cell may fill the gap
        _start(ctx, fl, c, phase="design", round_no=0, slots=slots, start_s=ctx.executor.now())
        fl.design.remove(c)


def _admit(ctx: _Context, fl: _Flight, c: int, reserved: int | None, believed: tuple[int, ...]) -> bool:
    """Start ``c`` now if it fits and (with a reservation) does not delay it; its started
    record lists ``believed``, the cells its pick was conditioned on."""
    need, group = int(ctx.tp[c]), int(ctx.group[c])
    if not _fits_budget(ctx, fl, c):
        fl.blocked = c if fl.blocked is None else fl.blocked
        return False
    if not ctx.pool.fits(need, group):
        return False
    now = ctx.executor.now()
    # A cell of another GPU type than the reservation's cannot delay it.
    if reserved is not None and int(ctx.group[reserved]) == group:
        shadow, extra = _reservation_window(ctx, fl, now, reserved)
        if not (now + ctx.expected[c] <= shadow + 1e-9 or need <= extra):
            return False
    slots = ctx.pool.take(need, group=group)
    assert slots is not None
    _start(
        ctx,
        fl,
        c,
        phase="acquire",
        round_no=fl.next_round,
        slots=slots,
        start_s=now,
        believed=list(believed),
        # A pick of a measured cell is its next window (a repeat the strategy chose).
        replicate=next_replicate(ctx.grid, ctx.journal.records, c),
    )
    fl.next_round += 1
    return True


def _free_cells(ctx: _Context, candidates: np.ndarray) -> int:
    """How many candidate cells the free GPUs could start now, at the smallest TP of each
    GPU type's candidates."""
    cells = np.flatnonzero(candidates)  # candidates: (n_cells,) bool
    total = 0
    for j in np.unique(ctx.group[cells]):
        tp_min = max(1, int(ctx.tp[cells[ctx.group[cells] == j]].min()))
        total += ctx.pool.free_in(int(j)) // tp_min
    return total


def _reservation_window(ctx: _Context, fl: _Flight, now: float, reserved: int) -> tuple[float, int]:
    """EASY backfilling: ``(shadow, extra)`` — when the reserved cell can start (cells in
    flight on its GPU type finishing at their expected times) and the GPUs of that type it
    leaves spare then."""
    group, need_reserved = int(ctx.group[reserved]), int(ctx.tp[reserved])
    free = ctx.pool.free_in(group)
    shadow = now
    mine = ((float(r["start_s"]) + ctx.expected[k], k) for k, r in fl.flight.items() if int(ctx.group[k]) == group)
    for f, k in sorted(mine):
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
    write_measurements(ctx.out, ctx.journal)


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


def _finish(ctx: _Context, outcome: _Outcome, t_start: float) -> CampaignResult:
    """The common result.json plus the cancelled cells, per-completion timings and the pool."""
    journal = ctx.journal
    result = result_json(ctx.setup, ctx.grid, journal, outcome.final_rec, time.perf_counter() - t_start)
    result["gpu_seconds"] = float(result["gpu_seconds"] + sum(r["gpu_seconds"] for r in _of(journal.records, "cancelled")))
    result["cancelled"] = [r["cell"] for r in outcome.cancelled]
    # This invocation's refit + batch selection per completion: wall and CPU seconds.
    result["timings"]["per_completion_s"] = outcome.plan_times
    result["timings"]["per_completion_cpu_s"] = outcome.plan_cpu
    result["pool"] = {
        "pool_gpus": ctx.pool.n,
        **({"pool_gpus_by_gpu": dict(zip(ctx.grid.pools, ctx.pool.sizes, strict=True))}
           if len(ctx.pool.sizes) > 1 else {}),
        "executor": ctx.campaign.pool.executor,
        "clock": "simulated" if ctx.executor.simulated else "real",
    }
    write_result(ctx.out, result, allow_nan=True)
    ctx.on_event("done", result)
    return CampaignResult(outcome.status, result)


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
    """The measurement record, then the ``finished`` record with the clock time."""
    journal_measurement(
        journal,
        grid,
        c,
        done.row,
        round_no=int(started.get("round", 0)),
        phase=str(started.get("phase", "acquire")),
        started=done.started_at,
        finished=done.finished_at,
        on_event=on_event,
        replicate=int(started.get("replicate", 0)),
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


def _cell_json(grid: CellGrid, c: int) -> dict[str, Any]:
    return cell_of(grid, c).to_json()


def _round_record(
    ctx: _Context,
    round_no: int,
    real: Belief,
    n_measured: int,
    outcome: str,
    chosen: int | None,
    timings: dict[str, float],
    final: Any,
    joint: dict[str, Any] | None = None,
    *,
    repeat: bool = False,
    stop: dict[str, Any] | None = None,
    alternatives: dict[str, Any] | None = None,
) -> RoundRecord:
    """Append one round record (the real state's certificate and allocations) and return it."""
    rec = round_record(
        ctx.grid, round_no, real, outcome=outcome, measured_cells=n_measured,
        gpu_seconds=_spent(ctx.journal.records), chosen=chosen, timings=timings, final=final, joint=joint,
        repeat=repeat, stop=stop, alternatives=alternatives,
    )
    ctx.journal.append(rec)
    return rec
