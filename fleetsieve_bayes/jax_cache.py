"""JAX's compiled programs: a persistent cache on disk, and a bound on those held in memory.

A persistent JAX compilation cache is switched on by the command line (:func:`fleetsieve_bayes.cli.main`).

Every `run` invocation (and every resume after a kill) would otherwise
recompile the NUTS sampler, the allocator and the acquisition kernel — tens of
seconds on a laptop CPU. JAX can keep compiled programs on disk; we turn that
on for programs that took ≥ 1 s to compile, in ``$FLEETSIEVE_JAX_CACHE`` or
``~/.cache/fleetsieve-bayes/jax``. A cache dir the user configured through
JAX's own ``JAX_COMPILATION_CACHE_DIR`` wins, and ``FLEETSIEVE_JAX_CACHE=off``
disables it. A program that uses the package as a library calls
:func:`enable_compilation_cache` itself if it wants the cache.

Each program XLA compiles for the CPU keeps about three memory mappings of
its own until JAX drops it, and Linux refuses a process more mappings than
``vm.max_map_count`` (65,530 by default): past that, a compile aborts the
process. A campaign compiles programs of new shapes every round, so a process
that runs several campaigns (a sweep, a notebook, a benchmark) reaches the
limit. The drivers call :func:`release_compiled_if_crowded` before each round.
"""

from __future__ import annotations

import os
from pathlib import Path

_done = False

# Drop the in-memory programs once half the mapping limit is used: the other half is left
# for the programs of one round, which compiles far fewer than 10,000. Below the half nothing
# is dropped, so a single ordinary campaign never recompiles.
CROWDED_FRACTION = 0.5
_MAPS = Path("/proc/self/maps")
_MAX_MAPS = Path("/proc/sys/vm/max_map_count")


def enable_compilation_cache() -> Path | None:
    """Turn the persistent cache on (idempotent); returns its folder, or None if disabled."""
    global _done
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    setting = os.environ.get("FLEETSIEVE_JAX_CACHE", "")
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    folder = Path(setting) if setting else Path.home() / ".cache" / "fleetsieve-bayes" / "jax"
    if not _done:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # read-only home: run without the cache
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        _done = True
    return folder


def memory_maps() -> tuple[int, int] | None:
    """This process's memory mappings and the kernel's limit on them, or None where the
    system does not say (not Linux, or /proc unreadable)."""
    try:
        with _MAPS.open("rb") as f:
            n = sum(1 for _ in f)
        limit = int(_MAX_MAPS.read_text().strip())
    except (OSError, ValueError):
        return None
    return n, limit


def release_compiled_if_crowded(fraction: float | None = None) -> bool:
    """Drop JAX's in-memory compiled programs (``jax.clear_caches``) when this process uses
    more than ``fraction`` (default :data:`CROWDED_FRACTION`) of its memory-mapping limit;
    returns whether it did. Programs compile again on their next call (from the persistent
    cache where it is on); results do not change."""
    maps = memory_maps()
    share = CROWDED_FRACTION if fraction is None else fraction
    if maps is None or maps[0] <= share * maps[1]:
        return False
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    return True
