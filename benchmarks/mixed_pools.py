"""Mixed GPU pools end to end: one campaign over every type against one campaign per type.

Synthetic mixed-pool fleets (:mod:`fleetsieve_bayes.evaluation.mixed_pools`,
fixed seed; every other fleet is built to need a mix: too few H100s for an
all-H100 answer). For each fleet:

* the **mixed campaign** (every pool, the generic card with the roofline
  ``[gpu_axis]``) runs to its stop on the replay backend;
* **one campaign per GPU type**, run separately (its rows, its pool, the
  generic card), each to its stop;
* on the noise-free truth: the full-table optimum over all pools (the
  oracle), and the **best single-type fleet** (the optimum with one pool
  alone, best over the types: max–min fulfillment, then goodput, then
  dollars).

Reported per fleet: profiling GPU-seconds (and dollars) of the mixed
campaign against the sum of the single-type campaigns; whether its decision
is ε-correct on the truth on goodput (the lexicographic regret) *and* on cost
(its true $/h within (1 + ε) of the oracle's); false certificates (a
certified decision that is not ε-correct on either, or commits to a cell
violating its SLO on the truth); the decision's true $/h against the best
single-type fleet where that fleet serves as much (where it serves less, the
mixed fleet wins outright).

    python benchmarks/mixed_pools.py --fleets 4 [--seed 0] [--partial FILE] [--work DIR] [--jobs 2] [--out FILE] [--publish]
    python benchmarks/mixed_pools.py --only 2,3,4 --max-rounds 30 --partial FILE   # these fleets, each campaign capped
    python benchmarks/profiling_cost.py --pools 4      # the same study

Prints a markdown table and writes JSON (default benchmarks/results/mixed_pools.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "mixed_pools.json"
TOL = 1e-6


def _usd_per_hour(grid: Any, problem: Any, cell: np.ndarray | None, reps: np.ndarray | None) -> float:
    """Dollars per hour of per-class cells and replicas ``(n_classes,)`` (0 for none)."""
    if cell is None or reps is None:
        return 0.0
    price = np.asarray(problem.usd_per_gpu_hour, np.float64)
    return float(sum(int(n) * int(grid.tp[c]) * price[grid.gpu_idx[c]] for c, n in zip(cell, reps, strict=True) if c >= 0 and n > 0))


def _service(out: Any) -> tuple[float, float]:
    return (round(out.min_fulfillment, 6), round(out.goodput_rps, 6))


# The profiling target the study is read against: GPU-seconds ≤ 0.6× the single-type campaigns.
RATIO_MARK = 0.6


def _single_service(b: dict[str, Any]) -> tuple[float, float]:
    """A single-type optimum's (min fulfillment, goodput rps), rounded as :func:`_service`."""
    return (round(b["min_fulfillment"], 6), round(b["goodput_rps"], 6))


def _beats(service: tuple[float, ...], usd: float, best: dict[str, Any]) -> bool:
    """Whether ``service`` at ``usd`` per hour beats the single-type optimum ``best``: serves more, or the same for fewer dollars."""
    theirs = _single_service(best)
    return bool(service > theirs or (service == theirs and usd < best["usd_per_hour"] - TOL))


def versus_best_single(service: tuple[float, float], best: dict[str, Any], demand_rps: float,
                       epsilon: float) -> dict[str, bool]:
    """A decision's ``service`` (min fulfillment, goodput rps) against the best single-type fleet's.

    ``same_service``: exactly what it serves; ``serves_more``: lexicographically more;
    ``within_epsilon``: not more, and short of it by at most ``epsilon`` at each stage, as
    the regret measures it (fulfillment absolute, goodput over the total demand
    ``demand_rps``): the tolerance an ε-correct decision is allowed against the optimum.
    """
    theirs = _single_service(best)
    more = service > theirs
    within = (not more and theirs[0] - service[0] <= epsilon + TOL
              and (theirs[1] - service[1]) / max(demand_rps, TOL) <= epsilon + TOL)
    return {"same_service": service == theirs, "serves_more": more, "within_epsilon": bool(within)}


