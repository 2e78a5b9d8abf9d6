"""The decision loop end to end on the shipped grid (replay backend)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd
import pytest
from shipped import load_point

from fleetsieve_bayes import jax_cache
from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import (
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import Campaign, load_campaign
from fleetsieve_bayes.campaign.journal import read_journal
from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

EXAMPLE = data_dir("examples") / "h100_31b_fp8" / "campaign.toml"
GRID = EXAMPLE.parent / "grid.csv"
RESULT_KEYS = {"status", "gpu_seconds", "measured", "allocation", "timings"}


def _campaign_file(tmp: Path, *, table: Path, extra_measurement: str = "", workloads: str | None = None) -> Path:
    workloads = workloads or """
[[workloads]]
name = "chat"
demand_rps = 12.0
slo = { success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }

[[workloads]]
name = "code"
demand_rps = 16.0
slo = { success_min = 0.99, ttft_p99_s = 5.0 }
"""
    text = f"""
name = "t"
[fleet]
gpus = 16
[model]
family = "dense-31b-fp8-h100"
[measurement]
backend = "replay"
table = "{table}"
{extra_measurement}
[stopping]
epsilon = 0.05
slo_attainment = "point"
credible_level = 0.9
{workloads}
"""
    path = tmp / "campaign.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def shipped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("shipped")
    outcome = run_campaign(load_point(), out, seed=0)
    return out, outcome.result


def test_shipped_campaign_at_point_certifies_chat_and_code_tp4_c96_x2_in_10800_gpu_seconds(
    shipped_run: tuple[Path, dict],
) -> None:
    out, result = shipped_run
    on_disk = json.loads((out / "result.json").read_text())
    assert on_disk == result
    assert set(result) >= RESULT_KEYS
    assert result["status"] == "certified-feasible"
    assert result["allocation"] == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 4, "load": "C96", "replicas": 2},
    }
    # Replay is deterministic at a fixed seed: 8 of the 22 cells (the full grid is 30,600 GPU-s),
    # one at a time, 2,400 s of profiling.
    assert result["gpu_seconds"] == 10800.0 and result["startup_gpu_seconds"] == 0.0
    assert result["profiling_wall_s"] == 2400.0
    assert result["timings"]["rounds"] == len(result["timings"]["per_round_s"])
    # The initial design comes first, then the two cells of the allocation.
    cells = [(m["workload"], m["tp"], m["load"]) for m in result["measured"]]
    assert cells == [
        ("chat", 2, "C32"), ("chat", 4, "C64"), ("chat", 8, "C64"),
        ("code", 2, "C16"), ("code", 4, "C64"), ("code", 8, "C96"),
        ("code", 4, "C96"), ("chat", 4, "C96"),
    ]  # fmt: skip
    grid_df = read_table(GRID).set_index(["workload", "tp", "load"])
    spent = sum(grid_df.loc[c, "duration_s"] * c[1] for c in cells)
    assert result["gpu_seconds"] == pytest.approx(spent)
    # bounds.csv: every cell, with the documented columns, measured cells collapsed.
    bounds = pd.read_csv(out / "bounds.csv")
    assert list(bounds.columns) == [
        "workload", "tp", "load", "measured", "throughput_lo", "throughput_hi", "ttft_p99_lo",
        "ttft_p99_hi", "completion_p99_lo", "completion_p99_hi", "success_lo", "success_hi",
    ]  # fmt: skip
    assert len(bounds) == 22 and bounds["measured"].sum() == len(cells)
    assert (out / "posterior.nc").exists()
    # Issued by the converged certifying posterior after the joint check.
    cert = result["certificate"]
    assert cert["p_epsilon_optimal"] >= 1 - result["risk"] and 0.0 <= cert["p_slo_met"] <= 1.0
    d = cert["diagnostics"]
    assert d["r_hat_max"] <= 1.01 and d["ess_bulk_min"] >= 400 and d["divergences"] == 0
    # Its NUTS runs: the draws judged are those of the last run not an extension, and its extensions.
    runs = d["nuts_runs"]
    last = max(i for i, r in enumerate(runs) if r["kind"] != "extension")
    assert runs[0]["kind"] == "fresh" and sum(r["draws"] for r in runs[last:]) == d["draws"]
    assert all(r["divergences"] == 0 for r in runs[last:]) and all(r["step_size"] > 0 for r in runs)
    from fleetsieve_bayes.model.diagnostics import diagnose_file

    on_file = diagnose_file(out / "posterior.nc")  # posterior.nc is that posterior
    assert on_file["r_hat_max"] <= 1.01 and on_file["ess_bulk_min"] >= 400 and on_file["divergences"] == 0
    # The check's own numbers (what the decision reads) are the file's decision headline;
    # on this grid (no failed cell) the parameters converge too.
    assert on_file["decision_r_hat_max"] == pytest.approx(d["r_hat_max"], rel=1e-6)
    # the file's diagnose reads float32 draws, the campaign's check float64: rank-normalised
    # r_hat agrees to about 1e-5 (a different posterior differs by 1e-3 or more)
    assert d["r_hat_max_parameters"] == pytest.approx(on_file["r_hat_max"], rel=1e-4)


def test_shipped_campaign_at_the_default_level_ends_undecided_and_names_code_tp4_c96(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One row per cell: code TP4@C96, measured once, whose attainment posterior straddles 0.9,
    # cannot be repeated. Acquisition tests the hopes left (code TP8@C128, chat TP8@C128);
    # once they fail, the campaign stops undecided and names it. The trail is
    # the same on every machine (docs/method.md, "The same decision on every machine";
    # benchmarks/reproducibility.py runs it under three XLA instruction sets).
    result = run_campaign(load_campaign(EXAMPLE), tmp_path / "run", seed=0).result
    assert result["status"] == "undecided" and result["gpu_seconds"] == 16800.0
    assert result["slo_attainment"] == {"chat": 0.9, "code": 0.9}
    assert result["repeat"] == {"workload": "code", "tp": 4, "load": "C96", "windows": 1, "limit": 1,
                                "limited_by": "backend"}
    measured = [(m["workload"], m["tp"], m["load"]) for m in result["measured"]]
    assert measured == [
        ("chat", 2, "C32"), ("chat", 4, "C64"), ("chat", 8, "C64"),
        ("code", 2, "C16"), ("code", 4, "C64"), ("code", 8, "C96"),
        ("code", 8, "C128"), ("chat", 4, "C32"), ("chat", 4, "C96"),
        ("code", 4, "C96"), ("chat", 8, "C128"),
    ]  # fmt: skip
    # Uncertified, it answers with its best estimate: at level 0.9, measured cells whose median
    # attainment reaches 0.9; chat at C96, the doubt in its interval's lower end; code at C64.
    assert result["answer"] == "credible" and result["answer_confidence"] == {"chat": 0.5, "code": 0.5}
    assert result["allocation"] == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 4, "load": "C64", "replicas": 2},
    }
    committed = {c["workload"]: c for c in result["committed"]}
    assert (committed["chat"]["tp"], committed["chat"]["load"], committed["chat"]["windows"]) == (4, "C96", 1)
    assert all(c["attainment"]["median"] >= 0.9 for c in committed.values())
    assert committed["chat"]["attainment"]["median"] >= 0.9 > committed["chat"]["attainment"]["lo"]
    assert committed["chat"]["attainment"]["lo"] < 0.6  # one window: chat's doubt is wide
    # `run` on the finished directory measures nothing and says the answer is not certified.
    from fleetsieve_bayes.cli import main

    assert main(["run", str(EXAMPLE), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "undecided: 16800 GPU-seconds, 11 cells measured" in out
    assert ("not certified: its best estimate (each measured cell admitted where its attainment reaches its "
            "level with posterior probability at least chat 0.5, code 0.5)") in out
    assert "chat: TP4 @ C96 x2" in out and "code: TP4 @ C64 x2" in out
    assert "chat meets its SLOs in about 90 % of windows [50, 99]" in out, out


def test_rerun_of_a_finished_campaign_measures_nothing(
    shipped_run: tuple[Path, dict], tmp_path: Path
) -> None:
    # On a copy: the shared directory stays as the first run left it, whatever the test order.
    out, result = tmp_path / "shipped", shipped_run[1]
    shutil.copytree(shipped_run[0], out)
    before = (out / "journal.jsonl").read_bytes()
    again = run_campaign(load_point(), out, seed=0).result
    after = (out / "journal.jsonl").read_bytes()
    assert before == after  # nothing measured, and the final round is not recorded twice
    assert again["timings"]["rounds"] == result["timings"]["rounds"]
    assert again["measured"] == result["measured"] and again["allocation"] == result["allocation"]


def test_resume_refuses_another_strategy(shipped_run: tuple[Path, dict], tmp_path: Path) -> None:
    from fleetsieve_bayes.errors import InputError

    out = tmp_path / "shipped"
    shutil.copytree(shipped_run[0], out)
    with pytest.raises(InputError, match=r"changed: strategy \(fleetsieve → random\)"):
        run_campaign(load_point(), out, seed=0, strategy="random")


@pytest.fixture(scope="module")
def c128_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Campaign, dict]:
    """Chat alone at C128 on the shipped grid: the campaign and its result."""
    tmp = tmp_path_factory.mktemp("c128")
    df = read_table(GRID)
    only = df[(df["workload"] == "chat") & (df["load"] == "C128")]
    only.to_csv(tmp / "c128.csv", index=False)
    workloads = """
