"""A run killed right after its last window's journal record, resumed: measurements.csv is whole.

``run`` appends a window to the journal, then rewrites measurements.csv. A SIGKILL between the
two leaves the file a window short; the resumed run only has to certify (no window more), and
must still leave measurements.csv holding every window of the journal, as a run that was never
killed does. (The session's shipped run, tests/campaign_dirs.py, is killed and resumed the same
way; whether its resumption measures again depends on the trail.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tiny_campaign import write_tiny

from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.table import read_table, write_table


def test_resumed_run_rewrites_measurements_csv(tmp_path: Path) -> None:
    campaign = write_tiny(tmp_path / "c")
    whole = tmp_path / "whole"
    assert cli_main(["run", str(campaign), "--out", str(whole), "--quiet"]) == 0
    lines = (whole / "journal.jsonl").read_text().splitlines(keepends=True)
    kinds = [json.loads(x)["type"] for x in lines]
    assert kinds[-1] == "round" and kinds[-2] == "measurement"  # the last window, then the deciding round

    # What a SIGKILL right after the last window's append leaves: the journal up to that record,
    # measurements.csv as the window before left it, no result.json.
    killed = tmp_path / "killed"
    shutil.copytree(whole, killed, ignore=shutil.ignore_patterns(".lock", "result.json", "report.html"))
    (killed / "journal.jsonl").write_text("".join(lines[:-1]))
    rows = read_table(whole / "measurements.csv")
    write_table(rows.iloc[:-1], killed / "measurements.csv")

    assert cli_main(["run", str(campaign), "--out", str(killed), "--quiet"]) == 0
    resumed = json.loads((killed / "result.json").read_text())
    assert resumed["status"] == json.loads((whole / "result.json").read_text())["status"] == "certified-feasible"
    assert [json.loads(x)["type"] for x in (killed / "journal.jsonl").read_text().splitlines()] == kinds  # no window more
    assert read_table(killed / "measurements.csv").equals(rows)
    assert [(r.workload, r.tp, r.load) for r in rows.itertuples()] == [(c["workload"], c["tp"], c["load"]) for c in resumed["measured"]]
