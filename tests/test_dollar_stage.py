"""The certificate's dollar stage with several priced GPU pools."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_allocation_pools import GRID, PROBLEM, VALUES, pool_instances

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.milp_pools import cheapest_at_service
from fleetsieve_bayes.allocation.objective import DEFAULT_TOL, within
from fleetsieve_bayes.allocation.problem import admissible, within_cap
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    UNDECIDED,
    certify,
    dollar_gap,
)


def _cheapest_by_enumeration(grid, values, problem, t_min, g_min):
    """Least $/h over every (cell, replicas) choice per class serving ≥ t_min of each demand and ≥ g_min in all."""
    adm = admissible(grid, values, problem)
    lam = problem.demand
    counts = np.minimum(np.asarray(problem.pool_gpus, np.int64), problem.gpus)
    price = np.asarray(problem.usd_per_gpu_hour, np.float64)
    options = []
    for i in range(grid.n_classes):
        opts = [(0.0, 0, 0)]
        for q in np.flatnonzero(adm & (grid.workload_idx == i)):
            tp, p = int(grid.tp[q]), int(grid.gpu_idx[q])
            opts += [(min(lam[i], n * values[q, 0]), n * tp, p) for n in range(1, counts[p] // tp + 1)]
        options.append(opts)
    best = None
    floor = np.maximum(np.where(problem.critical, problem.floor, 0.0), t_min)
    for combo in itertools.product(*options):
        by_pool = np.zeros(grid.n_pools)
        for _, g, p in combo:
            by_pool[p] += g
        cost = float(by_pool @ price)
        served = np.array([c[0] for c in combo])
        if (
            np.all(by_pool <= counts) and by_pool.sum() <= problem.gpus
            and cost <= within_cap(problem.usd_per_hour_max, DEFAULT_TOL)
            and np.all(served / lam >= within(floor, DEFAULT_TOL))
            and served.sum() >= within(g_min, DEFAULT_TOL)
        ):
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_instances())
def test_cheapest_at_service_is_the_least_dollars_of_any_fleet_serving_as_much(inst) -> None:
    grid, values, problem = inst
    lex = allocate_milp(grid, values, problem)
    # at the lexicographic optimum's own service, and at half of it
    for scale in (1.0, 0.5):
        t, g = (lex.min_fulfillment * scale, lex.goodput_rps * scale) if lex.feasible else (0.0, 0.0)
        want = _cheapest_by_enumeration(grid, values, problem, t, g)
        got = cheapest_at_service(grid, values, problem, t, g)
        if want is None:
            assert got is None
            continue
        assert got is not None and got[0] == pytest.approx(want, abs=1e-9)
        if scale == 1.0 and lex.feasible:
            assert got[0] == pytest.approx(lex.usd_per_hour, abs=1e-9)  # stage 4 of the lexicographic order


def test_a_pessimistic_cheap_pool_holds_the_certificate_back_on_dollars() -> None:
    # code served in full either way: on the H100 (TP2 ×2, 16 $/h) or, if the A100
    # cell's capacity is as the optimistic table says, on A100 ×2 (8 $/h).
    cons_t, opt_t = VALUES.copy(), VALUES.copy()
    cons_t[3, 0], opt_t[3, 0] = 1.0, 3.0
    problem = PROBLEM._replace(pool_gpus=np.array([8, 4]))
    cons, opt = allocate_milp(GRID, cons_t, problem), allocate_milp(GRID, opt_t, problem)
    assert (cons.goodput_rps, opt.goodput_rps) == (16.0, 16.0)
    measured = np.array([True, True, True, False])
    base = certify(GRID, problem, cons, opt, measured, cons_t, 0.05)
    assert base.status == CERTIFIED_FEASIBLE and base.dollars is None  # no table, no dollar stage
    cert = certify(GRID, problem, cons, opt, measured, cons_t, 0.05, opt_t)
    assert cert.status == UNDECIDED
    assert cert.reason == "dollar gap above epsilon=0.05: 32.00 $/h against at least 24.00 $/h for the same service"
    assert cert.dollars == pytest.approx(0.25) and cert.unmeasured_committed == (3,)
    gap, floor, cells = dollar_gap(GRID, problem, cons, opt_t)
    assert (gap, floor, np.flatnonzero(cells).tolist()) == (pytest.approx(0.25), 24.0, [0, 3])
    # once the A100 cell is known to be as good, the stage closes
    closed = certify(GRID, problem, allocate_milp(GRID, opt_t, problem), opt, np.ones(4, bool), opt_t, 0.05, opt_t)
    assert closed.status == CERTIFIED_FEASIBLE and closed.dollars == 0.0


def test_one_pool_has_no_dollar_stage() -> None:
    one = GRID._replace(gpu=np.zeros(4, np.int64), pools=("h100-sxm-80gb",))
    problem = PROBLEM._replace(pool_gpus=np.array([16]), usd_per_gpu_hour=np.array([4.0]))
    cons = allocate_milp(one, VALUES, problem)
    assert dollar_gap(one, problem, cons, VALUES) is None


def _two_pool_grid() -> tuple:
    from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid

    # One class, cells 0–1 on pool 0 (h100, 4 $/h), cells 2–3 on pool 1 (a100, 1.8 $/h).
    grid = CellGrid(
        workloads=("chat",),
        workload_idx=np.zeros(4, np.int64),
        tp=np.array([2, 4, 2, 4], np.int64),
        load=("C8", "C8", "C8", "C8"),
        offered_rps=np.ones(4),
        duration_s=np.array([300.0, 300.0, 300.0, 300.0]),
        gpu=np.array([0, 0, 1, 1], np.int64),
        pools=("h100", "a100"),
    )
    problem = AllocationProblem(
        demand=np.array([1.0]), critical=np.array([False]), floor=np.array([0.0]),
        success_min=np.array([0.99]), ttft_max=np.array([2.0]), completion_max=np.array([30.0]),
        gpus=16, pool_gpus=np.array([8, 8]), usd_per_gpu_hour=np.array([4.0, 1.8]),
    )
    return grid, problem


def test_profiling_cost_is_dollars_over_priced_pools_and_gpu_seconds_otherwise() -> None:
    from fleetsieve_bayes.allocation.problem import profiling_cost

    grid, problem = _two_pool_grid()
    np.testing.assert_allclose(profiling_cost(grid, problem), [600 * 4 / 3600, 1200 * 4 / 3600, 600 * 1.8 / 3600, 1200 * 1.8 / 3600])
    np.testing.assert_array_equal(profiling_cost(grid, problem._replace(usd_per_gpu_hour=None)), [600, 1200, 600, 1200])
    np.testing.assert_array_equal(profiling_cost(grid), [600, 1200, 600, 1200])
    one = grid._replace(gpu=None, pools=("",))
    np.testing.assert_array_equal(profiling_cost(one, problem._replace(pool_gpus=None, usd_per_gpu_hour=np.array([4.0]))), [600, 1200, 600, 1200])


def test_ties_go_to_the_cell_that_costs_fewer_dollars_not_fewer_gpu_seconds() -> None:
    """TP4 on the 1.8 $/h pool (1200 GPU-s, 0.60 $) beats TP2 on the 4 $/h pool (600 GPU-s,
    0.67 $) at an equal score; unpriced, the GPU-seconds decide as before."""
    from fleetsieve_bayes.allocation.problem import profiling_cost
    from fleetsieve_bayes.decision.strategies.base import cheapest, select_cell

    grid, problem = _two_pool_grid()
    score = np.array([0.5, -np.inf, -np.inf, 0.5])
    assert select_cell(score, profiling_cost(grid, problem)) == 3
    assert select_cell(score, grid.cost_gpu_s) == 0
    assert cheapest([0, 3], grid, problem) == 3
    assert cheapest([0, 3], grid) == 0
    assert cheapest([0, 3], grid, problem._replace(usd_per_gpu_hour=None)) == 0
