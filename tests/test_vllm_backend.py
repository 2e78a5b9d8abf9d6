"""The vLLM backend with the fake server as its command: grid, real cells, failures, validation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from fake_vllm import WARMUP, WINDOW, fake_vllm_campaign

from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.backends.server import group_members
from fleetsieve_bayes.backends.vllm import parse_vllm_options
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS, validate_table
from fleetsieve_bayes.testing import fake_server_command


def _campaign(tmp_path, *, flags: tuple[str, ...] = (), extra: str = "", workloads=("chat",)) -> object:
    cmd = [*fake_server_command("--slots", "2", "--token-delay", "0.01", "--tp-speedup", "1"), *flags]
    return fake_vllm_campaign(tmp_path, cmd, extra=extra, workloads=workloads)


def test_grid_and_offered_rates_are_known_before_measuring(tmp_path) -> None:
    backend = make_backend(_campaign(tmp_path, workloads=("chat", "code")), tmp_path / "out")
    g = backend.grid
    assert g.n_cells == 8
    assert [g.key(i) for i in range(4)] == [("chat", 1, "low"), ("chat", 1, "high"), ("chat", 2, "low"), ("chat", 2, "high")]
    # Window [0.3, 1.5): arrivals every 0.2 s → 6 at scale 1 (0.4..1.4), every 1/15 s → 18 at scale 3.
    assert g.offered_rps[:2] == pytest.approx([6 / WINDOW, 18 / WINDOW])
    assert np.all(g.duration_s == WARMUP + WINDOW) and np.all(backend.expected_duration_s == WARMUP + WINDOW)
    assert backend.preflight(0) is None


def test_measured_cell_row_records_and_no_orphan(tmp_path) -> None:
    out = tmp_path / "out"
    backend = make_backend(_campaign(tmp_path), out)
    c = backend.grid.index()[("chat", 2, "high")]
    row = backend.measure(c)
    backend.close()
    assert row["failure"] == "" and row["seed"] == 0
    assert (row["workload"], row["tp"], row["load"]) == ("chat", 2, "high")
    assert row["offered_rps"] == pytest.approx(backend.grid.offered_rps[c])
    assert row["duration_s"] == pytest.approx(WARMUP + WINDOW)
    assert row["success_rate"] == 1.0
    # TP2 with --tp-speedup 1 halves the step: completion = 10 × 5 ms (+ overheads), a
    # lower bound set by the server's sleeps; the first token comes before the last.
    assert row["ttft_p99_s"] <= row["completion_p99_s"] < math.inf and row["completion_p99_s"] >= 0.05
    validate_table(pd.DataFrame([{k: row[k] for k in (*COLUMNS, "seed", "failure")}]))
    raws = list((out / "raw").glob("chat_tp2_high_*.parquet"))
    assert len(raws) == 1
    rec = pd.read_parquet(raws[0])
    assert len(rec) == 23 and set(rec["tp"]) == {2}  # 5 warm-up + 18 window arrivals, all sent
    assert list((out / "logs").glob("chat_tp2_high_*.log"))


@pytest.mark.parametrize(
    ("flags", "extra", "failure"),
    [
        (("--oom-at-start",), "", "startup-oom"),
        (("--die-at-start", "--spawn-worker"), "", "startup-exit"),
        (("--never-healthy",), "readiness_timeout_s = 1.0", "startup-timeout"),
        (("--die-after", "3"), "", "died-mid-run"),
        ((), 'served_model_name = "other"', "request-errors"),
    ],
)
def test_failures_are_observations(tmp_path, flags, extra, failure) -> None:
    campaign = _campaign(tmp_path, flags=flags, extra=extra.replace("readiness_timeout_s = 1.0", ""))
    if "readiness" in extra:
        text = campaign.path.read_text().replace("readiness_timeout_s = 20", extra)
        campaign.path.write_text(text)
        campaign = load_campaign(campaign.path)
    backend = make_backend(campaign, tmp_path / "out")
    row = backend.measure(0)
    backend.close()
    assert row["failure"] == failure
    assert row["success_rate"] == 0.0 and row["throughput_rps"] == 0.0 and math.isinf(row["ttft_p99_s"])
    assert 0 < row["duration_s"] < 25
    assert row["offered_rps"] == pytest.approx(backend.grid.offered_rps[0])
    validate_table(pd.DataFrame([{k: row[k] for k in (*COLUMNS, "seed", "failure")}]))


def test_memory_guard_skips_at_zero_gpu_seconds(tmp_path) -> None:
    extra = "model_size_gb = 100.0\ngpu_memory_gb = 80.0\nkv_cache_gb_min = 5.0"
    backend = make_backend(_campaign(tmp_path, extra=extra), tmp_path / "out")
    g = backend.grid
    tp1 = [i for i in range(g.n_cells) if g.tp[i] == 1]
    tp2 = [i for i in range(g.n_cells) if g.tp[i] == 2]
    for c in tp1:  # 100 + 5 > 72 usable
        row = backend.preflight(c)
        assert row is not None and row["failure"] == "memory-guard" and row["duration_s"] == 0.0
        assert row["duration_s"] * row["tp"] == 0.0
    assert all(backend.preflight(c) is None for c in tp2)  # 50 + 5 <= 72
    assert not (tmp_path / "out").exists()  # nothing was launched
    validate_table(pd.DataFrame([{k: backend.preflight(tp1[0])[k] for k in (*COLUMNS, "failure")}]))


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        ('model = "fake-model"', "[measurement] model: missing"),
        ("tp = [2, 1]", "[measurement] tp: missing"),
        ("tp = [2, 1]\n", 'tp = [0]\n'),
        ("gpus = [0, 1]", "[measurement] gpus: TP2 needs 2 GPUs but the pool has 1"),
        ('loads = { low = 1.0, high = 3.0 }', "[measurement] loads.low: arrival scale must be a positive number"),
        ('traces = { chat = "traces/chat.csv" }', "[measurement] traces.chat: file not found"),
        ("warmup_s = 0.3", "[measurement] warmup_sec: unknown key for backend 'vllm' (did you mean 'warmup_s'?)"),
        ("command = ", "[measurement] command: expected a list of strings"),
    ],
)
def test_config_errors_name_the_key(tmp_path, replace, message) -> None:
    campaign = _campaign(tmp_path)
    text = campaign.path.read_text()
    substitutes = {
        "[measurement] model: missing": "",
        "[measurement] tp: missing": "",
        'tp = [0]\n': "tp = [0]\n",
        "[measurement] gpus: TP2 needs 2 GPUs but the pool has 1": "gpus = [0]",
        "[measurement] loads.low: arrival scale must be a positive number": "loads = { low = -1.0 }",
        "[measurement] traces.chat: file not found": 'traces = { chat = "nope.csv" }',
        "[measurement] warmup_sec: unknown key for backend 'vllm' (did you mean 'warmup_s'?)": "warmup_sec = 0.3",
        "[measurement] command: expected a list of strings": 'command = "vllm serve x" #',
    }
    text = text.replace(replace, substitutes[message], 1)
    campaign.path.write_text(text)
    with pytest.raises(InputError) as err:
        parse_vllm_options(load_campaign(campaign.path))
    msg = str(err.value)
    assert "\n" not in msg and str(campaign.path) in msg
    expected = "[measurement] tp: expected a non-empty list of positive integers" if message == 'tp = [0]\n' else message
    assert expected in msg


def test_missing_trace_for_a_workload(tmp_path) -> None:
    campaign = _campaign(tmp_path, workloads=("chat", "code"))
    text = campaign.path.read_text().replace(', code = "traces/code.csv"', "")
    campaign.path.write_text(text)
    with pytest.raises(InputError, match=r"\[measurement\] traces: no trace for workload 'code'"):
        parse_vllm_options(load_campaign(campaign.path))


def test_no_server_left_behind() -> None:
    # Sessions started by this process (fake servers of the tests above) are all gone.
    import os
    from pathlib import Path

    leftovers = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            watchdog = b"lifeline.py" in Path(f"/proc/{pid}/cmdline").read_bytes()  # lives as long as we do
            if int(rest[1]) == os.getpid() and rest[0] != "Z" and not watchdog and group_members(int(pid)):
                leftovers.append(int(pid))
    assert leftovers == []


def test_consecutive_cells_with_the_same_tp_reuse_the_server(tmp_path) -> None:
    out = tmp_path / "out"
    backend = make_backend(_campaign(tmp_path), out)
    idx = backend.grid.index()
    try:
        first = backend.measure(idx[("chat", 1, "low")])
        second = backend.measure(idx[("chat", 1, "high")])  # same TP: the running server is reused
        third = backend.measure(idx[("chat", 2, "low")])  # another TP: restart
    finally:
        backend.close()
    assert first["startup_s"] > 0 and second["startup_s"] == 0.0 and third["startup_s"] > 0
    assert all(r["failure"] == "" and r["success_rate"] == 1.0 for r in (first, second, third))
    assert len(list((out / "logs").glob("*.log"))) == 2  # two servers for three cells
    # startup_s is a table column; duration_s stays the measurement itself.
    df = validate_table(pd.DataFrame([{k: r[k] for k in (*COLUMNS, "seed", "failure", "startup_s")}
                                      for r in (first, second, third)]))
    assert list(df["startup_s"]) == [first["startup_s"], 0.0, third["startup_s"]]
    assert all(r["duration_s"] == pytest.approx(WARMUP + WINDOW) for r in (first, second, third))


def test_reuse_can_be_switched_off(tmp_path) -> None:
    out = tmp_path / "out"
    backend = make_backend(_campaign(tmp_path, extra="reuse_server = false"), out)
    idx = backend.grid.index()
    try:
        rows = [backend.measure(idx[("chat", 1, "low")]), backend.measure(idx[("chat", 1, "high")])]
    finally:
        backend.close()
    assert all(r["startup_s"] > 0 for r in rows) and len(list((out / "logs").glob("*.log"))) == 2


def test_startup_failure_duration_is_its_startup(tmp_path) -> None:
    backend = make_backend(_campaign(tmp_path, flags=("--die-at-start",)), tmp_path / "out")
    row = backend.measure(0)
    backend.close()
    assert row["failure"] == "startup-exit" and row["duration_s"] == pytest.approx(row["startup_s"])
