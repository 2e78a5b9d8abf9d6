"""``fleetsieve-bayes status``: finished, running (locked) and killed campaigns, text and JSON."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from campaign_dirs import (
    CANDIDATES,
    CERTIFIED_ALLOCATION,
    CERTIFIED_CELLS,
    CERTIFIED_GPU_SECONDS,
    Runs,
    copy_run,
    journal,
)
from rich.console import Console

from fleetsieve_bayes.campaign.journal import campaign_lock
from fleetsieve_bayes.commands.status import render_status, status_json
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.reporting.report import load_campaign_dir


@pytest.fixture(scope="module")
def finished(shipped_runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A copy of the certified run, its journal and result.json."""
    d = copy_run(shipped_runs.certified, tmp_path_factory.mktemp("finished"))
    return d, {"records": journal(d), "result": json.loads((d / "result.json").read_text())}


def test_status_json_of_finished_campaign(finished: tuple[Path, dict[str, Any]]) -> None:
    d, built = finished
    s = status_json(load_campaign_dir(d))
    meas = [r for r in built["records"] if r["type"] == "measurement"]
    rounds = [r for r in built["records"] if r["type"] == "round"]
    assert s["state"] == "finished" and s["status"] == "certified-feasible" == built["result"]["status"]
    assert s["candidates"] == CANDIDATES == len(built["records"][0]["cells"])
    assert s["measured_cells"] == len(meas) == len(built["result"]["measured"]) == CERTIFIED_CELLS
    assert s["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for r in meas)) == built["result"]["gpu_seconds"] == CERTIFIED_GPU_SECONDS
    assert [(m["workload"], m["tp"], m["load"]) for m in s["measured"]] == [(r["cell"]["workload"], r["cell"]["tp"], r["cell"]["load"]) for r in meas]
    assert s["certificate"] == {"status": "certified-feasible", "reason": rounds[-1]["reason"], "gap": rounds[-1]["gap"],
                                "round": len(rounds), "joint": rounds[-1]["joint"]}
    assert s["certificate"]["joint"]["diagnostics"]["converged"] is True  # the certifying fit's
    assert s["conservative"]["allocation"] == rounds[-1]["conservative"]["allocation"] == CERTIFIED_ALLOCATION
    assert s["optimistic"]["allocation"] == rounds[-1]["optimistic"]["allocation"]
    assert s["result"]["allocation"] == built["result"]["allocation"] == CERTIFIED_ALLOCATION


def test_status_of_running_and_killed_campaign(shipped_runs: Runs, tmp_path: Path) -> None:
    d = copy_run(shipped_runs.killed, tmp_path / "c")  # SIGKILLed right after round 2's measurement
    records = journal(d)
    with open(d / "journal.jsonl", "a") as fh:
        fh.write('{"type":"round","round":3,')  # cut by a kill mid-write
    with campaign_lock(d):  # a run holds the directory
        view = load_campaign_dir(d)
        assert view.state == "running"
    view = load_campaign_dir(d)
    assert view.state == "stopped" and view.result is None
    s = status_json(view)
    rounds = [r for r in records if r["type"] == "round"]
    meas = [r for r in records if r["type"] == "measurement"]
    assert s["status"] == "undecided" and s["rounds"] == len(rounds) == 2 and s["measured_cells"] == len(meas) == 8
    assert s["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for r in meas))
    assert s["next"] == rounds[-1]["chosen"] == meas[-1]["cell"]
    assert s["next_state"] == "last chosen cell (measured)"
    # Killed one append earlier, between the round record and its measurement: the chosen cell is cut off.
    lines = (d / "journal.jsonl").read_text().splitlines(keepends=True)
    (d / "journal.jsonl").write_text("".join(lines[:-2]))
    s = status_json(load_campaign_dir(d))
    assert s["next_state"] == "chosen next, not measured (interrupted)" and s["measured_cells"] == 7
    assert s["next"] == rounds[-1]["chosen"]


def test_status_text_shows_cells_certificate_allocations_and_gap(finished: tuple[Path, dict[str, Any]]) -> None:
    d, built = finished
    buf = io.StringIO()
    render_status(load_campaign_dir(d), Console(file=buf, width=160, color_system=None))
    out = buf.getvalue()
    assert "status: certified-feasible" in out
    assert f"cells measured: {CERTIFIED_CELLS} / {CANDIDATES}" in out and f"GPU-seconds: {CERTIFIED_GPU_SECONDS:,.0f}" in out
    last = [r for r in built["records"] if r["type"] == "round"][-1]
    assert f"round {last['round']}: certified-feasible" in out
    assert "gap: critical 0, min fulfillment 0.000, goodput 0.000" in out
    # Each class's conservative, optimistic and final allocation.
    allocs = [last["conservative"]["allocation"], last["optimistic"]["allocation"], built["result"]["allocation"]]
    for w in ("chat", "code"):
        row = next(line for line in out.splitlines() if line.strip("│ ").startswith(w + " "))
        want = [f"TP{a[w]['tp']}@{a[w]['load']} ×{a[w]['replicas']} ({a[w]['tp'] * a[w]['replicas']} GPUs)" for a in allocs]
        assert [c.strip() for c in row.strip("│ ").split("│")[1:]] == want, row
    # The measured cells, in the journal's order, each with its row: chat TP2@C32 missed its SLO.
    table = out[out.index("Measured cells"):]
    at = 0
    for i, r in enumerate(r for r in built["records"] if r["type"] == "measurement"):
        c = r["cell"]
        line = next(x for x in table.splitlines() if f" {c['workload']} TP{c['tp']}@{c['load']} " in x)
        assert line.split("│")[1].strip() == str(i + 1) and f"{r['phase']} r{r['round']}" in line
        assert table.index(line) > at
        at = table.index(line)
    chat2 = next(x for x in table.splitlines() if " chat TP2@C32 " in x)
    assert [x.strip() for x in chat2.split("│")[4:8]] == ["2.41", "2.90", "38.5", "0.981"]


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
