"""The decision loop: fit → bounds → allocate both → certify → acquire → measure.

``run_campaign`` runs (or resumes) one campaign in a directory. Everything it
measures goes to the append-only journal before the next step, so a kill at
any instant loses at most the measurement in flight; running again on the same
directory resumes. Each round's randomness is derived from ``(seed, round)``
and the warm-start state of the model is saved with the round, so a resumed
campaign makes the same decisions as an uninterrupted one.

Campaign directory:
    journal.jsonl     append-only record of every measurement and round
    measurements.csv  the measured rows (derived from the journal)
    posterior.nc      the latest posterior (ArviZ InferenceData)
    bounds.csv        the latest credible intervals of every cell
    warm_start/       the model state each round starts from
    result.json       the final result (docs/contracts.md)
"""

from __future__ import annotations

import json
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
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.journal import (
    Journal,
    atomic_write_text,
    campaign_lock,
    open_journal,
)
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    EXHAUSTED,
    UNDECIDED,
    Certificate,
    certify,
)
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.jax_cache import enable_compilation_cache
from fleetsieve_bayes.table import COLUMNS, METRICS, startup_gpu_seconds, write_table

__all__ = ["CampaignOutcome", "run_campaign", "measured_state", "Event"]

# Callback for progress displays: ``on_event(kind, info)``. Kinds: "resume",
# "round", "measure-start", "measure-done", "done".
Event = Callable[[str, dict[str, Any]], None]


class CampaignOutcome(NamedTuple):
    """What ``run_campaign`` returns (and writes as ``result.json``)."""

    status: str
    result: dict[str, Any]
    allocation: Allocation | None


def _cell_json(grid: CellGrid, c: int) -> dict[str, Any]:
    w, tp, load = grid.key(c)
    return {"workload": w, "tp": tp, "load": load}


def _objective_json(a: Allocation) -> dict[str, Any]:
    return objective_json(a, with_feasible=True)


