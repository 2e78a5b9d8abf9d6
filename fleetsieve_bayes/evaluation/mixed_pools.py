"""Synthetic mixed-pool fleets: one ground truth over 2–3 GPU types (issue 31's suite).

A fleet starts from a single-type synthetic fleet on the reference GPU
(:func:`fleetsieve_bayes.evaluation.synthetic.synthetic_fleet`, its table read
as H100 truth) and copies every cell onto the other GPU types through the
roofline (:func:`fleetsieve_bayes.model.gpu_axis.gpu_axis` of Llama 3.1 8B in
BF16), *at each class's own request shape* (prompt and output lengths drawn
per class): decode-heavy classes gain more from bandwidth, prefill-heavy ones
from FLOP/s, so the best type differs by class. On GPU ``g`` a cell of class
``w`` at TP ``t``:

* offers ``λ_g = λ · e^{r_cap}`` and serves ``e^{r_cap}`` times the reference
  cell's rate (the same utilisation), ``r_cap = r_cap(w, g, t)`` the log ratio
  of per-GPU capacity at the class's shape (the same load labels);
* has TTFT and completion p99s ``e^{r_ttft}``, ``e^{r_completion}`` times the
  reference cell's; the same success;
* carries the reference row's measurement noise (the same multiplicative
  departure from its truth), so the copy is a valid table row.

The campaign's prior card is the generic card plus a ``[gpu_axis]`` at the
card's *default* request shape (1,000 prompt, 250 output tokens), so every
class departs from the card's ratios by a class-specific amount: what the
model's per-type, per-class deviation must learn. Half the classes get SLOs
loose enough for slower GPUs (× the worst tail ratio); the others keep the
reference GPU's SLOs, which only fast types meet.

Pools: the reference pool is too small for an all-H100 answer on fleets
built to need a mix (``need_mix``: 35 % of the fleet size the demand was
drawn for); otherwise it holds 1.3× the H100s the demand needs; every
other pool 1.3× that in its own GPUs (by the card's mean capacity ratio),
at most :data:`MAX_POOL`. A type may still serve a class badly or not at all
within its SLOs (tails too slow). Prices are :data:`PRICES` × U(0.9, 1.1).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.evaluation.synthetic import KNEES, SyntheticSpec, synthetic_fleet, toml_value
from fleetsieve_bayes.model.derive import DEFAULT_WORKLOAD, Workload, load_architecture, load_gpus
from fleetsieve_bayes.model.gpu_axis import GpuAxis, card_with_axis, gpu_axis
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import METRICS

__all__ = ["MixedFleet", "PRICES", "REFERENCE", "mixed_fleet", "write_mixed", "single_type", "mixed_toml"]

REFERENCE = "h100-sxm-80gb"
OTHERS = ("a100-80gb", "l40s-48gb", "h200-141gb")
# Illustrative on-demand prices, $/GPU-hour (as benchmarks/pool_savings.py).
PRICES = {"h100-sxm-80gb": 4.0, "h200-141gb": 5.0, "a100-80gb": 2.0, "l40s-48gb": 1.0}
ARCH, DTYPE = "llama-3.1-8b", "bf16"
AXIS_TPS = (1, 2, 4, 8)
# Largest pool: the batched JAX allocator's pool DP has (count + 1)^pools
# states, and the acquisition runs it on every draw (a pool of 124 L40S made
# a round's acquisition take minutes on 2 shared cores).
MAX_POOL = 32


class MixedFleet(NamedTuple):
    """One mixed-pool fleet.

    ``table``: every GPU type's rows (docs/contracts.md columns, ``gpu``,
    ``true_*``); ``campaign``: the mapping of the mixed campaign;
    ``card_axis``: the card's GPU axis; ``truth_axis``: per class the true
    ratios (``(n_classes,)`` of :class:`GpuAxis`); ``info``: what was drawn.
    """

    table: pd.DataFrame
    campaign: dict[str, Any]
    card_axis: GpuAxis
    truth_axis: tuple[GpuAxis, ...]
    info: dict[str, Any]


def _spec(rng: np.random.Generator) -> SyntheticSpec:
    n_classes = int(rng.choice([2, 3]))
    tps = [(1, 2, 4), (1, 2, 4, 8), (2, 4, 8)][int(rng.integers(3))]
    knees = tuple(str(rng.choice(KNEES, p=[0.5, 0.25, 0.25])) for _ in range(n_classes))
    return SyntheticSpec(
        n_classes=n_classes, tps=tps, knees=knees, gpus=16, pressure=0.7,
        noise=float(rng.choice([0.02, 0.05])), critical="none", n_loads=4, slo_on_cell=True,
    )


def _copy_rows(ref: pd.DataFrame, axis: GpuAxis, gpu: str) -> pd.DataFrame:
    """The reference rows of one class on GPU ``gpu`` (see the module docstring)."""
    i = axis.row(gpu)
    col = np.array([axis.tps.index(int(t)) for t in ref["tp"]])
    r_cap, r_t, r_c = axis.log_capacity[i, col], axis.log_ttft[i, col], axis.log_completion[i, col]
    out = ref.copy()
    scale = np.exp(r_cap)
    out["offered_rps"] = np.round(ref["offered_rps"].to_numpy() * scale, 4)
    for pre in ("", "true_"):
        out[pre + "throughput_rps"] = ref[pre + "throughput_rps"].to_numpy() * scale
        out[pre + "ttft_p99_s"] = ref[pre + "ttft_p99_s"].to_numpy() * np.exp(r_t)
        out[pre + "completion_p99_s"] = ref[pre + "completion_p99_s"].to_numpy() * np.exp(r_c)
    # Served never above offered after rounding the offered rate.
    out["throughput_rps"] = np.minimum(out["throughput_rps"], out["offered_rps"])
    out["true_throughput_rps"] = np.minimum(out["true_throughput_rps"], out["offered_rps"])
    out["gpu"] = gpu
    return out


def mixed_fleet(rng: np.random.Generator, *, need_mix: bool) -> MixedFleet:
    """Draw one mixed-pool fleet (see the module docstring)."""
    spec = _spec(rng)
    ref_table, single = synthetic_fleet(rng, spec)
    types = [REFERENCE, *[str(g) for g in rng.choice(OTHERS, int(rng.integers(1, 3)), replace=False)]]
    specs = load_gpus()
    arch = load_architecture(ARCH)
    card_axis = gpu_axis(arch, [specs[g] for g in types], REFERENCE, dtype=DTYPE, tps=AXIS_TPS,
                         workload=DEFAULT_WORKLOAD)
    shapes = [Workload(float(rng.uniform(300, 3000)), float(rng.uniform(100, 600))) for _ in range(spec.n_classes)]
    truth = tuple(gpu_axis(arch, [specs[g] for g in types], REFERENCE, dtype=DTYPE, tps=AXIS_TPS, workload=s)
                  for s in shapes)
    ref_table = ref_table.assign(gpu=REFERENCE)
    parts = [ref_table]
    workloads = single["workloads"]
    for w_i, w in enumerate(workloads):
        rows = ref_table[ref_table["workload"] == w["name"]]
        parts += [_copy_rows(rows, truth[w_i], g) for g in types[1:]]
        if rng.random() < 0.5:  # loose SLOs: slower types can serve this class too
            worst = {m: float(np.max(getattr(truth[w_i], m)[np.isfinite(getattr(truth[w_i], m))]))
                     for m in ("log_ttft", "log_completion")}
            w["slo"] = dict(w["slo"])
            w["slo"]["ttft_p99_s"] = float(f"{w['slo']['ttft_p99_s'] * math.exp(worst['log_ttft']):.3g}")
            if "completion_p99_s" in w["slo"]:
                w["slo"]["completion_p99_s"] = float(
                    f"{w['slo']['completion_p99_s'] * math.exp(worst['log_completion']):.3g}")
    table = pd.concat(parts, ignore_index=True)
    prices = {g: round(PRICES[g] * float(rng.uniform(0.9, 1.1)), 2) for g in types}
    pools = []
    need = 1.3 * spec.pressure * spec.gpus  # about what the demand needs in H100s, with room
    for g in types:
        if g == REFERENCE:
            count = max(1, math.ceil(0.35 * spec.gpus)) if need_mix else math.ceil(need)
        else:
            cap = card_axis.log_capacity[card_axis.row(g)]
            count = min(MAX_POOL, math.ceil(need * math.exp(-float(np.mean(cap[np.isfinite(cap)])))))
        pools.append({"gpu": g, "count": int(count), "usd_per_gpu_hour": prices[g]})
    campaign = {
        "name": "mixed-pools",
        "fleet": {"pools": pools},
        "model": {"family": "card.toml"},
        "measurement": {"backend": "replay", "table": "grid.csv"},
        "stopping": {"epsilon": 0.05, "credible_level": 0.9, "slo_attainment": "point"},
        "workloads": workloads,
    }
    info = {"types": types, "need_mix": need_mix, "n_classes": spec.n_classes, "tps": list(spec.tps),
            "shapes": [list(s) for s in shapes], "prices": prices, "pools": {p["gpu"]: p["count"] for p in pools}}
    return MixedFleet(table, campaign, card_axis, truth, info)


def mixed_toml(campaign: dict[str, Any]) -> str:
    """TOML text of a campaign mapping with ``[[fleet.pools]]`` (and ``[[workloads]]``)."""
    lines = [f"name = {toml_value(campaign['name'])}", "", "[fleet]"]
    lines += [f"{k} = {toml_value(x)}" for k, x in campaign["fleet"].items() if k != "pools"]
    for p in campaign["fleet"].get("pools", []):
        lines += ["", "[[fleet.pools]]", *(f"{k} = {toml_value(x)}" for k, x in p.items())]
    for sec in ("model", "measurement", "stopping"):
        lines += ["", f"[{sec}]", *(f"{k} = {toml_value(x)}" for k, x in campaign[sec].items())]
    for w in campaign["workloads"]:
        lines += ["", "[[workloads]]", *(f"{k} = {toml_value(x)}" for k, x in w.items())]
    return "\n".join(lines) + "\n"


def write_mixed(directory: str | Path, fleet: MixedFleet) -> Path:
    """Write ``grid.csv``, ``card.toml`` (generic + the card's ``[gpu_axis]``) and ``campaign.toml``; the campaign's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fleet.table.to_csv(d / "grid.csv", index=False)
    generic = (data_dir("priors") / "generic.toml").read_text(encoding="utf-8")
    (d / "card.toml").write_text(card_with_axis(generic, fleet.card_axis), encoding="utf-8")
    (d / "campaign.toml").write_text(mixed_toml(fleet.campaign), encoding="utf-8")
    return d / "campaign.toml"


def single_type(directory: str | Path, fleet: MixedFleet, gpu: str) -> Path:
    """Write the campaign of one GPU type alone (its rows, its pool, the generic card); its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fleet.table[fleet.table["gpu"] == gpu].to_csv(d / "grid.csv", index=False)
    pool = next(p for p in fleet.campaign["fleet"]["pools"] if p["gpu"] == gpu)
    c = {**fleet.campaign, "name": f"single-{gpu}", "fleet": {"pools": [pool]}, "model": {"family": "generic"}}
    (d / "campaign.toml").write_text(mixed_toml(c), encoding="utf-8")
    return d / "campaign.toml"


def true_values(table: pd.DataFrame) -> pd.DataFrame:
    """The table with its noise-free ``true_*`` columns as the metrics (a copy)."""
    out = table.copy()
    for m in METRICS:
        out[m] = out[f"true_{m}"]
    return out
