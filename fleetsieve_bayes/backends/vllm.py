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
``tp``                    TP candidates, e.g. ``[2, 4, 8]`` (required without
                          ``[[configs]]``; refused with them: the catalogue
                          gives each cell's layout)
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
                          needs the same server (same TP and pool; with
                          ``[[configs]]`` the same configuration, layout and
                          engine arguments, and pool; command, arguments and
                          environment are the campaign's) instead of
                          restarting it (default true)
``kv_connector``          a disaggregated configuration's KV connector, its
                          engines' ``kv_connector`` (default
                          ``"NixlConnector"``); ``"none"``: no KV transfer,
                          the decode worker recomputes the prompt (for a
                          vLLM build where no connector runs, e.g. the CPU
                          build without the ``nixl`` package)
``kv_connector_extra_config`` table handed to the connector as
                          ``kv_connector_extra_config`` (default none;
                          refused with ``kv_connector = "none"``)
========================  =====================================================

**A catalogue of configurations** (``[[configs]]``, docs/contracts.md
"Configurations"): the cells are workloads × configurations × loads (× pools),
in the catalogue's order, and each configuration's replica must fit ``gpus``
(every pool's). A cell's row names its ``config`` and its ``tp`` is the GPUs of
one replica (GPU-seconds = ``duration_s × tp`` count every GPU of it, as
:func:`fleetsieve_bayes.configs.resolve_configs` reads a table). An aggregated
configuration is one engine on ``tp`` of the pool's devices with its engine
arguments as flags; a disaggregated one is its prefill and decode workers on
distinct devices behind the project's router (:mod:`.replica`,
:mod:`.router`). A start-up failure of any of its processes (an engine
argument vLLM rejects included: ``startup-exit``) or one dying mid-window is a
failed observation of the configuration whose ``detail`` names the
configuration and the process (``server``, ``prefill worker 0``,
``decode worker 0``, ``router``).

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
``<workload>_<gpu>_tp<tp>_…`` with several pools; ``<workload>_<config>_…``
with a catalogue), server logs to ``OUT/logs/`` (a disaggregated replica's:
``…_prefill0.log``, ``…_decode0.log``, ``…_router.log``), each starting with
the command it ran.

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

import concurrent.futures as cf
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
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
from fleetsieve_bayes.backends.replica import RECOMPUTE, Launch, Part, error_line, start_replica
from fleetsieve_bayes.backends.server import (
    DEFAULT_COMMAND,
    ServerHandle,
    log_tail,
    probe,
    render_command,
    stop_server,
)
from fleetsieve_bayes.backends.traces import (
    Trace,
    read_trace,
    replicate_seed,
    window_offset_s,
    window_rate,
)
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.configs import ServingConfig
from fleetsieve_bayes.errors import InputError, MeasurementError

__all__ = ["VllmSettings", "VLLM_KEYS", "parse_vllm_options", "make_vllm_backend"]

