"""Trace readers (Azure, BurstGPT), the replay schedule, and the shipped synthetic traces."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.backends.traces import (
    Trace,
    read_azure_trace,
    read_burstgpt_trace,
    read_trace,
    schedule,
    window_rate,
    write_azure_trace,
)
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000001,879,0
"""
BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
47,GPT-4,417,276,693,Conversation log
118,ChatGPT,1360,241,1601,Conversation log
"""


def _write(tmp_path, text: str, name: str = "t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_seven_fractional_digits(tmp_path) -> None:
    tr = read_trace(_write(tmp_path, AZURE))
    np.testing.assert_allclose(tr.arrival_s, [0.0, 4.314579, 4.3194101], atol=1e-9)
    assert tr.input_tokens.tolist() == [374, 396, 879]
    assert tr.output_tokens.tolist() == [44, 109, 1]  # a 0-token output is replayed as 1


def test_azure_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 100, 50))
    t -= t[0]
    inp, out = rng.integers(1, 5000, 50), rng.integers(1, 500, 50)
    write_azure_trace(tmp_path / "a.csv", t, inp, out)
    tr = read_azure_trace(tmp_path / "a.csv")
    np.testing.assert_allclose(tr.arrival_s, t, atol=1e-7)  # 100 ns resolution
    assert tr.input_tokens.tolist() == inp.tolist() and tr.output_tokens.tolist() == out.tolist()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (AZURE.replace("2023-11-16 18:15:50.9951690", "16/11/2023 noon"), "line 3, column 'TIMESTAMP'"),
        (AZURE.replace(",396,", ",-3,"), "line 3, column 'ContextTokens'"),
        (AZURE.replace(",109", ",1.5"), "line 3, column 'GeneratedTokens'"),
        (AZURE.replace("GeneratedTokens", "Generated"), "unrecognised trace header"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,1\n", "at least 2 requests"),
        ('TIMESTAMP,ContextTokens,GeneratedTokens\n"unterminated,1,1\n', "cannot parse trace CSV"),
    ],
)
def test_malformed_azure_is_one_line_error(tmp_path, text, message) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(InputError) as err:
        read_trace(p)
    assert message in str(err.value) and str(p) in str(err.value) and "\n" not in str(err.value)


def test_missing_file_and_forced_format(tmp_path) -> None:
    with pytest.raises(InputError, match="trace file not found"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(InputError, match="missing trace column"):
        read_trace(_write(tmp_path, BURST), "azure")


def test_burstgpt_drops_failed_and_filters_model(tmp_path) -> None:
    p = _write(tmp_path, BURST)
    tr = read_trace(p)  # auto-detected
    assert tr.arrival_s.tolist() == [0.0, 42.0, 113.0]
    assert tr.input_tokens.tolist() == [472, 417, 1360] and tr.output_tokens.tolist() == [18, 276, 241]
    chat = read_burstgpt_trace(p, model="ChatGPT")
    assert chat.arrival_s.tolist() == [0.0, 113.0]
    bad = _write(tmp_path, BURST.replace("\n47,", "\nforty,"), "b.csv")
    with pytest.raises(InputError, match="line 4, column 'Timestamp'"):
        read_trace(bad)


def test_schedule_scales_and_tiles() -> None:
    tr = Trace(np.array([0.0, 1.0, 3.0]), np.array([5, 6, 7]), np.array([1, 2, 3]), "t")
    plan = schedule(tr, 2.0, 1.6)
    np.testing.assert_allclose(plan.arrival_s, [0.0, 0.5, 1.5])  # t / scale
    # Period = span 3 + mean gap 1.5 = 4.5 s → the 2nd copy starts at 4.5 / 2 = 2.25 s.
    plan = schedule(tr, 2.0, 3.0, max_input_tokens=5)
    np.testing.assert_allclose(plan.arrival_s, [0.0, 0.5, 1.5, 2.25, 2.75])
    assert plan.trace_index.tolist() == [0, 1, 2, 0, 1] and plan.input_tokens.tolist() == [5, 5, 5, 5, 5]
    assert tr.rate_rps == pytest.approx(3 / 4.5)


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.floats(0.01, 5.0), min_size=1, max_size=30),
    scale=st.floats(0.1, 20.0),
    warmup=st.floats(0.0, 10.0),
    duration=st.floats(0.5, 50.0),
)
def test_window_rate_counts_window_arrivals(gaps, scale, warmup, duration) -> None:
    t = np.concatenate([[0.0], np.cumsum(gaps)])
    tr = Trace(t, np.ones(len(t), np.int64), np.ones(len(t), np.int64), "h")
    plan = schedule(tr, scale, warmup + duration)
    assert np.all(np.diff(plan.arrival_s) >= 0) and plan.arrival_s.max() < warmup + duration
    n = np.count_nonzero(plan.arrival_s >= warmup)
    assert window_rate(tr, scale, warmup, duration) == n / duration
    # Tiling keeps the long-run rate: arrivals over k whole periods = k × n.
    k = 3
    assert len(schedule(tr, scale, k * tr.period_s / scale - 1e-9)) == 4  # a NamedTuple of 4 arrays
    assert len(schedule(tr, scale, k * tr.period_s / scale - 1e-9).arrival_s) == k * tr.n


def test_shipped_synthetic_traces_are_labelled_and_reproducible(tmp_path) -> None:
    folder = data_dir("examples") / "traces"
    assert "synthetic" in (folder / "README.md").read_text().lower()
    for name in ("synthetic_chat_azure.csv", "synthetic_code_azure.csv"):
        tr = read_trace(folder / name)
        assert tr.n > 1000 and 1.5 < tr.rate_rps < 2.5
    subprocess.run([sys.executable, str(folder / "generate.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    for name in ("synthetic_chat_azure.csv", "synthetic_code_azure.csv"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes()
