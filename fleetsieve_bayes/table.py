"""Measurement tables (CSV or Parquet): the contract of docs/contracts.md.

One row per measured cell with the columns of :data:`COLUMNS` (plus the
optional :data:`OPTIONAL_COLUMNS`). GPU-seconds of a cell are
``duration_s * tp``. Reading validates every row and names the first bad one;
tail latencies may be ``inf`` for a cell where no request completed (a failed
cell is an observation, not a missing value). ``completion_p99_s`` may be
empty (NaN after reading) when the row's source had no completion timing at
all (e.g. an ingested result without end-to-end latencies): unobserved, never
zero. Nothing else may be NaN. The optional ``startup_s`` is the server
start-up time a measured cell paid (0 when it reused a running server); it is
not part of ``duration_s`` except for a start-up failure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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
    "gpu_seconds",
    "startup_gpu_seconds",
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
OPTIONAL_COLUMNS: tuple[str, ...] = ("calibration", "seed", "failure", "startup_s")
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

_FLOAT_COLUMNS = ("offered_rps", "throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate", "duration_s")
_INF_OK = {"ttft_p99_s", "completion_p99_s"}
# Unobserved (empty / NaN) is allowed here only: a source without completion timing.
_NAN_OK = {"completion_p99_s"}
_EMPTY = {"", "nan", "none", "null"}
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

    def where(i: int, col: str) -> str:
        label = "line" if row_offset == 2 else "row"
        return f"{source}: {label} {i + row_offset}, column {col!r}"

    workloads = []
    for i, v in enumerate(df["workload"]):
        s = "" if v is None else str(v).strip()
        if not s or s.lower() == "nan":
            raise InputError(f"{where(i, 'workload')}: empty workload name")
        workloads.append(s)
    out["workload"] = workloads

    tps = []
    for i, v in enumerate(df["tp"]):
        try:
            f = float(str(v).strip())
        except ValueError:
            raise InputError(f"{where(i, 'tp')}: not a number: {v!r}") from None
        if not math.isfinite(f) or f != int(f) or f < 1:
            raise InputError(f"{where(i, 'tp')}: tensor-parallel degree must be a positive integer, got {v!r}")
        tps.append(int(f))
    out["tp"] = np.asarray(tps, dtype=np.int64)

    loads = []
    for i, v in enumerate(df["load"]):
        s = "" if v is None else str(v).strip()
        if not s or s.lower() == "nan":
            raise InputError(f"{where(i, 'load')}: empty load label")
        loads.append(s)
    out["load"] = loads

    for col in _FLOAT_COLUMNS:
        vals = []
        for i, v in enumerate(df[col]):
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
            if f < 0:
                raise InputError(f"{where(i, col)}: negative value {f:g}")
            if col == "success_rate" and f > 1:
                raise InputError(f"{where(i, col)}: success rate {f:g} outside [0, 1]")
            vals.append(f)
        out[col] = np.asarray(vals, dtype=np.float64)
    # A failed cell skipped before running (the memory guard) costs 0 GPU-seconds;
    # every other row must have run for a positive time.
    skipped = (
        [str(v).strip().lower() not in ("", "nan", "none") for v in df["failure"]]
        if "failure" in df.columns
        else [False] * len(df)
    )
    for i, d in enumerate(out["duration_s"]):
        if d <= 0 and not (d == 0 and skipped[i]):
            raise InputError(f"{where(i, 'duration_s')}: duration must be positive, got {d:g}")

    if "calibration" in df.columns:
        flags = []
        for i, v in enumerate(df["calibration"]):
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
        out["calibration"] = flags
    if "seed" in df.columns:
        seeds = []
        for i, v in enumerate(df["seed"]):
            s = str(v).strip()
            if s in ("", "nan", "None"):
                seeds.append(pd.NA)
                continue
            try:
                seeds.append(int(float(s)))
            except ValueError:
                raise InputError(f"{where(i, 'seed')}: expected an integer, got {v!r}") from None
        out["seed"] = pd.array(seeds, dtype="Int64")
    if "startup_s" in df.columns:
        ups = []
        for i, v in enumerate(df["startup_s"]):
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
        out["startup_s"] = np.asarray(ups, dtype=np.float64)
    if "failure" in df.columns:
        out["failure"] = ["" if v is None or str(v).strip().lower() in ("", "nan", "none") else str(v).strip() for v in df["failure"]]

    keys = list(zip(out["workload"], out["tp"], out["load"], strict=True))
    first: dict[tuple[str, int, str], int] = {}
    for i, key in enumerate(keys):
        if key in first:
            label = "line" if row_offset == 2 else "row"
            raise InputError(
                f"{source}: {label} {i + row_offset}: duplicate cell "
                f"(workload={key[0]}, tp={key[1]}, load={key[2]}), first at {label} {first[key] + row_offset}"
            )
        first[key] = i
    return out


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
