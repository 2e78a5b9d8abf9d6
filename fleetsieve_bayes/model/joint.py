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

This module holds :func:`fleet_model` and its window likelihood; the parts it
reads live beside it in ``fleetsieve_bayes.model``, and every public name is
re-exported here:

* :mod:`~fleetsieve_bayes.model.data`: the inputs (:class:`ModelData`,
  :class:`WindowRows`, :func:`model_data`, :func:`usable_mask`,
  :func:`load_failures`, :func:`served_nothing`);
* :mod:`~fleetsieve_bayes.model.observation`: the transforms and the
  observation model (:func:`obs_logpdf`, :func:`sample_obs`; pure JAX, used by
  the acquisition kernel, no card needed);
* :mod:`~fleetsieve_bayes.model.curves`: the structural curves
  (:func:`latent_metrics`, :func:`congestion`, :func:`overload_growth`) and the
  GPU and TP departures;
* :mod:`~fleetsieve_bayes.model.window_noise`: the window noise
  (:func:`window_scales`, :func:`cell_offsets`, :func:`window_attainment`);
* :mod:`~fleetsieve_bayes.model.success`: the success burst mixture and its
  likelihood over a cell's windows;
* :mod:`~fleetsieve_bayes.model.class_prior`: the class-level prior, the
  family sites and :func:`init_unconstrained`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from fleetsieve_bayes.model.class_prior import (
    OVERLOAD_CLASS_SD,
    OVERLOAD_LOG_MEDIAN,
    OVERLOAD_LOG_SD,
    class_param_count,
    class_prior,
    global_sites,
    init_unconstrained,
)
from fleetsieve_bayes.model.curves import (
    GPU_DEVIATION_CLASS_SD,
    GPU_DEVIATION_LOG_SD,
    RHO_GAP,
    capacity_parabola,
    congestion,
    gpu_deviation,
    latent_metrics,
    overload_growth,
    tp_departure,
    trend_free,
)
from fleetsieve_bayes.model.data import (
    ROW_BUCKET,
    ModelData,
    WindowRows,
    gpu_dev_count,
    load_failures,
    model_data,
    served_nothing,
    tp_departure_sd,
    tp_dev_count,
    usable_mask,
    window_rows,
)
from fleetsieve_bayes.model.observation import (
    NOISE_DF,
    NOISE_DFS,
    NOISE_FLOOR,
    THROUGHPUT_NOISE_DF,
    from_transformed,
    obs_from_normals,
    obs_logpdf,
    sample_obs,
    to_transformed,
)
from fleetsieve_bayes.model.priors import PriorCard
from fleetsieve_bayes.model.roles import config_centre, role_sites
from fleetsieve_bayes.model.scales import SUCCESS_EPS
from fleetsieve_bayes.model.success import (
    burst_logpdf,
    burst_sf,
    success_loglik,
    success_node_loglik,
    success_offsets,
)
from fleetsieve_bayes.model.window_noise import (
    N_WINDOW_CLASS,
    WINDOW_COLUMNS,
    WINDOW_G,
    cell_offsets,
    compound_loglik,
    offset_moments,
    offset_normals,
    offsets_from_moments,
    probabilities_given_offsets,
    window_attainment,
    window_probabilities,
    window_scales,
)

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
    "COORDINATES",
    "OVERLOAD_LOG_MEDIAN",
    "OVERLOAD_LOG_SD",
    "OVERLOAD_CLASS_SD",
    "N_WINDOW_CLASS",
    "tp_departure_sd",
    "overload_growth",
    "tp_departure",
    "capacity_parabola",
    "trend_free",
    "class_param_count",
]

# What the sampled sites mean at a given shape. A saved sampler state moves its chains in these
# coordinates, so one saved under another value seeds no fit (model.inference's sampler keys).
# 2: the capacity departure at each TP sampled centred (tp_departure).
COORDINATES = 2
# Failure under load (see :func:`load_failures`): P(fail | ρ) ∝ sigmoid(k log ρ)
# with k = FAILURE_SHARPNESS: against deep overload, a failed run makes ρ = 1
# half as likely, ρ = 0.8 a seventh, ρ = 0.5 e^-5.5 times.
FAILURE_SHARPNESS = 8.0


def knee_range(data: ModelData, card: PriorCard) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """The knee's range and prior centre: ``(lo, span, pos0)``, the padded log2(TP) range's
    lower end and width and the prior's position in it (a fraction in ``[0.02, 0.98]``)."""
    c = card
    pad = c.knee_edge_pad_log2
    lo, hi = data.u_lo - pad, data.u_hi + pad
    span = jnp.maximum(hi - lo, 1e-6)
    if c.knee_tp is not None:
        pos0 = (math.log2(c.knee_tp) - lo) / span
    else:
        pos0 = (data.u_lo + c.knee_position * (data.u_hi - data.u_lo) - lo) / span
    return lo, span, jnp.clip(pos0, 0.02, 0.98)


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
    ``class_z (n_classes, 13 or 14)`` standard normal (the class parameters of
    :mod:`~fleetsieve_bayes.model.class_prior`, mapped through :func:`class_prior`), ``global (6,)`` (log sharpness, log
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
    lo, span, pos0 = knee_range(data, c)
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

    sharpness, exponent, tail_slope, overload, noise = global_sites(c, theta)

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
    if data.roles is not None:  # a catalogue's configurations (model.roles)
        params.update(role_sites(n_classes, c))
    if tp_dev_count(data, c):
        # Centred on each configuration's smooth capacity: the parabola, or with roles its composition.
        parabola = (capacity_parabola(params, data, cap_loc) if data.roles is None
                    else config_centre(params, data.roles, cap_loc))
        params["tp_dev"] = tp_departure(data, c, n_classes, parabola)
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
    compound-symmetric normal on the log scale (:func:`compound_loglik`: the
    curve's discrepancy ``noise`` shared by a cell's windows, the window noise
    apart), success's logit per window the burst mixture
    (:func:`burst_logpdf`) around the curve. Otherwise ``y (n_cells, 4)``: one
    window of every cell (transformed scale), discrepancy and window noise
    normal, success's burst drawn.
    """
    n_classes = data.cap_ref.shape[0]
    g = numpyro.sample("window_g", dist.Normal(jnp.zeros(len(WINDOW_G)), 1.0).to_event(1))
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
    ll = compound_loglik(d[:, :3], w[:, :3], wr.cell, n_cells, noise[:3], window[:, :3])
    numpyro.factor("windows", ll + success_loglik(d[:, 3], wr, noise[3], window))


# The private names the tests imported from here before the split; each is public, without
# its underscore, in the module that owns it now.
_burst_logpdf = burst_logpdf
_burst_sf = burst_sf
_compound_loglik = compound_loglik
_success_loglik = success_loglik
_success_node_loglik = success_node_loglik
