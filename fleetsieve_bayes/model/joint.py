"""The joint hierarchical model of capacity, tail latency and success.

One NumPyro model, :func:`fleet_model`, over ALL candidate cells of a campaign
(fixed shapes; which cells are measured is a mask, so a campaign compiles once).

Per cell ``c`` of class ``w`` with ``u = log2(TP)`` and offered load ``λ``:

* per-GPU saturation capacity, concave in ``u`` with an interior knee ``m_w``::

      log κ_w(u) = a_w - b_w (u - m_w)^2,      replica capacity C = TP · κ_w(u)

  ``m_w = lo + (hi - lo) · sigmoid(z_w)`` over the grid's log2(TP) range padded
  by ``knee.edge_pad_log2`` on both sides, with ``z_w`` centred on the card's
  knee: the prior puts the peak inside the TP range, while the data can still
  push it to (or past) an edge, making capacity per GPU monotone over the grid.
* served throughput = smooth-min(λ, C) = ``(λ^-k + C^-k)^(-1/k)``.
* utilisation ``ρ = λ / C`` and two congestion terms (:func:`congestion`):
  ``h_queue = -log(1 - ρ_s)`` with ``ρ_s`` = ``ρ^γ`` smoothly capped at
  ``1 - RHO_GAP`` — flat at light load, blowing up like ``1/(1-ρ)`` (M/M/1-like
  p99) near saturation; ``h_succ = log(1 + ρ^γ)`` for success.
* past saturation the tails grow with the share of the load that cannot be
  served (:func:`overload_growth`): ``log(1 + Ω_w·max(0, ρ − 1))``, linear in
  the excess (a finite 300 s window), with ``Ω`` per class and tail metric, so
  an overloaded cell neither inflates the loads beneath it nor is capped by
  the knee's amplitude.
* tails (TTFT p99, completion p99):
  ``log L = base_w + slope (u - u_mid) + α_w (log λ - log λ_ref,w) + β_w h_queue
  + log(1 + Ω_w excess(ρ))``
  with a separate load elasticity ``α`` (the gradual rise below saturation as
  batches grow) and amplitude ``β`` per class and per tail metric — shares ``C``
  (through ``ρ``) with the capacity model, which is what makes a
  high-throughput, tail-infeasible cell visible before it is measured.
* success: ``logit s = s0_w - η_w h_succ``.
* partial pooling: every class-level parameter is a shared family offset plus
  a per-class deviation, both normal with the card's scales
  (:func:`class_prior`; whitened, so NUTS sees a well-conditioned posterior).
* GPU types (issue 31): a cell on GPU ``g`` adds to ``log C`` and to both
  tail bases ``r_g(TP) + δ_{w,g}``: the roofline log ratio of ``g`` to the
  card's reference GPU (from ``priors derive --also-gpus``) and a learned
  deviation per type, partially pooled across classes (:func:`gpu_deviation`);
  a grid on the reference GPU alone has no such term.
* noise: Student-t on the transformed scale (log throughput, log tails, logit
  success clipped to ``[SUCCESS_EPS, 1 - SUCCESS_EPS]``), one scale per metric
  (:data:`NOISE_FLOOR` plus a half-normal part) and one number of degrees of
  freedom per metric (:data:`NOISE_DFS`): heavy tails (5) for the tails and
  success, practically Gaussian (1000) for throughput.

The true metrics of every cell are the deterministic site ``"latent"``
``(n_cells, 4)`` in natural units (METRICS order); the capacity is ``"capacity"``
``(n_cells,)`` (req/s per replica).

Failed and unusable observations. A cell measured as a failure (throughput 0
or success 0 — start-up OOM, crash, every request failed) is a structural
event, not a point on the smooth curves: it is *excluded* from the continuous
likelihood (its ``fit_mask`` row is all False) and enters decisions only through
:func:`fleetsieve_bayes.decision.bounds.credible_bounds`, which collapses a measured cell
to its measured values (0 throughput, 0 success: infeasible). A non-finite tail
on an otherwise working cell drops only that metric. Pass ``failed=`` to
:func:`model_data` to exclude cells by their ``failure`` label as well.
One thing a failed run does tell the curves: one that failed at a load its
class and TP served below it and none above (:func:`load_failures`; not a
start-up OOM, which fails every load of its TP) is evidence that the cell is overloaded,
``log sigmoid(k log ρ)`` in the log density (:data:`FAILURE_SHARPNESS`).

Observation model as pure JAX functions (used by the acquisition kernel):
:func:`obs_logpdf` and :func:`sample_obs`, with ``noise (..., 4)`` = the
per-metric Student-t scales; the degrees of freedom are the module constant
:data:`NOISE_DF` (not a card field, so these functions need no card).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.model.priors import PriorCard
from fleetsieve_bayes.model.scales import SUCCESS_EPS, metric_transform
from fleetsieve_bayes.model.scales import TINY as _TINY

__all__ = [
    "ModelData",
    "WindowRows",
    "window_rows",
    "served_nothing",
    "window_scales",
    "window_attainment",
    "window_probabilities",
    "WINDOW_COLUMNS",
    "cell_offsets",
    "success_offsets",
    "offset_moments",
    "offsets_from_moments",
    "offset_normals",
    "probabilities_given_offsets",
    "ROW_BUCKET",
    "model_data",
    "fleet_model",
    "obs_logpdf",
    "sample_obs",
    "obs_from_normals",
    "to_transformed",
    "from_transformed",
    "NOISE_DF",
    "NOISE_DFS",
    "THROUGHPUT_NOISE_DF",
    "SUCCESS_EPS",
    "NOISE_FLOOR",
    "usable_mask",
    "congestion",
    "class_prior",
    "latent_metrics",
    "RHO_GAP",
    "init_unconstrained",
    "load_failures",
    "FAILURE_SHARPNESS",
    "gpu_dev_count",
    "tp_dev_count",
    "gpu_deviation",
    "GPU_DEVIATION_LOG_SD",
    "GPU_DEVIATION_CLASS_SD",
]

# Student-t degrees of freedom of the observation noise of the tails and
# success (heavy tails: one odd measurement, e.g. the 94.3 % success repeat in
# the paper, must not drag a curve).
NOISE_DF = 5.0  # an integer: sample_obs draws it from normals
# ... and of throughput: practically Gaussian. A served rate averaged over a
# 300 s window is precise, and with heavy tails a chain can call a saturated
# cell's throughput an outlier: a second mode with the class's capacity far
# above what was measured (suite fleets c016, c033: one chain in four there
# for ever, r_hat 1.4-1.5; Gaussian throughput noise: r_hat ≤ 1.01 in the first
# 400 draws on the same states).
THROUGHPUT_NOISE_DF = 1000.0
# Per metric, METRICS order.
NOISE_DFS = (THROUGHPUT_NOISE_DF, NOISE_DF, NOISE_DF, NOISE_DF)
# log Γ((ν+1)/2) − log Γ(ν/2) − ½ log(νπ) per metric: the Student-t constant.
_T_LOG_CONST = tuple(
    math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi) for df in NOISE_DFS
)
# Lower bounds of the per-metric noise scales (transformed scale). The curves
# are approximations: a measurement that matches them to 0.1 % (throughput
# below saturation) must not make the posterior arbitrarily stiff, which would
# also wreck NUTS's step size.
NOISE_FLOOR = (0.03, 0.03, 0.03, 0.1)
# What the sampled sites mean at a given shape. A saved sampler state moves its chains in these
# coordinates, so one saved under another value seeds no fit (model.inference's sampler keys).
# 2: the capacity departure at each TP sampled centred (tp_departure).
COORDINATES = 2
# Columns of the class-level parameter matrix (sites class_mean, class_sd, class_eps).
_CLASS_PARAMS = (
    "knee_logit",
    "log_curvature",
    "cap_shift",
    "log_ttft_base",
    "log_completion_base",
    "log_ttft_blowup",
    "log_completion_blowup",
    "succ_logit_base",
    "log_succ_drop",
    "ttft_elasticity",
    "completion_elasticity",
    "log_ttft_overload_dev",
    "log_completion_overload_dev",
    "log_sharpness_dev",
)
# Tail congestion term (see :func:`congestion`): ρ^γ is capped smoothly at
# 1 - RHO_GAP, so -log(1 - ρ_s) ≤ -log(RHO_GAP) ≈ 3 (tails × e^{3β} at most from
# queueing; past saturation :func:`overload_growth` adds log(1 + Ω·(ρ − 1))).
RHO_GAP = 0.05
_CAP_SHARPNESS = 25.0
# Overload of the tails (see :func:`overload_growth`): Ω per class and tail
# metric, a family level per tail metric (the ``global`` site), log-normal with
# a wide prior (95 % within ×/÷ 20 of the median), plus a class deviation of sd
# OVERLOAD_CLASS_SD. Per class because how fast a p99 grows past saturation is
# a property of how the class is driven and how long its requests are: an
# open-loop rate piles up a queue that grows with the window (a late request
# waits about (ρ − 1)·T), a closed loop of N requests only queues the N − N_sat
# it cannot serve (a wait of about the service time), and either is relative
# to the class's own light-load p99. On the shipped grid chat's TTFT grows 3.4×
# from ρ 1.3 to 2 and code's 2.5× from ρ 1.3 to 3.3; one global Ω fits neither
# (leave-one-cell-out TTFT coverage: docs/results.md, "Calibration").
# The family median is 5: the p99 past saturation grows about 5× per unit of
# excess load. Open-loop queues in a 300 s window grow faster (the suite's
# truth: 1 + 6(ρ − 1)), closed loops slower (ρ²: about 1 + 3(ρ − 1)); the
# shipped grid's code class sits near 1 and its chat class at 30 or more, all
# inside the prior's 95 % range [0.26, 95]. With a median of 30 the shipped
# campaign's certifying fit needs 2,000 draws per chain instead of 1,600.
# Model constants, like NOISE_DF, not prior-card keys.
OVERLOAD_LOG_MEDIAN = math.log(5.0)
OVERLOAD_LOG_SD = 1.5
OVERLOAD_CLASS_SD = 1.0
_OVER_SHARPNESS = 40.0
# The GPU axis: a class's capacity and tail bases on a GPU type are the
# roofline ratio to the card's reference GPU times a learned deviation, log
# scale, per type and column (capacity, ttft, completion): a family level
# shared by the classes (95 % within ×/÷ 1.8 of the roofline) plus a class's
# departure from it (95 % within ×/÷ 1.2: what a class's own prompt and output
# lengths move its roofline ratio by). Narrower than a class's departure at one
# TP ([capacity] tp_sd), so a dip measured at a TP on one type alone is read
# mostly as the class's at that TP, not as a deviation of the type that would
# move every other TP on it (docs/results.md, "Several GPU types"). Model
# constants, like OVERLOAD_CLASS_SD.
GPU_DEVIATION_LOG_SD = 0.3
GPU_DEVIATION_CLASS_SD = 0.1
# Failure under load (see :func:`load_failures`): P(fail | ρ) ∝ sigmoid(k log ρ)
# with k = FAILURE_SHARPNESS: against deep overload, a failed run makes ρ = 1
# half as likely, ρ = 0.8 a seventh, ρ = 0.5 e^-5.5 times.
FAILURE_SHARPNESS = 8.0
# Window rows are padded to a multiple of this (a new program per bucket, not per repeat).
ROW_BUCKET = 16
# A cell's windows share its logit-success departure δ_s ~ N(0, a²), and each
# window is plain or in a burst (_burst_logpdf). Summed over which of a cell's
# _BURST_LABELLED highest windows burst (every subset, _SUBSETS), the plain
# windows and the prior make a normal in δ_s that integrates exactly; what is
# left (a burst window's normal cdf, the mixture density of any lower window)
# is integrated by Gauss-Hermite on that normal (_success_node_loglik).
_BURST_LABELLED = 3
_SUBSETS = np.array([[(b >> j) & 1 for j in range(_BURST_LABELLED)] for b in range(2**_BURST_LABELLED)], bool)
# windows a subset needs: one more than its highest burst position (0 for none)
_SUBSET_NEEDS = np.array([int(b).bit_length() for b in range(2**_BURST_LABELLED)])
# 9 nodes: docs/results.md "Success quadrature" (error and cost against 7 and 15).
_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(9)
_GH_LOGW = np.log(_GH_WEIGHTS / math.sqrt(2 * math.pi))


class ModelData(NamedTuple):
    """Fixed-shape inputs of :func:`fleet_model` (all jnp arrays).

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
    # smooth curves in TP (:func:`tp_departure`) read it.
    tp_onehot: jnp.ndarray | None = None
    tp_log2: jnp.ndarray | None = None  # (n_tp,) log2 of the grid's TP degrees (tp_onehot's columns)


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
    # Success's likelihood per cell (see _window_likelihood): ``single bool
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
    # which _success_node_loglik labels windows plain or burst.
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
            likelihood (:func:`fleet_model`) reads these instead of
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
    u = np.log2(grid.tp.astype(np.float64))
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
    return ModelData(
        widx=jnp.asarray(grid.workload_idx, dtype=jnp.int32),
        u=jnp.asarray(u),
        log_offered=jnp.asarray(np.log(np.maximum(grid.offered_rps, _TINY))),
        u_lo=jnp.asarray(float(u.min())),
        u_hi=jnp.asarray(float(u.max())),
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
            (grid.tp[:, None] == np.unique(grid.tp)[None, :]).astype(np.float64).reshape(n, -1)
        ),
        tp_log2=jnp.asarray(np.log2(np.unique(grid.tp).astype(np.float64))),
    )


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


