"""The campaign directory's append-only journal, its typed records and its lock.

Measurements are expensive (300 s × up to 8 GPUs each), so every record is one
JSON line written with a single ``write`` call, flushed and ``fsync``-ed before
the campaign takes its next step. A kill at any instant leaves at worst a
partial *last* line, which :func:`read_journal` detects and :func:`open_journal`
truncates; every complete record survives. Derived files (``result.json``,
``bounds.csv``, ``posterior.nc``…) are written to a temporary name and renamed,
so readers never see half a file (:mod:`fleetsieve_bayes.atomic`).

Record types (one JSON object per line, ``"type"`` first), each a NamedTuple
with ``to_json``/``from_json``:

- :class:`Header`: campaign name, strategy, seed, candidate cells, what
  status/report need (budget, ε, workloads), the ``fingerprint`` of every
  decision input and, for ``run --reuse-measurements``, ``reused_from``.
  Written once, first.
- :class:`MeasurementRecord`: ``seq``, ``round``, ``phase`` (``seed`` |
  ``design`` | ``acquire``), ``cell``, ``row`` (the table row),
  ``gpu_seconds``, ``started_at``/``finished_at`` (Unix seconds), ``wall_s``,
  ``source`` (where a seeded row came from; ``null`` when measured here) and
  ``replicate`` (the window's index among the cell's windows: 0 for its first,
  1, … for deliberate repeats; absent in older journals, read as 0).
- :class:`RoundRecord`: the decision state of one round (certificate, gap, both
  allocations and objectives, chosen cell or final allocation, timings;
  ``repeat`` when the chosen cell is to be measured again, written only then).

A complete line that parses but is not a valid record (a field missing or of
the wrong type) is an :class:`~fleetsieve_bayes.errors.InputError` naming the
file, the line and the field. Records of unknown types are kept as plain dicts
and ignored, so a newer writer's additions do not break an older reader.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from fleetsieve_bayes.errors import InputError

__all__ = [
    "plan_seconds",
    "JOURNAL_NAME",
    "LOCK_NAME",
    "Cell",
    "Header",
    "MeasurementRecord",
    "RoundRecord",
    "Side",
    "Record",
    "Journal",
    "open_journal",
    "read_journal",
    "read_records",
    "parse_record",
    "rounds_of",
    "unique_rounds",
    "BUDGET_KEYS",
    "held_budget",
    "campaign_lock",
]

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = ".lock"
HEADER_VERSION = 2
# ``on_append(n)``: called after the n-th durable append of this open journal.
OnAppend = Callable[[int], None]


class _Fields:
    """Reads typed fields of one raw record; errors name the file, line and field."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where

    def fail(self, name: str, message: str) -> InputError:
        return InputError(f"{self.where}: field {name!r} {message}")

    def get(self, name: str, default: Any = ..., obj: dict[str, Any] | None = None) -> Any:
        src = self.raw if obj is None else obj
        if name.split(".")[-1] not in src:
            if default is ...:
                raise self.fail(name, "is missing")
            return default
        return src[name.split(".")[-1]]

    def str_(self, name: str, default: Any = ..., obj: dict[str, Any] | None = None) -> Any:
        v = self.get(name, default, obj)
        if v is default and default is not ...:
            return v
        if not isinstance(v, str):
            raise self.fail(name, f"must be a string, got {v!r}")
        return v

    def int_(self, name: str, default: Any = ..., obj: dict[str, Any] | None = None) -> Any:
        v = self.get(name, default, obj)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(name, f"must be an integer, got {v!r}")
        return v

    def float_(self, name: str, default: Any = ..., obj: dict[str, Any] | None = None) -> Any:
        v = self.get(name, default, obj)
        if v is default and default is not ...:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(name, f"must be a number, got {v!r}")
        return float(v)

    def dict_(self, name: str, default: Any = ..., obj: dict[str, Any] | None = None) -> Any:
        v = self.get(name, default, obj)
        if v is default and default is not ...:
            return v
        if not isinstance(v, dict):
            raise self.fail(name, f"must be an object, got {type(v).__name__}")
        return v

    def list_(self, name: str, default: Any = ..., obj: dict[str, Any] | None = None) -> Any:
        v = self.get(name, default, obj)
        if v is default and default is not ...:
            return v
        if not isinstance(v, list):
            raise self.fail(name, f"must be a list, got {type(v).__name__}")
        return v

    def cell(self, name: str, v: Any) -> Cell:
        if not isinstance(v, dict):
            raise self.fail(name, f"must be an object {{workload, tp, load}}, got {v!r}")
        conf = self.str_(f"{name}.config", obj=v) if "config" in v else self.int_(f"{name}.tp", obj=v)
        return Cell(
            self.str_(f"{name}.workload", obj=v),
            conf,
            str(self.get(f"{name}.load", obj=v)),
            str(v.get("gpu") or ""),
        )

    def allocation(self, name: str, v: Any) -> dict[str, dict[str, Any]] | None:
        """An allocation in result.json form ``{workload: {tp, load, replicas}}`` or null."""
        if v is None:
            return None
        if not isinstance(v, dict):
            raise self.fail(name, f"must be an object or null, got {type(v).__name__}")
        out: dict[str, dict[str, Any]] = {}
        for w, e in v.items():
            if not isinstance(e, dict):
                raise self.fail(f"{name}.{w}", f"must be an object {{tp, load, replicas}}, got {e!r}")
            reps = self.int_(f"{name}.{w}.replicas", obj=e)
            tp = e.get("tp")
            if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int)):
                raise self.fail(f"{name}.{w}.tp", f"must be an integer or null, got {tp!r}")
            out[str(w)] = {"tp": tp, "load": None if e.get("load") is None else str(e["load"]), "replicas": reps}
            if "config" in e:  # a catalogued campaign names each class's configuration
                out[str(w)]["config"] = None if e["config"] is None else str(e["config"])
                out[str(w)]["gpus_per_replica"] = e.get("gpus_per_replica")
            if e.get("gpu") is not None:  # a campaign of several pools names each class's GPU type
                out[str(w)]["gpu"] = str(e["gpu"])
        return out


