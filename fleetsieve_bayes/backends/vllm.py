"""The vLLM backend: each chosen cell is measured on a server this backend launches.

Campaign keys (``[measurement]``, with ``backend = "vllm"``):

========================  =====================================================
``model``                 model path or name handed to the server (required)
``served_model_name``     the request's ``model`` field (default: ``model``)
``command``               server command template, a list of strings with
                          ``{model}``, ``{tp}``, ``{port}`` (default
                          :data:`~.server.DEFAULT_COMMAND`, ``vllm serve``)
``extra_args``            list of strings appended verbatim (default ``[]``)
``env``                   table of extra environment variables for the server
``gpus``                  device ids of the pool; TP t uses the first t, via
                          ``CUDA_VISIBLE_DEVICES`` (default ``0..max(tp)-1``).
                          With two or more ``[[fleet.pools]]``: a table GPU
                          type → device ids on this node, one entry per pool
                          (required), e.g. ``{ h100-sxm-80gb = [0, 1],
                          a100-80gb = [2, 3] }``; a key is a pool's ``gpu`` as
                          written there or its spec-table name
                          (case-insensitive); a device belongs to one pool and
                          the widest TP must fit every pool
``tp``                    TP candidates, e.g. ``[2, 4, 8]`` (required)
``loads``                 load ladder, label → arrival scale, e.g.
                          ``{ C16 = 1.0, C32 = 2.0 }`` (required)
``traces``                workload → trace file (relative to the campaign
                          file); every campaign workload needs one (required)
``trace_format``          ``"auto"`` (default), ``"azure"`` or ``"burstgpt"``
``warmup_s``              warm-up seconds, arrivals excluded (default 30)
``duration_s``            measurement window after the warm-up (default 270)
``readiness_timeout_s``   start-up limit (default 1800)
``request_timeout_s``     per-request limit; a timeout is a failed request
                          (default 300)
``stop_timeout_s``        SIGTERM grace before SIGKILL (default 30)
``model_size_gb``         weights size, for the memory guard
``gpu_memory_gb``         memory of one GPU, for the memory guard (default:
                          with ``[[fleet.pools]]``, each pool's ``memory_gb``
                          from its GPU spec; without, no guard)
``kv_cache_gb_min``       KV cache a GPU must hold besides its weights (default 0)
``gpu_memory_utilization`` fraction of GPU memory vLLM may use (default 0.9)
``max_input_tokens``      clip trace prompt lengths (e.g. to the context length)
``max_output_tokens``     clip trace output lengths
``request_error_tolerance`` deprecated, accepted and ignored: a window in
                          which some requests failed is a success
                          measurement (success = succeeded / sent); only a
                          window in which nothing was served is a failure
``seed``                  seed of the prompts and the row (default 0)
``reuse_server``          keep the server running for the next cell when it
                          needs the same server (same TP and pool; command,
                          arguments and environment are the campaign's)
                          instead of restarting it (default true)
========================  =====================================================

The memory guard also reads the prior card's per-TP feasibility
(``[feasibility] infeasible_tp``, written by ``priors derive``): such a TP is
skipped at zero GPU-seconds and recorded as infeasible (on every pool: the
card's feasibility is not per GPU type). Cells are workloads × TP candidates ×
loads, and with several ``[[fleet.pools]]`` workloads × pools × TP candidates ×
loads, in the order of :func:`~fleetsieve_bayes.allocation.problem.grid_from_table`;
a cell runs on its pool's devices and its row names the pool in ``gpu``.
A cell's ``offered_rps`` is computed from its trace at
construction (arrivals in the window / window), so unmeasured cells have a
known offered rate, and it equals what the
measurement reports. The row's ``duration_s`` is warm-up + window for a
measured cell, the wall seconds the GPUs were held for a failed one, and 0 for
a cell skipped by the memory guard. Raw per-request records go to
``OUT/raw/<workload>_tp<tp>_<load>_<timestamp>.parquet`` (written once;
``<workload>_<gpu>_tp<tp>_…`` with several pools), server logs to ``OUT/logs/``.

A repeated window of a cell (``measure(cell, replicate=k)``, k ≥ 1) is a new
window on the warm server where one with the cell's TP (and pool) is running: it
replays the trace from :func:`~.traces.window_offset_s` (k windows' worth of
trace time further on) with the prompt seed :func:`~.traces.replicate_seed`,
which the row records as ``seed``; its ``offered_rps`` is that stretch's.
Its records and log are named ``…_<load>_r<k>_<timestamp>``.

``model`` is handed to the server verbatim, except that a path relative to
the campaign file that exists there is made absolute. Each measured cell goes
through :func:`fleetsieve_bayes.backends.cell.measure_cell` (the same path as
``fleetsieve-bayes measure``): prompt token ids inside the served model's
vocabulary, prompt + output fitted into its context length.

Start-up is recorded per cell as ``startup_s``: the seconds from launch to a
healthy ``/health`` for the cell that started the server, 0 for a cell that
reused a running one. It is not part of ``duration_s``: a cell that failed
while running was held ``duration_s`` after its start-up; a start-up
failure's row has ``duration_s = startup_s`` (its GPUs were held only for the
start-up).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import DEFAULT_POOL, CellGrid
from fleetsieve_bayes.backends.base import Backend
from fleetsieve_bayes.backends.cell import CellSpec, measure_cell, served_model_info
from fleetsieve_bayes.backends.failures import (
    MEMORY_GUARD,
    classify_startup,
    failure_row,
    memory_guard,
)
from fleetsieve_bayes.backends.server import (
    DEFAULT_COMMAND,
    ServerHandle,
    free_port,
    log_tail,
    probe,
    render_command,
    start_server,
    stop_server,
    wait_ready,
)
from fleetsieve_bayes.backends.traces import (
    Trace,
    read_trace,
    replicate_seed,
    window_offset_s,
    window_rate,
)
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.errors import InputError, MeasurementError

__all__ = ["VllmSettings", "VLLM_KEYS", "parse_vllm_options", "make_vllm_backend"]

VLLM_KEYS: frozenset[str] = frozenset({
    "model", "served_model_name", "command", "extra_args", "env", "gpus", "tp", "loads", "traces",
    "trace_format", "warmup_s", "duration_s", "readiness_timeout_s", "request_timeout_s",
    "stop_timeout_s", "model_size_gb", "gpu_memory_gb", "kv_cache_gb_min", "gpu_memory_utilization",
    "max_input_tokens", "max_output_tokens", "request_error_tolerance", "seed", "reuse_server",
})


class VllmSettings(NamedTuple):
    """Validated ``[measurement]`` keys of the vLLM backend (see the module docstring)."""

    model: str
    served_model_name: str
    command: tuple[str, ...]
    extra_args: tuple[str, ...]
    env: dict[str, str]
    gpus: tuple[int, ...]
    tp: tuple[int, ...]
    loads: tuple[tuple[str, float], ...]  # (label, scale), file order
    traces: dict[str, Path]
    trace_format: str
    warmup_s: float
    duration_s: float
    readiness_timeout_s: float
    request_timeout_s: float
    stop_timeout_s: float
    model_size_gb: float | None
    gpu_memory_gb: float | None
    kv_cache_gb_min: float
    gpu_memory_utilization: float
    max_input_tokens: int | None
    max_output_tokens: int | None
    seed: int
    reuse_server: bool = True
    # Several [[fleet.pools]]: each pool's device ids, in Campaign.pool_names order
    # (``gpus`` is then every pool's devices); () for a campaign of one pool.
    pool_devices: tuple[tuple[int, ...], ...] = ()


class _Options:
    """Typed reads of ``[measurement]`` keys; every error names the file and the key."""

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.opts = campaign.measurement.options

    def fail(self, key: str, msg: str) -> InputError:
        return InputError(f"{self.campaign.path}: [measurement] {key}: {msg}")

    def string(self, key: str, default: str | None = None) -> str:
        v = self.opts.get(key, default)
        if v is None:
            raise self.fail(key, "missing")
        if not isinstance(v, str) or not v.strip():
            raise self.fail(key, f"expected a non-empty string, got {v!r}")
        return v

    def strings(self, key: str, default: Sequence[str]) -> tuple[str, ...]:
        v = self.opts.get(key, list(default))
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(key, f"expected a list of strings (an argument list, not a shell string), got {v!r}")
        return tuple(v)

    def number(self, key: str, default: float | None, *, lo: float = 0.0, lo_open: bool = True,
               hi: float | None = None) -> float | None:
        v = self.opts.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise self.fail(key, f"expected a finite number, got {v!r}")
        x = float(v)
        if x < lo or (lo_open and x == lo):
            raise self.fail(key, f"must be {'>' if lo_open else '>='} {lo:g}, got {v!r}")
        if hi is not None and x > hi:
            raise self.fail(key, f"must be <= {hi:g}, got {v!r}")
        return x

    def integer(self, key: str, default: int | None, lo: int) -> int | None:
        v = self.opts.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.fail(key, f"expected an integer >= {lo}, got {v!r}")
        return v


def parse_vllm_options(campaign: Campaign) -> VllmSettings:
    """Validate the campaign's ``[measurement]`` keys for ``backend = "vllm"``.

    Raises:
        InputError: one line naming the file and the key.
    """
    o = _Options(campaign)
    _check_known_keys(o)
    # Keys are read in this order so that the first bad one is the one reported.
    model, served, command, extra_args, env_raw = _server_options(o)
    tps = _tp_candidates(o)
    gpus, pool_devices = _gpu_pools(o, tps)
    loads = _load_ladder(o)
    traces = _trace_files(o)
    trace_format = o.string("trace_format", "auto")
    if trace_format not in ("auto", "azure", "burstgpt"):
        raise o.fail("trace_format", f"expected 'auto', 'azure' or 'burstgpt', got {trace_format!r}")

    # Deprecated (no effect; see the module docstring), still accepted and checked.
    o.number("request_error_tolerance", None, lo_open=False, hi=1.0)
    model_size = o.number("model_size_gb", None)
    gpu_mem = o.number("gpu_memory_gb", None)
    number, integer = o.number, o.integer
    return VllmSettings(
        model=model,
        served_model_name=served,
        command=command,
        extra_args=extra_args,
        env={str(k): v for k, v in env_raw.items()},
        gpus=gpus,
        tp=tps,
        loads=loads,
        traces=traces,
        trace_format=trace_format,
        warmup_s=number("warmup_s", 30.0, lo_open=False),  # type: ignore[arg-type]
        duration_s=number("duration_s", 270.0),  # type: ignore[arg-type]
        readiness_timeout_s=number("readiness_timeout_s", 1800.0),  # type: ignore[arg-type]
        request_timeout_s=number("request_timeout_s", 300.0),  # type: ignore[arg-type]
        stop_timeout_s=number("stop_timeout_s", 30.0),  # type: ignore[arg-type]
        model_size_gb=model_size,
        gpu_memory_gb=gpu_mem,
        kv_cache_gb_min=number("kv_cache_gb_min", 0.0, lo_open=False),  # type: ignore[arg-type]
        gpu_memory_utilization=number("gpu_memory_utilization", 0.9, hi=1.0),  # type: ignore[arg-type]
        max_input_tokens=integer("max_input_tokens", None, 1),
        max_output_tokens=integer("max_output_tokens", None, 1),
        seed=integer("seed", 0, 0),  # type: ignore[arg-type]
        reuse_server=_boolean(o.opts, "reuse_server", True, o.fail),
        pool_devices=pool_devices,
    )


def _check_known_keys(o: _Options) -> None:
    """A typo is an error (with the closest key), never a silently ignored setting."""
    for key in o.opts:
        if key not in VLLM_KEYS:
            import difflib

            close = difflib.get_close_matches(key, sorted(VLLM_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise o.fail(key, f"unknown key for backend 'vllm'{hint}")


def _server_options(o: _Options) -> tuple[str, str, tuple[str, ...], tuple[str, ...], dict[str, Any]]:
    """``(model, served name, command template, extra args, env)`` of the server."""
    model = o.string("model")
    served = o.string("served_model_name", model)
    local = o.campaign.measurement.base_dir / model
    if not Path(model).is_absolute() and local.exists():
        model = str(local.resolve())  # a model directory next to the campaign file
    command = o.strings("command", DEFAULT_COMMAND)
    if not command:
        raise o.fail("command", "empty command")
    try:
        render_command(command, model=model, tp=1, port=1)
    except ValueError as exc:
        raise o.fail("command", str(exc)) from None
    if "{port}" not in "".join(command):
        raise o.fail("command", "the template must contain {port} (each cell gets a free port)")
    extra_args = o.strings("extra_args", ())
    env_raw = o.opts.get("env", {})
    if not isinstance(env_raw, dict) or not all(isinstance(v, str) for v in env_raw.values()):
        raise o.fail("env", f"expected a table of strings, got {env_raw!r}")
    return model, served, command, extra_args, env_raw


def _tp_candidates(o: _Options) -> tuple[int, ...]:
    tp_raw = o.opts.get("tp")
    if tp_raw is None:
        raise o.fail("tp", "missing (the TP candidates, e.g. [2, 4, 8])")
    if (not isinstance(tp_raw, list) or not tp_raw
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in tp_raw)):
        raise o.fail("tp", f"expected a non-empty list of positive integers, got {tp_raw!r}")
    if len(set(tp_raw)) != len(tp_raw):
        raise o.fail("tp", f"duplicate TP candidates in {tp_raw!r}")
    return tuple(sorted(tp_raw))


def _gpu_pools(o: _Options, tps: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(every device id, each pool's device ids)``: with two or more ``[[fleet.pools]]``
    ``gpus`` is a table GPU type → device ids, else a list (each pool's ids are then ``()``)."""
    names = o.campaign.pool_names
    if names is None or len(names) < 2:
        raw = o.opts.get("gpus")
        if isinstance(raw, dict):
            raise o.fail("gpus", f"a table of GPU types needs two or more [[fleet.pools]]; expected a list of "
                                 f"device ids, e.g. [0, 1], got {raw!r}")
        return _gpu_pool(o, tps), ()
    per_pool = _pool_device_table(o, names, tps)
    return tuple(g for ids in per_pool for g in ids), per_pool


