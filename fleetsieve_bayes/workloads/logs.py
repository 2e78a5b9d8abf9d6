"""Production request logs: arrival times, token counts and the service of each request.

Formats (``fmt``; ``"auto"`` decides from the file's suffix and header):

==============  ===============================================================
``azure``       the Azure LLM inference trace, 2023 and 2024 releases: CSV
                ``TIMESTAMP,ContextTokens,GeneratedTokens`` (2024 timestamps
                carry a UTC offset). The file is the service.
``burstgpt``    BurstGPT CSV: ``Timestamp`` (s), ``Model``, ``Request tokens``,
                ``Response tokens``; the ``Model`` column is the service. Rows
                with ``Response tokens = 0`` failed in the original log (no
                output length to replay) and are dropped, and counted.
``mooncake``    JSON Lines ``{"timestamp": ms, "input_length", "output_length"}``
                (the Mooncake / AIPerf trace layout). The file is the service.
``columns``     any CSV with named columns: ``columns = {"ts": …, "prompt": …,
                "output": …}`` plus an optional ``"service"`` (a model or
                tenant column). ``ts`` is seconds (numbers) or date-times.
==============  ===============================================================

Requests must be in arrival order (equal times are allowed): a log out of order
is refused with the first line that goes back in time, since a reordered log
usually means two logs were concatenated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.backends.traces import (
    AZURE_COLUMNS,
    parse_timestamps,
    read_csv_frame,
    read_mooncake_columns,
    token_counts,
)
from fleetsieve_bayes.errors import InputError

__all__ = ["RequestLog", "FORMATS", "read_log", "read_logs", "COLUMN_KEYS"]

FORMATS = ("auto", "azure", "burstgpt", "mooncake", "columns")
COLUMN_KEYS = ("ts", "prompt", "output", "service")


class RequestLog(NamedTuple):
    """Requests of one or more log files. Arrays have shape ``(n,)``, in arrival order per service.

    Attributes:
        arrival_s: float64 seconds since the first request of the request's file.
        input_tokens: int64 prompt lengths.
        output_tokens: int64 output lengths.
        service: int64 index into ``services``.
        services: service names.
        sources: the file each service came from.
        origins: per service, its file's first time (epoch seconds for date-times, else 0).
        dropped: requests dropped while reading (failed rows of a BurstGPT log).
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    service: np.ndarray
    services: tuple[str, ...]
    sources: tuple[str, ...]
    origins: tuple[float, ...]
    dropped: int

    @property
    def n(self) -> int:
        return len(self.arrival_s)


def _detect(path: Path, columns: Mapping[str, str] | None) -> str:
    if columns:
        return "columns"
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "mooncake"
    if not path.is_file():
        raise InputError(f"{path}: trace file not found")
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read trace: {exc}") from None
    if first.lstrip().startswith("{"):
        return "mooncake"
    header = {c.strip() for c in first.strip().split(",")}
    if set(AZURE_COLUMNS) <= header:
        return "azure"
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    if not first.strip():
        raise InputError(f"{path}: empty trace")
    raise InputError(
        f"{path}: unknown trace format (header {first.strip()[:120]!r}); expected Azure "
        f"({','.join(AZURE_COLUMNS)}), BurstGPT, Mooncake JSON Lines, or give --columns ts=…,prompt=…,output=…"
    )


def _in_order(path: Path, ts: np.ndarray, first_line: int) -> None:
    back = np.flatnonzero(np.diff(ts) < 0)
    if back.size:
        i = int(back[0]) + 1
        raise InputError(f"{path}: line {i + first_line}: timestamp goes back in time "
                         f"({ts[i]:.6f} s after {ts[i - 1]:.6f} s); requests must be in arrival order")


def _empty(path: Path, n: int) -> None:
    if n == 0:
        raise InputError(f"{path}: empty trace (no requests)")


