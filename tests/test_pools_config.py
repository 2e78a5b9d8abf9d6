"""``[[fleet.pools]]``: parsing, bad input (one line naming the field), the table's
``gpu`` column, and ``allocate`` on a two-pool campaign."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_allocation_pools import brute_force

from fleetsieve_bayes.allocation.problem import (
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import FleetPool, load_campaign
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import read_table

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pools"
CAMPAIGN = FIXTURE / "campaign.toml"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h100_31b_fp8" / "campaign.toml"


def _copy(tmp_path: Path, old: str | None = None, new: str = "") -> Path:
    """The fixture campaign (and its table) in ``tmp_path``, with ``old`` replaced by ``new``."""
    shutil.copy(FIXTURE / "grid.csv", tmp_path / "grid.csv")
    text = CAMPAIGN.read_text()
    if old is not None:
        assert old in text, old
        text = text.replace(old, new, 1)
    p = tmp_path / "campaign.toml"
    p.write_text(text)
    return p


def test_pools_parse() -> None:
    c = load_campaign(CAMPAIGN)
    assert c.pools == (
        FleetPool("h100-sxm-80gb", 8, 4.0),
        FleetPool("a100-80gb", 16, 1.8),  # "A100-80GB" names the spec table's row
    )
    assert c.pool_names == ("h100-sxm-80gb", "a100-80gb")
    assert c.gpus == 24 and c.usd_per_hour_max == 60.0
    p = c.problem()
    assert p.gpus == 24 and p.pool_gpus.tolist() == [8, 16]
    assert p.usd_per_gpu_hour.tolist() == [4.0, 1.8] and p.usd_per_hour_max == 60.0


def test_single_type_campaign_is_one_unnamed_pool() -> None:
    c = load_campaign(EXAMPLE)
    assert c.pools == () and c.pool_names is None and c.usd_per_hour_max is None
    p = c.problem()
    assert p.pool_gpus is None and p.usd_per_gpu_hour is None and p.usd_per_hour_max == np.inf


def test_gpus_caps_the_total_and_nodes_are_read(tmp_path: Path) -> None:
    p = _copy(
        tmp_path,
        "[fleet]\n",
        '[fleet]\ngpus = 20\n',
    )
    text = p.read_text().replace(
        "count = 16\n", 'count = 16\nnodes = ["a1", "a2"]\ngpus_per_node = 8\n'
    )
    p.write_text(text)
    c = load_campaign(p)
    assert c.gpus == 20 and c.pools[1].nodes == ("a1", "a2") and c.pools[1].gpus_per_node == 8


def test_gpu_from_a_spec_file(tmp_path: Path) -> None:
    (tmp_path / "mygpu.toml").write_text(
        "[my-gpu]\nmemory_gb = 96.0\nhbm_bandwidth_tb_s = 4.0\nbf16_dense_tflops = 900.0\npcie_gb_s = 128.0\n"
    )
    p = _copy(tmp_path, 'gpu = "A100-80GB"', 'gpu = "mygpu.toml"')
    c = load_campaign(p)
    assert c.pools[1].gpu == "my-gpu" and c.pools[1].spec == str((tmp_path / "mygpu.toml").resolve())


BAD = [
    ('gpu = "A100-80GB"', 'gpu = "a1000"', "[[fleet.pools]] #2 gpu: unknown GPU 'a1000'"),
    ("count = 8", "count = 0", "[[fleet.pools]] #1 count: must be >= 1, got 0"),
    ("usd_per_gpu_hour = 1.8", "usd_per_gpu_hour = 0", "[[fleet.pools]] #2 usd_per_gpu_hour: must be > 0"),
    ("usd_per_gpu_hour = 4.0", "usd_per_gpu_hour = -2.0", "[[fleet.pools]] #1 usd_per_gpu_hour: must be > 0"),
    ("usd_per_gpu_hour = 4.0\n", "", "[[fleet.pools]] #1 usd_per_gpu_hour: missing"),
    ('gpu = "A100-80GB"', 'gpu = "h100-sxm-80gb"', "[[fleet.pools]] #2 gpu: 'h100-sxm-80gb' is already pool #1"),
    ("count = 8", "count = 8\ncuont = 1", "[[fleet.pools]] #1: unknown key 'cuont' (did you mean 'count'?)"),
    ("usd_per_hour_max = 60.0", "usd_per_hour_max = 0.0", "[fleet] usd_per_hour_max: must be > 0"),
    ("[fleet]\n", "[fleet]\ngpus = 30\n", "[fleet] gpus: 30 is more than the pools hold (24)"),
    ("count = 16", 'count = 16\nnodes = ["a1"]\ngpus_per_node = 8', "[[fleet.pools]] #2 count: 16 GPUs do not fit"),
    ("count = 16", "count = 16\nnodes = []", "[[fleet.pools]] #2 nodes: expected a non-empty list"),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD, ids=[b[2].split(":")[0] + "|" + b[1][:12] for b in BAD])
def test_bad_pools_name_the_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    p = _copy(tmp_path, old, new)
    with pytest.raises(InputError) as err:
        load_campaign(p)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(p)) and message in msg, msg


def test_usd_cap_without_pools_is_refused(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("gpus = 16", "gpus = 16\nusd_per_hour_max = 50.0")
    shutil.copy(EXAMPLE.parent / "grid.csv", tmp_path / "grid.csv")
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(InputError, match=r"\[fleet\] usd_per_hour_max: needs \[\[fleet.pools\]\]"):
        load_campaign(tmp_path / "c.toml")


def test_unknown_gpu_suggests_the_spec_name(tmp_path: Path) -> None:
    p = _copy(tmp_path, 'gpu = "A100-80GB"', 'gpu = "a100"')
    with pytest.raises(InputError, match=r"did you mean 'a100-80gb'\?"):
        load_campaign(p)


# ----------------------------------------------------------------------------- the table's gpu column


def test_gpu_column_round_trip_and_duplicates(tmp_path: Path) -> None:
    df = read_table(FIXTURE / "grid.csv")
    assert set(df["gpu"]) == {"h100-sxm-80gb", "a100-80gb"} and len(df) == 44
    # The same (workload, tp, load) on two GPUs is two cells; twice on one GPU is a duplicate.
    bad = pd.read_csv(FIXTURE / "grid.csv")
    bad.loc[30, "gpu"] = "h100-sxm-80gb"  # chat TP8@C64 on the H100 again
    bad.to_csv(tmp_path / "dup.csv", index=False)
    with pytest.raises(InputError, match=r"line 32: duplicate cell \(workload=chat, tp=8, load=C64, gpu=h100-sxm-80gb\)"):
        read_table(tmp_path / "dup.csv")


def test_old_table_without_gpu_is_the_single_pool() -> None:
    df = read_table(EXAMPLE.parent / "grid.csv")
    assert "gpu" not in df.columns
    grid = grid_from_table(df, ("chat", "code"), pools=("h100-sxm-80gb",))
    assert grid.n_pools == 1 and grid.named_pools and grid.key(0) == ("chat", 2, "C16")
    plain = grid_from_table(df, ("chat", "code"))
    assert plain.gpu is None and not plain.named_pools
    assert values_from_table(grid, df).tolist() == values_from_table(plain, df).tolist()


def test_grid_over_two_pools_orders_and_keys_cells() -> None:
    df = read_table(FIXTURE / "grid.csv")
    grid = grid_from_table(df, ("chat", "code"), pools=("h100-sxm-80gb", "a100-80gb"))
    assert grid.n_cells == 44 and grid.n_pools == 2
    # class, then pool, then TP, then offered load
    assert grid.key(0) == ("chat", 2, "C16", "h100-sxm-80gb")
    assert grid.key(11) == ("chat", 2, "C16", "a100-80gb")
    assert grid.describe(11) == "chat TP2@C16 on a100-80gb"
    v = values_from_table(grid, df)
    assert v[0, 0] == 1.596 and v[11, 0] == 0.958


def test_row_on_a_gpu_in_no_pool(tmp_path: Path) -> None:
    bad = pd.read_csv(FIXTURE / "grid.csv")
    bad.loc[40, "gpu"] = "l40s-48gb"
    bad.to_csv(tmp_path / "grid.csv", index=False)
    df = read_table(tmp_path / "grid.csv")
    with pytest.raises(InputError) as err:
        grid_from_table(df, ("chat", "code"), source="grid.csv", pools=("h100-sxm-80gb", "a100-80gb"))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (
        "grid.csv: cell code TP4@C128: column 'gpu' 'l40s-48gb' is in no [[fleet.pools]] entry "
        "(pools: h100-sxm-80gb, a100-80gb)"
    )


def test_several_types_without_pools_and_no_gpu_with_pools() -> None:
    df = read_table(FIXTURE / "grid.csv")
    with pytest.raises(InputError, match=r"column 'gpu' holds 2 GPU types"):
        grid_from_table(df, ("chat", "code"))
    old = read_table(EXAMPLE.parent / "grid.csv")
    with pytest.raises(InputError, match=r"no 'gpu' column, but the campaign has 2 GPU pools"):
        grid_from_table(old, ("chat", "code"), pools=("h100-sxm-80gb", "a100-80gb"))


# ----------------------------------------------------------------------------- allocate on pools

EXPECTED = {
    "status": "feasible",
    "allocation": {
        "chat": {"tp": 4, "load": "C96", "replicas": 3, "gpu": "a100-80gb"},
        "code": {"tp": 4, "load": "C96", "replicas": 2, "gpu": "h100-sxm-80gb"},
    },
    # chat 3 × 3.958 = 11.874 of 12 on A100s; code 2 × 11.116 ≥ 16 on H100s;
    # 12 A100 × $1.8 + 8 H100 × $4 = $53.6 ≤ the $60 cap.
    "objective": {"min_fulfillment": 0.9895, "goodput_rps": 27.874, "gpus_used": 20, "usd_per_hour": 53.6},
}


@pytest.mark.parametrize("solver", ["milp", "jax"])
def test_allocate_two_pools_json(capsys: pytest.CaptureFixture[str], solver: str) -> None:
    assert main(["allocate", str(CAMPAIGN), "--json", "--solver", solver]) == 0
    assert json.loads(capsys.readouterr().out) == EXPECTED


def test_two_pool_answer_is_the_brute_force_optimum() -> None:
    c = load_campaign(CAMPAIGN)
    df = read_table(c.measurement.table)
    grid = grid_from_table(df, c.workload_names, pools=c.pool_names)
    feasible, t, g, usd, gpus = brute_force(grid, values_from_table(grid, df), c.problem())
    obj = EXPECTED["objective"]
    assert feasible and gpus == obj["gpus_used"]
    assert (t, g, usd) == pytest.approx((obj["min_fulfillment"], obj["goodput_rps"], obj["usd_per_hour"]))


def test_allocate_refuses_a_row_on_an_unknown_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _copy(tmp_path)
    bad = pd.read_csv(tmp_path / "grid.csv")
    bad.loc[3, "gpu"] = "h200-141gb"
    bad.to_csv(tmp_path / "grid.csv", index=False)
    assert main(["allocate", str(p), "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "column 'gpu' 'h200-141gb' is in no [[fleet.pools]] entry" in err[0]


def test_run_of_several_pools_needs_a_card_with_a_gpu_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The fixture's card (the shipped H100 card) has no [gpu_axis]: one line naming [model] family."""
    assert main(["run", str(CAMPAIGN), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[model] family: the prior card" in err[-1] and "has no [gpu_axis]" in err[-1]
    assert not (tmp_path / "out").exists()


def test_run_of_several_pools_on_a_gpu_off_the_cards_axis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _copy(tmp_path, 'family = "dense-31b-fp8-h100"', 'family = "card-h100-a100.toml"')
    shutil.copy(FIXTURE / "card-h100-a100.toml", tmp_path / "card-h100-a100.toml")
    p.write_text(p.read_text().replace('gpu = "A100-80GB"', 'gpu = "l40s-48gb"'))
    assert main(["run", str(p), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[[fleet.pools]] #2 gpu: 'l40s-48gb' is not on the prior card's GPU axis" in err[-1]


def test_run_of_several_pools_on_vllm_reads_the_vllm_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The vLLM backend profiles every pool; its own keys are checked (one line, exit 2).
    p = _copy(tmp_path, 'backend = "replay"\ntable = "grid.csv"', 'backend = "vllm"')
    assert main(["run", str(p), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[-1].endswith("[measurement] model: missing"), err


def test_profiling_cost_in_dollars() -> None:
    from fleetsieve_bayes.table import gpu_seconds, profiling_usd

    df = read_table(FIXTURE / "grid.csv")
    prices = {"H100-SXM-80GB": 4.0, "a100-80gb": 1.8}
    h100 = df[df["gpu"] == "h100-sxm-80gb"]
    a100 = df[df["gpu"] == "a100-80gb"]
    want = gpu_seconds(h100) * 4.0 / 3600 + gpu_seconds(a100) * 1.8 / 3600
    assert profiling_usd(df, prices) == pytest.approx(want)
    # every row ran 300 s
    assert gpu_seconds(h100) == 300.0 * int(h100["tp"].sum())
    old = read_table(EXAMPLE.parent / "grid.csv")
    assert profiling_usd(old, prices, default_gpu="h100-sxm-80gb") == pytest.approx(gpu_seconds(old) * 4.0 / 3600)
    with pytest.raises(InputError, match="no price for GPU 'a100-80gb'"):
        profiling_usd(df, {"h100-sxm-80gb": 4.0})
    c = load_campaign(CAMPAIGN)
    grid = grid_from_table(df, c.workload_names, pools=c.pool_names)
    np.testing.assert_allclose(grid.cost_usd(np.array([4.0, 1.8])), grid.cost_gpu_s * np.where(grid.gpu == 0, 4.0, 1.8) / 3600)


@pytest.mark.slow  # a whole campaign in a fresh process; the pricing itself: test_profiling_cost_in_dollars
def test_run_with_one_priced_pool_reports_dollars(tmp_path: Path) -> None:
    """A campaign whose one pool is priced runs as before and adds usd_per_hour and profiling_usd."""
    from tiny_campaign import cli, write_tiny

    path = write_tiny(tmp_path / "c")
    path.write_text(
        path.read_text().replace(
            "[fleet]\ngpus = 8\n", '[[fleet.pools]]\ngpu = "h100-sxm-80gb"\ncount = 8\nusd_per_gpu_hour = 2.5\n'
        )
    )
    assert load_campaign(path).gpus == 8
    proc = cli("run", str(path), "--out", str(tmp_path / "out"), "--quiet")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["profiling_usd"] == pytest.approx(result["gpu_seconds"] * 2.5 / 3600)
    if result["objective"] is not None:
        assert result["objective"]["usd_per_hour"] == pytest.approx(2.5 * result["objective"]["gpus_used"])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("count = 8", "count = 0"), "[[fleet.pools]] #1 count: must be >= 1, got 0"),
        (('gpu = "A100-80GB"', 'gpu = "a1000"'), "[[fleet.pools]] #2 gpu: unknown GPU 'a1000'"),
        (("usd_per_gpu_hour = 1.8", "usd_per_gpu_hour = -1.0"), "[[fleet.pools]] #2 usd_per_gpu_hour: must be > 0"),
        (None, "column 'gpu' 'h200-141gb' is in no [[fleet.pools]] entry"),
    ],
)
def test_run_of_several_pools_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str] | None, message: str
) -> None:
    p = _copy(tmp_path, 'family = "dense-31b-fp8-h100"', 'family = "card-h100-a100.toml"')
    shutil.copy(FIXTURE / "card-h100-a100.toml", tmp_path / "card-h100-a100.toml")
    if edit is None:
        bad = pd.read_csv(tmp_path / "grid.csv")
        bad.loc[3, "gpu"] = "h200-141gb"
        bad.to_csv(tmp_path / "grid.csv", index=False)
    else:
        p.write_text(p.read_text().replace(*edit, 1))
    assert main(["run", str(p), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()
