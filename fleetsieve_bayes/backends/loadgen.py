"""Open-loop load generator for an OpenAI-compatible completions server.

One cell = one :class:`~fleetsieve_bayes.backends.traces.Schedule` replayed on
asyncio with one aiohttp session. Request *i* is sent at its scheduled offset
whatever the state of earlier requests (open loop: a slow server never slows
the arrivals down). Each request is a streaming ``/v1/completions`` call whose
prompt is a list of token ids of exactly the trace's input length, with
``max_tokens`` = the trace's output length and ``ignore_eos``, so the server
does the trace's work without a tokenizer.

Per request we record (seconds from the cell start): the scheduled arrival,
the actual send time, the first token chunk, the last token chunk, the number
of token chunks, and an error class. Definitions used by :func:`summarize`
(the row of the cell):

- *window requests*: those scheduled in ``[warmup, warmup + duration)``;
  requests arriving during warm-up are excluded from every metric;
- ``offered_rps`` = window requests / duration;
- ``success_rate`` = window requests that succeeded / window requests sent.
  A request succeeds on HTTP 200, at least one token chunk and a clean end of
  stream (``[DONE]``) before its per-request timeout. HTTP errors, broken
  streams and timeouts all lower it; a window with some of them is still a
  measurement (only a window where none succeeded is a failed cell,
  :func:`~fleetsieve_bayes.backends.failures.classify_run`);
- ``ttft_p99_s`` / ``completion_p99_s``: 99th percentile (linear
  interpolation) over the *successful* window requests of first-token /
  last-token time minus send time. Failed requests are not goodput: they count
  against ``success_rate`` and their latency is excluded (``inf`` when no
  window request succeeded);
- ``throughput_rps`` = successful completions (any request, warm-up included)
  whose last token falls inside the window / duration. In steady state this
  equals the offered rate when the server keeps up, and the server's capacity
  when it does not (a queue that only drains after the window is not
  throughput).

After the last arrival every in-flight request runs to its end or to its own
timeout, so the wall time of a cell is at most warm-up + duration + the
request timeout.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import numpy as np
import pandas as pd

from fleetsieve_bayes.backends.traces import Schedule

__all__ = [
    "RECORD_COLUMNS",
    "LoadSpec",
    "run_cell",
    "run_cell_sync",
    "summarize",
    "prompt_tokens",
    "write_records",
    "completions_url",
]

RECORD_COLUMNS: tuple[str, ...] = (
    "request",
    "trace_index",
    "arrival_s",
    "sent_s",
    "first_token_s",
    "last_token_s",
    "n_chunks",
    "input_tokens",
    "output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "ok",
    "error",
    "http_status",
    "detail",
)

# Without a known vocabulary, token ids are drawn from this range: below every
# common vocabulary size (32k for Llama-2-style tokenizers) and above the
# special tokens. With a known vocabulary see :func:`token_range`.
TOKEN_ID_LOW = 1000
TOKEN_ID_HIGH = 30000
# How often the scheduler checks `alive()` while waiting for the next arrival.
_POLL_S = 0.2


class LoadSpec(NamedTuple):
    """Where and how to send one cell's requests."""

    endpoint: str  # base URL, e.g. http://127.0.0.1:8000
    model: str  # the `model` field of each request (the served model name)
    warmup_s: float
    duration_s: float  # measurement window after the warm-up
    request_timeout_s: float
    seed: int = 0
    # [low, high) of the prompt token ids (see :func:`token_range`).
    token_ids: tuple[int, int] = (TOKEN_ID_LOW, TOKEN_ID_HIGH)
    # Distinguishes the prompts of cells sent to one server (prefix caching
    # would otherwise serve a reused server's repeated prompts from cache).
    salt: int = 0


def completions_url(endpoint: str) -> str:
    """``…/v1/completions`` for a base URL given with or without ``/v1``."""
    base = endpoint.rstrip("/")
    if base.endswith("/v1/completions"):
        return base
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/v1/completions"