class Cell(tuple):
    """One candidate cell ``(workload, tp, load)``, or ``(workload, tp, load, gpu)``
    in a campaign of several GPU pools.

    A plain tuple of 3 or 4 items (``gpu`` empty: 3), so ``tuple(cell)`` is the
    grid's key of the cell (:meth:`fleetsieve_bayes.allocation.problem.CellGrid.key`).
    In a campaign with a ``[[configs]]`` catalogue the second item is the
    configuration's name (a ``str``) in place of the TP.
    """

    __slots__ = ()

    def __new__(cls, workload: str, tp: int | str, load: str, gpu: str = "") -> Cell:
        items = (workload, tp, load) if not gpu else (workload, tp, load, gpu)
        return super().__new__(cls, items)

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    @property
    def workload(self) -> str:
        return self[0]

    @property
    def tp(self) -> int:
        """The TP of a cell without a catalogue (its configuration); see :attr:`config`."""
        return self[1]

    @property
    def config(self) -> int | str:
        """The cell's configuration: its TP, or its catalogue entry's name."""
        return self[1]

    @property
    def catalogued(self) -> bool:
        return isinstance(self[1], str)

    @property
    def load(self) -> str:
        return self[2]

    @property
    def gpu(self) -> str:
        """The GPU type (pool) of the cell; "" in a campaign of one pool."""
        return self[3] if len(self) > 3 else ""

    def to_json(self) -> dict[str, Any]:
        conf = {"config": self[1]} if self.catalogued else {"tp": self[1]}
        out = {"workload": self.workload, **conf, "load": self.load}
        return {**out, "gpu": self.gpu} if self.gpu else out

    @property
    def label(self) -> str:
        name = self[1] if self.catalogued else f"TP{self[1]}"
        return f"{self.workload} {name}@{self.load}" + (f" on {self.gpu}" if self.gpu else "")


