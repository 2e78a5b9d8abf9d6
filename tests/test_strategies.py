"""The strategy seam: every strategy returns an unmeasured cell, reproducibly; documented rules hold."""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
import pytest

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.bounds import conservative_table, credible_bounds, optimistic_table
from fleetsieve_bayes.decision.certificate import Certificate, Gap, certify
from fleetsieve_bayes.decision.strategies import (
    STRATEGY_NAMES,
    RoundState,
    grid_order,
    interval_widths,
    make_strategy,
)
from fleetsieve_bayes.decision.surrogates import gp_predictive_std, independent_arms
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.settings import DecisionSettings

N_DRAWS = 200


class FakePosterior(NamedTuple):
    latent: np.ndarray  # (n_draws, n_cells, 4)
    noise: np.ndarray  # (n_draws, 4)


class FakeBounds(NamedTuple):
    lo: np.ndarray
    hi: np.ndarray


def two_class_grid() -> tuple[CellGrid, AllocationProblem]:
    # Cells deliberately NOT in (workload, tp, load) order, to test `grid`.
    grid = CellGrid(
        workloads=("a", "b"),
        workload_idx=np.array([1, 0, 0, 1, 0, 1, 1]),
        tp=np.array([2, 1, 2, 1, 1, 2, 1]),
        load=("L2", "L2", "L1", "L1", "L1", "L1", "L2"),
        offered_rps=np.array([6.0, 6.0, 5.0, 5.0, 5.0, 5.0, 6.0]),
        duration_s=np.array([100.0, 100.0, 100.0, 100.0, 100.0, 300.0, 100.0]),
    )
    problem = AllocationProblem(
        demand=np.array([4.0, 2.0]),
        critical=np.array([False, False]),
        floor=np.array([1.0, 1.0]),
        success_min=np.array([0.9, 0.9]),
        ttft_max=np.array([1.0, np.inf]),
        completion_max=np.array([np.inf, np.inf]),
        gpus=4,
    )
    return grid, problem


def make_state(rnd: int = 1, measured_cells=(4, 5)) -> RoundState:
    grid, problem = two_class_grid()
    rng = np.random.default_rng(123)
    c = grid.n_cells
    lat = np.empty((N_DRAWS, c, 4), np.float32)
    centre = np.array([1.5, 1.5, 0.4, 0.9, 1.0, 2.5, 1.2])
    spread = np.array([0.5, 0.6, 0.3, 0.2, 0.05, 0.05, 0.4])
    lat[..., 0] = centre * np.exp(spread * rng.normal(size=(N_DRAWS, c)))
    lat[..., 1] = 0.5 * np.exp(0.5 * rng.normal(size=(N_DRAWS, c)))
    lat[..., 2] = 5.0
    lat[..., 3] = 0.99
    noise = np.full((N_DRAWS, 4), 0.05, np.float32)
    measured = np.zeros(c, bool)
    measured[list(measured_cells)] = True
    truth = lat[0].astype(np.float64)
    observed = np.where(measured[:, None], truth, np.nan)
    posterior = FakePosterior(lat, noise)
    bounds = credible_bounds(posterior, observed, measured, 0.9, 0.0)
    cons_vals, opt_vals = conservative_table(bounds), optimistic_table(bounds)
    cons = allocate_milp(grid, cons_vals, problem)
    opt = allocate_milp(grid, opt_vals, problem)
    cert = certify(grid, problem, cons, opt, measured, np.nan_to_num(observed), 0.05)
    return RoundState(
        grid=grid,
        problem=problem,
        campaign_epsilon=0.05,
        credible_level=0.9,
        repeatability=0.0,
        measured=measured,
        observed=observed,
        posterior=posterior,
        bounds=bounds,
        conservative=cons,
        optimistic=opt,
        certificate=cert,
        round=rnd,
        rng=np.random.default_rng([7, rnd]),
        key=jax.random.fold_in(jax.random.PRNGKey(7), rnd),
    )


@pytest.fixture(scope="module")
def strategies():
    grid, problem = two_class_grid()
    return {n: make_strategy(n, grid, problem, DecisionSettings(credible_level=0.9), seed=7) for n in STRATEGY_NAMES}


