"""`fleetsieve-bayes measure` against a running fake server."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from fleetsieve_bayes.backends.server import free_port
from fleetsieve_bayes.backends.traces import write_azure_trace
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.table import COLUMNS, validate_table
from fleetsieve_bayes.testing import running_fake_server


@pytest.fixture()
def trace(tmp_path):
    path = tmp_path / "chat.csv"
    n = 40
    write_azure_trace(path, np.arange(n) * 0.2, np.full(n, 30), np.full(n, 10))
    return path


def test_measure_prints_one_valid_row(trace, tmp_path, capsys) -> None:
    records = tmp_path / "rec.parquet"
    with running_fake_server("--slots", "4", "--token-delay", "0.01", model="m") as url:
        rc = main(["measure", "--endpoint", url + "/v1", "--model", "m", "--trace", str(trace),
                   "--scale", "2", "--duration", "1.5", "--warmup", "0.5", "--tp", "2",
                   "--load", "L1", "--records", str(records), "--json"])
    assert rc == 0
    row = json.loads(capsys.readouterr().out)
    assert list(row) == [*COLUMNS, "seed", "failure"]
    assert (row["workload"], row["tp"], row["load"]) == ("chat", 2, "L1")
    assert row["offered_rps"] == pytest.approx(10.0)  # 15 arrivals (every 0.1 s) in [0.5, 2.0)
    assert row["duration_s"] == 2.0 and row["success_rate"] == 1.0
    # The server's sleeps bound the tails below (one 0.01 s step to the first token, ten to
    # the last); the first token comes before the last.
    assert 0.01 <= row["ttft_p99_s"] <= row["completion_p99_s"] < math.inf and row["completion_p99_s"] >= 0.1
    validate_table(pd.DataFrame([row]))
    assert len(pd.read_parquet(records)) == 20


def test_unhealthy_endpoint_is_one_line_error(trace, capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    rc = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(trace),
               "--scale", "1", "--duration", "1", "--warmup", "0", "--json"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and url in err and "not healthy" in err


def test_bad_trace_is_one_line_error(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\nyesterday,3,4\n")
    rc = main(["measure", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--trace", str(bad),
               "--scale", "1", "--duration", "1", "--warmup", "0"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "line 3" in err and "TIMESTAMP" in err


def test_prompts_stay_inside_the_served_vocabulary(trace, tmp_path, capsys) -> None:
    # The fake server rejects token ids >= 500 like vLLM ("Token id … is out of vocabulary").
    records = tmp_path / "rec.parquet"
    with running_fake_server("--vocab-size", "500", model="m") as url:
        ok = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(trace), "--scale", "2",
                   "--duration", "1", "--warmup", "0.2", "--vocab-size", "500", "--json"])
        row_ok = json.loads(capsys.readouterr().out)
        # Without the vocabulary the legacy range [1000, 30000) is used: every request fails,
        # and the row says so (a failure label, not success 0 with an empty one).
        bad = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(trace), "--scale", "2",
                    "--duration", "1", "--warmup", "0.2", "--records", str(records), "--json"])
        cap = capsys.readouterr()
    assert ok == 0 and row_ok["failure"] == "" and row_ok["success_rate"] == 1.0
    row_bad = json.loads(cap.out)
    assert bad == 0 and row_bad["failure"] == "request-errors" and row_bad["success_rate"] == 0.0
    assert "out of vocabulary" in cap.err and "\n" not in cap.err.strip()
    rec = pd.read_parquet(records)
    assert (rec["error"] == "http-400").all() and rec["detail"].str.contains("out of vocabulary").all()


def test_prompt_plus_output_fit_the_served_context(tmp_path, capsys) -> None:
    path = tmp_path / "long.csv"
    n = 20
    write_azure_trace(path, np.arange(n) * 0.1, np.full(n, 4000), np.full(n, 20))  # prompts far too long
    with running_fake_server("--max-model-len", "64", model="m") as url:  # reports max_model_len in /v1/models
        rc = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(path), "--scale", "1",
                   "--duration", "1", "--warmup", "0.2", "--json"])
        row = json.loads(capsys.readouterr().out)
        assert rc == 0 and row["failure"] == "" and row["success_rate"] == 1.0
        write_azure_trace(path, np.arange(n) * 0.1, np.full(n, 10), np.full(n, 64))  # the output alone fills it
        too_long = main(["measure", "--endpoint", url, "--model", "m", "--trace", str(path), "--scale", "1",
                         "--duration", "1", "--warmup", "0.2"])
        err = capsys.readouterr().err.strip()
    assert too_long == 2 and "\n" not in err
    assert str(path) in err and "64 output tokens" in err and "context is 64 tokens" in err


def test_fit_to_context_keeps_outputs_and_shortens_prompts() -> None:
    from fleetsieve_bayes.backends.cell import fit_to_context
    from fleetsieve_bayes.backends.traces import Schedule

    plan = Schedule(np.arange(3.0), np.array([10, 300, 5000]), np.array([20, 50, 100]), np.arange(3))
    fitted = fit_to_context(plan, 256, "t.csv")
    assert fitted.input_tokens.tolist() == [10, 206, 156] and fitted.output_tokens.tolist() == [20, 50, 100]
    assert ((fitted.input_tokens + fitted.output_tokens) <= 256).all()
    assert fit_to_context(plan, None, "t.csv") is plan


def test_token_range_follows_the_vocabulary() -> None:
    from fleetsieve_bayes.backends.loadgen import (
        TOKEN_ID_HIGH,
        TOKEN_ID_LOW,
        prompt_tokens,
        token_range,
    )

    assert token_range(None) == (TOKEN_ID_LOW, TOKEN_ID_HIGH)
    assert token_range(32000) == (1000, 30000)
    lo, hi = token_range(512)
    assert (lo, hi) == (128, 512)
    ids = prompt_tokens(0, 3, 2000, token_ids=(lo, hi), salt=7)
    assert min(ids) >= 128 and max(ids) < 512
    assert ids != prompt_tokens(0, 3, 2000, token_ids=(lo, hi), salt=8)  # cells sharing a server differ
