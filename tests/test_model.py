import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.infer import Predictive

from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.model.joint import (
    FAILURE_SHARPNESS,
    NOISE_DF,
    NOISE_DFS,
    OVERLOAD_CLASS_SD,
    OVERLOAD_LOG_MEDIAN,
    OVERLOAD_LOG_SD,
    class_param_count,
    fleet_model,
    from_transformed,
    latent_metrics,
    load_failures,
    model_data,
    obs_logpdf,
    sample_obs,
    to_transformed,
    usable_mask,
)
from fleetsieve_bayes.model.priors import load_card
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

GRID_CSV = data_dir("examples") / "h100_8b_bf16" / "grid_synthetic.csv"


@pytest.fixture(scope="module")
def grid_obs():
    df = read_table(GRID_CSV)
    grid = grid_from_table(df, ("chat", "summarize"))
    return grid, values_from_table(grid, df)


def test_obs_logpdf_matches_student_t():
    latent = jnp.array([[5.0, 0.5, 10.0, 0.99], [2.0, 1.5, 30.0, 0.9]])
    y = jnp.array([[4.8, 0.6, 9.0, 0.995], [2.1, 1.0, 35.0, 0.8]])
    noise = jnp.array([0.02, 0.2, 0.2, 0.5])
    want = dist.StudentT(np.asarray(NOISE_DFS), to_transformed(latent), noise).log_prob(to_transformed(y)).sum(-1)
    # atol: NumPyro's float32 lgamma((ν+1)/2) - lgamma(ν/2) at ν = 1000 is off by ~1e-4 (a constant)
    np.testing.assert_allclose(obs_logpdf(y, latent, noise), want, rtol=1e-5, atol=2e-4)
    assert obs_logpdf(y, latent, noise).shape == (2,)
    assert NOISE_DFS[1:] == (NOISE_DF,) * 3 and NOISE_DFS[0] >= 1000


def test_throughput_noise_is_gaussian_and_the_others_heavy_tailed():
    # Throughput: a precise 300 s average; tails and success: Student-t(5), so
    # one odd measurement does not drag a curve.
    latent = jnp.array([5.0, 0.5, 10.0, 0.5])
    y = sample_obs(jax.random.PRNGKey(1), jnp.broadcast_to(latent, (200_000, 4)), jnp.ones(4))
    eps = np.asarray(to_transformed(y) - to_transformed(latent))
    beyond4 = (np.abs(eps) > 4.0).sum(0)
    assert beyond4[0] < 100  # normal: ~13 of 200,000
    assert np.all(beyond4[1:] > 1000)  # t(5): ~2,000
    np.testing.assert_allclose(eps[:, 0].std(), 1.0, atol=0.01)


def test_sample_obs_round_trip_and_shapes():
    latent = jnp.array([5.0, 0.5, 10.0, 0.99])
    y = sample_obs(jax.random.PRNGKey(0), latent[None, None], jnp.full((300, 1, 4), 1e-6))
    assert y.shape == (300, 1, 4)
    np.testing.assert_allclose(np.asarray(y[0, 0]), np.asarray(latent), rtol=1e-4)
    z = to_transformed(latent)
    np.testing.assert_allclose(from_transformed(z), latent, rtol=1e-5)


def test_usable_mask_excludes_failures():
    obs = np.array([[1.0, 0.5, 5.0, 0.99], [0.0, np.inf, np.inf, 0.0], [1.0, np.inf, 5.0, 0.5], [1, 1, 1, 1.0]])
    m = usable_mask(obs, np.array([True, True, True, False]))
    np.testing.assert_array_equal(m[:, 0], [True, False, True, False])
    np.testing.assert_array_equal(m[2], [True, False, True, True])
    m2 = usable_mask(obs, np.array([True, True, True, False]), failed=np.array([True, False, False, False]))
    assert not m2[0].any()


