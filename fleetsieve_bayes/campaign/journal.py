"""The campaign directory's append-only journal, its lock, and atomic writes.

Measurements are expensive (300 s × up to 8 GPUs each), so every record is one
JSON line written with a single ``write`` call, flushed and ``fsync``-ed before
the campaign takes its next step. A kill at any instant leaves at worst a
partial *last* line, which :func:`read_journal` detects and :func:`open_journal`
truncates; every complete record survives. Derived files (``result.json``,
``bounds.csv``, ``posterior.nc``…) are written to a temporary name and renamed,
so readers never see half a file.

Record types (one JSON object per line, ``"type"`` first):

- ``header``: campaign name, strategy, seed and the candidate cells; written once.
- ``measurement``: ``seq``, ``round``, ``phase`` (``design`` | ``acquire``),
  ``cell`` ``{workload, tp, load}``, ``row`` (the table row), ``gpu_seconds``,
  ``started_at``/``finished_at`` (Unix seconds), ``wall_s``.
- ``round``: the decision state of one round (certificate, gap, both
  allocations and objectives, chosen cell, timings) — what the status and
  report commands read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleetsieve_bayes.errors import InputError

__all__ = [
    "JOURNAL_NAME",
    "Journal",
    "open_journal",
    "read_journal",
    "campaign_lock",
    "atomic_write_text",
    "atomic_write_bytes",
]

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = ".lock"


class Journal:
    """An open, append-only journal file. Use :func:`open_journal`."""

    def __init__(self, path: Path, records: list[dict[str, Any]]) -> None:
        self.path = path
        self.records = records
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        """Append one record durably: one write, then fsync, before returning."""
        line = (json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # a short write on a regular file means the disk is full
            raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
        os.fsync(self._fd)
        self.records.append(record)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("type") == kind]


def read_journal(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Parse a journal.

    Returns:
        ``(records, good_bytes)``: the complete records and the byte length of
        the prefix they occupy (a trailing partial line, left by a kill during
        a write, is not counted).

    Raises:
        InputError: a complete line in the middle of the file is not valid
            JSON (the file was edited or corrupted), naming the line.
    """
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    records: list[dict[str, Any]] = []
    good = 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        is_last = i == len(lines) - 1
        if is_last:
            break  # text after the final newline is an unfinished write (or empty)
        if not raw.strip():
            good += len(raw) + 1
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "type" not in rec:
                raise ValueError("not a journal record")
        except ValueError as exc:
            raise InputError(f"{path}: line {i + 1}: corrupt journal record ({exc})") from None
        records.append(rec)
        good += len(raw) + 1
    return records, good


def open_journal(directory: Path) -> Journal:
    """Open (or create) ``directory/journal.jsonl`` for appending, truncating a partial last line."""
    path = directory / JOURNAL_NAME
    records, good = read_journal(path)
    if path.exists() and path.stat().st_size != good:
        with open(path, "r+b") as fh:
            fh.truncate(good)
            fh.flush()
            os.fsync(fh.fileno())
    return Journal(path, records)


@contextlib.contextmanager
def campaign_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on a campaign directory for the duration.

    ``flock`` locks are released by the kernel when the process dies, so a
    SIGKILL-ed run never leaves a stale lock behind.

    Raises:
        InputError: another process holds the lock.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"{directory}: another fleetsieve-bayes run holds this campaign directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``rename`` (atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