def _pool_aliases(campaign: Campaign) -> dict[str, int]:
    """Lower-cased spellings of each pool's GPU type → pool index: its name in
    :attr:`Campaign.pool_names` and its ``gpu`` as written in ``[[fleet.pools]]``."""
    names = campaign.pool_names or ()
    out = {n.lower(): j for j, n in enumerate(names)}
    raw = campaign.raw.get("fleet", {}).get("pools", []) if isinstance(campaign.raw.get("fleet"), dict) else []
    if isinstance(raw, list) and len(raw) == len(names):
        for j, item in enumerate(raw):
            if isinstance(item, dict) and isinstance(item.get("gpu"), str):
                out.setdefault(item["gpu"].strip().lower(), j)
    return out


def _pool_device_table(o: _Options, names: tuple[str, ...], tps: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each pool's device ids (pool order) from ``gpus = { TYPE = [ids], … }``."""
    import difflib

    example = "{ " + ", ".join(f"{n} = [{j}]" for j, n in enumerate(names)) + " }"
    raw = o.opts.get("gpus")
    if raw is None:
        raise o.fail("gpus", f"missing: the campaign has {len(names)} [[fleet.pools]]; give each pool's device "
                             f"ids on this node, e.g. gpus = {example}")
    if not isinstance(raw, dict):
        raise o.fail("gpus", f"expected a table GPU type = device ids, one entry per [[fleet.pools]] "
                             f"({', '.join(names)}), e.g. {example}; got {raw!r}")
    aliases = _pool_aliases(o.campaign)
    ids_of: dict[int, tuple[int, ...]] = {}
    owner: dict[int, str] = {}  # device id → the pool holding it
    for key, ids in raw.items():
        where = f"gpus.{key}"
        j = aliases.get(str(key).strip().lower())
        if j is None:
            low = str(key).strip().lower()
            close = [n for n in names if low and low in n.lower()] or [
                names[aliases[m]] for m in difflib.get_close_matches(low, sorted(aliases), n=1)]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise o.fail(where, f"{key!r} is not the GPU type of a [[fleet.pools]] entry{hint}; "
                                f"pools: {', '.join(names)}")
        if j in ids_of:
            raise o.fail(where, f"pool {names[j]!r} is given twice")
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in ids)):
            raise o.fail(where, f"expected a non-empty list of GPU ids (integers >= 0), got {ids!r}")
        for g in ids:
            if ids.count(g) > 1:
                raise o.fail(where, f"device {g} is listed twice")
            if g in owner:
                raise o.fail(where, f"device {g} is also in pool {owner[g]!r} (a device belongs to one pool)")
        if max(tps) > len(ids):
            raise o.fail(where, f"TP{max(tps)} needs {max(tps)} GPUs but pool {names[j]!r} has {len(ids)}")
        ids_of[j] = tuple(ids)
        owner.update(dict.fromkeys(ids, names[j]))
    for j, n in enumerate(names):
        if j not in ids_of:
            raise o.fail(f"gpus.{n}", f"missing: pool {n!r} has no device ids (one entry per [[fleet.pools]])")
    return tuple(ids_of[j] for j in range(len(names)))


