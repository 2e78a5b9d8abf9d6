"""Array-namespace dispatch, so one rule serves NumPy callers and JAX kernels.

A decision rule written once with :func:`namespace` runs on NumPy arrays
(float64, in the certificate and reports) and on JAX arrays or tracers (inside
the jitted acquisition kernel and allocator) without importing JAX for NumPy
callers — ``status`` and ``report`` never pay JAX's import.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np

__all__ = ["namespace"]


def namespace(*arrays: Any) -> ModuleType:
    """``jax.numpy`` when any argument is a JAX array (or tracer), else ``numpy``."""
    jax = sys.modules.get("jax")
    if jax is not None and any(isinstance(a, jax.Array) for a in arrays):
        import jax.numpy as jnp

        return jnp
    return np
