"""Exact packing of a fleet's replicas onto nodes: a TP-t replica sits on t GPUs of one node.

:func:`pack` answers whether ``replicas`` (one TP per replica) fit ``nodes``
nodes of ``gpus_per_node`` GPUs each, and if so where each one goes. The
answer is exact either way:

* when the TPs are *divisible* (each distinct TP divides the next larger one,
  and the largest divides ``gpus_per_node``: powers of two on an 8-GPU node),
  first-fit decreasing packs whenever any packing exists (bin packing with
  divisible item sizes, Coffman, Garey and Johnson 1987), and every replica
  lands on an aligned block (offset a multiple of its TP), the GPUs that share
  the fastest links on NVLink/NVSwitch nodes;
* otherwise a small MILP (python-mip + CBC) over how many replicas of each TP
  each node holds decides it; GPUs are then given in decreasing TP order.

:func:`first_unfit` names the class whose replicas no longer fit, taking the
classes in the order given.

A replica of a *disaggregated* configuration is several workers (prefill and
decode engines, each on ``tp`` GPUs of one node). :func:`pack_groups` packs
replicas given as groups of workers: every replica that fits a node is kept
whole on one node (its workers side by side, larger TPs first), which is the
same exact packing with the replica's GPUs as one item; with ``split`` a
replica that cannot be kept whole (larger than a node, or no whole packing
exists) has its workers placed one by one (see :func:`pack_groups`).
:func:`first_unfit_groups` names the class that no longer fits, as
:func:`first_unfit` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "Placement",
    "Packing",
    "pack",
    "first_unfit",
    "is_divisible",
    "WorkerPlacement",
    "GroupPacking",
    "pack_groups",
    "first_unfit_groups",
]


class Placement(NamedTuple):
    """One replica: its class, its index within the class, its TP, node and GPU ids on that node."""

    workload: str
    index: int
    tp: int
    node: int
    gpus: tuple[int, ...]


class Packing(NamedTuple):
    """Where every replica of a fleet runs; ``method`` is ``"ffd"`` or ``"milp"``."""

    nodes: int
    gpus_per_node: int
    placements: tuple[Placement, ...]
    method: str

    def node_used(self) -> list[int]:
        """GPUs used on each node, ``(nodes,)``."""
        used = [0] * self.nodes
        for p in self.placements:
            used[p.node] += p.tp
        return used


def is_divisible(tps: Sequence[int], gpus_per_node: int) -> bool:
    """Whether the distinct TPs form a divisibility chain whose largest divides the node."""
    sizes = sorted(set(int(t) for t in tps))
    if not sizes:
        return True
    chain = all(b % a == 0 for a, b in zip(sizes, sizes[1:], strict=False))
    return chain and gpus_per_node % sizes[-1] == 0


def _ffd(tps: Sequence[int], nodes: int, gpus_per_node: int) -> list[tuple[int, int]] | None:
    """First-fit decreasing: ``(node, offset)`` per item in the given order, or None."""
    order = sorted(range(len(tps)), key=lambda i: (-tps[i], i))
    used = [0] * nodes
    where: list[tuple[int, int]] = [(-1, -1)] * len(tps)
    for i in order:
        t = tps[i]
        for n in range(nodes):
            if used[n] + t <= gpus_per_node:
                where[i] = (n, used[n])
                used[n] += t
                break
        else:
            return None
    return where


def _milp_counts(tps: Sequence[int], nodes: int, gpus_per_node: int) -> list[dict[int, int]] | None:
    """Per node, how many replicas of each TP it holds (an exact feasibility MILP), or None."""
    import mip

    need = Counter(int(t) for t in tps)
    kinds = sorted(need, reverse=True)
    m = mip.Model(sense=mip.MINIMIZE, solver_name=mip.CBC)
    m.verbose = 0
    m.threads = 1
    y = {(t, n): m.add_var(var_type=mip.INTEGER, lb=0, ub=gpus_per_node // t) for t in kinds for n in range(nodes)}
    for t in kinds:
        m += mip.xsum(y[t, n] for n in range(nodes)) == need[t]
    for n in range(nodes):
        m += mip.xsum(t * y[t, n] for t in kinds) <= gpus_per_node
    # Symmetry: nodes in non-increasing use, so the first nodes fill first.
    for n in range(nodes - 1):
        m += mip.xsum(t * y[t, n] for t in kinds) >= mip.xsum(t * y[t, n + 1] for t in kinds)
    m.objective = mip.xsum(y[t, n] * n for t in kinds for n in range(nodes))
    status = m.optimize()
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return None
    return [{t: int(round(y[t, n].x)) for t in kinds} for n in range(nodes)]


def _place_counts(tps: Sequence[int], counts: list[dict[int, int]]) -> list[tuple[int, int]]:
    """Turn per-node TP counts into ``(node, offset)`` per item, largest TPs first on each node."""
    slots: dict[int, list[tuple[int, int]]] = {}
    for n, per in enumerate(counts):
        offset = 0
        for t in sorted(per, reverse=True):
            for _ in range(per[t]):
                slots.setdefault(t, []).append((n, offset))
                offset += t
    where: list[tuple[int, int]] = [(-1, -1)] * len(tps)
    for i in sorted(range(len(tps)), key=lambda i: (-tps[i], i)):
        where[i] = slots[tps[i]].pop(0)
    return where


def pack(replicas: Sequence[tuple[str, int]], nodes: int, gpus_per_node: int) -> Packing | None:
    """Place ``replicas`` — ``(workload, tp)`` pairs — onto ``nodes × gpus_per_node`` GPUs.

    Args:
        replicas: one ``(workload, tp)`` per replica, ``(n_replicas,)``.
        nodes: number of nodes (≥ 1).
        gpus_per_node: GPUs on each node (≥ 1).

    Returns:
        A :class:`Packing` whose placements follow ``replicas``' order, or None
        when no packing exists (exactly: see the module docstring).
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be >= 1")
    tps = [int(t) for _, t in replicas]
    if any(t < 1 for t in tps):
        raise ValueError("every TP must be >= 1")
    if any(t > gpus_per_node for t in tps) or sum(tps) > nodes * gpus_per_node:
        return None
    if is_divisible(tps, gpus_per_node):
        where, method = _ffd(tps, nodes, gpus_per_node), "ffd"
    else:
        counts = _milp_counts(tps, nodes, gpus_per_node)
        where, method = (None if counts is None else _place_counts(tps, counts)), "milp"
    if where is None:
        return None
    seen: Counter[str] = Counter()
    placements = []
    for (w, t), (n, off) in zip(replicas, where, strict=True):
        placements.append(Placement(w, seen[w], int(t), n, tuple(range(off, off + int(t)))))
        seen[w] += 1
    return Packing(nodes, gpus_per_node, tuple(placements), method)


