"""The shipped examples run as scripts and are valid campaigns.

The H100 campaign itself runs end to end in test_campaign.py; the 8B family's
campaign is a slow test (it compiles the model for another grid shape).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import (
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

EXAMPLES = data_dir("examples")


def test_8b_table_script_reproduces_the_shipped_file(tmp_path: Path) -> None:
    out = tmp_path / "grid.csv"
    code = (
        "import runpy, sys; from pathlib import Path; "
        f"mod = runpy.run_path({str(EXAMPLES / 'h100_8b_bf16' / 'make_table.py')!r}); "
        f"mod['main'](Path({str(out)!r}))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    pd.testing.assert_frame_equal(pd.read_csv(out), pd.read_csv(EXAMPLES / "h100_8b_bf16" / "grid_synthetic.csv"))


@pytest.mark.parametrize("name", ["h100_31b_fp8", "h100_8b_bf16", "vllm", "vllm_cpu"])
def test_example_campaigns_load(name: str) -> None:
    campaign = load_campaign(EXAMPLES / name / "campaign.toml")
    assert campaign.workloads
    if campaign.measurement.backend == "replay":
        df = read_table(campaign.measurement.table)
        grid = grid_from_table(df, campaign.workload_names)
        alloc = allocate_milp(grid, values_from_table(grid, df), campaign.problem())
        assert alloc.feasible


def test_examples_ship_with_the_package() -> None:
    assert (data_dir("examples") / "h100_31b_fp8" / "campaign.toml").is_file()
    assert (data_dir("priors") / "dense-8b-bf16-h100.toml").is_file()


@pytest.mark.slow
def test_8b_campaign_certifies_the_full_table_optimum(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.runner import run_campaign

    # One row per cell: at the default level the table cannot settle attainment; the metric rule.
    campaign = load_campaign(EXAMPLES / "h100_8b_bf16" / "campaign.toml").at_level("point")
    result = run_campaign(campaign, tmp_path).result
    df = read_table(campaign.measurement.table)
    grid = grid_from_table(df, campaign.workload_names)
    oracle = allocate_milp(grid, values_from_table(grid, df), campaign.problem())
    assert result["status"] == "certified-feasible"
    assert result["objective"]["min_fulfillment"] == pytest.approx(oracle.min_fulfillment, abs=0.05)
    assert len(result["measured"]) < grid.n_cells
