"""Measurement tables (CSV or Parquet): the contract of docs/contracts.md.

One row per measurement window of a cell with the columns of :data:`COLUMNS`
(plus the optional :data:`OPTIONAL_COLUMNS`). A cell may have several rows
(repeated windows) when the table has a ``replicate`` column: its rows carry
the replicate indices 0, 1, …, k-1, each once, in any order. A table without
the column has one row per cell, each replicate 0. GPU-seconds of a cell are
``duration_s * tp``. Reading validates every row and names the first bad one;
tail latencies may be ``inf`` for a cell where no request completed (a failed
cell is an observation, not a missing value). ``completion_p99_s`` may be
empty (NaN after reading) when the row's source had no completion timing at
all (e.g. an ingested result without end-to-end latencies): unobserved, never
zero. Nothing else may be NaN. The optional ``startup_s`` is the server
start-up time a measured cell paid (0 when it reused a running server); it is
not part of ``duration_s`` except for a start-up failure. The optional ``gpu``
names the GPU type the row ran on (a pool's ``gpu`` in the campaign); empty or
absent means the campaign's single pool. The optional ``config`` names the
row's serving configuration in the campaign's ``[[configs]]`` catalogue; a row
that names one may leave ``tp`` empty (read as 0 until the catalogue resolves it,
:func:`fleetsieve_bayes.configs.resolve_configs`), and must for a disaggregated
one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fleetsieve_bayes.errors import InputError

__all__ = [
    "COLUMNS",
    "OPTIONAL_COLUMNS",
    "METRICS",
    "BOUNDS_COLUMNS",
    "read_table",
    "write_table",
    "validate_table",
    "replicates",
    "first_windows",
    "gpu_seconds",
    "startup_gpu_seconds",
    "profiling_usd",
]

COLUMNS: tuple[str, ...] = (
    "workload",
    "tp",
    "load",
    "offered_rps",
    "throughput_rps",
    "ttft_p99_s",
    "completion_p99_s",
    "success_rate",
    "duration_s",
)
# `failure` is empty for a normal cell, or a failure class from a backend
# (e.g. "startup-oom"); such cells count as measured and infeasible.
# `replicate`: the window's index among its cell's rows (0, 1, …; absent: 0).
# `gpu`: the GPU type the row ran on (absent: the campaign's one type).
# `config`: the row's entry of the campaign's [[configs]] catalogue (absent: its tp is its configuration).
OPTIONAL_COLUMNS: tuple[str, ...] = ("calibration", "seed", "failure", "startup_s", "replicate", "gpu", "config")
# bounds.csv in a campaign directory: the final round's credible interval of
# every cell (measured cells collapse to their measured values).
BOUNDS_COLUMNS: tuple[str, ...] = (
    "workload",
    "tp",
    "load",
    "measured",
    "throughput_lo",
    "throughput_hi",
    "ttft_p99_lo",
    "ttft_p99_hi",
    "completion_p99_lo",
    "completion_p99_hi",
    "success_lo",
    "success_hi",
)
# The four outcome metrics of a cell, in the order every (…, 4) array uses.
METRICS: tuple[str, ...] = ("throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate")

# A row may serve at most this multiple of its offered rate, plus this many requests
# over its duration (see max_throughput_rps).
THROUGHPUT_SLACK = 1.05
WINDOW_EDGE_REQUESTS = 2


def max_throughput_rps(offered_rps: float, duration_s: float) -> float:
    """The most a row offered ``offered_rps`` for ``duration_s`` can serve: 5 % slack for
    the arrival process's noise, plus two requests over the duration for the edges of a
    finite window (a request that arrived during warm-up may complete inside the window).
    Over a 300 s window the edge term is 0.007 req/s. Beyond this a row is a unit or
    bookkeeping error, whether measured, replayed or ingested."""
    edge = WINDOW_EDGE_REQUESTS / duration_s if duration_s > 0 else 0.0
    return offered_rps * THROUGHPUT_SLACK + edge
_FLOAT_COLUMNS = ("offered_rps", "throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate", "duration_s")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INF_OK = {"ttft_p99_s", "completion_p99_s"}
# Unobserved (empty / NaN) is allowed here only: a source without completion timing.
_NAN_OK = {"completion_p99_s"}
# "<na>": pandas' missing value of a nullable column (an Int64 tp read from Parquet), as read_csv reads it.
_EMPTY = {"", "nan", "none", "null", "<na>"}
_TRUE = {"true", "1", "yes", "t", "y"}
_FALSE = {"false", "0", "no", "f", "n", ""}


def read_table(path: str | Path) -> pd.DataFrame:
    """Read and validate a measurement table (``.csv`` or ``.parquet``).

    Returns:
        A DataFrame with the docs/contracts.md columns, typed (``tp`` int, metrics
        float, ``calibration`` bool if present), in file order.

    Raises:
        InputError: naming the file and the first bad row/column.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a measurement table")
    if not path.is_file():
        raise InputError(f"{path}: measurement table not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            df = pd.read_parquet(path)
            row_offset = 0  # Parquet rows are numbered from 0
        elif suffix in (".csv", ".txt"):
            df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
            row_offset = 2  # header is line 1; report file line numbers
        else:
            raise InputError(f"{path}: unknown table format {suffix!r} (expected .csv or .parquet)")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parser failure is bad input
        raise InputError(f"{path}: cannot parse table: {exc}") from None
    return validate_table(df, source=str(path), row_offset=row_offset)


def validate_table(df: pd.DataFrame, *, source: str = "<table>", row_offset: int = 0) -> pd.DataFrame:
    """Validate and type a raw table; rows are named as ``row_offset + index``."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{source}: missing column(s) {', '.join(missing)}")
    out = pd.DataFrame(index=range(len(df)))
    df = df.reset_index(drop=True)
    # CSV rows are reported as file lines (header is line 1); Parquet rows by index.
    label = "line" if row_offset == 2 else "row"

    def where(i: int, col: str) -> str:
        return f"{source}: {label} {i + row_offset}, column {col!r}"

    out["workload"] = _parse_labels(df["workload"], "workload", "empty workload name", where)
    configs = _parse_configs(df["config"]) if "config" in df.columns else None
    out["tp"] = _parse_tp(df["tp"], where, configs)
    out["load"] = _parse_labels(df["load"], "load", "empty load label", where)
    for col in _FLOAT_COLUMNS:
        out[col] = _parse_metric(df[col], col, where)
    _check_served_within_offered(out, where)
    _check_durations(out, df, where)
    if "calibration" in df.columns:
        out["calibration"] = _parse_calibration(df["calibration"], where)
    if "seed" in df.columns:
        out["seed"] = _parse_seeds(df["seed"], where)
    if "startup_s" in df.columns:
        out["startup_s"] = _parse_startup(df["startup_s"], where)
    if "replicate" in df.columns:
        out["replicate"] = _parse_replicates(df["replicate"], where)
    if "failure" in df.columns:
        out["failure"] = [
            "" if v is None or str(v).strip().lower() in ("", "nan", "none") else str(v).strip() for v in df["failure"]
        ]
    if "gpu" in df.columns:  # GPU type of the row; "" = the campaign's single pool
        out["gpu"] = ["" if v is None or str(v).strip().lower() in _EMPTY else str(v).strip() for v in df["gpu"]]
    if configs is not None:
        out["config"] = configs
    _check_unique_cells(out, source=source, label=label, row_offset=row_offset)
    return out


_Where = Callable[[int, str], str]


def _parse_labels(values: Iterable[Any], col: str, empty_message: str, where: _Where) -> list[str]:
    """Stripped non-empty string labels (workload names, load labels)."""
    labels = []
    for i, v in enumerate(values):
        s = "" if v is None else str(v).strip()
        if not s or s.lower() == "nan":
            raise InputError(f"{where(i, col)}: {empty_message}")
        labels.append(s)
    return labels


def _parse_configs(values: Iterable[Any]) -> list[str]:
    """The ``config`` column: stripped names, "" where empty."""
    return ["" if v is None or str(v).strip().lower() in _EMPTY else str(v).strip() for v in values]


def _parse_tp(values: Iterable[Any], where: _Where, configs: list[str] | None = None) -> np.ndarray:
    """Tensor-parallel degrees, ``(n_rows,)`` int64; "2.0" is accepted, 2.5 is not.

    A row that names a ``config`` may leave ``tp`` empty: 0 until its catalogue resolves it."""
    tps = []
    for i, v in enumerate(values):
        if configs is not None and configs[i] and (v is None or str(v).strip().lower() in _EMPTY):
            tps.append(0)
            continue
        try:
            f = float(str(v).strip())
        except ValueError:
            raise InputError(f"{where(i, 'tp')}: not a number: {v!r}") from None
        if not math.isfinite(f) or f != int(f) or f < 1:
            raise InputError(f"{where(i, 'tp')}: tensor-parallel degree must be a positive integer, got {v!r}")
        tps.append(int(f))
    return np.asarray(tps, dtype=np.int64)


def _parse_metric(values: Iterable[Any], col: str, where: _Where) -> np.ndarray:
    """One float column, ``(n_rows,)`` float64, under that column's NaN/inf/range rules."""
    vals = []
    for i, v in enumerate(values):
        if col in _NAN_OK and (v is None or (isinstance(v, str) and v.strip().lower() in _EMPTY)):
            vals.append(math.nan)
            continue
        try:
            f = float(str(v).strip()) if not isinstance(v, (int, float)) else float(v)
        except ValueError:
            raise InputError(f"{where(i, col)}: not a number: {v!r}") from None
        if math.isnan(f):
            if col in _NAN_OK:
                vals.append(math.nan)
                continue
            raise InputError(f"{where(i, col)}: value is NaN")
        if math.isinf(f) and not (col in _INF_OK and f > 0):
            raise InputError(f"{where(i, col)}: value is infinite")
        if col == "success_rate" and not 0 <= f <= 1:
            raise InputError(f"{where(i, col)}: success rate {f:g} outside [0, 1]")
        if f < 0:
            raise InputError(f"{where(i, col)}: negative value {f:g}")
        if _FLOAT32_MAX < f < math.inf:  # the model computes in float32
            raise InputError(f"{where(i, col)}: value {f:g} is too large to represent")
        vals.append(f)
    return np.asarray(vals, dtype=np.float64)


def _check_durations(out: pd.DataFrame, df: pd.DataFrame, where: _Where) -> None:
    """A failed cell skipped before running (the memory guard) costs 0 GPU-seconds;
    every other row must have run for a positive time."""
    skipped = (
        [str(v).strip().lower() not in ("", "nan", "none") for v in df["failure"]]
        if "failure" in df.columns
        else [False] * len(df)
    )
    for i, d in enumerate(out["duration_s"]):
        if d <= 0 and not (d == 0 and skipped[i]):
            raise InputError(f"{where(i, 'duration_s')}: duration must be positive, got {d:g}")


def _parse_calibration(values: Iterable[Any], where: _Where) -> list[bool]:
    flags = []
    for i, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)):
            flags.append(bool(v))
            continue
        s = str(v).strip().lower()
        if s in _TRUE:
            flags.append(True)
        elif s in _FALSE or s == "nan":
            flags.append(False)
        else:
            raise InputError(f"{where(i, 'calibration')}: expected true/false, got {v!r}")
    return flags


