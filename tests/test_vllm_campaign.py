"""End to end: `fleetsieve-bayes run` with backend = "vllm" against the fake engine, on CPU.

One workload × TP {1, 2} × three loads, ~2 s per cell. The fake server's speed
depends on TP (--tp-speedup 1: the step halves at TP2; --tp-slots: twice the
slots), so TP matters: at 20 req/s offered TP1 saturates (capacity 20 req/s,
TTFT tail grows) while TP2 (capacity 80 req/s) keeps up.
"""

from __future__ import annotations

import json

import pytest
from fake_vllm import write_fake_vllm_campaign

import fleetsieve_bayes.decision.bounds  # noqa: F401 - the decision loop: an import error fails here, never skips
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.table import read_table
from fleetsieve_bayes.testing import fake_server_command


def test_vllm_campaign_certifies_on_the_fake_engine(tmp_path, capsys) -> None:
    cmd = fake_server_command("--slots", "2", "--token-delay", "0.01", "--tp-speedup", "1", "--tp-slots")
    campaign = write_fake_vllm_campaign(
        tmp_path, cmd, name="fake-vllm", tp=(1, 2), model_lines='inference = "fast"',
        loads="{ low = 1.0, mid = 2.0, high = 4.0 }", warmup_s=0.5, duration_s=1.5, readiness_timeout_s=30,
        stopping='[stopping]\nepsilon = 0.05\nslo_attainment = "point"', demand_rps=8.0, critical=True,
        slo="{ success_min = 0.99, ttft_p99_s = 0.5, completion_p99_s = 2.0 }", n_requests=40,
    )
    out = tmp_path / "run"
    rc = main(["run", str(campaign), "--out", str(out), "--quiet", "--json"])
    assert rc == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "certified-feasible"
    alloc = result["allocation"]["chat"]
    assert alloc["replicas"] >= 1 and alloc["tp"] * alloc["replicas"] <= 4
    measured = read_table(out / "measurements.csv")
    assert len(measured) == len(result["measured"])
    # GPU-seconds = Σ duration × TP over the measured cells (2 s per cell).
    assert result["gpu_seconds"] == pytest.approx(float((measured["duration_s"] * measured["tp"]).sum()))
    # Start-up is reported beside, not inside, the measurement GPU-seconds.
    assert result["startup_gpu_seconds"] == pytest.approx(float((measured["startup_s"] * measured["tp"]).sum()))
    assert result["startup_gpu_seconds"] > 0
    # The committed cell was measured, and every measured cell kept its raw records.
    assert any((m["tp"], m["load"]) == (alloc["tp"], alloc["load"]) for m in result["measured"])
    assert len(list((out / "raw").glob("*.parquet"))) == len(measured)


def test_certified_with_no_replicas_says_which_slo_is_missed(tmp_path, capsys) -> None:
    # No cell can meet a 1 ms TTFT p99: the certificate is "feasible, no replicas". The
    # summary and `status` must say why, at the class's best measured cell.
    cmd = fake_server_command("--slots", "2", "--token-delay", "0.01", "--tp-speedup", "1")
    campaign = write_fake_vllm_campaign(
        tmp_path, cmd, name="fake-miss", tp=(1, 2), loads="{ low = 1.0, mid = 2.0, high = 4.0 }",
        warmup_s=0.5, duration_s=1.5, readiness_timeout_s=30, stopping='[stopping]\nslo_attainment = "point"',
        demand_rps=8.0, slo="{ success_min = 0.99, ttft_p99_s = 0.001 }", n_requests=40,
    )
    out = tmp_path / "run"
    assert main(["run", str(campaign), "--out", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "certified-feasible" in summary and "start-up GPU-seconds" in summary
    line = next(x for x in summary.splitlines() if x.strip().startswith("chat:"))
    assert "no replicas — best measured cell TP" in line and "misses TTFT p99" in line and "> 0.001 s" in line
    assert main(["status", str(out), "--json"]) == 0
    unserved = json.loads(capsys.readouterr().out)["unserved"]
    assert unserved["chat"]["misses"][0]["slo"] == "ttft_p99_s" and unserved["chat"]["misses"][0]["limit"] == 0.001