def _run(campaign_path: Path, seed: int) -> dict[str, Any]:
    """Run one campaign to its stop in ``out`` next to its file; a finished one is read back."""
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.campaign.runner import run_campaign

    out = campaign_path.parent / "out"
    done = out / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    t0 = time.perf_counter()
    result = run_campaign(load_campaign(campaign_path), out, strategy="fleetsieve", seed=seed).result
    result["wall_s"] = time.perf_counter() - t0
    done.write_text(json.dumps(result, default=float))
    return result


def _run_all(paths: list[Path], seed: int, jobs: int) -> list[dict[str, Any]]:
    """:func:`_run` of every campaign, ``jobs`` at a time."""
    if jobs <= 1:
        return [_run(p, seed) for p in paths]
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from fleetsieve_bayes.backends.lifeline import arm_parent_death_signal

    # Each worker dies with this process, however it dies (a killed study leaves no
    # campaign running on, orphaned, holding cores).
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"),
                             initializer=arm_parent_death_signal) as ex:
        return list(ex.map(_run, paths, [seed] * len(paths)))


def single_type_optima(grid: Any, truth: np.ndarray, problem: Any) -> dict[str, dict[str, Any]]:
    """Per GPU type, the exact optimum on the truth with that pool alone."""
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.evaluation.regret import evaluate_allocation

    out = {}
    for j, g in enumerate(grid.pools):
        counts = np.where(np.arange(grid.n_pools) == j, np.asarray(problem.pool_gpus), 0)
        p = problem._replace(pool_gpus=counts, gpus=int(counts[j]))
        a = allocate_milp(grid, truth, p)
        o = evaluate_allocation(grid, truth, p, a)
        usd = _usd_per_hour(grid, problem, a.cell, a.replicas) if a.feasible else 0.0
        out[g] = {"min_fulfillment": o.min_fulfillment, "goodput_rps": o.goodput_rps, "usd_per_hour": usd}
    return out


def _best(single: dict[str, dict[str, Any]]) -> str:
    return max(single, key=lambda g: (round(single[g]["min_fulfillment"], 6), round(single[g]["goodput_rps"], 6),
                                      -single[g]["usd_per_hour"]))


def _score(grid: Any, values: np.ndarray, problem: Any, epsilon: float,
           cr: tuple[np.ndarray, np.ndarray] | None, certified: bool) -> dict[str, Any]:
    """A decision ``cr`` (per-class cells and replicas ``(n_classes,)``, or None) on one truth ``values (n_cells, 4)``.

    ε-correct on goodput: the lexicographic regret against that truth's
    optimum within ε; on cost as well: its $/h within (1 + ε) of the
    optimum's. A false certificate: certified, and not ε-correct on both, or
    a committed cell violating its SLO on that truth.
    """
    from fleetsieve_bayes.evaluation.regret import eps_correct, evaluate_cells, make_oracle, regret

    oracle = make_oracle(grid, values, problem)
    oracle_usd = _usd_per_hour(grid, problem, oracle.allocation.cell, oracle.allocation.replicas) if oracle.allocation.feasible else 0.0
    out = evaluate_cells(grid, values, problem, *(cr if cr else (None, None)))
    reg = regret(out, oracle, problem)
    usd = _usd_per_hour(grid, problem, *(cr if cr else (None, None)))
    goodput_ok = eps_correct(reg, epsilon)
    cost_ok = goodput_ok and (usd <= (1 + epsilon) * oracle_usd + TOL or not oracle.allocation.feasible)
    return {"outcome": out, "regret": reg._asdict(), "eps_correct_goodput": goodput_ok, "eps_correct_cost": cost_ok,
            "false_certificate": bool(certified and (out.violations or not goodput_ok or not cost_ok)),
            "oracle_usd_per_hour": oracle_usd, "oracle_service": list(_service(oracle.outcome))}