def test_prior_predictive_shapes_and_knee_range(grid_obs):
    grid, obs = grid_obs
    data = model_data(grid, obs, np.zeros(grid.n_cells, bool))
    card = load_card("dense-8b-bf16-h100")
    pred = Predictive(lambda d: fleet_model(d, card, None), num_samples=200)(jax.random.PRNGKey(1), data)
    assert pred["latent"].shape == (200, grid.n_cells, 4)
    assert pred["y"].shape == (200, grid.n_cells, 4)
    lat = np.asarray(pred["latent"])
    assert np.all(np.isfinite(lat)) and np.all(lat[..., 0] > 0)
    assert np.all((lat[..., 3] >= 0) & (lat[..., 3] <= 1))
    # served throughput never exceeds the offered load (smooth-min)
    assert np.all(lat[..., 0] <= grid.offered_rps * (1 + 1e-5))
    knee = np.asarray(pred["knee"])
    assert knee.min() >= -0.5 - 1e-6 and knee.max() <= 3.5 + 1e-6
    # the card's knee (TP1.4, u≈0.49) is the prior's centre, well inside the range
    assert 0.2 < np.median(knee) < 0.9


@pytest.mark.parametrize("class_sd", [0.5, 0.05])
def test_sharpness_is_per_class_with_the_cards_spread(grid_obs, class_sd):
    """Saturation sharpness is a class-level parameter: the prior spread of the
    log ratio between two classes is √2 · ``[saturation] class_sd``, around the
    card's shared median."""
    import dataclasses
    import math

    grid, obs = grid_obs
    data = model_data(grid, obs, np.zeros(grid.n_cells, bool))
    card = dataclasses.replace(load_card("dense-8b-bf16-h100"), saturation_class_sd=class_sd)
    pred = Predictive(lambda d: fleet_model(d, card, None), num_samples=4000)(jax.random.PRNGKey(3), data)
    k = np.log(np.asarray(pred["sharpness"]))
    assert k.shape == (4000, grid.n_classes)
    assert np.std(k[:, 0] - k[:, 1]) == pytest.approx(math.sqrt(2) * class_sd, rel=0.08)
    total = math.hypot(card.saturation_sharpness_log_sd, class_sd)
    assert np.std(k[:, 0]) == pytest.approx(total, rel=0.08)
    assert np.median(k) == pytest.approx(math.log(card.saturation_sharpness_median), abs=0.05)


def test_a_zero_class_spread_shares_one_sharpness(grid_obs):
    """``[saturation] class_sd = 0`` (the default): one sharpness for every class
    and no per-class column in ``class_z``."""
    grid, obs = grid_obs
    data = model_data(grid, obs, np.zeros(grid.n_cells, bool))
    card = load_card("dense-8b-bf16-h100")
    assert card.saturation_class_sd == 0.0
    pred = Predictive(lambda d: fleet_model(d, card, None), num_samples=10)(jax.random.PRNGKey(0), data)
    assert pred["sharpness"].shape == (10,)
    assert pred["class_z"].shape == (10, grid.n_classes, 13) and class_param_count(card) == 13


def test_overload_is_per_class_around_a_family_level(grid_obs):
    """Each class has its own Ω per tail metric: log Ω is the family's
    (median :data:`OVERLOAD_LOG_MEDIAN`, sd :data:`OVERLOAD_LOG_SD`) plus a
    class deviation of sd :data:`OVERLOAD_CLASS_SD`, so the log ratio between
    two classes has sd √2 · OVERLOAD_CLASS_SD."""
    import math

    grid, obs = grid_obs
    data = model_data(grid, obs, np.zeros(grid.n_cells, bool))
    card = load_card("dense-8b-bf16-h100")
    pred = Predictive(lambda d: fleet_model(d, card, None), num_samples=4000)(jax.random.PRNGKey(5), data)
    om = np.log(np.asarray(pred["overload"]))
    assert om.shape == (4000, grid.n_classes, 2)
    for m in range(2):
        assert np.std(om[:, 0, m] - om[:, 1, m]) == pytest.approx(math.sqrt(2) * OVERLOAD_CLASS_SD, rel=0.08)
        assert np.std(om[:, 0, m]) == pytest.approx(math.hypot(OVERLOAD_LOG_SD, OVERLOAD_CLASS_SD), rel=0.08)
        assert np.median(om[:, :, m]) == pytest.approx(OVERLOAD_LOG_MEDIAN, abs=0.1)


