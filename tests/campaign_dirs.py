"""Campaign directories that ``fleetsieve-bayes run`` wrote, for the report, status, plan and
verify tests.

One real campaign per test session: the shipped H100 campaign at ``"point"``
(tests/shipped.py), started under the kill hooks
(:mod:`fleetsieve_bayes.testing.faults`) so that it is SIGKILLed right after
its :data:`KILL_AFTER_APPEND`-th journal append (round 2's measurement), then
resumed to the end by a plain ``run``. A copy taken between the two is
:attr:`Runs.killed` (a campaign killed mid-way: no result.json); the finished
directory is :attr:`Runs.certified`. Both are read-only for the tests: a test
that changes a directory works on a copy (:func:`copy_run`).

The runs are made once per session, whatever the number of xdist workers: in
a folder that the workers share, under a lock, on first use. To keep them
across sessions while working on these tests, name a folder in
``FLEETSIEVE_TEST_RUNS`` (and empty it after changing the package).

The outcome pinned here (:data:`CERTIFIED_ALLOCATION`, :data:`CERTIFIED_GPU_SECONDS`,
:data:`CERTIFIED_CELLS`) is the shipped campaign's at ``"point"``; the tests that
name a number of the campaign's trail read it from here, so a change of the
numerics re-pins it in one place.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from shipped import point_file

from fleetsieve_bayes.campaign.journal import read_journal

# Header, 6 design measurements, round 1, its cell, round 2, its cell.
KILL_AFTER_APPEND = 11
# The shipped campaign at "point" certifies the oracle fleet. Its trail (the cells it
# measures, so its GPU-seconds) moves with the numerics: re-pin these two with them.
CERTIFIED_ALLOCATION = {"chat": {"tp": 4, "load": "C96", "replicas": 2}, "code": {"tp": 4, "load": "C96", "replicas": 2}}
CERTIFIED_GPU_SECONDS = 10800.0
CERTIFIED_CELLS = 8
CANDIDATES = 22


class Runs(NamedTuple):
    certified: Path  # finished, certified-feasible
    killed: Path  # SIGKILLed after KILL_AFTER_APPEND journal appends: no result.json


_root: Path | None = None
_runs: Runs | None = None


def set_root(path: Path) -> None:
    """The folder the session's runs live in (shared by the xdist workers of one session)."""
    global _root
    _root = path


def _fleetsieve(*args: str, module: str = "fleetsieve_bayes") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=1800)


def _make(runs: Path) -> None:
    shutil.rmtree(runs, ignore_errors=True)  # what a failed attempt left
    runs.mkdir(parents=True)
    campaign = point_file(runs)
    out = runs / "certified"
    killed = _fleetsieve("--kill-after-append", str(KILL_AFTER_APPEND), "--", "run", str(campaign), "--out", str(out),
                         "--quiet", module="fleetsieve_bayes.testing.faults")
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-3000:])  # SIGKILL, as the hook does
    assert not (out / "result.json").exists()
    shutil.copytree(out, runs / "killed", ignore=shutil.ignore_patterns(".lock"))
    resumed = _fleetsieve("run", str(campaign), "--out", str(out), "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (runs / "done").write_text("")


def shipped_runs() -> Runs:
    """The session's two directories, made on first use (under a lock shared by the workers)."""
    global _runs
    if _runs is not None:
        return _runs
    kept = os.environ.get("FLEETSIEVE_TEST_RUNS")
    root = Path(kept) if kept else _root if _root is not None else Path(tempfile.mkdtemp(prefix="fleetsieve-runs-"))
    root.mkdir(parents=True, exist_ok=True)
    runs = root / "runs"
    with open(root / "runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (runs / "done").is_file():
            _make(runs)
    _runs = Runs(runs / "certified", runs / "killed")
    return _runs


def copy_run(src: Path, dst: Path) -> Path:
    """A writable copy of a run's directory at ``dst`` (its lock file left behind)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"), dirs_exist_ok=True)
    return dst


def journal(d: Path) -> list[dict[str, Any]]:
    """The journal's records as written (a last line cut by a kill left out)."""
    return read_journal(d / "journal.jsonl")[0]


def build_campaign_dir(out: Path, *, finished: bool = True, posterior: bool = True, **_: Any) -> dict[str, Any]:
    """A copy, at ``out``, of the session's certified run (``finished``) or of its killed one;
    ``posterior=False`` leaves out posterior.nc (a plan then reads its predictions from
    bounds.csv). Returns the journal's records and result.json (None when killed)."""
    runs = shipped_runs()
    copy_run(runs.certified if finished else runs.killed, out)
    if not posterior:
        (out / "posterior.nc").unlink(missing_ok=True)
    result = json.loads((out / "result.json").read_text()) if finished else None
    return {"records": journal(out), "result": result}
