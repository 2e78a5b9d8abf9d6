"""Acquisition chooses repeats at an SLO-attainment level (issue 29).

A small noisy fleet, every cell measured once, posterior built by hand (no
fit, so the tests run in seconds): class a needs two replicas of X (a TP1@L2,
its one window's TTFT 0.8 s against a 1 s limit, so its attainment straddles
0.9) — the cells beside it serve half the demand. Class b is served by B1;
Z (b TP1@L2) straddles its level too but no allocation wants it. The
certificate turns on X's attainment alone: a repeat of X can flip it, a
repeat of any other cell cannot.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.batch import believe
from fleetsieve_bayes.decision.certificate import EXHAUSTED, UNDECIDED
from fleetsieve_bayes.decision.strategies import make_strategy
from fleetsieve_bayes.decision.strategies.base import RoundState, StrategyContext
from fleetsieve_bayes.decision.strategies.gap import kernel_level, run_kernel
from fleetsieve_bayes.model.joint import window_rows
from fleetsieve_bayes.round import (
    assess,
    choose,
    new_state,
    open_cells,
    record,
    repeat_options,
    repeatable,
)
from fleetsieve_bayes.settings import DecisionSettings

X, Y, B1, Z = 0, 1, 2, 3
N_DRAWS = 400
LEVEL = DecisionSettings(slo_attainment=0.9, max_windows_per_cell=3)
GRID = CellGrid(
    workloads=("a", "b"),
    workload_idx=np.array([0, 0, 1, 1]),
    tp=np.array([1, 1, 1, 1]),
    load=("L2", "L1", "L1", "L2"),
    offered_rps=np.array([2.0, 1.0, 2.0, 1.6]),
    duration_s=np.array([300.0, 300.0, 300.0, 300.0]),
)
PROBLEM = AllocationProblem(
    demand=np.array([4.0, 2.0]),
    critical=np.array([False, False]),
    floor=np.array([1.0, 1.0]),
    success_min=np.array([0.9, 0.9]),
    ttft_max=np.array([1.0, 5.0]),
    completion_max=np.array([np.inf, np.inf]),
    gpus=3,
)
# throughput, TTFT p99, completion p99, success of each cell's one window
WINDOW = np.array([[2.0, 0.80, 10.0, 0.995], [1.0, 0.30, 5.0, 0.999], [2.0, 1.0, 8.0, 0.999], [1.5, 4.0, 9.0, 0.995]])


class _Post:
    """A window-noise posterior (the fields the decision reads)."""

    def __init__(self, latent, noise, window, windows):
        self.latent, self.noise, self.window, self.windows = latent, noise, window, windows


def _posterior(rows: np.ndarray, row_cell: np.ndarray) -> _Post:
    rng = np.random.default_rng(0)
    spread = np.array([0.02, 0.08, 0.05, 0.0])
    latent = WINDOW[None] * np.exp(spread * rng.normal(size=(N_DRAWS, 4, 4)))
    latent[..., 3] = WINDOW[None, :, 3]
    noise = np.tile([0.02, 0.08, 0.08, 0.3], (N_DRAWS, 1))
    window = np.tile([0.01, 0.1, 0.1, 0.3, 0.03, 1.5], (N_DRAWS, 4, 1))
    return _Post(latent, noise, window, window_rows(rows, row_cell, np.ones(4, bool)))


def _row(c: int, values: np.ndarray) -> dict:
    keys = ("throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate")
    return {**dict(zip(keys, map(float, values), strict=True)), "duration_s": 300.0, "tp": 1}


def _state(window_limit: np.ndarray | None = None):
    """Every cell measured once, the strategy and the posterior (``window_limit``: the backend's windows)."""
    strategy = make_strategy("fleetsieve", GRID, PROBLEM, LEVEL, seed=3, n_fantasies=16)
    state = new_state(GRID, PROBLEM, None, None, strategy, seed=3, window_limit=window_limit)
    rows, cells = [], []
    for c in range(GRID.n_cells):
        state = record(state, c, _row(c, WINDOW[c]), phase="design")
        rows.append(WINDOW[c])
        cells.append(c)
    return state, _posterior(np.array(rows), np.array(cells))


def _view(state, post):
    return believe(GRID, PROBLEM, post, state.measured, state.observed, [], LEVEL,
                   allocate=lambda v: allocate_milp(GRID, v, PROBLEM))


def test_the_fleet_turns_on_x_alone():
    state, post = _state()
    view = _view(state, post)
    att = view.attainment
    assert view.certificate.status == UNDECIDED
    assert att.lo[X] < 0.9 <= att.hi[X] and att.lo[Z] < 0.9 <= att.hi[Z]  # both straddle
    assert att.lo[Y] >= 0.9 and att.lo[B1] >= 0.9
    assert X in view.optimistic.committed() and X not in view.conservative.committed()
    assert Z not in view.optimistic.committed() + view.conservative.committed()


def test_a_repeat_is_chosen_where_it_can_flip_the_certificate_and_not_elsewhere():
    state, post = _state()
    view = _view(state, post)
    opts = repeat_options(state, LEVEL, view)
    # X alone is offered: the others are settled (Y, B1) or wanted by no allocation (Z)
    assert opts.repeatable.tolist() == [True, False, False, False] and opts.repeat_hint == X
    # The stopping rule acquires (a repeat can settle it) instead of stopping undecided.
    a = assess(state, LEVEL, post, attempt_seed=1)
    assert a.decision.acquire and a.decision.status == UNDECIDED
    assert choose(state, LEVEL, view, post, round_no=1) == X
    # The kernel's decision value, every cell offered: positive for X only; a repeat of
    # Z (straddling, never committed), Y or B1 (settled) cannot change the decision.
    ctx = StrategyContext(GRID, PROBLEM, 0.9, 0.0, 3, 16, LEVEL.rules)
    rs = _round_state(view, post, opts._replace(repeatable=np.ones(4, bool)))
    assert kernel_level(ctx, rs) is not None
    score = np.asarray(run_kernel(ctx, rs).score)
    assert score[X] > 0.3
    assert np.all(np.abs(score[[Y, B1, Z]]) <= 1e-6)


def _round_state(view, post, opts):
    return RoundState(
        grid=GRID, problem=PROBLEM, campaign_epsilon=0.05, credible_level=0.9, repeatability=0.0,
        measured=view.measured, observed=view.observed, posterior=post, bounds=view.bounds,
        conservative=view.conservative, optimistic=view.optimistic, certificate=view.certificate, round=1,
        rng=np.random.default_rng(0), key=jax.random.PRNGKey(0), **opts._asdict(),
    )


@pytest.mark.parametrize(
    ("cap", "limit", "why"),
    [(1, None, "max_windows_per_cell"), (3, np.array([1.0, 3.0, 3.0, 3.0]), "replay rows used up")],
)
def test_a_cell_that_may_not_be_repeated_is_never_chosen(cap, limit, why):
    settings = LEVEL._replace(max_windows_per_cell=cap)
    state, post = _state(window_limit=limit)
    view = _view(state, post)
    opts = repeat_options(state, settings, view)
    assert not opts.repeatable[X], why
    assert opts.repeat_hint is None
    a = assess(state, settings, post, attempt_seed=1)
    # Only repeats of X could settle it and none may be made: the campaign stops (every
    # cell measured: exhausted, the best over measured cells) naming X.
    assert not a.decision.acquire and a.decision.status == EXHAUSTED
    rep = a.attainment_json["repeat"]
    assert (rep["workload"], rep["tp"], rep["load"], rep["windows"]) == ("a", 1, "L2", 1)
    # ... and which limit it is at: the cap, or the replay table's rows of it.
    assert (rep["limit"], rep["limited_by"]) == ((1, "max_windows_per_cell") if cap == 1 else (1, "backend"))
    if cap > 1:  # only X's rows are used up
        assert repeatable(state, cap).tolist() == [False, True, True, True]


def test_the_pool_never_repeats_a_cell_in_flight():
    state, post = _state()
    view = _view(state, post)
    assert open_cells(state, LEVEL, view).tolist() == [True, False, False, False]
    # with X in flight nothing else is worth starting: the pool waits for it
    assert not open_cells(state, LEVEL, view, busy=[X]).any()
    assert repeat_options(state, LEVEL, view, busy={X}).repeat_hint is None


def test_at_point_measured_cells_are_never_candidates():
    state, post = _state()
    point = DecisionSettings()
    view = believe(GRID, PROBLEM, post, state.measured, state.observed, [], point,
                   allocate=lambda v: allocate_milp(GRID, v, PROBLEM))
    assert repeat_options(state, point, view).repeatable is None
    assert not open_cells(state, point, view).any()


def test_the_regret_fallback_at_a_level_repeats_the_cell_whose_attainment_is_in_doubt():
    from fleetsieve_bayes.decision.regret_acquisition import (
        level_regret_inputs,
        regret_scores,
        select_by_regret,
    )

    state, post = _state()
    view = _view(state, post)
    opts = repeat_options(state, LEVEL, view)
    level = level_regret_inputs(post, GRID, PROBLEM, opts.levels, opts.repeatable, seed=5)
    # in about one draw in ten X misses its level: committing to it risks half of class a
    assert 0.8 < float(np.mean(np.asarray(level.attainment)[:, X] >= 0.9)) < 0.97
    args = (GRID, PROBLEM, view.optimistic, post.latent, post.noise, state.observed, state.measured)
    sc = regret_scores(*args, seed=2, level=level)
    assert sc.expected_regret_now > 0.02
    assert select_by_regret(sc, GRID.cost_gpu_s) == X
    assert sc.score[X] > 5 * max(sc.score[[Y, B1, Z]])
    # the point rule scores no measured cell
    assert np.all(regret_scores(*args, seed=2).score == -np.inf)


def test_a_window_is_worth_its_price_only_where_it_beats_the_best_new_cell_per_gpu_second():
    from fleetsieve_bayes.decision.strategies.gap import worth_a_window

    score = np.array([0.5, 0.3, 0.2, 0.0])
    rep = np.array([False, True, True, False])
    # new cell 0 (1,200 GPU-s) against repeats 1 (300 GPU-s) and 2 (100 GPU-s): per
    # 1,200 GPU-s they are worth 1.2 and 2.4, so the cheaper, lower-scored window wins
    assert worth_a_window(score, np.array([1200.0, 300.0, 100.0, 50.0]), rep, 0) == 2
    # at the new cell's price the new cell wins: 0.3 < 0.5
    assert worth_a_window(score, np.array([300.0, 300.0, 300.0, 50.0]), rep, 0) is None
    # an exact tie goes to the new cell (it teaches its neighbours too)
    assert worth_a_window(np.array([0.6, 0.3, 0.0, 0.0]), np.array([600.0, 300.0, 1.0, 1.0]),
                          np.array([False, True, False, False]), 0) is None
    # no unmeasured cell: the best repeat per GPU-second; equal values go to the cheaper
    assert worth_a_window(score, np.array([1.0, 300.0, 200.0, 1.0]), rep, None) == 2
    assert worth_a_window(np.array([0.0, 0.3, 0.1, 0.0]), np.array([1.0, 300.0, 100.0, 1.0]), rep, None) == 2
    assert worth_a_window(score, np.ones(4), np.zeros(4, bool), 0) is None


@pytest.mark.parametrize("seed", range(20))
def test_the_window_rule_agrees_with_a_plain_ratio_comparison(seed):
    from fleetsieve_bayes.decision.strategies.gap import worth_a_window

    rng = np.random.default_rng(seed)
    n = 12
    score = rng.uniform(0.01, 1.0, n).round(3)
    cost = rng.choice([300.0, 600.0, 1200.0, 2400.0], n)
    rep = rng.random(n) < 0.4
    rep[0] = False
    ratio = np.where(rep, score / cost, -np.inf)
    got = worth_a_window(score, cost, rep, 0)
    if not rep.any() or ratio.max() * cost[0] <= score[0] * (1 + 1e-6):
        assert got is None
    else:
        assert got is not None and rep[got] and np.isclose(ratio[got], ratio.max(), rtol=1e-6)