def _tail_params(overload: np.ndarray, blowup: float = 0.8) -> dict[str, jnp.ndarray]:
    """Fixed class-level parameters of two classes (capacity ~8 req/s/GPU at the knee)."""
    p = {
        "knee": np.array([1.0, 1.0]),
        "curvature": np.array([0.2, 0.2]),
        "cap_level": np.log(np.array([8.0, 8.0])),
        "sharpness": 12.0,
        "exponent": 2.0,
        "tail_base": np.log(np.array([[0.3, 8.0], [0.9, 4.0]])),
        "tail_slope": np.array([-0.3, -0.3]),
        "tail_blowup": np.full((2, 2), blowup),
        "succ_base": np.array([6.5, 6.5]),
        "succ_drop": np.array([2.5, 2.5]),
        "overload": overload,
    }
    return {k: jnp.asarray(v) for k, v in p.items()}


def test_overload_moves_only_its_own_classes_overloaded_cells(grid_obs):
    """Raising one class's Ω raises the tails of that class's cells past
    saturation, and leaves every cell below saturation and every cell of the
    other class as it was: an overloaded measurement does not speak for the
    loads beneath it."""
    grid, obs = grid_obs
    data = model_data(grid, obs, np.ones(grid.n_cells, bool))
    low = np.full((2, 2), 10.0)
    high = low.copy()
    high[0] = 300.0
    lat_lo, cap = latent_metrics(_tail_params(low), data)
    lat_hi, _ = latent_metrics(_tail_params(high), data)
    rho = grid.offered_rps / np.asarray(cap)
    ratio = np.asarray(lat_hi[:, 1:3]) / np.asarray(lat_lo[:, 1:3])
    over = (grid.workload_idx == 0) & (rho > 1.2)
    under = rho < 0.8  # the excess is smooth: at ρ = 0.8 it is e^-8/40 (Ω·that < 1e-2 here)
    assert over.sum() >= 3 and under.sum() >= 3
    assert np.all(ratio[over] > 1.5)
    np.testing.assert_allclose(ratio[under], 1.0, rtol=3e-3)
    np.testing.assert_allclose(ratio[grid.workload_idx == 1], 1.0, rtol=1e-6)


def test_overload_grows_linearly_in_the_excess_whatever_the_knee_amplitude(grid_obs):
    """Past saturation the tails grow like ``1 + Ω (ρ - 1)``: with a large Ω
    the p99 at ρ = 3 is twice that at ρ = 2, and the knee's amplitude ``β``
    does not change that ratio (it only sets how far the tails rise up to the
    knee)."""
    grid, obs = grid_obs
    data = model_data(grid, obs, np.ones(grid.n_cells, bool))
    omega = np.full((2, 2), 1e4)
    _, cap = latent_metrics(_tail_params(omega), data)
    c = int(np.flatnonzero(grid.workload_idx == 0)[0])
    # the same cell at ρ = 2 and ρ = 3: two copies with the offered load set to match
    log_cap = float(np.log(cap[c]))
    at = lambda rho: data._replace(  # noqa: E731
        widx=data.widx[c : c + 1], u=data.u[c : c + 1], log_offered=jnp.asarray([log_cap + np.log(rho)])
    )
    for blowup in (0.3, 0.8, 1.5):
        p = _tail_params(omega, blowup)
        l2 = np.asarray(latent_metrics(p, at(2.0))[0])[0, 1:3]
        l3 = np.asarray(latent_metrics(p, at(3.0))[0])[0, 1:3]
        np.testing.assert_allclose(l3 / l2, 2.0, rtol=2e-3)


