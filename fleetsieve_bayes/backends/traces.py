"""Request traces: arrival times and token counts to replay against a server.

Two public formats are read:

- the Azure LLM inference trace (2023): CSV ``TIMESTAMP,ContextTokens,
  GeneratedTokens`` with timestamps like ``2023-11-16 18:15:46.6805900``
  (seven fractional digits, which plain ``strptime %f`` rejects);
- BurstGPT: CSV ``Timestamp`` (seconds), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``. Rows with
  ``Response tokens = 0`` are requests that failed in the original log; they
  have no output length to replay and are dropped.

The Azure 2024 release (a week of the same services) has the same three
columns with a UTC offset in the timestamp (``2024-05-10 00:00:00.009930+00:00``);
it is read by the same reader. :func:`read_mooncake_trace` reads Mooncake-style
JSON Lines (``timestamp`` in milliseconds, ``input_length``, ``output_length``).

A :class:`Trace` holds arrival offsets (seconds from the first request) and
token counts. :func:`schedule` turns it into the open-loop send times of one
cell: request *i* is sent at ``t_i / scale`` after the cell starts (``scale``
multiplies the arrival rate). A trace shorter than the cell is tiled: it
repeats with period ``span + mean gap``, which keeps its arrival rate.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.errors import InputError

__all__ = [
    "Trace",
    "Schedule",
    "AZURE_COLUMNS",
    "BURSTGPT_COLUMNS",
    "read_trace",
    "read_azure_trace",
    "read_burstgpt_trace",
    "read_mooncake_trace",
    "read_mooncake_columns",
    "read_csv_frame",
    "parse_timestamps",
    "token_counts",
    "write_azure_trace",
    "schedule",
    "window_rate",
]

AZURE_COLUMNS: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS: tuple[str, ...] = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)


class Trace(NamedTuple):
    """A request trace. Arrays have shape ``(n,)``, sorted by arrival.

    Attributes:
        arrival_s: float64, seconds since the first request (``arrival_s[0] == 0``).
        input_tokens: int64 prompt lengths, ≥ 1.
        output_tokens: int64 output lengths, ≥ 1.
        source: where it came from (file name), for messages.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    @property
    def n(self) -> int:
        return len(self.arrival_s)

    @property
    def period_s(self) -> float:
        """Tiling period: span plus one mean gap, so tiling keeps the arrival rate."""
        span = float(self.arrival_s[-1])
        return span + span / (self.n - 1)

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate of the trace at scale 1 (requests per second)."""
        return self.n / self.period_s


class Schedule(NamedTuple):
    """Open-loop send plan of one cell. Arrays have shape ``(m,)``.

    Attributes:
        arrival_s: float64 send offsets from the cell start, sorted, ``< horizon``.
        input_tokens: int64 prompt lengths.
        output_tokens: int64 ``max_tokens`` of each request.
        trace_index: int64 row of the trace each request replays.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    trace_index: np.ndarray


def read_trace(path: str | Path, fmt: str = "auto") -> Trace:
    """Read a trace file; ``fmt`` is ``"azure"``, ``"burstgpt"`` or ``"auto"`` (by header)."""
    path = Path(path)
    if fmt == "azure":
        return read_azure_trace(path)
    if fmt == "burstgpt":
        return read_burstgpt_trace(path)
    if fmt != "auto":
        raise InputError(f"{path}: unknown trace format {fmt!r} (expected 'azure', 'burstgpt' or 'auto')")
    header = _header(path)
    if set(AZURE_COLUMNS) <= set(header):
        return read_azure_trace(path)
    if {"Timestamp", "Request tokens", "Response tokens"} <= set(header):
        return read_burstgpt_trace(path)
    raise InputError(
        f"{path}: unrecognised trace header {','.join(header)!r} (expected the Azure columns "
        f"{','.join(AZURE_COLUMNS)} or the BurstGPT columns {','.join(BURSTGPT_COLUMNS)})"
    )


def read_azure_trace(path: str | Path) -> Trace:
    """Read an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Raises:
        InputError: naming the file and the first bad line.
    """
    path = Path(path)
    df = _read_csv(path)
    _require(path, df, AZURE_COLUMNS)
    seconds, _ = parse_timestamps(path, df, "TIMESTAMP")
    inp = _tokens(path, df, "ContextTokens")
    out = _tokens(path, df, "GeneratedTokens")
    return _make(path, seconds, inp, out)


