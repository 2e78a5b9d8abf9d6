"""Per-round seeds: every random choice of a round depends only on (campaign seed, round).

A resumed campaign replays its rounds exactly because nothing else feeds the
seeds: not the wall clock, not the order of process starts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["round_seed", "round_rng", "round_jax_key"]


def round_seed(seed: int, round_no: int) -> int:
    """A 32-bit seed that depends only on ``(seed, round_no)``."""
    return int(np.random.SeedSequence([seed, round_no]).generate_state(1)[0])


def round_rng(seed: int, round_no: int) -> np.random.Generator:
    """The round's NumPy generator."""
    return np.random.default_rng([seed, round_no])


def round_jax_key(seed: int, round_no: int) -> Any:
    """The round's JAX PRNG key (from :func:`round_seed`)."""
    import jax

    return jax.random.PRNGKey(round_seed(seed, round_no))
