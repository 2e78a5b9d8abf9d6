"""Regret on the true table, regret AUC and the hindsight floor, on a tiny hand-made table.

Table (8 GPUs, TTFT p99 ≤ 2 s, success ≥ 0.99; every cell 100 s):

    a TP2 L0  thr 1.0   ok          a TP2 L1  thr 2.0  ok
    a TP4 L0  thr 3.0   ok          a TP4 L1  thr 5.0  TTFT 3 s (violates)
    b TP2 L1  thr 1.5   ok          b TP4 L1  thr 4.0  ok

Demand a = 4, b = 3 (Σλ = 7). Optimum: a 2×TP2@L1 (4 GPUs, serves 4) and b
one 4-GPU choice serving 3: min fulfillment 1, goodput 7.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fleetsieve_bayes.allocation.problem import (
    AllocationProblem,
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.evaluation.regret import (
    cells_from_json,
    curve_at,
    eps_correct,
    evaluate_cells,
    evaluate_run,
    make_oracle,
    regret,
    regret_auc,
    regret_curve,
    scalar_regret,
)

ROWS = [
    # workload, tp, load, offered, thr, ttft, comp, success
    ("a", 2, "L0", 1.0, 1.0, 0.5, 5.0, 1.0),
    ("a", 2, "L1", 2.0, 2.0, 1.0, 5.0, 1.0),
    ("a", 4, "L0", 1.0, 3.0, 0.5, 5.0, 1.0),
    ("a", 4, "L1", 2.0, 5.0, 3.0, 5.0, 1.0),
    ("b", 2, "L1", 1.5, 1.5, 1.0, 5.0, 1.0),
    ("b", 4, "L1", 1.5, 4.0, 1.0, 5.0, 1.0),
]


def _table() -> pd.DataFrame:
    cols = ["workload", "tp", "load", "offered_rps", "throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate"]
    df = pd.DataFrame(ROWS, columns=cols)
    df["duration_s"] = 100.0
    return df


def _problem(demand_a: float = 4.0, *, critical_a: bool = False, floor_a: float = 1.0) -> AllocationProblem:
    return AllocationProblem(
        demand=np.array([demand_a, 3.0]),
        critical=np.array([critical_a, False]),
        floor=np.array([floor_a, 1.0]),
        success_min=np.array([0.99, 0.99]),
        ttft_max=np.array([2.0, 2.0]),
        completion_max=np.array([np.inf, np.inf]),
        gpus=8,
    )


@pytest.fixture(scope="module")
def setup():
    df = _table()
    grid = grid_from_table(df, ("a", "b"))
    values = values_from_table(grid, df)
    return grid, values, grid.index()


def test_oracle_and_hindsight_floor(setup) -> None:
    grid, values, idx = setup
    problem = _problem()
    o = make_oracle(grid, values, problem)
    assert o.allocation.feasible
    assert o.outcome.min_fulfillment == pytest.approx(1.0)
    assert o.outcome.goodput_rps == pytest.approx(7.0)
    assert o.full_gpu_s == pytest.approx(2 * 200 + 2 * 400 + 200 + 400)
    # a: cell a TP2@L1 with 2 replicas (the only way to serve 4 with 4 GPUs).
    assert int(o.allocation.cell[0]) == idx[("a", 2, "L1")]
    # Design = a TP2@L0, a TP4@L0, b TP2@L1, b TP4@L1 (1200); plus a TP2@L1 (200).
    assert o.floor_gpu_s == pytest.approx(1400.0)
    # Random after the design: a TP2@L1 (200) always; the one other cell, a TP4@L1
    # (400), comes before it half of the time.
    assert o.random_floor_gpu_s == pytest.approx(1400.0 + 0.5 * 400.0)


def test_inadmissible_committed_cell_serves_nothing(setup) -> None:
    grid, values, idx = setup
    problem = _problem()
    o = make_oracle(grid, values, problem)
    cell = np.array([idx[("a", 4, "L1")], idx[("b", 4, "L1")]])
    out = evaluate_cells(grid, values, problem, cell, np.array([1, 1]))
    assert out.violations == (idx[("a", 4, "L1")],)
    np.testing.assert_allclose(out.served, [0.0, 3.0])
    r = regret(out, o, problem)
    assert r.critical == 0.0
    assert r.min_fulfillment == pytest.approx(1.0)
    assert r.goodput == pytest.approx(4.0 / 7.0)
    assert scalar_regret(r) == pytest.approx(1.0 + 4.0 / 7.0)
    assert not eps_correct(r, 0.05)


def test_suboptimal_allocation_regret_and_critical(setup) -> None:
    grid, values, idx = setup
    cell = np.array([idx[("a", 4, "L0")], idx[("b", 2, "L1")]])
    reps = np.array([1, 2])
    problem = _problem()
    o = make_oracle(grid, values, problem)
    out = evaluate_cells(grid, values, problem, cell, reps)
    np.testing.assert_allclose(out.served, [3.0, 3.0])
    r = regret(out, o, problem)
    assert (r.critical, r.min_fulfillment, r.goodput) == pytest.approx((0.0, 0.25, 1.0 / 7.0))
    assert eps_correct(r, 0.3) and not eps_correct(r, 0.2)
    # With a critical floor 0.8 on a, the same fleet (r_a = 0.75) misses the floor.
    crit = _problem(critical_a=True, floor_a=0.8)
    oc = make_oracle(grid, values, crit)
    rc = regret(evaluate_cells(grid, values, crit, cell, reps), oc, crit)
    assert rc.critical == 1.0
    assert scalar_regret(rc) == pytest.approx(10.0 + 0.25 + 1.0 / 7.0)


def test_truly_infeasible_campaign(setup) -> None:
    grid, values, idx = setup
    problem = _problem(20.0, critical_a=True, floor_a=1.0)  # a needs 20 req/s; 8 GPUs serve ≤ 8
    o = make_oracle(grid, values, problem)
    assert not o.allocation.feasible
    assert o.floor_gpu_s == pytest.approx(1200.0)  # the design only
    assert o.random_floor_gpu_s == pytest.approx(1200.0)
    none = regret(evaluate_cells(grid, values, problem, None, None), o, problem)
    assert none == (0.0, 0.0, 0.0)
    cell = np.array([idx[("a", 2, "L1")], idx[("b", 4, "L1")]])
    claim = regret(evaluate_cells(grid, values, problem, cell, np.array([2, 1])), o, problem)
    assert claim.critical == 1.0


def test_cells_from_json(setup) -> None:
    grid, _, idx = setup
    cr = cells_from_json(grid, {"a": {"tp": 2, "load": "L1", "replicas": 2}, "b": {"tp": None, "load": None, "replicas": 0}})
    assert cr is not None
    np.testing.assert_array_equal(cr[0], [idx[("a", 2, "L1")], -1])
    np.testing.assert_array_equal(cr[1], [2, 0])
    assert cells_from_json(grid, None) is None


def _round(no: int, spent: float, alloc: dict | None) -> dict:
    from fleetsieve_bayes.campaign.journal import RoundRecord, Side

    side = Side(alloc, {"feasible": alloc is not None})
    return RoundRecord(
        round=no, certificate="undecided", outcome="measure", reason="", gap={}, conservative=side,
        optimistic=side, measured_cells=0, candidates=0, gpu_seconds=spent, chosen=None, timings={},
    ).to_json()


def test_regret_curve_auc_and_run(setup) -> None:
    grid, values, _ = setup
    problem = _problem()
    o = make_oracle(grid, values, problem)
    sub = {"a": {"tp": 4, "load": "L0", "replicas": 1}, "b": {"tp": 2, "load": "L1", "replicas": 2}}
    best = {"a": {"tp": 2, "load": "L1", "replicas": 2}, "b": {"tp": 4, "load": "L1", "replicas": 1}}
    records = [
        {"type": "measurement"},
        _round(1, 600.0, None),
        {"type": "measurement"},
        _round(2, 1000.0, sub),
        _round(3, 1200.0, sub),  # the final allocation replaces the last round's
    ]
    spent, reg = regret_curve(grid, values, problem, o, records, best)
    np.testing.assert_allclose(spent, [0.0, 600.0, 1000.0, 1200.0])
    x = 0.25 + 1.0 / 7.0
    np.testing.assert_allclose(reg, [2.0, 2.0, x, 0.0])
    np.testing.assert_allclose(curve_at(spent, reg, np.array([0.0, 599.0, 1000.0, 5000.0])), [2.0, 2.0, x, 0.0])
    auc = regret_auc(spent, reg, o.full_gpu_s)
    assert auc == pytest.approx((1000.0 * 2.0 + 200.0 * x) / 1800.0)
    result = {"status": "certified-feasible", "gpu_seconds": 1400.0, "measured": [{}] * 5, "allocation": best}
    ev = evaluate_run(grid, values, problem, o, result, records, 0.05)
    assert ev["zero_regret"] and ev["eps_correct"] and not ev["false_certificate"]
    assert ev["floor_ratio"] == pytest.approx(1.0)
    assert math.isclose(ev["regret_auc"], auc)
