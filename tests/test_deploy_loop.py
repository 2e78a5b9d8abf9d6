"""The whole loop: campaign → plan → serve (fake vLLM servers) → traffic → verify → re-plan.

The tiny replay campaign certifies chat on TP4@C64. Its plan is served by fake
servers with vLLM's /metrics; chat's replica aborts every other request, so
the live window shows its success far below the SLO. ``run --reuse-measurements
OLD --production VERIFY.json`` enters the window as a production observation
of chat's cell, certifies again, and names the cell that had to change.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
from tiny_campaign import write_tiny

from fleetsieve_bayes.backends.loadgen import LoadSpec, run_cell_sync
from fleetsieve_bayes.backends.traces import Schedule
from fleetsieve_bayes.campaign.journal import MeasurementRecord, read_records
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.testing import running_fake_server

FLAGS = ("--slots", "64", "--token-delay", "0.05")


def _traffic(url: str, rate: float, n: int = 40) -> None:
    sched = Schedule(np.arange(n) / rate, np.full(n, 8), np.full(n, 8), np.arange(n))
    run_cell_sync(LoadSpec(endpoint=url, model="m", warmup_s=0.0, duration_s=n / rate, request_timeout_s=30.0), sched)


def test_campaign_plan_serve_verify_replan(tmp_path: Path, capsys) -> None:
    campaign = write_tiny(tmp_path / "c")
    old = tmp_path / "old"
    assert cli_main(["run", str(campaign), "--out", str(old), "--quiet"]) == 0
    result = json.loads((old / "result.json").read_text())
    assert result["status"] == "certified-feasible"
    chat_cell = result["allocation"]["chat"]
    assert (chat_cell["tp"], chat_cell["load"]) == (4, "C64")

    plan_dir = tmp_path / "plan"
    assert cli_main(["plan", str(old), "--nodes", "1", "--gpus-per-node", "8", "--out", str(plan_dir)]) == 0
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert plan["certified"] and {c["workload"] for c in plan["classes"]} == {"chat", "code"}

    verify_json = tmp_path / "verify.json"
    with running_fake_server(*FLAGS, "--abort-every", "2", model="m") as chat, \
            running_fake_server(*FLAGS, model="m") as code:
        # Each class at its certified cell's rate per replica (C64: 6.4 req/s, C96: 9.6 req/s).
        drivers = [threading.Thread(target=_traffic, args=(u, r)) for u, r in ((chat, 6.4), (code, 9.6))]
        for t in drivers:
            t.start()
        rc = cli_main(["verify", str(plan_dir), "--metrics", f"chat={chat}/metrics,code={code}/metrics",
                       "--window", "3s", "--json", "--out", str(verify_json)])
        for t in drivers:
            t.join()
    assert rc == 0
    report = json.loads(verify_json.read_text())
    verdicts = {c["workload"]: c["verdict"] for c in report["classes"]}
    assert verdicts["chat"] == "violates" and verdicts["code"] != "violates"
    chat_live = next(c for c in report["classes"] if c["workload"] == "chat")
    assert 0.3 < chat_live["metrics"]["success_rate"]["value"] < 0.7
    capsys.readouterr()

    new = tmp_path / "new"
    rc = cli_main(["run", str(campaign), "--out", str(new), "--reuse-measurements", str(old),
                   "--production", str(verify_json)])
    stdout = capsys.readouterr().out
    assert rc == 0
    records, _ = read_records(new / "journal.jsonl")
    prod = [r for r in records if isinstance(r, MeasurementRecord) and r.phase == "production"]
    assert {(r.cell.workload, r.cell.tp, r.cell.load) for r in prod} == {("chat", 4, "C64"), ("code", 4, "C96")}
    assert all(r.gpu_seconds == 0 and str(verify_json) in (r.source or "") for r in prod)
    after = json.loads((new / "result.json").read_text())
    assert after["status"] == "certified-feasible"
    assert (after["allocation"]["chat"]["tp"], after["allocation"]["chat"]["load"]) != (4, "C64")
    assert after["allocation"]["code"] == result["allocation"]["code"]
    assert [p["workload"] for p in after["production"]["changed"]] == ["chat"]
    assert "chat: production windows put TP4@C64 outside its SLO" in stdout