class Header(NamedTuple):
    """The first record: what the campaign is and every input its decisions depend on."""

    campaign: str
    strategy: str
    seed: int
    cells: tuple[Cell, ...]
    created_at: float = 0.0
    campaign_file: str | None = None
    gpus: int | None = None
    epsilon: float | None = None
    credible_level: float | None = None
    # [{name, demand_rps, critical, floor, slo: {success_min, ttft_p99_s, completion_p99_s}}]
    workloads: tuple[dict[str, Any], ...] = ()
    # Input name → digest (campaign, prior_card, inference, table, seed_tables, seed, strategy).
    fingerprint: dict[str, str] | None = None
    # The parsed campaign file, so a mismatch can name the field that changed.
    inputs: dict[str, Any] | None = None
    # run --reuse-measurements: {directory, fingerprint, measurements}.
    reused_from: dict[str, Any] | None = None
    version: int = HEADER_VERSION

    def to_json(self) -> dict[str, Any]:
        d = {"type": "header", **self._asdict()}
        d["cells"] = [c.to_json() for c in self.cells]
        d["workloads"] = list(self.workloads)
        return d

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str = "header") -> Header:
        f = _Fields(raw, where)
        cells = tuple(f.cell(f"cells[{i}]", c) for i, c in enumerate(f.list_("cells")))
        workloads = f.list_("workloads", [])
        for i, w in enumerate(workloads):
            if not isinstance(w, dict):
                raise f.fail(f"workloads[{i}]", f"must be an object, got {w!r}")
        fp = f.dict_("fingerprint", None)
        return cls(
            campaign=f.str_("campaign"),
            strategy=f.str_("strategy"),
            seed=f.int_("seed"),
            cells=cells,
            created_at=f.float_("created_at", 0.0),
            campaign_file=f.str_("campaign_file", None),
            gpus=f.int_("gpus", None),
            epsilon=f.float_("epsilon", None),
            credible_level=f.float_("credible_level", None),
            workloads=tuple(workloads),
            fingerprint=None if fp is None else {str(k): str(v) for k, v in fp.items()},
            inputs=f.dict_("inputs", None),
            reused_from=f.dict_("reused_from", None),
            version=f.int_("version", 1),
        )


class MeasurementRecord(NamedTuple):
    """One measured (or seeded) cell."""

    seq: int
    round: int
    phase: str  # seed | design | acquire
    cell: Cell
    row: dict[str, Any]
    gpu_seconds: float
    started_at: float = 0.0
    finished_at: float = 0.0
    wall_s: float = 0.0
    source: str | None = None  # seeded rows: "seed table FILE" / "reused from DIR"
    # The window's index among the cell's windows: 0 first, 1, … for deliberate repeats.
    replicate: int = 0

    @property
    def seeded(self) -> bool:
        return self.source is not None

    @property
    def repeat(self) -> bool:
        """A deliberate repeat: a window of a cell after its first."""
        return self.replicate > 0

    def to_json(self) -> dict[str, Any]:
        return {"type": "measurement", **self._asdict(), "cell": self.cell.to_json()}

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str = "measurement") -> MeasurementRecord:
        f = _Fields(raw, where)
        row = f.dict_("row")
        from fleetsieve_bayes.table import METRICS

        for m in METRICS:
            v = f.get(f"row.{m}", obj=row)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise f.fail(f"row.{m}", f"must be a number, got {v!r}")
        return cls(
            seq=f.int_("seq", 0),
            round=f.int_("round", 0),
            phase=f.str_("phase", "design"),
            cell=f.cell("cell", f.get("cell")),
            row=row,
            gpu_seconds=f.float_("gpu_seconds"),
            started_at=f.float_("started_at", 0.0),
            finished_at=f.float_("finished_at", 0.0),
            wall_s=f.float_("wall_s", 0.0),
            source=f.str_("source", None),
            replicate=_replicate(f),
        )


def _flag(f: _Fields, name: str) -> bool:
    v = f.get(name, False)
    if not isinstance(v, bool):
        raise f.fail(name, f"must be true or false, got {v!r}")
    return v


def _alternatives(f: _Fields) -> dict[str, Any]:
    """A round record's ``alternatives``: ``{posterior, draws, ranked: [entry, ...]}``, each
    entry's rank, allocation and chances checked (the cell lists kept as written)."""
    d = f.dict_("alternatives")
    ranked = f.list_("alternatives.ranked", obj=d)
    f.int_("alternatives.draws", obj=d)
    for i, e in enumerate(ranked):
        name = f"alternatives.ranked[{i}]"
        if not isinstance(e, dict):
            raise f.fail(name, f"must be an object, got {e!r}")
        f.int_(f"{name}.rank", obj=e)
        f.allocation(f"{name}.allocation", f.get(f"{name}.allocation", obj=e))
        for k in ("p_epsilon_optimal", "p_slo_met", "gpus"):
            f.float_(f"{name}.{k}", obj=e)
        for k in ("measured_cells", "predicted_cells"):
            for j, c in enumerate(f.list_(f"{name}.{k}", obj=e)):
                f.cell(f"{name}.{k}[{j}]", c)
    return d


def _replicate(f: _Fields) -> int:
    r = f.int_("replicate", 0)
    if r < 0:
        raise f.fail("replicate", f"must be an integer >= 0, got {r!r}")
    return r


