"""Config worlds (fleetsieve_bayes/evaluation/config_worlds.py): the catalogue, the table and
campaign they write, and truth properties the benchmarks lean on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.backends.replay import make_replay_backend
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.configs import check_catalogue, parse_catalogue, resolve_configs
from fleetsieve_bayes.evaluation.config_worlds import (
    aggregated_only,
    config_toml,
    config_world,
    enumerate_catalogue,
    true_capacity,
    true_metrics,
    write_config_world,
)
from fleetsieve_bayes.evaluation.synthetic import truth_table
from fleetsieve_bayes.table import COLUMNS, gpu_seconds, read_table, validate_table

# Disaggregated layouts: prefill TP ∈ {1, 2, 4} × 1–3 workers, decode TP ∈ {1, 2, 4, 8} ×
# 1–2 workers, prefill_tp·prefill_workers + decode_tp·decode_workers ≤ max_gpus.
DISAGG_LAYOUTS = {8: 33, 4: 10}


def test_catalogue_counts_and_names():
    one = enumerate_catalogue(8, seqs=(256,))
    assert sum(not c.disaggregated for c in one) == 4  # TP 1, 2, 4, 8
    assert sum(c.disaggregated for c in one) == DISAGG_LAYOUTS[8]
    small = enumerate_catalogue(4, seqs=(256,))
    assert [c.tp for c in small if not c.disaggregated] == [1, 2, 4]
    assert sum(c.disaggregated for c in small) == DISAGG_LAYOUTS[4]
    assert len(enumerate_catalogue(8, seqs=(256,), disaggregated=False)) == 4

    full = enumerate_catalogue()  # max_num_seqs 64 and 256
    assert len(full) == 2 * (4 + DISAGG_LAYOUTS[8]) == 74
    assert all(c.gpus <= 8 for c in full)
    names = [c.name for c in full]
    assert len({n.lower() for n in names}) == len(names)
    assert "agg-tp4-s256" in names and "2p-tp2+1d-tp4-s256" in names
    check_catalogue(full, "test")
    # Aggregated first, in TP then max_num_seqs order.
    assert names[:8] == [f"agg-tp{t}-s{s}" for t in (1, 2, 4, 8) for s in (64, 256)]
    cfg = next(c for c in full if c.name == "2p-tp2+1d-tp4-s256")
    assert (cfg.prefill.tp, cfg.prefill.workers, cfg.decode.tp, cfg.decode.workers, cfg.gpus) == (2, 2, 4, 1, 8)
    assert cfg.engine_args == {"max_num_seqs": 256}

    sub = enumerate_catalogue(n_configs=63)
    assert len(sub) == 63 and sub == enumerate_catalogue(n_configs=63)
    assert [c for c in sub if not c.disaggregated] == [c for c in full if not c.disaggregated]
    assert [c.name for c in sub] == [n for n in names if n in {c.name for c in sub}]  # catalogue order kept
    check_catalogue(sub, "test")
    # The TOML tables parse back to the same catalogue.
    assert parse_catalogue([config_toml(c) for c in sub], "test") == sub
    with pytest.raises(ValueError):
        enumerate_catalogue(n_configs=7)


def test_world_table_is_a_valid_catalogued_table(tmp_path):
    world = config_world(0)
    table = world.table
    assert len(table) == 3 * 63 * 6
    assert list(table.columns[: len(COLUMNS)]) == list(COLUMNS)
    df = resolve_configs(validate_table(table), world.catalogue, "world")
    # A disaggregated row leaves tp empty; every row costs duration × the replica's GPUs.
    disagg = {c.name for c in world.catalogue if c.disaggregated}
    assert table.loc[table["config"].isin(disagg), "tp"].isna().all()
    assert table.loc[~table["config"].isin(disagg), "tp"].notna().all()
    assert 1.3e6 <= gpu_seconds(df) <= 1.9e6
    # One label is one offered rate within a class; each (class, config) has 6 loads.
    assert (table.groupby(["workload", "load"])["offered_rps"].nunique() == 1).all()
    assert (table.groupby(["workload", "config"]).size() == 6).all()
    # Truth never serves more than offered, windows stay within the table's slack.
    assert (table["true_throughput_rps"] <= table["offered_rps"]).all()
    assert not table.equals(truth_table(table))

    path = write_config_world(tmp_path / "w", world)
    campaign = load_campaign(path)
    assert campaign.configs == world.catalogue
    assert campaign.slo_attainment == "point"
    assert campaign.measurement.backend == "replay"
    assert [w.name for w in campaign.workloads] == [w["name"] for w in world.campaign["workloads"]]
    read = read_table(campaign.measurement.table)
    assert len(read) == len(table)
    backend = make_replay_backend(campaign)
    assert backend.grid.n_cells == len(table) and backend.grid.catalogued
    assert float(backend.grid.cost_gpu_s.sum()) == pytest.approx(gpu_seconds(df))


def test_same_seed_same_world():
    a, b = config_world(5, n_classes=2, n_configs=12, n_loads=4), config_world(5, n_classes=2, n_configs=12, n_loads=4)
    pd.testing.assert_frame_equal(a.table, b.table)
    assert a.campaign == b.campaign and a.regime == b.regime


def _optimum(world, tmp_path):
    """The exact optimum on the world's full truth table and the configurations it commits to."""
    campaign = load_campaign(write_config_world(tmp_path, world))
    df = resolve_configs(validate_table(truth_table(world.table)), campaign.configs, "truth")
    grid = grid_from_table(df, campaign.workload_names, configs=campaign.configs)
    alloc = allocate_milp(grid, values_from_table(grid, df), campaign.problem())
    assert alloc.feasible
    return alloc, [grid.serving_config(c) for c in alloc.committed()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_disaggregation_wins_only_in_its_regime(seed, tmp_path):
    alloc, used = _optimum(config_world(seed, regime="disagg"), tmp_path / "d")
    assert any(c.disaggregated for c in used)
    # Demands are set so the best fleet serves every class in full within the budget.
    assert alloc.min_fulfillment == pytest.approx(1.0)
    alloc, used = _optimum(config_world(seed, regime="agg"), tmp_path / "a")
    assert used and not any(c.disaggregated for c in used)
    assert alloc.min_fulfillment == pytest.approx(1.0)


def test_aggregated_only_world():
    world = config_world(1, regime="disagg")
    agg = aggregated_only(world)
    assert agg.catalogue == tuple(c for c in world.catalogue if not c.disaggregated)
    assert set(agg.table["config"]) == {c.name for c in agg.catalogue}
    assert agg.campaign["workloads"] == world.campaign["workloads"]
    assert [t["name"] for t in agg.campaign["configs"]] == [c.name for c in agg.catalogue]
    validate_table(agg.table)


def test_max_num_seqs_caps_throughput_and_bounds_itl():
    world = config_world(2, regime="mixed")
    by_name = {c.name: c for c in enumerate_catalogue()}
    strict = 0
    for cls in world.spec["classes"]:
        name = cls["name"]
        for small in (c for c in by_name.values() if c.name.endswith("-s64")):
            large = by_name[small.name[: -len("-s64")] + "-s256"]
            cap_s, cap_l = true_capacity(world.spec, name, small), true_capacity(world.spec, name, large)
            # Saturated: offered far past either capacity.
            sat = true_metrics(world.spec, name, small, [10 * cap_l])[0, 0], true_metrics(
                world.spec, name, large, [10 * cap_l])[0, 0]
            assert sat[0] <= sat[1] * (1 + 1e-9) and cap_s <= cap_l * (1 + 1e-12)
            if cap_s < cap_l * 0.99:
                strict += 1
                assert sat[0] < sat[1]
                # Below the small engine's capacity the large one runs bigger batches: its
                # decode time (completion − TTFT) is at least the small one's, and longer near it.
                offered = np.array([0.3, 0.6, 0.9]) * cap_s
                ms, ml = true_metrics(world.spec, name, small, offered), true_metrics(world.spec, name, large, offered)
                decode_s, decode_l = ms[:, 2] - ms[:, 1], ml[:, 2] - ml[:, 1]
                assert np.all(decode_l >= decode_s * (1 - 1e-12)) and decode_l[-1] > decode_s[-1]
    assert strict >= 10
