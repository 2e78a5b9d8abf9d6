"""The acquisition kernel: shapes, a hand-checkable decision, CRN, weights, ESS fallback, selection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.acquisition import (
    AcquisitionScores,
    bound_tables,
    collapse_measured,
    credible_quantiles,
    fantasy_outcomes,
    importance_weights,
    make_acquisition,
    related_cells,
    select_cell,
    weighted_intervals,
)

N_DRAWS = 400
N_FANT = 8


def gauss_logpdf(y: jax.Array, latent: jax.Array, noise: jax.Array) -> jax.Array:
    """Stand-in observation model: Gaussian on the log scale of every metric."""
    r = (jnp.log(y) - jnp.log(latent)) / noise
    return jnp.sum(-0.5 * r * r - jnp.log(noise), axis=-1)


def gauss_sample(key: jax.Array, latent: jax.Array, noise: jax.Array) -> jax.Array:
    shape = jnp.broadcast_shapes(latent.shape, noise.shape)
    return latent * jnp.exp(noise * jax.random.normal(key, shape))


def tiny() -> tuple[CellGrid, AllocationProblem, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One class, demand 4 req/s, 2 GPUs.

    c0 (TP1, measured, 1.0 req/s): two replicas serve 2.0 → r = 0.5.
    c1 (TP1, unmeasured, capacity uniform on [0.5, 3]): conservative 5 % ≈ 0.6
        (worse than c0), optimistic 95 % ≈ 2.9 (two replicas serve all 4).
        Gap = 0.5 (min fulfillment) + 2/4 (goodput) = 1.0; measuring c1
        collapses its interval, so the gap becomes exactly 0.
    c2 (TP2, unmeasured, capacity ≤ 0.6): one replica can never beat c0 → cannot
        change either allocation.
    """
    grid = CellGrid(
        workloads=("a",),
        workload_idx=np.zeros(3, np.int64),
        tp=np.array([1, 1, 2]),
        load=("L1", "L2", "L1"),
        offered_rps=np.array([5.0, 6.0, 5.0]),
        duration_s=np.array([100.0, 100.0, 100.0]),
    )
    problem = AllocationProblem(
        demand=np.array([4.0]),
        critical=np.array([False]),
        floor=np.array([1.0]),
        success_min=np.array([0.9]),
        ttft_max=np.array([np.inf]),
        completion_max=np.array([np.inf]),
        gpus=2,
    )
    rng = np.random.default_rng(0)
    latent = np.empty((N_DRAWS, 3, 4), np.float32)
    latent[:, 0, 0] = rng.uniform(0.9, 1.1, N_DRAWS)
    latent[:, 1, 0] = rng.uniform(0.5, 3.0, N_DRAWS)
    latent[:, 2, 0] = rng.uniform(0.2, 0.6, N_DRAWS)
    latent[..., 1] = 0.1
    latent[..., 2] = 1.0
    latent[..., 3] = 1.0
    noise = np.full((N_DRAWS, 4), 0.05, np.float32)
    observed = np.array([[1.0, 0.1, 1.0, 1.0], [np.nan] * 4, [np.nan] * 4], np.float32)
    measured = np.array([True, False, False])
    return grid, problem, latent, noise, observed, measured


@pytest.fixture(scope="module")
def case():
    grid, problem, latent, noise, observed, measured = tiny()
    acq = make_acquisition(
        grid,
        problem,
        n_fantasies=N_FANT,
        credible_level=0.9,
        ess_threshold=0.2,
        memory_budget_mb=1e-6,  # one candidate per chunk: exercises the padded chunk loop
        obs_logpdf=gauss_logpdf,
        sample_obs=gauss_sample,
    )
    args = (jnp.asarray(latent), jnp.asarray(noise), jnp.asarray(observed), jnp.asarray(measured))
    scores = acq.score(jax.random.PRNGKey(0), *args)
    return grid, acq, args, scores


