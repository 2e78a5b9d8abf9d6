"""A window in which the server fails some requests is a success measurement, not a failed cell.

The fake server answers every 11th completion request with HTTP 500 and serves
the others. A 93-request window (no warm-up, so every request sent is a window
request) then has exactly 8 failed requests, whatever order they reach the
server in: the row must read success 85/93, with throughput and tails from the
85 that succeeded, and no failure label — through ``measure`` and through the
campaign's vLLM backend alike.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from fake_vllm import fake_vllm_campaign

from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.backends.failures import (
    DIED_MID_RUN,
    NO_SUCCESS,
    REQUEST_ERRORS,
    classify_run,
)
from fleetsieve_bayes.backends.traces import write_azure_trace
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.commands.measure import DEPRECATED_TOLERANCE
from fleetsieve_bayes.table import COLUMNS, validate_table
from fleetsieve_bayes.testing import fake_server_command, running_fake_server

N_REQUESTS, GAP_S, ERROR_EVERY = 93, 0.02, 11
WINDOW_S = N_REQUESTS * GAP_S  # arrivals at 0, 0.02, …, 1.84 s: all 93 inside [0, 1.86)
N_FAILED = N_REQUESTS // ERROR_EVERY  # requests 11, 22, …, 88 as received: 8
SERVER_FLAGS = ("--slots", "16", "--token-delay", "0.002", "--error-every", str(ERROR_EVERY))


def _write_trace(path) -> None:
    n = N_REQUESTS
    write_azure_trace(path, np.arange(n) * GAP_S, np.full(n, 8), np.full(n, 5))


def _expected_from_records(rec: pd.DataFrame) -> dict[str, float]:
    """Success, throughput and tails recomputed from the raw records (warm-up 0, window WINDOW_S)."""
    ok = rec["ok"].to_numpy(bool)
    last = rec["last_token_s"].to_numpy(np.float64)
    in_window = ok & (last >= 0) & (last < WINDOW_S)
    ttft = (rec["first_token_s"] - rec["sent_s"]).to_numpy(np.float64)[ok]
    comp = (rec["last_token_s"] - rec["sent_s"]).to_numpy(np.float64)[ok]
    return {
        "success_rate": ok.sum() / len(rec),
        "throughput_rps": in_window.sum() / WINDOW_S,
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "completion_p99_s": float(np.percentile(comp, 99)),
    }


def _check_row(row: dict, rec: pd.DataFrame) -> None:
    assert len(rec) == N_REQUESTS
    assert int((rec["error"] == "http-500").sum()) == N_FAILED and int(rec["ok"].sum()) == N_REQUESTS - N_FAILED
    assert row["failure"] == ""
    assert row["success_rate"] == pytest.approx(85 / 93, rel=1e-12)
    assert row["offered_rps"] == pytest.approx(N_REQUESTS / WINDOW_S)
    want = _expected_from_records(rec)
    for k, v in want.items():
        assert row[k] == pytest.approx(v, rel=1e-12), k
    assert np.isfinite(row["ttft_p99_s"]) and row["throughput_rps"] > 0
    validate_table(pd.DataFrame([{k: row[k] for k in (*COLUMNS, "seed", "failure")}]))


def test_measure_8_of_93_failed_is_success_85_of_93(tmp_path, capsys) -> None:
    trace, records = tmp_path / "chat.csv", tmp_path / "rec.parquet"
    _write_trace(trace)
    with running_fake_server(*SERVER_FLAGS, model="m") as url:
        rc = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(trace), "--scale", "1",
                   "--duration", str(WINDOW_S), "--warmup", "0", "--records", str(records), "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    row = json.loads(cap.out)
    assert list(row) == [*COLUMNS, "seed", "failure"]
    _check_row(row, pd.read_parquet(records))
    # stderr says what happened in one line: how many failed, and the server's first error.
    err = cap.err.strip()
    assert "\n" not in err and "8 request errors" in err and "of 93 window requests" in err and "http-500" in err


def test_error_tolerance_is_deprecated_and_has_no_effect(tmp_path, capsys) -> None:
    trace = tmp_path / "chat.csv"
    _write_trace(trace)
    with running_fake_server(*SERVER_FLAGS, model="m") as url:
        rc = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(trace), "--scale", "1",
                   "--duration", str(WINDOW_S), "--warmup", "0", "--error-tolerance", "0.0", "--json"])
    cap = capsys.readouterr()
    row = json.loads(cap.out)
    assert rc == 0 and row["failure"] == "" and row["success_rate"] == pytest.approx(85 / 93)
    assert cap.err.splitlines()[0] == DEPRECATED_TOLERANCE


def _vllm_campaign(tmp_path, extra: str = "") -> object:
    return fake_vllm_campaign(
        tmp_path, fake_server_command(*SERVER_FLAGS), name="partial", fleet="gpus = 2", tp=(1,), gpus="gpus = [0]",
        loads="{ x1 = 1.0 }", warmup_s=0, duration_s=WINDOW_S, extra=extra,
        n_requests=N_REQUESTS, gap_s=GAP_S, output_tokens=5)


def test_campaign_backend_8_of_93_failed_is_success_85_of_93(tmp_path) -> None:
    # The deprecated key is still accepted (and has no effect, even at 0).
    backend = make_backend(_vllm_campaign(tmp_path, "request_error_tolerance = 0.0"), tmp_path / "out")
    try:
        row = backend.measure(0)
    finally:
        backend.close()
    (raw,) = list((tmp_path / "out" / "raw").glob("*.parquet"))
    _check_row(row, pd.read_parquet(raw))
    assert "8 request errors" in row["detail"]


def test_classify_run_labels_only_a_window_where_the_server_failed() -> None:
    assert classify_run(server_died=True, n_window=93, n_error=0, n_ok=93) == DIED_MID_RUN
    assert classify_run(server_died=False, n_window=93, n_error=93, n_ok=0) == REQUEST_ERRORS
    assert classify_run(server_died=False, n_window=93, n_error=0, n_ok=0) == NO_SUCCESS  # all timed out
    assert classify_run(server_died=False, n_window=93, n_error=92, n_ok=1) == ""  # one served: measured
    assert classify_run(server_died=False, n_window=93, n_error=8, n_ok=85) == ""


class _Stop(Exception):
    pass


def test_campaign_journals_the_8_of_93_window_as_a_success_measurement(tmp_path) -> None:
    from fleetsieve_bayes.campaign.hooks import RunHooks
    from fleetsieve_bayes.campaign.journal import read_records
    from fleetsieve_bayes.campaign.runner import run_campaign

    def stop_after_first_measurement(n: int) -> None:
        if n >= 2:  # the header, then the design's one cell
            raise _Stop

    out = tmp_path / "run"
    with pytest.raises(_Stop):
        run_campaign(_vllm_campaign(tmp_path), out, hooks=RunHooks(on_append=stop_after_first_measurement))
    records, _ = read_records(out / "journal.jsonl")
    (meas,) = [r for r in records if hasattr(r, "row")]
    (raw,) = list((out / "raw").glob("*.parquet"))
    _check_row({k: meas.row[k] for k in (*COLUMNS, "seed", "failure")}, pd.read_parquet(raw))
    assert meas.replicate == 0 and meas.gpu_seconds == pytest.approx(WINDOW_S)
