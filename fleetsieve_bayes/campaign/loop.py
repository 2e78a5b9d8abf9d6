"""The decision loop: fit → bounds → allocate both → certify → decide → acquire → measure.

``run_campaign`` runs (or resumes) one campaign in a directory. Everything it
measures or decides goes to the append-only journal before the next step, so a
kill at any instant loses at most the measurement in flight; running again on
the same directory resumes from the journal, in a fresh process, to the same
decisions: each round's randomness is derived from ``(seed, round)``, the
model's warm-start state is saved with the round, a round whose decision is
journaled is never recomputed (its chosen cell is measured, or its final answer
rewritten), and ``result.json`` is always built from the journal alone.

Campaign directory:
    journal.jsonl     append-only record of every measurement and round
    measurements.csv  the measured rows (derived from the journal)
    posterior.nc      the latest posterior (ArviZ InferenceData)
    bounds.csv        the latest credible intervals of every cell
    warm_start/       the model state each round starts from (.npz)
    result.json       the final result
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.objective import objective_json
from fleetsieve_bayes.allocation.problem import (
    Allocation,
    AllocationProblem,
    CellGrid,
    allocation_to_json,
    problem_from_campaign,
)
from fleetsieve_bayes.backends import Backend, make_backend
from fleetsieve_bayes.backends.failures import MEMORY_GUARD, SERVER_FAILURES, STARTUP_OOM
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.directory import finite_or_none
from fleetsieve_bayes.campaign.fingerprint import (
    campaign_inputs,
    fingerprint,
    mismatch,
    reuse_refusal,
)
from fleetsieve_bayes.campaign.journal import (
    JOURNAL_NAME,
    LOCK_NAME,
    Cell,
    Header,
    Journal,
    MeasurementRecord,
    RoundRecord,
    Side,
    atomic_write_text,
    campaign_lock,
    open_journal,
    unique_rounds,
)
from fleetsieve_bayes.campaign.makespan import profiling_wall_s
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    EXHAUSTED,
    UNDECIDED,
)
from fleetsieve_bayes.decision.design import STRATEGY_NAMES, initial_design
from fleetsieve_bayes.errors import EnvironmentProblem, InputError
from fleetsieve_bayes.jax_cache import enable_compilation_cache
from fleetsieve_bayes.table import COLUMNS, METRICS, startup_gpu_seconds, write_table

__all__ = [
    "CampaignOutcome",
    "RoundFacts",
    "RoundDecision",
    "decide_round",
    "run_campaign",
    "measured_state",
    "Event",
]

# Callback for progress displays: ``on_event(kind, info)``. Kinds: "resume",
# "round", "measure-start", "measure-done", "done".
Event = Callable[[str, dict[str, Any]], None]


class CampaignOutcome(NamedTuple):
    """What ``run_campaign`` returns (and writes as ``result.json``).

    ``allocation`` is result.json's ``{workload: {tp, load, replicas}}`` (None when infeasible).
    """

    status: str
    result: dict[str, Any]
    allocation: dict[str, Any] | None


# --- the decision of one round (pure) ----------------------------------------


class RoundFacts(NamedTuple):
    """What the stopping rule looks at after a round's fit, allocations and certificate."""

    round_no: int
    certificate: str  # certified-feasible | certified-infeasible | undecided
    n_unmeasured: int
    max_rounds: int | None


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
    if facts.max_rounds is not None and facts.round_no > facts.max_rounds:
        return RoundDecision(UNDECIDED, False, "conservative")
    return RoundDecision(UNDECIDED, True, None)


# --- journal state -------------------------------------------------------------


def _cell(grid: CellGrid, c: int) -> Cell:
    w, tp, load = grid.key(c)
    return Cell(w, tp, load)


def _objective_json(a: Allocation) -> dict[str, Any]:
    return objective_json(a, with_feasible=True)


def _side(a: Allocation, grid: CellGrid) -> Side:
    return Side(allocation_to_json(a, grid), _objective_json(a))


# Failures of a server that cannot hold the model at a TP (out of memory at
# start-up, or refused by the memory guard before starting): the server is the
# same at every offered load of that class and TP, so none of them can run.
LOAD_INDEPENDENT_FAILURES = (STARTUP_OOM, MEMORY_GUARD)