[[workloads]]
name = "chat"
demand_rps = 12.0
slo = { success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }
"""
    campaign = load_campaign(_campaign_file(tmp, table=tmp / "c128.csv", workloads=workloads))
    return campaign, run_campaign(campaign, tmp / "out").result


def test_tail_feasible_tp8_is_chosen_at_c128(c128_run: tuple[Campaign, dict]) -> None:
    campaign, result = c128_run
    assert result["status"] == "certified-feasible"
    assert result["allocation"]["chat"]["tp"] == 8  # TP4@C128's 46.4 s completion p99 violates 30 s
    # Capacity-only ablation: drop the tail limits and TP4@C128 (11.27 req/s) wins.
    only = read_table(campaign.measurement.table)
    grid = grid_from_table(only, ("chat",))
    problem = campaign.problem()._replace(
        ttft_max=np.array([np.inf]), completion_max=np.array([np.inf])
    )
    ablation = allocate_milp(grid, values_from_table(grid, only), problem)
    assert grid.tp[ablation.cell[0]] == 4


def _decision(result: dict) -> tuple:
    return (result["status"], result["gpu_seconds"], [(m["workload"], m["tp"], m["load"], m["replicate"]) for m in result["measured"]],
            {k: (v["tp"], v["load"], v["replicas"]) for k, v in result["allocation"].items()})


@pytest.mark.slow  # the mechanism, in the default suite: tests/test_jax_memory.py
def test_a_campaign_that_drops_its_compiled_programs_every_round_decides_the_same(
    c128_run: tuple[Campaign, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign, plain = c128_run
    calls: list[int] = []
    clear = jax.clear_caches
    monkeypatch.setattr(jax_cache, "CROWDED_FRACTION", 0.0)  # every round counts as crowded
    monkeypatch.setattr(jax, "clear_caches", lambda: (calls.append(1), clear())[1])
    crowded = run_campaign(campaign, tmp_path / "crowded").result
    assert len(calls) == len(plain["measured"]) - 1  # before every round after the first window
    assert _decision(crowded) == _decision(plain)
    # Fits after the releases still run, and decide as before.
    monkeypatch.setattr(jax_cache, "CROWDED_FRACTION", 0.5)
    assert _decision(run_campaign(campaign, tmp_path / "after").result) == _decision(plain)


def test_unmeetable_critical_floor_is_certified_infeasible_early(tmp_path: Path) -> None:
    workloads = """