def _fleet_setup(k: int, seed: int, work: Path, max_rounds: int | None = None) -> tuple[Any, Path, Any, Any, np.ndarray, Any]:
    """Fleet ``k``'s ``(fleet, campaign path, campaign, grid, noise-free truth (n_cells, 4), problem)``.

    ``max_rounds``: every campaign of the fleet (the mixed one and each single
    type's) stops undecided after that many rounds (``[stopping] max_rounds``).
    """
    from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.evaluation.mixed_pools import mixed_fleet, true_values, write_mixed

    fleet = mixed_fleet(np.random.default_rng([seed, k]), need_mix=k % 2 == 0)
    if max_rounds is not None:
        fleet.campaign["stopping"]["max_rounds"] = int(max_rounds)
    path = write_mixed(work / f"f{k:03d}" / "mixed", fleet)
    campaign = load_campaign(path)
    grid = grid_from_table(fleet.table, campaign.workload_names, pools=campaign.pool_names)
    return fleet, path, campaign, grid, values_from_table(grid, true_values(fleet.table)), campaign.problem()


def against_singles(grid: Any, values: np.ndarray, problem: Any, outcome: Any, usd: float, epsilon: float,
                    oracle: dict[str, Any]) -> dict[str, Any]:
    """The decision (its ``outcome`` on the truth ``values (n_cells, 4)`` and its ``usd`` per hour) against
    the best single-type fleet on the same truth: the optimum of each pool alone, the best of them
    (:func:`_best`), :func:`versus_best_single`'s flags, and whether that truth needs a mix (its optimum,
    ``oracle`` ``{oracle_service, oracle_usd_per_hour}``, beats every single-type optimum)."""
    single = single_type_optima(grid, values, problem)
    best = _best(single)
    b = single[best]
    vs = versus_best_single(_service(outcome), b, float(np.sum(problem.demand)), epsilon)
    return {
        "single_optima": single, "best_single": best, "best_single_usd_per_hour": b["usd_per_hour"],
        "usd_per_hour": usd, "decision_service": list(_service(outcome)),
        "same_service_as_best_single": vs["same_service"], "serves_more_than_best_single": vs["serves_more"],
        "within_epsilon_of_best_single": vs["within_epsilon"],
        "needs_mix": _beats(tuple(oracle["oracle_service"]), oracle["oracle_usd_per_hour"], b),
    }


def _scored(grid: Any, fleet: Any, truth: np.ndarray, problem: Any, epsilon: float,
            cr: tuple[np.ndarray, np.ndarray] | None, certified: bool) -> dict[str, Any]:
    """A decision scored on both truths, as the point suite: the windows the campaign replays (what
    the point rule reads, ``table``) and the noise-free curves (``curve``); each with its comparison
    against the best single-type fleet on that truth (:func:`against_singles`)."""
    from fleetsieve_bayes.allocation.problem import values_from_table

    usd = _usd_per_hour(grid, problem, *(cr if cr else (None, None)))
    scores = {}
    for name, values in (("table", values_from_table(grid, fleet.table)), ("curve", truth)):
        sc = _score(grid, values, problem, epsilon, cr, certified)
        sc["vs_single"] = against_singles(grid, values, problem, sc.pop("outcome"), usd, epsilon, sc)
        scores[name] = sc
    return scores


def _top_level(scores: dict[str, Any]) -> dict[str, Any]:
    """A fleet record's headline fields: the curves' score and comparison (the fields older records hold)."""
    c, vs = scores["curve"], scores["curve"]["vs_single"]
    return {
        "regret": c["regret"], "eps_correct_goodput": c["eps_correct_goodput"], "eps_correct_cost": c["eps_correct_cost"],
        "false_certificate": c["false_certificate"], "oracle_usd_per_hour": c["oracle_usd_per_hour"], "by_truth": scores,
        "usd_per_hour": vs["usd_per_hour"], "decision_service": vs["decision_service"],
        "single_optima": vs["single_optima"], "best_single": vs["best_single"],
        "best_single_usd_per_hour": vs["best_single_usd_per_hour"],
        "same_service_as_best_single": vs["same_service_as_best_single"],
        "serves_more_than_best_single": vs["serves_more_than_best_single"],
        "within_epsilon_of_best_single": vs["within_epsilon_of_best_single"],
    }


