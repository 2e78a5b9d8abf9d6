"""Failures as observations: classification, failure rows, and the memory guard.

A cell whose server runs out of memory at start-up, never becomes ready, dies
mid-run, or serves nothing in the window (every request failed) is
*measured*: it is recorded with a failure class and counts as infeasible
(success 0, throughput 0, tails inf). Its GPU-seconds are the wall seconds it
held its GPUs. A window in which the server served some requests and failed
others is not a failure: it is a success measurement (success = succeeded /
sent, throughput and tails from the requests that succeeded). The memory guard records a
TP whose weights and minimum KV cache cannot fit on its GPUs without running
anything (``duration_s = 0`` ⇒ zero GPU-seconds).
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = [
    "STARTUP_OOM",
    "STARTUP_TIMEOUT",
    "STARTUP_EXIT",
    "DIED_MID_RUN",
    "REQUEST_ERRORS",
    "NO_SUCCESS",
    "MEMORY_GUARD",
    "TEARDOWN_ORPHANS",
    "FAILURE_CLASSES",
    "SERVER_FAILURES",
    "classify_startup",
    "classify_run",
    "failure_row",
    "memory_guard",
]

STARTUP_OOM = "startup-oom"
STARTUP_TIMEOUT = "startup-timeout"
STARTUP_EXIT = "startup-exit"
DIED_MID_RUN = "died-mid-run"
REQUEST_ERRORS = "request-errors"  # no window request succeeded; the server answered with errors
NO_SUCCESS = "no-success"  # no window request succeeded, none by a request error (all timed out)
MEMORY_GUARD = "memory-guard"
TEARDOWN_ORPHANS = "teardown-orphans"
# The server never served (it did not start, or the memory guard refused it):
# such a failure says nothing about the offered load.
SERVER_FAILURES: tuple[str, ...] = (STARTUP_OOM, STARTUP_TIMEOUT, STARTUP_EXIT, MEMORY_GUARD)
FAILURE_CLASSES: tuple[str, ...] = (
    STARTUP_OOM, STARTUP_TIMEOUT, STARTUP_EXIT, DIED_MID_RUN, REQUEST_ERRORS, NO_SUCCESS, MEMORY_GUARD,
)

# Messages of out-of-memory at vLLM start-up (PyTorch, CUDA, and vLLM's own
# check that no memory is left for the KV cache).
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
    r"|No available memory for the cache blocks|not enough (?:GPU )?memory"
    r"|larger than the available KV cache memory|insufficient (?:GPU )?memory",
    re.IGNORECASE,
)


def classify_startup(status: str, log: str) -> str:
    """Failure class of a server that did not become ready.

    Args:
        status: ``"exited"`` or ``"timeout"`` (:class:`~.server.Readiness`).
        log: the tail of the server's log.
    """
    if _OOM.search(log):
        return STARTUP_OOM  # a timeout can also be an engine stuck after an OOM in a worker
    if status == "timeout":
        return STARTUP_TIMEOUT
    return STARTUP_EXIT


def classify_run(*, server_died: bool, n_window: int, n_error: int, n_ok: int) -> str:
    """Failure class of a cell that started: ``""`` when its metrics stand as measured.

    Only a window in which the server failed carries a label: it died
    (:data:`DIED_MID_RUN`), or it served none of the window requests —
    :data:`REQUEST_ERRORS` when it answered them with errors (HTTP errors,
    broken streams: e.g. a wrong model name), :data:`NO_SUCCESS` when they all
    timed out. A window with some failed requests is a success measurement,
    whatever the share: failed requests (errors and timeouts alike) lower
    ``success_rate``, and throughput and tails come from the requests that
    succeeded.
    """
    if server_died:
        return DIED_MID_RUN
    if n_window and n_ok == 0:
        return REQUEST_ERRORS if n_error else NO_SUCCESS
    return ""


def failure_row(key: tuple[str, int, str], offered_rps: float, failure: str, duration_s: float,
                seed: int) -> dict[str, Any]:
    """Table row of a failed cell: infeasible by every metric."""
    workload, tp, load = key
    return {
        "workload": workload,
        "tp": int(tp),
        "load": load,
        "offered_rps": float(offered_rps),
        "throughput_rps": 0.0,
        "ttft_p99_s": math.inf,
        "completion_p99_s": math.inf,
        "success_rate": 0.0,
        "duration_s": float(duration_s),
        "seed": int(seed),
        "failure": failure,
    }


def memory_guard(
    tp: int,
    *,
    model_size_gb: float | None,
    gpu_memory_gb: float | None,
    kv_cache_gb_min: float = 0.0,
    gpu_memory_utilization: float = 0.9,
) -> str | None:
    """Why TP ``tp`` cannot fit, or None when it fits (or the sizes are unknown).

    Weights are sharded evenly over ``tp`` GPUs; each GPU must also hold at
    least ``kv_cache_gb_min`` of KV cache inside the fraction
    ``gpu_memory_utilization`` of its memory that vLLM may use.
    """
    if model_size_gb is None or gpu_memory_gb is None:
        return None
    need = model_size_gb / tp + kv_cache_gb_min
    have = gpu_memory_gb * gpu_memory_utilization
    if need > have:
        return (f"weights {model_size_gb:g} GB / TP{tp} + KV cache {kv_cache_gb_min:g} GB = {need:.1f} GB "
                f"> {have:.1f} GB usable per GPU")
    return None