def test_load_failures_are_failed_runs_above_a_working_load_of_their_tp(grid_obs):
    """Only a failed run above a load its class and TP served counts: not a
    start-up OOM (every load of the TP failed), not a failure below every
    working load, not an unmeasured cell."""
    grid, obs = grid_obs
    obs = obs.copy()
    cell = {grid.describe(i): i for i in range(grid.n_cells)}
    measured = np.zeros(grid.n_cells, bool)
    for name in ("chat TP1@L25", "chat TP1@L50", "chat TP1@L100", "chat TP2@L25", "chat TP2@L50",
                 "chat TP4@L25", "chat TP4@L75", "chat TP8@L25", "chat TP8@L50"):
        measured[cell[name]] = True
    for name in ("chat TP1@L100", "chat TP2@L25", "chat TP2@L50", "chat TP8@L25", "chat TP8@L125"):
        obs[cell[name]] = 0.0  # the all-zero row of a failed run
    got = load_failures(grid, measured, usable_mask(obs, measured))
    assert [grid.describe(i) for i in np.flatnonzero(got)] == ["chat TP1@L100"]
    # a failure label counts as a failure too, wherever the metrics look fine
    failed = np.zeros(grid.n_cells, bool)
    failed[cell["chat TP4@L75"]] = True
    got = load_failures(grid, measured, usable_mask(obs, measured, failed))
    assert [grid.describe(i) for i in np.flatnonzero(got)] == ["chat TP1@L100", "chat TP4@L75"]


def test_a_failure_under_load_adds_log_sigmoid_of_its_utilisation(grid_obs):
    """The failed cell's whole contribution to the log density is
    ``log sigmoid(k log ρ)``, ρ = offered / the draw's capacity."""
    from numpyro.infer.util import log_density

    grid, obs = grid_obs
    card = load_card("dense-8b-bf16-h100")
    measured = np.zeros(grid.n_cells, bool)
    cell = {grid.describe(i): i for i in range(grid.n_cells)}
    c = cell["chat TP2@L125"]
    measured[[cell["chat TP2@L25"], cell["chat TP2@L50"], c]] = True
    failed_obs = obs.copy()
    failed_obs[c] = 0.0
    with_failure = model_data(grid, failed_obs, measured)
    without = model_data(grid, failed_obs, np.where(np.arange(grid.n_cells) == c, False, measured))
    assert bool(with_failure.failed_under_load[c]) and not bool(without.failed_under_load.any())
    rng = np.random.default_rng(0)
    for _ in range(3):
        params = {
            "class_z": jnp.asarray(rng.normal(size=(grid.n_classes, class_param_count(card)))),
            "global": jnp.asarray(rng.normal(size=6) * 0.3 + np.array([2.0, 0.5, 0.0, 0.0, 3.0, 3.0])),
            "noise_raw": jnp.asarray(np.abs(rng.normal(size=4)) * 0.1),
        }
        a, trace = log_density(fleet_model, (with_failure, card, with_failure.observed), {}, params)
        b, _ = log_density(fleet_model, (without, card, without.observed), {}, params)
        rho = grid.offered_rps[c] / float(trace["capacity"]["value"][c])
        want = float(jax.nn.log_sigmoid(FAILURE_SHARPNESS * np.log(rho)))
        assert float(a - b) == pytest.approx(want, rel=1e-4, abs=1e-4)
        assert want < -1e-3  # the term is not negligible at these draws


def test_observations_from_normals_agree_in_numpy_and_in_jax():
    # The posterior predictive is drawn in NumPy, the acquisition's fantasies in JAX: one rule.
    from fleetsieve_bayes.model.joint import NOISE_DF, obs_from_normals

    rng = np.random.default_rng(4)
    latent = np.stack([rng.uniform(1, 20, (5, 7)), rng.uniform(0.1, 3, (5, 7)), rng.uniform(1, 40, (5, 7)),
                       rng.uniform(0.5, 0.999, (5, 7))], axis=-1).astype(np.float32)
    noise = np.asarray([0.05, 0.2, 0.1, 0.4], np.float32)
    z = rng.standard_normal((int(NOISE_DF) + 1, 5, 7, 4)).astype(np.float32)
    y_np = obs_from_normals(latent, noise, z)
    assert isinstance(y_np, np.ndarray)
    np.testing.assert_allclose(y_np, np.asarray(obs_from_normals(jnp.asarray(latent), jnp.asarray(noise), jnp.asarray(z))),
                               rtol=2e-5)
    np.testing.assert_allclose(np.asarray(sample_obs(jax.random.PRNGKey(0), jnp.asarray(latent), jnp.asarray(noise))),
                               np.asarray(obs_from_normals(jnp.asarray(latent), jnp.asarray(noise),
                                                           jax.random.normal(jax.random.PRNGKey(0), z.shape, jnp.float32))))