def measured_state(grid: CellGrid, records: list[Any]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Rebuild what is measured from journal records (typed).

    A failure that does not depend on the load (:data:`LOAD_INDEPENDENT_FAILURES`)
    is known for every load of its class and TP: those cells count as measured
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
        c = index[key]
        if measured[c]:
            continue  # never measured twice by us; tolerate a duplicate record
        measured[c] = True
        observed[c] = [_metric(rec.row.get(m)) for m in METRICS]
        order.append(c)
        if rec.row.get("failure") in LOAD_INDEPENDENT_FAILURES:
            cant_start.append(c)
    for c in cant_start:
        same = (grid.workload_idx == grid.workload_idx[c]) & (grid.tp == grid.tp[c]) & ~measured
        observed[same] = observed[c]
        measured |= same
    return measured, observed, order


def server_failures(grid: CellGrid, records: list[Any]) -> np.ndarray:
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


def _metric(v: Any) -> float:
    return float("nan") if v is None else float(v)


def _plain_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def _measure_cell(
    backend: Backend,
    journal: Journal,
    grid: CellGrid,
    c: int,
    *,
    round_no: int,
    phase: str,
    on_event: Event,
) -> None:
    """Measure (or preflight-skip) one cell and journal it durably."""
    cell = _cell(grid, c)
    on_event(
        "measure-start",
        {
            "cell": cell.to_json(),
            "label": cell.label,
            "expected_s": float(backend.expected_duration_s[c]),
            "round": round_no,
            "candidates": grid.n_cells,
        },
    )
    started = time.time()
    _arm_kill_in_measurement()
    row = backend.preflight(c)
    if row is None:
        row = backend.measure(c)
    finished = time.time()
    _journal_measurement(journal, grid, c, row, round_no=round_no, phase=phase, started=started, finished=finished, on_event=on_event)


def _journal_measurement(
    journal: Journal,
    grid: CellGrid,
    c: int,
    row: dict[str, Any],
    *,
    round_no: int,
    phase: str,
    started: float,
    finished: float,
    on_event: Event,
) -> dict[str, Any]:
    """Check a backend's row and append its measurement record durably; returns the row."""
    cell = _cell(grid, c)
    missing = [k for k in COLUMNS if k not in row]
    if missing:
        raise InputError(f"backend returned a row for {cell.label} without {', '.join(missing)}")
    row = _plain_row(row)
    gpu_s = float(row["duration_s"]) * int(row["tp"])
    journal.append(
        MeasurementRecord(
            seq=len(journal.measurements),
            round=round_no,
            phase=phase,
            cell=cell,
            row=row,
            gpu_seconds=gpu_s,
            started_at=started,
            finished_at=finished,
            wall_s=finished - started,
        )
    )
    on_event("measure-done", {"cell": cell.to_json(), "label": cell.label, "row": row, "gpu_seconds": gpu_s})
    return row


# Test hook: SIGKILL this process this many seconds into its first measurement
# (the kill-everywhere test's way of stopping a run inside a measurement; a
# replay with `delay_s` makes the measurement last that long).
_KILL_IN_MEASUREMENT_ENV = "FLEETSIEVE_BAYES_KILL_IN_MEASUREMENT"


def _arm_kill_in_measurement() -> None:
    after = os.environ.get(_KILL_IN_MEASUREMENT_ENV, "")
    try:
        seconds = float(after)
    except ValueError:
        return
    import signal
    import threading

    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGKILL))
    timer.daemon = True
    timer.start()


def _write_measurements(out: Path, journal: Journal) -> None:
    rows = [r.row for r in journal.measurements]
    if not rows:
        return
    tmp = out / ".measurements.csv.tmp"
    write_table(pd.DataFrame(rows), tmp)
    tmp.replace(out / "measurements.csv")


