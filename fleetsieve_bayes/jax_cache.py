"""A persistent JAX compilation cache, switched on by the command line (:func:`fleetsieve_bayes.cli.main`).

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
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
from pathlib import Path

_done = False
_quieted = False

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
    to a temporary file for the duration, and reads that file. Takes about 0.1 s;
    the answer is kept for the process (once the log is quieted, a second probe
    would see nothing).
    """
    import jax
    import jax.numpy as jnp
    from jax.experimental import serialize_executable

    if jax.default_backend() != "cpu":
        return False
    compiled = jax.jit(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3)).compile()
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
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
    global _quieted
    if _quieted:
        return
    if loader_false_alarm():
        from jax._src.lib import utils

        utils.absl_set_min_log_level(_ABSL_FATAL_ONLY)
    _quieted = True


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