def _parse_seeds(values: Iterable[Any], where: _Where) -> Any:
    """Nullable Int64 seeds: an empty seed means "not recorded", not 0."""
    seeds = []
    for i, v in enumerate(values):
        s = str(v).strip()
        if s in ("", "nan", "None"):
            seeds.append(pd.NA)
            continue
        try:
            seeds.append(int(float(s)))
        except ValueError:
            raise InputError(f"{where(i, 'seed')}: expected an integer, got {v!r}") from None
    return pd.array(seeds, dtype="Int64")


def _parse_startup(values: Iterable[Any], where: _Where) -> np.ndarray:
    ups = []
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and v.strip().lower() in _EMPTY):
            ups.append(math.nan)  # not recorded (e.g. a replayed or ingested row)
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise InputError(f"{where(i, 'startup_s')}: not a number: {v!r}") from None
        if not math.isnan(f) and (not math.isfinite(f) or f < 0):
            raise InputError(f"{where(i, 'startup_s')}: start-up seconds must be finite and >= 0, got {v!r}")
        ups.append(f)
    return np.asarray(ups, dtype=np.float64)


def _parse_replicates(values: Iterable[Any], where: _Where) -> np.ndarray:
    """Replicate indices, ``(n_rows,)`` int64, each an integer >= 0 ("1.0" is accepted)."""
    reps = []
    for i, v in enumerate(values):
        s = "" if v is None else str(v).strip()
        try:
            f = float(s)
        except ValueError:
            f = math.nan
        if not math.isfinite(f) or f != int(f) or f < 0:
            raise InputError(f"{where(i, 'replicate')}: expected an integer >= 0 (0, 1, … per cell), got {v!r}")
        reps.append(int(f))
    return np.asarray(reps, dtype=np.int64)