def read_burstgpt_trace(path: str | Path, *, model: str | None = None) -> Trace:
    """Read a BurstGPT CSV; failed requests (``Response tokens = 0``) are dropped.

    Args:
        model: keep only rows of this ``Model`` (e.g. ``"ChatGPT"``); all if None.

    Raises:
        InputError: naming the file and the first bad line.
    """
    path = Path(path)
    df = _read_csv(path)
    _require(path, df, ("Timestamp", "Request tokens", "Response tokens"))
    ts = pd.to_numeric(df["Timestamp"].str.strip(), errors="coerce").to_numpy(np.float64)
    bad = np.flatnonzero(~np.isfinite(ts))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{path}: line {i + 2}, column 'Timestamp': not a number: {df['Timestamp'].iloc[i]!r}")
    inp = _tokens(path, df, "Request tokens")
    out = _tokens(path, df, "Response tokens")
    keep = out > 0
    if model is not None:
        if "Model" not in df.columns:
            raise InputError(f"{path}: no 'Model' column to select model {model!r}")
        keep &= (df["Model"].str.strip() == model).to_numpy()
    if not keep.any():
        raise InputError(f"{path}: no successful requests to replay" + (f" for model {model!r}" if model else ""))
    ts = ts[keep]
    return _make(path, ts - ts.min(), inp[keep], out[keep])


def read_mooncake_trace(path: str | Path) -> Trace:
    """Read Mooncake-style JSON Lines: one ``{"timestamp": ms, "input_length", "output_length"}`` a line.

    Raises:
        InputError: naming the file and the first bad line.
    """
    path = Path(path)
    ts, inp, out = read_mooncake_columns(path)
    return _make(path, (ts - ts.min()) / 1000.0, inp, out)