def first_unfit(classes: Sequence[tuple[str, int, int]], nodes: int, gpus_per_node: int) -> str | None:
    """The first class — ``(workload, tp, replicas)`` in the order given — whose replicas no longer fit.

    None when the whole fleet fits.
    """
    items: list[tuple[str, int]] = []
    for w, tp, n in classes:
        items.extend([(w, int(tp))] * int(n))
        if n and pack(items, nodes, gpus_per_node) is None:
            return w
    return None


class WorkerPlacement(NamedTuple):
    """One worker of a replica: its class, the replica's index within the class, its role
    (``engine`` for an aggregated replica's one engine, ``prefill`` or ``decode``), its index
    within the role, its TP, node and GPU ids on that node."""

    workload: str
    index: int
    role: str
    worker: int
    tp: int
    node: int
    gpus: tuple[int, ...]


class GroupPacking(NamedTuple):
    """Where every worker of a fleet runs; ``split`` names the replicas ``(workload, index)``
    whose workers are on more than one node."""

    nodes: int
    gpus_per_node: int
    placements: tuple[WorkerPlacement, ...]
    method: str
    split: tuple[tuple[str, int], ...]

    def node_used(self) -> list[int]:
        """GPUs used on each node, ``(nodes,)``."""
        used = [0] * self.nodes
        for p in self.placements:
            used[p.node] += p.tp
        return used


Group = tuple[str, Sequence[tuple[str, int]]]  # (workload, ((role, tp), …) in the replica's order)