def _measured_only_table(observed: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Values where unmeasured cells are inadmissible (zero throughput and success)."""
    vals = np.where(measured[:, None], observed, 0.0)
    vals[~measured, 1:3] = np.inf
    return vals


# --- inputs, resolved before the directory is touched ----------------------------


class _Inputs(NamedTuple):
    campaign: Campaign
    card: Any
    preset: Any
    strategy: str
    seed: int
    fingerprint: dict[str, str]
    inputs: dict[str, Any]
    seed_rows: list[tuple[Cell, dict[str, Any], str]]  # (cell, row, source) from seed tables
    reuse: Path | None


def _field_error(campaign: Campaign, field: str, exc: InputError) -> InputError:
    return InputError(f"{campaign.path}: {field}: {exc}")


def _resolve(campaign: Campaign, strategy: str, seed: int, reuse: Path | None) -> _Inputs:
    """Load the prior card, preset and seed tables; fingerprint every decision input.

    Raises:
        InputError: naming the campaign file and field (family, inference,
            seed_tables) or the strategy.
    """
    from fleetsieve_bayes.model.inference import load_preset
    from fleetsieve_bayes.model.priors import card_path, load_card

    if strategy not in STRATEGY_NAMES:
        raise InputError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGY_NAMES)}")
    try:
        card_file = card_path(campaign.family)
        card = load_card(card_file)
    except InputError as exc:
        raise _field_error(campaign, "[model] family", exc) from None
    try:
        preset = load_preset(campaign.inference)
    except InputError as exc:
        raise _field_error(campaign, "[model] inference", exc) from None
    return _Inputs(
        campaign=campaign,
        card=card,
        preset=preset,
        strategy=strategy,
        seed=seed,
        fingerprint=fingerprint(campaign, card_file=card_file, preset=preset, strategy=strategy, seed=seed),
        inputs=campaign_inputs(campaign),
        seed_rows=_seed_table_rows(campaign),
        reuse=reuse,
    )


def _seed_table_rows(campaign: Campaign) -> list[tuple[Cell, dict[str, Any], str]]:
    """Rows of ``[measurement] seed_tables`` for the campaign's workloads, validated, first table first."""
    from fleetsieve_bayes.table import read_table

    out: list[tuple[Cell, dict[str, Any], str]] = []
    names = set(campaign.workload_names)
    for i, path in enumerate(campaign.measurement.seed_tables):
        try:
            df = read_table(path)
        except InputError as exc:
            raise _field_error(campaign, f"[measurement] seed_tables[{i}]", exc) from None
        for line, r in enumerate(df.to_dict(orient="records"), start=2):
            if r["workload"] not in names:
                continue
            row = _plain_row({k: (None if v is pd.NA else v) for k, v in r.items()})
            out.append((Cell(str(r["workload"]), int(r["tp"]), str(r["load"])), row, f"seed table {path} line {line}"))
    return out


def _prepare_out(out: Path) -> tuple[bool, bool]:
    """Create the campaign directory; whether this call created it, and its lock file.

    Raises:
        InputError: ``out`` (or a parent) is a file.
        EnvironmentProblem: it cannot be created (read-only file system, permissions).
    """
    for p in [out, *out.parents]:
        if p.exists() and not p.is_dir():
            where = "is a file" if p == out else f"is under {p}, which is a file"
            raise InputError(f"--out {out}: {where}, not a campaign directory")
    created = not out.exists()
    lock_created = not (out / LOCK_NAME).exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / LOCK_NAME, "a"):
            pass
    except OSError as exc:
        raise EnvironmentProblem(f"--out {out}: cannot write the campaign directory ({exc.strerror or exc})") from None
    return created, lock_created


def _undo_fresh_files(out: Path, created: bool, lock_created: bool) -> None:
    """Remove what this run created when it fails before journaling anything."""
    journal = out / JOURNAL_NAME
    if journal.exists() and journal.stat().st_size > 0:
        return
    with contextlib.suppress(OSError):
        journal.unlink()
    if lock_created:
        with contextlib.suppress(OSError):
            (out / LOCK_NAME).unlink()
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()


def _noop(kind: str, info: dict[str, Any]) -> None:
    return None


