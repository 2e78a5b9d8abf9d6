"""One cell, measured: trace → send plan → load generator → table row.

:func:`measure_cell` is the one path from a trace to a measurement-table row,
used by the vLLM backend (on a server it launched) and by ``fleetsieve-bayes
measure`` (on a server someone else runs). It

1. asks the server what it serves (:func:`served_model_info`): the context
   length (vLLM reports ``max_model_len`` in ``GET /v1/models``) and the
   vocabulary size (``vocab_size`` of the model's ``config.json``, found
   through the ``root`` path ``/v1/models`` reports, or given explicitly);
2. builds the send plan and fits every request into the context
   (:func:`fit_to_context`: the prompt is shortened so prompt + output ≤
   context; a request whose output alone does not fit is an
   :class:`~fleetsieve_bayes.errors.InputError` naming the trace);
3. draws prompt token ids inside the vocabulary and replays the plan
   open-loop (:mod:`.loadgen`);
4. summarises the window and labels failures (:func:`.failures.classify_run`):
   a window where no request succeeded (or the server died) carries a
   ``failure`` label, with the server's first error message in ``detail``. A
   window where some requests failed is a success measurement: ``success_rate``
   = succeeded / sent, throughput and tails from the requests that succeeded,
   and ``detail`` counts the failed ones.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.backends.failures import classify_run, failure_row
from fleetsieve_bayes.backends.loadgen import (
    LoadSpec,
    run_cell_sync,
    summarize,
    token_range,
    write_records,
)
from fleetsieve_bayes.backends.traces import Schedule, Trace, schedule
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS

__all__ = ["ServedModel", "CellSpec", "CellResult", "served_model_info", "fit_to_context", "measure_cell"]


class ServedModel(NamedTuple):
    """What the server serves: ``None`` where it could not be learnt."""

    vocab_size: int | None
    max_model_len: int | None


class CellSpec(NamedTuple):
    """One cell's labels and measurement protocol."""

    workload: str
    tp: int
    load: str
    scale: float  # arrival-rate multiplier of the trace
    warmup_s: float
    duration_s: float  # measurement window after the warm-up
    request_timeout_s: float = 300.0
    seed: int = 0
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    # Trace seconds the window starts at (a repeated window: traces.window_offset_s).
    trace_offset_s: float = 0.0


class CellResult(NamedTuple):
    """``row``: the table row (with ``failure`` and, for a failure, ``detail``);
    ``records``: per-request records; ``stats``: :func:`.loadgen.summarize` output."""

    row: dict[str, Any]
    records: pd.DataFrame
    stats: dict[str, Any]