def _attempt(groups: Sequence[Group], whole: Sequence[bool], nodes: int,
             gpus_per_node: int) -> tuple[list[list[tuple[int, tuple[int, ...]]]], str] | None:
    """Pack with ``whole[i]`` replicas as one item each and the others' workers as items of
    their own: per replica, ``(node, gpus)`` of each worker in its order, and the method."""
    items: list[tuple[str, int]] = []
    owner: list[tuple[int, int | None]] = []  # (replica, worker or None for the whole replica)
    for i, (w, workers) in enumerate(groups):
        if whole[i]:
            items.append((w, sum(int(t) for _, t in workers)))
            owner.append((i, None))
        else:
            for k, (_, t) in enumerate(workers):
                items.append((w, int(t)))
                owner.append((i, k))
    packing = pack(items, nodes, gpus_per_node)
    if packing is None:
        return None
    where: list[list[tuple[int, tuple[int, ...]]]] = [[(-1, ())] * len(workers) for _, workers in groups]
    for (i, k), p in zip(owner, packing.placements, strict=True):
        workers = groups[i][1]
        if k is not None:
            where[i][k] = (p.node, p.gpus)
            continue
        # A whole replica: its workers side by side on its block, larger TPs first.
        at = p.gpus[0]
        for j in sorted(range(len(workers)), key=lambda j: (-int(workers[j][1]), j)):
            t = int(workers[j][1])
            where[i][j] = (p.node, tuple(range(at, at + t)))
            at += t
    return where, packing.method


def pack_groups(groups: Sequence[Group], nodes: int, gpus_per_node: int, *, split: bool = False) -> GroupPacking | None:
    """Place replicas given as groups of workers — ``(workload, ((role, tp), …))`` — onto
    ``nodes × gpus_per_node`` GPUs, each worker on ``tp`` GPUs of one node.

    Without ``split`` every replica is whole on one node: None when no such packing
    exists (exactly, as :func:`pack` decides it with each replica's GPUs as one item).
    With ``split``, every replica that fits a node is kept whole if a packing exists
    that way; otherwise replicas are split into their workers one at a time, from the
    last given backwards, until a packing exists (every one split: the exact packing
    of the workers alone, so None only when no placement of the workers exists at all).

    Returns:
        A :class:`GroupPacking` whose placements follow ``groups``' order (and each
        replica's workers in its order), or None.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be >= 1")
    sizes = [sum(int(t) for _, t in workers) for _, workers in groups]
    if any(not workers for _, workers in groups):
        raise ValueError("every replica has at least one worker")
    whole = [s <= gpus_per_node for s in sizes]
    if not split and not all(whole):
        return None
    got = _attempt(groups, whole, nodes, gpus_per_node)
    if got is None and split:
        for i in reversed(range(len(groups))):
            if not whole[i] or len(groups[i][1]) == 1:
                continue
            whole[i] = False
            got = _attempt(groups, whole, nodes, gpus_per_node)
            if got is not None:
                break
    if got is None:
        return None
    where, method = got
    seen: Counter[str] = Counter()
    placements: list[WorkerPlacement] = []
    spread: list[tuple[str, int]] = []
    for (w, workers), at in zip(groups, where, strict=True):
        index = seen[w]
        seen[w] += 1
        per_role: Counter[str] = Counter()
        for (role, t), (n, gpus) in zip(workers, at, strict=True):
            placements.append(WorkerPlacement(w, index, str(role), per_role[role], int(t), n, gpus))
            per_role[role] += 1
        if len({n for n, _ in at}) > 1:
            spread.append((w, index))
    return GroupPacking(nodes, gpus_per_node, tuple(placements), method, tuple(spread))


def first_unfit_groups(classes: Sequence[tuple[str, Sequence[tuple[str, int]], int]], nodes: int,
                       gpus_per_node: int, *, split: bool = False) -> str | None:
    """The first class — ``(workload, workers of one replica, replicas)`` in the order given —
    whose replicas no longer fit (:func:`pack_groups`); None when the whole fleet fits."""
    groups: list[Group] = []
    for w, workers, n in classes:
        groups.extend([(w, tuple(workers))] * int(n))
        if n and pack_groups(groups, nodes, gpus_per_node, split=split) is None:
            return w
    return None