def run_campaign(
    campaign: Campaign,
    out: Path,
    *,
    strategy: str = "fleetsieve",
    seed: int = 0,
    on_event: Event | None = None,
    backend: Backend | None = None,
    reuse_measurements: Path | None = None,
) -> CampaignOutcome:
    """Run or resume ``campaign`` in directory ``out`` and write ``out/result.json``.

    Args:
        strategy: acquisition strategy name (see :mod:`fleetsieve_bayes.decision.strategies`).
        seed: seeds every round's randomness (NUTS, fantasies, random strategy).
        on_event: progress callback ``(kind, info)``.
        backend: a measurement backend; by default the campaign's own.
        reuse_measurements: a finished or stopped campaign directory whose
            measurements seed this (new) decision; only demands, SLOs, floors,
            the budget and the stopping rule may differ from its campaign.

    Raises:
        InputError: bad campaign, a journal from another campaign (naming what
            changed), or a directory locked by another run.
        EnvironmentProblem: the directory cannot be written.
    """
    on_event = on_event or _noop
    out = Path(out)
    inputs = _resolve(campaign, strategy, seed, None if reuse_measurements is None else Path(reuse_measurements))
    if inputs.reuse is not None and inputs.reuse.resolve() == out.resolve():
        raise InputError(f"--reuse-measurements {inputs.reuse}: that is --out itself; re-plan into a new --out")
    created, lock_created = _prepare_out(out)
    try:
        with campaign_lock(out):
            own_backend = backend is None
            backend = backend or make_backend(campaign, out)
            try:
                if campaign.pool.parallel:  # several cells at once
                    from fleetsieve_bayes.campaign.parallel import run_parallel

                    return run_parallel(inputs, out, backend, on_event, explicit_backend=not own_backend)
                return _run_locked(inputs, out, backend, on_event)
            finally:
                if own_backend:
                    backend.close()
    except (InputError, EnvironmentProblem):
        _undo_fresh_files(out, created, lock_created)
        raise


def _run_locked(inputs: _Inputs, out: Path, backend: Backend, on_event: Event) -> CampaignOutcome:
    enable_compilation_cache()
    t_start = time.perf_counter()
    journal = open_journal(out)
    try:
        _begin(inputs, out, journal, backend.grid, on_event)
        _initial_design(inputs, out, journal, backend, on_event)
        final = _rounds(inputs, out, journal, backend, on_event)
        result = finite_or_none(_result_json(inputs, backend.grid, journal, final, time.perf_counter() - t_start))
        atomic_write_text(out / "result.json", json.dumps(result, indent=2, allow_nan=False) + "\n")
        on_event("done", result)
        return CampaignOutcome(result["status"], result, result["allocation"])
    finally:
        journal.close()


# --- start or resume -------------------------------------------------------------


def _new_header(inputs: _Inputs, grid: CellGrid, reused_from: dict[str, Any] | None) -> Header:
    c = inputs.campaign
    return Header(
        campaign=c.name,
        strategy=inputs.strategy,
        seed=inputs.seed,
        cells=tuple(_cell(grid, i) for i in range(grid.n_cells)),
        created_at=time.time(),
        campaign_file=str(c.path),
        gpus=c.gpus,
        epsilon=c.epsilon,
        credible_level=c.credible_level,
        workloads=tuple({"name": w.name, **w.to_json()} for w in c.workloads),
        fingerprint=inputs.fingerprint,
        inputs=inputs.inputs,
        reused_from=reused_from,
    )


def _check_header(out: Path, header: Header, inputs: _Inputs, grid: CellGrid) -> None:
    """Refuse to resume a directory started with other decision inputs, naming what changed."""
    what = mismatch(
        header.fingerprint,
        inputs.fingerprint,
        header.inputs,
        inputs.inputs,
        old_seed=header.seed,
        old_strategy=header.strategy,
    )
    if what is None and list(header.cells) != [_cell(grid, c) for c in range(grid.n_cells)]:
        what = "candidate cells"
    if what is None and inputs.reuse is not None:
        src = (header.reused_from or {}).get("directory")
        if src != str(inputs.reuse.resolve()):
            what = f"measurements source ({src or 'none'} → {inputs.reuse.resolve()})"
    if what is not None:
        raise InputError(
            f"{out}: this directory holds a campaign with other inputs — changed: {what}; "
            f"resume with the same inputs, or re-plan from its measurements with "
            f"--reuse-measurements {out} --out NEW_DIR"
        )


