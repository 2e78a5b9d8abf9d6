"""Configurations in the model (fleetsieve_bayes.model.roles): what a catalogue's cells are to the
joint model, checked against hand computation and against the model without a catalogue; the
prior card's [roles] section feeding the role sites, and a card without one refused in one line."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from numpyro.infer import Predictive
from shipped import GRID, point_text

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.setup import resolve
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.configs import Role, ServingConfig
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.curves import _cell_shift, capacity_parabola, latent_metrics
from fleetsieve_bayes.model.data import model_data
from fleetsieve_bayes.model.joint import fleet_model
from fleetsieve_bayes.model.priors import PriorCard, load_card
from fleetsieve_bayes.model.roles import (
    config_centre,
    missing_roles_message,
    needs_roles,
    role_inputs,
    role_log_capacity,
)

AGG2 = ServingConfig(name="agg-tp2", tp=2)
AGG4 = ServingConfig(name="agg-tp4", tp=4)
AGG4_S64 = ServingConfig(name="agg-tp4-s64", tp=4, engine=(("max_num_seqs", 64),))
DIS = ServingConfig(name="2p-tp2+1d-tp4", prefill=Role(2, 2), decode=Role(4, 1))


def _grid(configs: tuple[ServingConfig, ...] | None, tps: list[int]) -> CellGrid:
    """Two classes × the given configurations (or bare TPs) × two loads."""
    cells = [(w, k, load) for w in range(2) for k in range(len(tps)) for load in range(2)]
    conf = np.array([k for _, k, _ in cells], np.int64)
    return CellGrid(
        workloads=("chat", "code"),
        workload_idx=np.array([w for w, _, _ in cells], np.int64),
        tp=np.array([tps[k] for _, k, _ in cells], np.int64),
        load=tuple(f"C{load}" for _, _, load in cells),
        offered_rps=np.array([1.0 + load + 0.5 * k for _, k, load in cells]),
        duration_s=np.full(len(cells), 300.0),
        config=None if configs is None else conf,
        configs=configs,
    )


def _params(n_classes: int = 2) -> dict[str, jnp.ndarray]:
    return {
        "knee": jnp.array([1.5, 2.0][:n_classes]),
        "curvature": jnp.array([0.4, 0.7][:n_classes]),
        "cap_level": jnp.array([0.2, -0.3][:n_classes]),
        "sharpness": jnp.asarray(15.0),
        "exponent": jnp.asarray(2.0),
        "tail_base": jnp.zeros((n_classes, 2)),
        "tail_slope": jnp.array([-0.3, -0.2]),
        "tail_blowup": jnp.ones((n_classes, 2)),
        "succ_base": jnp.full((n_classes,), 6.0),
        "succ_drop": jnp.full((n_classes,), 2.0),
        "prefill_share": jnp.array([0.3, 0.6][:n_classes]),
        "decode_gain": jnp.asarray(0.1),
        "kv_cost": jnp.asarray(0.05),
        "disagg_tail": jnp.array([0.2, -0.1]),
        "engine_coef": jnp.array([[0.25, 0.1, -0.05], [0.0, 0.0, 0.0]]),
    }


def test_a_catalogue_of_bare_tps_is_the_model_without_one() -> None:
    plain = model_data(_grid(None, [2, 4]), np.ones((8, 4)), np.zeros(8, bool))
    cat = model_data(_grid((AGG2, AGG4), [2, 4]), np.ones((8, 4)), np.zeros(8, bool))
    assert cat.roles is None
    for name in ("u", "u_lo", "u_hi", "cap_ref", "load_ref", "tp_onehot", "tp_log2"):
        np.testing.assert_array_equal(np.asarray(getattr(cat, name)), np.asarray(getattr(plain, name)), err_msg=name)


def test_engine_limits_or_roles_switch_the_roles_on() -> None:
    grid = _grid((AGG2, AGG4_S64, DIS), [2, 4, 8])
    roles = role_inputs(grid)
    assert roles is not None
    np.testing.assert_array_equal(np.asarray(roles.disagg), np.tile([False] * 4 + [True] * 2, 2))
    # max_num_seqs 64 against the reference 256: log2(1/4) = -2; unset elsewhere
    np.testing.assert_array_equal(np.asarray(roles.engine_x[:, 0]), np.tile([0, 0, -2, -2, 0, 0], 2))
    np.testing.assert_allclose(np.asarray(roles.u_prefill[4]), 1.0)
    np.testing.assert_allclose(np.asarray(roles.u_decode[4]), 2.0)
    np.testing.assert_allclose(np.asarray(roles.log_workers[4]), [math.log(2), 0.0])
    np.testing.assert_array_equal(np.asarray(roles.config_col), np.tile([0, 0, 1, 1, 2, 2], 2))
    data = model_data(grid, np.ones((12, 4)), np.zeros(12, bool))
    assert (float(data.u_lo), float(data.u_hi)) == (1.0, 2.0)  # engine TPs 2 and 4, not the 8 GPUs


def test_composition_is_the_slower_role_less_the_kv_cost() -> None:
    grid = _grid((AGG2, AGG4_S64, DIS), [2, 4, 8])
    roles = role_inputs(grid)
    p = _params()
    w = jnp.asarray(grid.workload_idx)
    knee, curv, cap = p["knee"][w], p["curvature"][w], p["cap_level"][w]

    def engine(v: jnp.ndarray) -> jnp.ndarray:
        return v * math.log(2.0) + cap - curv * (v - knee) ** 2

    out = np.asarray(role_log_capacity(p, roles, w, engine, engine(jnp.asarray(np.log2(grid.tp.astype(float))))))
    for c in range(grid.n_cells):
        k = int(grid.workload_idx[c])
        a, b, m = float(p["cap_level"][k]), float(p["curvature"][k]), float(p["knee"][k])

        def one(t: float, a: float = a, b: float = b, m: float = m) -> float:
            return t * math.log(2) + a - b * (t - m) ** 2

        share = float(p["prefill_share"][k])
        cfg = grid.serving_config(c)
        if cfg.disaggregated:
            prefill = math.log(2) + one(1.0) - math.log(share)
            decode = one(2.0) - math.log(1 - share) + 0.1
            want = min(prefill, decode) - 0.05
            assert out[c] == pytest.approx(want, abs=0.03)  # the smooth minimum (sharpness 25) within 0.03
            assert out[c] <= min(prefill, decode) - 0.05 + 1e-12
        else:
            want = one(math.log2(cfg.tp)) + 0.25 * (-2.0 if cfg.engine else 0.0)
            assert out[c] == pytest.approx(want, abs=1e-12)


def test_centre_of_an_aggregated_configuration_is_the_parabola() -> None:
    grid = _grid((AGG2, AGG4, DIS), [2, 4, 8])
    data = model_data(grid, np.ones((12, 4)), np.zeros(12, bool))
    p = _params()
    cap_loc = jnp.array([0.1, -0.2])
    centre = np.asarray(config_centre(p, data.roles, cap_loc))
    parabola = np.asarray(capacity_parabola(p, data, cap_loc))
    np.testing.assert_allclose(centre[:, :2], parabola[:, :2], rtol=0, atol=1e-12)
    # the disaggregated column: its composed capacity per GPU (8 GPUs a replica) less cap_loc
    w = jnp.asarray(grid.workload_idx)
    full = np.asarray(latent_metrics(p, data)[1])
    for k in range(2):
        c = int(np.flatnonzero((grid.workload_idx == k) & (grid.config_idx == 2))[0])
        assert centre[k, 2] == pytest.approx(math.log(full[c]) - math.log(8) - float(cap_loc[k]), abs=1e-9)
    assert w.shape == (12,)


def test_departures_by_index_equal_the_one_hot_product() -> None:
    grid = _grid((AGG2, AGG4_S64, DIS), [2, 4, 8])
    data = model_data(grid, np.ones((12, 4)), np.zeros(12, bool))
    dev = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 3)))
    by_index = np.asarray(_cell_shift({"tp_dev": dev}, data))
    one_hot = np.asarray(_cell_shift({"tp_dev": dev}, data._replace(roles=None)))
    np.testing.assert_array_equal(by_index, one_hot)


# ------------------------------------------------------------ the card's [roles]


def _prior_roles(card: PriorCard, n: int = 2000) -> dict[str, np.ndarray]:
    """Prior draws of the role sites of a two-class grid with a disaggregated configuration."""
    grid = _grid((AGG2, AGG4_S64, DIS), [2, 4, 8])
    data = model_data(grid, np.ones((12, 4)), np.zeros(12, bool))
    pred = Predictive(lambda d: fleet_model(d, card, None), num_samples=n,
                      return_sites=["prefill_share", "kv_cost", "decode_gain", "disagg_tail", "engine_coef"])
    return {k: np.asarray(v) for k, v in pred(jax.random.PRNGKey(0), data).items()}


def test_the_role_sites_read_the_cards_roles(tmp_path: Path) -> None:
    generic = _prior_roles(load_card("generic"))
    assert np.median(generic["prefill_share"]) == pytest.approx(0.5, abs=0.03)
    assert np.median(generic["kv_cost"]) == pytest.approx(0.05, rel=0.1)
    assert np.std(generic["decode_gain"]) == pytest.approx(0.3, rel=0.1)
    path = tmp_path / "mine.toml"
    path.write_text("[roles]\nprefill_share_logit_mean = 2.0\nkv_cost_median = 0.2\ndecode_gain_log_sd = 0.05\n"
                    "disagg_tail_sd = 0.1\nengine_coef_sd = 0.01\n")
    mine = _prior_roles(load_card(path))
    assert np.median(mine["prefill_share"]) == pytest.approx(1 / (1 + math.exp(-2.0)), abs=0.03)
    assert np.median(mine["kv_cost"]) == pytest.approx(0.2, rel=0.1)
    assert np.std(mine["decode_gain"]) == pytest.approx(0.05, rel=0.1)
    assert np.std(mine["disagg_tail"]) == pytest.approx(0.1, rel=0.1)
    assert np.std(mine["engine_coef"]) == pytest.approx(0.01, rel=0.1)
    # the keys the section leaves out keep the generic card's values
    assert np.std(np.log(mine["kv_cost"])) == pytest.approx(1.0, rel=0.1)


def test_a_card_without_roles_cannot_fit_a_catalogue_that_needs_them(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("[knee]\ntp = 4\n")
    with pytest.raises(InputError) as err:
        _prior_roles(load_card(path), n=2)
    assert str(err.value) == missing_roles_message("mine")
    assert "\n" not in str(err.value) and "copy the generic card's [roles]" in str(err.value)


def test_what_needs_the_roles() -> None:
    assert not needs_roles(None) and not needs_roles((AGG2, AGG4))
    assert needs_roles((AGG2, DIS)) and needs_roles((AGG4_S64,))
    # an engine limit at its reference value moves no covariate
    assert not needs_roles((ServingConfig(name="s256", tp=4, engine=(("max_num_seqs", 256),)),))


def _catalogued_campaign(tmp: Path, family: str, engine_limit: bool) -> Path:
    """The shipped campaign as a catalogue of its three TPs; with ``engine_limit``, TP8's engine
    runs max_num_seqs 128 (an engine covariate: the role model is on)."""
    grid = pd.read_csv(GRID)
    grid["config"] = [f"agg-tp{t}" for t in grid["tp"]]
    grid.to_csv(tmp / "grid.csv", index=False)
    configs = "".join(
        f'\n[[configs]]\nname = "agg-tp{t}"\ntp = {t}\n'
        + ("engine = { max_num_seqs = 128 }\n" if engine_limit and t == 8 else "")
        for t in (2, 4, 8)
    )
    path = tmp / "campaign.toml"
    path.write_text(point_text().replace('family = "dense-31b-fp8-h100"', f'family = "{family}"') + configs)
    return path


def test_a_catalogue_that_needs_roles_and_a_card_without_them_is_one_line_saying_how_to_add_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.toml").write_text("[knee]\ntp = 4\n")
    path = _catalogued_campaign(tmp_path, "mine.toml", engine_limit=True)
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"fleetsieve-bayes run: error: {path}: [model] family: the prior card {tmp_path / 'mine.toml'} has no [roles] "
        "section, "
        "which a catalogue of disaggregated configurations or engine limits needs (copy the generic card's "
        "[roles], or write one with `priors derive`)\n"
    )
    assert not (tmp_path / "run" / "journal.jsonl").exists()
    # A card with [roles] passes; so does the roleless card when the catalogue needs none.
    for family in ("generic", "dense-31b-fp8-h100"):
        assert resolve(load_campaign(_catalogued_campaign(tmp_path, family, engine_limit=True))).card.has_roles
    assert not resolve(load_campaign(_catalogued_campaign(tmp_path, "mine.toml", engine_limit=False))).card.has_roles