def token_range(vocab_size: int | None) -> tuple[int, int]:
    """``[low, high)`` of prompt token ids valid for a vocabulary of ``vocab_size`` ids.

    ``None`` (unknown vocabulary) gives the legacy ``[TOKEN_ID_LOW,
    TOKEN_ID_HIGH)``. Otherwise the range ends at the vocabulary and starts
    above the first quarter of a small one, where special tokens live.
    """
    if vocab_size is None:
        return TOKEN_ID_LOW, TOKEN_ID_HIGH
    if vocab_size < 8:
        raise ValueError(f"vocabulary of {vocab_size} token ids is too small to draw prompts from")
    high = min(int(vocab_size), TOKEN_ID_HIGH)
    return min(TOKEN_ID_LOW, max(1, high // 4)), high


def prompt_tokens(seed: int, request: int, n: int, *, token_ids: tuple[int, int] = (TOKEN_ID_LOW, TOKEN_ID_HIGH),
                  salt: int = 0) -> list[int]:
    """``n`` pseudo-random token ids in ``[token_ids[0], token_ids[1])`` for request ``request``.

    Distinct per request (and per ``salt``) so that prefix caching cannot
    turn a replay into cache hits the real traffic would not get.
    """
    rng = np.random.default_rng([seed, request] if salt == 0 else [seed, salt, request])
    return rng.integers(token_ids[0], token_ids[1], size=n).tolist()


async def run_cell(
    spec: LoadSpec,
    plan: Schedule,
    *,
    alive: Callable[[], bool] | None = None,
) -> pd.DataFrame:
    """Replay ``plan`` open-loop against ``spec.endpoint``; one record per sent request.

    Args:
        plan: the send plan, offsets ``(m,)`` from the cell start.
        alive: polled while waiting; when it returns False (the server process
            died) no further request is sent and in-flight ones get a short
            grace before being cancelled.

    Returns:
        DataFrame with :data:`RECORD_COLUMNS`, one row per sent request.
    """
    url = completions_url(spec.endpoint)
    loop = asyncio.get_running_loop()
    records: list[dict[str, Any]] = []
    # limit=0: no client-side cap on connections — a cap would turn the open
    # loop into a closed one under load.
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = loop.time()
        tasks: list[asyncio.Task[None]] = []
        stopped = False
        for i in range(len(plan.arrival_s)):
            due = t0 + float(plan.arrival_s[i])
            while True:
                wait = due - loop.time()
                if alive is not None and not alive():
                    stopped = True
                    break
                if wait <= 0:
                    break
                await asyncio.sleep(min(wait, _POLL_S))
            if stopped:
                break
            rec = {
                "request": i,
                "trace_index": int(plan.trace_index[i]),
                "arrival_s": float(plan.arrival_s[i]),
                "input_tokens": int(plan.input_tokens[i]),
                "output_tokens": int(plan.output_tokens[i]),
            }
            records.append(rec)
            tasks.append(asyncio.create_task(_one(session, url, spec, rec, t0)))
        if tasks:
            if alive is None:
                await asyncio.gather(*tasks)
            else:
                await _drain(tasks, alive)
    df = pd.DataFrame(records, columns=list(RECORD_COLUMNS))
    df["ok"] = df["ok"].fillna(False).astype(bool)
    df["error"] = df["error"].fillna("cancelled").astype(str)
    df["detail"] = df["detail"].fillna("").astype(str)
    return df


def run_cell_sync(spec: LoadSpec, plan: Schedule, *, alive: Callable[[], bool] | None = None) -> pd.DataFrame:
    """:func:`run_cell` from synchronous code."""
    return asyncio.run(run_cell(spec, plan, alive=alive))


async def _drain(tasks: list[asyncio.Task[None]], alive: Callable[[], bool]) -> None:
    """Wait for in-flight requests; if the server dies, cancel them after a grace period."""
    pending = set(tasks)
    dead_since: float | None = None
    while pending:
        _, pending = await asyncio.wait(pending, timeout=_POLL_S)
        if not alive():
            dead_since = dead_since or time.monotonic()
            if time.monotonic() - dead_since > 2.0:
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                return


async def _one(session: aiohttp.ClientSession, url: str, spec: LoadSpec, rec: dict[str, Any], t0: float) -> None:
    """Send one streaming request and fill ``rec`` in place."""
    loop = asyncio.get_running_loop()
    body = {
        "model": spec.model,
        "prompt": prompt_tokens(spec.seed, rec["request"], rec["input_tokens"], token_ids=spec.token_ids,
                                salt=spec.salt),
        "max_tokens": rec["output_tokens"],
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rec.update(sent_s=loop.time() - t0, first_token_s=math.nan, last_token_s=math.nan,
               n_chunks=0, prompt_tokens=-1, completion_tokens=-1, ok=False, error="cancelled", http_status=0,
               detail="")
    try:
        async with asyncio.timeout(spec.request_timeout_s):
            async with session.post(url, json=body) as resp:
                rec["http_status"] = resp.status
                if resp.status != 200:
                    rec["error"] = f"http-{resp.status}"
                    # The server's reason (e.g. a token id out of vocabulary), for the cell's message.
                    rec["detail"] = (await resp.read()).decode("utf-8", errors="replace")[:300]
                    return
                done = False
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    now = loop.time() - t0
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        rec["error"] = "bad-stream"
                        return
                    if "error" in chunk:
                        rec["error"] = "stream-error"
                        rec["detail"] = str(chunk["error"])[:300]
                        return
                    if chunk.get("choices"):
                        if rec["n_chunks"] == 0:
                            rec["first_token_s"] = now
                        rec["last_token_s"] = now
                        rec["n_chunks"] += 1
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        # Server-side counts, to check the replay did the trace's work.
                        rec["prompt_tokens"] = int(usage.get("prompt_tokens", -1))
                        rec["completion_tokens"] = int(usage.get("completion_tokens", -1))
                if not done:
                    rec["error"] = "incomplete"
                elif rec["n_chunks"] == 0:
                    rec["error"] = "no-tokens"
                else:
                    rec["ok"], rec["error"] = True, ""
    except TimeoutError:
        rec["error"] = "timeout"
    except aiohttp.ClientPayloadError as exc:
        rec["error"], rec["detail"] = "incomplete", f"{type(exc).__name__}: {exc}"[:300]
    except (aiohttp.ClientError, OSError) as exc:
        rec["error"], rec["detail"] = "connection", f"{type(exc).__name__}: {exc}"[:300]
    except asyncio.CancelledError:
        rec["error"] = "cancelled"


def summarize(records: pd.DataFrame, warmup_s: float, duration_s: float, *, n_scheduled: int | None = None) -> dict[str, Any]:
    """Metrics of one cell from its per-request records (definitions in the module docstring).

    Args:
        records: :data:`RECORD_COLUMNS` frame, one row per sent request.
        n_scheduled: window arrivals in the plan, when some were never sent
            (the server died); defaults to the window rows of ``records``.

    Returns:
        ``offered_rps, throughput_rps, ttft_p99_s, completion_p99_s,
        success_rate`` plus diagnostic counts ``n_window, n_ok, n_timeout,
        n_error`` (non-timeout failures).
    """
    end = warmup_s + duration_s
    arrival = records["arrival_s"].to_numpy(np.float64)
    ok = records["ok"].to_numpy(bool)
    window = (arrival >= warmup_s) & (arrival < end)
    n_window = int(window.sum()) if n_scheduled is None else int(n_scheduled)
    win_ok = window & ok
    sent = records["sent_s"].to_numpy(np.float64)
    ttft = records["first_token_s"].to_numpy(np.float64) - sent
    comp = records["last_token_s"].to_numpy(np.float64) - sent
    last = records["last_token_s"].to_numpy(np.float64)
    done_in_window = ok & (last >= warmup_s) & (last < end)
    errors = records["error"].to_numpy(str)
    return {
        "offered_rps": n_window / duration_s,
        "throughput_rps": int(done_in_window.sum()) / duration_s,
        "ttft_p99_s": _p99(ttft[win_ok]),
        "completion_p99_s": _p99(comp[win_ok]),
        "success_rate": (int(win_ok.sum()) / n_window) if n_window else 0.0,
        "n_window": n_window,
        "n_ok": int(win_ok.sum()),
        "n_timeout": int((window & (errors == "timeout")).sum()),
        "n_error": int((window & ~ok & (errors != "timeout")).sum()),
    }


def _p99(x: np.ndarray) -> float:
    return float(np.percentile(x, 99)) if x.size else math.inf


def write_records(records: pd.DataFrame, path: Path) -> Path:
    """Write raw records to a new Parquet file; never overwrites (raises FileExistsError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("xb") as f:
        records.to_parquet(f, index=False)
    return path
