"""The window-noise model: several windows per cell, SLO attainment, the level rule."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special, stats

from fleetsieve_bayes.allocation.problem import grid_from_table, meets_slo, values_from_table
from fleetsieve_bayes.decision.intervals import (
    POINT,
    admissible_at_level,
    check_level,
    level_tables,
)
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.joint import (
    ROW_BUCKET,
    WINDOW_COLUMNS,
    _burst_logpdf,
    _burst_sf,
    _compound_loglik,
    model_data,
    to_transformed,
    window_attainment,
    window_probabilities,
    window_rows,
    window_scales,
)
from fleetsieve_bayes.model.priors import load_card, parse_card
from fleetsieve_bayes.table import read_table


def _np_burst_logpdf(x: np.ndarray, sd: float, p: float, drop: float) -> np.ndarray:
    """The burst mixture's log density in NumPy, written from its definition (a normal, or
    a normal minus an exponential of mean ``drop``), for the integrals the tests take."""
    lam = 1.0 / drop
    core = stats.norm(0, sd).logpdf(x)
    burst = math.log(lam) + 0.5 * (lam * sd) ** 2 + lam * x + special.log_ndtr(-x / sd - lam * sd)
    return np.logaddexp(math.log1p(-p) + core, math.log(p) + burst)

GRID_CSV = "examples/h100_8b_bf16/grid_synthetic.csv"


@settings(max_examples=25, deadline=None)
@given(
    n_rows=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    a=st.floats(0.01, 1.0),
    b=st.floats(0.01, 1.0),
    seed=st.integers(0, 10_000),
)
def test_compound_loglik_is_the_multivariate_normal_of_each_cells_windows(n_rows, a, b, seed):
    # y_r = μ + δ_c + ε_r with δ_c ~ N(0, a²) shared by a cell's windows: the
    # closed form must equal the joint normal density with covariance b²I + a²11'.
    rng = np.random.default_rng(seed)
    cell = np.repeat(np.arange(len(n_rows)), n_rows)
    d = rng.normal(0.0, 0.5, (cell.size, 1))
    bs = np.full((len(n_rows), 1), b)
    got = float(_compound_loglik(jnp.asarray(d), jnp.ones_like(jnp.asarray(d)), jnp.asarray(cell), len(n_rows), jnp.asarray([a]), jnp.asarray(bs)))
    want = 0.0
    for c, n in enumerate(n_rows):
        if n:
            cov = b * b * np.eye(n) + a * a * np.ones((n, n))
            want += stats.multivariate_normal(np.zeros(n), cov).logpdf(d[cell == c, 0])
    assert got == pytest.approx(want, rel=1e-4, abs=1e-3)


def test_a_masked_window_counts_as_absent():
    d = jnp.asarray([[0.3], [0.1], [-0.2]])
    cell = jnp.asarray([0, 0, 1])
    a, b = jnp.asarray([0.2]), jnp.full((2, 1), 0.1)
    masked = _compound_loglik(d, jnp.asarray([[1.0], [0.0], [1.0]]), cell, 2, a, b)
    dropped = _compound_loglik(d[jnp.array([0, 2])], jnp.ones((2, 1)), cell[jnp.array([0, 2])], 2, a, b)
    assert float(masked) == pytest.approx(float(dropped), rel=1e-6)


@pytest.mark.parametrize(("sd", "p", "drop"), [(0.3, 0.05, 1.5), (0.1, 0.3, 3.0), (1.0, 0.5, 0.5)])
def test_burst_mixture_density_integrates_to_one_and_matches_its_survival(sd, p, drop):
    pdf = lambda x: float(jnp.exp(_burst_logpdf(jnp.asarray(x), jnp.asarray(sd), jnp.asarray(p), jnp.asarray(drop))))  # noqa: E731
    total, _ = integrate.quad(pdf, -60, 20, points=[0.0], limit=200)
    assert total == pytest.approx(1.0, abs=1e-5)
    xs = np.linspace(-8.0, 3.0, 23)  # the NumPy twin the integrals below use is the same density
    assert np.exp(_np_burst_logpdf(xs, sd, p, drop)) == pytest.approx([pdf(x) for x in xs], rel=1e-4, abs=1e-12)
    for x in (-1.0, 0.0, 0.7, 2.5):
        # P(residual ≥ −x): the density integrated from −x upwards
        upper, _ = integrate.quad(pdf, -x, 20, limit=200)
        assert float(_burst_sf(jnp.asarray(x), jnp.asarray(sd), jnp.asarray(p), jnp.asarray(drop))) == pytest.approx(upper, abs=1e-5)


def test_burst_mixture_drops_success_in_a_burst_not_as_a_wide_normal():
    # The paper's 94.3 % window among ~99 % windows: a drop of ~1.8 on the logit.
    # Under the mixture it is plausible; under a normal with the ordinary scatter
    # it is a 6-sigma event.
    x = math.log(0.943 / 0.057) - math.log(0.99 / 0.01)
    mix = float(_burst_logpdf(jnp.asarray(x), jnp.asarray(0.3), jnp.asarray(0.05), jnp.asarray(1.5)))
    normal = stats.norm(0, 0.3).logpdf(x)
    assert mix > normal + 10
    # ... and no burst pushes success up: the right tail is the normal's.
    up = float(_burst_logpdf(jnp.asarray(1.5), jnp.asarray(0.3), jnp.asarray(0.05), jnp.asarray(1.5)))
    assert up == pytest.approx(math.log(0.95) + stats.norm(0, 0.3).logpdf(1.5), abs=0.05)


def test_tail_window_noise_grows_near_and_past_the_knee():
    card = load_card("generic")
    g, z = jnp.zeros(7), jnp.zeros((1, 6))
    rho = jnp.asarray([0.2, 0.5, 0.85, 1.0, 2.0])
    w = np.asarray(window_scales(card, g, z, jnp.log(rho), jnp.zeros(5, jnp.int32)))
    assert w.shape == (5, len(WINDOW_COLUMNS))
    tails = w[:, 1]
    assert np.all(np.diff(tails) > 0)
    assert tails[0] == pytest.approx(card.window_tail_light_sd, rel=0.01)
    assert tails[-1] == pytest.approx(card.window_tail_light_sd + card.window_tail_knee_sd, rel=0.01)
    assert np.all(w[:, 0] == pytest.approx(card.window_throughput_sd))
    assert w[0, 4] == pytest.approx(card.window_burst_probability, rel=1e-5)


def test_attainment_agrees_with_simulated_windows():
    # One cell, the window noise known and no curve discrepancy left (a → 0):
    # the analytic attainment is the share of simulated windows meeting the SLOs.
    latent = jnp.asarray([[[5.0, 0.9, 20.0, 0.995]]])
    noise = jnp.asarray([[1e-6, 1e-6, 1e-6, 1e-6]])
    window = jnp.asarray([[[0.01, 0.15, 0.1, 0.4, 0.1, 2.0]]])
    rows = window_rows(np.ones((0, 4)), np.zeros(0, int), np.zeros(1, bool))
    lim = (jnp.asarray([0.99]), jnp.asarray([1.0]), jnp.asarray([22.0]))
    att = float(window_attainment(jax.random.PRNGKey(0), latent, noise, window, rows, *lim)[0, 0])
    rng = np.random.default_rng(1)
    n = 400_000
    ttft = 0.9 * np.exp(0.15 * rng.normal(size=n))
    comp = 20.0 * np.exp(0.1 * rng.normal(size=n))
    logit = math.log(0.995 / 0.005) + 0.4 * rng.normal(size=n) - (rng.random(n) < 0.1) * rng.exponential(2.0, n)
    succ = 1 / (1 + np.exp(-logit))
    mc = np.mean((ttft <= 1.0) & (comp <= 22.0) & (succ >= 0.99))
    assert att == pytest.approx(mc, abs=0.004)


def test_attainment_of_a_measured_cell_follows_its_windows():
    # Windows far above the curve move the cell's truth there (δ's posterior):
    # three windows at 1.3 s against an SLO of 1 s make the cell fail, while the
    # curve alone (0.8 s) would pass it.
    n = 4000
    latent = jnp.broadcast_to(jnp.asarray([5.0, 0.8, 10.0, 0.999]), (n, 2, 4))
    noise = jnp.broadcast_to(jnp.asarray([0.01, 0.3, 0.3, 0.1]), (n, 4))
    window = jnp.broadcast_to(jnp.asarray([0.01, 0.05, 0.05, 0.3, 0.01, 1.0]), (n, 2, 6))
    rows = window_rows(np.array([[5.0, 1.3, 10.0, 0.999]] * 3), np.zeros(3, int), np.array([True, False]))
    lim = (jnp.full(2, 0.99), jnp.full(2, 1.0), jnp.full(2, jnp.inf))
    p = np.asarray(window_probabilities(jax.random.PRNGKey(3), latent, noise, window, rows, *lim))
    assert np.median(p[:, 0, 1]) < 0.01  # measured at 1.3 s, three times
    # unmeasured: the curve's 0.8 s with the discrepancy's prior N(0, 0.3²) around
    # it; averaged over draws, Φ(log(1/0.8) / sqrt(0.3² + 0.05²))
    want = stats.norm.cdf(math.log(1.25) / math.hypot(0.3, 0.05))
    assert p[:, 1, 1].mean() == pytest.approx(want, abs=0.02)
    # deterministic for a key
    again = np.asarray(window_probabilities(jax.random.PRNGKey(3), latent, noise, window, rows, *lim))
    np.testing.assert_array_equal(p, again)


def test_window_rows_pad_and_mask():
    rows = window_rows(np.ones((3, 4)), np.array([0, 0, 2]), np.array([True, False, True]))
    assert rows.rows.shape == (ROW_BUCKET, 4) and rows.mask[3:].sum() == 0 and rows.mask[:3].all()
    with pytest.raises(ValueError, match="outside the grid"):
        window_rows(np.ones((1, 4)), np.array([5]), np.array([True, True]))
    # a row of a cell not measured does not enter
    assert not window_rows(np.ones((1, 4)), np.array([1]), np.array([True, False])).mask[0].any()
    # a failed window (0 throughput) does not enter the likelihood
    r = window_rows(np.array([[0.0, 1.0, 1.0, 0.0], [5.0, 1.0, 1.0, 1.0]]), np.array([0, 0]), np.array([True]))
    assert not r.mask[0].any() and r.mask[1].all()


def test_model_data_carries_windows_only_when_given():
    df = read_table(GRID_CSV)
    grid = grid_from_table(df, ("chat", "summarize"))
    obs = values_from_table(grid, df)
    meas = np.zeros(grid.n_cells, bool)
    meas[:3] = True
    assert model_data(grid, obs, meas).windows is None
    d = model_data(grid, obs, meas, rows=obs[[0, 0, 1, 2]], row_cell=np.array([0, 0, 1, 2]))
    assert d.windows is not None and int(d.windows.mask[:, 0].sum()) == 4


def test_level_rule_and_tables():
    att = np.array([0.95, 0.9, 0.89])
    assert admissible_at_level(att, 0.9).tolist() == [True, True, False]
    cons = np.array([[2.0, 1.5, 30.0, 0.95]] * 3)  # fails on its metrics
    smin, tmax, cmax = np.full(3, 0.99), np.full(3, 1.0), np.full(3, np.inf)
    lo, hi = np.array([0.95, 0.5, 0.1]), np.array([0.99, 0.95, 0.5])
    c2, o2 = level_tables(cons, cons, lo, hi, 0.9, smin, tmax, cmax)
    assert meets_slo(c2, smin, tmax, cmax).tolist() == [True, False, False]
    assert meets_slo(o2, smin, tmax, cmax).tolist() == [True, True, False]
    assert c2[0, 0] == 2.0 and o2[1, 0] == 2.0 and c2[1, 0] == 0.0  # throughput kept where admissible
    # per-cell levels (per-class overrides)
    assert admissible_at_level(att, np.array([0.5, 0.95, 0.5])).tolist() == [True, False, True]


def test_check_level_names_the_field():
    assert check_level("point", "f") == POINT and check_level(0.9, "f") == 0.9
    for bad in (0.0, 1.0, 1.5, -0.1, "median", True, float("nan")):
        with pytest.raises(ValueError, match="^f must"):
            check_level(bad, "f")


def test_card_window_keys_are_checked():
    with pytest.raises(InputError, match=r"did you mean window.'burst_probability'"):
        parse_card({"window": {"burst_probabilty": 0.1}}, __import__("pathlib").Path("c.toml"))
    with pytest.raises(InputError, match="window.knee_utilisation"):
        parse_card({"window": {"knee_utilisation": 2.5}}, __import__("pathlib").Path("c.toml"))
    with pytest.raises(InputError, match="window.burst_probability"):
        parse_card({"window": {"burst_probability": 1.0}}, __import__("pathlib").Path("c.toml"))


def test_synthetic_windows_scatter_as_their_true_attainment_says():
    from fleetsieve_bayes.evaluation.synthetic import true_attainment, window_draws

    rng = np.random.default_rng(0)
    w = {"light": 0.04, "knee": 0.2, "success_sd": 0.4, "burst": 0.06, "drop": 1.5, "throughput": 0.01}
    truth = np.array([[5.0, 0.9, 10.0, 0.995], [5.0, 1.0, 10.0, 0.999], [5.0, 0.5, 12.0, 0.992]])
    rho = np.array([0.9, 0.8, 1.2])
    slo = {"success_min": 0.99, "ttft_p99_s": 1.0, "completion_p99_s": 11.0}
    d = window_draws(rng, truth, np.full(3, 10.0), rho, w, 100_000)
    ok = (d[..., 3] >= 0.99) & (d[..., 1] <= 1.0) & (d[..., 2] <= 11.0)
    np.testing.assert_allclose(ok.mean(0), true_attainment(truth, rho, w, slo), atol=0.006)
    # tails scatter more past the knee than at light load; throughput barely moves
    light = window_draws(rng, truth[:1], np.full(1, 10.0), np.array([0.2]), w, 20_000)
    assert np.log(d[:, 2, 1]).std() > 3 * np.log(light[:, 0, 1]).std()
    assert np.log(d[:, 0, 0]).std() < 0.012


def test_synthetic_suite_with_window_noise_has_replicate_rows():
    from fleetsieve_bayes.evaluation.synthetic import random_spec, synthetic_fleet

    spec = random_spec(np.random.default_rng(5))._replace(window_noise=True, windows=3)
    table, _ = synthetic_fleet(np.random.default_rng(5), spec)
    per_cell = table.groupby(["workload", "tp", "load"])["replicate"].apply(list)
    assert all(r == [0, 1, 2] for r in per_cell)
    assert table.groupby(["workload", "tp", "load"])["true_attainment"].nunique().max() == 1
    assert table["true_attainment"].between(0, 1).all()
    # without window noise the suite is unchanged (same rows for a seed)
    plain, _ = synthetic_fleet(np.random.default_rng(5), random_spec(np.random.default_rng(5)))
    assert "replicate" not in plain.columns


class _Post:
    """A window-noise posterior built by hand (the fields the decision reads)."""

    def __init__(self, latent, noise, window, windows):
        self.latent, self.noise, self.window, self.windows = latent, noise, window, windows


def _shipped_level_state():
    from fleetsieve_bayes.campaign.config import load_campaign

    camp = load_campaign("examples/h100_31b_fp8/campaign.toml")
    df = read_table(camp.measurement.table)
    grid = grid_from_table(df, camp.workload_names)
    obs = values_from_table(grid, df)
    problem = camp.problem()
    rng = np.random.default_rng(0)
    d = 64
    latent = obs[None] * np.exp(rng.normal(0, 0.05, (d, grid.n_cells, 4)))
    latent[..., 3] = np.clip(obs[None, :, 3] + rng.normal(0, 0.001, (d, grid.n_cells)), 0.5, 0.9999)
    noise = np.tile([0.03, 0.1, 0.1, 0.3], (d, 1))
    window = np.tile([0.01, 0.08, 0.08, 0.3, 0.03, 1.5], (d, grid.n_cells, 1))
    meas = np.zeros(grid.n_cells, bool)
    meas[::2] = True
    cells = np.flatnonzero(meas)
    post = _Post(latent, noise, window, window_rows(obs[cells], cells, meas))
    return grid, problem, obs, meas, post


def test_level_bounds_and_the_acquisition_read_one_rule():
    from fleetsieve_bayes.decision.acquisition import level_inputs, make_acquisition
    from fleetsieve_bayes.decision.bounds import cell_levels, level_bounds
    from fleetsieve_bayes.decision.intervals import DEFAULT_RULES

    grid, problem, obs, meas, post = _shipped_level_state()
    levels = cell_levels(grid, 0.9)
    bounds, att, cons, opt = level_bounds(post, grid, problem, obs, meas, 0.9, 0.0, DEFAULT_RULES, levels)
    w = grid.workload_idx
    lim = (problem.success_min[w], problem.ttft_max[w], problem.completion_max[w])
    assert np.all(att.lo <= att.median + 1e-12) and np.all(att.median <= att.hi + 1e-12)
    # the tables say exactly what the level rule says
    np.testing.assert_array_equal(meets_slo(cons, *lim), admissible_at_level(att.lo, levels))
    np.testing.assert_array_equal(meets_slo(opt, *lim), admissible_at_level(att.hi, levels))
    # a cell whose windows sit far beyond the TTFT limit attains ~0
    over = int(np.argmax(obs[:, 1] / lim[1]))
    assert obs[over, 1] > 2 * lim[1][over] and att.hi[over] < 0.01
    acq = make_acquisition(grid, problem, n_fantasies=4)
    repeatable = meas.copy()
    repeatable[0] = False
    li = level_inputs(post, att, grid, problem, levels, repeatable)
    args = (jax.random.PRNGKey(0), jnp.asarray(post.latent), jnp.asarray(post.noise), jnp.asarray(obs), jnp.asarray(meas))
    sc = acq.score(*args, li)
    s = np.asarray(sc.score)
    assert s[0] == -np.inf  # measured, no repeat left
    assert np.all(np.isfinite(s[1:]))  # the rest: unmeasured cells and repeats
    # at the point rule measured cells are never candidates
    s0 = np.asarray(acq.score(*args).score)
    assert np.all(s0[meas] == -np.inf) and np.all(np.isfinite(s0[~meas]))


def test_a_measured_cell_that_never_served_attains_nothing_at_a_level():
    # A start-up OOM window (all zeros) and a cell known to OOM without a window of its
    # own: the posterior knows nothing of either, yet neither may be admissible, in any
    # table or draw (at "point" their measured zeros say the same).
    from fleetsieve_bayes.decision.bounds import cell_levels, level_bounds
    from fleetsieve_bayes.decision.intervals import DEFAULT_RULES
    from fleetsieve_bayes.decision.regret_acquisition import level_regret_inputs
    from fleetsieve_bayes.model.joint import served_nothing

    grid, problem, obs, meas, post = _shipped_level_state()
    good = np.flatnonzero(meas)
    oom, known = np.flatnonzero(~meas)[:2]
    obs = obs.copy()
    obs[[oom, known]] = 0.0
    meas = meas.copy()
    meas[[oom, known]] = True
    cells = np.concatenate([good, [oom]])
    post = _Post(post.latent, post.noise, post.window, window_rows(obs[cells], cells, meas))
    assert np.flatnonzero(served_nothing(post.windows, meas, obs)).tolist() == sorted([oom, known])
    # a cell believed measured (in flight, at its believed values) without a window is not one
    believed = meas.copy()
    spare = np.flatnonzero(~meas)[0]
    believed[spare] = True
    assert not served_nothing(post.windows, believed, obs)[spare]
    levels = cell_levels(grid, 0.9)
    bounds, att, cons, opt = level_bounds(post, grid, problem, obs, meas, 0.9, 0.0, DEFAULT_RULES, levels)
    for c in (oom, known):
        assert att.hi[c] == 0.0 and not att.draws[:, c].any() and not att.hi_draws[:, c].any()
        assert opt[c, 0] == 0.0 and cons[c, 0] == 0.0
        np.testing.assert_array_equal(bounds.hi[c], obs[c])
    # a cell that served keeps its posterior's attainment
    assert att.hi[good].max() > 0.0
    lr = level_regret_inputs(post, grid, problem, levels, np.zeros(grid.n_cells, bool), measured=meas, observed=obs)
    assert not np.asarray(lr.attainment)[:, [oom, known]].any()
    assert np.asarray(lr.attainment)[:, good].max() > 0.0


def test_joint_check_at_a_level_reads_the_draws_attainment():
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.decision.bounds import cell_levels, level_bounds
    from fleetsieve_bayes.decision.certificate import CERTIFIED_FEASIBLE, UNDECIDED, Certificate
    from fleetsieve_bayes.decision.intervals import DEFAULT_RULES
    from fleetsieve_bayes.decision.joint_check import apply_joint_check, joint_check

    grid, problem, obs, meas, post = _shipped_level_state()
    levels = cell_levels(grid, 0.9)
    _, att, cons, _ = level_bounds(post, grid, problem, obs, meas, 0.9, 0.0, DEFAULT_RULES, levels)
    # an allocation on the optimistic end commits to cells whose attainment is uncertain
    cand = allocate_milp(grid, np.where(np.isfinite(obs), obs, 0.0), problem)
    assert cand.feasible
    committed = cand.committed()
    check = joint_check(
        grid, problem, cand, post.latent, post.noise, obs, meas, 0.05, attainment=att.draws, levels=levels
    )
    want = np.mean(np.all(att.draws[:, committed] >= 0.9, axis=1))
    assert check.p_slo_met == pytest.approx(want)
    cert = Certificate(CERTIFIED_FEASIBLE, None, (), "ok")
    out = apply_joint_check(cert, check._replace(p_epsilon_optimal=1.0, p_slo_met=0.49), 0.05, require_slo=True)
    assert out.status == UNDECIDED and "P(SLO met) = 0.490" in out.reason
    # the point rule keeps today's: P(SLO met) does not gate the verdict
    assert apply_joint_check(cert, check._replace(p_epsilon_optimal=1.0, p_slo_met=0.49), 0.05).status == CERTIFIED_FEASIBLE


@pytest.mark.parametrize(
    ("d", "a", "sd"),
    [
        ((0.3, -1.5, 0.1), 0.2, 0.3),  # one window in a burst
        ((0.3, -1.5, 0.1), 0.8, 0.3),
        ((0.3, -1.5, 0.1), 0.8, 0.05),
        ((0.3, -1.5, 0.1), 1.5, 0.2),
        ((-3.0, -2.5, -4.0), 0.8, 0.05),  # every window far below the curve
        ((-6.0, -5.0, -7.0), 0.5, 0.1),
        ((-3.0, -2.5), 0.8, 0.05),
        ((0.1, 0.0, -0.1, 0.05, -2.0), 0.8, 0.05),  # more windows than are labelled
        ((-3.0, -2.5, -4.0, -3.3, 0.2), 0.8, 0.05),
        ((0.5, 0.4), 0.8, 0.05),
    ],
)
def test_success_departure_quadrature_integrates_a_cells_windows(d, a, sd):
    # A cell's windows share δ_s ~ N(0, a²): their joint density is the integral
    # of the product of burst-mixture densities, which the quadrature computes
    # whichever of the windows burst.
    from fleetsieve_bayes.model.joint import _success_node_loglik

    d = jnp.asarray(d)
    rank = jnp.asarray(np.argsort(np.argsort(-np.asarray(d), kind="stable")), jnp.int32)
    window = jnp.asarray([[0.01, 0.1, 0.1, sd, 0.05, 1.5]])
    n = d.shape[0]
    ls, _ = _success_node_loglik(d, jnp.ones(n, bool), jnp.zeros(n, jnp.int32), rank, 1, jnp.asarray(a), window)
    got = float(jax.nn.logsumexp(ls[0]))

    def integrand(x):
        f = math.exp(float(_np_burst_logpdf(np.asarray(d) - x, sd, 0.05, 1.5).sum()))
        return f * stats.norm(0, a).pdf(x)

    points = sorted({float(v) for v in np.asarray(d)})
    want = math.log(integrate.quad(integrand, -10 * a - 8, 10 * a + 2, points=points, limit=800)[0])
    assert got == pytest.approx(want, abs=0.03)


def test_window_rows_rank_a_cells_windows_from_the_highest():
    # the quadrature labels a cell's highest windows plain or burst: rank 0 is the highest
    rows = np.column_stack([np.ones((5, 3)), [0.9, 0.99, 0.95, 0.5, 0.97]])
    wr = window_rows(rows, np.array([0, 0, 0, 1, 1]), np.ones(2, bool))
    assert np.asarray(wr.rank)[:5].tolist() == [2, 0, 1, 1, 0]


@pytest.mark.parametrize(("a", "sd", "x"), [(0.2, 0.3, 0.1), (0.8, 0.05, -1.7), (1.5, 0.2, 2.0)])
def test_one_window_success_density_is_the_burst_mixture_widened_by_the_departure(a, sd, x):
    # δ_s ~ N(0, a²) plus a burst-mixture window: the closed form the likelihood uses
    # for a cell with one window, against the integral.
    want = math.log(integrate.quad(
        lambda t: math.exp(float(_np_burst_logpdf(np.asarray(x - t), sd, 0.05, 1.5))) * stats.norm(0, a).pdf(t),
        -10 * a, 10 * a, limit=400,
    )[0])
    got = float(_burst_logpdf(jnp.asarray(x), jnp.sqrt(sd**2 + a**2), jnp.asarray(0.05), jnp.asarray(1.5)))
    assert got == pytest.approx(want, abs=1e-6)


@settings(max_examples=20, deadline=None)
@given(counts=st.lists(st.integers(0, 3), min_size=2, max_size=6), seed=st.integers(0, 10_000))
def test_success_likelihood_split_agrees_with_quadrature_over_every_cell(counts, seed):
    # Cells with one window take the closed form (the burst mixture at sd √(sd² + a²)), the
    # rest Gauss-Hermite over their shared departure: the sum is exactly that, cell by cell.
    from fleetsieve_bayes.model.joint import (
        _burst_logpdf,
        _success_loglik,
        _success_node_loglik,
    )

    rng = np.random.default_rng(seed)
    n_cells = len(counts)
    cell = np.repeat(np.arange(n_cells), counts)
    rows = np.column_stack([
        np.ones((cell.size, 3)), 1 / (1 + np.exp(-rng.normal(3.0, 1.0, cell.size))),
    ]) if cell.size else np.zeros((0, 4))
    wr = window_rows(rows, cell, np.ones(n_cells, bool))
    window = jnp.asarray(np.column_stack([
        np.full((n_cells, 3), 0.1), rng.uniform(0.1, 0.5, n_cells), np.full(n_cells, 0.05), np.full(n_cells, 1.5),
    ]))
    d = to_transformed(wr.rows)[:, 3] - 3.0  # padding rows clipped, as in the model
    a = jnp.asarray(0.4)
    got = float(_success_loglik(d, wr, a, window))
    ls, _ = _success_node_loglik(d, wr.mask[:, 3], wr.cell, wr.rank, n_cells, a, window)
    per_cell = np.asarray(jax.nn.logsumexp(ls, axis=-1))
    n = np.bincount(cell, minlength=n_cells)
    want = float(per_cell[n > 1].sum())
    for r in np.flatnonzero(n[cell] == 1):
        c = cell[r]
        want += float(_burst_logpdf(d[r], jnp.sqrt(window[c, 3] ** 2 + a * a), window[c, 4], window[c, 5]))
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert int(wr.shared.shape[0]) % ROW_BUCKET == 0
    assert int(np.asarray(wr.shared_mask).sum()) == int(sum(c for c in counts if c > 1))


def _campaign_raw(**stopping):
    import tomllib
    from pathlib import Path

    raw = tomllib.loads(Path("examples/h100_31b_fp8/campaign.toml").read_text())
    raw.setdefault("stopping", {}).update(stopping)
    return raw


def test_slo_attainment_setting_is_parsed_and_checked():
    from pathlib import Path

    from fleetsieve_bayes.campaign.config import parse_campaign

    path = Path("examples/h100_31b_fp8/campaign.toml").resolve()
    assert parse_campaign(_campaign_raw(), path).slo_levels() == (0.9, 0.9)  # the default level
    assert parse_campaign(_campaign_raw(slo_attainment="point"), path).slo_levels() == POINT
    c = parse_campaign(_campaign_raw(slo_attainment=0.9, max_windows_per_cell=2), path)
    assert c.slo_levels() == (0.9, 0.9) and c.max_windows_per_cell == 2
    raw = _campaign_raw(slo_attainment=0.9)
    raw["workloads"][0]["slo_attainment"] = 0.95
    assert parse_campaign(raw, path).slo_levels() == (0.95, 0.9)
    for bad in (1.0, 0, "median"):
        with pytest.raises(InputError, match=r"\[stopping\] slo_attainment") as e:
            parse_campaign(_campaign_raw(slo_attainment=bad), path)
        assert "\n" not in str(e.value)
    raw = _campaign_raw(slo_attainment="point")
    raw["workloads"][1]["slo_attainment"] = 0.9
    with pytest.raises(InputError, match="slo_attainment: cannot mix"):
        parse_campaign(raw, path)
    with pytest.raises(InputError, match="max_windows_per_cell"):
        parse_campaign(_campaign_raw(max_windows_per_cell=0), path)


def test_at_level_sets_every_class_and_refuses_a_bad_level():
    from pathlib import Path

    from fleetsieve_bayes.campaign.config import parse_campaign

    path = Path("examples/h100_31b_fp8/campaign.toml").resolve()
    raw = _campaign_raw(slo_attainment=0.9)
    raw["workloads"][0]["slo_attainment"] = 0.95
    c = parse_campaign(raw, path)
    assert c.at_level("point").slo_levels() == POINT and c.at_level(0.5).slo_levels() == (0.5, 0.5)
    assert c.at_level(0.5).settings != c.settings and c.slo_levels() == (0.95, 0.9)
    for bad in (1.0, "median"):
        with pytest.raises(ValueError, match="slo_attainment") as e:
            c.at_level(bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("d", "a", "sd"),
    [((0.3, -1.5, 0.1), 0.8, 0.05), ((-3.0, -2.5, -4.0), 0.8, 0.05), ((0.5,), 0.5, 0.3), ((-2.0, -2.2), 0.3, 0.3)],
)
def test_success_offsets_draw_a_cells_departure_from_its_posterior(d, a, sd):
    # Given its windows, a measured cell's logit-success departure δ_s has the posterior
    # N(0, a²) × Π burst-mixture(d_i − δ_s); the draws' mean and sd match it on a dense grid.
    from fleetsieve_bayes.model.joint import success_offsets

    truth = 3.0
    rows = np.column_stack([np.ones((len(d), 3)), 1 / (1 + np.exp(-(truth + np.asarray(d))))])
    wr = window_rows(rows, np.zeros(len(d), np.int64), np.ones(2, bool))
    n_draws = 4000
    latent = jnp.asarray(np.tile([1.0, 1.0, 1.0, 1 / (1 + math.exp(-truth))], (n_draws, 2, 1)))
    noise = jnp.asarray(np.tile([0.1, 0.1, 0.1, a], (n_draws, 1)))
    window = jnp.asarray(np.tile([0.01, 0.1, 0.1, sd, 0.05, 1.5], (n_draws, 2, 1)))
    got = np.asarray(success_offsets(jax.random.PRNGKey(0), latent, noise, window, wr))
    xs = np.linspace(-12, 6, 90_001)
    dd = to_transformed(wr.rows)[: len(d), 3] - truth
    logp = sum(_np_burst_logpdf(float(di) - xs, sd, 0.05, 1.5) for di in np.asarray(dd))
    logp = logp + stats.norm(0, a).logpdf(xs)
    p = np.exp(logp - logp.max())
    p /= p.sum()
    mean = float((p * xs).sum())
    post_sd = math.sqrt(float((p * (xs - mean) ** 2).sum()))
    assert got[:, 0].mean() == pytest.approx(mean, abs=0.1 * post_sd)
    assert got[:, 0].std() == pytest.approx(post_sd, rel=0.15)
    # the cell never measured draws its prior
    assert got[:, 1].std() == pytest.approx(a, rel=0.05) and abs(got[:, 1].mean()) < 0.1 * a


def test_attainment_tables_read_one_draw_of_the_departures_as_three_separate_draws_would():
    # The margins and the knee guard move unmeasured cells only, whose departure is their
    # prior's: one draw of the departures gives each table what its own draw with the same
    # key gives (window_probabilities, which draws them afresh from the shifted curves).
    from fleetsieve_bayes.decision.bounds import _shift, attainment_bounds
    from fleetsieve_bayes.decision.intervals import DEFAULT_RULES
    from fleetsieve_bayes.model.joint import window_probabilities

    grid, problem, obs, meas, post = _shipped_level_state()
    att = attainment_bounds(post, grid, problem, obs, meas, 0.9, 0.0, DEFAULT_RULES, seed=3)
    w = grid.workload_idx
    lim = tuple(jnp.asarray(x) for x in (problem.success_min[w], problem.ttft_max[w], problem.completion_max[w]))
    key = jax.random.PRNGKey(3)

    def fresh(lat: np.ndarray) -> np.ndarray:
        return np.asarray(window_probabilities(key, jnp.asarray(lat), jnp.asarray(post.noise), jnp.asarray(post.window),
                                               post.windows, *lim), np.float64).prod(-1)

    r = DEFAULT_RULES
    np.testing.assert_allclose(att.draws, fresh(post.latent), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(att.lo_draws, fresh(_shift(post.latent, ~meas, r.tail_margin, r.success_margin, 1.0)),
                               rtol=1e-5, atol=1e-7)
    assert (att.draws[:, ~meas] != att.lo_draws[:, ~meas]).any()  # the margins did move them
