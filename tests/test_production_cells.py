"""``run --production VERIFY.json`` whose report plans a cell that is not a candidate of the campaign.

The report is refused with one line naming the class and the cell (exit 2), before the
campaign directory gets its header: a run of the same ``--out`` with a corrected report then
starts the campaign and enters the windows, instead of resuming a header-only campaign
without them (docs/contracts.md, "verify JSON").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tiny_campaign import write_tiny

from fleetsieve_bayes.campaign.hooks import RunHooks, installed
from fleetsieve_bayes.campaign.journal import read_journal
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.deploy.metrics import QuantileBound, WindowReading
from fleetsieve_bayes.deploy.verify import verify_report

SLO = {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 30.0}


def _verify_json(path: Path, cells: dict[str, tuple[int, str]]) -> Path:
    """A verify report (the package's own writer) of a plan whose classes sit on ``cells``."""
    plan = {"campaign": "tiny", "campaign_dir": "/x", "certified": True, "certificate": {"campaign_fingerprint": "f"},
            "classes": [{"workload": w, "tp": tp, "load": load, "replicas": 1, "offered_rps_per_replica": 6.4,
                         "slo": SLO, "predicted": {}} for w, (tp, load) in cells.items()]}
    live = {w: WindowReading(300.0, 1, 1920, 1915, 6.4, 6.38, 1915 / 1920, QuantileBound(0.5, 1.0, 0.8, 1920),
                             QuantileBound(10.0, 15.0, 12.0, 1920), 0.4, {}) for w in cells}
    path.write_text(json.dumps(verify_report(plan, live, {"kind": "metrics", "window_s": 300.0})))
    return path


class _Stop(BaseException):
    """Ends a run after its first journal appends (nothing in the package catches it)."""


def test_a_planned_cell_that_is_not_a_candidate_is_refused_before_the_campaign_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign = write_tiny(tmp_path / "c")  # cells TP2 and TP4 only
    out = tmp_path / "new"
    bad = _verify_json(tmp_path / "bad.json", {"chat": (4, "C64"), "code": (8, "C64")})
    assert cli_main(["run", str(campaign), "--out", str(out), "--quiet", "--production", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"fleetsieve-bayes run: error: --production {bad}: class code's cell TP8@C64 "
                                "is not a candidate of this campaign"]
    assert read_journal(out / "journal.jsonl")[0] == []  # no header: nothing to resume

    # The corrected report, into the same directory: a new campaign whose first records are the windows.
    good = _verify_json(tmp_path / "good.json", {"chat": (4, "C64"), "code": (4, "C96")})
    appended: list[int] = []

    def stop_after_the_windows(n: int) -> None:
        appended.append(n)
        if n == 3:  # header, chat's window, code's window
            raise _Stop

    with pytest.raises(_Stop), installed(RunHooks(on_append=stop_after_the_windows)):
        cli_main(["run", str(campaign), "--out", str(out), "--quiet", "--production", str(good)])
    records: list[dict[str, Any]] = read_journal(out / "journal.jsonl")[0]
    assert [r["type"] for r in records] == ["header", "measurement", "measurement"]
    assert [(r["phase"], r["cell"]["workload"], r["cell"]["tp"], r["cell"]["load"], r["gpu_seconds"]) for r in records[1:]] == [
        ("production", "chat", 4, "C64", 0.0), ("production", "code", 4, "C96", 0.0)]
    assert all(str(good.resolve()) in r["source"] for r in records[1:])
    assert records[1]["row"]["throughput_rps"] == pytest.approx(6.38) and records[1]["row"]["ttft_p99_s"] == 0.8
