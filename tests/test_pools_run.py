"""`run` over several GPU pools: a replay campaign over one mixed table, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.fingerprint import campaign_inputs
from fleetsieve_bayes.table import read_table

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pools"
RUN = FIXTURE / "run.toml"


def test_the_fingerprint_holds_the_pools() -> None:
    c = load_campaign(RUN)
    fleet = campaign_inputs(c)["fleet"]
    assert [p["gpu"] for p in fleet["pools"]] == ["h100-sxm-80gb", "a100-80gb"]
    assert [p["count"] for p in fleet["pools"]] == [8, 16] and fleet["usd_per_hour_max"] == 60.0
    assert "pools" not in campaign_inputs(load_campaign(FIXTURE.parent.parent.parent / "examples" / "h100_31b_fp8" / "campaign.toml"))["fleet"]


@pytest.mark.slow
def test_a_mixed_replay_campaign_certifies_within_each_pool(tmp_path: Path) -> None:
    from fleetsieve_bayes.cli import main

    out = tmp_path / "out"
    assert main(["run", str(RUN), "--out", str(out), "--quiet"]) == 0
    r = json.loads((out / "result.json").read_text())
    assert r["status"] == "certified-feasible"
    c = load_campaign(RUN)
    df = read_table(FIXTURE / "grid.csv")
    grid = grid_from_table(df, c.workload_names, pools=c.pool_names)
    # Per-pool budgets and the dollar cap hold for the certified allocation.
    used = {p.gpu: 0 for p in c.pools}
    for e in r["allocation"].values():
        if e["replicas"]:
            used[e["gpu"]] += e["replicas"] * e["tp"]
    assert all(used[p.gpu] <= p.count for p in c.pools)
    price = {p.gpu: p.usd_per_gpu_hour for p in c.pools}
    assert r["objective"]["usd_per_hour"] == pytest.approx(sum(price[g] * n for g, n in used.items()))
    assert r["objective"]["usd_per_hour"] <= 60.0
    # Every committed cell was measured, on its pool, and is admissible as measured.
    measured = {(m["workload"], m["tp"], m["load"], m["gpu"]) for m in r["measured"]}
    values = values_from_table(grid, df)
    index = grid.index()
    for name, e in r["allocation"].items():
        if e["replicas"]:
            key = (name, e["tp"], e["load"], e["gpu"])
            assert key in measured and np.all(np.isfinite(values[index[key]]))
    # Profiling cost per pool sums to the totals.
    by = r["profiling_by_gpu"]
    assert sum(v["gpu_seconds"] for v in by.values()) == pytest.approx(r["gpu_seconds"])
    assert sum(v["usd"] for v in by.values()) == pytest.approx(r["profiling_usd"])
    assert sum(v["windows"] for v in by.values()) == len(r["measured"])
    # A resumed, finished campaign reads the same decision back from its journal.
    assert main(["run", str(RUN), "--out", str(out), "--quiet"]) == 0
    again = json.loads((out / "result.json").read_text())
    assert {k: v for k, v in again.items() if k != "timings"} == {k: v for k, v in r.items() if k != "timings"}


def test_a_pool_too_small_for_its_widest_cell_is_one_line_naming_its_type(tmp_path: Path) -> None:
    from fleetsieve_bayes.cli import main

    text = RUN.read_text().replace('table = "grid.csv"', f'table = "{FIXTURE / "grid.csv"}"\n'
                                   'pool_gpus = { h100-sxm-80gb = 8, A100-80GB = 4 }')
    text = text.replace('family = "card-h100-a100.toml"', f'family = "{FIXTURE / "card-h100-a100.toml"}"')
    path = tmp_path / "run.toml"
    path.write_text(text)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        code = main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert code != 0
    assert buf.getvalue().strip().splitlines() == [
        f"fleetsieve-bayes run: error: {path}: [measurement] pool_gpus.a100-80gb: 4 GPUs cannot hold cell "
        "chat TP8@C32 on a100-80gb (TP8); use at least 8"]