def test_shapes_and_masking(case):
    grid, acq, args, s = case
    assert isinstance(s, AcquisitionScores)
    for field in ("score", "expected_gap", "ess_min", "fallback", "expected_conservative"):
        assert getattr(s, field).shape == (grid.n_cells,)
    assert s.gap_now.shape == () and s.conservative_now.shape == ()
    assert s.fallback.dtype == jnp.bool_
    assert s.score[0] == -np.inf and np.isnan(s.expected_gap[0]) and not bool(s.fallback[0])
    assert np.all(np.isfinite(np.asarray(s.score[1:])))


def test_only_the_decision_cell_scores(case):
    grid, acq, args, s = case
    assert float(s.gap_now) == pytest.approx(1.0, abs=1e-5)
    assert float(s.expected_gap[1]) == pytest.approx(0.0, abs=1e-5)
    assert float(s.score[1]) == pytest.approx(1.0, abs=1e-5)
    assert abs(float(s.score[2])) < 1e-5  # cannot change the allocation
    assert acq.select(s, grid.cost_gpu_s) == 1
    # Measuring c1 lets the conservative side use it whenever it beats c0: value can only rise.
    assert float(s.expected_conservative[1]) >= float(s.conservative_now) - 1e-6


def test_deterministic_under_key(case):
    grid, acq, args, s = case
    again = acq.score(jax.random.PRNGKey(0), *args)
    for a, b in zip(s, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fallback_flagged_for_an_informative_cell(case):
    grid, acq, args, s = case
    # Noise 5 % against a capacity spread of 0.5..3: the raw weights collapse.
    assert bool(s.fallback[1])
    assert float(s.ess_min[1]) < 0.2


def test_common_random_numbers_across_candidates():
    grid, problem, latent, noise, observed, measured = tiny()
    key = jax.random.PRNGKey(3)
    y = np.asarray(fantasy_outcomes(key, jnp.asarray(latent), jnp.asarray(noise), N_FANT, gauss_sample))
    assert y.shape == (grid.n_cells, N_FANT, 4)
    # Same draw index and the same standard normals for every candidate:
    # log(y / latent[d_f]) is identical across cells.
    from fleetsieve_bayes.decision.acquisition import fantasy_plan

    d_f, _ = fantasy_plan(key, N_DRAWS, N_FANT)
    d_f = np.asarray(d_f)
    assert np.all(np.diff(d_f) > 0)  # systematic sample, spread over the draws
    z = np.log(y) - np.log(np.moveaxis(latent[d_f], 1, 0))
    np.testing.assert_allclose(z[0], z[1], atol=1e-5)
    np.testing.assert_allclose(z[0], z[2], atol=1e-5)


def test_weights_concentrate_on_the_matching_draw():
    rng = np.random.default_rng(1)
    lat = jnp.asarray(rng.uniform(1.0, 5.0, (300, 4)), jnp.float32)
    noise = jnp.full((300, 4), 0.01, jnp.float32)
    ys = jnp.stack([lat[37], lat[38]])
    ll = gauss_logpdf(ys[:, None, :], lat[None], noise[None])  # (2, 300), one shape for all weight tests
    w, ess, tempered = importance_weights(ll, ess_threshold=0.0)
    assert [int(i) for i in jnp.argmax(w, axis=1)] == [37, 38]
    assert float(w[0, 37]) > 0.99 and float(w[1, 38]) > 0.99
    np.testing.assert_allclose(np.asarray(jnp.sum(w, axis=1)), 1.0, atol=1e-5)
    assert not bool(tempered.any()) and float(ess.max()) < 0.01


def test_ess_fallback_in_the_tail():
    rng = np.random.default_rng(2)
    lat = jnp.asarray(rng.uniform(1.0, 2.0, (300, 4)), jnp.float32)
    noise = jnp.full((300, 4), 0.1, jnp.float32)
    far = jnp.full((4,), 20.0)  # ~25 noise sds beyond every draw
    near = lat[5]
    ll = gauss_logpdf(jnp.stack([far, near])[:, None, :], lat[None], noise[None])  # (2, 300)
    w, ess, tempered = importance_weights(ll, ess_threshold=0.1)
    assert bool(tempered[0]) and float(ess[0]) < 0.1
    w0 = np.asarray(w[0], np.float64)
    assert 1.0 / np.sum(w0**2) / 300 >= 0.1 - 1e-3  # tempering restores the threshold
    assert np.isfinite(w0).all() and w0.sum() == pytest.approx(1.0, abs=1e-5)
    # Uniform weights when the fantasy is impossible under every draw.
    w_nan, _, _ = importance_weights(jnp.full((2, 300), -jnp.inf), 0.1)
    np.testing.assert_allclose(np.asarray(w_nan), 1.0 / 300, rtol=1e-5)


def test_weighted_intervals_uniform_equal_inverted_cdf():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 4, 101)).astype(np.float32)
    order = np.argsort(x, axis=-1)
    sv = np.take_along_axis(x, order, -1)
    q_lo, q_hi = credible_quantiles(0.9)
    lo, hi = weighted_intervals(jnp.asarray(sv), jnp.asarray(order), jnp.full((101,), 1 / 101), q_lo, q_hi)
    np.testing.assert_array_equal(np.asarray(lo), np.quantile(x, q_lo, axis=-1, method="inverted_cdf"))
    np.testing.assert_array_equal(np.asarray(hi), np.quantile(x, q_hi, axis=-1, method="inverted_cdf"))
    # All weight on one draw → both bounds are that draw.
    w = jnp.zeros((101,)).at[17].set(1.0)
    lo, hi = weighted_intervals(jnp.asarray(sv), jnp.asarray(order), w, q_lo, q_hi)
    np.testing.assert_array_equal(np.asarray(lo), x[..., 17])
    np.testing.assert_array_equal(np.asarray(hi), x[..., 17])


