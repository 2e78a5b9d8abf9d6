"""One replica of a serving configuration, started for the vLLM backend's cells.

An aggregated configuration (:class:`~fleetsieve_bayes.configs.ServingConfig`
with ``tp``) is one engine on ``tp`` devices. A disaggregated one is
``prefill.workers`` prefill engines and ``decode.workers`` decode engines, each
on ``tp`` devices of its own (prefill workers first, in the order of the
devices given), each with ``--kv-transfer-config`` naming its role
(``kv_producer`` for prefill, ``kv_consumer`` for decode), behind the router
of :mod:`.router`, which is what the load generator then talks to. With the
connector :data:`RECOMPUTE` (``"none"``) no engine gets a KV-transfer config:
the prefill worker computes the prompt and the decode worker computes it again
(for a build of vLLM where no connector runs, e.g. the CPU build without NIXL).

Every engine's command is the campaign's template (``{model}``, ``{tp}`` with
the engine's TP, ``{port}``), then ``extra_args``, then the configuration's
engine arguments as flags (:func:`engine_flags`; last, so that they win over
the same flag in ``extra_args``). A disaggregated engine also gets its own
``VLLM_NIXL_SIDE_CHANNEL_PORT`` (a free block of ``tp`` ports: NIXL's
handshake listens there, one port per TP rank; two workers on one node must
not share it), as vLLM's NIXL examples give each instance; not with
:data:`RECOMPUTE`.

Every process, the router included, is started by
:func:`.server.start_server`, so it dies with the campaign (SIGKILL included:
:mod:`.lifeline`). Each log starts with the command it ran (``$ …``).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from fleetsieve_bayes.backends.server import (
    HOST,
    Readiness,
    ServerHandle,
    free_port,
    probe,
    render_command,
    start_server,
)
from fleetsieve_bayes.configs import KV_RECOMPUTE, ServingConfig

__all__ = [
    "KV_ROLES",
    "RECOMPUTE",
    "EngineSpec",
    "Part",
    "Launch",
    "Started",
    "engine_flags",
    "kv_transfer_config",
    "replica_engines",
    "engine_command",
    "router_command",
    "start_replica",
    "wait_all",
    "error_line",
]

# The kv_role of each role's engines.
KV_ROLES: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
# The ``kv_connector`` that means no KV transfer: the decode worker recomputes the prompt.
RECOMPUTE = KV_RECOMPUTE


def engine_flags(engine: Iterable[tuple[str, Any]]) -> list[str]:
    """vLLM command-line flags of engine arguments: ``max_num_seqs = 8`` → ``--max-num-seqs 8``;
    ``true`` → ``--name``, ``false`` → ``--no-name`` (vLLM's boolean flags)."""
    out: list[str] = []
    for name, value in engine:
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


def kv_transfer_config(connector: str, kv_role: str, extra: dict[str, Any] | None = None) -> str:
    """The ``--kv-transfer-config`` JSON of one engine of a disaggregated replica."""
    config: dict[str, Any] = {"kv_connector": connector, "kv_role": kv_role}
    if extra is not None:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config, separators=(",", ":"))


class EngineSpec(NamedTuple):
    """One engine of a replica: its role (``engine``, ``prefill`` or ``decode``), its index in
    the role, its TP and devices."""

    role: str
    index: int
    tp: int
    devices: tuple[int, ...]

    @property
    def label(self) -> str:
        """``server`` (an aggregated replica's one engine) or ``prefill worker 0``, …"""
        return "server" if self.role == "engine" else f"{self.role} worker {self.index}"

    @property
    def suffix(self) -> str:
        """Its log file's suffix: ``""``, ``_prefill0``, …"""
        return "" if self.role == "engine" else f"_{self.role}{self.index}"


def replica_engines(config: ServingConfig, devices: Sequence[int]) -> list[EngineSpec]:
    """The engines of one replica of ``config`` on ``devices`` (at least ``config.gpus`` of them).

    Raises:
        ValueError: fewer devices than the replica's GPUs.
    """
    if len(devices) < config.gpus:
        raise ValueError(f"configuration {config.name!r} needs {config.gpus} devices, got {list(devices)}")
    if not config.disaggregated:
        assert config.tp is not None
        return [EngineSpec("engine", 0, config.tp, tuple(devices[: config.tp]))]
    out, at = [], 0
    for role, r in (("prefill", config.prefill), ("decode", config.decode)):
        assert r is not None
        for i in range(r.workers):
            out.append(EngineSpec(role, i, r.tp, tuple(devices[at : at + r.tp])))
            at += r.tp
    return out


class Launch(NamedTuple):
    """What starting an engine needs from the campaign (``[measurement]``)."""

    command: tuple[str, ...]
    model: str
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    kv_connector: str = "NixlConnector"
    kv_connector_extra_config: dict[str, Any] | None = None
    readiness_timeout_s: float = 1800.0