class Side(NamedTuple):
    """One side (conservative or optimistic) of a round: its allocation and objective."""

    allocation: dict[str, dict[str, Any]] | None
    objective: dict[str, Any]

    @property
    def feasible(self) -> bool:
        return bool(self.objective.get("feasible", self.allocation is not None))

    def to_json(self) -> dict[str, Any]:
        return {"allocation": self.allocation, "objective": self.objective}


class RoundRecord(NamedTuple):
    """The decision state of one round."""

    round: int
    certificate: str
    outcome: str  # "measure", or the campaign's final status
    reason: str
    gap: dict[str, float]
    conservative: Side
    optimistic: Side
    measured_cells: int
    candidates: int
    gpu_seconds: float
    chosen: Cell | None
    timings: dict[str, float]
    # The final allocation when the campaign stops at this round (outcome != "measure").
    final: Side | None = None
    # The certification attempt's joint check (p_epsilon_optimal, p_slo_met,
    # p_infeasible, draws, diagnostics, attempt_s); None when none was made.
    joint: dict[str, Any] | None = None
    # The chosen cell is measured again (a deliberate repeat: its next window).
    repeat: bool = False
    # A stop by the profiling budget (campaign/budget.py): the budget, what was spent, the
    # cell the round would have measured and what the next cells would buy; else None.
    stop: dict[str, Any] | None = None
    # A stopping round's ranked alternative fleets ({posterior, draws, ranked}: round.py's
    # with_alternatives; result.json's alternatives); else None.
    alternatives: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"type": "round", **self._asdict()}
        for key in ("stop", "alternatives"):  # written only when set: older journals read the same
            if d[key] is None:
                del d[key]
        d["conservative"] = self.conservative.to_json()
        d["optimistic"] = self.optimistic.to_json()
        d["chosen"] = None if self.chosen is None else self.chosen.to_json()
        d["final"] = None if self.final is None else self.final.to_json()
        if self.joint is None:
            del d["joint"]
        if not self.repeat:
            del d["repeat"]  # written only for a repeat: older journals read the same
        return d

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str = "round") -> RoundRecord:
        f = _Fields(raw, where)

        def side(name: str) -> Side:
            d = f.dict_(name)
            obj = f.dict_(f"{name}.objective", {}, obj=d)
            return Side(f.allocation(f"{name}.allocation", d.get("allocation")), obj)

        gap = f.dict_("gap")
        for k, v in gap.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise f.fail(f"gap.{k}", f"must be a number, got {v!r}")
        timings = f.dict_("timings", {})
        for k, v in timings.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise f.fail(f"timings.{k}", f"must be a number, got {v!r}")
        chosen = f.get("chosen", None)
        return cls(
            round=f.int_("round"),
            certificate=f.str_("certificate"),
            outcome=f.str_("outcome", "measure" if chosen is not None else "undecided"),
            reason=f.str_("reason", ""),
            gap={str(k): float(v) for k, v in gap.items()},
            conservative=side("conservative"),
            optimistic=side("optimistic"),
            measured_cells=f.int_("measured_cells", 0),
            candidates=f.int_("candidates", 0),
            gpu_seconds=f.float_("gpu_seconds"),
            chosen=None if chosen is None else f.cell("chosen", chosen),
            timings={str(k): float(v) for k, v in timings.items()},
            final=None if raw.get("final") is None else side("final"),
            joint=None if raw.get("joint") is None else f.dict_("joint"),
            repeat=_flag(f, "repeat"),
            stop=None if raw.get("stop") is None else f.dict_("stop"),
            alternatives=None if raw.get("alternatives") is None else _alternatives(f),
        )


Record = Header | MeasurementRecord | RoundRecord | dict
_TYPES: dict[str, Any] = {"header": Header, "measurement": MeasurementRecord, "round": RoundRecord}


def parse_record(raw: dict[str, Any], where: str = "journal record") -> Record:
    """The typed record of one raw journal object (unknown types stay plain dicts).

    Raises:
        InputError: a field is missing or of the wrong type (named with ``where``).
    """
    cls = _TYPES.get(str(raw.get("type")))
    return raw if cls is None else cls.from_json(raw, where)


def rounds_of(records: Iterable[Any]) -> list[RoundRecord]:
    """The round records among ``records`` (typed records or raw journal dicts)."""
    out = []
    for r in records:
        if isinstance(r, dict) and r.get("type") == "round":
            r = RoundRecord.from_json(r)
        if isinstance(r, RoundRecord):
            out.append(r)
    return out


