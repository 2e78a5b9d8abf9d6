"""One owner for intervals/tables/collapse: NumPy and JAX give the same tables, and the
acquisition kernel reads the very table the certificate reads, cell by cell."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.acquisition import (
    AcquisitionConfig,
    candidate_tables,
    kernel_functions,
    prepare_inputs,
)
from fleetsieve_bayes.decision.bounds import conservative_table, credible_bounds, optimistic_table
from fleetsieve_bayes.decision.intervals import (
    bound_tables,
    collapse_measured,
    widen_success,
    with_measured,
)
from fleetsieve_bayes.model.inference import Posterior
from fleetsieve_bayes.model.scales import SUCCESS_EPS

# 41 draws: the 5 %/95 % quantiles land exactly on draws 2 and 38 under both
# NumPy's linear interpolation (bounds) and the inverted empirical CDF (kernel),
# so the two tables must agree to float32 rounding.
N_DRAWS = 41
N_CELLS = 6


def _case(repeatability: float):
    grid = CellGrid(
        workloads=("a", "b"),
        workload_idx=np.array([0, 0, 0, 1, 1, 1]),
        tp=np.array([1, 2, 4, 1, 2, 4]),
        load=("L",) * N_CELLS,
        offered_rps=np.ones(N_CELLS),
        duration_s=np.full(N_CELLS, 100.0),
    )
    problem = AllocationProblem(
        demand=np.array([3.0, 2.0]),
        critical=np.array([False, True]),
        floor=np.array([1.0, 0.5]),
        success_min=np.array([0.99, 0.9]),
        ttft_max=np.array([2.0, np.inf]),
        completion_max=np.array([30.0, np.inf]),
        gpus=8,
    )
    rng = np.random.default_rng(3)
    latent = np.empty((N_DRAWS, N_CELLS, 4), np.float32)
    latent[..., 0] = np.exp(rng.normal(0.5, 0.4, (N_DRAWS, N_CELLS)))
    latent[..., 1] = np.exp(rng.normal(0.0, 0.5, (N_DRAWS, N_CELLS)))
    latent[..., 2] = np.exp(rng.normal(2.5, 0.5, (N_DRAWS, N_CELLS)))
    # Success near 1 in cells 0-2 (the upper end must widen to 1.0), near 0 in
    # cell 5 (the lower end must widen to 0.0), mid-range in 3-4.
    latent[..., 3] = 1.0 / (1.0 + np.exp(-rng.normal(8.0, 0.3, (N_DRAWS, N_CELLS))))
    latent[:, 3:5, 3] = rng.uniform(0.5, 0.9, (N_DRAWS, 2))
    latent[:, 5, 3] = rng.uniform(1e-5, 2e-3, N_DRAWS)
    noise = np.full((N_DRAWS, 4), 0.05, np.float32)
    measured = np.array([False, True, False, False, True, False])
    observed = np.full((N_CELLS, 4), np.nan)
    observed[1] = [2.0, 0.5, 12.0, 1.0]
    observed[4] = [0.0, np.inf, np.inf, 0.0]  # a failed cell keeps 0 / +inf
    post = Posterior(latent=latent, noise=noise, params={}, idata=None)
    return grid, problem, post, observed, measured


@pytest.mark.parametrize("repeatability", [0.0, 0.1])
def test_certificate_table_and_kernel_table_agree_cell_by_cell(repeatability):
    grid, problem, post, observed, measured = _case(repeatability)
    bounds = credible_bounds(post, observed, measured, 0.9, repeatability)
    cons_cert, opt_cert = conservative_table(bounds), optimistic_table(bounds)

    config = AcquisitionConfig(n_fantasies=4, credible_level=0.9, repeatability=repeatability)
    fns = kernel_functions(grid, problem, allocator_solve=lambda v: None)  # the tables need no allocator
    inp = prepare_inputs(
        jax.random.PRNGKey(0),
        jnp.asarray(post.latent, jnp.float64),
        jnp.asarray(post.noise),
        jnp.asarray(np.nan_to_num(observed, nan=1.0, posinf=np.inf), jnp.float32),
        jnp.asarray(measured),
        fns,
        config,
    )
    # The "measure nothing" candidate: the current tables, every fantasy alike.
    cons_k, opt_k, _, _ = candidate_tables(jnp.int32(N_CELLS), inp, fns, config)
    for f in range(config.n_fantasies):
        np.testing.assert_allclose(np.asarray(cons_k[f], np.float64), cons_cert, rtol=2e-6, atol=0)
        np.testing.assert_allclose(np.asarray(opt_k[f], np.float64), opt_cert, rtol=2e-6, atol=0)
    # The widening near 0/1 is exercised, in both tables.
    assert np.all(opt_cert[[0, 2], 3] == 1.0) and np.all(np.asarray(opt_k)[:, [0, 2], 3] == 1.0)
    assert cons_cert[5, 3] == 0.0 and np.all(np.asarray(cons_k)[:, 5, 3] == 0.0)
    # Measured cells are collapsed the same way (failed cell 4: 0 throughput, +inf tails).
    assert cons_cert[4, 0] == 0.0 and np.isinf(cons_cert[4, 1])


def test_candidate_collapses_to_its_fantasy_in_the_kernel():
    grid, problem, post, observed, measured = _case(0.0)
    config = AcquisitionConfig(n_fantasies=4, credible_level=0.9, repeatability=0.0)
    fns = kernel_functions(grid, problem, allocator_solve=lambda v: None)
    obs = jnp.asarray(np.nan_to_num(observed, nan=1.0, posinf=np.inf), jnp.float32)
    inp = prepare_inputs(jax.random.PRNGKey(1), jnp.asarray(post.latent, jnp.float64), jnp.asarray(post.noise), obs, jnp.asarray(measured), fns, config)
    cons, opt, _, _ = candidate_tables(jnp.int32(3), inp, fns, config)
    # Candidate 3 collapsed (cons == opt == its fantasy), unmeasured cell 0 not.
    np.testing.assert_array_equal(np.asarray(cons[:, 3]), np.asarray(opt[:, 3]))
    assert np.all(np.asarray(cons[:, 0, 0]) < np.asarray(opt[:, 0, 0]))


def test_rules_agree_on_numpy_and_jax():
    rng = np.random.default_rng(0)
    lo = rng.uniform(0.0, 1.0, (5, 4))
    hi = lo + rng.uniform(0.0, 1.0, (5, 4))
    lo[:, 3], hi[:, 3] = [0.0005, 0.2, 0.0, 0.5, 0.3], [0.9995, 0.9, 1.0, 0.9989, 0.99]
    obs = rng.uniform(0.5, 2.0, (5, 4))
    obs[:, 3] = [1.0, 0.99, 0.0, 0.5, 0.95]
    measured = np.array([True, False, True, False, True])
    for fn, args in (
        (widen_success, (lo, hi)),
        (lambda a, b: bound_tables(a, b), (lo, hi)),
        (lambda v: collapse_measured(v, 0.2), (obs,)),
        (lambda a, b: with_measured(a, b, obs, measured, 0.1), (lo, hi)),
    ):
        out_np = fn(*args)
        out_jx = fn(*(jnp.asarray(a, jnp.float32) for a in args))
        assert all(isinstance(x, np.ndarray) for x in out_np)
        assert all(isinstance(x, jax.Array) for x in out_jx)
        for a, b in zip(out_np, out_jx, strict=True):
            np.testing.assert_allclose(np.asarray(b), a, rtol=1e-6, atol=1e-7)
    w_lo, w_hi = widen_success(lo, hi)
    np.testing.assert_array_equal(w_lo[:, 3], [0.0, 0.2, 0.0, 0.5, 0.3])
    np.testing.assert_array_equal(w_hi[:, 3], [1.0, 0.9, 1.0, 0.9989, 0.99])
    assert SUCCESS_EPS == 1e-3
    c_lo, c_hi = collapse_measured(obs, 0.2)
    # Success band on the failure probability: 0.99 ± 20 % of 0.01.
    np.testing.assert_allclose([c_lo[1, 3], c_hi[1, 3]], [0.988, 0.992])


def test_unobserved_tail_is_unbounded_and_passes_only_an_slo_that_does_not_name_it():
    from fleetsieve_bayes.allocation.problem import meets_slo

    obs = np.array([[2.0, 0.5, np.nan, 1.0], [2.0, np.nan, 3.0, 1.0]])
    for xp_obs in (obs, jnp.asarray(obs, jnp.float32)):
        lo, hi = collapse_measured(xp_obs, 0.1)
        assert np.isinf(np.asarray(lo)[0, 2]) and np.isinf(np.asarray(hi)[0, 2])
        assert np.isinf(np.asarray(lo)[1, 1]) and np.isinf(np.asarray(hi)[1, 1])
        np.testing.assert_allclose(np.asarray(lo)[0, :2], [1.8, 0.45], rtol=1e-6)
        named = meets_slo(xp_obs, np.array([0.9, 0.9]), np.array([2.0, 2.0]), np.array([30.0, 30.0]))
        unnamed = meets_slo(xp_obs, np.array([0.9, 0.9]), np.array([2.0, np.inf]), np.array([np.inf, 30.0]))
        assert list(np.asarray(named)) == [False, False]
        assert list(np.asarray(unnamed)) == [True, True]
