"""``fleetsieve-bayes status``: finished, running (locked) and killed campaigns, text and JSON."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_report import FINAL, build_campaign_dir

from fleetsieve_bayes.campaign.journal import campaign_lock
from fleetsieve_bayes.commands.status import render_status, status_json
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.reporting.report import load_campaign_dir


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    d = tmp_path_factory.mktemp("finished")
    return d, build_campaign_dir(d, posterior=False)


def test_status_json_of_finished_campaign(finished: tuple[Path, dict[str, Any]]) -> None:
    d, built = finished
    s = status_json(load_campaign_dir(d))
    meas = [r for r in built["records"] if r["type"] == "measurement"]
    rounds = [r for r in built["records"] if r["type"] == "round"]
    assert s["state"] == "finished" and s["status"] == "certified-feasible"
    assert s["candidates"] == 22
    assert s["measured_cells"] == len(meas) == 9
    assert s["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for r in meas)) == built["result"]["gpu_seconds"]
    assert [(m["workload"], m["tp"], m["load"]) for m in s["measured"]] == [(r["cell"]["workload"], r["cell"]["tp"], r["cell"]["load"]) for r in meas]
    assert s["certificate"] == {"status": "certified-feasible", "reason": rounds[-1]["reason"], "gap": rounds[-1]["gap"], "round": len(rounds)}
    assert s["conservative"]["allocation"] == FINAL and s["optimistic"]["allocation"] == FINAL
    assert s["result"]["allocation"] == FINAL


def test_status_of_running_and_killed_campaign(tmp_path: Path) -> None:
    build_campaign_dir(tmp_path, finished=False, posterior=False, n_rounds=2)
    with open(tmp_path / "journal.jsonl", "a") as fh:
        fh.write('{"type":"round","round":3,')  # cut by a kill mid-write
    with campaign_lock(tmp_path):  # a run holds the directory
        view = load_campaign_dir(tmp_path)
        assert view.state == "running"
    view = load_campaign_dir(tmp_path)
    assert view.state == "stopped" and view.result is None
    s = status_json(view)
    assert s["status"] == "undecided" and s["rounds"] == 2 and s["measured_cells"] == 8
    assert s["next"] == {"workload": "code", "tp": 4, "load": "C96"}
    assert s["next_state"] == "last chosen cell (measured)"
    # Kill between the round record and its measurement: the chosen cell is cut off.
    lines = (tmp_path / "journal.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "journal.jsonl").write_text("".join(lines[:-2]))
    s = status_json(load_campaign_dir(tmp_path))
    assert s["next_state"] == "chosen next, not measured (interrupted)" and s["measured_cells"] == 7


def test_status_text_shows_cells_certificate_allocations_and_gap(finished: tuple[Path, dict[str, Any]]) -> None:
    d, _ = finished
    buf = io.StringIO()
    render_status(load_campaign_dir(d), Console(file=buf, width=160, color_system=None))
    out = buf.getvalue()
    assert "certified-feasible" in out
    assert "cells measured: 9 / 22" in out and "GPU-seconds: 12,000" in out
    assert "gap: critical 0, min fulfillment 0.000, goodput 0.000" in out
    assert "TP4@C96 ×2 (8 GPUs)" in out  # both classes, each allocation
    assert out.count("TP4@C96 ×2 (8 GPUs)") == 6
    assert "chat TP4@C128" in out and "46.4" in out  # the measured cell that violates the SLO


def test_status_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no journal.jsonl"):
        load_campaign_dir(tmp_path)
    (tmp_path / "journal.jsonl").write_text('{"type":"measurement"}\nnot json\n{"type":"round"}\n')
    with pytest.raises(InputError, match=r"journal.jsonl: line 2: corrupt journal record"):
        load_campaign_dir(tmp_path)
    (tmp_path / "journal.jsonl").write_text("")
    with pytest.raises(InputError, match="no header record"):
        load_campaign_dir(tmp_path)


def test_status_cli_is_fast_and_never_imports_jax(finished: tuple[Path, dict[str, Any]]) -> None:
    d, _ = finished
    code = (
        "import sys, json, io, contextlib\n"
        "from fleetsieve_bayes.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main(['status', {str(d)!r}, '--json'])\n"
        "assert rc == 0, rc\n"
        "s = json.loads(buf.getvalue())\n"
        "assert s['status'] == 'certified-feasible', s['status']\n"
        "bad = [m for m in ('jax', 'numpyro', 'matplotlib', 'arviz') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "rc = main(['status', '/nonexistent/dir'])\n"
        "assert rc == 2, rc\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fleetsieve-bayes status: error: /nonexistent/dir: not a campaign directory" in proc.stderr