def read_log(path: str | Path, fmt: str = "auto", *, columns: Mapping[str, str] | None = None,
             service: str | None = None) -> RequestLog:
    """Read one log file (module docstring). ``service`` names the file's service (default: its stem).

    Raises:
        InputError: one line naming the file and what is wrong.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"{path}: unknown trace format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if fmt == "auto":
        fmt = _detect(path, columns)
    name = service or path.stem
    if fmt == "mooncake":
        if not path.is_file():
            raise InputError(f"{path}: trace file not found")
        if path.stat().st_size == 0:
            raise InputError(f"{path}: empty trace (no requests)")
        ts_ms, inp, out = read_mooncake_columns(path)
        _in_order(path, ts_ms, 1)
        return _log((ts_ms - ts_ms.min()) / 1000.0, inp, out, None, name, path, 0, 0.0)
    if path.is_file() and path.stat().st_size == 0:
        raise InputError(f"{path}: empty trace (no header, no requests)")
    df = _Frame(path)
    if fmt == "azure":
        missing = [c for c in AZURE_COLUMNS if c not in df.columns]
        if missing:
            raise InputError(f"{path}: not an Azure trace: no column(s) {', '.join(missing)} "
                             f"(header: {','.join(df.columns)})")
        ts, origin = df.times("TIMESTAMP")
        inp, out = df.tokens("ContextTokens"), df.tokens("GeneratedTokens")
        _in_order(path, ts, 2)
        return _log(ts, inp, out, None, name, path, 0, origin)
    if fmt == "burstgpt":
        for c in ("Timestamp", "Request tokens", "Response tokens"):
            if c not in df.columns:
                raise InputError(f"{path}: not a BurstGPT trace: no column {c!r} (header: {','.join(df.columns)})")
        ts, origin = df.times("Timestamp")
        inp, out = df.tokens("Request tokens"), df.tokens("Response tokens")
        _in_order(path, ts, 2)
        keep = out > 0
        labels = df.labels("Model") if "Model" in df.columns else None
        if not keep.any():
            raise InputError(f"{path}: no successful request (every 'Response tokens' is 0)")
        return _log(ts[keep], inp[keep], out[keep], None if labels is None else labels[keep], name, path,
                    int((~keep).sum()), origin)
    # columns
    cols = dict(columns or {})
    unknown = sorted(set(cols) - set(COLUMN_KEYS))
    if unknown:
        raise InputError(f"{path}: unknown --columns key(s) {', '.join(unknown)} (allowed: {', '.join(COLUMN_KEYS)})")
    for key in ("ts", "prompt", "output"):
        if key not in cols:
            raise InputError(f"{path}: --columns needs {key}=COLUMN (have: {', '.join(cols) or 'none'})")
        if cols[key] not in df.columns:
            what = "token counts" if key != "ts" else "timestamps"
            raise InputError(f"{path}: no column {cols[key]!r} for {key} ({what}); header: {','.join(df.columns)}")
    ts, origin = df.times(cols["ts"])
    inp, out = df.tokens(cols["prompt"]), df.tokens(cols["output"])
    _in_order(path, ts, 2)
    labels = None
    if "service" in cols:
        if cols["service"] not in df.columns:
            raise InputError(f"{path}: no column {cols['service']!r} for service; header: {','.join(df.columns)}")
        labels = df.labels(cols["service"])
    return _log(ts, inp, out, labels, name, path, 0, origin)


class _Frame:
    """A CSV log's columns: numbers parsed natively (Arrow) when every cell of a column is a
    clean number; otherwise, for that column only, the strict reader of
    :mod:`fleetsieve_bayes.backends.traces`, whose message names the first bad line."""

    def __init__(self, path: Path) -> None:
        import pandas as pd

        self.path = path
        self._strict: Any = None
        try:
            fast = pd.read_csv(path, engine="pyarrow")
            fast.columns = [str(c).strip() for c in fast.columns]
            self.fast = fast if len(fast) >= 2 else None
        except Exception:  # noqa: BLE001 - any failure: the strict reader reports it
            self.fast = None
        if self.fast is None:
            self.strict()  # raises the one-line message (empty, unparsable, < 2 requests)
        self.columns = list(self.fast.columns if self.fast is not None else self.strict().columns)

    def strict(self) -> Any:
        if self._strict is None:
            try:
                self._strict = read_csv_frame(self.path)
            except InputError as exc:
                if "at least 2 requests" in str(exc):
                    raise InputError(f"{self.path}: empty trace (fewer than 2 requests)") from None
                raise
        return self._strict

    def _numeric(self, col: str) -> np.ndarray | None:
        if self.fast is None or col not in self.fast.columns:
            return None
        kind = self.fast[col].dtype.kind
        if kind not in "iuf":
            return None
        v = self.fast[col].to_numpy(np.float64)
        return v if np.isfinite(v).all() and (v >= 0).all() else None

    def tokens(self, col: str) -> np.ndarray:
        v = self._numeric(col)
        if v is not None and (v == np.round(v)).all():
            return v.astype(np.int64)
        return token_counts(self.path, self.strict(), col)

    def times(self, col: str) -> tuple[np.ndarray, float]:
        v = self._numeric(col)
        if v is not None:
            return v - v.min(), float(v.min())
        return parse_timestamps(self.path, self.strict(), col)

    def labels(self, col: str) -> np.ndarray:
        src = self.fast if self.fast is not None and col in self.fast.columns else self.strict()
        return src[col].astype(str).str.strip().to_numpy()


def _log(ts: np.ndarray, inp: np.ndarray, out: np.ndarray, labels: np.ndarray | None, name: str,
         path: Path, dropped: int, origin: float) -> RequestLog:
    _empty(path, len(ts))
    if labels is None:
        services: tuple[str, ...] = (name,)
        svc = np.zeros(len(ts), dtype=np.int64)
    else:
        uniq, svc = np.unique(labels.astype(str), return_inverse=True)
        services = tuple(str(u) or "unlabelled" for u in uniq)
        svc = svc.astype(np.int64)
    return RequestLog(ts.astype(np.float64), inp.astype(np.int64), out.astype(np.int64), svc, services,
                      tuple(str(path) for _ in services), tuple(origin for _ in services), dropped)


def read_logs(paths: Sequence[str | Path], fmt: str = "auto", *,
              columns: Mapping[str, str] | None = None) -> RequestLog:
    """Read several files; each file is a service (its stem less the stems' common prefix), or,
    when a file has a service column, each of its values is."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("classes: no trace file given")
    names = _service_names(paths)
    logs = [read_log(p, fmt, columns=columns, service=nm) for p, nm in zip(paths, names, strict=True)]
    if len(logs) == 1:
        return logs[0]
    services: list[str] = []
    sources: list[str] = []
    parts = []
    for log in logs:
        offset = len(services)
        for s, src in zip(log.services, log.sources, strict=True):
            full = s if len(logs) == 1 or s in names else f"{Path(src).stem}/{s}"
            if full in services:
                raise InputError(f"{src}: service {full!r} also comes from {sources[services.index(full)]}")
            services.append(full)
            sources.append(src)
        parts.append(log.service + offset)
    return RequestLog(
        np.concatenate([lg.arrival_s for lg in logs]),
        np.concatenate([lg.input_tokens for lg in logs]),
        np.concatenate([lg.output_tokens for lg in logs]),
        np.concatenate(parts), tuple(services), tuple(sources), tuple(o for lg in logs for o in lg.origins),
        sum(lg.dropped for lg in logs),
    )


def _service_names(paths: Sequence[Path]) -> list[str]:
    """File stems less their common prefix (``azure_code``, ``azure_conv`` → ``code``, ``conv``)."""
    stems = [p.stem for p in paths]
    if len(stems) == 1:
        return stems
    if len(set(stems)) != len(stems):
        raise InputError(f"{paths[0]}: two trace files have the same name {stems[0]!r}; rename one "
                         "(the file name is the service)")
    import os

    pre = os.path.commonprefix(stems)
    cut = max(pre.rfind("_"), pre.rfind("-"), pre.rfind("."))
    short = [s[cut + 1:] for s in stems] if cut >= 0 else stems
    return short if all(short) and len(set(short)) == len(short) else stems
