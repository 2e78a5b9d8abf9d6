"""Existing benchmark results → measurement-table rows.

Formats (detected from the content):

- ``vllm bench serve --save-result`` JSON (and the older
  ``benchmarks/benchmark_serving.py``): one cell per JSON object; a file
  written with ``--append-result`` holds several objects, one after another.
- GuideLLM ``benchmarks.json``, current and 0.3 schemas: one cell per benchmark.
- AIPerf ``profile_export_aiperf.json``, inference-perf ``stage_<i>_lifecycle_metrics.json``,
  SGLang ``bench_serving`` JSONL and llm-d-benchmark reports (YAML): one module
  each, ``ingest_aiperf``, ``ingest_inference_perf``, ``ingest_sglang`` and
  ``ingest_llmd``, with its conversion table in its docstring; their rows are
  built by the same :func:`_row` / :func:`_finish` as the formats here.

Conversions (every unit converted to seconds / requests per second):

vLLM
  ``success_rate`` = ``completed`` / requests sent, where requests sent =
  ``completed + failed`` (newest), else the length of ``errors`` (older), else
  ``num_prompts``. TTFT p99 = ``p99_ttft_ms`` / 1000, else the p99 of the
  successful per-request ``ttfts`` (s). Completion p99 = ``p99_e2el_ms`` /
  1000, else ``p99_latency_ms`` / 1000 (older files), else the p99 of the
  successful per-request ``latencies`` (s), else of ``ttfts + sum(itls)`` per
  successful request; when the file has none of these the completion p99 is
  left empty (unobserved) — a p99 is never made up from means. ``duration``
  runs until the last request finished, so it contains the drain of the last
  requests; the time the client was sending is estimated as ``duration −``
  the fastest successful request's end-to-end time (the drain lasts at least
  that long), and ``throughput_rps`` = ``completed`` / that time, capped at
  ``offered_rps × success_rate``. A file with no per-request times cannot
  take the drain out; when every request of its open-loop run completed, the
  server kept up, and ``throughput_rps`` = ``offered_rps`` (the row carries a
  ``note`` saying so) rather than ``completed / duration``. ``offered_rps`` = ``request_rate`` for an
  open-loop run (a finite rate and no ``max_concurrency``). A closed-loop run
  (``request_rate`` ``"inf"``, or a ``max_concurrency`` cap) has no open-loop
  rate: its offered rate is the rate the client actually sent
  (``(n − 1)`` / the span of ``start_times`` with ``--save-detailed``, else
  requests sent / the sending time above), never more than ``request_rate``.
  A ramp-up run has no single offered rate and is refused.
GuideLLM
  Counts from ``metrics.request_totals`` (current) or ``request_totals`` (0.3).
  ``incomplete`` requests were cancelled when the benchmark's time ran out:
  they are neither successes nor failures, so ``success_rate`` =
  successful / (successful + errored). ``duration`` = the benchmark's
  ``duration`` (or ``end_time − start_time``). ``offered_rps`` = the
  strategy's ``rate`` for ``constant`` / ``poisson``; the closed-loop
  strategies (``synchronous``, ``concurrent``, ``throughput``) offer what
  they send: (successful + errored) / duration. ``throughput_rps`` =
  successful / duration, capped at ``offered_rps × success_rate``. TTFT p99 =
  ``metrics.time_to_first_token_ms.successful.percentiles.p99`` / 1000;
  completion p99 = ``metrics.request_latency.successful.percentiles.p99`` (s).
  The load label defaults to ``<strategy>@<rate>`` (e.g. ``constant@2``).

Several results of one cell (in one file or in several) are its repeated
windows: :func:`number_replicates` gives them ``replicate`` 0, 1, … in order.

Configurations: ``config`` (``ingest --config NAME``) names the rows'
configuration of a campaign's ``[[configs]]`` catalogue in place of a TP:
every row names it and leaves ``tp`` empty, or gives ``tp`` where it is also
given (an aggregated configuration whose TP the user knows). A name that says
its layout (``2p-tp2+1d-tp4…``: disaggregated, no single TP; ``TP4`` or
``agg-tp4…``) refuses a ``tp`` that contradicts it (:func:`~.ingest_rows.check_config`).
An llm-d v0.2 report whose stack is prefill and decode engines names its
layout ``{P}p-tp{tp_p}+{D}d-tp{tp_d}`` as the rows' configuration when no
``config`` is given (``ingest_llmd``).

A cell where no request succeeded gets ``failure = "no-success"`` and
infinite tails. Every row is checked before it is returned: success in
[0, 1] and throughput ≤ offered × 1.05. Every problem is one
:class:`~fleetsieve_bayes.errors.InputError` naming the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.backends.ingest_rows import (
    check_config,
    finish_row,
    ingest_row,
    itl_sums,
    json_number,
    json_numbers,
    optional_json_number,
    p99_or_inf,
    row_labels,
    with_config,
)
from fleetsieve_bayes.errors import InputError

__all__ = ["ingest_file", "rows_from_vllm_bench", "rows_from_guidellm", "read_json_objects", "number_replicates"]

_CLOSED_LOOP = ("synchronous", "concurrent", "throughput")


def read_json_objects(path: Path) -> list[Any]:
    """The JSON values in ``path``: one, or several written one after another (``--append-result``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: result file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read result file: {exc}") from None
    decoder = json.JSONDecoder()
    out: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON: {exc}") from None
        out.append(value)
    if not out:
        raise InputError(f"{path}: empty result file")
    return out


def ingest_file(path: str | Path, *, workload: str | None = None, tp: int | None = None,
                loads: Sequence[str] = (), details: bool = False, config: str | None = None) -> list[dict[str, Any]]:
    """Rows of one result file (format detected from its content).

    Args:
        loads: load labels, one per cell of the file in order; empty to take
            them from metadata / the strategy / the request rate.
        details: keep, besides the table columns, ``note`` (what a reader read
            differently from the file's own numbers, and why) and ``lengths``
            (the run's mean prompt and output tokens) where a reader sets them.
        config: the rows' configuration (``--config``): each row names it, its
            ``tp`` the given ``tp`` or None (empty), whatever the file's metadata says.

    Raises:
        InputError: besides a file's own problems, a ``config`` that is not a name or
            that contradicts ``tp`` (:func:`~.ingest_rows.check_config`).
    """
    if config is not None:
        config = check_config(config, tp)
    rows = _ingest_file(Path(path), workload=workload, tp=tp, loads=loads, config=config)
    if not details:
        for r in rows:
            r.pop("note", None)
            r.pop("lengths", None)
    return rows


def _ingest_file(path: Path, *, workload: str | None, tp: int | None,
                 loads: Sequence[str], config: str | None = None) -> list[dict[str, Any]]:
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        from fleetsieve_bayes.backends.ingest_llmd import read_llmd_report, rows_from_llmd

        if loads and len(loads) != 1:
            raise InputError(f"{path}: one llm-d report is one cell but {len(loads)} load labels were given")
        return rows_from_llmd(read_llmd_report(path), str(path), workload=workload, tp=tp,
                              load=loads[0] if loads else None, config=config)
    if config is None:
        return _json_rows(path, workload=workload, tp=tp, loads=loads)
    # The configuration is the rows' label: the readers' TP label is a stand-in, replaced.
    rows = _json_rows(path, workload=workload, tp=tp if tp is not None else 1, loads=loads)
    return [with_config(r, config, tp) for r in rows]


def _json_rows(path: Path, *, workload: str | None, tp: int | None, loads: Sequence[str]) -> list[dict[str, Any]]:
    objs = read_json_objects(path)
    other = _other_format(path, objs, workload=workload, tp=tp, loads=loads)
    if other is not None:
        return other
    if len(objs) == 1 and isinstance(objs[0], dict) and "benchmarks" in objs[0]:
        return rows_from_guidellm(objs[0], str(path), workload=workload, tp=tp, loads=loads)
    if all(isinstance(o, dict) and "completed" in o and "duration" in o for o in objs):
        if loads and len(loads) != len(objs):
            raise InputError(f"{path}: {len(objs)} vllm bench result(s) in the file but {len(loads)} load labels")
        return [
            rows_from_vllm_bench(o, str(path) if len(objs) == 1 else f"{path}: result #{k + 1}", workload=workload,
                                 tp=tp, load=loads[k] if loads else None)
            for k, o in enumerate(objs)
        ]
    raise InputError(f"{path}: unknown result format: not a vllm bench serve result (no 'completed'/'duration'), "
                     "a GuideLLM benchmarks.json, an AIPerf profile_export_aiperf.json, an inference-perf "
                     "lifecycle report, an SGLang bench_serving JSONL or an llm-d report (.yaml)")


def _other_format(path: Path, objs: list[Any], *, workload: str | None, tp: int | None,
                  loads: Sequence[str]) -> list[dict[str, Any]] | None:
    """Rows of an AIPerf, inference-perf or SGLang file (their modules), or None for another format."""
    from fleetsieve_bayes.backends.ingest_aiperf import is_aiperf, rows_from_aiperf
    from fleetsieve_bayes.backends.ingest_inference_perf import (
        is_inference_perf,
        rows_from_inference_perf,
    )
    from fleetsieve_bayes.backends.ingest_sglang import is_sglang, rows_from_sglang

    for test, reader in ((is_aiperf, rows_from_aiperf), (is_inference_perf, rows_from_inference_perf),
                         (is_sglang, rows_from_sglang)):
        if objs and all(test(o) for o in objs):
            if loads and len(loads) != len(objs):
                raise InputError(f"{path}: {len(objs)} result(s) in the file but {len(loads)} load labels")
            rows: list[dict[str, Any]] = []
            for k, o in enumerate(objs):
                src = str(path) if len(objs) == 1 else f"{path}: line {k + 1}"
                rows.extend(reader(o, src, workload=workload, tp=tp, load=loads[k] if loads else None))
            return rows
    return None


# --- vLLM ----------------------------------------------------------------------------------


class _VllmRequests(NamedTuple):
    """A result's per-request arrays, each ``(n_requests,)`` or None when the file lacks it."""

    ttfts: np.ndarray | None
    lats: np.ndarray | None
    itl_sum: np.ndarray | None  # each request's summed inter-token latencies
    starts: np.ndarray | None
    ok: np.ndarray | None  # bool: which requests succeeded (None: unknown, take all)

    def successful(self, x: np.ndarray | None) -> np.ndarray | None:
        return None if x is None else (x[self.ok] if self.ok is not None else x)


def rows_from_vllm_bench(data: dict[str, Any], src: str, *, workload: str | None = None,
                         tp: int | None = None, load: str | None = None) -> dict[str, Any]:
    """One row from a ``vllm bench serve`` / ``benchmark_serving.py`` result object (module docstring)."""
    if data.get("ramp_up_strategy") is not None:
        raise InputError(f"{src}: a ramp-up run (ramp_up_strategy={data['ramp_up_strategy']!r}) has no single "
                         f"offered rate; measure each rate separately")
    duration = json_number(src, data.get("duration"), "duration")
    if duration <= 0:
        raise InputError(f"{src}: field 'duration': must be positive, got {duration:g}")
    completed = json_number(src, data.get("completed"), "completed")
    n_sent, errors = _vllm_sent(src, data, completed)
    success = completed / n_sent
    req = _vllm_requests(src, data, errors)
    ttft_s = _vllm_ttft(src, data, req, completed)
    # Per-request end-to-end times of the successful requests, when the file has them.
    e2e = req.successful(req.lats) if req.lats is not None else (
        req.successful(req.ttfts + req.itl_sum) if req.ttfts is not None and req.itl_sum is not None else None)
    comp_s = _vllm_completion(src, data, e2e)

    # The client was sending for duration − drain; the drain lasts at least the fastest request.
    fastest = float(e2e[e2e > 0].min()) if e2e is not None and np.any(e2e > 0) else 0.0
    sending = duration - fastest if fastest < duration else duration
    achieved = n_sent / sending
    starts = req.starts
    if starts is not None and len(starts) >= 2 and float(starts.max() - starts.min()) > 0:
        achieved = (len(starts) - 1) / float(starts.max() - starts.min())
    offered, default_load = _vllm_offered(src, data, achieved)

    meta = dict(data)
    meta.setdefault("load", default_load)
    labels = row_labels(src, meta, workload, tp, load)
    throughput = min(completed / sending, offered * success)
    open_loop = _is_open_loop(data)
    note = ""
    if open_loop and e2e is None and starts is None and completed >= n_sent:
        # No per-request times: the drain after the last arrival cannot be taken out of
        # `duration`, and completed / duration reads it as lost throughput. Every request of
        # an open-loop run completed, so the server kept up with the offered rate.
        throughput = offered
        note = (f"{src}: no per-request times; every one of {completed:g} requests of the open-loop run "
                f"completed, so throughput = the offered {offered:g} req/s (completed / duration, "
                f"{completed / duration:.4g} req/s, counts the drain)")
    row = ingest_row(labels, offered, throughput, ttft_s, comp_s, success, duration)
    out = finish_row(src, row, completed)
    if completed > 0 and data.get("total_input_tokens") and data.get("total_output_tokens"):
        from fleetsieve_bayes.backends.ingest_common import with_lengths

        with_lengths(out, data["total_input_tokens"] / completed, data["total_output_tokens"] / completed)
    if note:
        out["note"] = note
    return out


def _is_open_loop(data: dict[str, Any]) -> bool:
    rate = data.get("request_rate")
    finite = isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0
    return finite and data.get("max_concurrency") is None


def _vllm_sent(src: str, data: dict[str, Any], completed: float) -> tuple[float, list[Any] | None]:
    """``(requests sent, per-request errors)``: sent is completed + failed, else one per
    error entry (an empty error is a success), else the prompts."""
    failed = optional_json_number(src, data, "failed")
    errors = data.get("errors")
    if errors is not None and not isinstance(errors, list):
        raise InputError(f"{src}: field 'errors': expected a list, got {type(errors).__name__}")
    if failed is not None:
        n_sent = completed + failed
    elif errors is not None:
        n_sent = float(len(errors))
    else:
        n_sent = optional_json_number(src, data, "num_prompts") or completed
    if n_sent <= 0:
        raise InputError(f"{src}: no requests (completed + failed is 0)")
    return n_sent, errors


def _vllm_requests(src: str, data: dict[str, Any], errors: list[Any] | None) -> _VllmRequests:
    """The per-request arrays, all of one length, and which requests succeeded."""
    ttfts = json_numbers(src, data, "ttfts")
    lats = json_numbers(src, data, "latencies")
    itl_sum = itl_sums(src, data)
    starts = json_numbers(src, data, "start_times")
    n_req = next((len(a) for a in (ttfts, lats, itl_sum, starts) if a is not None), None)
    for name, arr in (("ttfts", ttfts), ("latencies", lats), ("itls", itl_sum), ("start_times", starts)):
        if arr is not None and len(arr) != n_req:
            raise InputError(f"{src}: field {name!r} has {len(arr)} entries, other per-request fields {n_req}")
    if errors is not None and n_req is not None and len(errors) != n_req:
        raise InputError(f"{src}: field 'errors' has {len(errors)} entries, other per-request fields {n_req}")
    if errors is not None:
        ok = np.array([not e for e in errors], dtype=bool)
    elif lats is not None:
        ok = lats > 0  # a failed request's latency is left at 0
    elif ttfts is not None:
        ok = ttfts > 0
    else:
        ok = None
    return _VllmRequests(ttfts, lats, itl_sum, starts, ok)


def _vllm_ttft(src: str, data: dict[str, Any], req: _VllmRequests, completed: float) -> float:
    """p99 TTFT in seconds: the file's own p99, else from the successful requests' TTFTs."""
    p99_ttft = optional_json_number(src, data, "p99_ttft_ms")
    if p99_ttft is not None:
        return p99_ttft / 1000.0
    if req.ttfts is not None:
        return p99_or_inf(req.successful(req.ttfts))
    if completed > 0:
        raise InputError(f"{src}: missing field 'p99_ttft_ms' (and no per-request 'ttfts'); run vllm bench serve "
                         f"with --percentile-metrics including ttft")
    return math.inf


def _vllm_completion(src: str, data: dict[str, Any], e2e: np.ndarray | None) -> float:
    """p99 end-to-end seconds: the file's p99 (e2el, else latency), else from ``e2e``; NaN when unobserved."""
    p99_e2el = optional_json_number(src, data, "p99_e2el_ms")
    p99_latency = optional_json_number(src, data, "p99_latency_ms")
    if p99_e2el is not None:
        return p99_e2el / 1000.0
    if p99_latency is not None:
        return p99_latency / 1000.0
    if e2e is not None:
        return p99_or_inf(e2e)
    return math.nan  # unobserved: this file has no completion timing


def _vllm_offered(src: str, data: dict[str, Any], achieved: float) -> tuple[float, str]:
    """``(offered req/s, default load label)`` from the request rate and concurrency cap."""
    rate_raw = data.get("request_rate")
    if rate_raw is None or (isinstance(rate_raw, str) and rate_raw.strip().lower() in ("inf", "infinity")):
        rate = math.inf
    else:
        rate = json_number(src, rate_raw, "request_rate")
    conc = data.get("max_concurrency")
    if conc is not None:
        conc = json_number(src, conc, "max_concurrency")
    if math.isfinite(rate) and rate > 0 and conc is None:
        offered = rate  # open loop
    elif math.isfinite(rate) and rate > 0:
        offered = min(rate, achieved)  # the concurrency cap may have held the client back
    else:
        offered = achieved  # closed loop: the client offers what it sends
    default_load = (f"{rate:g}rps" if math.isfinite(rate) and conc is None
                    else (f"C{int(conc)}" if conc is not None else "max"))
    return offered, default_load


# --- GuideLLM ------------------------------------------------------------------------------


def _get(src: str, obj: Any, *keys: str) -> Any:
    cur = obj
    for i, k in enumerate(keys):
        if not isinstance(cur, dict):
            where = ".".join(keys[:i]) or "benchmark"
            raise InputError(f"{src}: field {where!r}: expected an object, got {type(cur).__name__}")
        if k not in cur:
            raise InputError(f"{src}: missing field {'.'.join(keys[: i + 1])!r}")
        cur = cur[k]
    return cur


def _count(src: str, totals: dict[str, Any], key: str) -> float:
    v = totals.get(key, 0)
    if isinstance(v, dict):  # some writers nest {"count": n}
        v = v.get("count")
    return json_number(src, v, f"request_totals.{key}")


def _strategy(b: dict[str, Any]) -> dict[str, Any]:
    for holder in (b.get("config"), b.get("args"), b):
        if isinstance(holder, dict) and isinstance(holder.get("strategy"), dict):
            return holder["strategy"]
    return {}


def _guidellm_p99(where: str, metrics: dict[str, Any], key: str) -> float:
    """``metrics.<key>.successful.percentiles.p99`` as a number (null or a string: one line)."""
    v = _get(where, metrics, key, "successful", "percentiles", "p99")
    return json_number(where, v, f"metrics.{key}.successful.percentiles.p99")


def rows_from_guidellm(data: dict[str, Any], src: str, *, workload: str | None = None,
                       tp: int | None = None, loads: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per benchmark of a GuideLLM ``benchmarks.json`` object (module docstring)."""
    benches = data.get("benchmarks")
    if not isinstance(benches, list):
        raise InputError(f"{src}: field 'benchmarks': expected a list, got {type(benches).__name__}")
    if not benches:
        raise InputError(f"{src}: 'benchmarks' is empty")
    if loads and len(loads) != len(benches):
        raise InputError(f"{src}: {len(benches)} benchmarks but {len(loads)} load labels")
    rows = []
    for i, b in enumerate(benches):
        where = f"{src}: benchmarks[{i}]"
        if not isinstance(b, dict):
            raise InputError(f"{where}: expected an object, got {type(b).__name__}")
        metrics = b.get("metrics")
        if not isinstance(metrics, dict):
            raise InputError(f"{where}: field 'metrics': expected an object, got "
                             f"{'nothing' if metrics is None else type(metrics).__name__}")
        totals = metrics.get("request_totals", b.get("request_totals"))
        if not isinstance(totals, dict):
            raise InputError(f"{where}: missing field 'metrics.request_totals' (or 'request_totals')")
        ok = _count(where, totals, "successful")
        err = _count(where, totals, "errored")
        sent = ok + err  # incomplete: cancelled when the benchmark's time ran out
        if sent <= 0:
            raise InputError(f"{where}: no successful or errored request in 'request_totals'")

        duration = b.get("duration")
        if duration is None and "start_time" in b and "end_time" in b:
            duration = json_number(where, b["end_time"], "end_time") - json_number(where, b["start_time"], "start_time")
        if duration is None:
            raise InputError(f"{where}: missing field 'duration'")
        duration = json_number(where, duration, "duration")
        if duration <= 0:
            raise InputError(f"{where}: field 'duration': must be positive, got {duration:g}")

        strat = _strategy(b)
        kind = str(strat.get("type_", strat.get("type", "")))
        rate = strat.get("rate")
        open_loop = kind not in _CLOSED_LOOP and isinstance(rate, (int, float)) and not isinstance(rate, bool) \
            and math.isfinite(rate) and rate > 0
        success = ok / sent
        offered = float(rate) if open_loop else sent / duration

        ttft_s = _guidellm_p99(where, metrics, "time_to_first_token_ms") / 1000.0 if ok else math.inf
        if ok and isinstance(metrics.get("request_latency"), dict):
            comp_s = _guidellm_p99(where, metrics, "request_latency")
        else:
            comp_s = math.inf if not ok else math.nan  # no latency distribution: unobserved

        if loads:
            label = loads[i]
        else:
            num = rate if open_loop else strat.get("streams", strat.get("max_concurrency"))
            label = f"{kind or 'bench'}@{num:g}" if isinstance(num, (int, float)) and not isinstance(num, bool) \
                else (kind or f"bench{i}")
        labels = row_labels(where, {}, workload, tp, label)
        row = ingest_row(labels, offered, min(ok / duration, offered * success), ttft_s, comp_s, success, duration)
        rows.append(finish_row(where, row, ok))
    return rows


# --- several results of one cell: replicate rows ------------------------------------------

_WINDOW_FIELDS = ("offered_rps", "throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate", "duration_s")


def _cell_key(row: Any) -> tuple[str, Any, str]:
    """A row's cell: ``(workload, tp, load)``, or with the configuration's name (lower case) in
    place of the TP where the row names one (as the table tells cells apart)."""
    conf = row.get("config")
    conf = "" if conf is None or str(conf).strip().lower() in ("", "nan", "none", "<na>") else str(conf).strip()
    return (str(row["workload"]), conf.lower() if conf else int(row["tp"]), str(row["load"]))


def _cell_words(key: tuple[str, Any, str]) -> str:
    what = f"config={key[1]}" if isinstance(key[1], str) else f"tp={key[1]}"
    return f"workload={key[0]}, {what}, load={key[2]}"


def _window_id(row: Any) -> tuple[Any, ...]:
    """What identifies one window's result: its cell and every measured value (NaN-safe)."""
    vals = tuple(None if math.isnan(float(row[k])) else float(row[k]) for k in _WINDOW_FIELDS)
    return (*_cell_key(row), *vals)


def number_replicates(rows: Sequence[dict[str, Any]], sources: Sequence[str], *,
                      existing: Any = None, existing_source: str = "the table") -> list[dict[str, Any]]:
    """``rows`` with a ``replicate`` each: several results of one cell are its windows 0, 1, ….

    Rows are numbered in order (the files' order on the command line, then
    the order inside each file), after the windows the ``existing`` table
    (validated, or None) already holds of the cell.

    Args:
        sources: ``(len(rows),)`` where each row came from (a file name), for messages.

    Raises:
        InputError: a row repeats a window already in ``existing`` or earlier in
            ``rows`` value for value — the same result ingested twice, never two
            windows — naming the file and the cell.
    """
    counts: dict[tuple[str, Any, str], int] = {}
    seen: dict[tuple[Any, ...], str] = {}
    if existing is not None:
        for r in existing.to_dict(orient="records"):
            key = _cell_key(r)
            counts[key] = counts.get(key, 0) + 1
            seen[_window_id(r)] = f"a row already in {existing_source}"
    out = []
    for row, src in zip(rows, sources, strict=True):
        key = _cell_key(row)
        wid = _window_id(row)
        if wid in seen:
            raise InputError(
                f"{src}: duplicate cell ({_cell_words(key)}): the same window as "
                f"{seen[wid]} (every value equal: this result was already ingested)"
            )
        seen[wid] = f"a result of {src}"
        out.append({**row, "replicate": counts.get(key, 0)})
        counts[key] = counts.get(key, 0) + 1
    return out