def _reused_rows(inputs: _Inputs, grid: CellGrid) -> tuple[list[tuple[Cell, dict[str, Any], str]], dict[str, Any]]:
    """Measurements of the ``--reuse-measurements`` directory, checked against this campaign."""
    from fleetsieve_bayes.campaign.directory import load_campaign_dir
    from fleetsieve_bayes.table import validate_table

    src = inputs.reuse
    assert src is not None
    try:
        view = load_campaign_dir(src)
    except InputError as exc:
        raise InputError(f"--reuse-measurements: {exc}") from None
    why = reuse_refusal(view.header.fingerprint, inputs.fingerprint, view.header.inputs, inputs.inputs)
    if why is not None:
        raise InputError(f"--reuse-measurements {src}: cannot re-plan from that campaign: {why}")
    if view.measurements:
        validate_table(pd.DataFrame([r.row for r in view.measurements]), source=f"{src / JOURNAL_NAME}")
    index = grid.index()
    rows = []
    for r in view.measurements:
        if tuple(r.cell) not in index:
            raise InputError(f"--reuse-measurements {src}: cell {r.cell.label} is not a candidate of this campaign")
        rows.append((r.cell, r.row, f"reused from {src.resolve()}"))
    info = {
        "directory": str(src.resolve()),
        "fingerprint": view.header.fingerprint,
        "measurements": len(rows),
        "gpu_seconds": view.gpu_seconds,
    }
    return rows, info


def _check_seed_cells(inputs: _Inputs, grid: CellGrid) -> None:
    index = grid.index()
    seen: dict[Cell, str] = {}
    for cell, _, source in inputs.seed_rows:
        if tuple(cell) not in index:
            raise InputError(f"{inputs.campaign.path}: [measurement] seed_tables: {source}: cell {cell.label} is not a candidate of this campaign")
        if cell in seen:
            raise InputError(f"{inputs.campaign.path}: [measurement] seed_tables: {source}: cell {cell.label} is also in {seen[cell]}")
        seen[cell] = source


def _begin(inputs: _Inputs, out: Path, journal: Journal, grid: CellGrid, on_event: Event) -> None:
    """Write the header and seeded rows of a new campaign, or check and complete those of a resumed one."""
    _check_seed_cells(inputs, grid)
    header = journal.header
    reused: list[tuple[Cell, dict[str, Any], str]] = []
    if header is None:
        reused_from = None
        if inputs.reuse is not None:
            reused, reused_from = _reused_rows(inputs, grid)
        journal.append(_new_header(inputs, grid, reused_from))
    else:
        _check_header(out, header, inputs, grid)
        on_event("resume", {"measured": len(journal.measurements), "candidates": grid.n_cells})
        want = (header.reused_from or {}).get("measurements", 0)
        have = sum(1 for r in journal.measurements if (r.source or "").startswith("reused from"))
        if have < want:  # killed while copying them: finish the copy
            reused, _ = _reused_rows(inputs._replace(reuse=Path(header.reused_from["directory"])), grid)
    measured = {r.cell for r in journal.measurements}
    for cell, row, source in [*reused, *inputs.seed_rows]:
        if cell in measured:
            continue
        measured.add(cell)
        journal.append(
            MeasurementRecord(
                seq=len(journal.measurements), round=0, phase="seed", cell=cell, row=dict(row),
                gpu_seconds=0.0, started_at=time.time(), finished_at=time.time(), wall_s=0.0, source=source,
            )
        )


def _initial_design(inputs: _Inputs, out: Path, journal: Journal, backend: Backend, on_event: Event) -> None:
    grid = backend.grid
    measured, _, _ = measured_state(grid, journal.records)
    for c in initial_design(grid):
        if not measured[c]:
            _measure_cell(backend, journal, grid, c, round_no=0, phase="design", on_event=on_event)
            measured[c] = True
    _write_measurements(out, journal)


# --- rounds ----------------------------------------------------------------------