[[workloads]]
name = "chat"
demand_rps = 1000.0
critical = true
floor = 0.9
slo = { success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }

[[workloads]]
name = "code"
demand_rps = 16.0
slo = { success_min = 0.99, ttft_p99_s = 5.0 }
"""
    table = GRID
    result = run_campaign(load_campaign(_campaign_file(tmp_path, table=table, workloads=workloads)), tmp_path / "o").result
    assert result["status"] == "certified-infeasible"
    assert result["allocation"] is None
    # "Early" is the first decision, right after the initial design: no cell is acquired.
    # Why nothing more can be needed: the floor asks 0.9 x 1000 = 900 req/s of chat, and no
    # chat cell of the grid is even offered more than 2.825 req/s per GPU (TP4@C128: 11.3 req/s
    # on 4 GPUs), so 16 GPUs serve at most 45.2 req/s whatever any cell's measurement says.
    # The optimistic allocation misses the floor on the design's rows alone.
    from fleetsieve_bayes.decision.design import initial_design

    grid = grid_from_table(read_table(table), ("chat", "code"))
    design = [dict(zip(("workload", "tp", "load"), grid.key(i), strict=True)) for i in initial_design(grid)]
    assert len(design) == 6  # one cell per class and TP (2 classes x TP 2, 4, 8) of the 22
    assert [{k: m[k] for k in ("workload", "tp", "load")} for m in result["measured"]] == design
    assert result["gpu_seconds"] == 8400.0  # the design's 6 windows of 300 s: (2 + 4 + 8) x 2 x 300
    assert "optimistic allocation cannot meet the critical floors" in result["certificate"]["reason"]
    assert result["certificate"]["p_infeasible"] >= 0.95


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetsieve_bayes", *args]


def test_ctrl_c_stops_cleanly_and_keeps_the_journal(tmp_path: Path) -> None:
    campaign = _campaign_file(
        tmp_path, table=GRID, extra_measurement="delay_s = 0.5"
    )
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(
        _cli("run", str(campaign), "--out", str(out), "--quiet"), stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if (out / "journal.jsonl").exists() and b'"type":"measurement"' in (out / "journal.jsonl").read_bytes():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    # It stops when the fit under way returns (a compiled program does not see the signal):
    # seconds here, minutes on a crowded machine.
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130
    assert stderr.strip().splitlines()[-1] == "fleetsieve-bayes run: interrupted"
    assert "Traceback" not in stderr
    records, good = read_journal(out / "journal.jsonl")
    assert good == (out / "journal.jsonl").stat().st_size
    assert sum(r["type"] == "measurement" for r in records) >= 1
    from fleetsieve_bayes.campaign.journal import campaign_lock

    with campaign_lock(out):  # the lock was released
        pass