def _base_url(endpoint: str) -> str:
    base = endpoint.rstrip("/")
    for suffix in ("/v1/completions", "/v1"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


def _vocab_of(path: str | Path | None) -> int | None:
    """``vocab_size`` of a local model directory's ``config.json`` (text config first)."""
    if path is None:
        return None
    cfg = Path(path) / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for holder in (data.get("text_config"), data):
        if isinstance(holder, dict) and isinstance(holder.get("vocab_size"), int) and holder["vocab_size"] > 0:
            return int(holder["vocab_size"])
    return None


def served_model_info(endpoint: str, model: str, *, model_path: str | Path | None = None,
                      vocab_size: int | None = None, timeout_s: float = 10.0) -> ServedModel:
    """Ask the server (``GET /v1/models``) what it serves as ``model``.

    ``max_model_len`` comes from the model's entry (vLLM reports it). The
    vocabulary is ``vocab_size`` when given, else the ``config.json`` of
    ``model_path`` or of the entry's ``root`` when that is a local directory.
    """
    max_len: int | None = None
    root: str | None = None
    try:
        with urllib.request.urlopen(_base_url(endpoint) + "/v1/models", timeout=timeout_s) as resp:  # noqa: S310
            data = json.loads(resp.read().decode("utf-8", errors="replace"))
        entries = data.get("data") if isinstance(data, dict) else None
        if isinstance(entries, list):
            match = [e for e in entries if isinstance(e, dict) and e.get("id") == model]
            entry = match[0] if match else (entries[0] if len(entries) == 1 and isinstance(entries[0], dict) else {})
            if isinstance(entry.get("max_model_len"), int) and entry["max_model_len"] > 0:
                max_len = int(entry["max_model_len"])
            if isinstance(entry.get("root"), str):
                root = entry["root"]
    except (urllib.error.URLError, OSError, ValueError):
        pass  # a server without /v1/models: nothing learnt, the legacy token range is used
    vocab = vocab_size if vocab_size is not None else (_vocab_of(model_path) or _vocab_of(root))
    return ServedModel(vocab_size=vocab, max_model_len=max_len)


def fit_to_context(plan: Schedule, max_model_len: int | None, source: str) -> Schedule:
    """Shorten prompts so that prompt + output ≤ ``max_model_len`` for every request.

    Raises:
        InputError: a request's output alone (after ``max_output_tokens``) needs
            the whole context, naming the trace, the request and the limits.
    """
    if max_model_len is None or len(plan.arrival_s) == 0:
        return plan
    out = plan.output_tokens
    too_long = np.flatnonzero(out >= max_model_len)
    if too_long.size:
        i = int(too_long[0])
        raise InputError(
            f"{source}: request {int(plan.trace_index[i])} asks for {int(out[i])} output tokens but the served "
            f"model's context is {max_model_len} tokens (at least 1 prompt token is needed); "
            f"set max_output_tokens below {max_model_len}"
        )
    inp = np.minimum(plan.input_tokens, max_model_len - out)
    return plan._replace(input_tokens=inp.astype(np.int64))


def _salt(spec: CellSpec) -> int:
    """A stable per-cell salt for the prompts (cells sharing a server must not share prompts)."""
    return zlib.crc32(f"{spec.workload}|{spec.tp}|{spec.load}|{spec.scale!r}".encode()) or 1


def _first_error(records: pd.DataFrame) -> str:
    bad = records[~records["ok"].astype(bool)]
    if bad.empty:
        return ""
    r = bad.iloc[0]
    detail = str(r.get("detail", "") or "").strip().replace("\n", " ")
    return f"first error: {r['error']}" + (f" ({detail[:200]})" if detail else "")


def measure_cell(
    endpoint: str,
    model: str,
    trace: Trace,
    spec: CellSpec,
    *,
    served: ServedModel | None = None,
    alive: Callable[[], bool] | None = None,
    records_path: Path | None = None,
    record_extras: dict[str, Any] | None = None,
) -> CellResult:
    """Measure one cell against a running OpenAI-compatible server.

    Args:
        endpoint: the server's base URL.
        model: the request's ``model`` field (the served model name).
        served: what the server serves; asked with :func:`served_model_info` when None.
        alive: polled during the run; False means the server process died
            (the row is then a ``died-mid-run`` failure).
        records_path: where to write the per-request records (Parquet, never overwritten).
        record_extras: constant columns added to the written records.

    Returns:
        The row has every :data:`~fleetsieve_bayes.table.COLUMNS` column plus
        ``seed`` and ``failure``. ``duration_s`` is warm-up + window for a
        measured cell and the wall seconds of the run for a failed one.
    """
    served = served or served_model_info(endpoint, model)
    horizon = spec.warmup_s + spec.duration_s
    plan = schedule(trace, spec.scale, horizon, max_input_tokens=spec.max_input_tokens,
                    max_output_tokens=spec.max_output_tokens, offset_s=spec.trace_offset_s)
    plan = fit_to_context(plan, served.max_model_len, trace.source)
    try:
        ids = token_range(served.vocab_size)
    except ValueError as exc:
        raise InputError(f"{endpoint}: model {model!r}: {exc}") from None
    load = LoadSpec(endpoint=endpoint, model=model, warmup_s=spec.warmup_s, duration_s=spec.duration_s,
                    request_timeout_s=spec.request_timeout_s, seed=spec.seed, token_ids=ids, salt=_salt(spec))
    started = time.monotonic()
    records = run_cell_sync(load, plan, alive=alive)
    wall = time.monotonic() - started
    died = alive is not None and not alive()
    if records_path is not None:
        write_records(records.assign(**(record_extras or {})), records_path)
    n_window = int(np.count_nonzero((plan.arrival_s >= spec.warmup_s) & (plan.arrival_s < horizon)))
    stats = summarize(records, spec.warmup_s, spec.duration_s, n_scheduled=n_window)
    failure = classify_run(server_died=died, n_window=n_window, n_error=stats["n_error"], n_ok=stats["n_ok"])
    key = (spec.workload, int(spec.tp), spec.load)
    where = f" (records: {records_path})" if records_path is not None else ""
    first = _first_error(records)
    detail = (f"{stats['n_error']} request errors, {stats['n_timeout']} timeouts of {n_window} window "
              f"requests" + (f"; {first}" if first else "") + where)
    if failure:
        row = failure_row(key, stats["offered_rps"], failure, max(wall, 1e-3), spec.seed)
        row["detail"] = detail
        return CellResult(row, records, stats)
    row = {"workload": key[0], "tp": key[1], "load": key[2],
           **{k: float(stats[k]) for k in COLUMNS if k in stats},
           "duration_s": float(horizon), "seed": int(spec.seed), "failure": ""}
    row = {k: row[k] for k in (*COLUMNS, "seed", "failure")}
    if not math.isfinite(row["ttft_p99_s"]):
        row["ttft_p99_s"] = math.inf
    if stats["n_ok"] < n_window:
        row["detail"] = detail  # a success measurement with failed requests: say how many and why
    return CellResult(row, records, stats)