def _gpu_pool(o: _Options, tps: tuple[int, ...]) -> tuple[int, ...]:
    """The GPU ids to launch on (default 0..max TP-1); the widest TP must fit."""
    gpus_raw = o.opts.get("gpus", list(range(max(tps))))
    if (not isinstance(gpus_raw, list) or not gpus_raw
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus_raw)
            or len(set(gpus_raw)) != len(gpus_raw)):
        raise o.fail("gpus", f"expected a list of distinct GPU ids (integers >= 0), got {gpus_raw!r}")
    if max(tps) > len(gpus_raw):
        raise o.fail("gpus", f"TP{max(tps)} needs {max(tps)} GPUs but the pool has {len(gpus_raw)}")
    return tuple(gpus_raw)


def _load_ladder(o: _Options) -> tuple[tuple[str, float], ...]:
    """``(label, arrival scale)`` pairs in file order."""
    loads_raw = o.opts.get("loads")
    if loads_raw is None:
        raise o.fail("loads", "missing (the load ladder, label = arrival scale, e.g. { C16 = 1.0 })")
    if not isinstance(loads_raw, dict) or not loads_raw:
        raise o.fail("loads", f"expected a non-empty table label = arrival scale, got {loads_raw!r}")
    loads = []
    for label, scale in loads_raw.items():
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise o.fail(f"loads.{label}", f"arrival scale must be a positive number, got {scale!r}")
        loads.append((str(label), float(scale)))
    return tuple(loads)