def read_mooncake_columns(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(timestamp ms, input_length, output_length)``, each ``(n,)``, in file order."""
    import json

    if not path.is_file():
        raise InputError(f"{path}: trace file not found")
    ts: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read trace: {exc}") from None
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {k}: not valid JSON: {exc.msg}") from None
        if not isinstance(rec, dict):
            raise InputError(f"{path}: line {k}: expected a JSON object, got {type(rec).__name__}")
        for key, dest in (("timestamp", ts), ("input_length", inp), ("output_length", out)):
            v = rec.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (key != "timestamp" and v != int(v)):
                raise InputError(f"{path}: line {k}, field {key!r}: expected a non-negative "
                                 f"{'number' if key == 'timestamp' else 'integer'}, got {v!r}")
            dest.append(v)  # type: ignore[arg-type]
    if len(ts) < 2:
        raise InputError(f"{path}: a trace needs at least 2 requests, found {len(ts)}")
    return (np.asarray(ts, dtype=np.float64), np.asarray(inp, dtype=np.int64),
            np.asarray(out, dtype=np.int64))


def parse_timestamps(path: Path, df: pd.DataFrame, col: str) -> tuple[np.ndarray, float]:
    """Column ``col`` as ``(seconds since its earliest value (n,) float64, that earliest value)``.

    Date-times (any fractional digits, an optional UTC offset) are differenced in
    integer nanoseconds, so 100 ns stamps keep their order; the origin is then in
    seconds since the epoch. Plain numbers are seconds."""
    raw = df[col].str.strip()
    numeric = pd.to_numeric(raw, errors="coerce")
    if not numeric.isna().any():
        vals = numeric.to_numpy(np.float64)
        bad = np.flatnonzero(~np.isfinite(vals))
        if bad.size:
            raise InputError(f"{path}: line {int(bad[0]) + 2}, column {col!r}: not a number: {raw.iloc[int(bad[0])]!r}")
        return vals - vals.min(), float(vals.min())
    # ISO8601 parsing takes any number of fractional digits (the 2023 trace has 7) and a
    # UTC offset (the 2024 trace); naive times are read as UTC, which keeps their offsets.
    stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True)
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{path}: line {i + 2}, column {col!r}: not a timestamp: {df[col].iloc[i]!r}")
    ns = stamps.dt.tz_convert(None).to_numpy("datetime64[ns]").astype(np.int64)
    return (ns - ns.min()) / 1e9, float(ns.min()) / 1e9


def token_counts(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    """Column ``col`` as non-negative integer token counts ``(n,)`` (one line naming the cell otherwise)."""
    if col not in df.columns:
        raise InputError(f"{path}: no token count column {col!r} (header: {','.join(df.columns)})")
    return _tokens(path, df, col)


def read_csv_frame(path: Path) -> pd.DataFrame:
    """The CSV as strings, header stripped (one line naming the file when it cannot be read)."""
    return _read_csv(path)


def write_azure_trace(path: str | Path, arrival_s: np.ndarray, input_tokens: np.ndarray,
                      output_tokens: np.ndarray, *, start: str = "2023-11-16 18:00:00") -> None:
    """Write a trace in the Azure format (seven fractional digits).

    Args:
        arrival_s: ``(n,)`` seconds from ``start``.
        input_tokens, output_tokens: ``(n,)`` integer token counts.
    """
    base = np.datetime64(pd.Timestamp(start).to_datetime64(), "ns")
    # Round to 100 ns, the resolution of seven fractional digits.
    ticks = np.round(np.asarray(arrival_s, dtype=np.float64) * 1e7).astype(np.int64)
    inp = np.asarray(input_tokens).astype(np.int64)
    out = np.asarray(output_tokens).astype(np.int64)
    if not len(ticks) == len(inp) == len(out):
        raise ValueError("arrival_s, input_tokens and output_tokens must have one length")
    stamps = base + ticks * np.timedelta64(100, "ns")
    # 'YYYY-MM-DDTHH:MM:SS.fffffffff' → 'YYYY-MM-DD HH:MM:SS.fffffff' (the stamp's own
    # fraction, so a ``start`` with a fraction of its own is kept).
    text = np.char.replace(np.datetime_as_string(stamps, unit="ns"), "T", " ")
    text = np.char.add(np.char.ljust(text, 29).astype("<U27"), ",")
    rows = np.char.add(np.char.add(np.char.add(text, inp.astype(str)), ","), out.astype(str))
    body = "\n".join(rows.tolist())
    Path(path).write_text(",".join(AZURE_COLUMNS) + "\n" + (body + "\n" if body else ""), encoding="utf-8")


def schedule(
    trace: Trace,
    scale: float,
    horizon_s: float,
    *,
    max_input_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> Schedule:
    """Send plan of one cell: request *i* at ``t_i / scale``, for offsets ``< horizon_s``.

    The trace is tiled (period :attr:`Trace.period_s`) when it is shorter than
    ``horizon_s × scale``. Token counts are clipped to the optional maxima
    (e.g. the server's context length).
    """
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"arrival scale must be a positive number, got {scale!r}")
    period = trace.period_s
    reps = max(1, math.ceil(horizon_s * scale / period))
    t = (trace.arrival_s[None, :] + period * np.arange(reps)[:, None]).ravel() / scale
    idx = np.tile(np.arange(trace.n, dtype=np.int64), reps)
    keep = t < horizon_s
    inp = trace.input_tokens[idx[keep]]
    out = trace.output_tokens[idx[keep]]
    if max_input_tokens is not None:
        inp = np.minimum(inp, max_input_tokens)
    if max_output_tokens is not None:
        out = np.minimum(out, max_output_tokens)
    return Schedule(arrival_s=t[keep], input_tokens=inp, output_tokens=out, trace_index=idx[keep])


def window_rate(trace: Trace, scale: float, warmup_s: float, duration_s: float) -> float:
    """Offered rate of a cell: arrivals in ``[warmup, warmup + duration)`` / duration (req/s).

    This is exactly what a measurement of the cell reports as ``offered_rps``,
    because the send plan is deterministic.
    """
    plan = schedule(trace, scale, warmup_s + duration_s)
    n = int(np.count_nonzero(plan.arrival_s >= warmup_s))
    return n / duration_s


def _header(path: Path) -> list[str]:
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
    except FileNotFoundError:
        raise InputError(f"{path}: trace file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read trace: {exc}") from None
    return [c.strip() for c in first.strip().split(",")]


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(f"{path}: trace file not found")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as exc:  # noqa: BLE001 - any parser failure is bad input
        raise InputError(f"{path}: cannot parse trace CSV: {str(exc).splitlines()[0]}") from None
    df.columns = [str(c).strip() for c in df.columns]
    if len(df) < 2:
        raise InputError(f"{path}: a trace needs at least 2 requests, found {len(df)}")
    return df


def _require(path: Path, df: pd.DataFrame, cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing trace column(s) {', '.join(missing)} (header: {','.join(df.columns)})")


def _tokens(path: Path, df: pd.DataFrame, col: str) -> np.ndarray:
    vals = pd.to_numeric(df[col].str.strip(), errors="coerce").to_numpy(np.float64)
    bad = np.flatnonzero(~np.isfinite(vals) | (vals < 0) | (vals != np.round(vals)))
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{path}: line {i + 2}, column {col!r}: expected a non-negative integer token count, got {df[col].iloc[i]!r}"
        )
    return vals.astype(np.int64)


def _make(path: Path, seconds: np.ndarray, inp: np.ndarray, out: np.ndarray) -> Trace:
    order = np.argsort(seconds, kind="stable")
    seconds = seconds[order]
    if len(seconds) < 2 or seconds[-1] <= 0:
        raise InputError(f"{path}: a trace needs at least 2 requests at distinct times")
    # A zero-length prompt or output cannot be replayed (max_tokens ≥ 1).
    return Trace(
        arrival_s=seconds - seconds[0],
        input_tokens=np.maximum(inp[order], 1),
        output_tokens=np.maximum(out[order], 1),
        source=str(path),
    )
