"""The ``targeted``, ``voi`` and ``constrained-bo`` strategies, asked to choose.

Each gets a small situation built by hand (grid, problem, posterior draws, the
round's bounds, allocations and certificate) in which its documented rule
(docs/method.md §7 and the strategy's module docstring) has one answer, and
that answer is none of the naive ones: the cheapest cell, the first unmeasured
cell, the ``grid`` order's next cell, the widest interval (``max-uncertainty``).
Swapping the strategy for another fails the test. Each also gets one
documented edge, and one short replayed campaign end to end.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
import pytest
from tiny_campaign import write_tiny

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import (
    AllocationProblem,
    CellGrid,
    grid_from_table,
    profiling_cost,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import Campaign, load_campaign
from fleetsieve_bayes.campaign.journal import read_journal
from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.decision.bounds import conservative_table, credible_bounds, optimistic_table
from fleetsieve_bayes.decision.certificate import certify
from fleetsieve_bayes.decision.intervals import load_ladder
from fleetsieve_bayes.decision.strategies import (
    RoundState,
    grid_order,
    interval_widths,
    make_strategy,
)
from fleetsieve_bayes.decision.strategies.base import TIE_TOLERANCE, StrategyContext, select_cell
from fleetsieve_bayes.decision.strategies.bo import expected_improvement, p_slo
from fleetsieve_bayes.decision.strategies.gap import run_kernel
from fleetsieve_bayes.decision.surrogates import independent_arms
from fleetsieve_bayes.settings import DecisionSettings
from fleetsieve_bayes.table import read_table

SETTINGS = DecisionSettings(credible_level=0.9)


class FakePosterior(NamedTuple):
    latent: np.ndarray  # (n_draws, n_cells, 4)
    noise: np.ndarray  # (n_draws, 4)


def round_state(
    grid: CellGrid, problem: AllocationProblem, latent: np.ndarray, measured: np.ndarray, observed: np.ndarray
) -> RoundState:
    """The round a campaign would hand its strategy: bounds from the draws (with the knee
    guard, as a campaign's), A⁻ and A⁺ allocated on them, the certificate (ε = 0.05)."""
    latent = np.asarray(latent, np.float32)
    posterior = FakePosterior(latent, np.full((latent.shape[0], 4), 0.02, np.float32))
    observed = np.where(measured[:, None], observed, np.nan)
    ladder = load_ladder(grid.workload_idx, grid.tp, grid.offered_rps, SETTINGS.rules.knee_guard, grid.gpu_idx)
    bounds = credible_bounds(posterior, observed, measured, SETTINGS.credible_level, 0.0, ladder=ladder)
    cons = allocate_milp(grid, conservative_table(bounds), problem)
    opt = allocate_milp(grid, optimistic_table(bounds), problem)
    cert = certify(grid, problem, cons, opt, measured, np.nan_to_num(observed), 0.05)
    return RoundState(
        grid=grid,
        problem=problem,
        campaign_epsilon=0.05,
        credible_level=SETTINGS.credible_level,
        repeatability=0.0,
        measured=measured,
        observed=observed,
        posterior=posterior,
        bounds=bounds,
        conservative=cons,
        optimistic=opt,
        certificate=cert,
        round=1,
        rng=np.random.default_rng([7, 1]),
        key=jax.random.fold_in(jax.random.PRNGKey(7), 1),
    )


def naive_choices(state: RoundState) -> dict[str, int]:
    """What the naive rules would measure next: cheapest, first unmeasured, the ``grid``
    order's next cell, the widest interval."""
    open_ = np.flatnonzero(~state.measured)
    cost = profiling_cost(state.grid, state.problem)
    widths = interval_widths(np.asarray(state.bounds.lo), np.asarray(state.bounds.hi))
    return {
        "cheapest": int(open_[np.argmin(cost[open_])]),
        "first": int(open_[0]),
        "grid": int(next(c for c in grid_order(state.grid) if not state.measured[c])),
        "widest": int(open_[np.argmax(widths[open_])]),
    }


def all_measured(state: RoundState) -> RoundState:
    obs = np.where(np.isnan(state.observed), 1.0, state.observed)
    return state._replace(measured=np.ones(state.grid.n_cells, bool), observed=obs)


# --- constrained-bo -------------------------------------------------------------------
#
# Two classes, SLO TTFT ≤ 1 s. Class a's measured cells: one admissible (0), one not (1);
# class b's two measured cells (6, 7) miss the TTFT limit twentyfold, so its unmeasured
# cell 8 (offered 16 req/s, the largest expected improvement by far) meets the SLO with
# probability ~1e-10. Among class a's unmeasured cells (one P(SLO) between them) the
# expected improvement of per-GPU throughput grows with offered rate / TP: cell 3
# (TP1, 8 req/s) — the dearest cell of the class (600 s).
BO_GRID = CellGrid(
    workloads=("a", "b"),
    workload_idx=np.array([0, 0, 0, 0, 0, 0, 1, 1, 1]),
    tp=np.array([1, 1, 2, 1, 1, 4, 1, 1, 1]),
    load=("L1", "L2", "L1", "L3", "L0", "L3", "L1", "L2", "L4"),
    offered_rps=np.array([2.0, 4.0, 2.0, 8.0, 1.0, 8.0, 2.0, 4.0, 16.0]),
    duration_s=np.array([100.0, 100.0, 100.0, 600.0, 50.0, 100.0, 100.0, 100.0, 100.0]),
)
BO_PROBLEM = AllocationProblem(
    demand=np.array([8.0, 8.0]),
    critical=np.array([False, False]),
    floor=np.zeros(2),
    success_min=np.array([0.99, 0.99]),
    ttft_max=np.array([1.0, 1.0]),
    completion_max=np.array([np.inf, np.inf]),
    gpus=8,
)
BO_OBSERVED = np.array(
    [
        [1.8, 0.5, 5.0, 0.999],
        [3.0, 3.0, 9.0, 0.995],
        [1.9, 0.6, 5.0, 0.999],
        [6.0, 0.8, 6.0, 0.999],
        [0.95, 0.4, 5.0, 0.999],
        [7.5, 0.5, 4.0, 0.999],
        [1.9, 20.0, 30.0, 0.999],
        [3.8, 30.0, 40.0, 0.999],
        [15.0, 25.0, 40.0, 0.999],
    ]
)


def bo_state(
    measured_cells: tuple[int, ...] = (0, 1, 6, 7), grid: CellGrid = BO_GRID, observed: np.ndarray = BO_OBSERVED
) -> RoundState:
    """``constrained-bo`` reads only the measured values; the draws (the measured values
    give or take 10 %) make the rest of the round a campaign's."""
    measured = np.zeros(grid.n_cells, bool)
    measured[list(measured_cells)] = True
    latent = np.repeat(observed[None], 50, axis=0) * np.exp(
        0.1 * np.random.default_rng(0).normal(size=(50, grid.n_cells, 1))
    )
    latent[..., 3] = observed[:, 3]
    return round_state(grid, BO_PROBLEM, latent, measured, observed)


def test_constrained_bo_measures_the_best_improvement_times_p_slo():
    state = bo_state()
    chosen = make_strategy("constrained-bo", BO_GRID, BO_PROBLEM, SETTINGS, seed=7).select(state)
    assert chosen == 3
    naive = naive_choices(state)
    assert chosen not in naive.values(), naive  # cheapest/grid: 4, first: 2, widest: elsewhere
    # Unconstrained BO (expected improvement alone) would measure class b's cell 8;
    # the probability of meeting the SLO is what rules it out.
    obs = np.where(state.measured[:, None], BO_OBSERVED, 1.0)
    arms = independent_arms(BO_GRID, obs, state.measured)
    ei = np.where(state.measured, -np.inf, expected_improvement(BO_GRID, BO_PROBLEM, arms, obs, state.measured))
    assert int(np.argmax(ei)) == 8
    assert p_slo(BO_GRID, BO_PROBLEM, arms)[8] < 1e-6


def test_constrained_bo_breaks_ties_by_cost_then_cell_order():
    # With 3 and 5 measured too (both missing the TTFT limit), cells 2 (TP2, 2 req/s) and
    # 4 (TP1, 1 req/s) have one expected per-GPU throughput and one P(SLO): equal
    # scores, the best left (and well above the tie tolerance's absolute floor, 1e-6).
    observed = BO_OBSERVED.copy()
    observed[3, 1] = observed[5, 1] = 3.0
    state = bo_state((0, 1, 3, 5, 6, 7), observed=observed)
    obs = np.where(state.measured[:, None], observed, 1.0)
    arms = independent_arms(BO_GRID, obs, state.measured)
    score = expected_improvement(BO_GRID, BO_PROBLEM, arms, obs, state.measured) * p_slo(BO_GRID, BO_PROBLEM, arms)
    assert score[2] == pytest.approx(score[4], rel=1e-12)
    assert score[8] < score[2] - TIE_TOLERANCE * max(1.0, score[2])  # 8 is no tie
    bo = make_strategy("constrained-bo", BO_GRID, BO_PROBLEM, SETTINGS, seed=7)
    assert bo.select(state) == 4  # 50 GPU-s, not 200
    # Equal cost as well: the lower index.
    even = BO_GRID._replace(duration_s=np.where(np.arange(9) == 4, 200.0, BO_GRID.duration_s))
    state = bo_state((0, 1, 3, 5, 6, 7), grid=even, observed=observed)
    assert make_strategy("constrained-bo", even, BO_PROBLEM, SETTINGS, seed=7).select(state) == 2


@pytest.mark.parametrize("name", ["constrained-bo", "targeted", "voi"])
def test_no_unmeasured_cell_left_is_an_error(name):
    state = all_measured(bo_state())
    with pytest.raises(ValueError, match="no unmeasured cell left"):
        make_strategy(name, BO_GRID, BO_PROBLEM, SETTINGS, seed=7).select(state)


# --- targeted and voi -----------------------------------------------------------------
#
# One class, 4 req/s on 4 GPUs, SLO TTFT ≤ 1 s. Cell 0 is measured (TP2, 0.5 req/s,
# admissible; no cell of its TP beneath it, so the knee guard holds nothing open).
# Unmeasured: 1, the cheapest, never admissible; 2, the widest interval (throughput
# e^±1.5), never admissible; 3 (TP1, 1 req/s: 4 replicas serve it all; 500 s) admissible
# in a share ``p3`` of the draws; 4 (TP1, 0.8 req/s; 100 s) always admissible; 5 (TP2,
# 1.9 req/s: 2 replicas serve 95 %; 500 s, so 1000 GPU-s) admissible in a share ``p5``.
# The draws are laid out, not sampled, so the shares are exact.
DECISION_GRID = CellGrid(
    workloads=("a",),
    workload_idx=np.zeros(6, np.int64),
    tp=np.array([2, 1, 1, 1, 1, 2]),
    load=("L1", "L0", "L2", "L3", "L4", "L4"),
    offered_rps=np.array([1.0, 0.5, 2.0, 3.0, 4.0, 4.0]),
    duration_s=np.array([100.0, 50.0, 100.0, 500.0, 100.0, 500.0]),
)
DECISION_PROBLEM = AllocationProblem(
    demand=np.array([4.0]),
    critical=np.array([False]),
    floor=np.zeros(1),
    success_min=np.array([0.99]),
    ttft_max=np.array([1.0]),
    completion_max=np.array([np.inf]),
    gpus=4,
)
N_DRAWS = 200


def decision_state(p3: float, p5: float, *, independent: bool = False) -> RoundState:
    """Draws where 3 is admissible in the first ``p3`` of the draws and 5 in the last
    ``p5`` (never both when ``p3 + p5 ≤ 1``), or, ``independent``, 3 in ``p3`` of every
    ten draws and 5 in ``p5`` of every ten blocks of ten (independent: measuring one
    tells nothing of the other)."""
    i = np.arange(N_DRAWS)
    share3 = (i + 0.5) / N_DRAWS
    share5 = share3[::-1]
    if independent:
        share3, share5 = (i % 10 + 0.5) / 10, (i // 10 % 10 + 0.5) / 10
    lat = np.empty((N_DRAWS, 6, 4))
    lat[..., 2], lat[..., 3] = 5.0, 0.999
    lat[:, 0] = [0.5, 0.3, 5.0, 0.999]
    lat[:, 1, :2] = [0.45, 5.0]
    lat[:, 2, 0] = np.where(i < N_DRAWS // 2, np.exp(-1.5), np.exp(1.5))
    lat[:, 2, 1] = 10.0
    lat[:, 3, 0], lat[:, 3, 1] = 1.0, np.where(share3 < p3, 0.5, 2.0)
    lat[:, 4, :2] = [0.8, 0.4]
    lat[:, 5, 0], lat[:, 5, 1] = 1.9, np.where(share5 < p5, 0.5, 2.0)
    measured = np.zeros(6, bool)
    measured[0] = True
    return round_state(DECISION_GRID, DECISION_PROBLEM, lat, measured, lat[0])


def test_targeted_measures_the_most_uncertain_decision_variable():
    from fleetsieve_bayes.allocation.batched import make_jax_allocator
    from fleetsieve_bayes.decision.strategies.targeted import decision_usage

    state = decision_state(p3=0.4, p5=0.5)
    # The decision: A⁻ on cell 4 (0.8 of demand), A⁺ on the hope 3 (all of it).
    assert state.conservative.committed() == [4] and state.optimistic.committed() == [3]
    p_best, p_adm = decision_usage(make_jax_allocator(DECISION_GRID, DECISION_PROBLEM).solve, state)
    # Each draw's own optimum: 3 where admissible (40 %), else 5 (50 %), else 4 (10 %).
    np.testing.assert_allclose(p_best, [0.0, 0.0, 0.0, 0.4, 0.1, 0.5])
    np.testing.assert_allclose(p_adm, [1.0, 0.0, 0.0, 0.4, 1.0, 0.5])
    # Scores p_best(1 − p_best) + [decision] p_adm(1 − p_adm): 3 → 0.24 + 0.24, 4 → 0.09,
    # 5 → 0.25 (the largest p_best variance, but no allocation commits to it).
    chosen = make_strategy("targeted", DECISION_GRID, DECISION_PROBLEM, SETTINGS, seed=7).select(state)
    assert chosen == 3
    naive = naive_choices(state)
    assert chosen not in naive.values(), naive  # cheapest, first, grid: 1; widest: 2


def test_targeted_falls_back_to_max_uncertainty_when_no_score_is_positive():
    # 3 and 5 never admissible: every draw uses 4 (p_best 1, p_adm 1), every score is 0.
    state = decision_state(p3=0.0, p5=0.0)
    chosen = make_strategy("targeted", DECISION_GRID, DECISION_PROBLEM, SETTINGS, seed=7).select(state)
    assert chosen == 2 == naive_choices(state)["widest"]  # not the cheapest cell, 1


def test_voi_measures_the_best_conservative_improvement_per_gpu_second():
    state = decision_state(p3=0.3, p5=0.9, independent=True)
    assert state.conservative.committed() == [4] and state.optimistic.committed() == [3]
    voi = make_strategy("voi", DECISION_GRID, DECISION_PROBLEM, SETTINGS, seed=7)
    chosen = voi.select(state)
    # Expected improvement of A⁻ (now 0.77 of the demand, on 4's lower bound) per GPU-s:
    # 5 (admissible in 90 % of the draws: to 0.95) ≈ 0.31 / 1000; 3 (30 %: to all of it)
    # ≈ 0.11 / 500; 4 itself (its measured 0.8 replaces its lower bound) ≈ 0.05 / 100.
    assert chosen == 4
    naive = naive_choices(state)
    assert chosen not in naive.values(), naive  # cheapest, first, grid: 1; widest: 2
    # Expected gap reduction, cost only breaking ties (``fleetsieve``), measures 5; the
    # decision's most uncertain variable (``targeted``) is 3.
    assert make_strategy("fleetsieve", DECISION_GRID, DECISION_PROBLEM, SETTINGS, seed=7).select(state) == 5
    assert make_strategy("targeted", DECISION_GRID, DECISION_PROBLEM, SETTINGS, seed=7).select(state) == 3


# Cell 3 (TP2, measured) holds A⁻ at 0.8 of the demand. Cell 5 (TP2, 4 req/s): in half
# the draws 1.5 req/s and admissible (2 replicas, 3 req/s: no better than 3), in the
# other half 2 req/s and not admissible. A⁺ hopes for 2 req/s and the SLO together:
# measuring 5 closes the gap, yet no measurement can raise A⁻.
FALLBACK_GRID = CellGrid(
    workloads=("a",),
    workload_idx=np.zeros(6, np.int64),
    tp=np.array([2, 1, 4, 2, 1, 2]),
    load=("L1", "L1", "L1", "L2", "L2", "L3"),
    offered_rps=np.array([1.0, 1.0, 4.0, 2.0, 2.0, 4.0]),
    duration_s=np.array([100.0, 50.0, 100.0, 100.0, 100.0, 100.0]),
)


def test_voi_falls_back_to_gap_reduction_per_gpu_second_when_nothing_improves_a_minus():
    even = np.arange(N_DRAWS) % 2 == 0
    lat = np.empty((N_DRAWS, 6, 4))
    lat[..., 2], lat[..., 3] = 5.0, 0.999
    lat[:, 0] = [0.5, 0.3, 5.0, 0.999]
    lat[:, 1, :2] = [0.9, 5.0]
    lat[:, 2, 0] = np.exp(np.random.default_rng(0).normal(0.0, 1.5, N_DRAWS))
    lat[:, 2, 1] = 10.0
    lat[:, 3] = [1.6, 0.4, 5.0, 0.999]
    lat[:, 4, :2] = [1.8, 3.0]
    lat[:, 5, 0], lat[:, 5, 1] = np.where(even, 1.5, 2.0), np.where(even, 0.5, 2.0)
    measured = np.zeros(6, bool)
    measured[[0, 3]] = True
    state = round_state(FALLBACK_GRID, DECISION_PROBLEM, lat, measured, lat[0])
    assert state.conservative.committed() == [3] and state.optimistic.committed() == [5]
    ctx = StrategyContext(FALLBACK_GRID, DECISION_PROBLEM, SETTINGS.credible_level, 0.0, 7, rules=SETTINGS.rules)
    scores = run_kernel(ctx, state)
    gain = np.asarray(scores.expected_conservative) - float(scores.conservative_now)
    assert np.all(gain[~measured] <= 0.0)  # the premise: no measurement raises A⁻
    assert int(np.argmax(np.asarray(scores.score))) == 5  # only 5 reduces the gap
    chosen = make_strategy("voi", FALLBACK_GRID, DECISION_PROBLEM, SETTINGS, seed=7).select(state)
    assert chosen == 5
    naive = naive_choices(state)
    assert chosen not in naive.values(), naive  # cheapest, first, grid: 1; widest: 2


# --- end to end -----------------------------------------------------------------------

STATUSES = {"certified-feasible", "certified-infeasible", "undecided", "exhausted"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Campaign, CellGrid, np.ndarray]:
    """The tiny replayed campaign at ``"point"`` (tests/tiny_campaign.py), its grid and
    the table's values of every cell."""
    path = write_tiny(tmp_path_factory.mktemp("tiny"))
    campaign = load_campaign(path)
    table = read_table(path.parent / "grid.csv")
    grid = grid_from_table(table, tuple(w.name for w in campaign.workloads))
    return campaign, grid, values_from_table(grid, table)


def _index(grid: CellGrid, cell: dict) -> int:
    keys = [(grid.workloads[w], int(t), ld) for w, t, ld in zip(grid.workload_idx, grid.tp, grid.load, strict=True)]
    return keys.index((cell["workload"], int(cell["tp"]), cell["load"]))


@pytest.mark.parametrize("name", ["targeted", "voi", "constrained-bo"])
def test_strategy_runs_a_replayed_campaign_to_a_decision(name, tiny, tmp_path):
    campaign, grid, values = tiny
    assert campaign.slo_attainment == "point"
    out = tmp_path / name
    result = run_campaign(campaign, out, strategy=name, seed=0).result
    assert result["strategy"] == name
    assert result["status"] in STATUSES
    records, _ = read_journal(out / "journal.jsonl")
    design = [_index(grid, r["cell"]) for r in records if r["type"] == "measurement" and r["phase"] == "design"]
    picks = [_index(grid, r["cell"]) for r in records if r["type"] == "measurement" and r["phase"] == "acquire"]
    assert design and picks, "the strategy was never asked to choose"
    assert len(set(design + picks)) == len(design) + len(picks)  # each pick a cell not measured yet
    assert [(m["workload"], m["tp"], m["load"]) for m in result["measured"]] == [
        (grid.workloads[grid.workload_idx[c]], int(grid.tp[c]), grid.load[c]) for c in design + picks
    ]
    # Not the grid strategy: its picks after the design are the grid order's.
    grid_next = [int(c) for c in grid_order(grid) if c not in design]
    assert picks != grid_next[: len(picks)]
    if result["status"] == "certified-feasible":  # on measured cells only
        for cls, place in result["allocation"].items():
            if place["replicas"]:
                assert _index(grid, {"workload": cls, "tp": place["tp"], "load": place["load"]}) in design + picks
    if name == "constrained-bo":
        # Its rule reads the measurements alone (replayed table rows), so every pick is
        # the rule's answer on the cells measured before it: exact, whatever the model fits.
        problem = campaign.problem()
        cost = profiling_cost(grid, problem)
        for k, chosen in enumerate(picks):
            measured = np.zeros(grid.n_cells, bool)
            measured[design + picks[:k]] = True
            obs = np.where(measured[:, None], values, 1.0)
            arms = independent_arms(grid, obs, measured)
            score = np.maximum(expected_improvement(grid, problem, arms, obs, measured), 0.0) * p_slo(grid, problem, arms)
            assert chosen == select_cell(np.where(measured, -np.inf, score), cost, tie_tolerance=TIE_TOLERANCE)
