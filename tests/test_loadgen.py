"""Load generator against the fake engine: open loop, metrics vs. the known timing model.

The fake server emits token k of a request at start + k × step once the request
holds one of `slots` engine slots, so with output length L the service time
is L × step and the capacity slots / (L × step). The server's sleeps make
those times lower bounds; above them the tests assert orderings (first token
before last, requests sent in arrival order and while earlier ones still wait
for a slot), never a wall-clock ceiling: the CI machine is small and shared. How close
the throughput comes to the capacity under overload is a timing of the machine, measured
by benchmarks/loadgen_capacity.py.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fleetsieve_bayes.backends.loadgen import (
    RECORD_COLUMNS,
    LoadSpec,
    completions_url,
    prompt_tokens,
    run_cell_sync,
    summarize,
    write_records,
)
from fleetsieve_bayes.backends.traces import Trace, schedule
from fleetsieve_bayes.testing import running_fake_server

STEP = 0.01
SLOTS = 4
OUT = 20  # output tokens → service time 0.2 s, capacity 20 req/s
IN = 37


def _trace(n: int = 100, gap: float = 0.1) -> Trace:
    """Uniform arrivals every `gap` s (10 req/s at scale 1)."""
    return Trace(np.arange(n) * gap, np.full(n, IN), np.full(n, OUT), "uniform")


@pytest.fixture(scope="module")
def server() -> str:
    with running_fake_server("--slots", str(SLOTS), "--token-delay", str(STEP)) as url:
        yield url


def _spec(url: str, warmup: float, duration: float, timeout: float = 10.0, model: str = "fake-model") -> LoadSpec:
    return LoadSpec(endpoint=url, model=model, warmup_s=warmup, duration_s=duration, request_timeout_s=timeout)


def test_light_load_matches_timing_model(server: str) -> None:
    warmup, duration = 0.5, 2.0
    plan = schedule(_trace(), 1.0, warmup + duration)
    rec = run_cell_sync(_spec(server, warmup, duration), plan)
    assert list(rec.columns) == list(RECORD_COLUMNS)
    s = summarize(rec, warmup, duration)
    assert s["offered_rps"] == pytest.approx(10.0)  # 20 arrivals in [0.5, 2.5)
    assert s["success_rate"] == 1.0
    # TTFT = one step (+ client/server overhead), completion = OUT steps: the server's
    # sleeps bound them below; every request's first token comes before its last.
    assert s["ttft_p99_s"] >= STEP and OUT * STEP <= s["completion_p99_s"] < math.inf
    assert (rec["first_token_s"] <= rec["last_token_s"]).all()
    assert (rec["last_token_s"] - rec["sent_s"] >= OUT * STEP).all()
    # The server keeps up, so throughput equals the offered rate (±1 request at the edges).
    assert abs(s["throughput_rps"] - 10.0) <= 1.0 / duration + 1e-9
    # Exact token counts reached the server: prompt of the trace's length, max_tokens honoured.
    assert (rec["prompt_tokens"] == IN).all() and (rec["completion_tokens"] == OUT).all()
    assert (rec["n_chunks"] == OUT).all()
    # Open loop: requests left in arrival order, none before its scheduled time.
    _assert_open_loop(rec)


def test_overload_saturates_at_capacity_and_tails_grow(server: str) -> None:
    warmup, duration = 0.5, 2.0
    plan = schedule(_trace(), 4.0, warmup + duration)  # 40 req/s offered vs 20 capacity
    rec = run_cell_sync(_spec(server, warmup, duration), plan)
    s = summarize(rec, warmup, duration)
    assert s["offered_rps"] == pytest.approx(40.0)
    # Never above capacity, on any machine: a slot holds a request for at least the service
    # time S = OUT × STEP (the server's sleeps), so the i-th completion (0-based) comes at least
    # ceil((i + 1) / SLOTS) × S after the first request was sent (the client's clock, the
    # server's events: a token is read after it is sent, a request served after it is sent).
    service = OUT * STEP
    done = np.sort(rec.loc[rec["ok"], "last_token_s"].to_numpy(np.float64))
    earliest = rec["sent_s"].min() + np.ceil(np.arange(1, len(done) + 1) / SLOTS) * service
    assert len(done) == len(rec) and (done >= earliest - 1e-6).all()
    # Hence at most SLOTS × (duration / S + 1) completions in the window: the capacity, plus one
    # per slot at its edge. How close to the capacity it comes is a timing of this machine
    # (benchmarks/loadgen_capacity.py).
    capacity = SLOTS / service
    assert s["throughput_rps"] <= capacity + SLOTS / duration < s["offered_rps"]
    # The queue grows by ~20 req/s: the last window arrivals wait ~2 s for a slot.
    assert s["ttft_p99_s"] > 1.0
    assert s["completion_p99_s"] > s["ttft_p99_s"]
    assert s["success_rate"] == 1.0
    # Open loop even while the server is saturated: a closed loop would hold at most
    # SLOTS requests in flight; this one sends while earlier requests still wait for a
    # slot, so the queue, not the client, delays them.
    _assert_open_loop(rec)
    assert _max_in_flight(rec) > 2 * SLOTS
    wait = rec["first_token_s"] - rec["sent_s"]
    assert (rec["sent_s"] - rec["arrival_s"]).median() < wait.median()


def _max_in_flight(rec: pd.DataFrame) -> int:
    """The most requests sent and not yet finished at any instant."""
    events = sorted([(t, 1) for t in rec["sent_s"]] + [(t, -1) for t in rec["last_token_s"]])
    return int(np.max(np.cumsum([d for _, d in events])))


def _assert_open_loop(rec: pd.DataFrame) -> None:
    """Requests were sent in arrival order, never before their scheduled instant."""
    order = rec.sort_values("arrival_s")
    assert order["sent_s"].is_monotonic_increasing
    assert (rec["sent_s"] >= rec["arrival_s"] - 1e-9).all()


def test_timeouts_and_errors_are_failures(server: str) -> None:
    plan = schedule(_trace(n=10), 1.0, 0.6)  # 6 requests
    rec = run_cell_sync(_spec(server, 0.0, 0.6, timeout=0.1), plan)  # each needs 0.2 s
    assert (rec["error"] == "timeout").all() and not rec["ok"].any()
    s = summarize(rec, 0.0, 0.6)
    assert s["success_rate"] == 0.0 and s["n_timeout"] == 6
    assert math.isinf(s["ttft_p99_s"]) and math.isinf(s["completion_p99_s"])
    rec = run_cell_sync(_spec(server, 0.0, 0.6, model="no-such-model"), plan)
    assert (rec["error"] == "http-404").all()
    assert summarize(rec, 0.0, 0.6)["n_error"] == 6


def _records(arrival, sent, first, last, ok) -> pd.DataFrame:
    n = len(arrival)
    return pd.DataFrame({
        "request": range(n), "trace_index": range(n), "arrival_s": arrival, "sent_s": sent,
        "first_token_s": first, "last_token_s": last, "n_chunks": [1] * n, "input_tokens": [1] * n,
        "output_tokens": [1] * n, "prompt_tokens": [1] * n, "completion_tokens": [1] * n, "ok": ok,
        "error": ["" if o else "timeout" for o in ok], "http_status": [200] * n,
    })


def test_summarize_known_answer() -> None:
    # Warm-up 1 s, window [1, 3). Request 0 arrives in warm-up but completes in the window.
    rec = _records(
        arrival=[0.5, 1.0, 1.5, 2.0, 2.9, 3.0],
        sent=[0.5, 1.0, 1.5, 2.0, 2.9, 3.0],
        first=[1.5, 1.2, 1.6, np.nan, 3.0, 3.1],
        last=[2.5, 1.4, 2.0, np.nan, 3.5, 3.2],
        ok=[True, True, True, False, True, True],
    )
    s = summarize(rec, 1.0, 2.0)
    assert s["offered_rps"] == 2.0  # arrivals 1.0, 1.5, 2.0, 2.9 (3.0 is after the window)
    assert s["success_rate"] == 0.75
    assert s["throughput_rps"] == 1.5  # completions at 2.5 (warm-up arrival), 1.4, 2.0
    ttft = np.array([0.2, 0.1, 0.1])  # successful window requests only
    assert s["ttft_p99_s"] == pytest.approx(np.percentile(ttft, 99))
    assert s["completion_p99_s"] == pytest.approx(np.percentile([0.4, 0.5, 0.6], 99))
    assert s["n_timeout"] == 1 and s["n_error"] == 0


def test_prompt_tokens_exact_length_and_distinct() -> None:
    a, b = prompt_tokens(0, 1, 500), prompt_tokens(0, 2, 500)
    assert len(a) == 500 and a == prompt_tokens(0, 1, 500) and a != b
    assert min(a) >= 1000 and max(a) < 30000


def test_completions_url() -> None:
    for base in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/completions"):
        assert completions_url(base) == "http://h:1/v1/completions"


def test_write_records_never_overwrites(tmp_path) -> None:
    rec = _records([0.0], [0.0], [0.1], [0.2], [True])
    path = write_records(rec, tmp_path / "raw" / "a.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(path), rec)
    with pytest.raises(FileExistsError):
        write_records(rec, path)