# --- transforms and the observation model (pure JAX) -------------------------


def to_transformed(y: jnp.ndarray) -> jnp.ndarray:
    """Natural units → modelling scale. ``y (..., 4)`` → ``(..., 4)``:
    log throughput, log ttft, log completion, logit(clipped success)
    (:func:`fleetsieve_bayes.model.scales.metric_transform` in JAX)."""
    return metric_transform(y, jnp)


def from_transformed(z: jnp.ndarray) -> jnp.ndarray:
    """Inverse of :func:`to_transformed` (success in ``(0, 1)``). ``z (..., 4)`` → ``(..., 4)``."""
    return jnp.concatenate([jnp.exp(z[..., :3]), jax.nn.sigmoid(z[..., 3:4])], axis=-1)


def obs_logpdf(y: jnp.ndarray, latent: jnp.ndarray, noise: jnp.ndarray) -> jnp.ndarray:
    """Log density of observations given the latent metrics, summed over the 4 metrics.

    Student-t (degrees of freedom :data:`NOISE_DFS`, per metric) on the
    transformed scale centred on the transformed latent. The Jacobian of the transform depends on ``y`` only, so
    it is omitted: ratios between posterior draws (importance weights) are exact.

    Args:
        y: ``(..., 4)`` observation, natural units.
        latent: ``(..., 4)`` true metrics, natural units.
        noise: ``(..., 4)`` per-metric scales on the transformed scale.

    Returns:
        ``(...)``.
    """
    r = (to_transformed(y) - to_transformed(latent)) / noise
    df = jnp.asarray(NOISE_DFS)
    const = jnp.asarray(_T_LOG_CONST)  # computed in float64: lgamma of large df cancels
    lp = const - jnp.log(noise) - 0.5 * (df + 1) * jnp.log1p(r * r / df)
    return jnp.sum(lp, axis=-1)


def sample_obs(key: jax.Array, latent: jnp.ndarray, noise: jnp.ndarray) -> jnp.ndarray:
    """Draw observations given latent metrics; ``latent (..., 4)``, ``noise (..., 4)`` →
    ``y (..., 4)`` in natural units (success in ``(0, 1)``).

    The Student-t(5) draw of the tails and success is built from six standard
    normals, ``t = z0 / sqrt(Σ_{i=1..5} z_i² / 5)`` — exact for the integer
    :data:`NOISE_DF`, and far cheaper to compile than ``jax.random.t`` (whose
    gamma rejection sampler costs seconds of XLA compile time per shape).
    Throughput's draw is ``z0`` itself: a standard normal for the Student-t
    with :data:`THROUGHPUT_NOISE_DF` = 1000 (variance 1.002).
    """
    shape = jnp.broadcast_shapes(latent.shape, noise.shape)
    z = jax.random.normal(key, (int(NOISE_DF) + 1, *shape), dtype=jnp.result_type(latent, noise))
    return obs_from_normals(latent, noise, z)


def obs_from_normals(latent: jnp.ndarray, noise: jnp.ndarray, z: jnp.ndarray) -> jnp.ndarray:
    """:func:`sample_obs` given its standard normals ``z (NOISE_DF + 1, ..., 4)``: in JAX, or in
    NumPy for NumPy arrays (draws that need no compiled program, e.g. a posterior's
    predictive, whose shape changes with every number of draws)."""
    df = int(NOISE_DF)
    if namespace(latent, noise, z) is np:
        eps = z[0] / np.sqrt(np.sum(z[1:] ** 2, axis=0) / df)
        eps = np.where(np.arange(4) == 0, z[0], eps)
        t = metric_transform(latent, np) + noise * eps
        return np.concatenate([np.exp(t[..., :3]), 0.5 * (1.0 + np.tanh(0.5 * t[..., 3:4]))], axis=-1)
    eps = z[0] * jax.lax.rsqrt(jnp.sum(z[1:] ** 2, axis=0) / df)
    eps = jnp.where(jnp.arange(4) == 0, z[0], eps)
    return from_transformed(to_transformed(latent) + noise * eps)