def rescore_fleet(old: dict[str, Any], seed: int, work: Path) -> dict[str, Any]:
    """Score a finished fleet's record ``old`` again (its decision and campaigns as they were) on both truths."""
    from fleetsieve_bayes.evaluation.regret import cells_from_json

    if "error" in old:
        return old
    fleet, _, campaign, grid, truth, problem = _fleet_setup(int(old["fleet"]), seed, work)
    cr = cells_from_json(grid, old.get("allocation"))
    scores = _scored(grid, fleet, truth, problem, campaign.epsilon, cr, bool(old["certified"]))
    return {**old, **_top_level(scores)}


def study_fleet(k: int, seed: int, work: Path, jobs: int = 1, max_rounds: int | None = None) -> dict[str, Any]:
    """Run fleet ``k``'s mixed campaign and its single-type campaigns; evaluate all on the truth."""
    from fleetsieve_bayes.evaluation.mixed_pools import single_type
    from fleetsieve_bayes.evaluation.regret import cells_from_json

    fleet, path, campaign, grid, truth, problem = _fleet_setup(k, seed, work, max_rounds)
    single_paths = [single_type(work / f"f{k:03d}" / g, fleet, g) for g in grid.pools]
    mixed, *single_results = _run_all([path, *single_paths], seed, jobs)
    cr = cells_from_json(grid, mixed.get("allocation"))
    certified = mixed["status"] in ("certified-feasible", "certified-infeasible")
    scores = _scored(grid, fleet, truth, problem, campaign.epsilon, cr, certified)
    singles = {}
    for g, r in zip(grid.pools, single_results, strict=True):
        singles[g] = {"status": r["status"], "gpu_seconds": r["gpu_seconds"], "usd": r.get("profiling_usd"),
                      "wall_s": r.get("wall_s")}
    sum_single = sum(s["gpu_seconds"] for s in singles.values())
    return {
        "fleet": k, "info": fleet.info, "status": mixed["status"], "certified": certified,
        "gpu_seconds": mixed["gpu_seconds"], "profiling_usd": mixed.get("profiling_usd"),
        "profiling_by_gpu": mixed.get("profiling_by_gpu"), "wall_s": mixed.get("wall_s"),
        "allocation": mixed.get("allocation"), **_top_level(scores),
        "singles": singles, "sum_single_gpu_seconds": sum_single,
        "gpu_seconds_ratio": mixed["gpu_seconds"] / sum_single if sum_single else None,
    }


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


_VS_KEYS = ("usd_per_hour", "best_single", "best_single_usd_per_hour", "same_service_as_best_single",
            "serves_more_than_best_single", "within_epsilon_of_best_single", "single_optima")


def vs_single(f: dict[str, Any], truth: str) -> dict[str, Any] | None:
    """A fleet record's comparison with the best single-type fleet on ``truth`` (``table`` or ``curve``,
    :func:`against_singles`); a record scored before the windows had one holds the curves' at its top level."""
    block = f.get("by_truth", {}).get(truth, {}).get("vs_single")
    if block is not None or truth != "curve":
        return block
    curve = f.get("by_truth", {}).get("curve", {})
    needs = (_beats(tuple(curve["oracle_service"]), curve["oracle_usd_per_hour"], f["single_optima"][f["best_single"]])
             if "oracle_service" in curve else bool(f["info"]["need_mix"]))
    return {**{k: f[k] for k in _VS_KEYS if k in f}, "needs_mix": needs}


