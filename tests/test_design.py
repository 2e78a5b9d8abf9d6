"""The initial design: one probe per (class, TP); over several pools, spread over the GPU types."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid, grid_from_table
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.table import read_table

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pools"
H100, A100 = "h100-sxm-80gb", "a100-80gb"


def _per_class_tp(grid: CellGrid) -> list[int]:
    """The single-type rule, written out: the lower-median offered load of every (class, TP)."""
    out = []
    for w in range(grid.n_classes):
        for tp in sorted(set(grid.tp[grid.workload_idx == w].tolist())):
            idx = [i for i in range(grid.n_cells) if grid.workload_idx[i] == w and grid.tp[i] == tp]
            idx.sort(key=lambda i: (grid.offered_rps[i], i))
            out.append(idx[(len(idx) - 1) // 2])
    return out


def test_one_pool_is_one_probe_per_class_and_tp_at_the_median_load() -> None:
    from shipped import load_point

    campaign = load_point()
    grid = grid_from_table(read_table(campaign.measurement.table), campaign.workload_names)
    design = initial_design(grid)
    assert design == _per_class_tp(grid)
    assert [grid.describe(i) for i in design] == [
        "chat TP2@C32", "chat TP4@C64", "chat TP8@C64", "code TP2@C16", "code TP4@C64", "code TP8@C96",
    ]


def test_two_pools_rotate_the_tps_over_the_types_class_by_class() -> None:
    campaign = load_campaign(FIXTURE / "campaign.toml")
    grid = grid_from_table(read_table(FIXTURE / "grid.csv"), campaign.workload_names, pools=(H100, A100))
    design = initial_design(grid)
    # class 0 starts on the first type, class 1 one type further on; one probe per (class, TP)
    assert [(grid.key(i)[0], grid.key(i)[1], grid.key(i)[3]) for i in design] == [
        ("chat", 2, H100), ("chat", 4, A100), ("chat", 8, H100),
        ("code", 2, A100), ("code", 4, H100), ("code", 8, A100),
    ]
    # each probe is its (class, TP, type)'s lower-median load
    for i in design:
        same = (grid.workload_idx == grid.workload_idx[i]) & (grid.tp == grid.tp[i]) & (grid.gpu_idx == grid.gpu_idx[i])
        loads = np.sort(grid.offered_rps[same])
        assert grid.offered_rps[i] == loads[(len(loads) - 1) // 2]


def _grid(cells: list[tuple[int, int, int, float]], pools: tuple[str, ...]) -> CellGrid:
    """A grid from ``(class, tp, pool, offered)`` rows, in the grid's order."""
    cells = sorted(cells)
    return CellGrid(
        workloads=tuple(f"w{w}" for w in sorted({c[0] for c in cells})),
        workload_idx=np.array([c[0] for c in cells], np.int64),
        tp=np.array([c[1] for c in cells], np.int64),
        load=tuple(f"C{int(c[3])}" for c in cells),
        offered_rps=np.array([c[3] for c in cells], np.float64),
        duration_s=np.full(len(cells), 300.0),
        gpu=np.array([c[2] for c in cells], np.int64),
        pools=pools,
    )


def test_more_types_than_tps_gives_every_type_a_probe() -> None:
    rows = [(0, tp, g, load) for tp in (2, 4) for g in range(3) for load in (1.0, 2.0, 3.0)]
    grid = _grid(rows, ("a", "b", "c"))
    design = initial_design(grid)
    got = [(int(grid.tp[i]), int(grid.gpu_idx[i]), float(grid.offered_rps[i])) for i in design]
    # TP 2 on a, TP 4 on b, then c (left without a probe) at the middle TP, the lower one of two
    assert got == [(2, 0, 2.0), (4, 1, 2.0), (2, 2, 2.0)]


def test_a_tp_a_type_lacks_goes_to_the_next_type_in_the_rotation() -> None:
    rows = [(0, 1, 0, 1.0), (0, 2, 0, 1.0), (0, 2, 1, 1.0), (0, 4, 0, 1.0), (0, 4, 1, 1.0)]
    grid = _grid(rows, ("a", "b"))
    got = [(int(grid.tp[i]), int(grid.gpu_idx[i])) for i in initial_design(grid)]
    # TP 1 on a, TP 2 on b, TP 4 on a: b is probed, nothing is added
    assert got == [(1, 0), (2, 1), (4, 0)]
    rows = [(0, 1, 0, 1.0), (0, 2, 0, 1.0), (0, 4, 0, 1.0), (0, 4, 1, 1.0)]
    grid = _grid(rows, ("a", "b"))
    got = [(int(grid.tp[i]), int(grid.gpu_idx[i])) for i in initial_design(grid)]
    # TP 2 would be b's, which lacks it: a takes it; b gets its probe at its one TP
    assert got == [(1, 0), (2, 0), (4, 0), (4, 1)]
