"""`fleetsieve-bayes measure` against a running fake server."""

from __future__ import annotations

import json

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
    assert 0.01 <= row["ttft_p99_s"] < 0.2 and 0.1 <= row["completion_p99_s"] < 0.35
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