def cost_summary(fleets: list[dict[str, Any]], truth: str) -> dict[str, Any]:
    """Dollars per hour against the best single-type fleet on one truth, over ``fleets`` (records).

    Where the decision serves what that fleet serves within ε (as ε-correctness allows against the
    optimum), dollars decide; a decision serving more is not worse. A fleet needs a mix when the
    optimum on that truth beats every single-type optimum (serves more, or the same for fewer
    dollars); one built to need a mix (``info.need_mix``: the H100 pool too small for an all-H100
    answer) may still be best served by another type alone.
    """
    rows = [(f, b) for f in fleets if (b := vs_single(f, truth)) is not None]

    def comparable(b: dict[str, Any]) -> bool:
        return bool(b.get("within_epsilon_of_best_single", b["same_service_as_best_single"]))

    def better(b: dict[str, Any], strict: bool, exact: bool = False) -> bool:
        same = b["same_service_as_best_single"] if exact else comparable(b)
        gap = b["best_single_usd_per_hour"] - b["usd_per_hour"]
        return b["serves_more_than_best_single"] or (same and (gap > TOL if strict else gap >= -TOL))

    savings = [1 - b["usd_per_hour"] / b["best_single_usd_per_hour"] for _, b in rows
               if comparable(b) and b["best_single_usd_per_hour"] > 0]
    built = [(f, b) for f, b in rows if f["info"]["need_mix"]]
    needs = [(f, b) for f, b in rows if b["needs_mix"]]
    return {
        "fleets": len(rows),
        "not_worse": sum(better(b, False) for _, b in rows),
        "not_worse_exact_service": sum(better(b, False, exact=True) for _, b in rows),
        "built_to_need_mix": len(built), "strictly_better_built": sum(better(b, True) for _, b in built),
        "needs_mix": len(needs), "strictly_better_needs_mix": sum(better(b, True) for _, b in needs),
        "built_not_needed": [f["fleet"] for f, b in built if not b["needs_mix"]],
        "comparable": sum(comparable(b) for _, b in rows),
        "mean_saving": float(np.mean(savings)) if savings else None,
    }