def _check_unique_cells(out: pd.DataFrame, *, source: str, label: str, row_offset: int) -> None:
    """Each (workload, tp, load[, gpu], replicate) at most once, and a cell's replicates 0..k-1 without gaps.

    Without a ``replicate`` column every row is replicate 0: a second row of a
    cell is a duplicate. Errors name both rows (a duplicate) or the row past
    the gap (a missing replicate).
    """
    gpus = [str(g) for g in out["gpu"]] if "gpu" in out.columns else [""] * len(out)
    # A row's configuration is its config's name where it names one, else its tp.
    confs = out["config"].tolist() if "config" in out.columns else [""] * len(out)
    ident = [c.lower() if c else int(t) for c, t in zip(confs, out["tp"], strict=True)]
    keys = list(zip(out["workload"], ident, out["load"], gpus, strict=True))
    has_reps = "replicate" in out.columns
    reps = out["replicate"].to_numpy(np.int64) if has_reps else np.zeros(len(out), dtype=np.int64)

    def cell(key: tuple[str, Any, str, str]) -> str:
        on = f", gpu={key[3]}" if key[3] else ""
        what = f"config={key[1]}" if isinstance(key[1], str) else f"tp={key[1]}"
        return f"(workload={key[0]}, {what}, load={key[2]}{on})"

    first: dict[tuple[tuple[str, Any, str, str], int], int] = {}
    by_cell: dict[tuple[str, Any, str, str], dict[int, int]] = {}
    for i, (key, r) in enumerate(zip(keys, reps.tolist(), strict=True)):
        if (key, r) in first:
            what = f"duplicate replicate {r} of cell" if has_reps else "duplicate cell"
            raise InputError(
                f"{source}: {label} {i + row_offset}: {what} {cell(key)}, first at {label} "
                f"{first[(key, r)] + row_offset}"
            )
        first[(key, r)] = i
        by_cell.setdefault(key, {})[r] = i
    for key, rows in by_cell.items():
        have = sorted(rows)
        missing = next((k for k, r in enumerate(have) if r != k), None)
        if missing is not None:
            past = have[missing]
            raise InputError(
                f"{source}: {label} {rows[past] + row_offset}: replicate {past} of cell {cell(key)} but no "
                f"replicate {missing} (a cell's replicates are 0, 1, … without gaps; it has "
                f"{', '.join(map(str, have))})"
            )


