"""The argument list of one replica's ``vllm serve``, from the campaign's server template.

With a catalogue of configurations (docs/contracts.md, "Configurations") a
worker's command also carries its configuration's engine arguments as vLLM
flags (:func:`engine_flags`, after ``extra_args`` so that they win over the
same flag there) and, for a worker of a disaggregated replica, its
``--kv-transfer-config`` (:func:`kv_transfer_config`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from fleetsieve_bayes.backends.server import render_command
from fleetsieve_bayes.errors import InputError

__all__ = ["KV_ROLES", "replica_command", "engine_flags", "kv_transfer_config", "worker_command"]

# The kv_role of each role's workers (vLLM's KVTransferConfig: the prefill worker produces
# the KV cache, the decode worker consumes it).
KV_ROLES: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def replica_command(template: Sequence[str], extra_args: Sequence[str], *, model: str, tp: int, port: int) -> list[str]:
    """The argument list of one replica: ``template`` filled, then ``extra_args``.

    Raises:
        InputError: the template names a placeholder other than ``{model}``, ``{tp}``, ``{port}``.
    """
    try:
        return render_command(list(template), model=model, tp=tp, port=port) + list(extra_args)
    except ValueError as exc:
        raise InputError(f"[measurement] command: {exc}") from None


def engine_flags(engine: Iterable[tuple[str, Any]]) -> list[str]:
    """vLLM flags of engine arguments (``EngineArgs`` names): ``max_num_seqs = 256`` →
    ``--max-num-seqs 256``; a boolean ``true`` → ``--name``, ``false`` → ``--no-name``
    (vLLM's boolean flags, e.g. ``--no-enable-prefix-caching``)."""
    out: list[str] = []
    for name, value in engine:
        flag = str(name).replace("_", "-")
        if isinstance(value, bool):
            out.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            out += [f"--{flag}", str(value)]
    return out


def kv_transfer_config(connector: str, kv_role: str) -> str:
    """The ``--kv-transfer-config`` JSON of one worker of a disaggregated replica."""
    return json.dumps({"kv_connector": connector, "kv_role": kv_role}, separators=(",", ":"))


def worker_command(
    template: Sequence[str],
    extra_args: Sequence[str],
    *,
    model: str,
    tp: int,
    port: int,
    engine: Iterable[tuple[str, Any]] = (),
    kv: tuple[str, str] | None = None,
    ensure_tp: bool = False,
) -> list[str]:
    """One worker's argument list: :func:`replica_command`, ``--tensor-parallel-size`` where
    ``ensure_tp`` and the template lacks it, the engine flags, then ``--kv-transfer-config``
    for ``kv = (connector, kv_role)``."""
    argv = replica_command(template, extra_args, model=model, tp=tp, port=port)
    if ensure_tp and "--tensor-parallel-size" not in argv and "-tp" not in argv:
        argv += ["--tensor-parallel-size", str(tp)]
    argv += engine_flags(engine)
    if kv is not None:
        argv += ["--kv-transfer-config", kv_transfer_config(*kv)]
    return argv
