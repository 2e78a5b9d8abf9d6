"""What an uncertified campaign should answer: each rule judged on the same finished campaigns.

A campaign at an attainment level that ends ``undecided`` or ``exhausted`` answers
on a table where a measured cell is admitted when the posterior probability that
its attainment reaches its level is at least a confidence c
(``[stopping] uncertified_answer``; :func:`fleetsieve_bayes.decision.bounds.best_estimate_table`).
This study takes the finished campaign directories of the noisy suite (kept by
``profiling_cost.py --noisy N --workdir DIR``, one ``nKKK`` folder per fleet),
rebuilds each uncertified campaign's final posterior from its ``posterior.nc``
and journal (no refit), and solves the answer again under every rule: c from 0.5
(``"best-estimate"``) to 0.95, ``"credible"`` (c by level,
:data:`fleetsieve_bayes.settings.ANSWER_CONFIDENCE`) and ``"conservative"``
(attainment lower bounds). Each answer is judged on the fleet's truth at the
campaign's level as the noisy suite judges a decision: correct (every committed
cell's true attainment reaches the level and the fleet is ε-correct against
the optimum of the truth) and SLOs met (every committed cell's true attainment
reaches the level). The answer the campaign recorded is scored beside, so that
the rebuilt posterior can be seen to give the campaign's own answer.

    python benchmarks/answer_rules.py DIR/n003 DIR/n004 ... --publish

Prints a markdown table and writes JSON (default benchmarks/results/answer_rules.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from publish import command_line, machine, publish  # noqa: E402

import fleetsieve_bayes as fsb  # noqa: E402
from fleetsieve_bayes.allocation.milp import allocate_milp  # noqa: E402
from fleetsieve_bayes.allocation.problem import allocation_to_json  # noqa: E402
from fleetsieve_bayes.campaign.journal import MeasurementRecord, read_records  # noqa: E402
from fleetsieve_bayes.decision.batch import believe  # noqa: E402
from fleetsieve_bayes.decision.bounds import answer_confidence, best_estimate_table, slo_levels  # noqa: E402
from fleetsieve_bayes.evaluation.attainment import noisy_fleet, score_decision  # noqa: E402
from fleetsieve_bayes.evaluation.noisy import cells_from_json, noisy_suite_fleet  # noqa: E402
from fleetsieve_bayes.evaluation.synthetic import write_synthetic  # noqa: E402
from fleetsieve_bayes.model.inference import Posterior  # noqa: E402
from fleetsieve_bayes.model.joint import model_data  # noqa: E402
from fleetsieve_bayes.model.storage import load_idata  # noqa: E402
from fleetsieve_bayes.round import observe, probable_answer, window_inputs  # noqa: E402

DEFAULT_OUT = REPO / "benchmarks" / "results" / "answer_rules.json"
CONFIDENCES = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
RULES = (*(f"c={c:g}" for c in CONFIDENCES), "credible", "probable", "conservative", "recorded")


def final_posterior(state: Any, run: Path) -> Posterior:
    """The campaign's last posterior, from ``run/posterior.nc`` and the windows of its journal."""
    idata = load_idata(run / "posterior.nc")
    post = idata.posterior

    def flat(name: str) -> np.ndarray:
        a = np.asarray(post[name].values, np.float64)
        return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])

    rows, row_cell = window_inputs(state)
    data = model_data(state.grid, state.observed, state.measured, server_failed=state.server_failed,
                      rows=rows, row_cell=row_cell)
    return Posterior(latent=flat("latent"), noise=flat("noise"), params={}, idata=idata,
                     window=flat("window"), windows=data.windows)


