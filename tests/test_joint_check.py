"""The decision-level joint check, the certifying posterior's convergence test and
the regret acquisition, on small hand-built posteriors with known answers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    UNDECIDED,
    Certificate,
    Gap,
)
from fleetsieve_bayes.decision.joint_check import apply_joint_check, joint_check, joint_tables
from fleetsieve_bayes.decision.regret_acquisition import (
    expected_regret,
    regret_scores,
    select_by_regret,
)
from fleetsieve_bayes.model.converged_fit import CONVERGENCE, _passes, convergence_diagnostics
from fleetsieve_bayes.model.diagnostics import decision_samples, failed_cells

# One class, two TPs x two loads. Cell 1 (TP2@hi) is the decision's hinge: in
# half of the draws it meets the TTFT limit and serves more than cell 0.
GRID = CellGrid(
    workloads=("chat",),
    workload_idx=np.zeros(4, np.int64),
    tp=np.array([2, 2, 4, 4]),
    load=("lo", "hi", "lo", "hi"),
    offered_rps=np.array([1.0, 2.0, 1.0, 2.0]),
    duration_s=np.full(4, 300.0),
)
PROBLEM = AllocationProblem(
    demand=np.array([4.0]),
    critical=np.array([False]),
    floor=np.array([1.0]),
    success_min=np.array([0.99]),
    ttft_max=np.array([1.0]),
    completion_max=np.array([np.inf]),
    gpus=4,
)
N_DRAWS = 400
TINY = np.full((N_DRAWS, 4), 1e-4)  # noise scales: predictive ≈ latent


def _latent(frac_good: float) -> np.ndarray:
    """``(N_DRAWS, 4, 4)``: cells 0, 2, 3 fixed; cell 1 meets its SLO in the first ``frac_good`` of draws."""
    base = np.array(
        [
            [1.0, 0.5, 5.0, 0.999],  # TP2@lo: 1 req/s, fine
            [2.0, 0.5, 5.0, 0.999],  # TP2@hi: 2 req/s, TTFT depends on the draw
            [1.0, 0.3, 5.0, 0.999],  # TP4@lo
            [1.5, 3.0, 9.0, 0.999],  # TP4@hi: violates TTFT
        ]
    )
    lat = np.broadcast_to(base, (N_DRAWS, 4, 4)).copy()
    bad = np.arange(N_DRAWS) >= int(frac_good * N_DRAWS)
    lat[bad, 1, 1] = 3.0
    return lat


def test_joint_tables_keep_measured_values_and_redraw_only_the_hidden_ones() -> None:
    import jax

    lat = _latent(0.5)
    noise = np.full((N_DRAWS, 4), 0.05)
    measured = np.array([True, False, False, True])
    obs = np.where(measured[:, None], lat[0] * 1.01, np.nan)
    obs[3] = [0.0, 0.0, 0.0, 0.0]  # a failed run: zeros
    t, hidden = (np.asarray(x) for x in joint_tables(jax.random.PRNGKey(0), lat, noise, np.nan_to_num(obs, nan=1.0), measured))
    assert t.shape == (N_DRAWS, 4, 4)
    np.testing.assert_allclose(t[:, 0], np.broadcast_to(obs[0], (N_DRAWS, 4)), rtol=1e-6)
    assert np.all(hidden[:, 3] == 0.0)  # a failure hides nothing
    assert np.std(np.log(hidden[:, 0, 1])) == pytest.approx(0.05 * 1.29, rel=0.2)  # Student-t(5) sd = 1.29 σ
    np.testing.assert_array_equal(t[:, 1], hidden[:, 1])  # unmeasured: the same predictive draw
    assert np.std(np.log(t[:, 1, 0])) > 0


@pytest.mark.parametrize("frac_good", [0.0, 0.3, 0.97])
def test_p_epsilon_optimal_is_the_share_of_draws_where_the_candidate_is_optimal(frac_good: float) -> None:
    lat = _latent(frac_good)
    measured = np.array([True, False, True, True])
    obs = np.where(measured[:, None], lat[0], np.nan)
    # Candidate: two TP2@lo replicas (2 req/s of 4): optimal only where cell 1 fails its SLO.
    cand = allocate_milp(GRID, np.where(measured[:, None], lat[-1], [0, np.inf, np.inf, 0]), PROBLEM)
    assert cand.feasible and int(cand.cell[0]) in (0, 2) and cand.min_fulfillment == pytest.approx(0.5)
    jc = joint_check(GRID, PROBLEM, cand, lat, TINY, obs, measured, 0.05, seed=1)
    good = int(frac_good * N_DRAWS)
    assert jc.p_epsilon_optimal == pytest.approx(1.0 - good / N_DRAWS, abs=1e-9)
    assert jc.p_infeasible == 0.0 and jc.n_draws == N_DRAWS
    # Where it is not optimal the regret is exactly 1.0 - 0.5 in min fulfillment.
    np.testing.assert_allclose(jc.regret_min_fulfillment[~jc.eps_optimal], 0.5, atol=1e-3)
    # The threatening cell is the unmeasured hinge.
    assert jc.threat[1] == pytest.approx(good / N_DRAWS) and jc.threat[[0, 2, 3]].sum() == 0


def test_p_slo_met_counts_redrawn_committed_cells_against_their_limits() -> None:
    lat = _latent(0.0)
    measured = np.ones(4, bool)
    obs = lat[0].copy()
    obs[0, 1] = 0.999  # committed cell measured right at its 1.0 s TTFT limit
    cand = allocate_milp(GRID, obs, PROBLEM)
    assert int(cand.cell[0]) == 0
    noise = np.full((N_DRAWS, 4), 0.1)
    jc = joint_check(GRID, PROBLEM, cand, lat, noise, obs, measured, 0.05, seed=3)
    assert jc.p_epsilon_optimal == 1.0  # measured cells are judged as measured
    assert 0.35 < jc.p_slo_met < 0.65  # a re-measurement fails about half the time


def test_infeasible_call_is_checked_against_draws_that_can_meet_the_floors() -> None:
    lat = _latent(0.25)
    problem = PROBLEM._replace(critical=np.array([True]), floor=np.array([0.9]))
    measured = np.array([True, False, True, True])
    obs = np.where(measured[:, None], lat[0], np.nan)
    jc = joint_check(GRID, problem, None, lat, TINY, obs, measured, 0.05, seed=0)
    # Only draws where cell 1 passes can serve 0.9 x 4 req/s (2 replicas x 2 req/s).
    assert jc.p_infeasible == pytest.approx(0.75)
    assert jc.p_epsilon_optimal == pytest.approx(0.75)


def _cert(status: str) -> Certificate:
    return Certificate(status, Gap(0.0, 0.0, 0.0), (), "interval rule")


def test_apply_joint_check_downgrades_below_one_minus_risk() -> None:
    lat = _latent(0.1)
    measured = np.array([True, False, True, True])
    obs = np.where(measured[:, None], lat[0], np.nan)
    cand = allocate_milp(GRID, np.where(measured[:, None], lat[-1], [0, np.inf, np.inf, 0]), PROBLEM)
    jc = joint_check(GRID, PROBLEM, cand, lat, TINY, obs, measured, 0.05)
    assert jc.p_epsilon_optimal == pytest.approx(0.9)
    assert apply_joint_check(_cert(CERTIFIED_FEASIBLE), jc, risk=0.05).status == UNDECIDED
    kept = apply_joint_check(_cert(CERTIFIED_FEASIBLE), jc, risk=0.15)
    assert kept.status == CERTIFIED_FEASIBLE and "joint check 0.900" in kept.reason
    assert apply_joint_check(_cert(CERTIFIED_INFEASIBLE), jc, risk=0.05).status == UNDECIDED
    assert apply_joint_check(_cert(UNDECIDED), jc, risk=0.05).reason == "interval rule"


def test_regret_acquisition_measures_the_hinge_cell() -> None:
    lat = _latent(0.5)
    measured = np.array([True, False, True, False])
    obs = np.where(measured[:, None], lat[0], np.nan)
    cand = allocate_milp(GRID, np.where(measured[:, None], lat[-1], [0, np.inf, np.inf, 0]), PROBLEM)
    noise = np.full((N_DRAWS, 4), 0.05)
    rs = regret_scores(GRID, PROBLEM, cand, lat, noise, obs, measured, seed=0, n_fantasies=16)
    assert np.isneginf(rs.score[[0, 2]]).all()
    # Now: either action is wrong in half the draws, each miss costs 0.5 in min
    # fulfillment + 0.5 in goodput/Σλ; measuring cell 1 reveals which holds.
    assert rs.expected_regret_now == pytest.approx(0.5, abs=0.05)
    assert rs.score[1] == pytest.approx(rs.expected_regret_now, abs=0.05)
    assert abs(rs.score[3]) < 0.02  # TP4@hi never matters
    assert select_by_regret(rs, GRID.cost_gpu_s) == 1
    # The refit side of the accuracy benchmark: each action's expected regret
    # on the same draws; its minimum is the kernel's "now".
    per_action = expected_regret(GRID, PROBLEM, rs.actions, lat, noise, obs, measured, seed=0)
    assert per_action.shape == (rs.n_actions,)
    assert per_action.min() == pytest.approx(rs.expected_regret_now, rel=1e-5)
    # Knowing cell 1 (its value in draw 0, where it passes) leaves no regret for the best action.
    known = measured.copy()
    known[1] = True
    assert expected_regret(GRID, PROBLEM, rs.actions, lat[:1], noise[:1], lat[0], known).min() == pytest.approx(0.0)
    # Nothing left to learn: no cell is selected.
    settled = _latent(0.0)
    rs0 = regret_scores(GRID, PROBLEM, cand, settled, noise, obs, measured, seed=0, n_fantasies=16)
    assert select_by_regret(rs0, GRID.cost_gpu_s) is None


def test_convergence_diagnostics_flag_unmixed_chains_and_divergences() -> None:
    rng = np.random.default_rng(0)
    good = {"latent": rng.standard_normal((4, 1000, 3, 2)), "knee": rng.standard_normal((4, 1000, 2))}
    d = convergence_diagnostics(good, np.zeros((4, 1000), bool))
    assert d["r_hat_max"] < 1.01 and d["ess_bulk_min"] > 2000 and d["divergences"] == 0
    assert _passes(d, CONVERGENCE)
    stuck = {k: v.copy() for k, v in good.items()}
    stuck["latent"][0, :, 1, 0] += 3.0  # one chain elsewhere for one cell's metric
    d2 = convergence_diagnostics(stuck, np.zeros((4, 1000), bool))
    assert d2["r_hat_max"] > 1.1 and d2["worst_r_hat_site"] == "latent" and not _passes(d2, CONVERGENCE)
    div = np.zeros((4, 1000), bool)
    div[2, 17] = True
    d3 = convergence_diagnostics(good, div)
    assert d3["divergences"] == 1 and not _passes(d3, CONVERGENCE)
    # A constant quantity (a clipped tail) has no r_hat: skipped, not a failure,
    # and nothing is printed about it (a campaign's stderr is for its own messages).
    flat = {**good, "capacity": np.ones((4, 1000, 3)), "const": np.ones((4, 1000))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _passes(convergence_diagnostics(flat, np.zeros((4, 1000), bool)), CONVERGENCE)


def test_diagnose_reports_a_constant_parameter_without_r_hat_and_without_a_warning() -> None:
    import arviz as az

    from fleetsieve_bayes.model.diagnostics import summarize

    rng = np.random.default_rng(1)
    idata = az.from_dict(posterior={"knee": rng.standard_normal((2, 500)), "clipped": np.ones((2, 500))})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = {r["name"]: r for r in summarize(idata)["parameters"]}
    assert rows["clipped"]["r_hat"] is None and rows["knee"]["r_hat"] < 1.02


@pytest.mark.slow
def test_certifying_fit_converges_on_the_shipped_grid() -> None:
    from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
    from fleetsieve_bayes.model.converged_fit import fit_certifying
    from fleetsieve_bayes.model.diagnostics import summarize
    from fleetsieve_bayes.resources import data_dir
    from fleetsieve_bayes.table import read_table

    path = data_dir("examples") / "h100_31b_fp8" / "grid.csv"
    df = read_table(path)
    grid = grid_from_table(df, ("chat", "code"))
    values = values_from_table(grid, df)
    measured = np.zeros(grid.n_cells, bool)
    measured[[0, 3, 5, 7, 12, 15, 17, 19]] = True
    cf = fit_certifying(grid, np.where(measured[:, None], values, np.nan), measured, "dense-31b-fp8-h100", seed=0)
    assert cf.converged, cf.diagnostics
    s = summarize(cf.posterior.idata)  # what `diagnose` reports
    assert s["r_hat_max"] <= 1.01 and s["ess_bulk_min"] >= 400 and s["divergences"] == 0


def test_stopping_risk_is_read_and_checked(tmp_path) -> None:
    from pathlib import Path

    from fleetsieve_bayes.campaign.config import parse_campaign
    from fleetsieve_bayes.errors import InputError

    raw = {
        "name": "x",
        "fleet": {"gpus": 4},
        "model": {"family": "generic"},
        "measurement": {"backend": "none"},
        "stopping": {"risk": 0.1},
        "workloads": [{"name": "chat", "demand_rps": 1.0, "slo": {"success_min": 0.99}}],
    }
    assert parse_campaign(raw, Path(tmp_path / "c.toml")).risk == 0.1
    del raw["stopping"]["risk"]
    assert parse_campaign(raw, Path(tmp_path / "c.toml")).risk == 0.05
    raw["stopping"]["risk"] = 1.5
    with pytest.raises(InputError, match=r"\[stopping\] risk"):
        parse_campaign(raw, Path(tmp_path / "c.toml"))


def test_convergence_is_judged_on_what_the_decision_reads() -> None:
    # Cell 1 was measured as a start-up OOM: its latent metrics are a
    # counterfactual no data pins down, and chains may disagree on it for ever.
    # The cells a decision reads (measured-working 0, unmeasured 2) mix.
    from fleetsieve_bayes.model.joint import model_data

    grid = CellGrid(
        workloads=("a",),
        workload_idx=np.zeros(3, np.int64),
        tp=np.array([1, 2, 4]),
        load=("C1", "C1", "C1"),
        offered_rps=np.array([1.0, 2.0, 4.0]),
        duration_s=np.full(3, 300.0),
    )
    observed = np.array([[1.0, 0.5, 5.0, 0.99], [0.0, 0.0, 0.0, 0.0], [np.nan] * 4])
    data = model_data(grid, observed, np.array([True, True, False]))
    rng = np.random.default_rng(0)
    latent = np.exp(rng.normal(0.0, 0.1, (4, 500, 3, 4)))
    latent[:, :, 1, 0] += np.arange(4)[:, None]  # chains far apart on the failed cell
    samples = {"latent": latent, "noise": np.exp(rng.normal(-3.0, 0.1, (4, 500, 4)))}
    diverging = np.zeros((4, 500), bool)
    assert convergence_diagnostics(samples, diverging)["r_hat_max"] > 1.5
    kept = decision_samples(samples, failed_cells(np.asarray(data.measured), np.asarray(data.fit_mask)))
    assert kept["latent"].shape == (4, 500, 2, 4)
    assert _passes(convergence_diagnostics(kept, diverging), CONVERGENCE)


def test_minor_mode_chains_are_the_ones_far_below_the_best_log_density() -> None:
    from fleetsieve_bayes.model.converged_fit import minor_mode_chains

    rng = np.random.default_rng(1)
    lp = rng.normal(-25.0, 3.0, (4, 400))
    assert minor_mode_chains(lp) == {}  # chains that agree are left alone
    lp[1] -= 20.0  # one chain 20 nats down: the shipped failure of a hard suite fleet
    assert minor_mode_chains(lp) == {1: 0}
    lp[2] -= 20.0
    lp[3] -= 20.0  # three stuck chains restart from the one good chain
    assert minor_mode_chains(lp) == {1: 0, 2: 0, 3: 0}
    close = rng.normal(-25.0, 3.0, (4, 400))
    close[2] -= 6.0  # overlapping ranges: slow mixing, not a minor mode
    assert minor_mode_chains(close) == {}


def test_sampling_more_stops_when_the_projected_ess_cannot_reach_the_target() -> None:
    from fleetsieve_bayes.model.converged_fit import _hopeless
    from fleetsieve_bayes.model.inference import load_preset

    preset = load_preset("certify")  # 400 draws per chain and extension
    rng = np.random.default_rng(2)
    stats = {"lp": rng.normal(-25.0, 3.0, (4, 800)), "diverging": np.zeros((4, 800), bool)}
    # 800 draws per chain: ESS 65 projects to 800·400/65 ≈ 4,900 draws ≤ 400·13 = 5,200: keep sampling.
    assert not _hopeless({"ess_bulk_min": 65.0}, stats, preset, 12, CONVERGENCE)
    # ESS 50 projects to 6,400 > 5,200: stop; with fewer extensions allowed, stop sooner.
    assert _hopeless({"ess_bulk_min": 50.0}, stats, preset, 12, CONVERGENCE)
    assert _hopeless({"ess_bulk_min": 65.0}, stats, preset, 3, CONVERGENCE)
    assert _hopeless({"ess_bulk_min": None}, stats, preset, 12, CONVERGENCE)
    # Chains in different modes are restarted, not judged by their ESS.
    stats["lp"][1] -= 20.0
    assert not _hopeless({"ess_bulk_min": 5.0}, stats, preset, 12, CONVERGENCE)