def _trace_files(o: _Options) -> dict[str, Path]:
    """One existing trace file per campaign workload, relative to the campaign file."""
    campaign = o.campaign
    traces_raw = o.opts.get("traces")
    if traces_raw is None:
        raise o.fail("traces", "missing (one trace file per workload)")
    if not isinstance(traces_raw, dict):
        raise o.fail("traces", f"expected a table workload = file, got {traces_raw!r}")
    traces = {}
    for w, p in traces_raw.items():
        if w not in campaign.workload_names:
            raise o.fail(f"traces.{w}", f"no workload {w!r} in the campaign ({', '.join(campaign.workload_names)})")
        if not isinstance(p, str) or not p.strip():
            raise o.fail(f"traces.{w}", f"expected a file path, got {p!r}")
        path = (campaign.measurement.base_dir / p).resolve()
        if not path.is_file():
            raise o.fail(f"traces.{w}", f"file not found: {path}")
        traces[w] = path
    for w in campaign.workload_names:
        if w not in traces:
            raise o.fail("traces", f"no trace for workload {w!r}")
    return traces


def _card_infeasible(campaign: Campaign) -> dict[int, str]:
    """TP → why, for the TPs the campaign's prior card marks infeasible (``[feasibility]``)."""
    from fleetsieve_bayes.model.priors import load_card

    card = load_card(campaign.family)
    return {
        tp: f"prior card {card.name!r} marks TP{tp} infeasible (weights + activations + minimum KV "
            f"cache do not fit; [feasibility] infeasible_tp in {card.path})"
        for tp in card.feasibility_infeasible_tp or ()
    }


