"""JAX's compiled programs: a persistent cache on disk, and a bound on those held in memory.

A persistent JAX compilation cache is switched on by the command line (:func:`fleetsieve_bayes.cli.main`).

Every `run` invocation (and every resume after a kill) would otherwise
recompile the NUTS sampler, the allocator and the acquisition kernel — tens of
seconds on a laptop CPU. JAX can keep compiled programs on disk; we turn that
on for programs that took ≥ 1 s to compile, in ``$FLEETSIEVE_JAX_CACHE`` or
``~/.cache/fleetsieve-bayes/jax``, in a subfolder named after the host's CPU
(model and instruction-set flags) and jaxlib's version, so that a home folder
shared by unlike machines never hands one of them a program built for another.
A cache dir the user configured through JAX's own ``JAX_COMPILATION_CACHE_DIR``
wins, and ``FLEETSIEVE_JAX_CACHE=off`` disables it. A program that uses the
package as a library calls :func:`enable_compilation_cache` itself if it wants
the cache.

On an AVX-512 host, XLA:CPU records two LLVM tuning preferences
(``+prefer-no-gather``, ``+prefer-no-scatter``) among the features a cached
program was built for, and its loader then logs an ERROR line per program
("Target machine feature … is not supported on the host machine") although the
host is the one that built it and the program loads and runs (jax-ml/jax#38445).
:func:`loader_false_alarm` loads one tiny program through the same loader and
reads what it logs; where it raises that false alarm, the cache stays on and
XLA's C++ log keeps only FATAL lines for the process (a campaign's stderr is
for its own messages). ``FLEETSIEVE_JAX_CACHE=off`` keeps XLA's full log.

Each program XLA compiles for the CPU keeps about three memory mappings of its
own until JAX drops it, and Linux refuses a process more mappings than
``vm.max_map_count`` (65,530 by default): past that, the next compile aborts
the process (``LLVM ERROR: Unable to allocate section memory``). A campaign
compiles programs of new shapes every round, so a process that runs several
campaigns (a sweep, a notebook, a benchmark) reaches the limit. The drivers call
:func:`release_compiled_if_crowded` before each round; it drops JAX's programs
and every kernel the package keeps built around them (modules that keep one
register a hook with :func:`on_release`), so the next round traces and compiles
afresh — from the persistent cache where it is on — and decides the same.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_done = False

# Release the in-memory programs once half the mapping limit is used: the other half is left
# for the programs of one round, which compiles far fewer than 10,000. Below the half nothing
# is released, so a single ordinary campaign never recompiles.
CROWDED_FRACTION = 0.5
_MAPS = Path("/proc/self/maps")
_MAX_MAPS = Path("/proc/sys/vm/max_map_count")
# What higher modules drop with JAX's programs: their caches of kernels built around jitted
# closures (a kernel that outlived JAX's caches could retrace onto a tracer of its first trace).
_RELEASE_HOOKS: list[Callable[[], None]] = []

# absl's minimum log level that drops INFO, WARNING and ERROR lines and keeps FATAL ones.
_ABSL_FATAL_ONLY = 3


def host_key() -> str:
    """A short name for this host's CPU and jaxlib: the cache subfolder's name."""
    import jaxlib

    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
            if model and flags:
                break
    except OSError:
        import platform

        model = platform.processor() or platform.machine()
    digest = hashlib.sha256(f"{model}\n{flags}".encode()).hexdigest()[:12]
    return f"jaxlib-{jaxlib.__version__}-cpu-{digest}"


@functools.cache
def loader_false_alarm() -> bool:
    """Whether loading a program XLA:CPU built on this very host logs the
    machine-mismatch ERROR (the AVX-512 tuning-flag false alarm).

    Builds, serializes and reloads one tiny program with file descriptor 2 sent
    to a temporary file for the duration (nothing it logs reaches stderr), and
    reads that file. Takes about 0.1 s; the answer is kept for the process (once
    the log is quieted, a second probe would see nothing).
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import serialize_executable

    if jax.default_backend() != "cpu":
        return False
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            # The compile too: with a cache already on (JAX_COMPILATION_CACHE_DIR), its
            # programs may come from disk through the same loader.
            compiled = jax.jit(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3)).compile()
            payload, in_tree, out_tree = serialize_executable.serialize(compiled)
            serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    return "cpu_aot_loader" in text and "Target machine feature" in text


def _quiet_false_alarm() -> None:
    """Keep only FATAL lines of XLA's C++ log where the cache loader raises its false alarm."""
    if loader_false_alarm():
        from jax._src.lib import utils

        utils.absl_set_min_log_level(_ABSL_FATAL_ONLY)


def enable_compilation_cache() -> Path | None:
    """Turn the persistent cache on (idempotent); returns its folder, or None if disabled."""
    global _done
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        _quiet_false_alarm()
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    setting = os.environ.get("FLEETSIEVE_JAX_CACHE", "")
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    base = Path(setting) if setting else Path.home() / ".cache" / "fleetsieve-bayes" / "jax"
    folder = base / host_key()
    if not _done:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # read-only home: run without the cache
        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        _quiet_false_alarm()
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


def on_release(hook: Callable[[], None]) -> Callable[[], None]:
    """Register ``hook`` to run when compiled programs are released (a module's kernel
    cache is emptied there); returns it, so that it can decorate the function."""
    if hook not in _RELEASE_HOOKS:
        _RELEASE_HOOKS.append(hook)
    return hook


def release_compiled() -> None:
    """Drop the package's kernel caches (the :func:`on_release` hooks) and JAX's in-memory
    compiled programs (``jax.clear_caches``). Later calls trace and compile again."""
    import gc

    import jax

    for hook in _RELEASE_HOOKS:
        hook()
    jax.clear_caches()
    gc.collect()


def release_compiled_if_crowded(fraction: float | None = None) -> bool:
    """:func:`release_compiled` when this process uses more than ``fraction`` (default
    :data:`CROWDED_FRACTION`) of its memory-mapping limit; returns whether it did."""
    maps = memory_maps()
    share = CROWDED_FRACTION if fraction is None else fraction
    if maps is None or maps[0] <= share * maps[1]:
        return False
    release_compiled()
    return True
