"""A large grid is sampled on its measured cells alone (model.data.fit_cells / restrict): the
restricted log density and its gradient equal the full grid's at any parameters, with one value
per cell and with window rows; a posterior of the restricted data covers every cell; a small
grid is never restricted."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer.util import potential_energy

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.configs import Role, ServingConfig
from fleetsieve_bayes.model.data import (
    FIT_CELL_BUCKET,
    RESTRICT_MIN_CELLS,
    fit_cells,
    free_departures,
    model_data,
    restrict,
)
from fleetsieve_bayes.model.inference import _init_point, bind_model, mass_from_draws, redraw_free
from fleetsieve_bayes.model.priors import load_card

N_LOADS = 5


def _catalogue() -> tuple[ServingConfig, ...]:
    out = [ServingConfig(name=f"agg-tp{tp}-s{s}", tp=tp, engine=(("max_num_seqs", s),)) for tp in (1, 2, 4, 8)
           for s in (64, 256)]
    for p_tp in (1, 2, 4):
        for d_tp in (1, 2, 4):
            for workers in ((1, 1), (2, 1), (1, 2)):
                out.append(ServingConfig(name=f"{workers[0]}p{p_tp}+{workers[1]}d{d_tp}",
                                         prefill=Role(p_tp, workers[0]), decode=Role(d_tp, workers[1])))
    return tuple(out)


def _grid() -> CellGrid:
    configs = _catalogue()
    cells = [(w, k, j) for w in range(2) for k in range(len(configs)) for j in range(N_LOADS)]
    conf = np.array([k for _, k, _ in cells], np.int64)
    return CellGrid(
        workloads=("chat", "code"),
        workload_idx=np.array([w for w, _, _ in cells], np.int64),
        tp=np.array([configs[k].gpus for _, k, _ in cells], np.int64),
        load=tuple(f"C{j}" for _, _, j in cells),
        offered_rps=np.array([0.5 + j + 0.1 * k + w for w, k, j in cells]),
        duration_s=np.full(len(cells), 300.0),
        config=conf,
        configs=configs,
    )


def _measured(grid: CellGrid, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    measured = np.zeros(grid.n_cells, bool)
    measured[rng.choice(grid.n_cells, n, replace=False)] = True
    observed = np.column_stack([
        grid.offered_rps * rng.uniform(0.6, 1.0, grid.n_cells),
        rng.uniform(0.1, 2.0, grid.n_cells),
        rng.uniform(2.0, 20.0, grid.n_cells),
        rng.uniform(0.95, 1.0, grid.n_cells),
    ])
    failed = np.flatnonzero(measured)[-2:]
    observed[failed[0]] = [0.0, np.nan, np.nan, 0.0]  # a failed run: no metric usable
    observed[failed[1], 1] = np.inf  # one tail unusable
    return measured, observed


def _windows(measured: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every measured cell's value as a window, three more of two cells (one a failed window)."""
    cells = np.flatnonzero(measured)
    rows = [observed[c] for c in cells]
    row_cell = list(cells)
    for c, scale in ((cells[3], 1.1), (cells[3], 0.9), (cells[5], 1.05)):
        rows.append(observed[c] * scale)
        row_cell.append(c)
    rows.append(np.array([0.0, np.nan, np.nan, 0.0]))
    row_cell.append(cells[6])
    return np.array(rows), np.array(row_cell)


def _energies(data, card, seeds=(0, 1, 2)) -> list[tuple[float, np.ndarray]]:
    model = bind_model(card)
    energy = jax.jit(jax.value_and_grad(lambda q, d: potential_energy(model, (d, d.observed), {}, q)))
    out = []
    for s in seeds:
        z = _init_point(jax.random.PRNGKey(s), card, data)
        z = jax.tree.map(lambda a, s=s: a + 0.3 * jax.random.normal(jax.random.PRNGKey(100 + s), a.shape), z)
        pe, grad = energy(z, data)
        out.append((float(pe), np.concatenate([np.ravel(np.asarray(g)) for g in jax.tree.leaves(grad)])))
    return out


@pytest.mark.parametrize("with_windows", [False, True], ids=["one-value", "windows"])
def test_restricted_log_density_equals_the_full_grid(with_windows: bool) -> None:
    grid = _grid()
    assert grid.n_cells > RESTRICT_MIN_CELLS
    measured, observed = _measured(grid, 21)
    rows, row_cell = _windows(measured, observed) if with_windows else (None, None)
    card = load_card("generic")
    full = model_data(grid, observed, measured, rows=rows, row_cell=row_cell)
    cells = fit_cells(full)
    assert cells is not None and cells.size == FIT_CELL_BUCKET
    np.testing.assert_array_equal(cells[:21], np.flatnonzero(measured))
    assert set(cells[21:]) == {np.flatnonzero(measured)[0]}
    sub = restrict(full, cells)
    assert int(np.asarray(sub.measured).sum()) == 21
    assert int(np.asarray(sub.failed_under_load).sum()) == int(np.asarray(full.failed_under_load).sum())
    for (pe_full, g_full), (pe_sub, g_sub) in zip(_energies(full, card), _energies(sub, card), strict=True):
        assert pe_sub == pytest.approx(pe_full, rel=1e-10, abs=1e-8)
        np.testing.assert_allclose(g_sub, g_full, rtol=1e-8, atol=1e-8)


