"""What a campaign directory shows besides its journal, and the typed result.

``measurements.csv`` (the measured rows), ``bounds.csv`` and ``posterior.nc``
(the latest round's view) and ``result.json`` are all derived from the journal
and replaced atomically; ``result.json`` is built from the journal alone, so it
is the same whether the run was interrupted or not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.atomic import atomic_write_text
from fleetsieve_bayes.campaign.budget import BUDGET_REASON, budget_json
from fleetsieve_bayes.campaign.journal import Journal, RoundRecord, unique_rounds
from fleetsieve_bayes.campaign.makespan import profiling_wall_s
from fleetsieve_bayes.campaign.windows import window_rows
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    EXHAUSTED,
)
from fleetsieve_bayes.table import startup_gpu_seconds, write_table

__all__ = [
    "Placement",
    "CampaignResult",
    "write_measurements",
    "write_round_files",
    "placements",
    "result_json",
    "stop_reason",
    "alternatives_json",
    "write_result",
]


class Placement(NamedTuple):
    """One class's part of the final allocation: ``replicas`` servers of ``tp`` GPUs at ``load``
    (a class that gets no replica: ``tp`` and ``load`` None, ``replicas`` 0)."""

    tp: int | None
    load: str | None
    replicas: int


def placements(alloc: dict[str, Any] | None) -> dict[str, Placement] | None:
    """result.json's ``allocation`` object as :class:`Placement` per class (None stays None)."""
    if alloc is None:
        return None
    return {
        w: Placement(None if a["tp"] is None else int(a["tp"]), None if a["load"] is None else str(a["load"]), int(a["replicas"]))
        for w, a in alloc.items()
    }


class CampaignResult(NamedTuple):
    """What a campaign decided: ``result.json`` (``result``) with typed accessors.

    ``to_json()`` is ``result.json``'s object exactly (docs/contracts.md).
    """

    status: str
    result: dict[str, Any]

    @property
    def gpu_seconds(self) -> float:
        return float(self.result["gpu_seconds"])

    @property
    def profiling_wall_s(self) -> float:
        return float(self.result["profiling_wall_s"])

    @property
    def allocation(self) -> dict[str, Placement] | None:
        """Per class: TP, load and replicas of the final allocation (None when there is none)."""
        return placements(self.result.get("allocation"))

    @property
    def measured(self) -> list[dict[str, Any]]:
        return list(self.result["measured"])

    def to_json(self) -> dict[str, Any]:
        return self.result


def write_measurements(out: Path, journal: Journal) -> None:
    """``measurements.csv``: every window measured so far, each with its ``replicate``
    (nothing before the first). A catalogued campaign's rows name their ``config``,
    and give ``tp`` only for an aggregated one."""
    rows = window_rows(journal.measurements)
    if not rows:
        return
    frame = pd.DataFrame(rows)
    header = journal.header
    catalogue = ((header.inputs or {}).get("configs") if header is not None else None) or []
    if catalogue and "config" in frame.columns:  # tp as the table gives it: the aggregated TP, else empty
        tp_of = {str(c["name"]).lower(): c.get("tp") for c in catalogue}
        frame["tp"] = pd.array([tp_of.get(str(n).lower()) for n in frame["config"]], dtype="Int64")
    tmp = out / ".measurements.csv.tmp"
    write_table(frame, tmp)
    tmp.replace(out / "measurements.csv")


def write_round_files(out: Path, grid: CellGrid, posterior: Any, bounds: Any, measured: np.ndarray) -> None:
    """This round's ``bounds.csv`` and ``posterior.nc``, each replaced atomically."""
    from fleetsieve_bayes.decision.bounds import bounds_frame
    from fleetsieve_bayes.model.inference import save_posterior

    frame = bounds_frame(grid, bounds, measured)
    atomic_write_text(out / "bounds.csv", frame.to_csv(index=False))
    tmp = out / ".posterior.nc.tmp"
    save_posterior(posterior, tmp)
    tmp.replace(out / "posterior.nc")


def _joint_json(joint: dict[str, Any] | None) -> dict[str, Any]:
    if not joint:
        return {"p_epsilon_optimal": None, "p_slo_met": None, "p_infeasible": None, "diagnostics": None}
    return {k: joint.get(k) for k in ("p_epsilon_optimal", "p_slo_met", "p_infeasible", "diagnostics")}


