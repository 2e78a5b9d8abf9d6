"""Per-(class, TP) departures from the smooth curves in TP: the card's ``tp_sd`` keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.inference import prior_predictive
from fleetsieve_bayes.model.joint import latent_metrics, model_data, tp_dev_count
from fleetsieve_bayes.model.priors import PriorCard, load_card

# Per-class parameters of latent_metrics, as the model's deterministic sites name them.
_PARAMS = ("knee", "curvature", "cap_level", "sharpness", "exponent", "tail_base", "tail_slope", "tail_blowup",
           "succ_base", "succ_drop", "tail_elasticity", "overload")


def _grid() -> CellGrid:
    """Two classes × TP {1, 2, 4, 8} × three loads (24 cells)."""
    w, tp, load, offered = [], [], [], []
    for c in range(2):
        for t in (1, 2, 4, 8):
            for j, x in enumerate((0.5, 1.0, 2.0)):
                w.append(c)
                tp.append(t)
                load.append(f"L{j}")
                offered.append(x * t * (1.0 + c))
    n = len(w)
    return CellGrid(("chat", "code"), np.array(w), np.array(tp), tuple(load), np.array(offered, float),
                    np.full(n, 300.0))


def _card(sd: tuple[float, float, float]) -> PriorCard:
    return dataclasses.replace(load_card("generic"), capacity_tp_sd=sd[0], ttft_tp_sd=sd[1], completion_tp_sd=sd[2])


def test_the_generic_card_departs_in_capacity_only_and_the_architecture_cards_not_at_all() -> None:
    grid = _grid()
    data = model_data(grid, np.ones((grid.n_cells, 4)), np.zeros(grid.n_cells, bool))
    generic = load_card("generic")
    assert (generic.capacity_tp_sd, generic.ttft_tp_sd, generic.completion_tp_sd) == (0.3, 0.0, 0.0)
    assert tp_dev_count(data, generic) == 4
    draws = prior_predictive(grid, "generic", 2000, seed=0)
    dev = draws["tp_dev"].reshape(-1, 3)
    np.testing.assert_allclose(dev[:, 0].std(), 0.3, rtol=0.03)
    assert (dev[:, 1:] == 0.0).all()  # the tails' bases follow their slope exactly
    for name in ("dense-31b-fp8-h100", "dense-8b-bf16-h100"):
        card = load_card(name)
        assert (card.capacity_tp_sd, card.ttft_tp_sd, card.completion_tp_sd) == (0.0, 0.0, 0.0)
        assert tp_dev_count(data, card) == 0
        draws = prior_predictive(grid, card, 4, seed=0)
        assert "tp_z" not in draws and "tp_dev" not in draws
    # One column per TP degree of the grid, in increasing TP.
    onehot = np.asarray(data.tp_onehot)
    assert onehot.shape == (24, 4) and (onehot.sum(1) == 1).all()
    assert (np.argmax(onehot, 1) == np.log2(grid.tp).astype(int)).all()


def test_a_departure_moves_only_its_class_and_tp_by_exactly_its_value() -> None:
    grid = _grid()
    card = _card((0.3, 0.2, 0.1))
    data = model_data(grid, np.ones((grid.n_cells, 4)), np.zeros(grid.n_cells, bool))
    assert tp_dev_count(data, card) == 4
    draws = prior_predictive(grid, card, 2, seed=1)
    params = {k: jnp.asarray(draws[k][0]) for k in _PARAMS}
    dev = np.zeros((2, 4, 3))
    dev[1, 2] = (0.4, -0.3, 0.25)  # class "code" at TP4
    base_latent, base_cap = latent_metrics(params, data)
    latent, cap = latent_metrics({**params, "tp_dev": jnp.asarray(dev)}, data)
    hit = (grid.workload_idx == 1) & (grid.tp == 4)
    np.testing.assert_allclose(np.log(np.asarray(cap) / np.asarray(base_cap)), np.where(hit, 0.4, 0.0), atol=1e-5)
    # The tails of the other cells are unchanged; a hit cell's base moves by its departure (its
    # utilisation too, through the capacity: compare at the same capacity via the draw's own tails).
    same = ~hit
    np.testing.assert_allclose(np.asarray(latent)[same], np.asarray(base_latent)[same], rtol=1e-6)
    assert not np.allclose(np.asarray(latent)[hit], np.asarray(base_latent)[hit])
    # The model's own site is the same function of the sampled departure.
    np.testing.assert_allclose(
        np.asarray(latent_metrics({**params, "tp_dev": jnp.asarray(draws["tp_dev"][0])}, data)[1]),
        draws["capacity"][0], rtol=1e-5)


def test_departures_have_the_cards_spread_under_the_prior() -> None:
    grid = _grid()
    sd = (0.3, 0.2, 0.1)
    draws = prior_predictive(grid, _card(sd), 2000, seed=2)
    dev = draws["tp_dev"]
    assert dev.shape == (2000, 2, 4, 3)
    # 16,000 normal draws per column: the sample sd is within 2 % of the card's (5 standard errors).
    np.testing.assert_allclose(dev.reshape(-1, 3).std(0), sd, rtol=0.03)
    np.testing.assert_allclose(dev.reshape(-1, 3).mean(0), 0.0, atol=0.01)


def test_a_negative_tp_sd_is_refused_naming_the_key(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[capacity]\ntp_sd = -0.1\n")
    with pytest.raises(InputError, match=r"c\.toml: 'capacity\.tp_sd' must be >= 0, got -0\.1"):
        load_card(p)
    p.write_text("[ttft]\ntp_sd = 0.2\n")
    assert load_card(p).ttft_tp_sd == 0.2


def test_orthogonal_departures_carry_no_level_and_no_trend_in_log2_tp() -> None:
    grid = _grid()
    sd = (0.3, 0.2, 0.1)
    card = dataclasses.replace(_card(sd), capacity_tp_departures="orthogonal")
    dev = prior_predictive(grid, card, 2000, seed=3)["tp_dev"]  # (draws, classes, TP 1/2/4/8, 3)
    u = np.log2([1.0, 2.0, 4.0, 8.0])
    np.testing.assert_allclose(dev.sum(axis=2), 0.0, atol=1e-5)  # no level
    np.testing.assert_allclose(np.einsum("dctk,t->dck", dev, u - u.mean()), 0.0, atol=1e-5)  # no slope
    # What is left has the card's spread over n_tp - 2 = 2 of the 4 directions: variance sd²·2/4.
    np.testing.assert_allclose(dev.reshape(-1, 3).std(0), np.asarray(sd) * np.sqrt(0.5), rtol=0.03)
    free = prior_predictive(grid, _card(sd), 4, seed=3)["tp_dev"]
    assert np.abs(free.sum(axis=2)).max() > 0.05  # the default keeps every direction


def test_a_grid_of_two_tp_degrees_has_no_orthogonal_departure() -> None:
    from fleetsieve_bayes.model.joint import trend_free

    assert np.asarray(trend_free(jnp.log2(jnp.array([2.0, 8.0])))).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    p = np.asarray(trend_free(jnp.log2(jnp.array([1.0, 4.0, 8.0]))), np.float64)
    np.testing.assert_allclose(p @ p, p, atol=1e-6)  # a projection, of rank 1 here
    assert np.linalg.matrix_rank(p, tol=1e-5) == 1


def test_tp_departures_takes_free_or_orthogonal_and_names_the_key_otherwise(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('[capacity]\ntp_departures = "orthogonal"\n')
    assert load_card(p).capacity_tp_departures == "orthogonal"
    assert load_card("generic").capacity_tp_departures == "free"
    p.write_text('[capacity]\ntp_departures = "orthogonl"\n')
    with pytest.raises(InputError, match=r"c\.toml: 'capacity\.tp_departures' must be one of 'free', 'orthogonal', "
                                         r"got 'orthogonl'"):
        load_card(p)


def test_the_sampled_capacity_coordinate_is_the_whole_log_capacity_at_its_tp() -> None:
    # Centred: tp_z[..., 0] · tp_sd is the class's log capacity per GPU at the TP (less cap_loc),
    # parabola and departure together, so a measured load that pins a capacity pins the coordinate.
    grid = _grid()
    card = _card((0.3, 0.2, 0.1))
    draws = prior_predictive(grid, card, 50, seed=4)
    data = model_data(grid, np.ones((grid.n_cells, 4)), np.zeros(grid.n_cells, bool))
    cap_loc = np.asarray(data.cap_ref) + np.log(card.capacity_relative_to_offered)  # (classes,)
    col = np.log2(grid.tp).astype(int)
    z = draws["tp_z"][:, grid.workload_idx, col, 0]  # (draws, cells)
    expected = np.log(grid.tp) + cap_loc[grid.workload_idx] + 0.3 * z
    np.testing.assert_allclose(np.log(draws["capacity"]), expected, atol=2e-4)
    # The tails' columns stay non-centred: their coordinate is the departure over its sd.
    np.testing.assert_allclose(draws["tp_z"][..., 1:] * np.array([0.2, 0.1]), draws["tp_dev"][..., 1:], atol=1e-6)