def test_padding_changes_the_density() -> None:
    """The check above can fail: the same restriction with a padded cell left live (measured)
    counts that cell twice."""
    grid = _grid()
    measured, observed = _measured(grid, 21)
    card = load_card("generic")
    full = model_data(grid, observed, measured)
    cells = fit_cells(full)
    sub = restrict(full, cells)
    doubled = sub._replace(fit_mask=jnp.asarray(full.fit_mask)[jnp.asarray(cells)])
    assert _energies(doubled, card, (0,))[0][0] != pytest.approx(_energies(full, card, (0,))[0][0], rel=1e-6)


def test_buckets_and_small_grids() -> None:
    grid = _grid()
    measured, observed = _measured(grid, 40)
    full = model_data(grid, observed, measured)
    cells = fit_cells(full)
    assert cells is not None and cells.size == 64  # the next power of two
    small_grid = CellGrid(
        workloads=("chat",), workload_idx=np.zeros(4, np.int64), tp=np.array([1, 1, 2, 2]),
        load=("C1", "C2", "C1", "C2"), offered_rps=np.array([1.0, 2.0, 1.0, 2.0]), duration_s=np.full(4, 300.0),
    )
    small = model_data(small_grid, np.ones((4, 4)), np.array([True, False, False, False]))
    assert fit_cells(small) is None
    many = np.ones(grid.n_cells, bool)
    many[:10] = False  # nearly every cell measured: no smaller bucket
    assert fit_cells(model_data(grid, observed, many)) is None


def test_a_fit_covers_every_cell() -> None:
    """A NUTS fit of a restricted grid returns draws for every cell of the grid, and a measured
    cell's latent sits near its observation."""
    from fleetsieve_bayes.model.inference import fit

    grid = _grid()
    measured, observed = _measured(grid, 12, seed=3)
    post = fit(grid, observed, measured, "generic", "fast", seed=0)
    assert post.latent.shape[1:] == (grid.n_cells, 4)
    assert np.isfinite(post.latent).all()
    c = np.flatnonzero(measured)[5]
    median = np.median(post.latent[:, c, 0])
    assert abs(np.log(median / observed[c, 0])) < 0.3
    # A (class, configuration) pair without a measured cell is sampled non-centred: its
    # coordinate is its prior's standard normal, moved by no other coordinate; its departure
    # keeps its prior N(0, tp_sd²).
    data = model_data(grid, observed, measured)
    free = ~np.asarray(data.dev_centred)
    assert free.sum() > 0 and (~free).sum() > 0
    w, k = np.argwhere(free)[0]
    z = post.params["tp_z"][:, w, k, 0]
    assert abs(np.mean(z)) < 0.25 and 0.75 < np.std(z) < 1.25
    cap_level = np.asarray(post.idata.posterior["cap_level"]).reshape(z.size, -1)[:, w]
    assert abs(np.corrcoef(z, cap_level)[0, 1]) < 0.2
    sd = load_card("generic").capacity_tp_sd
    dev = np.asarray(post.idata.posterior["tp_dev"]).reshape(z.size, *free.shape, 3)[:, w, k, 0]
    assert abs(np.std(dev) / sd - 1.0) < 0.25


def _pe_with(data, card, z, site: str, index: tuple[int, ...], delta: float) -> float:
    model = bind_model(card)
    moved = {**z, site: jnp.asarray(z[site]).at[index].add(delta)}
    return float(potential_energy(model, (data, data.observed), {}, moved))


