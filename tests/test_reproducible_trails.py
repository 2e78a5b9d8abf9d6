"""The same decision trail under another XLA instruction set, and the suite fleets' trails pinned.

docs/method.md, "The same decision on every machine": float64, NUTS on a lattice and
stated tolerances keep float rounding out of every decision. Here the shipped campaign
runs in a process compiled for SSE4.2 (no fused multiply-add, 128-bit vectors), and must
give exactly the trail tests/test_campaign.py pins on the host's default code path; and
three fleets of the 40-fleet hard suite are pinned, one exact trail each
(benchmarks/reproducibility.py runs all of them under three settings).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from shipped import SHIPPED, point_file

from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.evaluation.synthetic import random_spec, synthetic_fleet, write_synthetic

pytestmark = pytest.mark.slow

SSE = {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"}

# The Quickstart's trails (tests/test_campaign.py pins the same on the default code path).
SHIPPED_LEVEL_CELLS = [
    ("chat", 2, "C32"), ("chat", 4, "C64"), ("chat", 8, "C64"),
    ("code", 2, "C16"), ("code", 4, "C64"), ("code", 8, "C96"),
    ("code", 8, "C128"), ("chat", 4, "C32"), ("chat", 4, "C96"),
    ("code", 4, "C96"), ("chat", 8, "C128"),
]  # fmt: skip
SHIPPED_POINT_CELLS = [
    ("chat", 2, "C32"), ("chat", 4, "C64"), ("chat", 8, "C64"),
    ("code", 2, "C16"), ("code", 4, "C64"), ("code", 8, "C96"),
    ("code", 4, "C96"), ("chat", 4, "C96"),
]  # fmt: skip

# Hard-suite fleets (suite seed 0, as profiling_cost.py --suite builds them): status,
# GPU-seconds, cells measured, allocation as "class TPn@load xr" words (None: no allocation).
# benchmarks/reproducibility.py found each the same under the three XLA settings.
SUITE_TRAILS: dict[int, tuple[str, float, int, dict[str, str] | None]] = {
    0: ("certified-feasible", 27990.0, 25,
        {"chat": "TP4@N90 x1", "code": "TP4@C12 x1", "rank": "TP2@N48 x4", "batch": "TP8@C18 x2"}),
    1: ("certified-infeasible", 27690.0, 15, None),
    2: ("certified-feasible", 6390.0, 14,
        {"chat": "TP2@C4 x1", "code": "TP1@N8 x2", "rank": "TP2@C4 x1", "batch": "TP2@C5 x1"}),
}


def _run_isolated(campaign: Path, out: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(out), "--quiet"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def _cells(result: dict) -> list[tuple[str, int, str]]:
    return [(m["workload"], m["tp"], m["load"]) for m in result["measured"]]


def test_the_shipped_campaign_at_the_default_level_decides_the_same_under_sse4_2(tmp_path: Path) -> None:
    result = _run_isolated(SHIPPED, tmp_path / "run", SSE)
    assert result["status"] == "undecided" and result["gpu_seconds"] == 16800.0
    assert _cells(result) == SHIPPED_LEVEL_CELLS
    assert result["repeat"]["workload"] == "code" and result["repeat"]["load"] == "C96"
    assert result["allocation"] == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 4, "load": "C64", "replicas": 2},
    }


def test_the_shipped_campaign_at_point_decides_the_same_under_sse4_2(tmp_path: Path) -> None:
    result = _run_isolated(point_file(tmp_path), tmp_path / "run", SSE)
    assert result["status"] == "certified-feasible" and result["gpu_seconds"] == 10800.0
    assert _cells(result) == SHIPPED_POINT_CELLS
    assert result["allocation"] == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 4, "load": "C96", "replicas": 2},
    }


def _words(allocation: dict | None) -> dict[str, str] | None:
    if allocation is None:
        return None
    return {w: (f"TP{a['tp']}@{a['load']} x{a['replicas']}" if a["replicas"] else "none")
            for w, a in allocation.items()}


@pytest.mark.parametrize("k", sorted(SUITE_TRAILS))
def test_a_hard_suite_fleet_has_its_one_trail(k: int, tmp_path: Path) -> None:
    rng = np.random.default_rng([0, k])
    table, camp = synthetic_fleet(rng, random_spec(rng, hard=True))
    camp["name"] = f"synthetic-{k}"
    campaign = write_synthetic(tmp_path / "fleet", table, camp)
    result = run_campaign(campaign, tmp_path / "run", seed=0).result
    status, gpu_s, cells, allocation = SUITE_TRAILS[k]
    assert (result["status"], result["gpu_seconds"], len(result["measured"])) == (status, gpu_s, cells)
    assert _words(result["allocation"]) == allocation