class _Round(NamedTuple):
    record: RoundRecord
    posterior: Any  # the cheap fit: the next round's warm start
    bounds: Any
    measured: np.ndarray
    shown: Any  # what posterior.nc holds: after a certification attempt, its converged posterior


def _rounds(inputs: _Inputs, out: Path, journal: Journal, backend: Backend, on_event: Event) -> RoundRecord:
    """Run rounds until one stops the campaign; return that round's record.

    Round r fits on what is measured after r−1 acquisitions. A round whose
    record is already journaled is not recomputed: its chosen cell is measured
    (a kill mid-measurement), or, when it stopped the campaign, it is the answer.
    """
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start

    grid = backend.grid
    c = inputs.campaign
    problem = problem_from_campaign(c)
    strategy = campaign_strategy(inputs.strategy, c, grid, problem, inputs.seed)
    warm: Any = None
    while True:
        round_no = 1 + sum(1 for r in journal.measurements if r.phase == "acquire")
        done = [r for r in journal.rounds if r.round == round_no]
        if done:
            rec = done[-1]
            if rec.outcome != "measure":
                return rec
            assert rec.chosen is not None
            _measure_chosen(backend, journal, grid, rec.chosen, round_no, on_event)
            _write_measurements(out, journal)
            continue
        if warm is None:
            warm = load_warm_start(out / "warm_start", before_round=round_no)
        rnd = _one_round(inputs, grid, problem, strategy, journal, round_no, warm)
        save_warm_start(out / "warm_start", rnd.posterior, round_no=round_no)
        warm = rnd.posterior
        # Persist this round's view for status/report before the record that commits to it.
        _write_round_files(out, grid, rnd.shown, rnd.bounds, rnd.measured)
        journal.append(rnd.record)
        on_event("round", rnd.record.to_json())


def _measure_chosen(
    backend: Backend, journal: Journal, grid: CellGrid, chosen: Cell, round_no: int, on_event: Event
) -> None:
    c = grid.index().get(tuple(chosen))
    if c is None:
        raise InputError(f"{journal.path}: round {round_no} chose {chosen.label}, not a candidate of this campaign")
    _measure_cell(backend, journal, grid, c, round_no=round_no, phase="acquire", on_event=on_event)


