"""JAX's compiled programs in memory: a process that runs many campaigns stays under the
kernel's memory-mapping limit, and fits after a release give the same draws (a campaign that
releases every round decides the same: ``tests/test_campaign.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fleetsieve_bayes import jax_cache
from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.jax_cache import memory_maps, release_compiled, release_compiled_if_crowded
from fleetsieve_bayes.model.inference import fit, load_preset
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

GRID_CSV = data_dir("examples") / "h100_31b_fp8" / "grid.csv"
CARD = "dense-31b-fp8-h100"
needs_proc = pytest.mark.skipif(memory_maps() is None, reason="the system does not report memory mappings (/proc)")


@needs_proc
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


@needs_proc
def test_release_only_when_the_share_of_the_limit_is_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    f = jax.jit(lambda x: x + 1.0)
    f(1.0)
    hooks: list[int] = []
    monkeypatch.setattr(jax_cache, "_RELEASE_HOOKS", [lambda: hooks.append(1)])
    assert release_compiled_if_crowded(1.0) is False  # never above the whole limit
    assert f._cache_size() == 1 and hooks == []
    assert release_compiled_if_crowded(0.0) is True
    assert f._cache_size() == 0 and hooks == [1]


def test_release_hooks_are_registered_once() -> None:
    hook = jax_cache._RELEASE_HOOKS[0]
    n = len(jax_cache._RELEASE_HOOKS)
    jax_cache.on_release(hook)
    assert len(jax_cache._RELEASE_HOOKS) == n


@pytest.mark.parametrize("preset", ["svi", "fast"])
def test_a_fit_after_a_release_draws_what_it_drew_before(preset: str) -> None:
    """The package's kernels are dropped with JAX's programs: a kernel kept across
    ``jax.clear_caches`` would retrace onto a tracer of its first trace
    (``UnexpectedTracerError``); rebuilt, it compiles the same program. A warm start from
    before the release still applies, and a cold fit after a warm one on a rebuilt kernel
    does not read the warm trace's values."""
    df = read_table(GRID_CSV)
    grid = grid_from_table(df, ("chat", "code"))
    obs = values_from_table(grid, df)
    m = np.zeros(grid.n_cells, bool)
    m[initial_design(grid)] = True
    p = load_preset("svi")._replace(steps=300, warm_steps=150, draws=100) if preset == "svi" else preset
    first = fit(grid, obs, m, CARD, p, seed=0)
    warm = fit(grid, obs, m, CARD, p, seed=1, warm_start=first)
    release_compiled()
    # Warm first, as a campaign's next round after a release; then cold, as the next campaign.
    warm_again = fit(grid, obs, m, CARD, p, seed=1, warm_start=first)
    np.testing.assert_array_equal(warm_again.latent, warm.latent)
    again = fit(grid, obs, m, CARD, p, seed=0)
    np.testing.assert_array_equal(again.latent, first.latent)