def fresh(state: RoundState) -> RoundState:
    """Same state with freshly seeded generators (what the loop builds for a round)."""
    return state._replace(rng=np.random.default_rng([7, state.round]))


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_returns_unmeasured_cell_reproducibly(strategies, name):
    state = make_state()
    strategy = strategies[name]
    assert strategy.name == name
    first = strategy.select(fresh(state))
    assert isinstance(first, int)
    assert 0 <= first < state.grid.n_cells and not state.measured[first]
    assert strategy.select(fresh(state)) == first


def test_unknown_strategy_lists_names():
    grid, problem = two_class_grid()
    with pytest.raises(InputError) as err:
        make_strategy("bogus", grid, problem, DecisionSettings(credible_level=0.9), seed=0)
    msg = str(err.value)
    assert "bogus" in msg and "\n" not in msg
    for n in STRATEGY_NAMES:
        assert n in msg


def test_grid_order_is_workload_tp_load():
    grid, _ = two_class_grid()
    order = list(grid_order(grid))
    keys = [(int(grid.workload_idx[i]), int(grid.tp[i]), float(grid.offered_rps[i])) for i in order]
    assert keys == sorted(keys)
    # Exactly: a TP1 L1, a TP1 L2, a TP2 L1, b TP1 L1, b TP1 L2, b TP2 L1, b TP2 L2.
    assert order == [4, 1, 2, 3, 6, 5, 0]


def test_grid_strategy_walks_the_order(strategies):
    state = make_state(measured_cells=(4, 1))
    assert strategies["grid"].select(state) == 2
    state = make_state(measured_cells=(4, 1, 2, 3))
    assert strategies["grid"].select(state) == 6


def test_random_covers_cells_and_follows_rng(strategies):
    state = make_state()
    picks = {strategies["random"].select(state._replace(rng=np.random.default_rng(s))) for s in range(40)}
    assert picks == set(np.flatnonzero(~state.measured))


def test_fleetsieve_measures_cheapest_committed_when_gap_closed(strategies):
    state = make_state()
    cert = Certificate("undecided", Gap(0.0, 0.01, 0.0), (0, 3), "committed cell not measured yet")
    # Cell 0 (TP2, 100 s) costs 200 GPU-s, cell 3 (TP1) 100 GPU-s.
    assert strategies["fleetsieve"].select(state._replace(certificate=cert)) == 3


def test_max_uncertainty_picks_widest_interval(strategies):
    state = make_state()
    lo = np.ones((7, 4))
    hi = np.ones((7, 4)) * 1.1
    hi[6, 0] = 5.0  # widest
    hi[4, 0] = 50.0  # wider still, but measured
    assert strategies["max-uncertainty"].select(state._replace(bounds=FakeBounds(lo, hi))) == 6
    w = interval_widths(lo, hi)
    assert w[6] == pytest.approx(np.log(5.0) + 2 * np.log(1.1))


def test_shared_uncertainty_prefers_cells_far_from_measurements():
    grid, _ = two_class_grid()
    measured = np.zeros(7, bool)
    measured[[4, 1]] = True  # class a, TP1
    observed = np.where(measured[:, None], np.array([1.0, 0.5, 5.0, 0.99]), 1.0)
    sd = gp_predictive_std(grid, observed, measured)
    assert sd.shape == (7,)
    assert np.all(sd[[4, 1]] < 0.2) and np.all(sd <= 1.0 + 1e-12)
    assert sd[2] < sd[5]  # same features, but a TP2 L1 shares the measured cells' class (corr < 1)
    assert sd[2] <= sd[0] + 1e-12


def test_independent_arms_no_sharing():
    grid, _ = two_class_grid()
    measured = np.zeros(7, bool)
    measured[[4]] = True
    observed = np.where(measured[:, None], np.array([1.0, 0.5, 5.0, 0.99]), 1.0)
    arms = independent_arms(grid, observed, measured)
    assert arms.mean.shape == (7, 4) and arms.sd.shape == (7, 4)
    assert arms.mean[4, 0] == pytest.approx(0.0)  # log 1.0
    # An unmeasured cell's belief depends on its offered rate only, not on TP or neighbours.
    assert arms.mean[2, 0] == pytest.approx(arms.mean[3, 0])
    assert arms.mean[1, 0] - arms.mean[2, 0] == pytest.approx(np.log(6.0 / 5.0))
    np.testing.assert_allclose(arms.mean[1, 1:], arms.mean[2, 1:])
    assert np.all(arms.mean[:, 0] <= np.log(grid.offered_rps) + 1e-12)