def measured_state(grid: CellGrid, journal_records: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Rebuild what is measured from journal records.

    Returns:
        ``measured (n_cells,) bool``, ``observed (n_cells, 4)`` (NaN where
        unmeasured) and the measured cell indices in measurement order.
    """
    index = grid.index()
    measured = np.zeros(grid.n_cells, dtype=bool)
    observed = np.full((grid.n_cells, len(METRICS)), np.nan)
    order: list[int] = []
    for rec in journal_records:
        if rec.get("type") != "measurement":
            continue
        cell = rec["cell"]
        key = (cell["workload"], int(cell["tp"]), str(cell["load"]))
        if key not in index:
            raise InputError(f"journal: measured cell {key} is not a candidate of this campaign")
        c = index[key]
        if measured[c]:
            continue  # never measured twice by us; tolerate a duplicate record
        measured[c] = True
        observed[c] = [float(rec["row"][m]) for m in METRICS]
        order.append(c)
    return measured, observed, order


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
    on_event(
        "measure-start",
        {
            "cell": _cell_json(grid, c),
            "label": grid.describe(c),
            "expected_s": float(backend.expected_duration_s[c]),
            "round": round_no,
            "candidates": grid.n_cells,
        },
    )
    started = time.time()
    row = backend.preflight(c)
    if row is None:
        row = backend.measure(c)
    finished = time.time()
    missing = [k for k in COLUMNS if k not in row]
    if missing:
        raise InputError(f"backend returned a row for {grid.describe(c)} without {', '.join(missing)}")
    row = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
    gpu_s = float(row["duration_s"]) * int(row["tp"])
    journal.append(
        {
            "type": "measurement",
            "seq": len(journal.of_type("measurement")),
            "round": round_no,
            "phase": phase,
            "cell": _cell_json(grid, c),
            "row": row,
            "gpu_seconds": gpu_s,
            "started_at": started,
            "finished_at": finished,
            "wall_s": finished - started,
        }
    )
    on_event("measure-done", {"cell": _cell_json(grid, c), "label": grid.describe(c), "row": row, "gpu_seconds": gpu_s})


def _write_measurements(out: Path, journal: Journal) -> None:
    rows = [r["row"] for r in journal.of_type("measurement")]
    if not rows:
        return
    df = pd.DataFrame(rows)
    tmp = out / ".measurements.csv.tmp"
    write_table(df, tmp)
    tmp.replace(out / "measurements.csv")


def _measured_only_table(observed: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Values where unmeasured cells are inadmissible (zero throughput and success)."""
    vals = np.where(measured[:, None], observed, 0.0)
    vals[~measured, 1:3] = np.inf
    return vals


def _header(campaign: Campaign, grid: CellGrid, strategy: str, seed: int) -> dict[str, Any]:
    return {
        "type": "header",
        "version": 1,
        "campaign": campaign.name,
        "strategy": strategy,
        "seed": seed,
        "cells": [_cell_json(grid, c) for c in range(grid.n_cells)],
        "created_at": time.time(),
        # What status/report need to explain the decision without the TOML.
        "campaign_file": str(campaign.path),
        "gpus": campaign.gpus,
        "epsilon": campaign.epsilon,
        "credible_level": campaign.credible_level,
        "workloads": [
            {
                "name": w.name,
                "demand_rps": w.demand_rps,
                "critical": w.critical,
                "floor": w.floor,
                "slo": {
                    "success_min": w.slo.success_min,
                    "ttft_p99_s": w.slo.ttft_p99_s,
                    "completion_p99_s": w.slo.completion_p99_s,
                },
            }
            for w in campaign.workloads
        ],
    }


def _check_header(out: Path, header: dict[str, Any], expected: dict[str, Any]) -> None:
    for key in ("strategy", "seed", "cells"):
        if header.get(key) != expected[key]:
            what = "candidate cells" if key == "cells" else key
            raise InputError(
                f"{out}: this directory holds a campaign with a different {what} "
                f"({header.get(key) if key != 'cells' else 'another grid'!r}); resume with the same "
                f"campaign/--strategy/--seed or use a new --out"
            )


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
) -> CampaignOutcome:
    """Run or resume ``campaign`` in directory ``out`` and write ``out/result.json``.

    Args:
        strategy: acquisition strategy name (see :mod:`fleetsieve_bayes.decision.strategies`).
        seed: seeds every round's randomness (NUTS, fantasies, random strategy).
        on_event: progress callback ``(kind, info)``.
        backend: a measurement backend; by default the campaign's own.

    Raises:
        InputError: bad campaign, a journal from another campaign, or a
            directory locked by another run.
    """
    on_event = on_event or _noop
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with campaign_lock(out):
        own_backend = backend is None
        backend = backend or make_backend(campaign, out)
        try:
            return _run_locked(campaign, out, backend, strategy, seed, on_event)
        finally:
            if own_backend:
                backend.close()