def _one_round(
    inputs: _Inputs,
    grid: CellGrid,
    problem: AllocationProblem,
    strategy: Any,
    journal: Journal,
    round_no: int,
    warm: Any,
) -> _Round:
    """Fit, bound, allocate both ends, certify, decide and (maybe) choose the next cell.

    A certified state is only issued from the converged certifying posterior and
    after the decision-level joint check (:mod:`fleetsieve_bayes.campaign.certification`).
    """
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.decision.bounds import (
        conservative_table,
        optimistic_table,
        rule_bounds,
    )
    from fleetsieve_bayes.decision.certificate import certify
    from fleetsieve_bayes.decision.strategies import RoundState
    from fleetsieve_bayes.model.inference import fit

    c = inputs.campaign
    measured, observed, _ = measured_state(grid, journal.records)
    t0 = time.perf_counter()
    server = server_failures(grid, journal.records)
    posterior = fit(
        grid, observed, measured, inputs.card, inputs.preset, seed=_round_seed(inputs.seed, round_no),
        warm_start=warm, server_failed=server,
    )
    t_fit = time.perf_counter() - t0

    t0 = time.perf_counter()
    bounds = rule_bounds(posterior, observed, measured, c.credible_level, c.repeatability, grid, c.interval_rules)
    conservative = allocate_milp(grid, conservative_table(bounds), problem)
    optimistic = allocate_milp(grid, optimistic_table(bounds), problem)
    cert = certify(grid, problem, conservative, optimistic, measured, observed, c.epsilon)
    t_alloc = time.perf_counter() - t0

    attempt = None
    if cert.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
        attempt = _attempt_certification(inputs, grid, problem, observed, measured, round_no, posterior, server)
        cert, bounds = attempt.certificate, attempt.bounds
        conservative, optimistic = attempt.conservative, attempt.optimistic

    decision = decide_round(RoundFacts(round_no, cert.status, int((~measured).sum()), c.max_rounds))
    final: Allocation | None = None
    if decision.final == "conservative":
        final = conservative
    elif decision.final == "measured-only":
        final = allocate_milp(grid, _measured_only_table(observed, measured), problem)

    chosen: int | None = None
    t_acq = 0.0
    if decision.acquire:
        t0 = time.perf_counter()
        state = RoundState(
            grid=grid,
            problem=problem,
            campaign_epsilon=c.epsilon,
            credible_level=c.credible_level,
            repeatability=c.repeatability,
            measured=measured.copy(),
            observed=observed.copy(),
            posterior=posterior,
            bounds=bounds,
            conservative=conservative,
            optimistic=optimistic,
            certificate=cert,
            round=round_no,
            rng=np.random.default_rng([inputs.seed, round_no]),
            key=_jax_key(inputs.seed, round_no),
        )
        chosen = _choose(inputs, strategy, state, attempt, round_no)
        t_acq = time.perf_counter() - t0

    record = RoundRecord(
        round=round_no,
        certificate=cert.status,
        outcome="measure" if decision.acquire else decision.status,
        reason=cert.reason,
        gap={k: float(v) for k, v in cert.gap._asdict().items()},
        conservative=_side(conservative, grid),
        optimistic=_side(optimistic, grid),
        measured_cells=int(measured.sum()),
        candidates=grid.n_cells,
        gpu_seconds=float(sum(r.gpu_seconds for r in journal.measurements)),
        chosen=None if chosen is None else _cell(grid, chosen),
        timings={
            "fit_s": t_fit,
            "allocate_s": t_alloc,
            "acquire_s": t_acq,
            "certify_s": 0.0 if attempt is None else float(attempt.wall_s),
        },
        final=None if final is None else _side(final, grid),
        joint=None if attempt is None else attempt.to_json(),
    )
    shown = posterior if attempt is None else attempt.posterior
    return _Round(record, posterior, bounds, measured, shown)


def campaign_strategy(name: str, campaign: Campaign, grid: CellGrid, problem: Any, seed: int) -> Any:
    """The named acquisition strategy with the campaign's interval settings
    (credible level, repeatability band, tail and success margins, knee guard)."""
    from fleetsieve_bayes.decision.strategies import make_strategy

    return make_strategy(
        name,
        grid,
        problem,
        credible_level=campaign.credible_level,
        repeatability=campaign.repeatability,
        rules=campaign.interval_rules,
        seed=seed,
    )


def _attempt_certification(
    inputs: _Inputs,
    grid: CellGrid,
    problem: AllocationProblem,
    observed: np.ndarray,
    measured: np.ndarray,
    round_no: int,
    cheap: Any = None,
    server_failed: np.ndarray | None = None,
) -> Any:
    """The converged certifying posterior and the joint check, for a round whose intervals certify.

    ``cheap`` is the round's own posterior: its draws' covariance is the
    certifying warm-up's first mass matrix (a deterministic function of the
    round, so a resumed campaign reproduces the attempt). ``server_failed``:
    :func:`server_failures`."""
    from fleetsieve_bayes.campaign.certification import campaign_attempt

    seed = _round_seed(inputs.seed, round_no) + 1
    return campaign_attempt(
        inputs.campaign, grid, problem, inputs.card, observed, measured, seed=seed, mass_from=cheap,
        server_failed=server_failed,
    )


def _choose(inputs: _Inputs, strategy: Any, state: Any, attempt: Any, round_no: int) -> int:
    """The next cell: the strategy's pick, or — when the interval gap is closed but the
    joint check is not — the cell expected to reduce the decision's posterior regret most."""
    from fleetsieve_bayes.campaign.certification import thin
    from fleetsieve_bayes.decision.regret_acquisition import regret_scores, select_by_regret

    grid, measured = state.grid, state.measured
    chosen: int | None = None
    if attempt is not None:
        # Acquire on the converged draws (thinned to the cheap fit's shape).
        state = state._replace(posterior=thin(attempt.posterior, state.posterior.latent.shape[0]))
        if attempt.gap_closed and inputs.strategy == "fleetsieve":
            scores = regret_scores(
                grid,
                state.problem,
                state.conservative,
                attempt.posterior.latent,
                attempt.posterior.noise,
                state.observed,
                measured,
                seed=_round_seed(inputs.seed, round_no) + 2,
            )
            chosen = select_by_regret(scores, grid.cost_gpu_s)
    if chosen is None:
        chosen = int(strategy.select(state))
    if measured[chosen]:
        raise RuntimeError(f"strategy {inputs.strategy!r} chose measured cell {grid.describe(chosen)}")
    return int(chosen)


