"""Known answers of the exact allocators on the shipped H100 grid.

Every expected value below is derived by hand from examples/h100_31b_fp8/grid.csv
(capacities c in req/s per replica). Admissible cells (chat: success ≥ 0.99,
TTFT ≤ 2 s, completion ≤ 30 s; code: success ≥ 0.99, TTFT ≤ 5 s):

    chat  TP2@C16 1.596 | TP4@C32 3.198, C64 4.996, C96 6.596 (C128: completion 46.4 ✗)
          TP8@C32 3.199, C64 4.998, C96 6.598, C128 11.264
          (TP2@C32: TTFT 2.9 ✗, TP2@C64 ✗)
    code  TP2@C8 0.6, C16 1.12 | TP4@C32 2.399, C64 5.995, C96 11.116 (C128: TTFT 7.9 ✗)
          TP8@C64 5.998, C96 11.136 (C128: success 0.97 ✗) (TP2@C32/C64 ✗)

Both allocators (MILP and JAX) must give these; the same cases are run for
JAX in test_allocation_jax.py via ``KNOWN_CASES``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleetsieve_bayes.allocation.milp import allocate_milp, pareto_cells
from fleetsieve_bayes.allocation.problem import (
    AllocationProblem,
    CellGrid,
    admissible,
    allocation_to_json,
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.table import read_table

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h100_31b_fp8" / "campaign.toml"

# (id, demand scale, gpus, TP restriction, critical floors {class: δ},
#  expected {class: (tp, load, replicas)} or None if infeasible,
#  min fulfillment, goodput, gpus used)
KNOWN_CASES = [
    # 1.0× (chat 12, code 16), 16 GPUs. Chat ≥ 12 needs 8 GPUs: at 4 GPUs the best
    # is TP4@C96 6.596; at 8, TP4@C96×2 = 13.192 (TP8@C128 11.264 < 12). Code ≥ 16
    # needs 8: at 4 the best is TP4@C96 11.116; at 8, TP4@C96×2 = 22.232 (TP8@C96
    # 11.136, TP4@C64×2 11.99 < 16). 8 + 8 = 16 → both fully served, 28 req/s.
    ("1.0x", 1.0, 16, None, {}, {"chat": (4, "C96", 2), "code": (4, "C96", 2)}, 1.0, 28.0, 16),
    # 0.7× (chat 8.4, code 11.2). Chat at 4 GPUs ≤ 6.596 < 8.4, code at 4 GPUs ≤
    # 11.116 < 11.2, so full service needs 8 + 8. At 8 GPUs the lowest-index cell
    # serving all of chat is TP4@C64×2 = 9.992 (TP2@C16×4 6.384, TP4@C32×2 6.396
    # fall short); for code TP4@C64×2 = 11.99 (TP2×4 ≤ 4.48, TP4@C32×2 4.798).
    ("0.7x", 0.7, 16, None, {}, {"chat": (4, "C64", 2), "code": (4, "C64", 2)}, 1.0, 19.6, 16),
    # 1.3× (chat 15.6, code 20.8). Splits of 16 GPUs: 8/8 → chat 13.192/15.6 =
    # 0.845641, code 22.232 ≥ 20.8 → 1; 12/4 → code 11.116/20.8 = 0.534; 6/10 →
    # chat TP4@C96×1 6.596/15.6 = 0.423; 4/12 → 0.423. Best min is 8/8; goodput
    # 13.192 + 20.8 = 33.992.
    (
        "1.3x",
        1.3,
        16,
        None,
        {},
        {"chat": (4, "C96", 2), "code": (4, "C96", 2)},
        13.192 / 15.6,
        33.992,
        16,
    ),
    # TP8 only, 1.0×: best chat TP8 cell C128 11.264, best code TP8 cell C96
    # 11.136 (C128 success 0.97 ✗). 16 GPUs = two TP8 replicas; 1+1 gives
    # min(11.264/12, 11.136/16) = 0.696, 2+0 or 0+2 gives 0. Goodput 22.4.
    (
        "tp8-only",
        1.0,
        16,
        8,
        {},
        {"chat": (8, "C128", 1), "code": (8, "C96", 1)},
        0.696,
        22.4,
        16,
    ),
    # TP2 only, 1.0×: chat TP2@C16 1.596 per replica (r = 0.133 a), code TP2@C16
    # 1.12 (r = 0.07 b), a + b ≤ 8. a=2,b=6 → 0.266; a=3,b=5 → min(0.399, 0.35) =
    # 0.35; a=4,b=4 → 0.28. So 3 + 5, goodput 4.788 + 5.6 = 10.388.
    (
        "tp2-only",
        1.0,
        16,
        2,
        {},
        {"chat": (2, "C16", 3), "code": (2, "C16", 5)},
        0.35,
        10.388,
        16,
    ),
    # 8 GPUs, no floors: 4/4 → chat TP4@C96 6.596/12 = 0.549667, code TP4@C96
    # 11.116/16 = 0.69475; 2/6 → chat 1.596/12 = 0.133; 6/2 → code 1.12/16 =
    # 0.07; 8/0, 0/8 → 0. Goodput 6.596 + 11.116 = 17.712.
    (
        "8gpu",
        1.0,
        8,
        None,
        {},
        {"chat": (4, "C96", 1), "code": (4, "C96", 1)},
        6.596 / 12,
        17.712,
        8,
    ),
    # 8 GPUs, code critical with floor 1.0: code ≥ 16 needs all 8 GPUs
    # (TP4@C96×2), chat gets nothing → min fulfillment 0, goodput 16.
    (
        "8gpu-code-critical",
        1.0,
        8,
        None,
        {"code": 1.0},
        {"chat": None, "code": (4, "C96", 2)},
        0.0,
        16.0,
        8,
    ),
    # 8 GPUs, both critical at 1.0: 8 + 8 GPUs needed > 8 → infeasible.
    ("8gpu-both-critical", 1.0, 8, None, {"chat": 1.0, "code": 1.0}, None, 0.0, 0.0, 0),
    # 16 GPUs, chat critical at 0.9 and code at 1.0 while 1.3× demand: chat needs
    # 13.192 < 0.9·15.6 = 14.04 at 8 GPUs → 12 GPUs; code needs 20.8 → 8 GPUs;
    # 20 > 16 → infeasible.
    ("1.3x-critical", 1.3, 16, None, {"chat": 0.9, "code": 1.0}, None, 0.0, 0.0, 0),
]


def build_case(case: tuple) -> tuple:
    """(grid, values, problem) of one KNOWN_CASES entry."""
    _, scale, gpus, tp_only, floors, *_ = case
    campaign = load_campaign(EXAMPLE)
    df = read_table(campaign.measurement.table)
    if tp_only is not None:
        df = df[df["tp"] == tp_only].reset_index(drop=True)
    grid = grid_from_table(df, campaign.workload_names)
    values = values_from_table(grid, df)
    problem = campaign.problem(demand_scale=scale)
    critical = np.array([w in floors for w in grid.workloads])
    floor = np.array([floors.get(w, 1.0) for w in grid.workloads])
    problem = problem._replace(gpus=gpus, critical=critical, floor=floor)
    return grid, values, problem


def check_known(alloc, grid, case: tuple) -> None:
    *_, expected, min_f, goodput, gpus_used = case
    if expected is None:
        assert alloc.status == "infeasible"
        assert allocation_to_json(alloc, grid) is None
        assert (alloc.cell == -1).all() and (alloc.replicas == 0).all()
        return
    assert alloc.status == "feasible"
    got = allocation_to_json(alloc, grid)
    want = {
        w: (
            {"tp": None, "load": None, "replicas": 0}
            if e is None
            else dict(zip(("tp", "load", "replicas"), e, strict=True))
        )
        for w, e in expected.items()
    }
    assert got == want
    assert alloc.min_fulfillment == pytest.approx(min_f, abs=1e-9)
    assert alloc.goodput_rps == pytest.approx(goodput, abs=1e-9)
    assert alloc.gpus_used == gpus_used


@pytest.mark.parametrize("case", KNOWN_CASES, ids=[c[0] for c in KNOWN_CASES])
def test_milp_known_answers(case: tuple) -> None:
    grid, values, problem = build_case(case)
    check_known(allocate_milp(grid, values, problem), grid, case)


@pytest.mark.parametrize("case", KNOWN_CASES[:4], ids=[c[0] for c in KNOWN_CASES[:4]])
def test_milp_unpruned_agrees(case: tuple) -> None:
    """Pareto pruning is an exact reduction: the full model gives the same answer."""
    grid, values, problem = build_case(case)
    check_known(allocate_milp(grid, values, problem, prune=False), grid, case)


def test_capacity_only_choice_is_rejected() -> None:
    """Chat TP4@C128 has the highest TP4 capacity (11.27) but a 46.4 s completion p99."""
    grid, values, problem = build_case(KNOWN_CASES[0])
    adm = admissible(grid, values, problem)
    c128 = grid.index()[("chat", 4, "C128")]
    assert not adm[c128]
    front = pareto_cells(grid, values, adm, problem.gpus)
    # Chat front: TP2@C16 (1.596) < TP4@C96 (6.596) < TP8@C128 (11.264).
    assert [grid.describe(q) for q in front[0]] == ["chat TP2@C16", "chat TP4@C96", "chat TP8@C128"]
    # Code front: TP2@C16 (1.12) < TP4@C96 (11.116) < TP8@C96 (11.136).
    assert [grid.describe(q) for q in front[1]] == ["code TP2@C16", "code TP4@C96", "code TP8@C96"]


def test_milp_no_admissible_cell_for_a_class() -> None:
    """A class with no admissible cell is served 0; the other still gets the minimum GPUs."""
    grid, values, problem = build_case(KNOWN_CASES[0])
    problem = problem._replace(success_min=np.array([1.01, 0.99]))  # chat: nothing admissible
    alloc = allocate_milp(grid, values, problem)
    assert alloc.status == "feasible"
    assert alloc.min_fulfillment == 0.0
    # Goodput is maximised first (code fully served: 16), then GPUs minimised (8).
    assert alloc.goodput_rps == pytest.approx(16.0)
    assert alloc.gpus_used == 8
    assert alloc.cell[0] == -1


def test_cbc_bound_tightening_regression() -> None:
    """A feasible instance that CBC builds from mip ≥ 1.16 ("cbcbox") declare infeasible.

    Class 0 (45.849 req/s) has TP1/2/4 cells, class 1 (6.734 req/s) one TP8
    cell, 32 GPUs. By hand: class 1 gets one TP8 replica (4.35523 req/s, r =
    0.64675) and class 0 the other 24 GPUs as 24 TP1 replicas (37.64424 req/s,
    r = 0.82105); two TP8 replicas for class 1 would leave 16 GPUs and r₀ =
    0.5474. So min fulfillment 0.6467523, goodput 41.99947, 32 GPUs.
    """
    grid = CellGrid(
        workloads=("a", "b"),
        workload_idx=np.array([0, 0, 0, 1]),
        tp=np.array([1, 2, 4, 8]),
        load=("L", "L", "L", "L"),
        offered_rps=np.full(4, 50.0),
        duration_s=np.full(4, 300.0),
    )
    values = np.array(
        [[1.56851, 1, 1, 1.0], [1.60834, 1, 1, 1.0], [2.06186, 1, 1, 1.0], [4.35523, 1, 1, 1.0]]
    )
    problem = AllocationProblem(
        demand=np.array([45.849, 6.734]),
        critical=np.array([False, False]),
        floor=np.ones(2),
        success_min=np.full(2, 0.99),
        ttft_max=np.full(2, np.inf),
        completion_max=np.full(2, np.inf),
        gpus=32,
    )
    a = allocate_milp(grid, values, problem)
    assert a.feasible
    assert a.min_fulfillment == pytest.approx(4.35523 / 6.734)
    assert a.goodput_rps == pytest.approx(24 * 1.56851 + 4.35523)
    assert a.gpus_used == 32
    assert list(a.replicas) == [24, 1] and list(a.cell) == [0, 3]