def test_free_departures_enter_the_density_only_through_their_prior() -> None:
    """The coordinates free_departures marks move the log density by exactly their own
    standard-normal prior term; every other departure coordinate moves it by more (the
    likelihood or the curve's centre reads it): the redraw of the marked ones is exact."""
    grid = _grid()
    measured, observed = _measured(grid, 21)
    card = load_card("generic")
    full = model_data(grid, observed, measured)
    sub = restrict(full, fit_cells(full))
    free = free_departures(full, card)
    assert free is not None and free.shape == (2, len(grid.configs), 3)
    # the tail columns (scale 0 on the generic card) are free everywhere; capacity only where unmeasured
    assert free[:, :, 1:].all() and (free[:, :, 0] == ~np.asarray(full.dev_centred)).all()
    z = _init_point(jax.random.PRNGKey(0), card, sub)
    z = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(7), a.shape), z)
    base = _pe_with(sub, card, z, "tp_z", (0, 0, 0), 0.0)
    tz = np.asarray(z["tp_z"])
    delta = 0.7
    for idx in map(tuple, np.argwhere(free)[:: max(1, int(free.sum()) // 25)]):
        prior = 0.5 * ((tz[idx] + delta) ** 2 - tz[idx] ** 2)
        assert _pe_with(sub, card, z, "tp_z", idx, delta) - base == pytest.approx(prior, rel=1e-9, abs=1e-9)
    for idx in map(tuple, np.argwhere(~free)):
        prior = 0.5 * ((tz[idx] + delta) ** 2 - tz[idx] ** 2)
        assert abs(_pe_with(sub, card, z, "tp_z", idx, delta) - base - prior) > 1e-6


def test_redraw_free_draws_standard_normals_where_free_and_keeps_the_rest() -> None:
    grid = _grid()
    measured, observed = _measured(grid, 21)
    card = load_card("generic")
    full = model_data(grid, observed, measured)
    free = free_departures(full, card)
    n = 4000
    z = {"tp_z": jnp.full((n, *free.shape), 0.25), "class_z": jnp.ones((n, 2, 3))}
    a, b = redraw_free(z, full, card, seed=5), redraw_free(z, full, card, seed=5)
    np.testing.assert_array_equal(np.asarray(a["tp_z"]), np.asarray(b["tp_z"]))  # seeded
    assert not np.array_equal(np.asarray(redraw_free(z, full, card, seed=6)["tp_z"]), np.asarray(a["tp_z"]))
    tz = np.asarray(a["tp_z"])
    np.testing.assert_array_equal(tz[:, ~free], 0.25)  # the chains' values kept
    np.testing.assert_array_equal(np.asarray(a["class_z"]), 1.0)
    drawn = tz[:, free]
    assert abs(drawn.mean()) < 0.01 and abs(drawn.std() - 1.0) < 0.01
    assert abs(np.corrcoef(drawn[:, 0], drawn[:, 1])[0, 1]) < 0.05  # independent coordinates
    np.testing.assert_array_equal(drawn * 2.0**30, np.round(drawn * 2.0**30))  # on the start lattice


def test_no_free_departures_on_a_small_grid_or_with_orthogonal_departures() -> None:
    grid = _grid()
    measured, observed = _measured(grid, 21)
    card = load_card("generic")
    assert free_departures(model_data(grid, observed, measured), dataclasses.replace(card, capacity_tp_departures="orthogonal")) is None
    small_grid = CellGrid(
        workloads=("chat",), workload_idx=np.zeros(4, np.int64), tp=np.array([1, 1, 2, 2]),
        load=("C1", "C2", "C1", "C2"), offered_rps=np.array([1.0, 2.0, 1.0, 2.0]), duration_s=np.full(4, 300.0),
    )
    small = model_data(small_grid, np.ones((4, 4)), np.array([True, False, False, False]))
    assert free_departures(small, card) is None
    z = {"tp_z": jnp.zeros((3, 1, 2, 3))}
    assert redraw_free(z, small, card, seed=0) is z


def test_mass_from_draws_is_the_identity_on_free_coordinates() -> None:
    rng = np.random.default_rng(0)
    flat = rng.normal(size=(60, 5)) @ rng.normal(size=(5, 5))  # correlated, scales far from 1
    free = np.array([False, True, False, False, True])
    m = mass_from_draws(flat, free)
    plain = mass_from_draws(flat)
    keep = ~free
    np.testing.assert_allclose(m[np.ix_(keep, keep)], plain[np.ix_(keep, keep)])
    np.testing.assert_array_equal(m[np.ix_(free, free)], np.eye(2))
    np.testing.assert_array_equal(m[np.ix_(free, keep)], 0.0)
    np.testing.assert_array_equal(m[np.ix_(keep, free)], 0.0)


def test_a_pooled_fit_on_a_large_catalogued_grid_has_a_dense_mass_identity_on_its_free_coordinates() -> None:
    """The pooled warm-up on a grid with free departures keeps a dense mass (the coordinates
    the data reach are few), the identity on the free ones; the windowed one stays diagonal."""
    from fleetsieve_bayes.model.inference import _free_flat, _nuts_kernel, _sampled, fit
    from fleetsieve_bayes.model.presets import load_preset

    grid = _grid()
    measured, observed = _measured(grid, 12, seed=3)
    card = load_card("generic")
    preset = load_preset("fast")._replace(warmup=40, samples=20, adaptation="pooled")
    post = fit(grid, observed, measured, card, preset, seed=0)
    mass = np.asarray(post.state["states"][0].adapt_state.inverse_mass_matrix)
    assert mass.ndim == 2
    data = _sampled(model_data(grid, observed, measured))
    free = _free_flat(_nuts_kernel(data, card, preset), data, card)
    assert free is not None and free.sum() == free_departures(data, card).sum() and (~free).sum() > 0
    np.testing.assert_array_equal(mass[np.ix_(free, free)], np.eye(int(free.sum())))
    np.testing.assert_array_equal(mass[np.ix_(free, ~free)], 0.0)
    assert np.count_nonzero(mass[np.ix_(~free, ~free)] - np.diag(np.diag(mass[np.ix_(~free, ~free)]))) > 0
    windowed = fit(grid, observed, measured, card, preset._replace(adaptation="windowed"), seed=0)
    assert np.asarray(windowed.state["states"][0].adapt_state.inverse_mass_matrix).ndim == 1