def _write_round_files(out: Path, grid: CellGrid, posterior: Any, bounds: Any, measured: np.ndarray) -> None:
    """This round's ``bounds.csv`` and ``posterior.nc``, each replaced atomically."""
    from fleetsieve_bayes.decision.bounds import bounds_frame
    from fleetsieve_bayes.model.inference import save_posterior

    frame = bounds_frame(grid, bounds, measured)
    atomic_write_text(out / "bounds.csv", frame.to_csv(index=False))
    tmp = out / ".posterior.nc.tmp"
    save_posterior(posterior, tmp)
    tmp.replace(out / "posterior.nc")


def _round_seed(seed: int, round_no: int) -> int:
    """A per-round seed that depends only on (seed, round), so resumes replay exactly."""
    return int(np.random.SeedSequence([seed, round_no]).generate_state(1)[0])


def _jax_key(seed: int, round_no: int) -> Any:
    import jax

    return jax.random.PRNGKey(_round_seed(seed, round_no))


def _result_json(inputs: _Inputs, grid: CellGrid, journal: Journal, final: RoundRecord, wall_s: float) -> dict[str, Any]:
    """result.json, from the journal alone (the same whether the run was interrupted or not)."""
    meas = journal.measurements
    rounds = unique_rounds(journal.rounds)
    per_round = [{"round": r.round, **r.timings, "total_s": float(sum(r.timings.values()))} for r in rounds]
    alloc = None if final.final is None else final.final.allocation
    objective = None
    if final.final is not None and final.final.feasible:
        objective = {k: final.final.objective[k] for k in ("min_fulfillment", "goodput_rps", "gpus_used")}
    header = journal.header
    return {
        "status": final.outcome,
        "gpu_seconds": float(sum(r.gpu_seconds for r in meas)),
        "profiling_wall_s": profiling_wall_s(journal.records),
        # Server start-up of cells that ran (a failed start-up is its own
        # duration_s, inside gpu_seconds): reported beside, never inside, gpu_seconds.
        "startup_gpu_seconds": startup_gpu_seconds([r.row for r in meas if not r.seeded]),
        "measured": [r.cell.to_json() for r in meas],
        "allocation": alloc,
        "timings": {
            "total_s": float(sum(p["total_s"] for p in per_round) + sum(r.wall_s for r in meas)),
            "rounds": len(rounds),
            "per_round_s": [p["total_s"] for p in per_round],
            "per_round": per_round,
            "this_invocation_s": wall_s,
        },
        # Additive extensions of the result.json contract (docs/contracts.md).
        "campaign": inputs.campaign.name,
        "strategy": inputs.strategy,
        "seed": inputs.seed,
        "objective": objective,
        "certificate": {
            "reason": final.reason,
            "gap": dict(final.gap),
            # The joint check and the certifying posterior's diagnostics of the
            # final round (null when that round made no certification attempt).
            **_joint_json(final.joint),
        },
        "risk": inputs.campaign.risk,
        "epsilon": inputs.campaign.epsilon,
        "candidates": grid.n_cells,
        "seeded": [r.cell.to_json() for r in meas if r.seeded],
        "reused_from": None if header is None or header.reused_from is None else header.reused_from["directory"],
    }


def _joint_json(joint: dict[str, Any] | None) -> dict[str, Any]:
    if not joint:
        return {"p_epsilon_optimal": None, "p_slo_met": None, "p_infeasible": None, "diagnostics": None}
    return {k: joint.get(k) for k in ("p_epsilon_optimal", "p_slo_met", "p_infeasible", "diagnostics")}
