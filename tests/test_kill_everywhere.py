"""Resume from any journal state, in a fresh process, to the uninterrupted run's decisions.

A tiny campaign is run by real ``fleetsieve-bayes run`` processes that are
SIGKILL-ed right after journal appends (``python -m
fleetsieve_bayes.testing.faults --kill-after-append N -- run ...``: the process
kills itself, no cleanup runs) and inside measurements
(``--kill-in-measurement S``: a timer kills it while the replay sleeps). One
chain kills after each kind of append; the exhaustive version kills after
every append and inside every measurement (also from outside). The whole
module is in the slow stage (a real campaign per process); the default suite
kills and resumes a campaign in ``test_servers_die.py``. The pool driver is killed along its journal the same way.
Every interrupted directory is resumed by a fresh process and compared with
the uninterrupted run: measured cells (in order), allocation, status, and the
number of round records (a resumed round is never recorded twice).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_campaign import cli, write_tiny

from fleetsieve_bayes.campaign.journal import RoundRecord, read_journal, read_records

pytestmark = pytest.mark.slow

KILL = "kill_after_append"
KILL_IN_MEASUREMENT = "kill_in_measurement"
_CACHE: list[str] = []  # this module's JAX compilation cache folder


def _summary(out: Path) -> dict:
    result = json.loads((out / "result.json").read_text())
    records, good = read_records(out / "journal.jsonl")
    assert good == (out / "journal.jsonl").stat().st_size  # no partial line left behind
    cells = [tuple(r.cell) for r in records if hasattr(r, "cell") and hasattr(r, "row")]
    assert len(cells) == len(set(cells)), "a cell was measured twice"
    return {
        "measured": result["measured"],
        "allocation": result["allocation"],
        "status": result["status"],
        "round_records": sum(isinstance(r, RoundRecord) for r in records),
        "timings.rounds": result["timings"]["rounds"],
        "gpu_seconds": result["gpu_seconds"],
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    """The campaign file, the uninterrupted run's summary and its journal records.

    Every process of this module shares one JAX compilation cache that keeps
    every program, so only the reference run compiles.
    """
    folder = tmp_path_factory.mktemp("tiny")
    _CACHE.append(str(tmp_path_factory.mktemp("jax-cache")))
    campaign = write_tiny(folder)
    out = folder / "reference"
    done = _cli("run", str(campaign), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    records, _ = read_journal(out / "journal.jsonl")
    return campaign, _summary(out), records


def _env() -> dict[str, str]:
    return {
        "JAX_COMPILATION_CACHE_DIR": _CACHE[-1],
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def _cli(*args: str, **faults: str) -> subprocess.CompletedProcess:
    """``fleetsieve-bayes ARGS`` in a fresh process; with ``kill_after_append`` /
    ``kill_in_measurement``, under :mod:`fleetsieve_bayes.testing.faults`."""
    if not faults:
        return cli(*args, env=_env())
    hooks = [x for k, v in faults.items() for x in (f"--{k.replace('_', '-')}", v)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **_env()}
    return subprocess.run(
        [sys.executable, "-m", "fleetsieve_bayes.testing.faults", *hooks, "--", *args],
        env=env, capture_output=True, text=True, timeout=1800,  # a hang guard, not a speed bound
    )


def test_reference_run_is_a_real_campaign(tiny: tuple[Path, dict, list[dict]]) -> None:
    _, ref, records = tiny
    n_records = len(records)
    # The design (4 cells), at least one acquisition, and a final answer.
    assert ref["status"] == "certified-feasible"
    assert len(ref["measured"]) >= 5 and ref["round_records"] >= 2
    assert ref["timings.rounds"] == ref["round_records"]
    assert n_records == 1 + len(ref["measured"]) + ref["round_records"]
    # The certificate rests on the campaign's own certifying preset (two chains), converged.
    joint = records[-1]["joint"]["diagnostics"]
    assert joint["chains"] == 2 and joint["converged"] is True


def _kill_points(ref_records: list[dict]) -> list[int]:
    """Journal lengths to kill at, one of each kind of append: the campaign header, the
    first design measurement, the first round, the first acquired cell, the final round."""
    kinds = [(r["type"], r.get("phase")) for r in ref_records]
    firsts = {kinds.index(k) + 1 for k in kinds if k[0] != "measurement" or k[1] != "design"}
    firsts.add(kinds.index(("measurement", "design")) + 1)
    return sorted(firsts | {len(ref_records)})


def test_killed_after_each_kind_of_journal_append_and_inside_measurements(
    tiny: tuple[Path, dict, list[dict]], tmp_path: Path
) -> None:
    """A chain of real processes on one directory, each SIGKILL-ed right after a journal
    append of each kind (the header, a design measurement, a round, an acquired cell, the
    final round), with one more killed inside the first design measurement and inside the
    first acquired cell's measurement; the last process finishes. Same decisions. (Every
    append and every measurement, each from a fresh directory: the slow exhaustive test.)"""
    campaign, ref, ref_records = tiny
    slow = write_tiny(campaign.parent, name="slow.toml", measurement_extra="delay_s = 2.0")
    out = tmp_path / "chain"
    points = _kill_points(ref_records)
    assert {ref_records[k - 1]["type"] for k in points} >= {"measurement", "round"}
    killed_inside, have = 0, 0
    for k in points:
        nxt = ref_records[have]
        if nxt["type"] == "measurement" and killed_inside < 2 and (
            (killed_inside == 0 and nxt["phase"] == "design") or nxt["phase"] == "acquire"
        ):
            # The replay sleeps 2 s; a timer kills the process 0.5 s into it.
            proc = _cli("run", str(slow), "--out", str(out), "--quiet", **{KILL_IN_MEASUREMENT: "0.5"})
            assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
            assert len(read_journal(out / "journal.jsonl")[0]) == have, "the killed measurement was journaled"
            killed_inside += 1
        proc = _cli("run", str(campaign), "--out", str(out), "--quiet", **{KILL: str(k - have)})
        assert proc.returncode == -signal.SIGKILL, f"killed at {k}: {proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr
        records, _ = read_journal(out / "journal.jsonl")
        assert len(records) == k, f"the process killed at {k} appended {len(records) - have} records"
        assert [r["type"] for r in records] == [r["type"] for r in ref_records[:k]]
        assert not (out / "result.json").exists()
        have = k
    assert killed_inside == 2
    # Killed after the final round's record, before result.json: the last process only writes it.
    done = _cli("run", str(campaign), "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    assert _summary(out) == ref


def test_exhaustive_every_kill_point_from_a_fresh_directory(tiny: tuple[Path, dict, list[dict]], tmp_path: Path) -> None:
    # The random strategy's run is tests/test_kill_everywhere_random.py: a file of its own, so
    # that the slow stage's two workers (a file each at a time) run the two side by side.
    exhaustive_kill_points(tiny, tmp_path, "fleetsieve", 0)


def exhaustive_kill_points(
    tiny: tuple[Path, dict, list[dict]], tmp_path: Path, strategy: str, seed: int, every: int = 1
) -> None:
    """Each kill point on its own: a fresh run killed after its k-th append, resumed once;
    plus an outside kill inside every measurement. ``every``: only every ``every``-th of
    both (the first and the last append always)."""
    campaign, _, _ = tiny
    opts = ["--strategy", strategy, "--seed", str(seed), "--quiet"]
    ref_out = tmp_path / "ref"
    done = _cli("run", str(campaign), "--out", str(ref_out), *opts)
    assert done.returncode == 0, done.stderr[-2000:]
    ref = _summary(ref_out)
    ref_records = read_journal(ref_out / "journal.jsonl")[0]
    n_records = len(ref_records)
    n_design = sum(r.get("phase") == "design" for r in ref_records)
    for k in sorted(set(range(1, n_records + 1, every)) | {n_records}):
        out = tmp_path / f"k{k}"
        killed = _cli("run", str(campaign), "--out", str(out), *opts, **{KILL: str(k)})
        assert killed.returncode == -signal.SIGKILL
        assert len(read_journal(out / "journal.jsonl")[0]) == k
        done = _cli("run", str(campaign), "--out", str(out), *opts)
        assert done.returncode == 0, done.stderr[-2000:]
        assert _summary(out) == ref, f"killed after append {k}"
    slow = write_tiny(campaign.parent, name="slow.toml", measurement_extra="delay_s = 1.0")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **_env()}
    for m in range(0, len(ref["measured"]), every):
        out = tmp_path / f"m{m}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetsieve_bayes", "run", str(slow), "--out", str(out), *opts],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            while True:  # until m cells are journaled and measurement m + 1 has begun
                recs = read_journal(out / "journal.jsonl")[0] if (out / "journal.jsonl").exists() else []
                done_m = sum(r["type"] == "measurement" for r in recs)
                if recs and done_m == m and (m < n_design or recs[-1]["type"] == "round"):
                    break
                assert proc.poll() is None
                time.sleep(0.02)
            time.sleep(0.4)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        done = _cli("run", str(campaign), "--out", str(out), *opts)
        assert done.returncode == 0, done.stderr[-2000:]
        assert _summary(out) == ref, f"killed in measurement {m + 1}"


@pytest.mark.parametrize("every", [2])
def test_pool_killed_along_its_journal(tiny: tuple[Path, dict, list[dict]], tmp_path: Path, every: int) -> None:
    """The pool driver (simulated clock) killed after every ``every``-th journal append,
    each kill in a fresh process on the same directory (cells in flight are started again
    on resume): the last process finishes with the uninterrupted pooled run's decisions,
    nothing measured twice."""
    campaign, _, _ = tiny
    pooled = write_tiny(campaign.parent, name="pooled.toml", measurement_extra="pool_gpus = 8")
    ref_out = tmp_path / "ref"
    done = _cli("run", str(pooled), "--out", str(ref_out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    ref = _summary(ref_out)
    n_records = len(read_journal(ref_out / "journal.jsonl")[0])
    out = tmp_path / "chain"
    kills = 0
    for k in range(1, n_records + 1, every):
        proc = _cli("run", str(pooled), "--out", str(out), "--quiet", **{KILL: str(every)})
        if proc.returncode == 0:  # fewer than `every` appends were left: it finished
            break
        assert proc.returncode == -signal.SIGKILL, f"process {k}: {proc.stderr[-2000:]}"
        assert not (out / "result.json").exists()
        kills += 1
    assert kills >= 2
    if proc.returncode != 0:
        done = _cli("run", str(pooled), "--out", str(out), "--quiet")
        assert done.returncode == 0, done.stderr[-2000:]
    # The decisions; the pool re-plans a completion whose picks' round records a kill cut
    # short, so the number of round records may differ.
    decisions = ("measured", "allocation", "status", "gpu_seconds")
    got = _summary(out)
    assert {k: got[k] for k in decisions} == {k: ref[k] for k in decisions}


def test_a_level_campaign_killed_after_its_windows_cross_a_bucket_resumes_to_the_same_result(tmp_path: Path) -> None:
    """A noisy suite fleet at level 0.9 fits every window; a cell's first repeat moves the fit
    to another compiled program (the repeated cells' rows), which goes on from the previous
    round's sampler state. Killed right after the first round that fits a repeat, a fresh
    process resumes to the uninterrupted run's result."""
    from fleetsieve_bayes.evaluation.noisy import noisy_suite_fleet
    from fleetsieve_bayes.evaluation.synthetic import write_synthetic

    _, table, camp = noisy_suite_fleet(0, 7)
    write_synthetic(tmp_path / "fleet", table, camp)
    campaign = tmp_path / "fleet" / "campaign.toml"
    _CACHE.append(str(tmp_path / "jax-cache"))
    ref_out = tmp_path / "reference"
    done = _cli("run", str(campaign), "--out", str(ref_out), "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    records, _ = read_journal(ref_out / "journal.jsonl")
    repeated = False
    kill_at = None
    for i, r in enumerate(records):
        repeated |= r["type"] == "measurement" and int(r.get("replicate", 0)) > 0
        if r["type"] == "round" and repeated:
            kill_at = i + 1
            break
    assert kill_at is not None and kill_at < len(records), "the reference never fitted a repeat"
    out = tmp_path / "killed"
    killed = _cli("run", str(campaign), "--out", str(out), "--quiet", kill_after_append=str(kill_at))
    assert killed.returncode != 0 and not (out / "result.json").exists()
    assert _cli("run", str(campaign), "--out", str(out), "--quiet").returncode == 0

    def summary(where: Path) -> dict:  # _summary's fields; a repeat is a second window of a cell here
        result = json.loads((where / "result.json").read_text())
        keys = ("measured", "allocation", "status", "gpu_seconds", "committed", "repeat")
        return {**{k: result.get(k) for k in keys}, "records": len(read_journal(where / "journal.jsonl")[0])}

    assert summary(out) == summary(ref_out)
    assert any(int(m.get("replicate", 0)) > 0 for m in summary(out)["measured"])