def _run_locked(
    campaign: Campaign, out: Path, backend: Backend, strategy_name: str, seed: int, on_event: Event
) -> CampaignOutcome:
    # Imported here: these pull in JAX/NumPyro, which `status`/`report` don't need.
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.campaign.certification import attempt_certification, thin
    from fleetsieve_bayes.decision.bounds import (
        conservative_table,
        credible_bounds,
        optimistic_table,
    )
    from fleetsieve_bayes.decision.regret_acquisition import regret_scores, select_by_regret
    from fleetsieve_bayes.decision.strategies import RoundState, make_strategy
    from fleetsieve_bayes.model.inference import fit, load_preset
    from fleetsieve_bayes.model.priors import load_card
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start

    enable_compilation_cache()
    t_start = time.perf_counter()
    grid = backend.grid
    problem: AllocationProblem = problem_from_campaign(campaign)
    card = load_card(campaign.family)
    preset = load_preset(campaign.inference)
    strategy = make_strategy(
        strategy_name,
        grid,
        problem,
        credible_level=campaign.credible_level,
        repeatability=campaign.repeatability,
        seed=seed,
    )

    journal = open_journal(out)
    try:
        expected_header = _header(campaign, grid, strategy_name, seed)
        headers = journal.of_type("header")
        if headers:
            _check_header(out, headers[0], expected_header)
            on_event("resume", {"measured": len(journal.of_type("measurement")), "candidates": grid.n_cells})
        else:
            journal.append(expected_header)

        measured, observed, _ = measured_state(grid, journal.records)

        # 1. The common initial design.
        for c in initial_design(grid):
            if not measured[c]:
                _measure_cell(backend, journal, grid, c, round_no=0, phase="design", on_event=on_event)
                measured, observed, _ = measured_state(grid, journal.records)
        _write_measurements(out, journal)

        # 2. Rounds. Round r fits on what is measured after r−1 acquisitions.
        round_no = 1 + len([r for r in journal.of_type("measurement") if r.get("phase") == "acquire"])
        warm = load_warm_start(out / "warm_start", before_round=round_no)
        status = UNDECIDED
        final_alloc: Allocation | None = None
        cert: Certificate | None = None
        while True:
            t0 = time.perf_counter()
            posterior = fit(
                grid, observed, measured, card, preset, seed=_round_seed(seed, round_no), warm_start=warm
            )
            t_fit = time.perf_counter() - t0
            save_warm_start(out / "warm_start", posterior, round_no=round_no)
            warm = posterior

            t0 = time.perf_counter()
            bounds = credible_bounds(
                posterior, observed, measured, campaign.credible_level, campaign.repeatability
            )
            cons_vals = conservative_table(bounds)
            opt_vals = optimistic_table(bounds)
            conservative = allocate_milp(grid, cons_vals, problem)
            optimistic = allocate_milp(grid, opt_vals, problem)
            cert = certify(grid, problem, conservative, optimistic, measured, observed, campaign.epsilon)
            t_alloc = time.perf_counter() - t0

            # A certified state is only issued from the converged certifying
            # posterior and after the decision-level joint check.
            attempt = None
            t_cert = 0.0
            if cert.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
                attempt = attempt_certification(
                    grid,
                    problem,
                    card,
                    observed,
                    measured,
                    epsilon=campaign.epsilon,
                    credible_level=campaign.credible_level,
                    repeatability=campaign.repeatability,
                    risk=campaign.risk,
                    seed=_round_seed(seed, round_no) + 1,
                )
                cert, bounds = attempt.certificate, attempt.bounds
                conservative, optimistic = attempt.conservative, attempt.optimistic
                t_cert = attempt.wall_s

            unmeasured = np.flatnonzero(~measured)
            chosen: int | None = None
            t_acq = 0.0
            if cert.status == CERTIFIED_FEASIBLE:
                status, final_alloc = CERTIFIED_FEASIBLE, conservative
            elif cert.status == CERTIFIED_INFEASIBLE:
                status, final_alloc = CERTIFIED_INFEASIBLE, None
            elif len(unmeasured) == 0:
                status = EXHAUSTED
                final_alloc = allocate_milp(grid, _measured_only_table(observed, measured), problem)
            elif campaign.max_rounds is not None and round_no > campaign.max_rounds:
                status, final_alloc = UNDECIDED, conservative
            else:
                t0 = time.perf_counter()
                state = RoundState(
                    grid=grid,
                    problem=problem,
                    campaign_epsilon=campaign.epsilon,
                    credible_level=campaign.credible_level,
                    repeatability=campaign.repeatability,
                    measured=measured.copy(),
                    observed=observed.copy(),
                    # After an attempt, its converged draws (thinned to the cheap fit's shape).
                    posterior=posterior if attempt is None else thin(attempt.posterior, posterior.latent.shape[0]),
                    bounds=bounds,
                    conservative=conservative,
                    optimistic=optimistic,
                    certificate=cert,
                    round=round_no,
                    rng=np.random.default_rng([seed, round_no]),
                    key=_jax_key(seed, round_no),
                )
                if attempt is not None and attempt.gap_closed and strategy_name == "fleetsieve":
                    # The interval gap is closed but the joint check is not: measure
                    # the cell expected to reduce the decision's posterior regret most.
                    scores = regret_scores(
                        grid,
                        problem,
                        conservative,
                        attempt.posterior.latent,
                        attempt.posterior.noise,
                        observed,
                        measured,
                        seed=_round_seed(seed, round_no) + 2,
                    )
                    chosen = select_by_regret(scores, grid.cost_gpu_s)
                if chosen is None:
                    chosen = int(strategy.select(state))
                if measured[chosen]:
                    raise RuntimeError(f"strategy {strategy_name!r} chose measured cell {grid.describe(chosen)}")
                t_acq = time.perf_counter() - t0

            spent = sum(r["gpu_seconds"] for r in journal.of_type("measurement"))
            round_rec = {
                "type": "round",
                "round": round_no,
                "certificate": cert.status,
                "outcome": "measure" if chosen is not None else status,
                "reason": cert.reason,
                "gap": cert.gap._asdict(),
                "conservative": {"allocation": allocation_to_json(conservative, grid), "objective": _objective_json(conservative)},
                "optimistic": {"allocation": allocation_to_json(optimistic, grid), "objective": _objective_json(optimistic)},
                "measured_cells": int(measured.sum()),
                "candidates": grid.n_cells,
                "gpu_seconds": spent,
                "chosen": None if chosen is None else _cell_json(grid, chosen),
                "timings": {"fit_s": t_fit, "allocate_s": t_alloc, "acquire_s": t_acq, "certify_s": t_cert},
            }
            if attempt is not None:
                round_rec["joint"] = attempt.to_json()
            # Persist this round's view for status/report before measuring.
            _write_round_files(out, grid, posterior if attempt is None else attempt.posterior, bounds, measured)
            if chosen is None:
                journal.append(round_rec)
                on_event("round", round_rec)
                break
            journal.append(round_rec)
            on_event("round", round_rec)
            _measure_cell(backend, journal, grid, chosen, round_no=round_no, phase="acquire", on_event=on_event)
            measured, observed, _ = measured_state(grid, journal.records)
            _write_measurements(out, journal)
            round_no += 1

        result = _result_json(campaign, grid, journal, status, final_alloc, cert, strategy_name, seed, time.perf_counter() - t_start)
        atomic_write_text(out / "result.json", json.dumps(result, indent=2) + "\n")
        on_event("done", result)
        return CampaignOutcome(status, result, final_alloc)
    finally:
        journal.close()


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