def _window_json(rec: Any) -> dict[str, Any]:
    """One window in ``result.json``: ``{workload, tp, load, replicate}``."""
    return {**rec.cell.to_json(), "replicate": int(rec.replicate)}


def result_json(setup: Any, grid: CellGrid, journal: Journal, final: RoundRecord, wall_s: float) -> dict[str, Any]:
    """result.json, from the journal alone (the same whether the run was interrupted or not).

    ``setup``: the :class:`~fleetsieve_bayes.campaign.setup.CampaignSetup`.
    """
    meas = journal.measurements
    rounds = unique_rounds(journal.rounds)
    per_round = [{"round": r.round, **r.timings, "total_s": float(sum(r.timings.values()))} for r in rounds]
    alloc = None if final.final is None else final.final.allocation
    objective = None
    if final.final is not None and final.final.feasible:
        objective = {k: final.final.objective[k] for k in ("min_fulfillment", "goodput_rps", "gpus_used")}
        if "usd_per_hour" in final.final.objective:  # a priced campaign ([[fleet.pools]])
            objective["usd_per_hour"] = final.final.objective["usd_per_hour"]
    header = journal.header
    result = {
        "status": final.outcome,
        "gpu_seconds": float(sum(r.gpu_seconds for r in meas)),
        "profiling_wall_s": profiling_wall_s(journal.records),
        # Server start-up of cells that ran (a failed start-up is its own
        # duration_s, inside gpu_seconds): reported beside, never inside, gpu_seconds.
        "startup_gpu_seconds": startup_gpu_seconds([r.row for r in meas if not r.seeded]),
        # Every window in order: a repeat is the cell again with its replicate.
        "measured": [_window_json(r) for r in meas],
        "allocation": alloc,
        "answer": _answer(setup.campaign, final.outcome),
        "timings": {
            "total_s": float(sum(p["total_s"] for p in per_round) + sum(r.wall_s for r in meas)),
            "rounds": len(rounds),
            "per_round_s": [p["total_s"] for p in per_round],
            "per_round": per_round,
            "this_invocation_s": wall_s,
        },
        # Additive extensions of the result.json contract (docs/contracts.md).
        "campaign": setup.campaign.name,
        "strategy": setup.strategy_name,
        "seed": setup.seed,
        "objective": objective,
        "certificate": {
            "reason": final.reason,
            "gap": dict(final.gap),
            # The joint check and the certifying posterior's diagnostics of the
            # final round (null when that round made no certification attempt).
            **_joint_json(final.joint),
        },
        "risk": setup.campaign.risk,
        "epsilon": setup.campaign.epsilon,
        "candidates": grid.n_cells,
        "seeded": [_window_json(r) for r in meas if r.seeded],
        "reused_from": None if header is None or header.reused_from is None else header.reused_from["directory"],
        "production": _production_json(setup, grid, journal, alloc),
        "stop_reason": stop_reason(setup.campaign, final),
        "budget": budget_json(setup.campaign, journal.records, final),
        **alternatives_json(setup.campaign, final),
        **_attainment_json(setup.campaign, final.joint, final.outcome),
    }
    pools = getattr(setup.campaign, "pools", ())
    if pools:  # profiling cost in dollars: each cell's GPU-seconds at its pool's price
        price = {p.gpu.lower(): p.usd_per_gpu_hour for p in pools}
        def gpu_of(r: Any) -> str:
            return str(getattr(r.cell, "gpu", "") or r.row.get("gpu") or pools[0].gpu).lower()

        result["profiling_usd"] = float(sum(r.gpu_seconds * price[gpu_of(r)] / 3600.0 for r in meas))
        if len(pools) > 1:  # several pools: each GPU type's share of the profiling
            by = {p.gpu: {"gpu_seconds": 0.0, "usd": 0.0, "windows": 0} for p in pools}
            name = {p.gpu.lower(): p.gpu for p in pools}
            for r in meas:
                e = by[name[gpu_of(r)]]
                e["gpu_seconds"] += float(r.gpu_seconds)
                e["usd"] += float(r.gpu_seconds) * price[gpu_of(r)] / 3600.0
                e["windows"] += 1
            result["profiling_by_gpu"] = by
    return result


