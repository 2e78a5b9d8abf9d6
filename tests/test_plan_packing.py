"""The exact replica packing (deploy/packing.py) against brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.deploy.packing import first_unfit, is_divisible, pack


def brute_force_fits(tps: list[int], nodes: int, g: int) -> bool:
    """Every assignment of replicas to nodes (GPU identity inside a node does not matter)."""
    for assign in itertools.product(range(nodes), repeat=len(tps)):
        used = [0] * nodes
        for t, n in zip(tps, assign, strict=True):
            used[n] += t
        if max(used, default=0) <= g:
            return True
    return False


def check_valid(packing, replicas, nodes, g) -> None:
    assert [(p.workload, p.tp) for p in packing.placements] == [(w, t) for w, t in replicas]
    taken: set[tuple[int, int]] = set()
    for p in packing.placements:
        assert 0 <= p.node < nodes
        assert len(p.gpus) == p.tp
        assert all(0 <= gpu < g for gpu in p.gpus)
        assert list(p.gpus) == list(range(p.gpus[0], p.gpus[0] + p.tp))  # contiguous
        for gpu in p.gpus:
            assert (p.node, gpu) not in taken
            taken.add((p.node, gpu))


@settings(max_examples=150, deadline=None)
@given(
    tps=st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=0, max_size=6),
    nodes=st.integers(1, 3),
    g=st.sampled_from([4, 6, 8]),
)
def test_pack_agrees_with_brute_force(tps: list[int], nodes: int, g: int) -> None:
    replicas = [(f"w{i % 2}", t) for i, t in enumerate(tps)]
    got = pack(replicas, nodes, g)
    assert (got is not None) == brute_force_fits(tps, nodes, g)
    if got is not None:
        check_valid(got, replicas, nodes, g)


@settings(max_examples=80, deadline=None)
@given(tps=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=0, max_size=7), nodes=st.integers(1, 3))
def test_power_of_two_uses_ffd_aligned(tps: list[int], nodes: int) -> None:
    replicas = [("w", t) for t in tps]
    got = pack(replicas, nodes, 8)
    assert (got is not None) == brute_force_fits(tps, nodes, 8)
    if got is not None:
        assert got.method == "ffd"
        assert all(p.gpus[0] % p.tp == 0 for p in got.placements)  # aligned blocks


def test_divisibility() -> None:
    assert is_divisible([1, 2, 4, 8], 8)
    assert is_divisible([2, 4], 16)
    assert not is_divisible([2, 3], 6)
    assert not is_divisible([8], 12)


def test_ffd_counterexample_needs_exact_method() -> None:
    # TPs 4, 3, 3, 2 on 2 × 6 GPUs are not divisible, so the MILP decides; the
    # only packing is 4+2 on one node and 3+3 on the other.
    tps = [4, 3, 3, 2]
    got = pack([("a", t) for t in tps], 2, 6)
    assert got is not None and got.method == "milp"
    assert sorted(got.node_used()) == [6, 6]


def test_shipped_shape_two_nodes() -> None:
    # chat TP4 ×2 and code TP4 ×2 on 2 × 8 GPUs: exactly full.
    replicas = [("chat", 4), ("chat", 4), ("code", 4), ("code", 4)]
    got = pack(replicas, 2, 8)
    assert got is not None
    assert got.node_used() == [8, 8]
    assert pack(replicas + [("code", 1)], 2, 8) is None


def test_first_unfit_names_the_class() -> None:
    assert first_unfit([("chat", 4, 2), ("code", 8, 1)], 2, 8) is None
    assert first_unfit([("chat", 4, 2), ("code", 8, 2)], 2, 8) == "code"
    assert first_unfit([("chat", 16, 1)], 2, 8) == "chat"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        pack([("a", 0)], 1, 8)
    with pytest.raises(ValueError):
        pack([], 0, 8)
