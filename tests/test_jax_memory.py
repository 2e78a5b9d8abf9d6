"""JAX's compiled programs in memory: a process that runs many campaigns stays under the
kernel's memory-mapping limit (a campaign that drops them decides the same:
``tests/test_campaign.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from fleetsieve_bayes.jax_cache import memory_maps, release_compiled_if_crowded

pytestmark = pytest.mark.skipif(memory_maps() is None, reason="the system does not report memory mappings (/proc)")


def test_each_compiled_program_holds_mappings_until_released() -> None:
    before = memory_maps()
    assert before is not None
    fns = []
    for n in range(1, 41):  # 40 programs of distinct shapes
        f = jax.jit(lambda x: jnp.sin(x) * x + x.sum())
        f(jnp.ones(n)).block_until_ready()
        fns.append(f)
    grown = memory_maps()
    assert grown is not None and grown[0] - before[0] >= 40
    assert release_compiled_if_crowded(0.0) is True
    after = memory_maps()
    assert after is not None and after[0] < grown[0] - 30
    assert all(f._cache_size() == 0 for f in fns)


def test_release_only_when_the_share_of_the_limit_is_passed() -> None:
    f = jax.jit(lambda x: x + 1.0)
    f(1.0)
    assert release_compiled_if_crowded(1.0) is False  # never above the whole limit
    assert f._cache_size() == 1
    assert release_compiled_if_crowded(0.0) is True
    assert f._cache_size() == 0
