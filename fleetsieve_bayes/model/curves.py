"""The structural curves: each cell's true metrics from its class's parameters.

Per cell ``c`` of class ``w`` with ``u = log2(TP)`` and offered load ``λ``
(:func:`latent_metrics`, ``(n_cells, 4)`` natural units and the replica capacity
``(n_cells,)``):

* per-GPU capacity, a parabola in ``u`` with a knee ``m_w``:
  ``log κ_w(u) = a_w - b_w (u - m_w)^2``, replica capacity ``C = TP · κ_w(u)``;
* served throughput ``smooth-min(λ, C)``;
* utilisation ``ρ = λ / C`` and its congestion terms (:func:`congestion`), the
  growth of the tails past saturation (:func:`overload_growth`);
* the departures from these smooth curves: of a GPU type from its roofline ratio
  (:func:`gpu_deviation`, sites ``gpu_z``/``gpu_dev``) and of a class at one TP
  degree (:func:`tp_departure`, sites ``tp_z``/``tp_dev``; :func:`capacity_parabola`,
  :func:`trend_free`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from fleetsieve_bayes.model.data import ModelData, gpu_dev_count, tp_departure_sd, tp_dev_count
from fleetsieve_bayes.model.observation import from_transformed
from fleetsieve_bayes.model.priors import PriorCard
from fleetsieve_bayes.model.roles import role_log_capacity, role_tail_shift

__all__ = [
    "RHO_GAP",
    "GPU_DEVIATION_LOG_SD",
    "GPU_DEVIATION_CLASS_SD",
    "congestion",
    "overload_growth",
    "latent_metrics",
    "gpu_deviation",
    "tp_departure",
    "capacity_parabola",
    "trend_free",
]

# Tail congestion term (see :func:`congestion`): ρ^γ is capped smoothly at
# 1 - RHO_GAP, so -log(1 - ρ_s) ≤ -log(RHO_GAP) ≈ 3 (tails × e^{3β} at most from
# queueing; past saturation :func:`overload_growth` adds log(1 + Ω·(ρ − 1))).
RHO_GAP = 0.05
_CAP_SHARPNESS = 25.0
# Sharpness of :func:`overload_growth`'s smooth ``max(0, ρ − 1)``.
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

    def engine(v: jnp.ndarray) -> jnp.ndarray:  # one engine of TP 2^v of each cell's class
        return v * math.log(2.0) + cap - curv * (v - knee) ** 2

    log_cap = engine(u)
    if data.roles is not None:  # a catalogue's configurations: roles and engine covariates
        log_cap = role_log_capacity(params, data.roles, w, engine, log_cap)
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
    if data.roles is not None:
        log_tails = log_tails + role_tail_shift(params, data.roles, params["tail_slope"], u)
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
    if "tp_dev" in params and data.roles is not None and data.roles.config_col is not None:
        # A catalogue: each cell reads its (class, configuration) departure directly, O(n_cells)
        # where the one-hot product is O(n_cells × n_configs) (the same value: one term is not 0).
        tp = params["tp_dev"][data.widx, data.roles.config_col]
        shift = tp if shift is None else shift + tp
    elif "tp_dev" in params and data.tp_onehot is not None:
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
    coordinate the sampler moves is the capacity that measured loads pin (on a
    large grid only where a load is measured: ``data.dev_centred``); a
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
        at = parabola / card.capacity_tp_sd
        if data.dev_centred is not None:  # pairs without a measured cell: non-centred (data.centred_pairs)
            at = jnp.where(data.dev_centred, at, 0.0)
        centre = centre.at[:, :, 0].set(at)
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
