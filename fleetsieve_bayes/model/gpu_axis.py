"""The GPU type as an axis: roofline ratios between GPU types, per TP and per cell.

A class's capacity and tails on GPU ``g`` relate to those on a reference GPU
through the roofline of :func:`fleetsieve_bayes.model.derive.roofline` (the
same equations ``priors derive`` fits a card to): a memory-bound decode
scales with HBM bandwidth, a prefill with FLOP/s, the KV room (and so the
decode batch) with memory. This module computes those ratios for one
architecture and dtype:

* per GPU and TP, ``log(per-GPU capacity on g / on the reference)`` and the
  same for the TTFT and completion p99s at the reference load
  (:func:`gpu_axis`); a TP at which the model does not fit ``g`` is marked
  infeasible (capacity ratio 0);
* per cell of a grid whose pools name GPU types, the three log ratios of its
  pool's GPU at its TP (:func:`cell_log_ratios`);
* as a prior card's ``[gpu_axis]`` section (``priors derive --also-gpus``):
  :func:`card_section` writes it, :func:`axis_from_card` reads it back.

These are the *prior* offsets of the GPU axis; the joint model adds a learned
per-type deviation (:func:`fleetsieve_bayes.model.joint.gpu_deviation`), and
:func:`grid_gpu_inputs` builds both inputs of a grid for it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.derive import (
    DEFAULT_WORKLOAD,
    Architecture,
    GpuSpec,
    Workload,
    roofline,
)

__all__ = ["GpuAxis", "gpu_axis", "cell_log_ratios", "card_section", "axis_from_card", "grid_gpu_inputs", "card_with_axis"]

# Log ratios are clipped to this: a TP at which the model does not fit a GPU
# (capacity ratio 0) is a capacity e^-10 of the reference's, not -inf.
_LOG_RATIO_CLIP = 10.0


class GpuAxis(NamedTuple):
    """Roofline ratios of several GPU types to a reference one.

    Arrays have shape ``(n_gpus, n_tp)``; row ``gpus.index(reference)`` is 0
    (feasible TPs) by construction.
    """

    gpus: tuple[str, ...]  # (n_gpus,) GPU type names
    reference: str
    tps: tuple[int, ...]  # (n_tp,)
    feasible: np.ndarray  # bool (n_gpus, n_tp): the model fits g and the reference at that TP
    log_capacity: np.ndarray  # float64 (n_gpus, n_tp): log per-GPU capacity ratio; -inf where infeasible
    log_ttft: np.ndarray  # float64 (n_gpus, n_tp): log TTFT p99 ratio; +inf where infeasible
    log_completion: np.ndarray  # float64 (n_gpus, n_tp): log completion p99 ratio; +inf where infeasible

    def row(self, gpu: str) -> int:
        """Index of GPU type ``gpu`` (case-insensitive).

        Raises:
            InputError: a GPU type the axis does not cover.
        """
        names = [g.lower() for g in self.gpus]
        if gpu.lower() not in names:
            raise InputError(f"GPU {gpu!r} is not on the GPU axis ({', '.join(self.gpus)})")
        return names.index(gpu.lower())


def gpu_axis(
    arch: Architecture,
    gpus: Sequence[GpuSpec],
    reference: str,
    *,
    dtype: str,
    kv_dtype: str | None = None,
    workload: Workload = DEFAULT_WORKLOAD,
    tps: Sequence[int] = (1, 2, 4, 8),
    gpu_memory_utilization: float = 0.9,
    min_concurrency: int = 8,
) -> GpuAxis:
    """Roofline ratios of every GPU of ``gpus`` to ``reference`` (one of them).

    ``kv_dtype`` defaults to ``bf16`` (as ``priors derive``).

    Raises:
        InputError: ``reference`` is not among ``gpus``, or the model fits the
            reference at none of ``tps``.
    """
    names = tuple(g.name for g in gpus)
    if reference.lower() not in [n.lower() for n in names]:
        raise InputError(f"reference GPU {reference!r} is not among {', '.join(names)}")
    kv = kv_dtype or "bf16"  # derive's default: a BF16 KV cache
    rows = {
        g.name: roofline(
            arch,
            g,
            dtype=dtype,
            kv_dtype=kv,
            workload=workload,
            tps=tps,
            gpu_memory_utilization=gpu_memory_utilization,
            min_concurrency=min_concurrency,
        )
        for g in gpus
    }
    ref = rows[names[[n.lower() for n in names].index(reference.lower())]]
    ref_ok = np.array([r.feasible for r in ref])
    if not ref_ok.any():
        raise InputError(f"{arch.name} in {dtype} fits the reference GPU {reference!r} at no TP in {list(tps)}")
    n_g, n_t = len(names), len(tps)
    feasible = np.zeros((n_g, n_t), bool)
    cap = np.full((n_g, n_t), -np.inf)
    ttft = np.full((n_g, n_t), np.inf)
    comp = np.full((n_g, n_t), np.inf)
    for i, name in enumerate(names):
        for j, (r, r0) in enumerate(zip(rows[name], ref, strict=True)):
            if not (r.feasible and r0.feasible):
                continue
            feasible[i, j] = True
            cap[i, j] = np.log(r.per_gpu_rps / r0.per_gpu_rps)
            ttft[i, j] = np.log(r.ttft_s / r0.ttft_s)
            comp[i, j] = np.log(r.completion_s / r0.completion_s)
    return GpuAxis(names, reference, tuple(int(t) for t in tps), feasible, cap, ttft, comp)


def cell_log_ratios(grid: CellGrid, axis: GpuAxis) -> np.ndarray:
    """Per cell, the log ratios ``(capacity, ttft, completion)`` of its pool's GPU at its TP.

    A grid without named pools is on the reference GPU (all zeros).

    Returns:
        float64 ``(n_cells, 3)``; capacity ``-inf`` (tails ``+inf``) where
        the model does not fit the cell's GPU at its TP.

    Raises:
        InputError: a pool's GPU or a cell's TP the axis does not cover.
    """
    out = np.zeros((grid.n_cells, 3))
    if not grid.named_pools:
        return out
    rows = np.array([axis.row(p) for p in grid.pools])
    col_of = {t: j for j, t in enumerate(axis.tps)}
    missing = sorted({int(t) for t in grid.tp} - set(col_of))
    if missing:
        raise InputError(f"the GPU axis covers TP {list(axis.tps)}, not TP {missing}")
    g = rows[grid.gpu_idx]
    t = np.array([col_of[int(x)] for x in grid.tp], np.int64)
    out[:, 0] = axis.log_capacity[g, t]
    out[:, 1] = axis.log_ttft[g, t]
    out[:, 2] = axis.log_completion[g, t]
    return out


def card_section(axis: GpuAxis, digits: int = 4) -> dict[str, object]:
    """The card's ``[gpu_axis]`` section: the reference, every GPU (the reference first) and their log-ratio rows.

    Values are rounded to ``digits`` significant digits (so the card loads back
    to exactly these numbers); no ratio is ``-inf`` (capacity) or ``inf``
    (tails), which TOML writes as such.
    """

    def r(x: float) -> float:
        return float(x) if not np.isfinite(x) or x == 0 else float(f"{x:.{digits}g}")

    ref = axis.row(axis.reference)
    order = [ref] + [i for i in range(len(axis.gpus)) if i != ref]
    return {
        "reference": axis.gpus[ref],
        "gpus": [axis.gpus[i] for i in order],
        "tp": list(axis.tps),
        "log_capacity": [[r(x) for x in axis.log_capacity[i]] for i in order],
        "log_ttft": [[r(x) for x in axis.log_ttft[i]] for i in order],
        "log_completion": [[r(x) for x in axis.log_completion[i]] for i in order],
    }


def axis_from_card(card: object) -> GpuAxis | None:
    """The :class:`GpuAxis` of a prior card's ``[gpu_axis]``; None without one."""
    gpus = getattr(card, "gpu_axis_gpus", None)
    if gpus is None:
        return None
    cap = np.array(card.gpu_axis_log_capacity, np.float64)  # type: ignore[attr-defined]
    return GpuAxis(
        gpus=tuple(gpus),
        reference=card.gpu_axis_reference,  # type: ignore[attr-defined]
        tps=tuple(card.gpu_axis_tp),  # type: ignore[attr-defined]
        feasible=np.isfinite(cap),
        log_capacity=cap,
        log_ttft=np.array(card.gpu_axis_log_ttft, np.float64),  # type: ignore[attr-defined]
        log_completion=np.array(card.gpu_axis_log_completion, np.float64),  # type: ignore[attr-defined]
    )