def replicates(df: pd.DataFrame) -> np.ndarray:
    """``(n_rows,)`` int64 replicate index of each row of a validated table (0 without the column)."""
    if "replicate" in df.columns:
        return df["replicate"].to_numpy(np.int64)
    return np.zeros(len(df), dtype=np.int64)


def first_windows(df: pd.DataFrame) -> pd.DataFrame:
    """The replicate-0 row of every cell of a validated table, in file order (one row per cell)."""
    if "replicate" not in df.columns:
        return df
    return df[replicates(df) == 0]


def _check_served_within_offered(out: pd.DataFrame, where: _Where) -> None:
    """Served cannot exceed offered (:func:`max_throughput_rps`)."""
    rows = zip(out["throughput_rps"], out["offered_rps"], out["duration_s"], strict=True)
    for i, (thr, off, dur) in enumerate(rows):
        if thr > max_throughput_rps(off, dur):
            raise InputError(
                f"{where(i, 'throughput_rps')}: throughput {thr:g} req/s exceeds the offered "
                f"{off:g} req/s (more than {THROUGHPUT_SLACK:g}× + {WINDOW_EDGE_REQUESTS} "
                f"requests over {dur:g} s)"
            )


def write_table(df: pd.DataFrame, path: str | Path) -> None:
    """Write a table as CSV or Parquet by the file's suffix (docs/contracts.md columns first)."""
    path = Path(path)
    cols = [c for c in COLUMNS if c in df.columns] + [c for c in df.columns if c not in COLUMNS]
    df = df[cols]
    if path.suffix.lower() == ".parquet":
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)


def gpu_seconds(df: pd.DataFrame) -> float:
    """Profiling cost of the rows: Σ duration_s × tp."""
    return float((df["duration_s"] * df["tp"]).sum())


def profiling_usd(df: pd.DataFrame, usd_per_gpu_hour: Mapping[str, float], default_gpu: str = "") -> float:
    """Dollars the rows cost: Σ ``duration_s × tp`` × the hourly price of the row's GPU / 3600.

    ``usd_per_gpu_hour``: price by GPU type (case-insensitive); a row without
    a ``gpu`` is on ``default_gpu``.

    Raises:
        InputError: a row's GPU has no price.
    """
    prices = {k.lower(): float(v) for k, v in usd_per_gpu_hour.items()}
    gpus = df["gpu"] if "gpu" in df.columns else [""] * len(df)
    total = 0.0
    for g, d, tp in zip(gpus, df["duration_s"], df["tp"], strict=True):
        name = (str(g).strip() if g is not None and str(g) != "nan" else "") or default_gpu
        if name.lower() not in prices:
            raise InputError(f"no price for GPU {name!r} (priced: {', '.join(sorted(prices))})")
        total += float(d) * int(tp) * prices[name.lower()] / 3600.0
    return total


def startup_gpu_seconds(rows: Iterable[Mapping[str, Any]]) -> float:
    """Server start-up cost of measured rows: Σ ``startup_s × tp`` over cells whose server became ready.

    A failed start-up (``failure`` ``startup-*``) is left out: its wait is its
    ``duration_s``, already in :func:`gpu_seconds`. Rows without ``startup_s``
    (replayed, ingested) count 0.
    """
    total = 0.0
    for row in rows:
        up = row.get("startup_s")
        if up is None or str(row.get("failure") or "").startswith("startup-"):
            continue
        up = float(up)
        if math.isfinite(up):
            total += up * int(row["tp"])
    return total