def unique_rounds(rounds: Iterable[RoundRecord]) -> list[RoundRecord]:
    """One record per round number (the last written wins), in round order.

    Journals of earlier versions repeat a round after a re-run or a kill
    mid-measurement; a round counts once.
    """
    by_no: dict[int, RoundRecord] = {}
    for r in rounds:
        by_no[r.round] = r
    return [by_no[k] for k in sorted(by_no)]


def plan_seconds(path: str | Path) -> list[float]:
    """Each round's planning wall time (s) in the journal at ``path``: its fit, bounds and
    allocations, acquisition and certification attempt (its round records' ``timings``
    summed, one per round, in round order)."""
    records, _ = read_journal(path)
    return [float(sum(r.timings.values())) for r in unique_rounds(rounds_of(records))]


BUDGET_KEYS = ("max_gpu_seconds", "max_wall_s")


def held_budget(records: Iterable[Any]) -> dict[str, float | None]:
    """The profiling budget a campaign directory last ran under: its header's ``[stopping]
    max_gpu_seconds`` and ``max_wall_s`` (None: no limit), raised by each later ``budget``
    record a resume with a higher budget appended (:mod:`fleetsieve_bayes.campaign.budget`)."""
    out: dict[str, float | None] = dict.fromkeys(BUDGET_KEYS)
    for r in records:
        if isinstance(r, Header):
            stopping = (r.inputs or {}).get("stopping") or {}
            out = {k: stopping.get(k) for k in BUDGET_KEYS}
        elif isinstance(r, dict) and r.get("type") == "budget":
            out = {k: r.get(k) for k in BUDGET_KEYS}
    return out


class Journal:
    """An open, append-only journal file of typed records. Use :func:`open_journal`."""

    def __init__(self, path: Path, records: list[Record], on_append: OnAppend | None = None) -> None:
        self.path = path
        self.records = records
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._appended = 0
        self._on_append = on_append

    def append(self, record: Header | MeasurementRecord | RoundRecord) -> None:
        """Append one record durably: one write, then fsync, before returning."""
        line = (json.dumps(record.to_json(), separators=(",", ":"), allow_nan=True) + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # a short write on a regular file means the disk is full
            raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
        os.fsync(self._fd)
        self.records.append(record)
        self._appended += 1
        if self._on_append is not None:
            self._on_append(self._appended)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    @property
    def header(self) -> Header | None:
        return next((r for r in self.records if isinstance(r, Header)), None)

    @property
    def measurements(self) -> list[MeasurementRecord]:
        return [r for r in self.records if isinstance(r, MeasurementRecord)]

    @property
    def rounds(self) -> list[RoundRecord]:
        return [r for r in self.records if isinstance(r, RoundRecord)]


def _read_lines(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    data = path.read_bytes() if path.exists() else b""
    records: list[tuple[int, dict[str, Any]]] = []
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
        records.append((i + 1, rec))
        good += len(raw) + 1
    return records, good


def read_journal(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Parse a journal into raw JSON objects.

    Returns:
        ``(records, good_bytes)``: the complete records and the byte length of
        the prefix they occupy (a trailing partial line, left by a kill during
        a write, is not counted).

    Raises:
        InputError: a complete line in the middle of the file is not valid
            JSON (the file was edited or corrupted), naming the line.
    """
    try:
        lines, good = _read_lines(Path(path))
    except (IsADirectoryError, PermissionError) as exc:
        raise InputError(f"{path}: cannot read journal ({exc.strerror})") from None
    return [r for _, r in lines], good


def read_records(path: str | Path) -> tuple[list[Record], int]:
    """Parse a journal into typed records (see :func:`parse_record`).

    Raises:
        InputError: corrupt JSON, or a record lacking a field, naming line and field.
    """
    path = Path(path)
    try:
        lines, good = _read_lines(path)
    except (IsADirectoryError, PermissionError) as exc:
        raise InputError(f"{path}: cannot read journal ({exc.strerror})") from None
    return [parse_record(r, f"{path}: line {n}: {r.get('type')} record") for n, r in lines], good


def open_journal(directory: Path, on_append: OnAppend | None = None) -> Journal:
    """Open (or create) ``directory/journal.jsonl`` for appending, truncating a partial last line.

    ``on_append(n)`` is called after each durable append (the n-th of this call), e.g. by
    :mod:`fleetsieve_bayes.testing.faults` to kill the process at a record boundary."""
    path = directory / JOURNAL_NAME
    records, good = read_records(path)
    if path.exists() and path.stat().st_size != good:
        with open(path, "r+b") as fh:
            fh.truncate(good)
            fh.flush()
            os.fsync(fh.fileno())
    return Journal(path, records, on_append)


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