def summarise(fleets: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [f for f in fleets if "error" not in f]
    paired = [f for f in ok if f["gpu_seconds_ratio"] is not None]
    ratio = [f["gpu_seconds_ratio"] for f in paired]
    single_total = sum(f["sum_single_gpu_seconds"] for f in paired)
    cert = [f for f in ok if f["certified"]]
    return {
        "fleets": len(ok), "errors": len(fleets) - len(ok), "certified": len(cert),
        "eps_correct_goodput": sum(f["eps_correct_goodput"] for f in cert),
        "eps_correct_cost": sum(f["eps_correct_cost"] for f in cert),
        "false_certificates": sum(f["false_certificate"] for f in ok),
        # On the windows the campaign replayed (the point rule's truth, as the point suite's).
        "eps_correct_goodput_table": sum(f["by_truth"]["table"]["eps_correct_goodput"] for f in cert if "by_truth" in f),
        "eps_correct_cost_table": sum(f["by_truth"]["table"]["eps_correct_cost"] for f in cert if "by_truth" in f),
        "false_certificates_table": sum(f["by_truth"]["table"]["false_certificate"] for f in ok if "by_truth" in f),
        "gpu_seconds_ratio_mean": float(np.mean(ratio)) if ratio else None,
        "gpu_seconds_ratio_max": float(np.max(ratio)) if ratio else None,
        # Every mixed campaign's GPU-seconds over every single-type campaign's, summed over fleets.
        "gpu_seconds_ratio_pooled": sum(f["gpu_seconds"] for f in paired) / single_total if single_total else None,
        "gpu_seconds_ratio_over_0_6": sum(r > RATIO_MARK for r in ratio),
        "need_mix": sum(bool(f["info"]["need_mix"]) for f in ok),
        # Each truth's own best single-type fleet (the windows: what the point rule decides on).
        "cost_vs_single": {truth: cost_summary(ok, truth) for truth in ("table", "curve")},
    }


def _versus(b: dict[str, Any] | None) -> str:
    """``TYPE $/h`` of the best single-type fleet on one truth, and how its service compares with the decision's."""
    if b is None:
        return "n/a"
    if b["serves_more_than_best_single"]:
        how = " (serves less)"
    elif b["same_service_as_best_single"]:
        how = ""
    else:
        how = " (serves more, within ε)" if b.get("within_epsilon_of_best_single") else " (serves more)"
    return f"{b['best_single']} {b['best_single_usd_per_hour']:.2f}{how}"


def _cost_sentence(name: str, c: dict[str, Any]) -> str:
    """One truth's :func:`cost_summary` in words."""
    ms = c["mean_saving"]
    not_needed = c["built_not_needed"]
    aside = (f"; fleet{'s' if len(not_needed) > 1 else ''} {', '.join(map(str, not_needed))}, built to need one, "
             f"{'are' if len(not_needed) > 1 else 'is'} best served by one type") if not_needed else ""
    return (f"on the {name}, not above it (or serving more) on {c['not_worse']}/{c['fleets']} "
            f"({c['not_worse_exact_service']}/{c['fleets']} with the service compared exactly), strictly below it on "
            f"{c['strictly_better_needs_mix']}/{c['needs_mix']} fleets that need a mix there and on "
            f"{c['strictly_better_built']}/{c['built_to_need_mix']} built to need one{aside}; mean saving where the service "
            f"is the same within ε {'n/a' if ms is None else f'{100 * ms:.1f} %'} ({c['comparable']} fleets)")


def _yes_no(score: dict[str, Any] | None) -> str:
    """``yes / no`` of a score's ε-correctness on goodput and on cost (``n/a`` without one)."""
    if not score:
        return "n/a"
    return f"{'yes' if score['eps_correct_goodput'] else 'no'} / {'yes' if score['eps_correct_cost'] else 'no'}"


def published_table(res: dict[str, Any]) -> str:
    """The markdown of a run's JSON ``res`` (what ``--publish`` writes to docs/results.md)."""
    return markdown(res)


def markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    lines = [
        "| fleet | types | need mix | status | mixed GPU-s | Σ single GPU-s | ratio | ε-correct on the windows (goodput / cost) "
        "| on the curves | $/h | best single type on the windows ($/h) | on the curves ($/h) |",
        "|---|---|---|---|---:|---:|---:|---|---|---:|---|---|",
    ]
    for f in res["fleets"]:
        if "error" in f:
            lines.append(f"| {f['fleet']} | error: {f['error'][:60]} |||||||||||")
            continue
        lines.append(
            f"| {f['fleet']} | {', '.join(f['info']['types'])} | {'yes' if f['info']['need_mix'] else 'no'} | {f['status']} "
            f"| {f['gpu_seconds']:,.0f} | {f['sum_single_gpu_seconds']:,.0f} | {f['gpu_seconds_ratio']:.2f} "
            f"| {_yes_no(f.get('by_truth', {}).get('table'))} | {_yes_no(f)} "
            f"| {f['usd_per_hour']:.2f} | {_versus(vs_single(f, 'table'))} | {_versus(vs_single(f, 'curve'))} |"
        )
    cv = s["cost_vs_single"]
    lines += [
        "",
        f"{s['fleets']} fleet{'s' if s['fleets'] != 1 else ''}, {s['certified']} certified. On the windows measured (the point rule's truth): ε-correct "
        f"on goodput {s.get('eps_correct_goodput_table', 'n/a')}, on cost {s.get('eps_correct_cost_table', 'n/a')}; "
        f"false certificates {s.get('false_certificates_table', 'n/a')}. On the noise-free curves: ε-correct on goodput "
        f"{s['eps_correct_goodput']}, on cost {s['eps_correct_cost']}; false certificates {s['false_certificates']}. Profiling GPU-seconds / Σ single-type "
        f"campaigns: mean {_ratio(s['gpu_seconds_ratio_mean'])}, pooled {_ratio(s.get('gpu_seconds_ratio_pooled'))}, "
        f"max {_ratio(s['gpu_seconds_ratio_max'])}; above {RATIO_MARK} on {s.get('gpu_seconds_ratio_over_0_6', 'n/a')} fleets.",
        "",
        "Fleet cost against the best single-type fleet on the same truth, the service compared within ε as the regret "
        f"is: {_cost_sentence('windows', cv['table'])}; {_cost_sentence('curves', cv['curve'])}.",
    ]
    if res.get("campaigns_commit"):
        # One commit, or "COMMIT (fleets …); COMMIT (fleets …)" where the runs were gathered across commits.
        at = res["campaigns_commit"]
        at = f"commit `{at[:10]}`" if ";" not in at else "commits " + "; ".join(
            f"`{part.split()[0][:10]}` {' '.join(part.split()[1:])}" for part in at.split(";"))
        lines += ["", f"The campaigns ran at {at}; their decisions are scored at this one."]
    return "\n".join(lines)


def run_study(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run ``args.pools`` (or ``args.fleets``) fleets, checkpointing each to ``--partial``."""
    n = int(getattr(args, "pools", 0) or getattr(args, "fleets", 0))
    only = getattr(args, "only", None)
    ks = sorted({int(k) for k in only.split(",")}) if only else list(range(n))
    max_rounds = getattr(args, "max_rounds", None)
    seed = int(getattr(args, "pool_seed", getattr(args, "seed", 0)) or 0)
    partial = getattr(args, "partial", None)
    done: dict[int, dict[str, Any]] = {}
    if partial is not None and Path(partial).exists():
        for line in Path(partial).read_text().splitlines():
            r = json.loads(line)
            done[int(r["fleet"])] = r
    rescore = getattr(args, "rescore", None)
    if rescore is not None:  # the campaigns as they ran: only their scores are computed again
        prev = json.loads(Path(rescore).read_text())
        seed = int(prev["seed"])
        with tempfile.TemporaryDirectory(prefix="fsb-mixed-") as tmp:
            done = {int(f["fleet"]): rescore_fleet(f, seed, Path(tmp)) for f in prev["fleets"]}
        ks = sorted(done)
        campaigns = getattr(args, "campaigns_commit", None) or prev.get("campaigns_commit") or _manifest_commit("mixed_pools")
    else:
        campaigns = None
    work_arg = getattr(args, "work", None)
    jobs = int(getattr(args, "jobs", 1) or 1)
    with tempfile.TemporaryDirectory(prefix="fsb-mixed-") as tmp:
        work = Path(work_arg) if work_arg else Path(tmp)  # --work: campaigns and their runs persist (resumable)
        for k in ks:
            if k in done:
                continue
            try:
                r = study_fleet(k, seed, work, jobs, max_rounds)
            except Exception as exc:  # noqa: BLE001 - reported, excluded from the summary
                r = {"fleet": k, "error": f"{type(exc).__name__}: {exc}"}
            done[k] = r
            if partial is not None:
                with open(partial, "a") as fh:
                    fh.write(json.dumps(r, default=float) + "\n")
            print(f"fleet {k}: {r.get('status', r.get('error'))}", file=sys.stderr, flush=True)
    fleets = [done[k] for k in sorted(set(ks) | (set(done) if only else set()))]
    res = {"study": "mixed_pools", "seed": seed, "fleets": fleets, "summary": summarise(fleets)}
    if campaigns:
        res["campaigns_commit"] = campaigns
    md = markdown(res)
    print(md)
    out = Path(getattr(args, "out", None) or DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=float))
    if getattr(args, "publish", False):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from publish import command_line, publish

        publish("mixed_pools", res, md, command_line(__file__, argv))
    return 0


def _manifest_commit(study: str) -> str | None:
    """The commit benchmarks/published/MANIFEST.json records for ``study`` (None if absent)."""
    path = REPO / "benchmarks" / "published" / "MANIFEST.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("studies", {}).get(study, {}).get("commit")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fleets", type=int, default=4, help="mixed-pool fleets (default 4)")
    p.add_argument("--only", default=None, metavar="K,K,…",
                   help="run these fleets (their numbers); the report holds them and every fleet already in --partial")
    p.add_argument("--max-rounds", type=int, default=None,
                   help="every campaign stops undecided after this many rounds ([stopping] max_rounds; default: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--partial", type=Path, default=None, help="append each finished fleet to this JSONL file (and resume from it)")
    p.add_argument("--work", type=Path, default=None, help="keep each campaign and its run here (a finished run is read back)")
    p.add_argument("--jobs", type=int, default=1, help="campaigns of a fleet run at once (default 1)")
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--rescore", type=Path, default=None,
                   help="score the fleets of a previous run's JSON again (no campaign runs; their commit is kept)")
    p.add_argument("--campaigns-commit", default=None, metavar="TEXT",
                   help="with --rescore: the commit(s) the campaigns ran at, e.g. 'abc123 (fleets 0-8); def456 (fleets 9-20)'")
    p.add_argument("--publish", action="store_true", help="write benchmarks/published/mixed_pools.json and its docs/results.md section")
    return run_study(p.parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
