"""The acquisition of a round whose certifying posterior did not converge: the
cell whose measurement the chains predict differently."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.decision.chain_disagreement import chain_disagreement, select_by_disagreement


def _draws(rng: np.random.Generator, chains: int, per_chain: int, n_cells: int) -> np.ndarray:
    """Chain-major latent draws ``(chains · per_chain, n_cells, 4)`` around one common value."""
    base = np.array([2.0, 0.5, 10.0, 0.99])
    z = rng.normal(0.0, 0.05, (chains * per_chain, n_cells, 4))
    lat = base * np.exp(z)
    lat[..., 3] = np.clip(0.99 + 0.001 * z[..., 3], 0.0, 1.0)
    return lat


def test_the_cell_the_chains_disagree_on_is_chosen_and_measured_cells_never_are() -> None:
    rng = np.random.default_rng(0)
    lat = _draws(rng, 4, 200, 5)
    noise = np.full((800, 4), 0.05)
    # Chains 0-1 read cell 3's TTFT as 0.5 s, chains 2-3 as 1.5 s (two modes);
    # cell 1 disagrees as much, but it is measured.
    lat[400:, 3, 1] *= 3.0
    lat[400:, 1, 0] *= 3.0
    measured = np.array([False, True, False, False, False])
    s = chain_disagreement(lat, noise, 4, measured)
    assert s[1] == -np.inf
    assert int(np.argmax(s)) == 3
    # Between/within ratio of the log TTFT: (log 3)² / 2 between-chain variance
    # against ≈ 0.05² + 0.05² within (draws plus noise).
    assert s[3] > 50.0 and np.all(s[[0, 2, 4]] < 1.0)
    assert select_by_disagreement(s, np.full(5, 600.0)) == 3


def test_no_cell_separates_chains_that_agree() -> None:
    rng = np.random.default_rng(1)
    lat = _draws(rng, 4, 400, 6)
    s = chain_disagreement(lat, np.full((1600, 4), 0.05), 4, np.zeros(6, bool))
    assert np.all(s < 0.05)
    assert select_by_disagreement(s, np.full(6, 600.0), min_score=0.1) is None


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1.5, 5.0))
def test_ties_go_to_the_cheaper_cell_and_the_score_is_invariant_to_chain_order(seed: int, scale: float) -> None:
    rng = np.random.default_rng(seed)
    lat = _draws(rng, 3, 100, 4)
    # Cells 0 and 2 carry the same disagreement (same draws, same shift).
    lat[:, 2] = lat[:, 0]
    lat[200:, [0, 2], 0] *= scale
    noise = np.full((300, 4), 0.03)
    s = chain_disagreement(lat, noise, 3, np.zeros(4, bool))
    assert s[0] == pytest.approx(s[2])
    assert select_by_disagreement(s, np.array([900.0, 300.0, 300.0, 300.0])) == 2
    flipped = np.concatenate([lat[200:], lat[:200]])
    assert chain_disagreement(flipped, noise, 3, np.zeros(4, bool)) == pytest.approx(s)


def test_draws_that_do_not_split_into_chains_are_an_error() -> None:
    with pytest.raises(ValueError, match="cannot be split"):
        chain_disagreement(np.ones((10, 2, 4)), np.ones((10, 4)), 3, np.zeros(2, bool))