def judge(d: Path, suite_seed: int, windows: int) -> dict[str, Any] | None:
    """One fleet's row: each rule's ``{correct, slo_ok}`` (None: certified, nothing to judge)."""
    run = d / "run"
    result = json.loads((run / "result.json").read_text())
    if str(result["status"]).startswith("certified"):
        return None
    k = int(d.name.lstrip("n"))
    camp = fsb.load_campaign(d / "campaign.toml")
    settings = fsb.DecisionSettings.from_campaign(camp)
    state = fsb.init(camp, seed=0)
    levels = slo_levels(state.grid, settings.slo_attainment)
    if levels is None:
        raise SystemExit(f"{d}: campaign.toml is at 'point', not at an attainment level")
    level = float(np.max(levels))
    recs, _ = read_records(run / "journal.jsonl")
    state = observe(state, [r for r in recs if isinstance(r, MeasurementRecord)])
    g, pb = state.grid, state.problem
    post = final_posterior(state, run)
    view = believe(g, pb, post, state.measured, state.observed, [], settings,
                   allocate=lambda v: allocate_milp(g, v, pb))
    assert view.attainment is not None
    _, table, cfg = noisy_suite_fleet(suite_seed, k, windows=windows, level=level,
                                      max_windows=int(settings.max_windows_per_cell))
    with tempfile.TemporaryDirectory() as tmp:
        fleet = noisy_fleet(table, write_synthetic(Path(tmp), table, cfg).workload_names)

    def score(alloc_json: dict[str, Any] | None) -> dict[str, bool]:
        cr = cells_from_json(fleet.grid, alloc_json)
        cell, reps = cr if cr is not None else (None, None)
        sc = score_decision(fleet, pb, cell, reps, level, camp.epsilon, certified=False)
        return {"correct": bool(sc["correct"]), "slo_ok": bool(sc["slo_ok"])}

    def answer(conf: np.ndarray) -> dict[str, bool]:
        al = allocate_milp(g, best_estimate_table(g, pb, view.bounds, view.attainment, state.measured, levels, conf), pb)
        return score(allocation_to_json(al, g) if al.feasible else None)

    row: dict[str, Any] = {"fleet": k, "level": level, "status": result["status"], "classes": len(camp.workloads),
                           "recorded_answer": result.get("answer")}
    for c in CONFIDENCES:
        row[f"c={c:g}"] = answer(np.full(g.n_cells, c))
    credible = answer_confidence("credible", levels)
    assert credible is not None
    row["credible"] = answer(credible)
    row["credible_confidence"] = float(np.max(credible))
    cons = view.conservative
    row["conservative"] = score(allocation_to_json(cons, g) if cons.feasible else None)
    best, choice = probable_answer(state, settings, view, post, lambda v: allocate_milp(g, v, pb))
    row["probable"] = score(allocation_to_json(best, g) if best.feasible else None)
    row["probable_choice"] = choice
    row["recorded"] = score(result.get("allocation"))
    return row


def table_md(rows: list[dict[str, Any]], rules: tuple[str, ...] | list[str] = RULES) -> str:
    levels = sorted({r["level"] for r in rows})
    out = ["| level | uncertified fleets | " + " | ".join(f"`{r}`" for r in rules) + " |",
           "|---|---|" + "---|" * len(rules)]
    for q in levels:
        sel = [r for r in rows if r["level"] == q]
        cells = [f"{sum(r[k]['correct'] for r in sel)} / {sum(r[k]['slo_ok'] for r in sel)}" for k in rules]
        out.append(f"| {q:g} | {len(sel)} | " + " | ".join(cells) + " |")
    conf = ", ".join(f"{q:g}: c = {next(r['credible_confidence'] for r in rows if r['level'] == q):g}" for q in levels)
    out.append("")
    out.append(f"Each entry: answers correct at the level / answers whose committed cells all meet the level, "
               f"of the uncertified fleets. `credible` at level {conf}. `recorded`: the answer the campaign "
               f"wrote (its own rule at the time), judged the same way.")
    if "probable" in rules:
        picks = {q: [str(r["probable_choice"]["candidate"]) for r in rows if r["level"] == q] for q in levels}
        said = "; ".join(f"level {q:g}: " + ", ".join(f"{n} × {k}" for k, n in
                                                      sorted(Counter(picks[q]).items())) for q in levels)
        out.append("")
        out.append(f"`probable`: of the conservative answer and those at each c, the one the fleet's posterior "
                   f"finds most likely ε-optimal at the level (the joint check's probability); its picks, {said}.")
    return "\n".join(out)


def published_table(payload: dict[str, Any]) -> str:
    """The docs/results.md table of a published run (benchmarks/publish.py renders it)."""
    return table_md(payload["rows"], payload.get("rules", RULES))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+", type=Path, help="finished noisy-suite campaign directories (nKKK)")
    p.add_argument("--suite-seed", type=int, default=0, help="the noisy suite's seed (profiling_cost.py --suite-seed)")
    p.add_argument("--windows", type=int, default=5, help="replicate rows per cell (profiling_cost.py --windows)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--publish", action="store_true", help="write benchmarks/published/answer_rules.json and its docs section")
    args = p.parse_args(argv)
    rows = []
    for i, d in enumerate(args.dirs, 1):
        row = judge(d, args.suite_seed, args.windows)
        print(f"[{i}/{len(args.dirs)}] {d.name}: " + ("certified, skipped" if row is None else
              " ".join(f"{k} {int(row[k]['correct'])}{int(row[k]['slo_ok'])}" for k in RULES) + f" probable {row['probable_choice']['candidate']}"), flush=True)
        if row is not None:
            rows.append(row)
    res = {"rows": rows, "rules": list(RULES), "machine": machine()}
    md = published_table(res)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    if args.publish:
        publish("answer_rules", res, md, command_line(__file__, [*(str(d) for d in args.dirs)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