def grid_gpu_inputs(grid: CellGrid, card: object) -> tuple[np.ndarray, np.ndarray] | None:
    """The joint model's GPU-axis inputs of ``grid`` under ``card``'s ``[gpu_axis]``.

    None when every cell is on the card's GPU: a grid without named pools,
    or one pool of the card's reference GPU (or a card without an axis and one pool).

    Returns:
        ``(offset, onehot)``: float64 ``(n_cells, 3)`` log ratios (capacity,
        ttft, completion) of each cell's GPU at its TP, clipped to ±10, and
        float64 ``(n_cells, n_dev)`` one-hot of the cell's non-reference
        pool (``n_dev`` pools are not the reference; a reference cell's row is 0).

    Raises:
        InputError: several pools and a card without ``[gpu_axis]``, or a
            pool's GPU (or a cell's TP) the axis does not cover.
    """
    if not grid.named_pools:
        return None
    axis = axis_from_card(card)
    if axis is None:
        if grid.n_pools == 1:
            return None
        raise InputError(
            f"the prior card has no [gpu_axis] section, which a fleet of {grid.n_pools} GPU types "
            f"({', '.join(grid.pools)}) needs: write one with `priors derive --also-gpus`"
        )
    ref = axis.reference.lower()
    # One pool on the card's own GPU, or on any GPU for a card of "any" (the generic card,
    # scale-free: its axis only relates several types to one another).
    if grid.n_pools == 1 and (grid.pools[0].lower() == ref or getattr(card, "card_gpu", "") == "any"):
        return None
    offset = np.clip(cell_log_ratios(grid, axis), -_LOG_RATIO_CLIP, _LOG_RATIO_CLIP)
    dev = [j for j, p in enumerate(grid.pools) if p.lower() != ref]
    onehot = np.zeros((grid.n_cells, len(dev)))
    g = grid.gpu_idx
    for k, j in enumerate(dev):
        onehot[g == j, k] = 1.0
    return offset, onehot


def _toml(v: object) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, float) and not np.isfinite(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def card_with_axis(card_text: str, axis: GpuAxis) -> str:
    """A prior card's TOML text with ``axis`` as its ``[gpu_axis]`` section (appended, replacing the
    card's own, e.g. the generic card's weakly informative one) and, where its ``[capacity]`` does
    not say, ``tp_departures = "orthogonal"`` (the departures a mixed-GPU certifying fit converges
    with: :func:`fleetsieve_bayes.model.joint.tp_departure`)."""
    lines = ["", "[gpu_axis]"] + [f"{k} = {_toml(v)}" for k, v in card_section(axis).items()]
    card_text = re.sub(r"(?ms)^\[gpu_axis\][^\n]*\n.*?(?=^\[|\Z)", "", card_text)
    text = card_text
    if "tp_departures" not in tomllib.loads(card_text).get("capacity", {}):
        text = re.sub(r"(?m)^(\[capacity\][^\n]*)$", lambda m: m.group(1) + '\ntp_departures = "orthogonal"', text,
                      count=1)
        if text == card_text:  # no [capacity] section
            text = text.rstrip("\n") + '\n\n[capacity]\ntp_departures = "orthogonal"\n'
    return text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
