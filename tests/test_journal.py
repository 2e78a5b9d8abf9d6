"""The journal survives a kill mid-write; the lock excludes a second run."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from fleetsieve_bayes.campaign.journal import campaign_lock, open_journal, read_journal
from fleetsieve_bayes.errors import InputError


def test_append_and_reopen(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append({"type": "header", "x": 1})
    j.append({"type": "measurement", "seq": 0})
    j.close()
    j2 = open_journal(tmp_path)
    assert [r["type"] for r in j2.records] == ["header", "measurement"]
    j2.close()


def test_partial_last_line_is_truncated(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append({"type": "header"})
    j.append({"type": "measurement", "seq": 0})
    j.close()
    path = tmp_path / "journal.jsonl"
    good = path.read_bytes()
    # A kill during a write leaves an unfinished line.
    path.write_bytes(good + b'{"type": "measurement", "se')
    records, nbytes = read_journal(path)
    assert len(records) == 2 and nbytes == len(good)
    j = open_journal(tmp_path)
    assert path.read_bytes() == good
    j.append({"type": "measurement", "seq": 1})
    j.close()
    assert [json.loads(x)["seq"] for x in path.read_text().splitlines()[1:]] == [0, 1]


def test_corrupt_middle_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"type": "header"}\nGARBAGE\n{"type": "round"}\n')
    with pytest.raises(InputError, match=r"journal.jsonl: line 2: corrupt journal record"):
        read_journal(path)


def _hold_lock(directory: str, ready: mp.Event, release: mp.Event) -> None:  # type: ignore[valid-type]
    with campaign_lock(Path(directory)):
        ready.set()
        release.wait(10)


def test_lock_excludes_a_second_run(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    proc.start()
    try:
        assert ready.wait(30)
        with pytest.raises(InputError, match="another fleetsieve-bayes run holds"), campaign_lock(tmp_path):
            pass
    finally:
        release.set()
        proc.join(10)
    with campaign_lock(tmp_path):  # released once the holder is gone
        pass


def test_lock_released_by_kill(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    proc.start()
    assert ready.wait(30)
    proc.kill()
    proc.join(10)
    with campaign_lock(tmp_path):
        pass
