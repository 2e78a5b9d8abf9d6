"""The GPU type as an axis of the joint model: roofline ratio × learned per-type deviation."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from numpyro import handlers

from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.campaign.journal import Cell
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.evaluation.mixed_pools import mixed_fleet, true_values
from fleetsieve_bayes.model.gpu_axis import card_with_axis, grid_gpu_inputs
from fleetsieve_bayes.model.joint import fleet_model, model_data
from fleetsieve_bayes.model.priors import load_card
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

REPO = Path(__file__).resolve().parent.parent
GENERIC = data_dir("priors") / "generic.toml"


def _fleet_with(gpu: str, need_mix: bool = False):
    for seed in range(40):
        f = mixed_fleet(np.random.default_rng(seed), need_mix=need_mix)
        if gpu in f.info["types"]:
            return f
    raise AssertionError(f"no fleet with {gpu}")


def _card(tmp_path: Path, fleet):
    path = tmp_path / "card.toml"
    path.write_text(card_with_axis(GENERIC.read_text(), fleet.card_axis))
    return load_card(path)


def _sites(data, card) -> dict:
    tr = handlers.trace(handlers.seed(fleet_model, jax.random.PRNGKey(0))).get_trace(data, card, None)
    return {k: v["value"].shape for k, v in tr.items() if v["type"] == "sample"}


def test_a_single_type_grid_has_no_gpu_axis(tmp_path: Path) -> None:
    df = read_table(REPO / "examples" / "h100_31b_fp8" / "grid.csv")
    grid = grid_from_table(df, ("chat", "code"))
    fleet = _fleet_with("a100-80gb")
    card = _card(tmp_path, fleet)
    assert grid_gpu_inputs(grid, card) is None
    data = model_data(grid, np.ones((grid.n_cells, 4)), np.zeros(grid.n_cells, bool))
    assert data.gpu_offset is None and "gpu_z" not in _sites(data, card)


def test_a_mixed_grid_carries_ratios_and_one_deviation_per_type(tmp_path: Path) -> None:
    fleet = _fleet_with("a100-80gb")
    card = _card(tmp_path, fleet)
    pools = tuple(fleet.info["types"])
    names = tuple(w["name"] for w in fleet.campaign["workloads"])
    grid = grid_from_table(fleet.table, names, pools=pools)
    offset, onehot = grid_gpu_inputs(grid, card)
    assert offset.shape == (grid.n_cells, 3) and onehot.shape == (grid.n_cells, len(pools) - 1)
    on_ref = grid.gpu_idx == 0
    assert np.all(offset[on_ref] == 0) and np.all(onehot[on_ref] == 0)
    assert np.all(onehot[~on_ref].sum(1) == 1)
    a = pools.index("a100-80gb")
    assert np.all(offset[grid.gpu_idx == a, 0] < 0) and np.all(offset[grid.gpu_idx == a, 1] > 0)
    data = model_data(grid, np.ones((grid.n_cells, 4)), np.zeros(grid.n_cells, bool), gpu=(offset, onehot))
    assert _sites(data, card)["gpu_z"] == (len(names) + 1, len(pools) - 1, 3)


def test_several_pools_need_a_card_with_a_gpu_axis() -> None:
    fleet = _fleet_with("a100-80gb")
    grid = grid_from_table(fleet.table, tuple(w["name"] for w in fleet.campaign["workloads"]),
                           pools=tuple(fleet.info["types"]))
    with pytest.raises(InputError, match=r"the prior card has no \[gpu_axis\] section.*priors derive --also-gpus"):
        grid_gpu_inputs(grid, load_card("dense-31b-fp8-h100"))  # the generic card has one


def test_a_cell_on_a_pool_is_its_grid_key() -> None:
    plain, on = Cell("chat", 4, "C96"), Cell("chat", 4, "C96", "a100-80gb")
    assert tuple(plain) == ("chat", 4, "C96") and plain.gpu == "" and plain.to_json() == {"workload": "chat", "tp": 4, "load": "C96"}
    assert tuple(on) == ("chat", 4, "C96", "a100-80gb") and on.label == "chat TP4@C96 on a100-80gb"
    assert on.to_json()["gpu"] == "a100-80gb" and on != plain and Cell(*tuple(on)) == on


@pytest.mark.slow
def test_two_a100_cells_move_the_h100_predictions_toward_truth(tmp_path: Path) -> None:
    """Truth: a roofline-consistent mixed fleet (each class at its own request shape, so
    the card's ratios are off by a class-specific amount). Two A100 measurements of one
    class, nothing on the H100: the H100 predictions of that class get closer to the
    truth, narrower, and their 90 % intervals still hold the truth."""
    from fleetsieve_bayes.model import inference

    fleet = _fleet_with("a100-80gb")
    card = _card(tmp_path, fleet)
    pools = tuple(fleet.info["types"])
    names = tuple(w["name"] for w in fleet.campaign["workloads"])
    grid = grid_from_table(fleet.table, names, pools=pools)
    observed = values_from_table(grid, fleet.table)
    truth = values_from_table(grid, true_values(fleet.table))
    a = pools.index("a100-80gb")
    on_a = np.flatnonzero((grid.workload_idx == 0) & (grid.gpu_idx == a))
    tps = sorted(set(grid.tp[on_a].tolist()))
    pick = [on_a[grid.tp[on_a] == tps[-1]][-2], on_a[grid.tp[on_a] == tps[0]][-1]]
    on_h = np.flatnonzero((grid.workload_idx == 0) & (grid.gpu_idx == 0))

    def predict(measured: np.ndarray) -> tuple[float, float, float]:
        post = inference.fit(grid, observed, measured, card, "fast", seed=0)
        lat = post.latent[:, on_h, :3]  # throughput, ttft, completion
        med = np.median(lat, 0)
        lo, hi = np.quantile(lat, [0.05, 0.95], 0)
        tr = truth[on_h, :3]
        return (float(np.mean(np.abs(np.log(med / tr)))), float(np.mean((tr >= lo) & (tr <= hi))),
                float(np.mean(np.log(hi / lo))))

    none = np.zeros(grid.n_cells, bool)
    two = none.copy()
    two[pick] = True
    err0, _, width0 = predict(none)
    err1, cov1, width1 = predict(two)
    assert err1 < 0.7 * err0
    assert width1 < 0.6 * width0
    assert cov1 >= 0.9


def _mixed_study() -> Any:
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import mixed_pools

    return mixed_pools


def test_the_mixed_study_caps_every_campaign_of_a_fleet_at_max_rounds(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.evaluation.mixed_pools import single_type

    study = _mixed_study()
    fleet, path, campaign, grid, _, _ = study._fleet_setup(3, 0, tmp_path, max_rounds=7)
    assert campaign.max_rounds == 7
    single = load_campaign(single_type(tmp_path / "single", fleet, grid.pools[0]))
    assert single.max_rounds == 7 and single.pool_names == (grid.pools[0],)
    _, _, uncapped, _, _, _ = study._fleet_setup(3, 0, tmp_path / "other")
    assert uncapped.max_rounds is None


def test_the_mixed_study_reports_the_fleets_it_was_asked_for_and_those_already_done(tmp_path: Path) -> None:
    import argparse

    study = _mixed_study()
    rec = {"fleet": 5, "error": "RuntimeError: stopped"}
    partial = tmp_path / "p.jsonl"
    partial.write_text(json.dumps({"fleet": 2, "error": "RuntimeError: earlier"}) + "\n" + json.dumps(rec) + "\n")
    args = argparse.Namespace(fleets=0, only="5", partial=partial, out=tmp_path / "o.json", work=None, jobs=1)
    assert study.run_study(args) == 0
    res = json.loads((tmp_path / "o.json").read_text())
    assert [f["fleet"] for f in res["fleets"]] == [2, 5]  # nothing rerun: both were in the checkpoint
    assert res["summary"]["errors"] == 2


def test_the_mixed_study_compares_dollars_when_the_service_is_within_epsilon_of_the_best_single() -> None:
    study = _mixed_study()
    best = {"min_fulfillment": 1.0, "goodput_rps": 20.789, "usd_per_hour": 56.52}
    # 0.5 % less fulfilment and 0.07 rps less of 40 demanded: within ε = 0.01 at both stages
    near = study.versus_best_single((0.994805, 20.716514), best, 40.0, 0.01)
    assert near == {"same_service": False, "serves_more": False, "within_epsilon": True}
    assert not study.versus_best_single((0.985, 20.716514), best, 40.0, 0.01)["within_epsilon"]
    assert not study.versus_best_single((0.994805, 20.0), best, 40.0, 0.01)["within_epsilon"]  # 2 % of demand short
    more = study.versus_best_single((1.0, 21.0), best, 40.0, 0.01)
    assert more["serves_more"] and not more["within_epsilon"]


def _vs(usd: float, best_usd: float, *, within: bool, same: bool = False, more: bool = False, needs: bool) -> dict:
    return {"usd_per_hour": usd, "best_single": "h200", "best_single_usd_per_hour": best_usd,
            "same_service_as_best_single": same, "serves_more_than_best_single": more,
            "within_epsilon_of_best_single": within, "needs_mix": needs}


def test_the_mixed_study_compares_cost_with_the_best_single_type_on_each_truth() -> None:
    study = _mixed_study()
    fleets = [
        # within ε of the best single and cheaper: not worse, strictly better, a saving of 3/56.52
        {"fleet": 5, "info": {"need_mix": True},
         "by_truth": {"table": {"vs_single": _vs(53.52, 56.52, within=True, needs=True)},
                      "curve": {"vs_single": _vs(53.52, 56.52, within=True, needs=True)}}},
        # built to need a mix, yet one type serves it all as cheaply on the curves; dearer on them
        {"fleet": 10, "info": {"need_mix": True},
         "by_truth": {"table": {"vs_single": _vs(40.86, 40.86, within=True, same=True, needs=False)},
                      "curve": {"vs_single": _vs(66.49, 55.08, within=True, same=True, needs=False)}}},
    ]
    table, curve = (study.cost_summary(fleets, t) for t in ("table", "curve"))
    assert (table["not_worse"], table["not_worse_exact_service"], table["strictly_better_built"]) == (2, 1, 1)
    assert (curve["not_worse"], curve["needs_mix"], curve["strictly_better_needs_mix"]) == (1, 1, 1)
    assert curve["built_not_needed"] == [10] and curve["built_to_need_mix"] == 2
    assert abs(table["mean_saving"] - np.mean([3.0 / 56.52, 0.0])) < 1e-12
    # a record scored before the windows had a comparison: the curves' at its top level
    old = {"fleet": 1, "info": {"need_mix": False}, "single_optima": {"h200": {"min_fulfillment": 1.0, "goodput_rps": 2.0,
           "usd_per_hour": 9.0}}, "best_single": "h200", "usd_per_hour": 8.0, "best_single_usd_per_hour": 9.0,
           "same_service_as_best_single": True, "serves_more_than_best_single": False,
           "by_truth": {"curve": {"oracle_service": [1.0, 2.0], "oracle_usd_per_hour": 8.0}}}
    assert study.vs_single(old, "table") is None
    assert study.vs_single(old, "curve")["needs_mix"]  # the same service for a dollar less
    assert study.cost_summary([old], "curve")["strictly_better_needs_mix"] == 1


def test_a_card_written_with_a_gpu_axis_has_orthogonal_departures(tmp_path: Path) -> None:
    fleet = mixed_fleet(np.random.default_rng(0), need_mix=True)
    generic = (data_dir("priors") / "generic.toml").read_text(encoding="utf-8")
    p = tmp_path / "card.toml"
    p.write_text(card_with_axis(generic, fleet.card_axis), encoding="utf-8")
    card = load_card(p)
    assert card.capacity_tp_departures == "orthogonal" and card.capacity_tp_sd == 0.3  # the rest of [capacity] kept
    assert card.gpu_axis_reference is not None
    # a card that says otherwise keeps its word
    p.write_text(card_with_axis(generic.replace("[capacity]", '[capacity]\ntp_departures = "free"', 1), fleet.card_axis))
    assert load_card(p).capacity_tp_departures == "free"


def test_the_mixed_study_pools_gpu_seconds_over_fleets_beside_the_mean_ratio() -> None:
    study = _mixed_study()

    def fleet(k: int, mixed: float, singles: float) -> dict:
        return {"fleet": k, "gpu_seconds": mixed, "sum_single_gpu_seconds": singles, "gpu_seconds_ratio": mixed / singles,
                "certified": False, "false_certificate": False, "info": {"need_mix": False},
                "by_truth": {t: {"vs_single": _vs(50.0, 50.0, within=True, same=True, needs=False),
                                 "false_certificate": False} for t in ("table", "curve")}}

    s = study.summarise([fleet(0, 9_000.0, 10_000.0), fleet(1, 10_000.0, 40_000.0)])
    assert s["gpu_seconds_ratio_mean"] == (0.9 + 0.25) / 2
    assert s["gpu_seconds_ratio_pooled"] == 19_000.0 / 50_000.0  # the large fleet weighs more
    assert s["gpu_seconds_ratio_over_0_6"] == 1
