"""Repeated windows of a live cell: another stretch of the trace, other prompts, the warm server."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from fake_vllm import fake_vllm_campaign
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.backends.traces import (
    Trace,
    replicate_seed,
    schedule,
    window_offset_s,
    window_rate,
    write_azure_trace,
)
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.testing import fake_server_command, running_fake_server


def _trace(gaps: list[float]) -> Trace:
    t = np.concatenate([[0.0], np.cumsum(gaps)])
    n = len(t)
    return Trace(t, np.arange(1, n + 1, dtype=np.int64), np.full(n, 3, dtype=np.int64), "t.csv")


def _naive_schedule(trace: Trace, scale: float, horizon: float, offset: float) -> tuple[np.ndarray, np.ndarray]:
    """The trace tiled far enough by a plain loop, kept where offset <= trace time < offset + horizon × scale."""
    times, idx = [], []
    k = 0
    while k * trace.period_s <= offset + horizon * scale:
        for i, a in enumerate(trace.arrival_s):
            t = a + k * trace.period_s
            if offset <= t and (t - offset) / scale < horizon:
                times.append((t - offset) / scale)
                idx.append(i)
        k += 1
    return np.asarray(times), np.asarray(idx, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=12),
    scale=st.floats(0.25, 8.0),
    horizon=st.floats(0.5, 40.0),
    replicate=st.integers(0, 6),
)
def test_offset_schedule_agrees_with_a_plain_loop(gaps, scale, horizon, replicate) -> None:
    tr = _trace(gaps)
    offset = window_offset_s(tr, scale, horizon, replicate)
    assert 0 <= offset < tr.period_s
    plan = schedule(tr, scale, horizon, offset_s=offset)
    times, idx = _naive_schedule(tr, scale, horizon, offset)
    np.testing.assert_allclose(plan.arrival_s, times, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(plan.trace_index, idx)
    np.testing.assert_array_equal(plan.input_tokens, tr.input_tokens[idx])
    assert window_rate(tr, scale, 0.0, horizon, offset_s=offset) == pytest.approx(len(times) / horizon)


def test_replicate_zero_is_the_unchanged_window() -> None:
    tr = _trace([0.2] * 29)
    assert window_offset_s(tr, 2.0, 1.6, 0) == 0.0 and replicate_seed(7, 0) == 7
    a, b = schedule(tr, 2.0, 1.6), schedule(tr, 2.0, 1.6, offset_s=0.0)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_consecutive_replicates_replay_disjoint_stretches_while_the_trace_lasts() -> None:
    tr = _trace([0.125] * 79)  # 10 s of trace (a binary-exact gap: no arrival straddles a boundary)
    scale, horizon = 2.0, 1.0  # each window replays 2 s of trace: 5 disjoint windows
    seen: set[int] = set()
    for k in range(5):
        idx = set(schedule(tr, scale, horizon, offset_s=window_offset_s(tr, scale, horizon, k)).trace_index.tolist())
        assert len(idx) == 16 and not (idx & seen)
        seen |= idx
    assert seen == set(range(80))
    assert window_offset_s(tr, scale, horizon, 5) == pytest.approx(0.0, abs=1e-9)  # then it wraps


def test_replicate_seeds_differ_and_are_reproducible() -> None:
    seeds = [replicate_seed(0, k) for k in range(50)]
    assert len(set(seeds)) == 50 and seeds == [replicate_seed(0, k) for k in range(50)]
    assert all(0 <= s < 2**31 for s in seeds) and replicate_seed(1, 1) != replicate_seed(0, 1)
    with pytest.raises(ValueError, match="replicate must be an integer >= 0"):
        window_offset_s(_trace([0.1]), 1.0, 1.0, -1)


WARMUP, WINDOW = 0.3, 1.2


def _campaign(tmp_path):
    # 30 arrivals at 5 req/s, 6 s of trace: a window (1.5 s at scale 1) replays a quarter of it
    return fake_vllm_campaign(
        tmp_path, fake_server_command("--slots", "4", "--token-delay", "0.005"), name="repeat", fleet="gpus = 2",
        tp=(1,), gpus="gpus = [0]", loads="{ x1 = 1.0 }", warmup_s=WARMUP, duration_s=WINDOW,
        extra="seed = 3", n_requests=30)


def test_vllm_repeat_is_a_new_window_on_the_warm_server(tmp_path) -> None:
    backend = make_backend(_campaign(tmp_path), tmp_path / "out")
    try:
        first = backend.measure(0)
        again = backend.measure(0, replicate=1)
    finally:
        backend.close()
    assert backend.windows_available(0) is None  # a live server can always measure again
    assert first["failure"] == again["failure"] == "" and first["success_rate"] == again["success_rate"] == 1.0
    assert first["startup_s"] > 0 and again["startup_s"] == 0.0  # the warm server was reused
    assert first["seed"] == 3 and again["seed"] == replicate_seed(3, 1)
    raw = {p.name: pd.read_parquet(p) for p in (tmp_path / "out" / "raw").glob("*.parquet")}
    (r0,) = [df for name, df in raw.items() if "_r1_" not in name]
    (r1,) = [df for name, df in raw.items() if "_r1_" in name]
    assert (r0["replicate"] == 0).all() and (r1["replicate"] == 1).all()
    # Replicate 1 starts 1.5 s into the trace (one window's worth at scale 1): request 8 (t = 1.6 s).
    assert r0["trace_index"].iloc[0] == 0 and r1["trace_index"].iloc[0] == 8
    assert r1["trace_offset_s"].iloc[0] == pytest.approx(1.5)
    assert set(r0["trace_index"]).isdisjoint(r1["trace_index"])
    assert list((tmp_path / "out" / "logs").glob("chat_tp1_x1_*.log"))  # one server, launched once
    assert len(list((tmp_path / "out" / "logs").glob("*.log"))) == 1


def test_measure_replicate_flag_uses_the_campaign_derivation(tmp_path, capsys) -> None:
    trace = tmp_path / "chat.csv"
    n = 30
    write_azure_trace(trace, np.arange(n) * 0.2, np.full(n, 8), np.full(n, 10))
    records = tmp_path / "rec.parquet"
    with running_fake_server("--slots", "4", "--token-delay", "0.005", model="m") as url:
        rc = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(trace), "--scale", "1",
                   "--duration", str(WINDOW), "--warmup", str(WARMUP), "--seed", "3", "--replicate", "1",
                   "--records", str(records), "--json"])
    row = json.loads(capsys.readouterr().out)
    assert rc == 0 and row["replicate"] == 1 and row["seed"] == replicate_seed(3, 1)
    assert pd.read_parquet(records)["trace_index"].iloc[0] == 8
    assert math.isfinite(row["ttft_p99_s"])
    bad = main(["measure", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--trace", str(trace),
                "--scale", "1", "--duration", "1", "--warmup", "0", "--replicate", "-1"])
    err = capsys.readouterr().err.strip()
    assert bad == 2 and err.endswith("--replicate: must be an integer >= 0, got -1")