def _two_pool_state() -> tuple[RoundState, CellGrid, AllocationProblem]:
    """One class on two pools; the cheap L40S TP1 cells are hopeless, the H100 TP2
    cell and the L40S TP2 cell may each serve the demand (unmeasured)."""
    grid = CellGrid(
        workloads=("a",),
        workload_idx=np.zeros(5, np.int64),
        tp=np.array([2, 2, 1, 1, 2]),
        load=("L1", "L2", "L1", "L2", "L1"),
        offered_rps=np.array([2.0, 4.0, 0.5, 1.0, 1.0]),
        duration_s=np.full(5, 300.0),
        gpu=np.array([0, 0, 1, 1, 1]),
        pools=("h100-sxm-80gb", "l40s-48gb"),
    )
    problem = AllocationProblem(
        demand=np.array([4.0]), critical=np.array([False]), floor=np.array([1.0]), success_min=np.array([0.9]),
        ttft_max=np.array([1.0]), completion_max=np.array([np.inf]), gpus=8, pool_gpus=np.array([2, 8]),
        usd_per_gpu_hour=np.array([4.0, 1.0]),
    )
    lat = np.empty((N_DRAWS, 5, 4), np.float32)
    rng = np.random.default_rng(0)
    lat[..., 0] = np.array([2.0, 4.0, 0.2, 0.2, 1.0]) * np.exp(0.3 * rng.normal(size=(N_DRAWS, 5)))
    lat[..., 1] = np.array([0.5, 0.8, 50.0, 80.0, 0.6]) * np.exp(0.3 * rng.normal(size=(N_DRAWS, 5)))
    lat[..., 2] = 5.0
    lat[..., 3] = 0.99
    measured = np.array([True, False, False, False, False])
    observed = np.where(measured[:, None], lat[0].astype(np.float64), np.nan)
    post = FakePosterior(lat, np.full((N_DRAWS, 4), 0.05, np.float32))
    bounds = credible_bounds(post, observed, measured, 0.9, 0.0)
    cons = allocate_milp(grid, conservative_table(bounds), problem)
    opt = allocate_milp(grid, optimistic_table(bounds), problem)
    cert = certify(grid, problem, cons, opt, measured, np.nan_to_num(observed), 0.05)
    state = RoundState(
        grid=grid, problem=problem, campaign_epsilon=0.05, credible_level=0.9, repeatability=0.0,
        measured=measured, observed=observed, posterior=post, bounds=bounds, conservative=cons, optimistic=opt,
        certificate=cert, round=1, rng=np.random.default_rng([7, 1]), key=jax.random.PRNGKey(7),
    )
    return state, grid, problem


def test_over_pools_nothing_helps_measures_a_hope_of_the_optimistic_allocation_not_the_cheapest_cell(monkeypatch):
    from fleetsieve_bayes.decision.strategies import gap

    state, grid, problem = _two_pool_state()
    hoped = gap.optimistic_unmeasured(state)
    assert hoped and all(not state.measured[c] for c in hoped)
    assert not set(hoped) & {2, 3}  # the optimistic allocation never wants the L40S TP1 cells
    assert not [c for c in state.certificate.unmeasured_committed if not state.measured[c]]  # A⁻: measured only

    class Zero(NamedTuple):
        score: np.ndarray

    monkeypatch.setattr(gap, "run_kernel", lambda ctx, st: Zero(np.zeros(grid.n_cells)))
    strategy = make_strategy("fleetsieve", grid, problem, DecisionSettings(credible_level=0.9), seed=7)
    chosen = strategy.select(state)
    costs = grid.cost_usd(problem.usd_per_gpu_hour)
    assert chosen == min(hoped, key=lambda c: (costs[c], c))
    # The cheapest cell of the grid (an L40S TP1) is what a score of 0 everywhere picked before.
    assert int(np.argmin(np.where(state.measured, np.inf, costs))) in (2, 3)
    # One pool: the rule is the single-type one (cheapest cell when nothing helps).
    one = grid._replace(gpu=None, pools=("default",))
    one_problem = problem._replace(pool_gpus=None, usd_per_gpu_hour=None)
    one_state = state._replace(grid=one, problem=one_problem)
    single = make_strategy("fleetsieve", one, one_problem, DecisionSettings(credible_level=0.9), seed=7)
    assert single.select(one_state) in (2, 3)