def test_collapse_and_tables():
    v = jnp.array([10.0, 1.0, 20.0, 0.995])
    lo, hi = collapse_measured(v, 0.1)
    # Success: ±10 % on the failure probability 0.005.
    np.testing.assert_allclose(np.asarray(lo), [9.0, 0.9, 18.0, 0.9945], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(hi), [11.0, 1.1, 22.0, 0.9955], rtol=1e-6)
    cons, opt = bound_tables(lo, hi)
    np.testing.assert_allclose(np.asarray(cons), [9.0, 1.1, 22.0, 0.9945], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(opt), [11.0, 0.9, 18.0, 0.9955], rtol=1e-6)


def test_select_ties_cost_and_normalised():
    cost = np.array([300.0, 100.0, 200.0, 50.0])
    s = np.array([0.5, 0.5 - 1e-9, 0.4, -np.inf])
    assert select_cell(s, cost) == 1  # tie within tolerance → cheaper
    assert select_cell(np.array([0.5, 0.49, 0.4, -np.inf]), cost) == 0  # no tie: score wins
    assert select_cell(s, cost, cost_normalised=True) == 1  # 0.5/100 > 0.4/200 > 0.5/300
    assert select_cell(np.array([0.0, 0.0, 0.0, -np.inf]), cost) == 1
    with pytest.raises(ValueError):
        select_cell(np.full(4, -np.inf), cost)


def test_related_cells():
    rng = np.random.default_rng(5)
    base = rng.uniform(1.0, 2.0, (100, 4))
    lat = np.stack([base, base * 1.5, rng.uniform(1.0, 2.0, (100, 4)), rng.uniform(1.0, 2.0, (100, 4))], axis=1)
    idx = np.asarray(related_cells(jnp.asarray(lat), jnp.zeros(4, bool), 2))
    assert idx.shape == (4, 2)
    assert list(idx[0]) == [0, 1] and list(idx[1]) == [1, 0]
    idx = np.asarray(related_cells(jnp.asarray(lat), jnp.array([False, True, False, False]), 2))
    assert idx[0, 0] == 0 and idx[0, 1] in (2, 3)  # the measured twin is excluded


def test_bad_credible_level():
    with pytest.raises(ValueError):
        credible_quantiles(1.0)