# --- the model ----------------------------------------------------------------


def congestion(log_rho: jnp.ndarray, exponent: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The two congestion terms of utilisation ``ρ`` (from ``log_rho (...)``).

    Returns ``(h_queue, h_succ)``, each ``(...)``:

    * ``h_queue = -log(1 - ρ_s)``: a queueing blow-up. ``ρ_s`` is ``ρ^γ``
      smoothly capped at ``1 -`` :data:`RHO_GAP` (``≈ 1 - ρ^γ`` well below
      saturation, so the term grows like ``-log(1 - ρ^γ)``: flat at light
      load, steep as ``ρ → 1`` — the M/M/1 p99 scales like ``1/(1-ρ)``). Near
      ``ρ ≈ 1`` a small uncertainty in capacity becomes a large one in the
      tails — which is what makes their intervals honest there. Past
      saturation it stays at ``-log RHO_GAP``; what grows there is
      :func:`overload_growth`.
    * ``h_succ = log(1 + ρ^γ)``: success degrades mostly in overload.
    """
    x = exponent * log_rho  # log ρ^γ
    rho_g = jnp.exp(jnp.minimum(x, 30.0))
    # 1 - ρ_s = gap + softplus(k (1 - gap - ρ^γ)) / k  ∈ (gap, 1]
    one_minus = RHO_GAP + jax.nn.softplus(_CAP_SHARPNESS * (1.0 - RHO_GAP - rho_g)) / _CAP_SHARPNESS
    return -jnp.log(one_minus), jax.nn.softplus(x)


def overload_growth(log_rho: jnp.ndarray, overload: jnp.ndarray) -> jnp.ndarray:
    """``log(1 + Ω · excess(ρ))``: how much a tail grows past saturation.

    ``excess ≈ max(0, ρ - 1)`` (smoothly): past saturation the queue of a window
    of length T grows by ``(λ - C)·t`` requests, so a late request waits about
    ``(ρ - 1)·T`` — the p99 grows linearly in ``ρ - 1``, on top of the
    steady-state tail and independently of the amplitude ``β`` of the queueing
    term beneath the knee. Flat-then-explode curves (0.18 s → 0.24 s → 23 s
    over three loads) are then fit by the overload of the last cell alone,
    without inflating the loads beneath it (which a larger ``β`` or a lower
    capacity would do), and a curve that keeps growing steeply past the knee
    (1.5 s → 26 s → 55 s) is not capped by a ``β`` that the knee fixed.

    Args:
        log_rho: ``(n_cells,)`` log utilisation.
        overload: ``(n_cells, k)`` ``Ω`` of each cell's class, one per tail metric.

    Returns:
        ``(n_cells, k)``, 0 below saturation.
    """
    excess = jax.nn.softplus(_OVER_SHARPNESS * jnp.expm1(jnp.minimum(log_rho, 30.0))) / _OVER_SHARPNESS
    return jnp.log1p(overload * excess[:, None])


# --- window noise -------------------------------------------------------------
# Columns of the window-noise sites: ``window_g (7,)`` family level (standard
# normal, scaled by the card's [window] section) and ``window_z (n_classes, 6)``
# class deviations (standard normal). See :func:`window_scales`.
_WINDOW_G = (
    "log_ttft_light",
    "log_completion_light",
    "log_ttft_knee",
    "log_completion_knee",
    "log_success_sd",
    "logit_burst",
    "log_burst_drop",
)
N_WINDOW_CLASS = 6  # the first six of _WINDOW_G deviate per class
# Columns of the deterministic site ``window (n_cells, 6)``.
WINDOW_COLUMNS = ("throughput_sd", "ttft_sd", "completion_sd", "success_sd", "burst_probability", "burst_drop")


def window_scales(card: PriorCard, g: jnp.ndarray, z: jnp.ndarray, log_rho: jnp.ndarray, widx: jnp.ndarray) -> jnp.ndarray:
    """Each cell's window noise from the window sites.

    Args:
        g: ``(7,)`` standard-normal family level (:data:`_WINDOW_G` order).
        z: ``(n_classes, 6)`` standard-normal class deviations.
        log_rho: ``(n_cells,)`` log utilisation of each cell.
        widx: int ``(n_cells,)`` class of each cell.

    Returns:
        ``(n_cells, 6)`` (:data:`WINDOW_COLUMNS`): throughput's log-scale sd
        (the card's, fixed); tail log-scale sds
        ``s0 + s1 · sigmoid((ρ − ρ_k)/width)`` (TTFT, completion) — small at
        light load, ``s0 + s1`` past the knee; success's logit sd outside
        bursts; the burst probability ``π``; the mean logit drop of a burst.
    """
    c = card
    light = jnp.log(jnp.array([c.window_tail_light_sd, c.window_tail_light_sd]))
    knee = jnp.log(jnp.array([c.window_tail_knee_sd, c.window_tail_knee_sd]))
    tsd, tcl = c.window_tail_log_sd, c.window_tail_class_sd
    s0 = jnp.exp(light + tsd * g[0:2] + tcl * z[:, 0:2])  # (n_classes, 2)
    s1 = jnp.exp(knee + tsd * g[2:4] + tcl * z[:, 2:4])
    succ_sd = jnp.exp(math.log(c.window_success_sd) + c.window_success_log_sd * g[4] + tcl * z[:, 4])
    p0 = c.window_burst_probability
    burst = jax.nn.sigmoid(math.log(p0 / (1 - p0)) + c.window_burst_logit_sd * g[5] + c.window_burst_class_sd * z[:, 5])
    drop = jnp.exp(math.log(c.window_burst_drop) + c.window_burst_drop_log_sd * g[6])
    near = jax.nn.sigmoid((jnp.exp(jnp.minimum(log_rho, 10.0)) - c.window_knee_utilisation) / c.window_knee_width)
    tails = s0[widx] + s1[widx] * near[:, None]
    thr = jnp.full(widx.shape + (1,), c.window_throughput_sd, tails.dtype)
    return jnp.concatenate(
        [thr, tails, succ_sd[widx][:, None], burst[widx][:, None], jnp.broadcast_to(drop, widx.shape)[:, None]],
        axis=-1,
    )


def _compound_loglik(d: jnp.ndarray, w: jnp.ndarray, cell: jnp.ndarray, n_cells: int, a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """Log density of every cell's windows under ``y = μ_c + δ_c + ε``, ``δ_c ~ N(0, a²)``
    (the curve's discrepancy at the cell, shared by its windows) and ``ε ~ N(0, b_c²)``
    (window noise), with ``δ`` integrated out (compound-symmetric normal).

    Args:
        d: ``(n_rows, k)`` residuals ``y − μ`` on the transformed scale.
        w: ``(n_rows, k)`` 1 where a row's metric enters, else 0.
        cell: int ``(n_rows,)``; a: ``(k,)``; b: ``(n_cells, k)``.

    Returns:
        ``()`` the summed log density.
    """
    n = jax.ops.segment_sum(w, cell, n_cells)
    s1 = jax.ops.segment_sum(w * d, cell, n_cells)
    s2 = jax.ops.segment_sum(w * d * d, cell, n_cells)
    a2, b2 = a * a, b * b
    tot = b2 + n * a2
    # Sherman-Morrison: d'Σ⁻¹d = (Σd² − a² (Σd)² / (b² + n a²)) / b²,
    # log det Σ = 2 (n − 1) log b + log(b² + n a²).
    ll = (
        -0.5 * n * math.log(2 * math.pi)
        - (n - 1.0) * jnp.log(b)
        - 0.5 * jnp.log(tot)
        - 0.5 * (s2 - a2 * s1 * s1 / tot) / b2
    )
    return jnp.sum(jnp.where(n > 0, ll, 0.0))


def _burst_logpdf(x: jnp.ndarray, sd: jnp.ndarray, p: jnp.ndarray, drop: jnp.ndarray) -> jnp.ndarray:
    """Log density of a window's logit-success residual ``x``: ``N(0, sd²)`` with
    probability ``1 − p``, else ``N(0, sd²) − D`` with ``D`` exponential of mean
    ``drop`` (an exponentially modified normal). Elementwise, all ``(...)``."""
    lam = 1.0 / drop
    core = -0.5 * (x / sd) ** 2 - jnp.log(sd) - 0.5 * math.log(2 * math.pi)
    # f(x) = λ exp(λ²sd²/2 + λx) Φ(−x/sd − λ sd)
    burst = jnp.log(lam) + 0.5 * (lam * sd) ** 2 + lam * x + jax.scipy.special.log_ndtr(-x / sd - lam * sd)
    return jnp.logaddexp(jnp.log1p(-p) + core, jnp.log(p) + burst)


def _burst_sf(x: jnp.ndarray, sd: jnp.ndarray, p: jnp.ndarray, drop: jnp.ndarray) -> jnp.ndarray:
    """``P(residual ≥ −x)``: the probability that a window's logit success is at
    least ``truth − x`` under :func:`_burst_logpdf`'s mixture; ``(...)``."""
    lam = 1.0 / drop
    core = jax.scipy.special.ndtr(x / sd)
    # P(D + sd·N ≤ x) = Φ(x/sd) − exp(λ²sd²/2 − λx) Φ(x/sd − λ sd)
    tail = jnp.exp(0.5 * (lam * sd) ** 2 - lam * x + jax.scipy.special.log_ndtr(x / sd - lam * sd))
    burst = jnp.clip(core - tail, 0.0, 1.0)
    return (1.0 - p) * core + p * burst


def offset_moments(
    latent: jnp.ndarray, noise: jnp.ndarray, windows: WindowRows
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The sufficient statistics of each cell's windows for its departure ``δ``:
    ``n (n_cells, 3)`` windows that enter per metric (throughput, TTFT,
    completion) and ``s1 (n_draws, n_cells, 3)`` their summed log residuals
    from the draw's curve. ``latent (n_draws, n_cells, 4)``; ``noise`` unused
    (kept for a uniform signature)."""
    del noise
    n_cells = latent.shape[1]
    y = jnp.log(jnp.maximum(windows.rows[:, :3], _TINY))  # (R, 3)
    mu = jnp.log(jnp.maximum(latent[:, windows.cell, :3], _TINY))  # (D, R, 3)
    w = windows.mask[:, :3].astype(latent.dtype)
    onehot = (windows.cell[:, None] == jnp.arange(n_cells)[None, :]).astype(latent.dtype)  # (R, C)
    n = jnp.einsum("rc,rk->ck", onehot, w)  # (C, 3)
    s1 = jnp.einsum("rc,drk->dck", onehot, w * (y[None] - mu))  # (D, C, 3)
    return n, s1


def offsets_from_moments(
    n: jnp.ndarray, s1: jnp.ndarray, a: jnp.ndarray, b: jnp.ndarray, z: jnp.ndarray
) -> jnp.ndarray:
    """``δ = m + sqrt(v)·z``: the conjugate posterior of :func:`_compound_loglik`'s
    ``δ`` given ``n`` windows summing to ``s1`` (``m = a² s1 / (b² + n a²)``,
    ``v = a² b² / (b² + n a²)``); all arguments broadcast (``a``: the curve's
    discrepancy sd, ``b``: the window sd, ``z``: standard normals)."""
    a2, b2 = a * a, b * b
    tot = b2 + n * a2
    return a2 * s1 / tot + jnp.sqrt(a2 * b2 / tot) * z


def cell_offsets(
    key: jax.Array, latent: jnp.ndarray, noise: jnp.ndarray, window: jnp.ndarray, windows: WindowRows
) -> jnp.ndarray:
    """Draws of each cell's departure ``δ`` from the curve (log throughput, log
    TTFT, log completion), given its windows: the conjugate normal posterior of
    :func:`_compound_loglik`'s ``δ_c`` per posterior draw (the prior ``N(0, a²)``
    for a cell never measured), sampled with ``key`` (common random numbers:
    deterministic for a key; the normals are :func:`offset_normals`).

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)`` (``a`` = its
            first three columns); window: ``(n_draws, n_cells, 6)``.

    Returns:
        ``(n_draws, n_cells, 4)``: log throughput, log TTFT, log completion
        (conjugate normal) and logit success (:func:`success_offsets`).
    """
    n, s1 = offset_moments(latent, noise, windows)
    z = offset_normals(key, latent)
    delta = offsets_from_moments(n[None], s1, noise[:, None, :3], window[..., 0:3], z)
    return jnp.concatenate([delta, success_offsets(key, latent, noise, window, windows)[..., None]], axis=-1)


def success_offsets(
    key: jax.Array, latent: jnp.ndarray, noise: jnp.ndarray, window: jnp.ndarray, windows: WindowRows
) -> jnp.ndarray:
    """Draws ``(n_draws, n_cells)`` of each cell's logit-success departure ``δ_s``
    from the curve given its windows: per posterior draw, one of the quadrature
    nodes of :func:`_success_node_loglik` (prior ``N(0, a²)``, ``a =
    noise[:, 3]``) picked with probability ∝ its term, by a uniform of ``key``
    (common random numbers). A cell never measured gets a draw of its prior
    ``a·z``. ``windows`` must be concrete (its measured cells are selected
    before the quadrature)."""
    n_cells = latent.shape[1]
    k_u, k_z = jax.random.split(jax.random.fold_in(key, 4))
    u = jax.random.uniform(k_u, latent.shape[:2], latent.dtype)
    z = jax.random.normal(k_z, latent.shape[:2], latent.dtype)
    prior = noise[:, 3:4] * z
    mask = np.asarray(windows.mask[:, 3])
    row_cell = np.asarray(windows.cell)
    slots = np.unique(row_cell[mask])
    if slots.size == 0:
        return prior
    # measured cells padded to a bucket (padding slots: no rows, dropped), so a
    # campaign's rounds reuse one compiled shape while cells are added
    n_slots = -(-slots.size // ROW_BUCKET) * ROW_BUCKET
    cells = np.concatenate([slots, np.full(n_slots - slots.size, n_cells)])
    take = np.minimum(cells, n_cells - 1)
    local = np.where(mask, np.searchsorted(slots, row_cell), 0)
    picked = _picked_success_offsets(
        to_transformed(windows.rows)[:, 3], latent[:, take, 3], windows.mask[:, 3], jnp.asarray(local, jnp.int32),
        windows.rank, noise[:, 3], window[:, take], u[:, take],
    )
    return prior.at[:, cells].set(picked, mode="drop")


@jax.jit
def _picked_success_offsets(
    y: jnp.ndarray, success: jnp.ndarray, mask: jnp.ndarray, local: jnp.ndarray, rank: jnp.ndarray,
    a: jnp.ndarray, window: jnp.ndarray, u: jnp.ndarray,
) -> jnp.ndarray:
    """:func:`success_offsets`' draws ``(n_draws, n_slots)`` at its measured cells: ``y (n_rows,)``
    the windows' logit success, ``success (n_draws, n_slots)`` the curve's, ``local`` each row's
    slot, ``a (n_draws,)``, ``window (n_draws, n_slots, 6)``, ``u (n_draws, n_slots)`` uniforms."""
    s = jnp.clip(success, SUCCESS_EPS, 1.0 - SUCCESS_EPS)
    ell = jnp.log(s) - jnp.log1p(-s)
    d = y[None, :] - ell[:, local]  # (D, n_rows)
    terms, nodes = _success_node_loglik(d, mask, local, rank, success.shape[1], a, window)
    cdf = jnp.cumsum(jax.nn.softmax(terms, axis=-1), axis=-1)  # (D, n_slots, S·K)
    node = jnp.minimum(jnp.sum(cdf < u[..., None], axis=-1), terms.shape[-1] - 1)
    return jnp.take_along_axis(nodes, node[..., None], axis=-1)[..., 0]


def offset_normals(key: jax.Array, latent: jnp.ndarray) -> jnp.ndarray:
    """The standard normals ``(n_draws, n_cells, 3)`` of :func:`cell_offsets` for ``key``."""
    return jax.random.normal(key, latent.shape[:2] + (3,), latent.dtype)


def probabilities_given_offsets(
    latent: jnp.ndarray,
    delta: jnp.ndarray,
    window: jnp.ndarray,
    success_min: jnp.ndarray,
    ttft_max: jnp.ndarray,
    completion_max: jnp.ndarray,
) -> jnp.ndarray:
    """:func:`window_probabilities` for given departures ``delta (..., 4)``
    (:func:`cell_offsets`' columns); ``latent (..., 4)``, ``window (..., 6)``,
    limits broadcast against ``(...)``. Returns ``(..., 3)``: success, TTFT,
    completion."""
    log_tails = jnp.log(jnp.maximum(latent[..., 1:3], _TINY)) + delta[..., 1:3]
    limits = jnp.stack(jnp.broadcast_arrays(ttft_max, completion_max), axis=-1)
    z = (jnp.log(jnp.maximum(limits, _TINY)) - log_tails) / window[..., 1:3]
    p_tails = jnp.where(jnp.isinf(limits), 1.0, jax.scipy.special.ndtr(z))
    s = jnp.clip(latent[..., 3], SUCCESS_EPS, 1.0 - SUCCESS_EPS)
    smin = jnp.clip(success_min, SUCCESS_EPS, 1.0 - SUCCESS_EPS)
    x = jnp.log(s) - jnp.log1p(-s) + delta[..., 3] - (jnp.log(smin) - jnp.log1p(-smin))
    p_succ = _burst_sf(x, window[..., 3], window[..., 4], window[..., 5])
    p_succ = jnp.where(success_min <= 0.0, 1.0, p_succ)
    batch = jnp.broadcast_shapes(latent.shape[:-1], delta.shape[:-1], window.shape[:-1])
    p = jnp.concatenate(
        [jnp.broadcast_to(p_succ, batch)[..., None], jnp.broadcast_to(p_tails, (*batch, 2))], axis=-1
    )
    return jnp.where((latent[..., 0] > 0)[..., None], p, 0.0)


def window_probabilities(
    key: jax.Array,
    latent: jnp.ndarray,
    noise: jnp.ndarray,
    window: jnp.ndarray,
    windows: WindowRows,
    success_min: jnp.ndarray,
    ttft_max: jnp.ndarray,
    completion_max: jnp.ndarray,
) -> jnp.ndarray:
    """Per posterior draw, the probability that ONE measurement window of each
    cell meets each of its class's SLOs: success ≥ ``success_min``, TTFT p99 ≤
    ``ttft_max``, completion p99 ≤ ``completion_max``.

    The cell's truth is the draw's curve plus its departure ``δ``
    (:func:`cell_offsets`, given the cell's windows); a window scatters around
    it by the draw's window noise (:func:`window_scales`): normal on log tails,
    :func:`_burst_sf` on logit success. Analytic, vectorised, and
    deterministic for ``key``.

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)``;
        window: ``(n_draws, n_cells, 6)``; limits ``(n_cells,)`` each
        (``+inf`` where the policy names no tail limit, success 0: none).

    Returns:
        ``(n_draws, n_cells, 3)``: success, TTFT, completion; 0 for all three
        where the draw's throughput is 0.
    """
    delta = cell_offsets(key, latent, noise, window, windows)
    return probabilities_given_offsets(latent, delta, window, success_min, ttft_max, completion_max)


def window_attainment(
    key: jax.Array,
    latent: jnp.ndarray,
    noise: jnp.ndarray,
    window: jnp.ndarray,
    windows: WindowRows,
    success_min: jnp.ndarray,
    ttft_max: jnp.ndarray,
    completion_max: jnp.ndarray,
) -> jnp.ndarray:
    """SLO attainment of every cell per posterior draw ``(n_draws, n_cells)``:
    the probability that one measurement window meets all its class's SLOs —
    the product of :func:`window_probabilities` (same arguments). Window noise
    is taken as independent between metrics given the cell: where a bad window
    is bad on several metrics at once the true joint attainment is higher, so
    the product errs low (the safe side)."""
    p = window_probabilities(key, latent, noise, window, windows, success_min, ttft_max, completion_max)
    return jnp.prod(p, axis=-1)


def latent_metrics(
    params: dict[str, jnp.ndarray], data: ModelData
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Deterministic part of the model: ``(latent (n_cells, 4), capacity (n_cells,))``
    from class-level parameters (each ``(n_classes,)`` or ``(n_classes, 2)``,
    ``overload`` among them) and globals (``sharpness``, ``exponent`` scalars,
    ``tail_slope (2,)``). Without ``overload`` the tails grow past saturation as
    a power ``β`` of ``ρ``.
    ``tail_elasticity (n_classes, 2)`` is optional (default 0: tails flat in the
    load below saturation)."""
    w, u = data.widx, data.u
    knee, curv, cap = params["knee"][w], params["curvature"][w], params["cap_level"][w]
    log_cap = u * math.log(2.0) + cap - curv * (u - knee) ** 2
    shift = _cell_shift(params, data)  # (n_cells, 3) or None
    if shift is not None:
        log_cap = log_cap + shift[:, 0]
    k = params["sharpness"]
    if jnp.ndim(k) == 1:  # per class ([saturation] class_sd > 0); a scalar is shared
        k = k[w]
    log_thr = -jnp.logaddexp(-k * data.log_offered, -k * log_cap) / k
    log_rho = data.log_offered - log_cap
    h_queue, h_succ = congestion(log_rho, params["exponent"])
    u_mid = 0.5 * (data.u_lo + data.u_hi)
    log_tails = (
        params["tail_base"][w]
        + params["tail_slope"][None, :] * (u - u_mid)[:, None]
        + params["tail_blowup"][w] * h_queue[:, None]
    )
    if shift is not None:
        log_tails = log_tails + shift[:, 1:3]
    if "overload" in params:
        log_tails = log_tails + overload_growth(log_rho, params["overload"][w])
    else:
        # Without Ω: past saturation the tails grow like ρ^β (a power of the same
        # amplitude that shapes the knee), for parameter sets without Ω.
        log_tails = log_tails + params["tail_blowup"][w] * (jax.nn.softplus(4.0 * log_rho) / 4.0)[:, None]
    if "tail_elasticity" in params:
        # Gradual rise with the load below saturation (bigger batches), on the
        # class's own load scale; separate from the utilisation term so that a
        # rising tail is not all read as a lower capacity.
        x = data.log_offered - data.load_ref[w]
        log_tails = log_tails + params["tail_elasticity"][w] * x[:, None]
    # Keep float32 finite for extreme prior draws (e^18 s ~ 2 years: "never").
    log_tails = jnp.clip(log_tails, -18.0, 18.0)
    logit_s = params["succ_base"][w] - params["succ_drop"][w] * h_succ
    z = jnp.concatenate([log_thr[:, None], log_tails, logit_s[:, None]], axis=-1)
    return from_transformed(z), jnp.exp(log_cap)


def _cell_shift(params: dict[str, jnp.ndarray], data: ModelData) -> jnp.ndarray | None:
    """Per cell, the log shift ``(capacity, ttft, completion)`` ``(n_cells, 3)`` of its GPU type
    (:func:`_gpu_shift`) plus its class's departure at its TP (``params["tp_dev"] (n_classes,
    n_tp, 3)``, :func:`tp_departure`); None when there is neither."""
    shift = _gpu_shift(params, data)
    if "tp_dev" in params and data.tp_onehot is not None:
        tp = jnp.einsum("ck,ckj->cj", data.tp_onehot, params["tp_dev"][data.widx])
        shift = tp if shift is None else shift + tp
    return shift


def _gpu_shift(params: dict[str, jnp.ndarray], data: ModelData) -> jnp.ndarray | None:
    """Per cell, the log shift ``(capacity, ttft, completion)`` ``(n_cells, 3)`` of its GPU type.

    The roofline ratio ``data.gpu_offset`` plus the learned deviation
    ``params["gpu_dev"] (n_classes, n_gpu_dev, 3)`` of the cell's class on its
    type (zero on the reference); None without a GPU axis.
    """
    if data.gpu_offset is None:
        return None
    if "gpu_dev" not in params:
        return data.gpu_offset
    dev = jnp.einsum("ck,ckj->cj", data.gpu_onehot, params["gpu_dev"][data.widx])
    return data.gpu_offset + dev


def gpu_deviation(data: ModelData, n_classes: int) -> jnp.ndarray:
    """Sample the GPU axis's deviations: site ``gpu_z (n_classes + 1, n_gpu_dev, 3)``.

    A type's departure from its roofline ratio, per column (capacity, ttft,
    completion): a family level shared by the classes (sd
    :data:`GPU_DEVIATION_LOG_SD`, row 0 of ``gpu_z``) plus a class's own
    departure (sd :data:`GPU_DEVIATION_CLASS_SD`) — partial pooling, so two
    measurements of one class on a type move every class's prediction there.

    Returns:
        the deterministic site ``gpu_dev (n_classes, n_gpu_dev, 3)``.
    """
    n_dev = gpu_dev_count(data)
    z = numpyro.sample("gpu_z", dist.Normal(jnp.zeros((n_classes + 1, n_dev, 3)), 1.0).to_event(3))
    dev = GPU_DEVIATION_LOG_SD * z[0][None] + GPU_DEVIATION_CLASS_SD * z[1:]
    return numpyro.deterministic("gpu_dev", dev)


def tp_departure(
    data: ModelData, card: PriorCard, n_classes: int, parabola: jnp.ndarray | None = None
) -> jnp.ndarray:
    """Sample the per-(class, TP) departures: site ``tp_z (n_classes, n_tp, 3)``.

    A class's log capacity and log tail bases at one TP degree depart from its
    smooth curves in ``log2 TP`` (the parabola of capacity, the tails' slope)
    by a normal of the card's ``tp_sd`` per column (capacity, ttft,
    completion). A measured load at that TP then moves the class's other loads
    at the same TP (their utilisation and their tails) without bending the
    curve at every other TP.

    The capacity column is sampled centred: ``tp_z[..., 0]`` is the class's whole
    log capacity per GPU at the TP (less ``cap_loc``: ``parabola``) over its
    ``tp_sd``, and the departure is what it leaves of the parabola. The prior is
    the same (``tp_dev ~ N(0, tp_sd²)`` whatever the parabola), but the
    coordinate the sampler moves is the capacity that measured loads pin; a
    departure sampled on its own (non-centred) has to move with every change of
    the knee and the curvature, a curved ridge that forced small steps and
    reruns after divergences (docs/results.md, "Certification attempt time").

    With the card's ``[capacity] tp_departures = "orthogonal"``, the departures
    are projected off a constant and a linear trend in log2 TP over the grid's
    TP degrees (:func:`trend_free`), sampled non-centred: those are the
    parabola's level and knee (the tails' base and slope), and a departure that
    can carry them too leaves a ridge between the two that NUTS crosses slowly.

    Args:
        parabola: ``(n_classes, n_tp)`` :func:`capacity_parabola`; None samples every
            column non-centred.

    Returns:
        the deterministic site ``tp_dev (n_classes, n_tp, 3)``.
    """
    n_tp = tp_dev_count(data, card)
    sd = jnp.asarray(tp_departure_sd(card))
    if card.capacity_tp_departures == "orthogonal":
        assert data.tp_log2 is not None
        z = numpyro.sample("tp_z", dist.Normal(jnp.zeros((n_classes, n_tp, 3)), 1.0).to_event(3))
        z = jnp.einsum("ij,cjk->cik", trend_free(data.tp_log2), z)
        return numpyro.deterministic("tp_dev", z * sd)
    centre = jnp.zeros((n_classes, n_tp, 3))
    if card.capacity_tp_sd > 0 and parabola is not None:
        centre = centre.at[:, :, 0].set(parabola / card.capacity_tp_sd)
    z = numpyro.sample("tp_z", dist.Normal(centre, 1.0).to_event(3))
    return numpyro.deterministic("tp_dev", (z - centre) * sd)


def capacity_parabola(params: dict[str, jnp.ndarray], data: ModelData, cap_loc: jnp.ndarray) -> jnp.ndarray | None:
    """``(n_classes, n_tp)``: each class's parabola of log capacity per GPU at the grid's TP
    degrees less its prior centre ``cap_loc (n_classes,)``, ``cap_level - cap_loc - curvature
    (u - knee)²`` (:func:`latent_metrics` without its ``u log 2``); None without the TP degrees."""
    if data.tp_log2 is None:
        return None
    u = data.tp_log2[None, :]
    bend = params["curvature"][:, None] * (u - params["knee"][:, None]) ** 2
    return (params["cap_level"] - cap_loc)[:, None] - bend


def trend_free(u: jnp.ndarray) -> jnp.ndarray:
    """``(n, n)`` projection off ``span{1, u}`` (``u (n,)``: log2 of the TP degrees);
    zero for ``n <= 2``, where a constant and a slope fit every point."""
    n = u.shape[0]
    if n <= 2:
        return jnp.zeros((n, n))
    q, _ = jnp.linalg.qr(jnp.stack([jnp.ones(n), u - jnp.mean(u)], axis=1))
    return jnp.eye(n) - q @ q.T


def class_param_count(card: PriorCard) -> int:
    """Columns of ``class_z``: :data:`_CLASS_PARAMS`, less the per-class sharpness
    when the card's ``[saturation] class_sd`` is 0 (one sharpness shared by all classes)."""
    return len(_CLASS_PARAMS) - (0 if card.saturation_class_sd > 0 else 1)


def class_prior(card: PriorCard, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Location offsets and Cholesky factors of the class-level prior.

    Column ``j`` of :data:`_CLASS_PARAMS` over the classes is
    ``θ_j = loc_j + L_j z_j`` with ``z_j ~ N(0, I)`` and
    ``L_j L_j^T = sd_j² 11^T + τ_j² I``: a shared family-level offset (sd
    ``sd_j``, the card's ``*_log_sd``) plus a per-class deviation (sd ``τ_j``,
    the card's ``class_sd``) — the hierarchical model with the shared mean
    integrated out analytically and the between-class spread fixed at the
    card's value. With 2-8 classes the spread cannot be learnt anyway, and the
    whitened parametrisation has no funnel and no ridge between a shared mean
    and the class offsets: NUTS needs short trajectories (fast) and compiles a
    small program.

    Returns:
        ``loc (n_params,)`` (transformed-scale centres; the capacity column is 0
        and is added per class by the model) and
        ``chol (n_params, n_classes, n_classes)``, ``n_params = class_param_count(card)``.
    """
    c = card
    sd = np.array(
        [
            c.knee_logit_sd,
            c.curvature_log_sd,
            c.capacity_log_sd,
            c.ttft_base_log_sd,
            c.completion_base_log_sd,
            c.ttft_blowup_log_sd,
            c.completion_blowup_log_sd,
            c.success_logit_base_sd,
            c.success_drop_log_sd,
            c.ttft_load_elasticity_sd,
            c.completion_load_elasticity_sd,
            0.0,  # overload (ttft, completion): the family level is the global site's
            0.0,
            0.0,  # sharpness: the family level is the global site's
        ]
    )
    tau = np.array(
        [
            c.knee_class_sd,
            c.curvature_class_sd,
            c.capacity_class_sd,
            c.ttft_class_sd,
            c.completion_class_sd,
            c.ttft_blowup_class_sd,
            c.completion_blowup_class_sd,
            c.success_class_sd,
            c.success_drop_class_sd,
            c.ttft_load_elasticity_class_sd,
            c.completion_load_elasticity_class_sd,
            OVERLOAD_CLASS_SD,
            OVERLOAD_CLASS_SD,
            c.saturation_class_sd,
        ]
    )
    loc = np.array(
        [
            0.0,  # knee: added by the model (depends on the grid's TP range)
            math.log(c.curvature_median),
            0.0,  # capacity: per class, added by the model
            math.log(c.ttft_base_median_s),
            math.log(c.completion_base_median_s),
            math.log(c.ttft_blowup_median),
            math.log(c.completion_blowup_median),
            c.success_logit_base_mean,
            math.log(c.success_drop_median),
            c.ttft_load_elasticity_mean,
            c.completion_load_elasticity_mean,
            0.0,  # a class's departure from the family's overload
            0.0,
            0.0,  # a class's departure from the global sharpness
        ]
    )
    n_params = class_param_count(c)
    sd, tau, loc = sd[:n_params], tau[:n_params], loc[:n_params]
    ones = np.ones((n_classes, n_classes))
    eye = np.eye(n_classes)
    chol = np.stack([np.linalg.cholesky(s * s * ones + t * t * eye) for s, t in zip(sd, tau, strict=True)])
    return loc, chol


def _global_sites(c: PriorCard, theta: jnp.ndarray) -> tuple[jnp.ndarray, ...]:
    """The family-level sites of :func:`fleet_model`, sampled in its order.

    Args:
        c: the prior card.
        theta: ``(n_classes, class_param_count)`` the class parameters.

    Returns ``sharpness`` (scalar, or ``(n_classes,)`` with a saturation class sd),
    ``exponent`` (scalar), ``tail_slope (2,)``, ``overload (n_classes, 2)`` and
    ``noise (4,)``.
    """
    # Globals: log sharpness, log exponent, ttft slope, completion slope,
    # log overload of ttft and of completion.
    g_loc, g_sd = _global_prior(c)
    g = numpyro.sample("global", dist.Normal(g_loc, g_sd).to_event(1))
    if c.saturation_class_sd > 0:
        # Per class: closed-loop load (N requests in flight) may saturate more
        # gradually than open-loop rates. Off by default (class_sd = 0): on the
        # hard suite (class_sd 0.5) it helps a fleet whose classes pin their own
        # sharpness, and where no class does it slows the certifying chains on
        # more fleets than it helps (a higher mean floor ratio than shared).
        sharpness = numpyro.deterministic("sharpness", jnp.exp(g[0] + theta[:, 13]))
    else:
        sharpness = numpyro.deterministic("sharpness", jnp.exp(g[0]))
    exponent = numpyro.deterministic("exponent", jnp.exp(g[1]))
    tail_slope = numpyro.deterministic("tail_slope", g[2:4])
    overload = numpyro.deterministic("overload", jnp.exp(g[4:6] + theta[:, 11:13]))

    noise_raw = numpyro.sample(
        "noise_raw",
        dist.HalfNormal(
            jnp.array([c.noise_throughput, c.noise_ttft, c.noise_completion, c.noise_success])
        ).to_event(1),
    )
    noise = numpyro.deterministic("noise", jnp.asarray(NOISE_FLOOR) + noise_raw)
    return sharpness, exponent, tail_slope, overload, noise


def fleet_model(data: ModelData, card: PriorCard, obs: jnp.ndarray | None = None) -> None:
    """The NumPyro model.

    Args:
        data: fixed-shape inputs (:func:`model_data`).
        card: hyperpriors (:mod:`fleetsieve_bayes.model.priors`).
        obs: ``(n_cells, 4)`` natural-unit observations to condition on
            (normally ``data.observed``); entries outside ``data.fit_mask`` are
            ignored. ``None``: the observation site ``"y"`` is sampled for every
            cell (prior / posterior prediction).

    Sample sites (three, all vector-valued: a small program compiles fast):
    ``class_z (n_classes, 13 or 14)`` standard normal (columns :data:`_CLASS_PARAMS`,
    mapped through :func:`class_prior`), ``global (6,)`` (log sharpness, log
    exponent, ttft slope, completion slope, the family's log overload of ttft
    and of completion), ``noise_raw (4,)`` and the observed
    ``y (n_cells, 4)`` on the transformed scale. Deterministic sites: the
    class-level ``knee``, ``curvature``, ``cap_level``, ``tail_base``,
    ``tail_blowup``, ``succ_base``, ``succ_drop``; ``sharpness``, ``exponent``,
    ``tail_slope``, ``overload (n_classes, 2)``, ``noise (4,)``; ``latent (n_cells, 4)``,
    ``capacity (n_cells,)``.
    """
    n_classes = data.cap_ref.shape[0]
    c = card
    # Knee: logit position inside the padded log2(TP) range.
    pad = c.knee_edge_pad_log2
    lo, hi = data.u_lo - pad, data.u_hi + pad
    span = jnp.maximum(hi - lo, 1e-6)
    if c.knee_tp is not None:
        pos0 = (math.log2(c.knee_tp) - lo) / span
    else:
        pos0 = (data.u_lo + c.knee_position * (data.u_hi - data.u_lo) - lo) / span
    pos0 = jnp.clip(pos0, 0.02, 0.98)
    loc, chol = class_prior(c, n_classes)
    z = numpyro.sample(
        "class_z", dist.Normal(jnp.zeros((n_classes, class_param_count(c))), 1.0).to_event(2)
    )
    # theta[w, j] = loc[j] + sum_v chol[j, w, v] z[v, j]   (n_classes, class_param_count)
    theta = jnp.asarray(loc) + jnp.einsum("jwv,vj->wj", jnp.asarray(chol, dtype=z.dtype), z)
    if c.capacity_per_gpu_at_knee is not None:
        cap_loc = jnp.full((n_classes,), math.log(c.capacity_per_gpu_at_knee))
    else:
        cap_loc = data.cap_ref + math.log(c.capacity_relative_to_offered)

    knee = numpyro.deterministic(
        "knee", lo + span * jax.nn.sigmoid(theta[:, 0] + jnp.log(pos0) - jnp.log1p(-pos0))
    )
    curvature = numpyro.deterministic("curvature", jnp.exp(theta[:, 1]))
    cap_level = numpyro.deterministic("cap_level", cap_loc + theta[:, 2])
    tail_base = numpyro.deterministic("tail_base", theta[:, 3:5])
    tail_blowup = numpyro.deterministic("tail_blowup", jnp.exp(theta[:, 5:7]))
    succ_base = numpyro.deterministic("succ_base", theta[:, 7])
    succ_drop = numpyro.deterministic("succ_drop", jnp.exp(theta[:, 8]))
    tail_elasticity = numpyro.deterministic("tail_elasticity", theta[:, 9:11])

    sharpness, exponent, tail_slope, overload, noise = _global_sites(c, theta)

    params = {
        "knee": knee,
        "curvature": curvature,
        "cap_level": cap_level,
        "sharpness": sharpness,
        "exponent": exponent,
        "tail_base": tail_base,
        "tail_slope": tail_slope,
        "tail_blowup": tail_blowup,
        "succ_base": succ_base,
        "succ_drop": succ_drop,
        "tail_elasticity": tail_elasticity,
        "overload": overload,
    }
    if data.gpu_offset is not None:
        params["gpu_dev"] = gpu_deviation(data, n_classes)
    if tp_dev_count(data, c):
        params["tp_dev"] = tp_departure(data, c, n_classes, capacity_parabola(params, data, cap_loc))
    latent, capacity = latent_metrics(params, data)
    # A run that failed at a load its TP served below it (none above) is evidence of
    # overload: P(fail | ρ) = ε · sigmoid(k log ρ) with ε small, so a working
    # cell's log(1 - P) ≈ 0 (overload need not fail a run) and a failed one
    # adds log sigmoid(k log ρ). Without it, suite fleet c016's chat class (its
    # three top loads failed) let chains wander into capacities that put every
    # measured load below saturation: r_hat 1.05 after 6,400 draws; 1.001 with it.
    log_rho = data.log_offered - jnp.log(capacity)
    numpyro.factor(
        "failed_under_load",
        jnp.sum(jnp.where(data.failed_under_load, jax.nn.log_sigmoid(FAILURE_SHARPNESS * log_rho), 0.0)),
    )
    numpyro.deterministic("latent", latent)
    numpyro.deterministic("capacity", capacity)
    loc_y = to_transformed(latent)
    if data.windows is not None:
        _window_likelihood(data, c, loc_y, noise, log_rho, obs is not None)
        return
    y_dist = dist.StudentT(jnp.asarray(NOISE_DFS), loc_y, noise)
    if obs is None:
        numpyro.sample("y", y_dist.to_event(2))
    else:
        numpyro.sample(
            "y", y_dist.mask(data.fit_mask).to_event(2), obs=to_transformed(jnp.asarray(obs))
        )


def _window_likelihood(
    data: ModelData, card: PriorCard, loc_y: jnp.ndarray, noise: jnp.ndarray, log_rho: jnp.ndarray, condition: bool
) -> None:
    """The window-noise part of :func:`fleet_model` (``data.windows`` set).

    Sites ``window_g (7,)`` and ``window_z (n_classes, 6)`` (standard normal,
    :func:`window_scales`), deterministic ``window (n_cells, 6)``. Conditioned
    (``condition``): throughput and the tails of a cell's windows are
    compound-symmetric normal on the log scale (:func:`_compound_loglik`: the
    curve's discrepancy ``noise`` shared by a cell's windows, the window noise
    apart), success's logit per window the burst mixture
    (:func:`_burst_logpdf`) around the curve. Otherwise ``y (n_cells, 4)``: one
    window of every cell (transformed scale), discrepancy and window noise
    normal, success's burst drawn.
    """
    n_classes = data.cap_ref.shape[0]
    g = numpyro.sample("window_g", dist.Normal(jnp.zeros(len(_WINDOW_G)), 1.0).to_event(1))
    z = numpyro.sample("window_z", dist.Normal(jnp.zeros((n_classes, N_WINDOW_CLASS)), 1.0).to_event(2))
    window = numpyro.deterministic("window", window_scales(card, g, z, log_rho, data.widx))
    if not condition:
        sd = jnp.concatenate([jnp.sqrt(noise[:3] ** 2 + window[:, :3] ** 2), window[:, 3:4]], axis=-1)
        numpyro.sample("y", dist.Normal(loc_y, sd).to_event(2))
        return
    wr = data.windows
    n_cells = data.u.shape[0]
    y = to_transformed(wr.rows)
    d = y - loc_y[wr.cell]
    w = wr.mask.astype(d.dtype)
    ll = _compound_loglik(d[:, :3], w[:, :3], wr.cell, n_cells, noise[:3], window[:, :3])
    numpyro.factor("windows", ll + _success_loglik(d[:, 3], wr, noise[3], window))


def _success_loglik(d: jnp.ndarray, wr: WindowRows, a: jnp.ndarray, window: jnp.ndarray) -> jnp.ndarray:
    """Log density ``()`` of every cell's success windows, the departure ``δ_s ~ N(0, a²)``
    they share integrated out: closed form for a cell with one window (a normal
    departure plus the burst mixture is the burst mixture with sd ``√(sd² + a²)``),
    :func:`_success_node_loglik` over the cells with more.

    Args:
        d: ``(n_rows,)`` logit-success residuals from the curve; ``a`` ``()``;
            ``window (n_cells, 6)`` (:func:`window_scales`).
    """
    wc = window[wr.cell]  # (R, 6)
    one = _burst_logpdf(d, jnp.sqrt(wc[:, 3] ** 2 + a * a), wc[:, 4], wc[:, 5])
    total = jnp.sum(jnp.where(wr.single, one, 0.0))
    n_shared = int(wr.shared.shape[0])
    if n_shared:
        ls, _ = _success_node_loglik(
            d[wr.shared], wr.shared_mask, wr.shared_cell, wr.rank[wr.shared], n_shared, a, window[wr.shared_slot]
        )
        seen = jnp.zeros(n_shared, bool).at[wr.shared_cell].max(wr.shared_mask)
        per_cell = jax.nn.logsumexp(ls, axis=-1)
        total = total + jnp.sum(jnp.where(seen, per_cell, 0.0))
    return total


def _success_node_loglik(
    d: jnp.ndarray,
    mask: jnp.ndarray,
    cell: jnp.ndarray,
    rank: jnp.ndarray,
    n_cells: int,
    a: jnp.ndarray,
    window: jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Weighted quadrature terms of each cell's success windows, integrated over
    the cell's logit-success departure ``δ_s ~ N(0, a²)``:
    ``log p(windows of c) ≈ logsumexp_k terms[c, k]``.

    Each of a cell's :data:`_BURST_LABELLED` highest windows is plain or in a
    burst (:func:`_burst_logpdf`); for each labelling (:data:`_SUBSETS`, those
    naming a window the cell lacks are ``-inf``), the prior, the plain windows'
    normals and the burst windows' exponential factors are one normal in
    ``δ_s`` that integrates in closed form, and the rest — each burst window's
    normal cdf, each lower window's whole mixture — is integrated by
    Gauss-Hermite on that normal. Exact for a cell whose windows are all plain
    or whose one window bursts, and centred on the posterior of every
    labelling however narrow the scatter or however many windows burst. The
    nodes, picked with probability ∝ ``exp(terms)``, are draws of ``δ_s``
    given the windows.

    Args:
        d: ``(..., n_rows)`` logit-success residuals from the curve; ``mask
            (n_rows,)``; ``cell`` int ``(n_rows,)``; ``rank`` int ``(n_rows,)``
            (:class:`WindowRows`); ``a`` ``(...)`` the discrepancy sd;
            ``window (..., n_cells, 6)``.

    Returns:
        ``(terms, nodes)`` each ``(..., n_cells, n_subsets · n_nodes)``.
    """
    d = jnp.asarray(d, jnp.result_type(d, jnp.float32))
    x = jnp.asarray(_GH_NODES, d.dtype)
    w = mask.astype(d.dtype)
    labelled = (rank < _BURST_LABELLED) & mask  # (R,)
    bit = jnp.asarray(_SUBSETS)[:, jnp.clip(rank, 0, _BURST_LABELLED - 1)].T  # (R, S)
    burst = (labelled[:, None] & bit).astype(d.dtype)
    plain = (labelled[:, None] & ~bit).astype(d.dtype)
    lower = mask & ~labelled  # (R,)
    n = jax.ops.segment_sum(w, cell, n_cells)  # (C,)
    valid = jnp.asarray(_SUBSET_NEEDS)[None, :] <= n[:, None]  # (C, S)
    k = jax.ops.segment_sum(plain, cell, n_cells)  # (C, S)
    j = jax.ops.segment_sum(burst, cell, n_cells)
    dr = jnp.moveaxis(d, -1, 0)[..., None]  # (R, ..., 1)
    by_row = plain.shape[:1] + (1,) * (d.ndim - 1)  # (R, 1 per batch axis): rows first
    plain_b, burst_b = plain.reshape(by_row + plain.shape[1:]), burst.reshape(by_row + burst.shape[1:])
    s1 = jnp.moveaxis(jax.ops.segment_sum(dr * plain_b, cell, n_cells), 0, -2)  # (..., C, S)
    s2 = jnp.moveaxis(jax.ops.segment_sum(dr * dr * plain_b, cell, n_cells), 0, -2)
    sb = jnp.moveaxis(jax.ops.segment_sum(dr * burst_b, cell, n_cells), 0, -2)
    sd, p, lam = window[..., 3:4], window[..., 4:5], 1.0 / window[..., 5:6]  # (..., C, 1)
    a = jnp.asarray(a, d.dtype)[..., None, None]  # (..., 1, 1)
    prec = 1.0 / (a * a) + k / (sd * sd)
    h = s1 / (sd * sd) - j * lam
    log_gauss = (
        -jnp.log(a) - k * jnp.log(sd) - 0.5 * k * math.log(2 * math.pi) - 0.5 * s2 / (sd * sd)
        + j * (jnp.log(lam) + 0.5 * (lam * sd) ** 2) + lam * sb
        + k * jnp.log1p(-p) + j * jnp.log(p)
        - 0.5 * jnp.log(prec) + 0.5 * h * h / prec
    )  # (..., C, S)
    nodes = (h / prec)[..., None] + jax.lax.rsqrt(prec)[..., None] * x  # (..., C, S, K)
    wc = jnp.moveaxis(window[..., cell, :], -2, 0)  # (R, ..., 6)
    at = jnp.moveaxis(jnp.take(nodes, cell, axis=-3), -3, 0)  # (R, ..., S, K)
    r_sd, r_p, r_drop = (wc[..., i][..., None, None] for i in (3, 4, 5))
    r_d = dr[..., None]
    cdf = jax.scipy.special.log_ndtr((at - r_d) / r_sd - r_sd / r_drop)
    mix = _burst_logpdf(r_d - at, r_sd, r_p, r_drop)
    lf = jnp.where(burst_b[..., None] > 0, cdf, 0.0)
    lf = lf + jnp.where(lower.reshape(by_row + (1, 1)), mix, 0.0)
    data = jnp.moveaxis(jax.ops.segment_sum(lf, cell, n_cells), 0, -3)  # (..., C, S, K)
    terms = log_gauss[..., None] + jnp.asarray(_GH_LOGW, d.dtype) + data
    terms = jnp.where(valid[..., None], terms, -jnp.inf)
    flat = terms.shape[:-2] + (terms.shape[-2] * terms.shape[-1],)
    return terms.reshape(flat), nodes.reshape(flat)


def _global_prior(c: PriorCard) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Location and scale ``(6,)`` of the ``global`` site (see :func:`fleet_model`)."""
    loc = jnp.array(
        [
            math.log(c.saturation_sharpness_median),
            math.log(c.utilisation_exponent_median),
            c.ttft_slope_per_log2tp,
            c.completion_slope_per_log2tp,
            OVERLOAD_LOG_MEDIAN,
            OVERLOAD_LOG_MEDIAN,
        ]
    )
    sd = jnp.array(
        [
            c.saturation_sharpness_log_sd,
            c.utilisation_exponent_log_sd,
            c.ttft_slope_sd,
            c.completion_slope_sd,
            OVERLOAD_LOG_SD,
            OVERLOAD_LOG_SD,
        ]
    )
    return loc, sd


def init_unconstrained(
    key: jax.Array, card: PriorCard, n_classes: int, windows: bool = False, n_gpu_dev: int = 0, n_tp: int = 0
) -> dict[str, jnp.ndarray]:
    """A random starting point for MCMC in NumPyro's unconstrained space.

    Near the prior's centre (``class_z`` uniform in ``(-1, 1)``, ``global``
    within one prior sd of its mean, ``noise_raw`` within a factor ``e`` of its
    scale, on the log scale that NumPyro uses for half-normal sites). Built
    directly rather than by running the model eagerly (``initialize_model``),
    which costs dozens of one-op XLA compilations on a cold start.

    Returns:
        ``{"class_z": (n_classes, class_param_count(card)), "global": (6,), "noise_raw": (4,)}``
        (13 columns, 14 with a per-class sharpness); with ``windows`` (the
        window-noise likelihood) also ``window_g (7,)`` and ``window_z
        (n_classes, 6)`` uniform in ``(-1, 1)``; with ``n_gpu_dev`` non-reference
        GPU types also ``gpu_z (n_classes + 1, n_gpu_dev, 3)``, likewise; with
        ``n_tp`` (:func:`tp_dev_count`) also ``tp_z (n_classes, n_tp, 3)``, likewise.
    """
    k1, k2, k3 = jax.random.split(key, 3)
    c = card
    g_loc, g_sd = _global_prior(c)
    n_scale = jnp.log(
        jnp.array([c.noise_throughput, c.noise_ttft, c.noise_completion, c.noise_success])
    )
    u = lambda k, shape: jax.random.uniform(k, shape, minval=-1.0, maxval=1.0)  # noqa: E731
    out = {
        "class_z": u(k1, (n_classes, class_param_count(c))),
        "global": g_loc + g_sd * u(k2, g_loc.shape),
        "noise_raw": n_scale + u(k3, (4,)),
    }
    if windows:
        k4, k5 = jax.random.split(jax.random.fold_in(key, 1))
        out["window_g"] = u(k4, (len(_WINDOW_G),))
        out["window_z"] = u(k5, (n_classes, N_WINDOW_CLASS))
    if n_gpu_dev:
        out["gpu_z"] = u(jax.random.fold_in(key, 2), (n_classes + 1, n_gpu_dev, 3))
    if n_tp:
        out["tp_z"] = u(jax.random.fold_in(key, 3), (n_classes, n_tp, 3))
    return out
