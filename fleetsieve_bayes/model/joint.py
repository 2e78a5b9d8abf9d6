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
from fleetsieve_bayes.model.priors import PriorCard
from fleetsieve_bayes.model.scales import SUCCESS_EPS, metric_transform
from fleetsieve_bayes.model.scales import TINY as _TINY

__all__ = [
    "ModelData",
    "model_data",
    "fleet_model",
    "obs_logpdf",
    "sample_obs",
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
# Failure under load (see :func:`load_failures`): P(fail | ρ) ∝ sigmoid(k log ρ)
# with k = FAILURE_SHARPNESS: against deep overload, a failed run makes ρ = 1
# half as likely, ρ = 0.8 a seventh, ρ = 0.5 e^-5.5 times.
FAILURE_SHARPNESS = 8.0


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
    )


def load_failures(
    grid: CellGrid, measured: np.ndarray, fit_mask: np.ndarray, server_failed: np.ndarray | None = None
) -> np.ndarray:
    """bool ``(n_cells,)``: measured cells that failed (no metric usable) where
    the same class and TP served a lower load and no higher one — the engine
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
        same = (grid.workload_idx == grid.workload_idx[c]) & (grid.tp == grid.tp[c]) & working
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
    df = int(NOISE_DF)
    z = jax.random.normal(key, (df + 1, *shape), dtype=jnp.result_type(latent, noise))
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
    y_dist = dist.StudentT(jnp.asarray(NOISE_DFS), loc_y, noise)
    if obs is None:
        numpyro.sample("y", y_dist.to_event(2))
    else:
        numpyro.sample(
            "y", y_dist.mask(data.fit_mask).to_event(2), obs=to_transformed(jnp.asarray(obs))
        )


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


def init_unconstrained(key: jax.Array, card: PriorCard, n_classes: int) -> dict[str, jnp.ndarray]:
    """A random starting point for MCMC in NumPyro's unconstrained space.

    Near the prior's centre (``class_z`` uniform in ``(-1, 1)``, ``global``
    within one prior sd of its mean, ``noise_raw`` within a factor ``e`` of its
    scale, on the log scale that NumPyro uses for half-normal sites). Built
    directly rather than by running the model eagerly (``initialize_model``),
    which costs dozens of one-op XLA compilations on a cold start.

    Returns:
        ``{"class_z": (n_classes, class_param_count(card)), "global": (6,), "noise_raw": (4,)}``
        (13 columns, 14 with a per-class sharpness).
    """
    k1, k2, k3 = jax.random.split(key, 3)
    c = card
    g_loc, g_sd = _global_prior(c)
    n_scale = jnp.log(
        jnp.array([c.noise_throughput, c.noise_ttft, c.noise_completion, c.noise_success])
    )
    u = lambda k, shape: jax.random.uniform(k, shape, minval=-1.0, maxval=1.0)  # noqa: E731
    return {
        "class_z": u(k1, (n_classes, class_param_count(c))),
        "global": g_loc + g_sd * u(k2, g_loc.shape),
        "noise_raw": n_scale + u(k3, (4,)),
    }