VLLM_KEYS: frozenset[str] = frozenset({
    "model", "served_model_name", "command", "extra_args", "env", "gpus", "tp", "loads", "traces",
    "trace_format", "warmup_s", "duration_s", "readiness_timeout_s", "request_timeout_s",
    "stop_timeout_s", "model_size_gb", "gpu_memory_gb", "kv_cache_gb_min", "gpu_memory_utilization",
    "max_input_tokens", "max_output_tokens", "request_error_tolerance", "seed", "reuse_server",
    "kv_connector", "kv_connector_extra_config",
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
    # The campaign's [[configs]] (None: each TP candidate is its own aggregated configuration).
    configs: tuple[ServingConfig, ...] | None = None
    kv_connector: str = "NixlConnector"
    kv_connector_extra_config: dict[str, Any] | None = None


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
    configs = campaign.configs
    tps, widest = _layouts(o, configs)
    gpus, pool_devices = _gpu_pools(o, widest)
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
        configs=configs,
        kv_connector=_kv_connector(o),
        kv_connector_extra_config=_extra_config(o),
    )


def _kv_connector(o: _Options) -> str:
    """``kv_connector``: a connector's name, or ``"none"`` (recompute), which takes no extra config."""
    connector = o.string("kv_connector", "NixlConnector").strip()
    if connector.lower() == RECOMPUTE:
        if o.opts.get("kv_connector_extra_config") is not None:
            raise o.fail("kv_connector_extra_config", 'kv_connector = "none" transfers no KV cache: '
                                                      "there is no connector to hand this table to")
        return RECOMPUTE
    return connector


def _layouts(o: _Options, configs: tuple[ServingConfig, ...] | None) -> tuple[tuple[int, ...], tuple[str, int]]:
    """``(the engines' TP degrees, (the widest replica's name, its GPUs))``: the ``tp``
    candidates, or with a catalogue its configurations (``tp`` is then refused)."""
    if configs is None:
        tps = _tp_candidates(o)
        return tps, (f"TP{max(tps)}", max(tps))
    if "tp" in o.opts:
        raise o.fail("tp", "the campaign's [[configs]] give each cell's layout (tp, or prefill and decode); "
                           "remove [measurement] tp")
    tps = sorted({t for c in configs for t in _engine_tps(c)})
    widest = max(configs, key=lambda c: c.gpus)
    return tuple(tps), (f"configuration {widest.name!r}", widest.gpus)


def _engine_tps(config: ServingConfig) -> tuple[int, ...]:
    """The TP of each engine kind of a configuration (its one engine, or each role's)."""
    if config.prefill is not None and config.decode is not None:
        return (config.prefill.tp, config.decode.tp)
    assert config.tp is not None
    return (config.tp,)


def _extra_config(o: _Options) -> dict[str, Any] | None:
    """``kv_connector_extra_config``: a table that JSON can carry, or None."""
    raw = o.opts.get("kv_connector_extra_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise o.fail("kv_connector_extra_config", f"expected a table, got {raw!r}")
    try:
        json.dumps(raw, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise o.fail("kv_connector_extra_config", f"not expressible as JSON ({exc})") from None
    return dict(raw)


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


def _gpu_pools(o: _Options, widest: tuple[str, int]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """``(every device id, each pool's device ids)``: with two or more ``[[fleet.pools]]``
    ``gpus`` is a table GPU type → device ids, else a list (each pool's ids are then ``()``).
    ``widest``: the widest replica (its name, its GPUs), which every pool must hold."""
    names = o.campaign.pool_names
    if names is None or len(names) < 2:
        raw = o.opts.get("gpus")
        if isinstance(raw, dict):
            raise o.fail("gpus", f"a table of GPU types needs two or more [[fleet.pools]]; expected a list of "
                                 f"device ids, e.g. [0, 1], got {raw!r}")
        return _gpu_pool(o, widest), ()
    per_pool = _pool_device_table(o, names, widest)
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


def _pool_device_table(o: _Options, names: tuple[str, ...], widest: tuple[str, int]) -> tuple[tuple[int, ...], ...]:
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
        if widest[1] > len(ids):
            raise o.fail(where, f"{widest[0]} needs {widest[1]} GPUs but pool {names[j]!r} has {len(ids)}")
        ids_of[j] = tuple(ids)
        owner.update(dict.fromkeys(ids, names[j]))
    for j, n in enumerate(names):
        if j not in ids_of:
            raise o.fail(f"gpus.{n}", f"missing: pool {n!r} has no device ids (one entry per [[fleet.pools]])")
    return tuple(ids_of[j] for j in range(len(names)))


def _gpu_pool(o: _Options, widest: tuple[str, int]) -> tuple[int, ...]:
    """The GPU ids to launch on (default 0..n-1 for the widest replica's n GPUs); it must fit."""
    gpus_raw = o.opts.get("gpus", list(range(widest[1])))
    if (not isinstance(gpus_raw, list) or not gpus_raw
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus_raw)
            or len(set(gpus_raw)) != len(gpus_raw)):
        raise o.fail("gpus", f"expected a list of distinct GPU ids (integers >= 0), got {gpus_raw!r}")
    if widest[1] > len(gpus_raw):
        raise o.fail("gpus", f"{widest[0]} needs {widest[1]} GPUs but the pool has {len(gpus_raw)}")
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
    """The running replica (at most one): reused by the next cell of the same configuration
    (TP, or layout and engine arguments) and pool."""

    handle: ServerHandle | None = None  # what requests go to: the engine, or a disaggregated replica's router
    parts: list[Part] = field(default_factory=list)  # every process of the replica, as started
    key: Any = None  # (configuration layout, pool index)
    what: str = ""  # the configuration, for messages: "TP2" or "configuration 'agg-s8'"
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
        """Device ids of cell ``c``'s pool (its replica uses the first ones: TP, or its GPUs)."""
        if self.grid.n_pools > 1:
            return self.s.pool_devices[int(self.grid.gpu_idx[c])]
        return self.s.gpus

    def with_gpu(self, c: int, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with cell ``c``'s GPU type in ``gpu`` when the grid has several pools."""
        if self.grid.n_pools > 1:
            row["gpu"] = self.grid.gpu_name(c)
        return row

    def with_config(self, c: int, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with cell ``c``'s configuration in ``config`` when the campaign has a catalogue."""
        if self.grid.catalogued:
            row["config"] = self.grid.serving_config(c).name
        return row

    def failed_row(self, c: int, failure: str, duration_s: float) -> dict[str, Any]:
        """A failed observation of cell ``c`` (its ``tp``: the GPUs of one replica)."""
        w, _, load = self.grid.key(c)[:3]
        row = failure_row((w, int(self.grid.tp[c]), load), float(self.grid.offered_rps[c]), failure,
                          duration_s, self.s.seed)
        return self.with_gpu(c, self.with_config(c, row))

    def named(self, c: int, text: str) -> str:
        """``text`` prefixed with cell ``c``'s configuration when the campaign has a catalogue."""
        return f"configuration {self.grid.serving_config(c).name!r}: {text}" if self.grid.catalogued else text


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
    """The candidate cells (workload × pool × configuration × load) and each cell's arrival scale.

    One pool: no GPU axis (``gpu`` None). Several: ``pools`` are the campaign's GPU types.
    Without a catalogue each TP candidate is a configuration; with one, its entries
    (``configs``; ``tp`` is each replica's GPUs). Sorted as
    :func:`~fleetsieve_bayes.allocation.problem.grid_from_table` sorts a table:
    workload, pool, TP or catalogue entry, offered load, load label.
    """
    horizon = s.warmup_s + s.duration_s
    pools = campaign.pool_names if s.pool_devices else None
    layouts = s.configs if s.configs is not None else tuple(ServingConfig(name=f"TP{t}", tp=t) for t in s.tp)
    offered_of: dict[tuple[str, str], float] = {}
    for w in campaign.workload_names:
        for label, scale in s.loads:
            offered = window_rate(traces[w], scale, s.warmup_s, s.duration_s)
            if offered <= 0:
                raise InputError(
                    f"{campaign.path}: [measurement] loads.{label}: trace {s.traces[w]} has no arrival in "
                    f"the {s.duration_s:g} s window at scale {scale:g} (cell {w} {layouts[0].name}@{label})"
                )
            offered_of[(w, label)] = offered
    cells = []  # (workload index, pool index, configuration index, GPUs, load label, scale, offered)
    for wi, w in enumerate(campaign.workload_names):
        for g in range(len(pools) if pools else 1):
            for j, cfg in enumerate(layouts):
                for label, scale in s.loads:
                    cells.append((wi, g, j, cfg.gpus, label, scale, offered_of[(w, label)]))
    cells.sort(key=lambda c: (c[0], c[1], c[2], c[6], c[4]))  # the order of problem.grid_from_table
    grid = CellGrid(
        workloads=campaign.workload_names,
        workload_idx=np.array([c[0] for c in cells], dtype=np.int64),
        tp=np.array([c[3] for c in cells], dtype=np.int64),
        load=tuple(c[4] for c in cells),
        offered_rps=np.array([c[6] for c in cells], dtype=np.float64),
        duration_s=np.full(len(cells), horizon, dtype=np.float64),
        gpu=None if pools is None else np.array([c[1] for c in cells], dtype=np.int64),
        pools=(DEFAULT_POOL,) if pools is None else tuple(pools),
        config=None if s.configs is None else np.array([c[2] for c in cells], dtype=np.int64),
        configs=s.configs,
    )
    return grid, [c[5] for c in cells]


def _preflight(cells: _VllmCells, c: int) -> dict[str, Any] | None:
    """The memory guard's row (0 GPU-seconds) for a configuration one of whose engines cannot
    hold the model on cell ``c``'s pool, else None."""
    s, grid = cells.s, cells.grid
    cfg = grid.serving_config(c)
    memory = cells.pool_memory_gb[int(grid.gpu_idx[c])]
    util = cfg.engine_args.get("gpu_memory_utilization", s.gpu_memory_utilization)
    if isinstance(util, bool) or not isinstance(util, (int, float)):
        util = s.gpu_memory_utilization
    roles = (("prefill: ", cfg.prefill.tp), ("decode: ", cfg.decode.tp)) if (
        cfg.prefill is not None and cfg.decode is not None) else (("", int(grid.tp[c])),)
    for role, tp in roles:
        why = cells.card_infeasible.get(tp)
        if why is None:
            why = memory_guard(
                tp, model_size_gb=s.model_size_gb, gpu_memory_gb=memory,
                kv_cache_gb_min=s.kv_cache_gb_min, gpu_memory_utilization=float(util))
            if why is not None and s.gpu_memory_gb is None:
                pool = cells.campaign.pools[int(grid.gpu_idx[c])]
                why += f" ({pool.gpu}: {memory:g} GB per GPU, its GPU spec's memory_gb)"
        if why is not None:
            row = cells.failed_row(c, MEMORY_GUARD, 0.0)
            row["startup_s"] = 0.0
            row["detail"] = cells.named(c, role + why)
            return row
    return None


def _stop_live(s: VllmSettings, live: _LiveServer) -> None:
    """Stop every process of the live replica (all at once); forget it.

    Raises:
        MeasurementError: a process survived SIGKILL, naming it and the GPUs it may hold.
    """
    parts, what, gpu = list(live.parts), live.what, live.gpu
    live.handle, live.parts, live.key, live.what, live.pool = None, [], None, "", None
    live.devices, live.gpu, live.served = (), "", None
    if not parts:
        return

    def stop(part: Part) -> set[int]:
        return stop_server(part.handle, grace_s=s.stop_timeout_s)

    if len(parts) == 1:
        lefts = [stop(parts[0])]
    else:
        with cf.ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="fleetsieve-stop") as pool:
            lefts = list(pool.map(stop, parts))
    on = f" on {gpu}" if gpu else ""
    problems = [
        f"server on port {p.handle.port} ({what if p.label == 'server' else f'{what} {p.label}'}{on}): "
        f"processes {sorted(left)} survived SIGKILL "
        f"({f'GPUs {list(p.devices)} may still be held' if p.devices else 'it holds no GPU'})"
        for p, left in zip(parts, lefts, strict=True) if left
    ]
    if problems:
        raise MeasurementError("; ".join(problems))


def _server_key(cells: _VllmCells, c: int) -> tuple[Any, int]:
    """What a replica serving cell ``c`` is: its configuration's layout and engine arguments, and its pool."""
    return cells.grid.serving_config(c).layout, int(cells.grid.gpu_idx[c])


def _reusable(cells: _VllmCells, live: _LiveServer, c: int) -> bool:
    handle = live.handle
    return (cells.s.reuse_server and handle is not None and live.key == _server_key(cells, c)
            and all(p.handle.proc.poll() is None for p in live.parts)
            and probe(handle.url + "/health", timeout_s=5.0) == 200)


def _measure(cells: _VllmCells, live: _LiveServer, c: int, replicate: int = 0) -> dict[str, Any]:
    """One window of a cell: the guard's row, a start-up failure's row, or the measured row."""
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 0:
        raise ValueError(f"replicate must be an integer >= 0, got {replicate!r}")
    guarded = _preflight(cells, c)
    if guarded is not None:
        return guarded
    grid = cells.grid
    w, conf, load = grid.key(c)[:3]
    rep = f"_r{replicate}" if replicate else ""
    on = f"{_safe(grid.gpu_name(c))}_" if grid.n_pools > 1 else ""
    layout = _safe(str(conf)) if grid.catalogued else f"tp{conf}"
    stem = f"{_safe(w)}_{on}{layout}_{_safe(load)}{rep}_{time.strftime('%Y%m%dT%H%M%S')}"
    startup_s = 0.0
    if not _reusable(cells, live, c):
        startup_s, failed = _launch(cells, live, c, stem)
        if failed is not None:
            return failed
    return _run_cell(cells, live, c, stem, startup_s, replicate)


def _launch(cells: _VllmCells, live: _LiveServer, c: int, stem: str) -> tuple[float, dict[str, Any] | None]:
    """Replace the live replica with one of cell ``c``'s configuration on its pool's devices:
    ``(startup_s, failure row or None)``."""
    s, grid = cells.s, cells.grid
    cfg = grid.serving_config(c)
    devices = cells.devices(c)[: cfg.gpus]
    _stop_live(s, live)
    live.key, live.pool, live.devices = _server_key(cells, c), int(grid.gpu_idx[c]), devices
    live.what = f"configuration {cfg.name!r}" if grid.catalogued else f"TP{cfg.tp}"
    live.gpu = grid.gpu_name(c) if grid.n_pools > 1 else ""
    launch = Launch(command=s.command, model=s.model, extra_args=s.extra_args, env=s.env,
                    kv_connector=s.kv_connector, kv_connector_extra_config=s.kv_connector_extra_config,
                    readiness_timeout_s=s.readiness_timeout_s)
    launched = time.monotonic()
    try:
        started = start_replica(cfg, devices, launch, partial(_log_for, cells.out_dir, stem), live.parts)
    except FileNotFoundError:
        _stop_live(s, live)
        raise InputError(f"{cells.campaign.path}: [measurement] command: executable {s.command[0]!r} not found "
                         f"(for vLLM: pip install 'fleetsieve-bayes[vllm]' on the GPU node)") from None
    startup_s = time.monotonic() - launched
    if started.entry is None:
        failed, ready = started.failed, started.readiness
        assert failed is not None and ready is not None
        tail = log_tail(failed.handle.log_path)
        _stop_live(s, live)
        # A start-up failure held its GPUs for the start-up only (at least 1 ms: a row must have run).
        row = cells.failed_row(c, classify_startup(ready.status, tail), max(startup_s, 1e-3))
        row["startup_s"] = startup_s
        err = error_line(tail)
        row["detail"] = cells.named(c, f"{failed.label} {ready.status} after {ready.waited_s:.1f} s"
                                       + (f": {err}" if err else "") + f" (log: {failed.handle.log_path})")
        return startup_s, row
    live.handle = started.entry.handle
    # What is served is asked of an engine (the router only routes): the server, or a decode worker.
    engine = next(p for p in started.parts if p.label == "server" or p.label.startswith("decode"))
    live.served = served_model_info(engine.handle.url, s.served_model_name, model_path=s.model)
    return startup_s, None


def _log_for(out_dir: Path, stem: str, suffix: str) -> Path:
    """A new log file of one process of a replica (``suffix``: ``""``, ``_prefill0``, ``_router``…)."""
    return _unique(out_dir / "logs" / f"{stem}{suffix}.log")


def _run_cell(cells: _VllmCells, live: _LiveServer, c: int, stem: str, startup_s: float,
              replicate: int = 0) -> dict[str, Any]:
    """Replay the cell's trace (replicate ``replicate``'s stretch) against the live replica;
    records go to ``raw/``."""
    s, grid = cells.s, cells.grid
    w, _, load = grid.key(c)[:3]
    tp = int(grid.tp[c])  # the GPUs of one replica
    scale = cells.scales[c]
    handle = live.handle
    assert handle is not None
    parts = tuple(live.parts)
    offset = window_offset_s(cells.traces[w], scale, s.warmup_s + s.duration_s, replicate)
    spec = CellSpec(workload=w, tp=tp, load=load, scale=scale, warmup_s=s.warmup_s,
                    duration_s=s.duration_s, request_timeout_s=s.request_timeout_s,
                    seed=replicate_seed(s.seed, replicate), max_input_tokens=s.max_input_tokens,
                    max_output_tokens=s.max_output_tokens, trace_offset_s=offset)
    raw_path = _unique(cells.out_dir / "raw" / f"{stem}.parquet")
    extras: dict[str, Any] = cells.with_gpu(c, cells.with_config(c, {
        "workload": w, "tp": tp, "load": load, "scale": scale, "warmup_s": s.warmup_s, "window_s": s.duration_s,
        "replicate": replicate, "trace_offset_s": offset}))
    try:
        result = measure_cell(
            handle.url, s.served_model_name, cells.traces[w], spec, served=live.served,
            alive=lambda: all(p.handle.proc.poll() is None for p in parts), records_path=raw_path,
            record_extras=extras,
        )
    except BaseException:
        _stop_live(s, live)
        raise
    row = cells.with_gpu(c, cells.with_config(c, dict(result.row)))
    row["startup_s"] = startup_s
    dead = [p for p in parts if p.handle.proc.poll() is not None]
    if row["failure"] and dead:  # name the process that died (a disaggregated replica has several)
        died = "; ".join(f"{p.label} (port {p.handle.port}) died mid-window (exit code {p.handle.proc.returncode}; "
                         f"log: {p.handle.log_path})" for p in dead)
        row["detail"] = cells.named(c, died) + (f"; {row['detail']}" if row.get("detail") else "")
    if row["failure"] or not s.reuse_server:
        _stop_live(s, live)  # a replica that failed a cell is never reused
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