def alternatives_json(campaign: Any, final: RoundRecord) -> dict[str, Any]:
    """result.json's ``alternatives`` (the final round's ranked fleets, at most ``[stopping]
    alternatives`` of them) and ``alternatives_draws`` (which posterior, how many draws);
    both null when the round ranked none (``alternatives = 0``, or a journal older than them)."""
    alt = final.alternatives
    count = int(getattr(campaign, "alternatives", 5))
    if alt is None or count <= 0:
        return {"alternatives": None, "alternatives_draws": None}
    return {
        "alternatives": list(alt["ranked"])[:count],
        "alternatives_draws": {"posterior": alt.get("posterior"), "draws": alt.get("draws")},
    }


def stop_reason(campaign: Any, final: RoundRecord) -> str:
    """result.json's ``stop_reason``: ``certificate`` (certified either way), ``exhausted``,
    ``budget`` (the profiling budget), ``max_rounds``, or ``nothing-to-measure`` (undecided
    with no cell or window left that could settle it)."""
    if final.stop and final.stop.get("reason") == BUDGET_REASON:
        return BUDGET_REASON
    if final.outcome in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
        return "certificate"
    if final.outcome == EXHAUSTED:
        return "exhausted"
    max_rounds = getattr(campaign, "max_rounds", None)
    if max_rounds is not None and final.round > max_rounds:
        return "max_rounds"
    return "nothing-to-measure"


def _answer(campaign: Any, status: str) -> str | None:
    """result.json's ``answer``: the table ``allocation`` was chosen on (:func:`fleetsieve_bayes.round.answer_rule`)."""
    from fleetsieve_bayes.round import answer_rule
    from fleetsieve_bayes.settings import DecisionSettings

    return answer_rule(status, DecisionSettings.from_campaign(campaign))


def _attainment_json(campaign: Any, joint: dict[str, Any] | None, status: str) -> dict[str, Any]:
    """At an SLO-attainment level: the level per class, each committed cell's
    windows and attainment, the cell to repeat, and (an answer on measured cells' posterior
    attainment) the confidence each class's measured cells needed, and for ``"probable"``
    the answers weighed (docs/contracts.md); nothing at ``"point"``."""
    from fleetsieve_bayes.decision.bounds import answer_confidence

    levels = campaign.slo_levels() if hasattr(campaign, "slo_levels") else "point"
    if isinstance(levels, str):
        return {}
    j = joint or {}
    out = {
        "slo_attainment": dict(zip(campaign.workload_names, levels, strict=True)),
        "committed": j.get("committed"),
        "repeat": j.get("repeat"),
    }
    answer = _answer(campaign, status)
    if answer in ("credible", "best-estimate"):
        conf = answer_confidence(campaign.uncertified_answer, np.asarray(levels, np.float64))
        assert conf is not None
        out["answer_confidence"] = {w: round(float(c), 6) for w, c in zip(campaign.workload_names, conf, strict=True)}
    elif answer == "probable" and j.get("answer_choice") is not None:
        choice = j["answer_choice"]
        out["answer_choice"] = choice
        if choice["candidate"] != "conservative":
            out["answer_confidence"] = {w: float(choice["candidate"]) for w in campaign.workload_names}
    return out


def _production_json(setup: Any, grid: CellGrid, journal: Journal, alloc: dict[str, Any] | None) -> dict[str, Any] | None:
    """result.json's ``production`` (null without production windows; docs/contracts.md)."""
    from fleetsieve_bayes.deploy.production import PRODUCTION_PHASE, production_summary
    from fleetsieve_bayes.round import measured_state

    if not any(r.phase == PRODUCTION_PHASE for r in journal.measurements):
        return None
    measured, observed, _ = measured_state(grid, journal.measurements)
    pooled = {grid.key(c): observed[c] for c in range(grid.n_cells) if measured[c]}
    slos = {w.name: {"success_min": w.slo.success_min, "ttft_p99_s": w.slo.ttft_p99_s,
                     "completion_p99_s": w.slo.completion_p99_s} for w in setup.campaign.workloads}
    return production_summary(journal.measurements, alloc, slos, pooled)


def write_result(out: Path, result: dict[str, Any], *, allow_nan: bool = False) -> None:
    """``result.json``, replaced atomically."""
    atomic_write_text(out / "result.json", json.dumps(result, indent=2, allow_nan=allow_nan) + "\n")