def engine_command(config: ServingConfig, engine: EngineSpec, launch: Launch, port: int) -> list[str]:
    """The argument list of one engine: template, ``extra_args``, engine flags, KV-transfer config
    (a disaggregated engine's, unless the connector is :data:`RECOMPUTE`)."""
    cmd = render_command(launch.command, model=launch.model, tp=engine.tp, port=port)
    cmd += [*launch.extra_args, *engine_flags(config.engine)]
    if engine.role in KV_ROLES and launch.kv_connector != RECOMPUTE:
        cmd += ["--kv-transfer-config",
                kv_transfer_config(launch.kv_connector, KV_ROLES[engine.role], launch.kv_connector_extra_config)]
    return cmd


def router_command(port: int, prefill: Sequence[str], decode: Sequence[str]) -> list[str]:
    """The router's argument list (this interpreter, ``-m fleetsieve_bayes.backends.router``)."""
    return [sys.executable, "-m", "fleetsieve_bayes.backends.router", "--port", str(port),
            "--prefill", *prefill, "--decode", *decode]


class Part(NamedTuple):
    """One started process of a replica: ``label`` (``server``, ``prefill worker 0``, …,
    ``router``), its handle and the devices it holds."""

    label: str
    handle: ServerHandle
    devices: tuple[int, ...] = ()


class Started(NamedTuple):
    """A replica's start: every process started (engines in order, the router last), the one
    requests go to (None when the start failed), and the process that failed and how."""

    parts: tuple[Part, ...]
    entry: Part | None
    failed: Part | None = None
    readiness: Readiness | None = None


def _port_block(n: int, taken: set[int]) -> int:
    """A port p with p … p+n-1 free on this host now and none in ``taken``."""
    for _ in range(200):
        p = free_port()
        block = range(p, p + n)
        if p + n <= 65536 and not taken.intersection(block) and all(_free(q) for q in block[1:]):
            return p
    raise OSError(f"no block of {n} free ports found")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _start(cmd: list[str], port: int, log: Path, devices: tuple[int, ...] | None,
           env: dict[str, str] | None) -> ServerHandle:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
    return start_server(cmd, port=port, log_path=log, gpus=devices, env=env)


def start_replica(config: ServingConfig, devices: Sequence[int], launch: Launch,
                  log_for: Callable[[str], Path], parts: list[Part]) -> Started:
    """Start one replica of ``config`` and wait until it is ready (every engine's ``/health``,
    then the router's), or until one of its processes exits or the start-up limit passes.

    ``log_for(suffix)``: the log file of the process whose log suffix is ``suffix``
    (:attr:`EngineSpec.suffix`, ``_router``). ``parts``: each process is appended as soon
    as it is started, so that the caller, who stops them, knows every one of them even
    when this raises.

    Raises:
        FileNotFoundError: the command's executable is not found.
    """
    start = time.monotonic()
    taken: set[int] = set()
    for e in replica_engines(config, devices):
        port = free_port()
        env = dict(launch.env)
        if e.role in KV_ROLES and launch.kv_connector != RECOMPUTE:
            side = _port_block(e.tp, taken | {port})
            taken.update(range(side, side + e.tp))
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side)
        taken.add(port)
        cmd = engine_command(config, e, launch, port)
        parts.append(Part(e.label, _start(cmd, port, log_for(e.suffix), e.devices, env), e.devices))
    engines = list(parts)
    failed, ready = wait_all(engines, launch.readiness_timeout_s)
    if failed is not None or not config.disaggregated:
        return Started(tuple(parts), None if failed is not None else parts[0], failed, ready)
    port = free_port()
    cmd = router_command(port, [p.handle.url for p in engines if p.label.startswith("prefill")],
                         [p.handle.url for p in engines if p.label.startswith("decode")])
    router = Part("router", _start(cmd, port, log_for("_router"), None, None))
    parts.append(router)
    left = max(launch.readiness_timeout_s - (time.monotonic() - start), 10.0)
    failed, ready = wait_all([router], left)
    return Started(tuple(parts), None if failed is not None else router, failed, ready)


def wait_all(parts: Sequence[Part], timeout_s: float, *, poll_s: float = 0.25) -> tuple[Part | None, Readiness]:
    """Poll every part's ``/health`` until all answer 200: ``(None, ready)``; or
    ``(the part, exited)`` as soon as one exits, ``(a part not ready, timeout)`` after
    ``timeout_s`` (as :func:`.server.wait_ready`, for several processes at once)."""
    start = time.monotonic()
    pending = list(parts)
    while True:
        for p in list(pending):
            rc = p.handle.proc.poll()
            if rc is not None:
                return p, Readiness("exited", time.monotonic() - start, rc)
            if probe(p.handle.url + "/health", timeout_s=min(2.0, max(poll_s, 0.5))) == 200:
                pending.remove(p)
        if not pending:
            return None, Readiness("ready", time.monotonic() - start, None)
        if time.monotonic() - start > timeout_s:
            return pending[0], Readiness("timeout", time.monotonic() - start, None)
        time.sleep(poll_s)


_ERROR = re.compile(r"error|exception|unrecognized|invalid", re.IGNORECASE)


def error_line(log: str, limit: int = 300) -> str:
    """The last line of a log tail that reads like an error (``""`` when none), shortened."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        if line and _ERROR.search(line) and not line.startswith("$ "):
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""
