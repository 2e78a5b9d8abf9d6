"""The model's inputs: a campaign's cells and measurement windows as fixed-shape arrays.

:class:`ModelData` is everything :func:`fleetsieve_bayes.model.joint.fleet_model` reads
(per cell ``(n_cells, ...)``, per class ``(n_classes,)``), built by :func:`model_data`;
:class:`WindowRows` holds every measurement window by cell (``(n_rows, 4)``, padded to a
multiple of :data:`ROW_BUCKET`), built by :func:`window_rows`. This module also owns the
rules on which observations count:

* :func:`usable_mask`: which measured metrics enter the continuous likelihood (a
  failed cell, 0 throughput or 0 success, enters none; a non-finite tail drops
  only that metric);
* :func:`load_failures`: which failed runs are evidence of overload (a failure at
  a load its class, GPU type and TP served below it and none above; the model's
  factor is :data:`fleetsieve_bayes.model.joint.FAILURE_SHARPNESS`);
* :func:`served_nothing`: measured cells without one usable window;
* the sizes of the GPU and TP axes (:func:`gpu_dev_count`, :func:`tp_dev_count`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.model.priors import PriorCard
from fleetsieve_bayes.model.roles import RoleInputs, role_inputs
from fleetsieve_bayes.model.scales import TINY as _TINY
from fleetsieve_bayes.model.scales import metric_transform

__all__ = [
    "ModelData",
    "WindowRows",
    "ROW_BUCKET",
    "usable_mask",
    "model_data",
    "gpu_dev_count",
    "tp_departure_sd",
    "tp_dev_count",
    "served_nothing",
    "window_rows",
    "load_failures",
    "fit_cells",
    "restrict",
    "RESTRICT_MIN_CELLS",
    "centred_pairs",
    "free_departures",
]

# Window rows are padded to a multiple of this (a new program per bucket, not per repeat).
ROW_BUCKET = 16
# A grid of more cells than this is sampled on its measured cells alone (:func:`fit_cells`,
# :func:`restrict`): an unmeasured cell adds nothing to the log density, but the full grid's
# potential computes its curves at every leapfrog step. At 1,134 cells (3 classes × 63
# configurations × 6 loads) with 18 measured, that is 60 times the work of the cells that
# count. Below it the full grid is cheap, and its programs (hence every campaign pinned on
# the shipped and suite grids, 22 to 60 cells) stay as they are.
RESTRICT_MIN_CELLS = 256
# The restricted cell count is padded to a power of two, at least this (a new program per
# bucket, not per measured cell).
FIT_CELL_BUCKET = 32


class ModelData(NamedTuple):
    """Fixed-shape inputs of :func:`~fleetsieve_bayes.model.joint.fleet_model` (all jnp arrays).

    ``n_classes`` is ``n_classes_max`` (padded classes have no cells and follow
    their prior).
    """

    widx: jnp.ndarray  # int32 (n_cells,): class of each cell
    u: jnp.ndarray  # (n_cells,): log2(TP)
    log_offered: jnp.ndarray  # (n_cells,): log offered_rps
    u_lo: jnp.ndarray  # (): smallest log2(TP) of the grid
    u_hi: jnp.ndarray  # (): largest log2(TP) of the grid
    cap_ref: jnp.ndarray  # (n_classes,): log median(offered_rps / TP) of the class
    load_ref: jnp.ndarray  # (n_classes,): median log offered_rps of the class
    observed: jnp.ndarray  # (n_cells, 4): natural units, placeholders (1.0) where not usable
    fit_mask: jnp.ndarray  # bool (n_cells, 4): metric enters the likelihood
    measured: jnp.ndarray  # bool (n_cells,)
    failed_under_load: jnp.ndarray  # bool (n_cells,): see :func:`load_failures`
    # Every measurement window, several per cell (None: one value per cell, the
    # Student-t likelihood of ``observed``; see :class:`WindowRows`).
    windows: WindowRows | None = None
    # The GPU axis (None: every cell on the card's GPU): per cell the roofline
    # log ratios (capacity, ttft, completion) of its GPU type to the card's
    # reference, (n_cells, 3), and which non-reference type it runs on,
    # one-hot (n_cells, n_gpu_dev) (a zero row: the reference). See
    # :func:`fleetsieve_bayes.model.gpu_axis.grid_gpu_inputs`.
    gpu_offset: jnp.ndarray | None = None
    gpu_onehot: jnp.ndarray | None = None
    # Which of the grid's TP degrees each cell runs at, one-hot (n_cells, n_tp)
    # (columns in increasing TP): the per-(class, TP) departures from the
    # smooth curves in TP (:func:`~fleetsieve_bayes.model.curves.tp_departure`) read it.
    tp_onehot: jnp.ndarray | None = None
    tp_log2: jnp.ndarray | None = None  # (n_tp,) log2 of the grid's TP degrees (tp_onehot's columns)
    # With a catalogue of configurations, tp_onehot's columns are its configurations
    # (in catalogue order; tp_log2 their engine's log2 TP), and ``roles`` what each
    # cell's configuration is to the model (model.roles; None: one engine of TP each).
    roles: RoleInputs | None = None
    # bool (n_classes, n_tp): the (class, TP or configuration) pairs whose capacity departure
    # is sampled centred on the smooth curve (:func:`~fleetsieve_bayes.model.curves.tp_departure`);
    # the others are sampled non-centred. None: every pair centred. Set on a grid of more than
    # RESTRICT_MIN_CELLS cells to the pairs with a measured cell (:func:`centred_pairs`).
    dev_centred: jnp.ndarray | None = None


class WindowRows(NamedTuple):
    """The measurement windows of a campaign, indexed by cell (jnp arrays).

    ``rows (n_rows, 4)`` natural units (1.0 where not usable), ``cell int32
    (n_rows,)`` the cell of each row, ``mask bool (n_rows, 4)`` the metric
    enters the likelihood (:func:`usable_mask` of the row; padding rows are all
    False). ``n_rows`` is padded to a multiple of :data:`ROW_BUCKET` so a
    campaign's program recompiles only every few repeats.
    """

    rows: jnp.ndarray
    cell: jnp.ndarray
    mask: jnp.ndarray
    # Success's likelihood per cell (see success.success_loglik): ``single bool
    # (n_rows,)`` the row is its cell's only success window (closed form);
    # the rows of cells with two or more, ``shared int32 (n_shared,)`` (row
    # indices, padded to a multiple of ROW_BUCKET, possibly 0), their cells
    # renumbered ``shared_cell int32 (n_shared,)`` into slots whose grid cell
    # is ``shared_slot int32 (n_shared,)``, ``shared_mask bool (n_shared,)``
    # (Gauss-Hermite over the departure the windows share).
    single: jnp.ndarray | None = None
    shared: jnp.ndarray | None = None
    shared_cell: jnp.ndarray | None = None
    shared_slot: jnp.ndarray | None = None
    shared_mask: jnp.ndarray | None = None
    # ``rank int32 (n_rows,)``: a usable success row's place among its cell's
    # by descending value (0 the highest; ties by row order), the order in
    # which success_node_loglik labels windows plain or burst.
    rank: jnp.ndarray | None = None


def usable_mask(
    observed: np.ndarray, measured_mask: np.ndarray, failed: np.ndarray | None = None
) -> np.ndarray:
    """Which measured metrics enter the continuous likelihood.

    Args:
        observed: ``(n_cells, 4)`` natural units (anything where not measured).
        measured_mask: bool ``(n_cells,)``.
        failed: optional bool ``(n_cells,)`` (the table's ``failure`` label).

    Returns:
        bool ``(n_cells, 4)``: measured, not a failed cell (throughput > 0 and
        success > 0 and not labelled failed), and the metric itself finite and > 0.
    """
    obs = np.asarray(observed, dtype=np.float64)
    m = np.asarray(measured_mask, dtype=bool)
    with np.errstate(invalid="ignore"):
        ok_cell = (
            m & np.isfinite(obs[:, 0]) & (obs[:, 0] > 0) & np.isfinite(obs[:, 3]) & (obs[:, 3] > 0)
        )
        if failed is not None:
            ok_cell &= ~np.asarray(failed, dtype=bool)
        ok_metric = np.isfinite(obs) & (obs > 0)
    return ok_cell[:, None] & ok_metric


def model_data(
    grid: CellGrid,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    n_classes_max: int | None = None,
    *,
    failed: np.ndarray | None = None,
    server_failed: np.ndarray | None = None,
    rows: np.ndarray | None = None,
    row_cell: np.ndarray | None = None,
    gpu: tuple[np.ndarray, np.ndarray] | None = None,
) -> ModelData:
    """Build the model's fixed-shape inputs.

    Args:
        grid: the candidate cells.
        observed: ``(n_cells, 4)`` METRICS values; only rows where
            ``measured_mask`` is True are read (NaN elsewhere is fine).
        measured_mask: bool ``(n_cells,)``.
        n_classes_max: pad the class axis to this size (default ``grid.n_classes``).
        failed: optional bool ``(n_cells,)`` of cells labelled as failures.
        server_failed: optional bool ``(n_cells,)`` of failed cells whose
            server never served (start-up failures, the memory guard): not
            evidence of overload (:func:`load_failures`).
        rows: optional ``(n_rows, 4)`` every measurement window (natural
            units), with ``row_cell int (n_rows,)`` its cell: the window-noise
            likelihood (:func:`~fleetsieve_bayes.model.joint.fleet_model`) reads these instead of
            ``observed``. A measured cell without a row (a failure inferred
            for every load of its TP) adds nothing to the likelihood, as its
            failed value would not.
        gpu: the GPU axis, ``(offset (n_cells, 3), onehot (n_cells, n_gpu_dev))``
            (:func:`fleetsieve_bayes.model.gpu_axis.grid_gpu_inputs`); None:
            every cell on the card's GPU. A class's capacity reference
            (``cap_ref``) is then on the reference GPU's scale.
    """
    n = grid.n_cells
    observed = np.asarray(observed, dtype=np.float64).reshape(n, 4)
    measured = np.asarray(measured_mask, dtype=bool).reshape(n)
    fit = usable_mask(observed, measured, failed)
    clean = np.where(fit, observed, 1.0)
    n_classes = grid.n_classes if n_classes_max is None else int(n_classes_max)
    if n_classes < grid.n_classes:
        raise ValueError(f"n_classes_max={n_classes} < {grid.n_classes} classes in the grid")
    roles = role_inputs(grid)
    # log2 of each cell's engine TP: its one engine's, or its decode role's (a
    # disaggregated cell; its capacity and tails read both roles, model.roles).
    u = np.log2(grid.tp.astype(np.float64)) if roles is None else np.asarray(roles.u_decode, np.float64)
    u_range = u if roles is None else np.concatenate([u, np.asarray(roles.u_prefill, np.float64)])
    per_gpu = grid.offered_rps / grid.tp
    if gpu is not None:  # each cell's load on the reference GPU's scale
        per_gpu = per_gpu / np.exp(np.asarray(gpu[0], np.float64)[:, 0])
    cap_ref = np.zeros(n_classes)
    load_ref = np.zeros(n_classes)
    overall = float(np.median(per_gpu[per_gpu > 0])) if np.any(per_gpu > 0) else 1.0
    log_load = np.log(np.maximum(grid.offered_rps, _TINY))
    overall_load = float(np.median(log_load)) if n else 0.0
    for w in range(n_classes):
        sel = (grid.workload_idx == w) & (per_gpu > 0)
        cap_ref[w] = math.log(float(np.median(per_gpu[sel])) if sel.any() else overall)
        load_ref[w] = float(np.median(log_load[sel])) if sel.any() else overall_load
    conf = grid.config_idx  # without a catalogue, the rank of each cell's TP
    return ModelData(
        widx=jnp.asarray(grid.workload_idx, dtype=jnp.int32),
        u=jnp.asarray(u),
        log_offered=jnp.asarray(np.log(np.maximum(grid.offered_rps, _TINY))),
        u_lo=jnp.asarray(float(u_range.min())),
        u_hi=jnp.asarray(float(u_range.max())),
        cap_ref=jnp.asarray(cap_ref),
        load_ref=jnp.asarray(load_ref),
        observed=jnp.asarray(clean),
        fit_mask=jnp.asarray(fit),
        measured=jnp.asarray(measured),
        failed_under_load=jnp.asarray(load_failures(grid, measured, fit, server_failed)),
        windows=None if rows is None else window_rows(rows, row_cell, measured, failed),
        gpu_offset=None if gpu is None else jnp.asarray(np.asarray(gpu[0], np.float64)),
        gpu_onehot=None if gpu is None else jnp.asarray(np.asarray(gpu[1], np.float64)),
        tp_onehot=jnp.asarray(
            (conf[:, None] == np.unique(conf)[None, :]).astype(np.float64).reshape(n, -1)
        ),
        tp_log2=jnp.asarray(np.array([u[conf == k][0] for k in np.unique(conf)], np.float64).reshape(-1)),
        roles=roles,
        dev_centred=centred_pairs(grid, measured, n_classes) if n > RESTRICT_MIN_CELLS else None,
    )


def centred_pairs(grid: CellGrid, measured: np.ndarray, n_classes: int) -> jnp.ndarray:
    """bool ``(n_classes, n_tp)``: the (class, configuration) pairs with a measured cell (columns
    as :attr:`ModelData.tp_onehot`'s: the grid's configurations, or its TP degrees, in order).

    A pair without one enters the likelihood nowhere: its departure is its prior, N(0, sd²),
    whatever the smooth curve. Sampled centred on the curve, its coordinate would have to move
    with every change of the knee, the curvature and the level (hundreds of such coordinates
    on a catalogue's grid: a ridge a diagonal mass crosses in tiny steps); sampled
    non-centred it is a standard normal that no other coordinate moves. A measured pair is
    sampled centred, the coordinate its measured loads pin (:func:`~fleetsieve_bayes.model.
    curves.tp_departure`)."""
    conf = grid.config_idx
    col = np.searchsorted(np.unique(conf), conf)
    out = np.zeros((n_classes, int(np.unique(conf).size)), bool)
    m = np.asarray(measured, bool)
    out[np.asarray(grid.workload_idx)[m], col[m]] = True
    return jnp.asarray(out)


def free_departures(data: ModelData, card: PriorCard) -> np.ndarray | None:
    """bool ``(n_classes, n_tp, 3)``: the departure coordinates (site ``tp_z``) that enter the
    log density only through their own standard-normal prior; None when there are none.

    They are, on a grid sampled on its measured cells (``data.dev_centred`` set, free
    departures): every column of a pair without a measured cell (:func:`centred_pairs`), and
    every column whose scale the card sets to 0. Their posterior is their prior, independent
    of every other coordinate, so a draw of them is exact whatever the chains did with them
    (:func:`fleetsieve_bayes.model.inference.redraw_free`)."""
    if data.dev_centred is None or card.capacity_tp_departures != "free" or not tp_dev_count(data, card):
        return None
    free = np.repeat(~np.asarray(data.dev_centred, bool)[:, :, None], 3, axis=2)
    free |= (np.asarray(tp_departure_sd(card)) == 0.0)[None, None, :]
    return free if free.any() else None


def gpu_dev_count(data: ModelData) -> int:
    """Non-reference GPU types of the model's GPU axis (0: no axis)."""
    return 0 if data.gpu_onehot is None else int(data.gpu_onehot.shape[1])


def tp_departure_sd(card: PriorCard) -> tuple[float, float, float]:
    """The card's per-(class, TP) departure scales ``(capacity, ttft, completion)``
    (``[capacity] tp_sd``, ``[ttft] tp_sd``, ``[completion] tp_sd``; log scale)."""
    return (card.capacity_tp_sd, card.ttft_tp_sd, card.completion_tp_sd)


def tp_dev_count(data: ModelData, card: PriorCard) -> int:
    """TP degrees of the per-(class, TP) departures (0: the card switches them off)."""
    if data.tp_onehot is None or not any(s > 0 for s in tp_departure_sd(card)):
        return 0
    return int(data.tp_onehot.shape[1])


def served_nothing(windows: WindowRows, measured: np.ndarray, observed: np.ndarray) -> np.ndarray:
    """bool ``(n_cells,)``: measured cells whose value is a failure (no metric usable,
    :func:`usable_mask`) and without one usable window: every window of them failed —
    the server never served, or nothing succeeded — or they are known to fail
    without a window of their own (a start-up failure at another load of their
    class, GPU type and TP). The window-noise posterior knows nothing of such a
    cell, so at an attainment level it is read as measured: it meets its SLOs in
    no window (``decision/bounds.py``, ``attainment_bounds``). A cell believed
    measured (a cell in flight, at its believed values) is not one.

    Args:
        windows: the fit's :class:`WindowRows`; ``measured`` bool ``(n_cells,)``;
            ``observed (n_cells, 4)`` the cells' values (read where measured).
    """
    measured = np.asarray(measured, bool)
    failed = measured & ~usable_mask(observed, measured).any(axis=1)
    usable = np.zeros(measured.shape[0], bool)
    usable[np.asarray(windows.cell)[np.asarray(windows.mask).any(axis=-1)]] = True
    return failed & ~usable


def window_rows(
    rows: np.ndarray, row_cell: np.ndarray, measured: np.ndarray, failed: np.ndarray | None = None
) -> WindowRows:
    """:class:`WindowRows` of ``rows (n_rows, 4)`` at cells ``row_cell (n_rows,)``.

    A row enters where its cell is measured and the row itself is usable
    (:func:`usable_mask`: a failed window — 0 throughput or success, or a
    ``failed`` cell — tells the continuous likelihood nothing).
    """
    rows = np.asarray(rows, np.float64).reshape(-1, 4)
    cell = np.asarray(row_cell, np.int64).reshape(-1)
    measured = np.asarray(measured, bool)
    if cell.shape[0] != rows.shape[0]:
        raise ValueError(f"row_cell has {cell.shape[0]} entries for {rows.shape[0]} rows")
    if cell.size and (cell.min() < 0 or cell.max() >= measured.shape[0]):
        raise ValueError("row_cell names a cell outside the grid")
    f = None if failed is None else np.asarray(failed, bool)[cell]
    mask = usable_mask(rows, measured[cell], f)
    n_pad = -(-max(rows.shape[0], 1) // ROW_BUCKET) * ROW_BUCKET
    pad = n_pad - rows.shape[0]
    clean = np.concatenate([np.where(mask, rows, 1.0), np.ones((pad, 4))])
    ok = mask[:, 3]
    per_cell = np.bincount(cell[ok], minlength=measured.shape[0])
    single = ok & (per_cell[cell] == 1)
    shared = np.flatnonzero(ok & (per_cell[cell] > 1))
    slots, local = np.unique(cell[shared], return_inverse=True)
    n_shared = -(-shared.size // ROW_BUCKET) * ROW_BUCKET
    value = np.where(ok, metric_transform(np.where(mask, rows, 1.0), np)[:, 3], -np.inf)
    order = np.lexsort((np.arange(cell.size), -value, cell))
    rank = np.empty(cell.size, np.int64)
    start = np.searchsorted(cell[order], cell[order], side="left")
    rank[order] = np.arange(cell.size) - start
    fill = n_shared - shared.size
    return WindowRows(
        rows=jnp.asarray(clean),
        cell=jnp.asarray(np.concatenate([cell, np.zeros(pad, np.int64)]), jnp.int32),
        mask=jnp.asarray(np.concatenate([mask, np.zeros((pad, 4), bool)])),
        single=jnp.asarray(np.concatenate([single, np.zeros(pad, bool)])),
        shared=jnp.asarray(np.concatenate([shared, np.zeros(fill, np.int64)]), jnp.int32),
        shared_cell=jnp.asarray(np.concatenate([local.reshape(-1), np.zeros(fill, np.int64)]), jnp.int32),
        shared_slot=jnp.asarray(np.concatenate([slots, np.zeros(n_shared - slots.size, np.int64)]), jnp.int32),
        shared_mask=jnp.asarray(np.concatenate([np.ones(shared.size, bool), np.zeros(fill, bool)])),
        rank=jnp.asarray(np.concatenate([rank, np.zeros(pad, np.int64)]), jnp.int32),
    )


def load_failures(
    grid: CellGrid, measured: np.ndarray, fit_mask: np.ndarray, server_failed: np.ndarray | None = None
) -> np.ndarray:
    """bool ``(n_cells,)``: measured cells that failed (no metric usable) where
    the same class, GPU type and TP served a lower load and no higher one — the engine
    fell over under load, not at start-up (a start-up OOM fails every load of
    its TP; a flaky start-up at one load is ``server_failed``). A failure
    beneath a load that worked is a fluke, not overload: tails and failures
    only grow with the load.

    Args:
        grid: the candidate cells.
        measured: bool ``(n_cells,)``.
        fit_mask: bool ``(n_cells, 4)`` (:func:`usable_mask`).
        server_failed: optional bool ``(n_cells,)``: failed cells whose server
            never served (a start-up failure): never counted.
    """
    measured = np.asarray(measured, bool)
    working = np.asarray(fit_mask, bool).any(axis=1)
    failed = measured & ~working
    if server_failed is not None:
        failed &= ~np.asarray(server_failed, bool)
    out = np.zeros(grid.n_cells, bool)
    for c in np.flatnonzero(failed):
        same = grid.same_curve(c) & working
        below = np.any(same & (grid.offered_rps < grid.offered_rps[c]))
        above = np.any(same & (grid.offered_rps > grid.offered_rps[c]))
        out[c] = bool(below and not above)
    return out


def fit_cells(data: ModelData) -> np.ndarray | None:
    """The cells a fit samples on: int ``(n_fit,)``, the measured cells in grid order padded
    to a power of two (at least :data:`FIT_CELL_BUCKET`) by repeating the first; None: the
    whole grid (at most :data:`RESTRICT_MIN_CELLS` cells, or no fewer after padding).

    Exact: an unmeasured cell enters the log density nowhere (its ``fit_mask`` row is False,
    it fails under no load it was not run at, and no window row names it)."""
    n = int(data.u.shape[0])
    if n <= RESTRICT_MIN_CELLS:
        return None
    measured = np.flatnonzero(np.asarray(data.measured))
    size = max(FIT_CELL_BUCKET, 1 << max(int(measured.size) - 1, 0).bit_length())
    if size >= n:
        return None
    first = int(measured[0]) if measured.size else 0
    return np.concatenate([measured, np.full(size - measured.size, first, np.int64)])


def restrict(data: ModelData, cells: np.ndarray) -> ModelData:
    """``data`` on ``cells`` (int ``(n_fit,)``, :func:`fit_cells`): every per-cell array
    gathered, the window rows renumbered to their cell's place; a repeated cell after its
    first place is padding (not measured, nothing usable). Per-class and per-configuration
    arrays, the TP range and the parameter shapes are the grid's, so a posterior of the
    restricted data is one of ``data`` (its deterministic sites computed on ``data``)."""
    cells = np.asarray(cells, np.int64)
    live = np.zeros(cells.size, bool)
    _, first = np.unique(cells, return_index=True)
    live[first] = True
    place = np.zeros(int(data.u.shape[0]), np.int64)
    place[cells[live]] = np.flatnonzero(live)
    idx = jnp.asarray(cells)

    def take(a: jnp.ndarray | None) -> jnp.ndarray | None:
        return None if a is None else jnp.asarray(a)[idx]

    def only_live(a: jnp.ndarray) -> jnp.ndarray:
        m = jnp.asarray(live).reshape((-1,) + (1,) * (a.ndim - 1))
        return jnp.where(m, a, False)

    windows = data.windows
    if windows is not None:
        remap = jnp.asarray(place)
        windows = windows._replace(
            cell=remap[windows.cell].astype(jnp.int32),
            shared_slot=None if windows.shared_slot is None else remap[windows.shared_slot].astype(jnp.int32),
        )
    roles = data.roles
    if roles is not None:
        roles = roles._replace(
            disagg=take(roles.disagg), u_prefill=take(roles.u_prefill), u_decode=take(roles.u_decode),
            log_workers=take(roles.log_workers), engine_x=take(roles.engine_x), config_col=take(roles.config_col),
        )
    return data._replace(
        widx=take(data.widx),
        u=take(data.u),
        log_offered=take(data.log_offered),
        observed=take(data.observed),
        fit_mask=only_live(take(data.fit_mask)),
        measured=only_live(take(data.measured)),
        failed_under_load=only_live(take(data.failed_under_load)),
        windows=windows,
        gpu_offset=take(data.gpu_offset),
        gpu_onehot=take(data.gpu_onehot),
        tp_onehot=take(data.tp_onehot),
        roles=roles,
    )
