"""The catalogue of serving configurations (docs/contracts.md, "Configurations" and the
measurement table's *Configurations* paragraph): parsing the ``[[configs]]`` array, catalogued
tables, grids, results and journal cells, the catalogued initial design, and the shipped
campaign run as a catalogue of its three TP degrees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from campaign_dirs import CERTIFIED_GPU_SECONDS
from shipped import GRID, point_text

from fleetsieve_bayes.allocation.problem import (
    Allocation,
    allocation_to_json,
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.journal import Cell, Header, _Fields, open_journal
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.configs import (
    Role,
    ServingConfig,
    parse_catalogue,
    resolve_configs,
    table_for_campaign,
)
from fleetsieve_bayes.decision.design import DISAGGREGATED_PROBES, _catalogue_design
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.evaluation.config_worlds import config_world, world_grid
from fleetsieve_bayes.evaluation.regret import cells_from_json
from fleetsieve_bayes.table import COLUMNS, METRICS, read_table

# ------------------------------------------------------------------ parsing

_CAMPAIGN = """name = "cat"
[fleet]
gpus = 16
[model]
family = "dense-31b-fp8-h100"
[measurement]
backend = "replay"
table = "{table}"
[stopping]
epsilon = 0.05
slo_attainment = "point"
[[workloads]]
name = "chat"
demand_rps = 12.0
slo = {{ success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }}
[[workloads]]
name = "code"
demand_rps = 16.0
slo = {{ success_min = 0.99, ttft_p99_s = 5.0 }}
"""

# Each bad catalogue: its [[configs]] TOML, its parsed form, and the one line it is refused with
# (after "FILE: ").
BAD_CATALOGUES = {
    "no-gpus": (
        '[[configs]]\nname = "a"\nengine = { max_num_seqs = 64 }\n',
        [{"name": "a", "engine": {"max_num_seqs": 64}}],
        "[[configs]] 'a': has no GPUs: give tp (aggregated) or prefill and decode (disaggregated)",
    ),
    "tp-and-roles": (
        '[[configs]]\nname = "a"\ntp = 2\nprefill = { tp = 1 }\ndecode = { tp = 1 }\n',
        [{"name": "a", "tp": 2, "prefill": {"tp": 1}, "decode": {"tp": 1}}],
        "[[configs]] 'a': give either tp (aggregated) or prefill and decode (disaggregated), not both",
    ),
    "prefill-only": (
        '[[configs]]\nname = "a"\nprefill = { tp = 2, workers = 2 }\n',
        [{"name": "a", "prefill": {"tp": 2, "workers": 2}}],
        "[[configs]] 'a' decode: missing: a disaggregated configuration has both roles",
    ),
    "engine-typo": (
        '[[configs]]\nname = "a"\ntp = 4\nengine = { max_num_seq = 256 }\n',
        [{"name": "a", "tp": 4, "engine": {"max_num_seq": 256}}],
        "[[configs]] 'a' engine.max_num_seq: vLLM has no engine argument 'max_num_seq' "
        "(did you mean 'max_num_seqs'?)",
    ),
    "engine-layout": (
        '[[configs]]\nname = "a"\ntp = 4\nengine = { tensor_parallel_size = 4 }\n',
        [{"name": "a", "tp": 4, "engine": {"tensor_parallel_size": 4}}],
        "[[configs]] 'a' engine.tensor_parallel_size: is set by the configuration's layout "
        "(tp, prefill, decode), not under engine",
    ),
    "name-twice": (
        '[[configs]]\nname = "Agg-TP4"\ntp = 4\n[[configs]]\nname = "agg-tp4"\ntp = 8\n',
        [{"name": "Agg-TP4", "tp": 4}, {"name": "agg-tp4", "tp": 8}],
        "[[configs]] 'agg-tp4': the name is used twice (also 'Agg-TP4')",
    ),
    "layout-twice": (
        '[[configs]]\nname = "a"\ntp = 4\nengine = { max_num_seqs = 64 }\n'
        '[[configs]]\nname = "b"\ntp = 4\nengine = { max_num_seqs = 64 }\n',
        [{"name": "a", "tp": 4, "engine": {"max_num_seqs": 64}}, {"name": "b", "tp": 4, "engine": {"max_num_seqs": 64}}],
        "[[configs]] 'b': is the same layout and engine arguments as 'a': two names for one layout",
    ),
    "tp-0": (
        '[[configs]]\nname = "a"\ntp = 0\n',
        [{"name": "a", "tp": 0}],
        "[[configs]] 'a' tp: expected an integer >= 1, got 0",
    ),
    "workers-0": (
        '[[configs]]\nname = "a"\nprefill = { tp = 2, workers = 0 }\ndecode = { tp = 4 }\n',
        [{"name": "a", "prefill": {"tp": 2, "workers": 0}, "decode": {"tp": 4}}],
        "[[configs]] 'a' prefill.workers: expected an integer >= 1, got 0",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CATALOGUES))
def test_a_bad_catalogue_is_one_line_naming_the_file_and_the_entry(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, raw, message = BAD_CATALOGUES[case]
    with pytest.raises(InputError) as parsed:
        parse_catalogue(raw, "c.toml")
    assert str(parsed.value) == f"c.toml: {message}"

    path = tmp_path / "campaign.toml"
    path.write_text(_CAMPAIGN.format(table=GRID) + toml)
    with pytest.raises(InputError) as loaded:
        load_campaign(path)
    assert str(loaded.value) == f"{path}: {message}" and "\n" not in str(loaded.value)

    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"fleetsieve-bayes run: error: {path}: {message}\n"


def test_an_empty_or_malformed_configs_array_is_refused() -> None:
    with pytest.raises(InputError, match=r"^c\.toml: \[\[configs\]\]: expected a non-empty array of tables$"):
        parse_catalogue([], "c.toml")
    with pytest.raises(InputError, match=r"^c\.toml: \[\[configs\]\] #2\.name: expected a name"):
        parse_catalogue([{"name": "a", "tp": 1}, {"name": "b c", "tp": 2}], "c.toml")
    with pytest.raises(InputError, match=r"^c\.toml: \[\[configs\]\] #1\.workers: unknown key; allowed: "):
        parse_catalogue([{"name": "a", "workers": 2}], "c.toml")


# ------------------------------------------------------------- ServingConfig

_AGG = {"name": "agg-tp4-s256", "tp": 4, "engine": {"max_num_seqs": 256}}
_DISAGG = {"name": "2p-tp2+1d-tp4", "prefill": {"tp": 2, "workers": 2}, "decode": {"tp": 4},
           "engine": {"max_num_seqs": 256, "enable_chunked_prefill": False}}


def test_gpus_and_json_round_trip() -> None:
    agg, dis = parse_catalogue([_AGG, _DISAGG], "c.toml")
    assert agg == ServingConfig("agg-tp4-s256", tp=4, engine=(("max_num_seqs", 256),))
    assert dis == ServingConfig("2p-tp2+1d-tp4", prefill=Role(2, 2), decode=Role(4, 1),
                                engine=(("enable_chunked_prefill", False), ("max_num_seqs", 256)))
    assert (agg.gpus, agg.disaggregated) == (4, False)
    assert (dis.gpus, dis.disaggregated) == (2 * 2 + 1 * 4, True) == (8, True)
    assert agg.to_json() == {"name": "agg-tp4-s256", "gpus": 4, "tp": 4, "engine": {"max_num_seqs": 256}}
    assert dis.to_json() == {
        "name": "2p-tp2+1d-tp4", "gpus": 8, "prefill": {"tp": 2, "workers": 2}, "decode": {"tp": 4, "workers": 1},
        "engine": {"enable_chunked_prefill": False, "max_num_seqs": 256},
    }
    # to_json's "gpus" is derived, not a key of [[configs]]: without it the entry parses back to itself.
    back = parse_catalogue([{k: v for k, v in c.to_json().items() if k != "gpus"} for c in (agg, dis)], "j")
    assert back == (agg, dis)
    assert ServingConfig("bare", tp=2).to_json() == {"name": "bare", "gpus": 2, "tp": 2}


# -------------------------------------------------------------------- tables

_HEAD = "workload,tp,load,offered_rps,throughput_rps,ttft_p99_s,completion_p99_s,success_rate,duration_s,config"
_CATALOGUE = parse_catalogue(
    [{"name": "agg-tp4", "tp": 4}, {"name": "agg-tp2", "tp": 2},
     {"name": "1p-tp2+1d-tp4", "prefill": {"tp": 2}, "decode": {"tp": 4}}], "c.toml")


def _rows(*rows: str) -> str:
    return "\n".join([_HEAD, *rows]) + "\n"


_TABLE = _rows(
    "code,,C32,3.2,3.1,1.0,20,1.0,300,1p-tp2+1d-tp4",
    "chat,4,C96,9.6,6.2,1.2,20,0.995,300,agg-tp4",
    "chat,,C32,3.2,3.1,0.5,9,1.0,300,1P-TP2+1D-TP4",
    "chat,,C16,1.6,1.6,0.4,8,1.0,300,agg-tp2",
    "code,2,C16,1.6,1.6,1.0,20,1.0,300,agg-tp2",
    "chat,,C32,3.2,3.2,0.4,8,1.0,300,AGG-TP4",
    "chat,2,C32,3.2,2.4,2.9,38,0.98,300,agg-tp2",
    "code,,C64,6.4,6.0,1.5,25,0.999,300,agg-tp4",
)


def test_a_catalogued_csv_reads_and_resolves(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(_TABLE)
    df = read_table(path)
    assert df["tp"].tolist() == [0, 4, 0, 0, 2, 0, 2, 0]  # empty: 0 until the catalogue resolves it
    assert df["config"].tolist()[2] == "1P-TP2+1D-TP4"
    resolved = resolve_configs(df, _CATALOGUE, str(path), row_offset=2)
    assert resolved["tp"].tolist() == [6, 4, 6, 2, 2, 4, 2, 4]  # GPUs of one replica
    assert resolved["config"].tolist() == [
        "1p-tp2+1d-tp4", "agg-tp4", "1p-tp2+1d-tp4", "agg-tp2", "agg-tp2", "agg-tp4", "agg-tp2", "agg-tp4"]
    assert df["tp"].tolist()[0] == 0  # a copy: the table read is unchanged
    # One owner reads a table for a campaign: the same.
    pd.testing.assert_frame_equal(table_for_campaign(df, _CATALOGUE, str(path)), resolved)
    # A disaggregated row may give the replica's GPUs (as a journal's rows do).
    path.write_text(_rows("chat,6,C32,3.2,3.1,0.5,9,1.0,300,1p-tp2+1d-tp4"))
    assert resolve_configs(read_table(path), _CATALOGUE, str(path), row_offset=2)["tp"].tolist() == [6]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("chat,4,C64,6.4,6.0,1.0,20,1.0,300,agg-tp8",
         "line 3: config 'agg-tp8' is not in the campaign's [[configs]] (agg-tp4, agg-tp2, 1p-tp2+1d-tp4)"),
        ("chat,8,C64,6.4,6.0,1.0,20,1.0,300,AGG-TP4", "line 3: config 'agg-tp4' has tp 4, but the row says tp 8"),
        ("chat,4,C64,6.4,6.0,1.0,20,1.0,300,1p-tp2+1d-tp4",
         "line 3: config '1p-tp2+1d-tp4' has an empty tp (it is disaggregated, 6 GPUs a replica), "
         "but the row says tp 4"),
    ],
)
def test_a_row_against_the_catalogue_is_refused_in_one_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(_rows("chat,,C32,3.2,3.2,0.4,8,1.0,300,agg-tp4", row))
    with pytest.raises(InputError) as e:
        table_for_campaign(read_table(path), _CATALOGUE, str(path), "c.toml")
    assert str(e.value) == f"{path}: {message}"


def test_a_config_column_without_a_catalogue_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(_rows("chat,4,C32,3.2,3.2,0.4,8,1.0,300,", "chat,2,C32,3.2,2.4,2.9,38,0.98,300,agg-tp2"))
    df = read_table(path)
    with pytest.raises(InputError) as e:
        table_for_campaign(df, None, str(path), "c.toml")
    assert str(e.value) == (f"{path}: line 3: config 'agg-tp2': column 'config' names configurations, "
                            f"but c.toml declares no [[configs]]")
    # An empty config column is no catalogue: the table reads as before.
    path.write_text(_rows("chat,4,C32,3.2,3.2,0.4,8,1.0,300,"))
    plain = table_for_campaign(read_table(path), None, str(path), "c.toml")
    assert plain["tp"].tolist() == [4]


def test_one_cell_twice_is_a_duplicate_whether_or_not_it_gives_tp(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(_rows("chat,4,C32,3.2,3.2,0.4,8,1.0,300,agg-tp4", "chat,2,C32,3.2,2.4,2.9,38,0.98,300,agg-tp2",
                          "chat,,C32,3.2,3.1,0.4,8,1.0,300,Agg-Tp4"))
    with pytest.raises(InputError) as e:
        read_table(path)
    assert str(e.value) == f"{path}: line 4: duplicate cell (workload=chat, config=agg-tp4, load=C32), first at line 2"


@pytest.mark.parametrize("tp_dtype", ["Int64", "float64"])
def test_a_catalogued_parquet_table_round_trips(tmp_path: Path, tp_dtype: str) -> None:
    (tmp_path / "t.csv").write_text(_TABLE)
    raw = pd.read_csv(tmp_path / "t.csv")
    raw["tp"] = raw["tp"].astype(tp_dtype)  # empty (<NA> or NaN) where disaggregated or left out
    assert raw["tp"].isna().sum() == 5
    raw.to_parquet(tmp_path / "t.parquet", index=False)
    from_csv = read_table(tmp_path / "t.csv")
    from_parquet = read_table(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(from_parquet, from_csv)
    resolved = table_for_campaign(from_parquet, _CATALOGUE, str(tmp_path / "t.parquet"))
    assert resolved["tp"].tolist() == [6, 4, 6, 2, 2, 4, 2, 4]
    # A Parquet row is named by its index, not a file line.
    raw.loc[1, "config"] = "nope"
    raw.to_parquet(tmp_path / "bad.parquet", index=False)
    with pytest.raises(InputError, match=r"bad\.parquet: row 1: config 'nope' is not in"):
        table_for_campaign(read_table(tmp_path / "bad.parquet"), _CATALOGUE, str(tmp_path / "bad.parquet"))


# --------------------------------------------------------------------- grids


def _grid(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text(_TABLE)
    df = table_for_campaign(read_table(path), _CATALOGUE, str(path))
    return grid_from_table(df, ("chat", "code"), configs=_CATALOGUE), df


def test_a_catalogued_grid_orders_keys_and_describes_its_cells(tmp_path: Path) -> None:
    grid, df = _grid(tmp_path)
    assert grid.catalogued
    # Workload (campaign order), then catalogue order (agg-tp4 before agg-tp2: not by TP), then load.
    assert [grid.key(i) for i in range(grid.n_cells)] == [
        ("chat", "agg-tp4", "C32"), ("chat", "agg-tp4", "C96"),
        ("chat", "agg-tp2", "C16"), ("chat", "agg-tp2", "C32"),
        ("chat", "1p-tp2+1d-tp4", "C32"),
        ("code", "agg-tp4", "C64"), ("code", "agg-tp2", "C16"), ("code", "1p-tp2+1d-tp4", "C32"),
    ]  # fmt: skip
    assert grid.config.tolist() == [0, 0, 1, 1, 2, 0, 1, 2]
    assert grid.tp.tolist() == [4, 4, 2, 2, 6, 4, 2, 6]
    assert grid.cost_gpu_s.tolist() == [1200.0, 1200.0, 600.0, 600.0, 1800.0, 1200.0, 600.0, 1800.0]
    assert grid.describe(1) == "chat agg-tp4@C96"
    assert grid.describe(4) == "chat 1p-tp2+1d-tp4@C32"
    assert grid.serving_config(4) is _CATALOGUE[2]
    assert grid.index()[("code", "agg-tp2", "C16")] == 6
    # Each cell's values are its own row's.
    values = values_from_table(grid, df)
    assert values[1].tolist() == [6.2, 1.2, 20.0, 0.995] and values[7].tolist() == [3.1, 1.0, 20.0, 1.0]


def _alloc(cell: list[int], replicas: list[int]) -> Allocation:
    return Allocation(status="feasible", cell=np.array(cell), replicas=np.array(replicas), served=np.ones(2),
                      min_fulfillment=1.0, goodput_rps=2.0, gpus_used=14)


def test_allocation_json_names_the_configuration(tmp_path: Path) -> None:
    grid, _ = _grid(tmp_path)
    assert allocation_to_json(_alloc([1, 7], [2, 1]), grid) == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2, "config": "agg-tp4", "gpus_per_replica": 4},
        "code": {"tp": None, "load": "C32", "replicas": 1, "config": "1p-tp2+1d-tp4", "gpus_per_replica": 6},
    }
    assert allocation_to_json(_alloc([4, -1], [1, 0]), grid) == {
        "chat": {"tp": None, "load": "C32", "replicas": 1, "config": "1p-tp2+1d-tp4", "gpus_per_replica": 6},
        "code": {"tp": None, "load": None, "replicas": 0, "config": None, "gpus_per_replica": None},
    }
    assert allocation_to_json(_alloc([-1, -1], [0, 0])._replace(status="infeasible"), grid) is None
    # cells_from_json reads it back to the cells, the disaggregated one included.
    back = cells_from_json(grid, allocation_to_json(_alloc([1, 7], [2, 1]), grid))
    assert back is not None and back[0].tolist() == [1, 7] and back[1].tolist() == [2, 1]


def test_without_a_catalogue_allocation_json_has_no_config_key() -> None:
    df = read_table(GRID)
    grid = grid_from_table(df, ("chat", "code"))
    assert not grid.catalogued and grid.describe(0) == "chat TP2@C16" and grid.key(0) == ("chat", 2, "C16")
    i, j = grid.index()[("chat", 4, "C96")], grid.index()[("code", 8, "C96")]
    assert allocation_to_json(_alloc([i, j], [2, 1]), grid) == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 8, "load": "C96", "replicas": 1},
    }
    assert allocation_to_json(_alloc([i, -1], [2, 0]), grid) == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": None, "load": None, "replicas": 0},
    }


def test_cells_from_json_reads_a_result_with_a_disaggregated_entry(tmp_path: Path) -> None:
    grid, _ = _grid(tmp_path)
    result = {
        "chat": {"tp": None, "load": "C32", "replicas": 3, "config": "1p-tp2+1d-tp4", "gpus_per_replica": 6},
        "code": {"tp": 4, "load": "C64", "replicas": 1, "config": "agg-tp4", "gpus_per_replica": 4},
    }
    cell, reps = cells_from_json(grid, result)
    assert cell.tolist() == [4, 5] and reps.tolist() == [3, 1]
    assert grid.key(4) == ("chat", "1p-tp2+1d-tp4", "C32")
    # A class that gets nothing stays -1; a null allocation is None.
    result["code"] = {"tp": None, "load": None, "replicas": 0, "config": None, "gpus_per_replica": None}
    cell, reps = cells_from_json(grid, result)
    assert cell.tolist() == [4, -1] and reps.tolist() == [3, 0]
    assert cells_from_json(grid, None) is None


# -------------------------------------------------------------- journal cells


def test_a_catalogued_cell_round_trips_through_the_journal(tmp_path: Path) -> None:
    cell = Cell("chat", "2p-tp2+1d-tp4", "C96")
    assert cell.catalogued and cell.config == "2p-tp2+1d-tp4" and cell.label == "chat 2p-tp2+1d-tp4@C96"
    assert cell.to_json() == {"workload": "chat", "config": "2p-tp2+1d-tp4", "load": "C96"}
    f = _Fields({}, "journal.jsonl line 1")
    back = f.cell("cell", cell.to_json())
    assert back == cell and back.catalogued and tuple(back) == ("chat", "2p-tp2+1d-tp4", "C96")
    # An uncatalogued cell keeps its TP, and its JSON has no config.
    assert Cell("chat", 4, "C96").to_json() == {"workload": "chat", "tp": 4, "load": "C96"}
    assert f.cell("cell", {"workload": "chat", "tp": 4, "load": "C96"}) == Cell("chat", 4, "C96")
    with pytest.raises(InputError) as e:
        f.cell("cells[0]", {"workload": "chat", "config": 4, "load": "C96"})
    assert str(e.value) == "journal.jsonl line 1: field 'cells[0].config' must be a string, got 4"

    header = Header(campaign="c", strategy="fleetsieve", seed=0,
                    cells=(Cell("chat", "agg-tp4", "C96"), cell))
    raw = header.to_json()
    assert raw["cells"] == [{"workload": "chat", "config": "agg-tp4", "load": "C96"}, cell.to_json()]
    assert Header.from_json(raw) == header
    j = open_journal(tmp_path)
    j.append(header)
    j.close()
    j2 = open_journal(tmp_path)
    assert j2.header == header and all(c.catalogued for c in j2.header.cells)
    j2.close()


# ------------------------------------------------------------ initial design


def test_the_catalogued_design_on_a_small_config_world() -> None:
    world = config_world(0, n_classes=2, n_configs=11, n_loads=3)
    grid, _, _ = world_grid(world, truth=False)
    design = _catalogue_design(grid)
    configs = grid.configs
    assert configs is not None
    n_disagg = sum(c.disaggregated for c in configs)
    assert (len(configs), n_disagg, DISAGGREGATED_PROBES) == (11, 3, 2)
    per_class = []
    for w in range(grid.n_classes):
        picks = [i for i in design if grid.workload_idx[i] == w]
        per_class.append(picks)
        confs = [configs[int(grid.config[i])] for i in picks]
        agg = [c for c in confs if not c.disaggregated]
        # One probe per aggregated TP, in TP order, then min(2, n_disagg) distinct disaggregated ones.
        assert [c.tp for c in agg] == [1, 2, 4, 8]
        assert len(confs) - len(agg) == min(DISAGGREGATED_PROBES, n_disagg)
        assert len({c.name for c in confs}) == len(confs)
        # Each at the (lower) median offered load of its (class, configuration).
        for i in picks:
            same = np.flatnonzero((grid.workload_idx == w) & (grid.config == grid.config[i]))
            ladder = same[np.argsort(grid.offered_rps[same], kind="stable")]
            assert i == ladder[(len(ladder) - 1) // 2]
    assert design == per_class[0] + per_class[1]  # class by class
    # Engine variants rotate: the two classes see different max_num_seqs at each TP.
    variants = [[grid.serving_config(i).engine_args["max_num_seqs"] for i in p[:4]] for p in per_class]
    assert variants == [[64, 256, 64, 256], [256, 64, 256, 64]]
    assert [grid.describe(i) for i in design] == [
        "assist agg-tp1-s64@C4", "assist agg-tp2-s256@C17", "assist agg-tp4-s64@C13", "assist agg-tp8-s256@C22",
        "assist 1p-tp1+1d-tp1-s64@C7", "assist 1p-tp4+1d-tp4-s256@C25",
        "chat agg-tp1-s256@C6", "chat agg-tp2-s64@C9", "chat agg-tp4-s256@C17", "chat agg-tp8-s64@C13",
        "chat 1p-tp1+1d-tp1-s64@C7", "chat 1p-tp2+2d-tp1-s64@C14",
    ]


# --------------------------------------------- the shipped campaign, catalogued

# The uncatalogued shipped campaign's measured cells at "point" (tests/test_campaign.py,
# test_shipped_campaign_at_point_certifies_chat_and_code_tp4_c96_x2_in_10800_gpu_seconds).
SHIPPED_POINT_CELLS = [
    ("chat", 2, "C32"), ("chat", 4, "C64"), ("chat", 8, "C64"),
    ("code", 2, "C16"), ("code", 4, "C64"), ("code", 8, "C96"),
    ("code", 4, "C96"), ("chat", 4, "C96"),
]  # fmt: skip
_AGG_CONFIGS = "".join(f'\n[[configs]]\nname = "agg-tp{t}"\ntp = {t}\n' for t in (2, 4, 8))


def _catalogued_shipped(tmp: Path) -> Path:
    grid = pd.read_csv(GRID)
    grid["config"] = [f"agg-tp{t}" for t in grid["tp"]]
    grid.to_csv(tmp / "grid.csv", index=False)
    path = tmp / "campaign.toml"
    path.write_text(point_text() + _AGG_CONFIGS)
    return path


@pytest.mark.slow  # a whole campaign in a fresh process (~70 s)
def test_the_shipped_campaign_as_a_catalogue_decides_as_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign = _catalogued_shipped(tmp_path)
    assert [c.name for c in load_campaign(campaign).configs] == ["agg-tp2", "agg-tp4", "agg-tp8"]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(out),
                           "--quiet"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "certified-feasible"
    assert result["gpu_seconds"] == CERTIFIED_GPU_SECONDS == 10800.0
    assert len(result["measured"]) == 8
    assert [(m["workload"], m["config"], m["load"]) for m in result["measured"]] == [
        (w, f"agg-tp{tp}", load) for w, tp, load in SHIPPED_POINT_CELLS]
    assert all("tp" not in m for m in result["measured"])
    tp4 = {"tp": 4, "load": "C96", "replicas": 2, "config": "agg-tp4", "gpus_per_replica": 4}
    assert result["allocation"] == {"chat": tp4, "code": tp4}

    bounds = pd.read_csv(out / "bounds.csv")
    assert list(bounds.columns) == [
        "workload", "tp", "config", "gpus_per_replica", "load", "measured", "throughput_lo", "throughput_hi",
        "ttft_p99_lo", "ttft_p99_hi", "completion_p99_lo", "completion_p99_hi", "success_lo", "success_hi",
    ]  # fmt: skip
    assert len(bounds) == 22 and bounds["measured"].sum() == 8
    assert (bounds["config"] == [f"agg-tp{t}" for t in bounds["tp"]]).all()
    assert (bounds["gpus_per_replica"] == bounds["tp"]).all()

    # measurements.csv names each row's config and reads back to the table's rows of the cells measured.
    written = pd.read_csv(out / "measurements.csv")
    assert written["config"].tolist() == [f"agg-tp{tp}" for _, tp, _ in SHIPPED_POINT_CELLS]
    catalogue = load_campaign(campaign).configs
    back = resolve_configs(read_table(out / "measurements.csv"), catalogue, "measurements.csv", row_offset=2)
    table = resolve_configs(read_table(tmp_path / "grid.csv"), catalogue, "grid.csv", row_offset=2)
    expected = pd.concat(
        [table[(table["workload"] == w) & (table["config"] == f"agg-tp{tp}") & (table["load"] == load)]
         for w, tp, load in SHIPPED_POINT_CELLS], ignore_index=True)
    cols = [*COLUMNS, "config"]
    pd.testing.assert_frame_equal(back[cols].reset_index(drop=True), expected[cols], check_dtype=False)
    assert set(METRICS) <= set(cols)

    header = json.loads((out / "journal.jsonl").read_text().splitlines()[0])
    assert header["type"] == "header" and len(header["cells"]) == 22
    assert all(set(c) == {"workload", "config", "load"} for c in header["cells"])

    # allocate on the catalogued table gives the same allocation.
    assert main(["allocate", str(campaign), "--json"]) == 0
    allocated = json.loads(capsys.readouterr().out)
    assert allocated["status"] == "feasible" and allocated["allocation"] == result["allocation"]
