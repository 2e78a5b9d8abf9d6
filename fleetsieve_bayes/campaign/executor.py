"""Where cells run when a campaign measures several at once: executors and the GPU pool.

An :class:`Executor` is a NamedTuple of functions (``submit`` / ``wait_any`` /
``cancel`` / ``now`` / ``close``), not a class hierarchy. Two kinds:

- :func:`local_executor`: threads on this machine. With the replay backend
  (and no ``time_scale``) it runs on a **simulated clock**: replayed
  measurements are instant, so each cell is held to finish at
  ``start_s + duration_s (+ startup_s)`` of its row, and ``wait_any`` hands
  back the cells in order of that simulated finish time (ties: submission
  order), all cells finishing at the same instant together. The campaign's
  decisions then depend only on the seed, never on thread timing.
  Otherwise it runs on the real clock, each cell in its own thread with its
  own backend (for vLLM: a server on the GPUs the pool assigned).
- :func:`ray_executor`: each cell is a Ray task requesting ``num_gpus = tp``;
  Ray places it on a node that has them and the backend is built inside the
  task, on that node (the vLLM backend's GPU pool is the GPUs Ray assigned
  to the task). Replay runs anywhere. Real clock.

Times are on the **campaign clock**: seconds of profiling, continued across
resumes (``offset_s`` is where the previous invocation's clock stopped), so
the makespan excludes the time a campaign was not running.

:class:`GpuPool` packs cells into the profiling pool: a TP-``t`` cell takes an
aligned block of ``t`` free GPUs when one exists (buddy-style, which keeps
room for the large cells), any ``t`` free GPUs otherwise; a cell that does
not fit waits. With Ray the pool is an accounting of how many GPUs are in use
(Ray chooses the node); the ids are slots, not device numbers.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from fleetsieve_bayes.errors import InputError

__all__ = [
    "Job",
    "Done",
    "Executor",
    "GpuPool",
    "occupancy_s",
    "local_executor",
    "ray_executor",
    "cell_runner",
]


class Job(NamedTuple):
    """One cell submitted to an executor."""

    cell: int
    tp: int
    gpus: tuple[int, ...]  # slots of the profiling pool
    start_s: float  # campaign clock
    seq: int  # submission order (breaks ties of the simulated clock)
    replicate: int = 0  # the cell's window to measure (0 first, 1, … repeats)


class Done(NamedTuple):
    """A finished cell: its row, or the error that stopped its harness."""

    job: Job
    row: dict[str, Any] | None
    error: str | None
    finish_s: float  # campaign clock
    started_at: float  # Unix seconds, real
    finished_at: float
    info: dict[str, Any]  # where it ran (node, device ids), for the journal


class Executor(NamedTuple):
    """How cells run.

    Attributes:
        submit: ``submit(job)`` starts ``job.cell`` on ``job.gpus``; returns at once.
        wait_any: blocks until at least one submitted cell finishes; returns the
            finished ones (never empty while cells are in flight).
        ready: the cells that have already finished, without waiting (always
            empty on the simulated clock, where a cell finishes only when
            ``wait_any`` moves the clock to it).
        cancel: ``cancel(cell) -> finish_s``: stops a cell in flight (its partial
            measurement is discarded) and returns when on the clock it stopped.
        now: the campaign clock.
        close: releases threads / the Ray connection.
        simulated: whether the clock is simulated (replay) rather than real.
    """

    submit: Callable[[Job], None]
    wait_any: Callable[[], list[Done]]
    ready: Callable[[], list[Done]]
    cancel: Callable[[int], float]
    now: Callable[[], float]
    close: Callable[[], None]
    simulated: bool


def occupancy_s(row: dict[str, Any]) -> float:
    """Seconds a measured cell holds its GPUs on the simulated clock: ``duration_s`` + ``startup_s``."""
    total = 0.0
    for key in ("duration_s", "startup_s"):
        v = row.get(key)
        with contextlib.suppress(TypeError, ValueError):
            v = float(v)
            if math.isfinite(v) and v > 0:
                total += v
    return total


class GpuPool:
    """The profiling pool's GPUs: ``n`` slots, packed by aligned blocks.

    With ``sizes`` the slots are split by GPU type: group ``j`` (a
    ``[[fleet.pools]]`` entry, pool order) holds slots ``offset[j] ..
    offset[j] + sizes[j] - 1``, and a cell takes its GPUs within its own group
    only. Without, every slot is group 0.
    """

    def __init__(self, n: int, sizes: tuple[int, ...] | None = None) -> None:
        self.sizes = (int(n),) if sizes is None else tuple(int(k) for k in sizes)
        if sum(self.sizes) != int(n):
            raise ValueError(f"group sizes {self.sizes} do not add up to {n} slots")
        self.n = int(n)
        self.offsets = tuple(itertools.accumulate(self.sizes[:-1], initial=0))
        self._free = [True] * self.n

    @property
    def n_free(self) -> int:
        return sum(self._free)

    def _slots(self, group: int) -> range:
        return range(self.offsets[group], self.offsets[group] + self.sizes[group])

    def free_in(self, group: int = 0) -> int:
        """Free slots of ``group``."""
        return sum(self._free[g] for g in self._slots(group))

    def fits(self, tp: int, group: int = 0) -> bool:
        return tp <= self.free_in(group)

    def take(self, tp: int, prefer: tuple[int, ...] = (), group: int = 0) -> tuple[int, ...] | None:
        """Reserve ``tp`` slots of ``group`` (``prefer`` if all free and in it, else an aligned
        block, else any); None if too few."""
        if tp > self.free_in(group):
            return None
        slots = self._slots(group)
        if prefer and len(prefer) == tp and all(g in slots and self._free[g] for g in prefer):
            ids = tuple(prefer)
        else:
            ids = ()
            for start in range(slots.start, slots.stop - tp + 1, tp):
                if all(self._free[start : start + tp]):
                    ids = tuple(range(start, start + tp))
                    break
            if not ids:
                ids = tuple(g for g in slots if self._free[g])[:tp]
        for g in ids:
            self._free[g] = False
        return ids

    def give(self, ids: tuple[int, ...]) -> None:
        for g in ids:
            self._free[g] = True


def cell_runner(campaign: Any, out: Path) -> Callable[..., dict[str, Any]]:
    """``run(key, device_ids, replicate=0) -> row``: builds the campaign's backend for one cell and
    measures its window ``replicate``.

    For vLLM the backend's GPU pool (``[measurement] gpus``; with several
    ``[[fleet.pools]]``, the cell's pool's entry) becomes ``device_ids`` and its
    TP candidates the cell's TP (with ``[[configs]]``, its catalogue the cell's
    configuration), so the server runs on exactly the GPUs this cell was given.
    Used inside Ray tasks and by the real-clock local executor.
    """

    def run(key: tuple[str, int, str], device_ids: tuple[int, ...], replicate: int = 0) -> dict[str, Any]:
        from fleetsieve_bayes.backends import make_backend

        camp = campaign
        if campaign.measurement.backend == "vllm" and device_ids:
            # This cell's TP only, on exactly the devices it was given (of its own
            # pool's, with several [[fleet.pools]]: the others keep theirs).
            gpus: Any = [int(g) for g in device_ids]
            names = campaign.pool_names
            if names is not None and len(names) >= 2:
                from fleetsieve_bayes.backends.vllm import parse_vllm_options

                table = {n: list(ids) for n, ids in zip(names, parse_vllm_options(campaign).pool_devices, strict=True)}
                table[str(key[3])] = gpus
                gpus = table
            options = {**campaign.measurement.options, "gpus": gpus}
            if campaign.configs is None:
                options["tp"] = [int(key[1])]
                camp = replace(campaign, measurement=replace(campaign.measurement, options=options))
            else:  # this cell's configuration only (the others may need more devices than it was given)
                only = tuple(c for c in campaign.configs if c.name == key[1])
                camp = replace(campaign, configs=only, measurement=replace(campaign.measurement, options=options))
        backend = make_backend(camp, out)
        try:
            index = backend.grid.index()
            if key not in index:
                raise InputError(f"cell {key} is not a candidate of the campaign's backend")
            c = index[key]
            row = backend.preflight(c)
            return backend.measure(c, replicate) if row is None else row
        finally:
            backend.close()

    return run


def _since(unix_t: float) -> float:
    """Real seconds elapsed since ``unix_t`` (0 if in the future)."""
    return max(0.0, time.time() - float(unix_t))


def _row_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def local_executor(
    measure: Callable[[int, tuple[int, ...], int], dict[str, Any]],
    *,
    simulated: bool,
    offset_s: float = 0.0,
    max_workers: int = 64,
) -> Executor:
    """Threads on this machine; see the module docstring for the two clocks.

    Args:
        measure: ``measure(cell, gpu_slots, replicate) -> row`` (preflight included).
        simulated: finish times from the rows (``start_s + occupancy_s``)
            instead of the real clock.
        offset_s: the campaign clock at which this invocation starts.
    """
    pool = cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="fleetsieve-cell")
    lock = threading.Lock()
    running: dict[int, tuple[Job, cf.Future[Any]]] = {}
    t0 = time.monotonic()
    clock = {"now": float(offset_s)}

    def now() -> float:
        if simulated:
            return clock["now"]
        return float(offset_s) + (time.monotonic() - t0)

    def task(job: Job) -> tuple[dict[str, Any], float, float, float]:
        started_at = time.time()
        row = measure(job.cell, job.gpus, job.replicate)
        return row, started_at, time.time(), now()

    def submit(job: Job) -> None:
        with lock:
            if job.cell in running:
                raise RuntimeError(f"cell {job.cell} is already in flight")
            running[job.cell] = (job, pool.submit(task, job))

    def _done(job: Job, fut: cf.Future[Any]) -> Done:
        try:
            row, started_at, finished_at, real_finish = fut.result()
        except Exception as exc:  # noqa: BLE001 - reported to the driver as the cell's error
            t = time.time()
            return Done(job, None, _row_error(exc), job.start_s if simulated else now(), t, t, {})
        finish = job.start_s + occupancy_s(row) if simulated else real_finish
        return Done(job, row, None, finish, started_at, finished_at, {"slots": list(job.gpus)})

    def wait_any() -> list[Done]:
        with lock:
            items = list(running.values())
        if not items:
            raise RuntimeError("wait_any with no cell in flight")
        if simulated:
            # Every replayed cell returns at once; the simulated finish decides the order.
            cf.wait([f for _, f in items])
            done = sorted((_done(j, f) for j, f in items), key=lambda d: (d.finish_s, d.job.seq))
            first = done[0].finish_s
            done = [d for d in done if d.finish_s <= first + 1e-9]
            clock["now"] = max(clock["now"], first)
        else:
            finished, _ = cf.wait([f for _, f in items], return_when=cf.FIRST_COMPLETED)
            done = sorted((_done(j, f) for j, f in items if f in finished), key=lambda d: (d.finish_s, d.job.seq))
        with lock:
            for d in done:
                running.pop(d.job.cell, None)
        return done

    def ready() -> list[Done]:
        if simulated:
            return []
        with lock:
            items = [(j, f) for j, f in running.values() if f.done()]
            for j, _ in items:
                running.pop(j.cell, None)
        return sorted((_done(j, f) for j, f in items), key=lambda d: (d.finish_s, d.job.seq))

    def cancel(cell: int) -> float:
        with lock:
            item = running.pop(cell, None)
        if item is not None:
            item[1].cancel()  # a thread already measuring finishes; its row is discarded
        return now()

    def close() -> None:
        with lock:
            for _, f in running.values():
                f.cancel()
            running.clear()
        pool.shutdown(wait=True, cancel_futures=True)

    return Executor(
        submit=submit, wait_any=wait_any, ready=ready, cancel=cancel, now=now, close=close, simulated=simulated
    )


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(
            '[measurement] executor = "ray" needs Ray: pip install "fleetsieve-bayes[ray]"'
        ) from None
    return ray


def ray_executor(
    campaign: Any,
    out: Path,
    grid: Any,
    *,
    offset_s: float = 0.0,
    pool_gpus: int | None = None,
    per_gpu: tuple[int, ...] | None = None,
) -> tuple[Executor, int]:
    """Cells as Ray tasks (``num_gpus = tp``), on the cluster at ``[measurement] ray_address``.

    Without an address a local Ray is started for the campaign (and shut down
    by ``close``); an already initialised Ray (tests) is used as it is.

    With ``per_gpu`` (a count per ``[[fleet.pools]]`` GPU type) a cell's task
    also asks for ``tp`` units of the custom resource named by its GPU type,
    which each node advertises for its own GPUs (``ray start --num-gpus 8
    --resources '{"h100-sxm-80gb": 8}'``): Ray then places it on a node of
    that type.

    Returns:
        ``(executor, pool_gpus)``: the pool defaults to the cluster's GPUs.

    Raises:
        InputError: Ray missing, or a pool larger than the cluster's GPUs (of a type).
    """
    ray = _import_ray()
    started_here = _ensure_ray(ray, campaign)
    pool = _ray_pool_size(ray, campaign, grid, pool_gpus)
    if per_gpu is not None:
        _check_ray_types(ray, campaign, per_gpu)
    remote = _ray_cell_task(ray, cell_runner(campaign, out))
    typed = per_gpu is not None
    return _ray_task_executor(ray, remote, grid, offset_s=offset_s, started_here=started_here, typed=typed), pool


def _check_ray_types(ray: Any, campaign: Any, per_gpu: tuple[int, ...]) -> None:
    """Each GPU type's count against the cluster's custom resource of that name."""
    have = ray.cluster_resources()
    for name, n in zip(campaign.pool_names, per_gpu, strict=True):
        if float(have.get(name, 0)) < n:
            raise InputError(
                f"{campaign.path}: [measurement] pool_gpus.{name}: {n} GPUs asked for, the Ray cluster advertises "
                f"{int(have.get(name, 0))} (start each node with --resources '{{\"{name}\": <its GPUs>}}')"
            )


def _ensure_ray(ray: Any, campaign: Any) -> bool:
    """Join (or start) Ray unless it is already initialised; True when started here."""
    if ray.is_initialized():
        return False
    from fleetsieve_bayes.backends.server import guard_descendants

    guard_descendants()  # a local Ray's processes die with the campaign, even on SIGKILL
    address = campaign.pool.ray_address
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except Exception as exc:  # noqa: BLE001 - any connection failure is the environment's
        raise InputError(f"{campaign.path}: [measurement] ray_address: cannot start/join Ray ({exc})") from None
    return True


def _ray_pool_size(ray: Any, campaign: Any, grid: Any, pool_gpus: int | None) -> int:
    """The pool (default: the cluster's GPUs), checked against the cluster and its nodes."""
    cluster_gpus = int(ray.cluster_resources().get("GPU", 0))
    pool = cluster_gpus if pool_gpus is None else int(pool_gpus)
    if pool > cluster_gpus:
        raise InputError(
            f"{campaign.path}: [measurement] pool_gpus: {pool} GPUs asked for, the Ray cluster has {cluster_gpus}"
        )

    # A cell runs on one node: the largest TP must fit some node's GPUs.
    per_node = [int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]
    widest = int(max(grid.tp))
    if per_node and widest > max(per_node):
        big = int(list(grid.tp).index(widest))
        raise InputError(
            f"{campaign.path}: [measurement] executor: cell {grid.describe(big)} needs {widest} GPUs on one node; "
            f"the largest Ray node has {max(per_node)}"
        )
    return pool


def _ray_cell_task(ray: Any, run: Callable[..., dict[str, Any]]) -> Any:
    """The Ray remote function measuring one window of a cell on the GPUs Ray gave its task."""

    def remote_cell(key: tuple[str, int, str], replicate: int = 0) -> tuple[dict[str, Any], float, float, dict[str, Any]]:
        started_at = time.time()
        ids = tuple(int(float(g)) for g in ray.get_gpu_ids())
        row = run(key, ids, replicate)
        ctx = ray.get_runtime_context()
        info = {"node": ctx.get_node_id(), "device_ids": list(ids)}
        typed = {k: v for k, v in ctx.get_assigned_resources().items() if k not in ("GPU", "CPU", "memory")}
        if typed:
            info["resources"] = typed
        return row, started_at, time.time(), info

    # Application errors are not retried (a harness failure is reported); a
    # worker that dies is retried once.
    return ray.remote(max_retries=1)(remote_cell)


def _ray_task_executor(
    ray: Any, remote: Any, grid: Any, *, offset_s: float, started_here: bool, typed: bool = False
) -> Executor:
    """The :class:`Executor` over ``remote`` tasks, on the real clock from ``offset_s``
    (``typed``: each task also asks for ``tp`` of its GPU type's custom resource)."""
    t0 = time.monotonic()
    running: dict[Any, Job] = {}

    def now() -> float:
        return float(offset_s) + (time.monotonic() - t0)

    def submit(job: Job) -> None:
        extra = {"resources": {grid.gpu_name(job.cell): job.tp}} if typed else {}
        ref = remote.options(num_gpus=job.tp, num_cpus=0, **extra).remote(grid.key(job.cell), job.replicate)
        running[ref] = job

    def _done(ref: Any) -> Done:
        job = running.pop(ref)
        try:
            row, started_at, finished_at, info = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - a failed task is the cell's error
            t = time.time()
            cause = getattr(exc, "cause", None) or exc
            return Done(job, None, _row_error(cause), now(), t, t, {})
        # The task's own finish time on the clock (not when the driver looked).
        return Done(job, row, None, now() - _since(finished_at), started_at, finished_at, info)

    def wait_any() -> list[Done]:
        if not running:
            raise RuntimeError("wait_any with no cell in flight")
        ready, _ = ray.wait(list(running), num_returns=1)
        more, _ = ray.wait([r for r in running if r not in ready], num_returns=len(running) - len(ready), timeout=0)
        return sorted((_done(r) for r in [*ready, *more]), key=lambda d: d.job.seq)

    def ready() -> list[Done]:
        if not running:
            return []
        done, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
        return sorted((_done(r) for r in done), key=lambda d: d.job.seq)

    def cancel(cell: int) -> float:
        for ref, job in list(running.items()):
            if job.cell == cell:
                running.pop(ref)
                # Not forced: the task sees KeyboardInterrupt and its backend stops its server.
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=False)
        return now()

    def close() -> None:
        for ref in list(running):
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=False)
        running.clear()
        if started_here:
            ray.shutdown()

    return Executor(
        submit=submit, wait_any=wait_any, ready=ready, cancel=cancel, now=now, close=close, simulated=False
    )