def _result_json(
    campaign: Campaign,
    grid: CellGrid,
    journal: Journal,
    status: str,
    alloc: Allocation | None,
    cert: Certificate | None,
    strategy: str,
    seed: int,
    wall_s: float,
) -> dict[str, Any]:
    meas = journal.of_type("measurement")
    rounds = journal.of_type("round")
    per_round = [
        {"round": r["round"], **r["timings"], "total_s": float(sum(r["timings"].values()))} for r in rounds
    ]
    objective = objective_json(alloc) if alloc is not None and alloc.feasible else None
    return {
        "status": status,
        "gpu_seconds": float(sum(r["gpu_seconds"] for r in meas)),
        # Server start-up of cells that ran (a failed start-up is its own
        # duration_s, inside gpu_seconds): reported beside, never inside, gpu_seconds.
        "startup_gpu_seconds": startup_gpu_seconds([r["row"] for r in meas]),
        "measured": [r["cell"] for r in meas],
        "allocation": None if alloc is None else allocation_to_json(alloc, grid),
        "timings": {
            "total_s": float(sum(p["total_s"] for p in per_round) + sum(r["wall_s"] for r in meas)),
            "rounds": len(rounds),
            "per_round_s": [p["total_s"] for p in per_round],
            "per_round": per_round,
            "this_invocation_s": wall_s,
        },
        # Additive extensions of the result.json contract (docs/contracts.md).
        "campaign": campaign.name,
        "strategy": strategy,
        "seed": seed,
        "objective": objective,
        "certificate": None
        if cert is None
        else {
            "reason": cert.reason,
            "gap": {k: float(v) for k, v in cert.gap._asdict().items()},
            # The joint check and the certifying posterior's diagnostics of the
            # final round (null when that round made no certification attempt).
            **_joint_json(rounds[-1] if rounds else None),
        },
        "risk": campaign.risk,
        "epsilon": campaign.epsilon,
        "candidates": grid.n_cells,
    }


def _joint_json(round_rec: dict[str, Any] | None) -> dict[str, Any]:
    joint = (round_rec or {}).get("joint")
    if not joint:
        return {"p_epsilon_optimal": None, "p_slo_met": None, "p_infeasible": None, "diagnostics": None}
    return {k: joint.get(k) for k in ("p_epsilon_optimal", "p_slo_met", "p_infeasible", "diagnostics")}
