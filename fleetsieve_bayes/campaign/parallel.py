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
from pathlib import Path
from typing import Any

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
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.decision.batch import believe, plan_batch
    from fleetsieve_bayes.decision.strategies import RoundState, make_strategy
    from fleetsieve_bayes.model.inference import fit
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start

    campaign: Campaign = inputs.campaign
    strategy_name, seed = inputs.strategy, inputs.seed
    enable_compilation_cache()
    t_start = time.perf_counter()
    grid: CellGrid = backend.grid
    problem = problem_from_campaign(campaign)
    card, preset = inputs.card, inputs.preset
    strategy = make_strategy(
        strategy_name,
        grid,
        problem,
        credible_level=campaign.credible_level,
        repeatability=campaign.repeatability,
        seed=seed,
    )
    tp = np.asarray(grid.tp, np.int64)
    expected = np.asarray(backend.expected_duration_s, np.float64)
    index = grid.index()

    journal = open_journal(out)
    executor: Executor | None = None
    try:
        resumed = _begin(inputs, out, journal, grid, on_event)

        executor, pool_n = _make_executor(campaign, out, backend, explicit_backend, _clock_offset(journal.records))
        if int(tp.max()) > pool_n:
            big = int(np.argmax(tp))
            raise InputError(
                f"{campaign.path}: [measurement] pool_gpus: {pool_n} GPUs cannot hold cell "
                f"{grid.describe(big)} (TP{int(tp[big])}); use at least {int(tp.max())}"
            )
        pool = GpuPool(pool_n)
        measured, observed, _ = loop.measured_state(grid, journal.records)

        # Cells in flight: what they are, for the journal and the packing.
        flight: dict[int, dict[str, Any]] = {}  # cell → its started record
        seq = [len([r for r in journal.records if record_dict(r).get("type") == "started"])]
        acq_cells = {
            cell_key(record_dict(r)["cell"])
            for r in journal.records
            if record_dict(r).get("type") == "started" and record_dict(r).get("phase") == "acquire"
        }
        next_round = [1 + len(acq_cells)]

        def start(
            c: int,
            *,
            phase: str,
            round_no: int,
            slots: tuple[int, ...],
            start_s: float,
            resumed: bool = False,
            believed: list[int] | None = None,
        ) -> None:
            rec = {
                "type": "started",
                "seq": seq[0],
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
            journal.append(_Raw(rec))  # durable before the cell runs
            flight[c] = rec
            executor.submit(Job(c, int(tp[c]), slots, float(start_s), seq[0]))
            seq[0] += 1
            on_event(
                "measure-start",
                {
                    "cell": rec["cell"],
                    "label": grid.describe(c),
                    "expected_s": float(expected[c]),
                    "round": round_no,
                    "candidates": grid.n_cells,
                    "gpus": list(slots),
                    "in_flight": [grid.describe(k) for k in flight],
                },
            )

        # Resume: cells started but never finished run again first.
        restart = [(index[cell_key(r["cell"])], r) for r in in_flight_cells(journal.records)]
        restart = [(c, r) for c, r in restart if not measured[c]]
        if resumed and restart:
            on_event("resume", {"measured": int(measured.sum()), "in_flight": [grid.describe(c) for c, _ in restart]})
        design = [c for c in initial_design(grid) if not measured[c] and c not in dict(restart)]

        def fill_mandatory() -> None:
            for c, r in list(restart):
                slots = pool.take(int(tp[c]), prefer=tuple(r.get("gpus", ())))
                if slots is None:
                    continue
                s = float(r["start_s"]) if executor.simulated else executor.now()
                start(c, phase=r.get("phase", "acquire"), round_no=int(r.get("round", 0)), slots=slots, start_s=s, resumed=True)
                restart.remove((c, r))
            for c in list(design):
                slots = pool.take(int(tp[c]))
                if slots is None:
                    continue  # waits; a smaller design cell may fill the gap
                start(c, phase="design", round_no=0, slots=slots, start_s=executor.now())
                design.remove(c)

        def admit(c: int, reserved: int | None) -> bool:
            """Start ``c`` now if it fits and (with a reservation) does not delay it."""
            need = int(tp[c])
            if not pool.fits(need):
                return False
            now = executor.now()
            if reserved is not None:
                free = pool.n_free
                shadow = now
                for f, k in sorted((float(r["start_s"]) + expected[k], k) for k, r in flight.items()):
                    if free >= int(tp[reserved]):
                        break
                    free += int(tp[k])
                    shadow = max(shadow, f)
                extra = free - int(tp[reserved])
                if not (now + expected[c] <= shadow + 1e-9 or need <= extra):
                    return False
            slots = pool.take(need)
            assert slots is not None
            start(
                c,
                phase="acquire",
                round_no=next_round[0],
                slots=slots,
                start_s=now,
                believed=list(flight) + ([] if reserved is None else [reserved]),
            )
            next_round[0] += 1
            return True

        def absorb(dones: list[Done]) -> None:
            """Journal finished cells (or their harness failures) and free their GPUs."""
            for done in dones:
                c = done.job.cell
                r = flight.pop(c)
                pool.give(tuple(r["gpus"]))
                if done.error is not None or done.row is None:
                    journal.append(
                        _Raw(
                            type="failed",
                            cell=r["cell"],
                            start_s=r["start_s"],
                            finish_s=float(done.finish_s),
                            error=done.error,
                        )
                    )
                    failures.append((c, str(done.error)))
                    continue
                _record(journal, grid, c, done, r, on_event)
            loop._write_measurements(out, journal)

        status: str | None = None
        final_alloc = None
        final_rec: Any = None
        cert = None
        posterior = None
        fitted_at = -1
        failures: list[tuple[int, str]] = []
        cancelled: list[dict[str, Any]] = []
        plan_times: list[float] = []  # refit + batch selection, per completion (wall)
        plan_cpu: list[float] = []  # the same in CPU seconds of this process (all threads)
        while True:
            if not failures:
                fill_mandatory()
            n_measured = int(measured.sum())
            if not failures and not restart and not design and n_measured > 0:
                t_event = t0 = time.perf_counter()
                cpu_event = time.process_time()
                t_fit = 0.0
                if fitted_at != n_measured:
                    warm = load_warm_start(out / WARM_START_DIR, before_round=n_measured)
                    posterior = fit(
                        grid,
                        observed,
                        measured,
                        card,
                        preset,
                        seed=loop._round_seed(seed, n_measured),
                        warm_start=warm,
                    )
                    save_warm_start(out / WARM_START_DIR, posterior, round_no=n_measured)
                    fitted_at = n_measured
                    t_fit = time.perf_counter() - t0

                def allocate(values: np.ndarray) -> Any:
                    return allocate_milp(grid, values, problem)

                def believe_fn(
                    believed: Any, posterior: Any = posterior, measured: Any = measured, observed: Any = observed
                ) -> Any:
                    return believe(
                        grid,
                        problem,
                        posterior,
                        measured,
                        observed,
                        believed,
                        credible_level=campaign.credible_level,
                        repeatability=campaign.repeatability,
                        epsilon=campaign.epsilon,
                        allocate=allocate,
                    )

                t0 = time.perf_counter()
                real = believe_fn([])
                t_alloc = time.perf_counter() - t0
                cert = real.certificate
                candidates = ~measured
                candidates[list(flight)] = False
                # The loop's stopping rule on what is measured; cells in flight count as
                # unmeasured, and only a certificate stops the campaign while some fly.
                decision = loop.decide_round(
                    loop.RoundFacts(next_round[0], cert.status, int((~measured).sum()), campaign.max_rounds)
                )
                if not decision.acquire and (not flight or decision.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE)):
                    status = decision.status
                    if decision.final == "conservative":
                        final_alloc = real.conservative
                    elif decision.final == "measured-only":
                        final_alloc = allocate(loop._measured_only_table(observed, measured))
                elif decision.acquire and candidates.any() and pool.n_free >= int(tp[candidates].min()):
                    def select(belief: Any, round_no: int, posterior: Any = posterior) -> int:
                        state = RoundState(
                            grid=grid,
                            problem=problem,
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
                        return int(strategy.select(state))

                    free_cells = max(1, pool.n_free // max(1, int(tp[candidates].min())))
                    if campaign.max_rounds is not None:
                        free_cells = min(free_cells, campaign.max_rounds - next_round[0] + 1)
                    plan = plan_batch(
                        believe_fn=believe_fn,
                        select=select,
                        candidates=candidates,
                        in_flight=list(flight),
                        admit=admit,
                        first_round=next_round[0],
                        max_picks=min(MAX_PICKS, free_cells + 1),
                        real=real,
                    )
                    first = True
                    for pick in plan.picks:
                        if not pick.start:
                            continue
                        timings = {
                            "fit_s": t_fit if first else 0.0,
                            "allocate_s": t_alloc if first else 0.0,
                            "acquire_s": pick.seconds,
                        }
                        first = False
                        rec = _round_record(
                            journal, grid, pick.round, real, n_measured, "measure", pick.cell, timings, None
                        )
                        on_event("round", record_dict(rec))
                plan_times.append(time.perf_counter() - t_event)
                plan_cpu.append(time.process_time() - cpu_event)
                # For status/report; written once the free GPUs are refilled (off the critical path).
                loop._write_round_files(out, grid, posterior, real.bounds, measured)
                late = executor.ready() if status is not None else []
                if late:
                    # Cells that finished while this refit ran are measured, not cancelled:
                    # decide again with them.
                    absorb(late)
                    measured, observed, _ = loop.measured_state(grid, journal.records)
                    status, final_alloc = None, None
                    continue
                if status is not None:
                    for c, r in list(flight.items()):
                        t = executor.cancel(c)
                        rec = {
                            "type": "cancelled",
                            "cell": r["cell"],
                            "gpus": r["gpus"],
                            "start_s": r["start_s"],
                            "finish_s": float(t),
                            "gpu_seconds": max(0.0, float(t) - float(r["start_s"])) * int(tp[c]),
                        }
                        journal.append(_Raw(rec))
                        cancelled.append(rec)
                        pool.give(tuple(r["gpus"]))
                        del flight[c]
                    final_rec = _round_record(
                        journal,
                        grid,
                        next_round[0],
                        real,
                        n_measured,
                        status,
                        None,
                        {"fit_s": t_fit, "allocate_s": t_alloc, "acquire_s": 0.0},
                        final_alloc,
                    )
                    on_event("round", record_dict(final_rec))
                    break

            if not flight:
                if failures:
                    c, err = failures[0]
                    raise MeasurementError(
                        f"cell {grid.describe(c)}: {err} (the other cells in flight were recorded; "
                        f"run again to resume — it re-measures {grid.describe(c)})"
                    )
                raise RuntimeError("parallel driver: nothing in flight, nothing to start and no decision")
            absorb(executor.wait_any())
            measured, observed, _ = loop.measured_state(grid, journal.records)

        result = _result(inputs, grid, journal, final_rec, t_start)
        result["gpu_seconds"] = float(result["gpu_seconds"] + sum(r["gpu_seconds"] for r in _of(journal.records, "cancelled")))
        result["cancelled"] = [r["cell"] for r in cancelled]
        # This invocation's refit + batch selection per completion: wall and CPU seconds.
        result["timings"]["per_completion_s"] = plan_times
        result["timings"]["per_completion_cpu_s"] = plan_cpu
        result["pool"] = {
            "pool_gpus": pool_n,
            "executor": campaign.pool.executor,
            "clock": "simulated" if executor.simulated else "real",
        }
        atomic_write_text(out / "result.json", json.dumps(result, indent=2) + "\n")
        on_event("done", result)
        return loop.CampaignOutcome(status, result, result["allocation"])
    finally:
        if executor is not None:
            executor.close()
        journal.close()


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
    )
    journal.append(rec)
    return rec


def _result(inputs: Any, grid: CellGrid, journal: Any, final_rec: Any, t_start: float) -> dict[str, Any]:
    """The loop's result.json, from the journal."""
    return loop._result_json(inputs, grid, journal, final_rec, time.perf_counter() - t_start)
