"""The common initial design, identical for every strategy.

For every workload class and every TP candidate of that class, measure the
cell at the median offered load of that (class, TP) — the lower median when
the count is even. One probe per (class, TP) gives the model a first look at
the per-GPU capacity curve (where the knee is) and at the tails at a
mid-range load, without spending on the most expensive high-load cells.
The design is ordered like the grid (class, TP), so every strategy spends the
same GPU-seconds before its own choices start.

Over several GPU pools a class's probes are spread over its GPU types: the
class's TPs, in order, go to its types in turn, starting one type further on
for each class (a Latin rotation), so that every (class, type) is measured and
every type is seen at several TPs across the classes. That is what the model's
GPU axis learns from (a per-type deviation from the roofline ratio, pooled
over the classes). Where a class has more types than TPs, each type left
without a probe gets one at the class's middle TP. A (class, TP) that a type
does not offer goes to the next type in the rotation that does. A grid of one
pool gets exactly the single-type design.

A grid with a catalogue of configurations (``[[configs]]``) cannot afford one
probe per (class, configuration): 63 configurations would spend the design's
whole budget. Each class probes instead, at its median load:

- every aggregated TP degree once, its engine variant (the catalogue's entries
  of that TP) chosen in rotation over classes and TPs, so that across the
  classes every engine setting is seen;
- :data:`DISAGGREGATED_PROBES` disaggregated configurations, evenly spaced in
  their order by GPUs per replica and offset by class, so that different
  classes see different worker mixes.

That is what the model shares strength through: the capacity curve in TP from
the aggregated probes, the engine covariates from the rotation, and the
composition of disaggregated replicas from a few measured mixes.
"""

from __future__ import annotations

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid

# The names live in the strategy registry (the only list); re-exported for
# callers that import them with the design.
from fleetsieve_bayes.decision.strategies.registry import STRATEGY_NAMES

__all__ = ["initial_design", "STRATEGY_NAMES", "DISAGGREGATED_PROBES"]

# Disaggregated configurations each class probes in a catalogued design: two
# mixes per class, so that with 3 classes six mixes (a spread of worker ratios
# and per-role TPs) are measured before the acquisition starts.
DISAGGREGATED_PROBES = 2


def _median_load(grid: CellGrid, where: np.ndarray) -> int:
    """The cell at the (lower) median offered load among the cells of mask ``where`` ``(n_cells,)``."""
    idx = np.flatnonzero(where)
    idx = idx[np.argsort(grid.offered_rps[idx], kind="stable")]
    return int(idx[(len(idx) - 1) // 2])


def initial_design(grid: CellGrid) -> list[int]:
    """Cell indices of the initial design, in measurement order (class, then TP)."""
    if grid.catalogued:
        return _catalogue_design(grid)
    cells: list[int] = []
    gpu = grid.gpu_idx
    for w in range(grid.n_classes):
        in_w = grid.workload_idx == w
        tps = np.unique(grid.tp[in_w])
        types = np.unique(gpu[in_w])  # one type: every TP on it, the single-type design
        probed: set[int] = set()
        for j, tp in enumerate(tps):
            at = in_w & (grid.tp == tp)
            for s in range(types.size):
                g = int(types[(j + w + s) % types.size])
                if np.any(at & (gpu == g)):
                    cells.append(_median_load(grid, at & (gpu == g)))
                    probed.add(g)
                    break
        for g in (int(t) for t in types if int(t) not in probed):
            on = in_w & (gpu == g)
            tps_g = np.unique(grid.tp[on])
            cells.append(_median_load(grid, on & (grid.tp == tps_g[(len(tps_g) - 1) // 2])))
    return cells


def _catalogue_design(grid: CellGrid) -> list[int]:
    """The catalogued design (module docstring): per class, each aggregated TP once (engine
    variant in rotation) and :data:`DISAGGREGATED_PROBES` disaggregated mixes, at the median load."""
    assert grid.configs is not None
    conf = grid.config_idx
    gpu = grid.gpu_idx
    cells: list[int] = []
    for w in range(grid.n_classes):
        in_w = grid.workload_idx == w
        offered = sorted({int(c) for c in conf[in_w]})
        agg = [c for c in offered if not grid.configs[c].disaggregated]
        dis = sorted((c for c in offered if grid.configs[c].disaggregated),
                     key=lambda c: (grid.configs[c].gpus, c))
        picks: list[int] = []
        for j, tp in enumerate(sorted({grid.configs[c].tp for c in agg})):
            variants = [c for c in agg if grid.configs[c].tp == tp]
            picks.append(variants[(w + j) % len(variants)])
        k = min(DISAGGREGATED_PROBES, len(dis))
        if k:
            step = max(1, len(dis) // (k * max(grid.n_classes, 1)))
            chosen = {(((2 * i + 1) * len(dis)) // (2 * k) + w * step) % len(dis) for i in range(k)}
            picks += [dis[i] for i in sorted(chosen)]
        types = np.unique(gpu[in_w])
        for j, c in enumerate(picks):
            at = in_w & (conf == c)
            g = next((int(types[(j + w + s) % types.size]) for s in range(types.size)
                      if np.any(at & (gpu == types[(j + w + s) % types.size]))), int(types[0]))
            cells.append(_median_load(grid, at & (gpu == g)))
    return cells
