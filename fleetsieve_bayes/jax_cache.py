"""A persistent JAX compilation cache, switched on by the command line (:func:`fleetsieve_bayes.cli.main`).

Every `run` invocation (and every resume after a kill) would otherwise
recompile the NUTS sampler, the allocator and the acquisition kernel — tens of
seconds on a laptop CPU. JAX can keep compiled programs on disk; we turn that
on for programs that took ≥ 1 s to compile, in ``$FLEETSIEVE_JAX_CACHE`` or
``~/.cache/fleetsieve-bayes/jax``. A cache dir the user configured through
JAX's own ``JAX_COMPILATION_CACHE_DIR`` wins, and ``FLEETSIEVE_JAX_CACHE=off``
disables it. A program that uses the package as a library calls
:func:`enable_compilation_cache` itself if it wants the cache.
"""

from __future__ import annotations

import os
from pathlib import Path

_done = False


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
