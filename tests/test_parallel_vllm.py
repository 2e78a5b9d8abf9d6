"""Several vLLM cells at once on this machine (local executor, real clock) against the fake engine.

Each cell gets its own backend and server on the devices the GPU pool gave it
(``CUDA_VISIBLE_DEVICES``); the server's command is wrapped to print that
variable into its log, so the test sees which devices every cell really used.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from fake_vllm import fake_vllm_campaign

from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.testing import fake_server_command


def test_vllm_cells_run_side_by_side_on_disjoint_devices(tmp_path: Path) -> None:
    fake = fake_server_command("--slots", "2", "--token-delay", "0.01", "--tp-speedup", "1", "--tp-slots")
    cmd = ["sh", "-c", "echo DEVICES=$CUDA_VISIBLE_DEVICES; exec " + shlex.join(fake)]
    campaign = fake_vllm_campaign(
        tmp_path, cmd, name="fake-vllm-pool", tp=(1, 2), gpus="gpus = [4, 5, 6, 7]\npool_gpus = 4",
        loads="{ low = 1.0, mid = 2.0, high = 4.0 }", warmup_s=0.5, duration_s=1.5, readiness_timeout_s=30,
        stopping='[stopping]\nepsilon = 0.05\nslo_attainment = "point"', n_requests=40, demand_rps=8.0,
        critical=True, slo="{ success_min = 0.99, ttft_p99_s = 0.5, completion_p99_s = 2.0 }")
    out = tmp_path / "run"
    r = run_campaign(campaign, out).result
    assert r["status"] == "certified-feasible"
    assert r["pool"] == {"pool_gpus": 4, "executor": "local", "clock": "real"}
    recs = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    # Every server ran on as many of the campaign's devices as its TP.
    logs = sorted((out / "logs").glob("*.log"))
    # (a cell still in flight when the certificate was issued is cancelled: its server ran too)
    assert len(logs) == len([x for x in recs if x["type"] in ("measurement", "cancelled")])
    for log in logs:
        tp = int(re.search(r"_tp(\d+)_", log.name).group(1))
        devices = re.search(r"DEVICES=([\d,]+)", log.read_text()).group(1).split(",")
        assert len(devices) == tp and set(devices) <= {"4", "5", "6", "7"}
    # The design's two cells (TP1 and TP2) overlapped, on disjoint pool slots.
    started = [x for x in recs if x["type"] == "started"]
    finished = {json.dumps(x["cell"]): x for x in recs if x["type"] in ("finished", "cancelled")}
    a, b = started[0], started[1]
    assert b["start_s"] < finished[json.dumps(a["cell"])]["finish_s"]
    assert not set(a["gpus"]) & set(b["gpus"])
    spans = [finished[json.dumps(x["cell"])]["finish_s"] - x["start_s"] for x in started]
    assert r["profiling_wall_s"] < sum(spans)
