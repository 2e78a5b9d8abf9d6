"""Scale-free allocation: any demand scale from 1e-6 to 1e9 req/s gives the brute-force optimum.

The oracle enumerates every (cell, replicas) choice of every class and applies
the lexicographic objective with the same relative tolerance
(:func:`fleetsieve_bayes.allocation.objective.within`). Capacities and base
demands sit on a coarse grid, so distinct stage values differ by far more
than the tolerance; only the common demand scale is a free float.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.allocation.batched import allocate_jax
from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.objective import DEFAULT_TOL, within
from fleetsieve_bayes.allocation.problem import (
    AllocationProblem,
    CellGrid,
    admissible,
    check_demand,
)
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir

EXAMPLE = data_dir("examples") / "h100_31b_fp8" / "campaign.toml"
TPS = (1, 2, 4)
LOADS = ("L1", "L2")


@st.composite
def instances(draw):
    k = draw(st.integers(1, 3))
    n = k * len(TPS) * len(LOADS)
    grid = CellGrid(
        workloads=tuple(f"w{i}" for i in range(k)),
        workload_idx=np.repeat(np.arange(k), len(TPS) * len(LOADS)),
        tp=np.tile(np.repeat(TPS, len(LOADS)), k),
        load=LOADS * (k * len(TPS)),
        offered_rps=np.tile([1.0, 2.0], k * len(TPS)),
        duration_s=np.full(n, 100.0),
    )
    values = np.empty((n, 4))
    values[:, 0] = np.array(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))) * 0.25
    values[:, 1] = draw(st.lists(st.sampled_from([0.5, 3.0]), min_size=n, max_size=n))
    values[:, 2] = 10.0
    values[:, 3] = draw(st.lists(st.sampled_from([0.98, 0.995, 1.0]), min_size=n, max_size=n))
    base = np.array(draw(st.lists(st.integers(1, 40), min_size=k, max_size=k))) * 0.5
    exponent = draw(st.floats(-6.0, 9.0, allow_nan=False))
    critical = np.array(draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    floor = np.array(draw(st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=k, max_size=k)))
    problem = AllocationProblem(
        demand=base * 10.0**exponent,
        critical=critical,
        floor=floor,
        success_min=np.full(k, 0.99),
        ttft_max=np.full(k, 2.0),
        completion_max=np.full(k, np.inf),
        gpus=draw(st.integers(1, 8)),
    )
    return grid, values, problem


def brute_force(grid: CellGrid, values: np.ndarray, problem: AllocationProblem, tol: float = DEFAULT_TOL):
    """``(feasible, min_fulfillment, goodput, gpus)`` of the lexicographic optimum, by enumeration."""
    adm = admissible(grid, values, problem)
    lam, gpus = problem.demand, problem.gpus
    options = []  # per class: (served, gpus) of every choice, "nothing" first
    for i in range(grid.n_classes):
        opts = [(0.0, 0)]
        for q in np.flatnonzero(adm & (grid.workload_idx == i)):
            tp = int(grid.tp[q])
            opts += [(min(lam[i], n * values[q, 0]), n * tp) for n in range(1, gpus // tp + 1)]
        options.append(np.array(opts))
    best = None
    combos = np.array(list(itertools.product(*[range(len(o)) for o in options])))
    served = np.stack([options[i][combos[:, i], 0] for i in range(grid.n_classes)], axis=1)
    used = np.sum([options[i][combos[:, i], 1] for i in range(grid.n_classes)], axis=0)
    r = served / lam
    ok = (used <= gpus) & np.all(~problem.critical | (r >= within(problem.floor, tol)), axis=1)
    if not ok.any():
        return (False, 0.0, 0.0, 0)
    t = r.min(axis=1)
    keep = ok & (t >= within(t[ok].max(), tol))
    g = served.sum(axis=1)
    keep &= g >= within(g[keep].max(), tol)
    best = np.flatnonzero(keep)[np.argmin(used[keep])]
    return (True, float(t[best]), float(g[best]), int(used[best]))


def _check(alloc, grid, values, problem) -> None:
    feasible, t, g, used = brute_force(grid, values, problem)
    scale = f"demand {problem.demand}"
    assert alloc.feasible == feasible, scale
    if feasible:
        assert alloc.min_fulfillment == pytest.approx(t, rel=1e-5, abs=0), scale
        assert alloc.goodput_rps == pytest.approx(g, rel=1e-5, abs=0), scale
        assert alloc.gpus_used == used, scale


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_milp_matches_brute_force_at_any_demand_scale(case):
    grid, values, problem = case
    _check(allocate_milp(grid, values, problem), grid, values, problem)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_jax_allocator_matches_brute_force_at_any_demand_scale(case):
    grid, values, problem = case
    _check(allocate_jax(grid, values, problem), grid, values, problem)


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 1e7, 1e8, 1e9])
def test_shipped_grid_at_extreme_demands_is_the_brute_force_optimum(scale):
    """The shipped example, where an absolute tolerance gives 0 GPUs at 1e8, 12/16 at 1e7 and drops chat at 1e-6."""
    from fleetsieve_bayes.allocation.problem import (
        grid_from_table,
        values_from_table,
    )
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.table import read_table

    campaign = load_campaign(EXAMPLE)
    df = read_table(campaign.measurement.table)
    grid = grid_from_table(df, campaign.workload_names)
    values = values_from_table(grid, df)
    problem = campaign.problem(demand_scale=scale)
    for alloc in (allocate_milp(grid, values, problem), allocate_jax(grid, values, problem)):
        _check(alloc, grid, values, problem)
        assert alloc.gpus_used > 0 and np.all(alloc.replicas > 0)


@pytest.mark.parametrize("demand", [1e300, np.inf, np.nan, 1e-300, 0.0])
def test_unusable_demand_is_refused_with_one_line(demand):
    with pytest.raises(InputError) as err:
        check_demand(np.array([12.0, demand]), ("chat", "code"), source="c.toml")
    msg = str(err.value)
    assert "\n" not in msg and "'code'" in msg and "c.toml" in msg


def test_cli_refuses_huge_demand_scale_with_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "fleetsieve_bayes.cli", "allocate", str(EXAMPLE), "--demand-scale", "1e300", "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "outside the range" in lines[0] and "'chat'" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_the_milp_writes_nothing_to_stdout_on_a_symmetric_instance(capfd):
    """CBC prints the orbits of a symmetric model from C ("Orbit 0:  0 2"), past its verbosity;
    this instance (4 classes x 16 cells, 5 GPUs) made it print before orbital branching was off."""
    import ctypes

    cap = [7, 6, 7.5, 5, .5, 5.5, 2.5, 4, 4.5, 1, 1.5, 2, 1.5, 7.5, 5.5, .5, 4.5, 8.5, 6, 7.5, 2, 3.5, 2.5, 2.5,
           3.5, 8, 4, 1, 8.5, 5, 7, 5.5, 5.5, 3, 4.5, 4, 7, 6.5, 4.5, 8, 3.5, 1, 2, .5, .5, .5, .5, .5, 4, 4, 2.5,
           7, 5.5, 8, 5, 1, 4.5, 8, 5.5, 7, 3.5, 2.5, 9.5, 9]
    fast = {3, 8, 12, 14, 16, 19, 21, 23, 27, 28, 29, 36, 37, 44, 45, 50, 57, 60}  # TTFT 0.5 s (else 3 s)
    ok = {0, 2, 4, 5, 9, 11, 12, 13, 14, 15, 18, 21, 22, 24, 26, 27, 29, 30, 33, 34, 35, 38, 39, 40, 42, 43, 44,
          45, 47, 49, 50, 51, 54, 55, 58, 59, 62}  # success 1.0 (else 0.98)
    tps, loads = (1, 2, 4, 8), ("a", "b", "c", "d")
    grid = CellGrid(workloads=("w0", "w1", "w2", "w3"), workload_idx=np.repeat(np.arange(4), 16),
                    tp=np.tile(np.repeat(tps, 4), 4), load=loads * 16,
                    offered_rps=np.tile([1.0, 2.0, 3.0, 4.0], 16), duration_s=np.full(64, 100.0))
    values = np.stack([cap, [0.5 if q in fast else 3.0 for q in range(64)], np.full(64, 10.0),
                       [1.0 if q in ok else 0.98 for q in range(64)]], axis=1)
    problem = AllocationProblem(demand=np.array([27.0, 36.0, 21.0, 38.0]), critical=np.zeros(4, bool),
                                floor=np.full(4, 0.5), success_min=np.full(4, 0.99), ttft_max=np.full(4, 2.0),
                                completion_max=np.full(4, np.inf), gpus=5)
    alloc = allocate_milp(grid, values, problem)
    ctypes.CDLL(None).fflush(None)  # C stdio buffers stdout when it is not a terminal
    assert capfd.readouterr().out == ""
    _check(alloc, grid, values, problem)