def _pool_memory_gb(campaign: Campaign, s: VllmSettings) -> tuple[float | None, ...]:
    """The memory of one GPU for the memory guard, per pool of the grid: ``gpu_memory_gb``
    when given, else each ``[[fleet.pools]]`` entry's ``memory_gb`` from its GPU spec
    (``None``, no guard, without pools)."""
    if s.gpu_memory_gb is not None or not campaign.pools:
        return (s.gpu_memory_gb,) * max(len(campaign.pools), 1)
    from fleetsieve_bayes.model.derive import load_gpus

    out: list[float | None] = []
    for p in campaign.pools:
        spec = load_gpus(p.spec).get(p.gpu)
        out.append(None if spec is None else spec.memory_gb)
    return tuple(out)


@dataclass
class _LiveServer:
    """The running server (at most one): reused by the next cell with the same TP and pool."""

    handle: ServerHandle | None = None
    tp: int | None = None
    pool: int | None = None  # index into the grid's pools
    devices: tuple[int, ...] = ()  # the device ids it runs on
    gpu: str = ""  # its pool's GPU type ("" for a campaign of one pool)
    served: Any = None  # what the server reports it serves (served_model_info)


class _VllmCells(NamedTuple):
    """What measuring any cell of the campaign needs, fixed once the backend is built."""

    campaign: Campaign
    s: VllmSettings
    out_dir: Path
    grid: CellGrid
    scales: list[float]  # (n_cells,) arrival scale of each cell
    traces: dict[str, Trace]
    card_infeasible: dict[int, str]  # TP → why the prior card rules it out
    pool_memory_gb: tuple[float | None, ...] = (None,)  # (n_pools,) memory of one GPU, for the guard

    def devices(self, c: int) -> tuple[int, ...]:
        """Device ids of cell ``c``'s pool (its server uses the first TP of them)."""
        if self.grid.n_pools > 1:
            return self.s.pool_devices[int(self.grid.gpu_idx[c])]
        return self.s.gpus

    def with_gpu(self, c: int, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with cell ``c``'s GPU type in ``gpu`` when the grid has several pools."""
        if self.grid.n_pools > 1:
            row["gpu"] = self.grid.gpu_name(c)
        return row


def make_vllm_backend(campaign: Campaign, out_dir: Path) -> Backend:
    """A :class:`~fleetsieve_bayes.backends.Backend` that launches one server per measured cell."""
    s = parse_vllm_options(campaign)
    card_infeasible = _card_infeasible(campaign)
    traces: dict[str, Trace] = {w: read_trace(p, s.trace_format) for w, p in s.traces.items()}
    grid, scales = _vllm_grid(campaign, s, traces)
    cells = _VllmCells(campaign, s, Path(out_dir), grid, scales, traces, card_infeasible,
                       _pool_memory_gb(campaign, s))
    live = _LiveServer()
    return Backend(grid=grid, measure=partial(_measure, cells, live), close=partial(_stop_live, s, live),
                   expected_duration_s=grid.duration_s, preflight=partial(_preflight, cells))


def _vllm_grid(campaign: Campaign, s: VllmSettings, traces: dict[str, Trace]) -> tuple[CellGrid, list[float]]:
    """The candidate cells (workload × pool × TP × load) and each cell's arrival scale.

    One pool: no GPU axis (``gpu`` None). Several: ``pools`` are the campaign's GPU types.
    Sorted as :func:`~fleetsieve_bayes.allocation.problem.grid_from_table` sorts a table:
    workload, pool, TP, offered load, load label.
    """
    horizon = s.warmup_s + s.duration_s
    pools = campaign.pool_names if s.pool_devices else None
    offered_of: dict[tuple[str, str], float] = {}
    for w in campaign.workload_names:
        for label, scale in s.loads:
            offered = window_rate(traces[w], scale, s.warmup_s, s.duration_s)
            if offered <= 0:
                raise InputError(
                    f"{campaign.path}: [measurement] loads.{label}: trace {s.traces[w]} has no arrival in "
                    f"the {s.duration_s:g} s window at scale {scale:g} (cell {w} TP{min(s.tp)}@{label})"
                )
            offered_of[(w, label)] = offered
    cells = []  # (workload index, pool index, tp, load label, scale, offered)
    for wi, w in enumerate(campaign.workload_names):
        for g in range(len(pools) if pools else 1):
            for tp in s.tp:
                for label, scale in s.loads:
                    cells.append((wi, g, tp, label, scale, offered_of[(w, label)]))
    cells.sort(key=lambda c: (c[0], c[1], c[2], c[5], c[3]))  # the order of problem.grid_from_table
    grid = CellGrid(
        workloads=campaign.workload_names,
        workload_idx=np.array([c[0] for c in cells], dtype=np.int64),
        tp=np.array([c[2] for c in cells], dtype=np.int64),
        load=tuple(c[3] for c in cells),
        offered_rps=np.array([c[5] for c in cells], dtype=np.float64),
        duration_s=np.full(len(cells), horizon, dtype=np.float64),
        gpu=None if pools is None else np.array([c[1] for c in cells], dtype=np.int64),
        pools=(DEFAULT_POOL,) if pools is None else tuple(pools),
    )
    return grid, [c[4] for c in cells]


def _preflight(cells: _VllmCells, c: int) -> dict[str, Any] | None:
    """The memory guard's row (0 GPU-seconds) for a TP that cannot hold the model on
    cell ``c``'s pool, else None."""
    s, grid = cells.s, cells.grid
    tp = int(grid.tp[c])
    memory = cells.pool_memory_gb[int(grid.gpu_idx[c])]
    why = cells.card_infeasible.get(tp)
    if why is None:
        why = memory_guard(
            tp, model_size_gb=s.model_size_gb, gpu_memory_gb=memory,
            kv_cache_gb_min=s.kv_cache_gb_min, gpu_memory_utilization=s.gpu_memory_utilization)
        if why is not None and s.gpu_memory_gb is None:
            pool = cells.campaign.pools[int(grid.gpu_idx[c])]
            why += f" ({pool.gpu}: {memory:g} GB per GPU, its GPU spec's memory_gb)"
    if why is None:
        return None
    row = failure_row(grid.key(c)[:3], float(grid.offered_rps[c]), MEMORY_GUARD, 0.0, s.seed)
    row["startup_s"] = 0.0
    row["detail"] = why
    return cells.with_gpu(c, row)


def _stop_live(s: VllmSettings, live: _LiveServer) -> None:
    handle = live.handle
    if handle is None:
        return
    tp, devices, gpu = live.tp, live.devices, live.gpu
    live.handle, live.tp, live.pool, live.devices, live.gpu, live.served = None, None, None, (), "", None
    left = stop_server(handle, grace_s=s.stop_timeout_s)
    if left:
        on = f" on {gpu}" if gpu else ""
        raise MeasurementError(f"server on port {handle.port} (TP{tp}{on}): processes {sorted(left)} survived "
                               f"SIGKILL (GPUs {list(devices)} may still be held)")


def _reusable(s: VllmSettings, live: _LiveServer, tp: int, pool: int) -> bool:
    handle = live.handle
    return (s.reuse_server and handle is not None and live.tp == tp and live.pool == pool
            and handle.proc.poll() is None and probe(handle.url + "/health", timeout_s=5.0) == 200)


def _measure(cells: _VllmCells, live: _LiveServer, c: int, replicate: int = 0) -> dict[str, Any]:
    """One window of a cell: the guard's row, a start-up failure's row, or the measured row."""
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 0:
        raise ValueError(f"replicate must be an integer >= 0, got {replicate!r}")
    guarded = _preflight(cells, c)
    if guarded is not None:
        return guarded
    grid = cells.grid
    w, tp, load = grid.key(c)[:3]
    rep = f"_r{replicate}" if replicate else ""
    on = f"{_safe(grid.gpu_name(c))}_" if grid.n_pools > 1 else ""
    stem = f"{_safe(w)}_{on}tp{tp}_{_safe(load)}{rep}_{time.strftime('%Y%m%dT%H%M%S')}"
    startup_s = 0.0
    if not _reusable(cells.s, live, tp, int(grid.gpu_idx[c])):
        startup_s, failed = _launch(cells, live, c, stem)
        if failed is not None:
            return failed
    return _run_cell(cells, live, c, stem, startup_s, replicate)


def _launch(cells: _VllmCells, live: _LiveServer, c: int, stem: str) -> tuple[float, dict[str, Any] | None]:
    """Replace the live server with one for cell ``c``'s TP on its pool's devices:
    ``(startup_s, failure row or None)``."""
    s, grid = cells.s, cells.grid
    key = grid.key(c)[:3]
    tp = key[1]
    devices = cells.devices(c)[:tp]
    _stop_live(s, live)
    port = free_port()
    cmd = render_command(s.command, model=s.model, tp=tp, port=port) + list(s.extra_args)
    log_path = _unique(cells.out_dir / "logs" / f"{stem}.log")
    launched = time.monotonic()
    try:
        handle = start_server(cmd, port=port, log_path=log_path, gpus=devices, env=s.env)
    except FileNotFoundError:
        raise InputError(f"{cells.campaign.path}: [measurement] command: executable {cmd[0]!r} not found "
                         f"(for vLLM: pip install 'fleetsieve-bayes[vllm]' on the GPU node)") from None
    live.handle, live.tp, live.pool, live.devices, live.served = handle, tp, int(grid.gpu_idx[c]), devices, None
    live.gpu = grid.gpu_name(c) if grid.n_pools > 1 else ""
    ready = wait_ready(handle, s.readiness_timeout_s)
    startup_s = time.monotonic() - launched
    if ready.status != "ready":
        failure = classify_startup(ready.status, log_tail(handle.log_path))
        _stop_live(s, live)
        # A start-up failure held its GPUs for the start-up only (at least 1 ms: a row must have run).
        row = failure_row(key, float(grid.offered_rps[c]), failure, max(startup_s, 1e-3), s.seed)
        row["startup_s"] = startup_s
        row["detail"] = f"server {ready.status} after {ready.waited_s:.1f} s (log: {log_path})"
        return startup_s, cells.with_gpu(c, row)
    live.served = served_model_info(handle.url, s.served_model_name, model_path=s.model)
    return startup_s, None


def _run_cell(cells: _VllmCells, live: _LiveServer, c: int, stem: str, startup_s: float,
              replicate: int = 0) -> dict[str, Any]:
    """Replay the cell's trace (replicate ``replicate``'s stretch) against the live server;
    records go to ``raw/``."""
    s = cells.s
    w, tp, load = cells.grid.key(c)[:3]
    scale = cells.scales[c]
    handle = live.handle
    assert handle is not None
    offset = window_offset_s(cells.traces[w], scale, s.warmup_s + s.duration_s, replicate)
    spec = CellSpec(workload=w, tp=tp, load=load, scale=scale, warmup_s=s.warmup_s,
                    duration_s=s.duration_s, request_timeout_s=s.request_timeout_s,
                    seed=replicate_seed(s.seed, replicate), max_input_tokens=s.max_input_tokens,
                    max_output_tokens=s.max_output_tokens, trace_offset_s=offset)
    raw_path = _unique(cells.out_dir / "raw" / f"{stem}.parquet")
    extras: dict[str, Any] = {"workload": w, "tp": tp, "load": load, "scale": scale,
                              "warmup_s": s.warmup_s, "window_s": s.duration_s,
                              "replicate": replicate, "trace_offset_s": offset}
    if cells.grid.n_pools > 1:
        extras["gpu"] = cells.grid.gpu_name(c)
    try:
        result = measure_cell(
            handle.url, s.served_model_name, cells.traces[w], spec, served=live.served,
            alive=lambda: handle.proc.poll() is None, records_path=raw_path, record_extras=extras,
        )
    except BaseException:
        _stop_live(s, live)
        raise
    row = cells.with_gpu(c, dict(result.row))
    row["startup_s"] = startup_s
    if row["failure"] or not s.reuse_server:
        _stop_live(s, live)  # a server that failed a cell is never reused
    return row


def _safe(label: str) -> str:
    """A label as a file-name fragment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)


def _unique(path: Path) -> Path:
    """``path``, or ``path`` with ``-1``, ``-2``… when it exists (records are never overwritten)."""
    if not path.exists():
        return path
    k = 1
    while (candidate := path.with_name(f"{path.stem}-{k}{path.suffix}")).exists():
        k += 1
    return candidate


def _boolean(opts: dict[str, Any], key: str, default: bool, fail: Any) -> bool:
    v = opts.get(key, default)
    if not isinstance(v, bool):
        raise fail(key, f"expected true or false, got {v!r}")
    return v
