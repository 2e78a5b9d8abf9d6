"""The window noise: how one measurement window of a cell scatters around its truth.

A cell's truth is the curve plus its departure ``δ`` (the curve's discrepancy at the
cell, shared by its windows); each window scatters around it by the window noise of
:func:`window_scales` (``(n_cells, 6)``, :data:`WINDOW_COLUMNS`; sites ``window_g``
``(7,)`` and ``window_z (n_classes, 6)``, columns :data:`WINDOW_G`): normal on log
throughput and log tails, the tails' sd growing near and past the knee, and the burst
mixture on logit success (:mod:`fleetsieve_bayes.model.success`).

* :func:`compound_loglik`: the log density of a cell's throughput and tail windows
  with ``δ`` integrated out (compound-symmetric normal);
* :func:`cell_offsets`: draws of ``δ`` given the windows, ``(n_draws, n_cells, 4)``
  (:func:`offset_moments`, :func:`offsets_from_moments`, :func:`offset_normals`);
* :func:`window_probabilities`, :func:`window_attainment`: the probability that one
  window of a cell meets its class's SLOs, per draw (``(n_draws, n_cells, 3)`` and
  ``(n_draws, n_cells)``; :func:`probabilities_given_offsets` for given departures).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fleetsieve_bayes.model.data import WindowRows
from fleetsieve_bayes.model.priors import PriorCard
from fleetsieve_bayes.model.scales import SUCCESS_EPS
from fleetsieve_bayes.model.scales import TINY as _TINY
from fleetsieve_bayes.model.success import burst_sf, success_offsets

__all__ = [
    "WINDOW_G",
    "N_WINDOW_CLASS",
    "WINDOW_COLUMNS",
    "window_scales",
    "compound_loglik",
    "offset_moments",
    "offsets_from_moments",
    "cell_offsets",
    "offset_normals",
    "probabilities_given_offsets",
    "window_probabilities",
    "window_attainment",
]

# Columns of the window-noise sites: ``window_g (7,)`` family level (standard
# normal, scaled by the card's [window] section) and ``window_z (n_classes, 6)``
# class deviations (standard normal). See :func:`window_scales`.
WINDOW_G = (
    "log_ttft_light",
    "log_completion_light",
    "log_ttft_knee",
    "log_completion_knee",
    "log_success_sd",
    "logit_burst",
    "log_burst_drop",
)
N_WINDOW_CLASS = 6  # the first six of WINDOW_G deviate per class
# Columns of the deterministic site ``window (n_cells, 6)``.
WINDOW_COLUMNS = ("throughput_sd", "ttft_sd", "completion_sd", "success_sd", "burst_probability", "burst_drop")


def window_scales(card: PriorCard, g: jnp.ndarray, z: jnp.ndarray, log_rho: jnp.ndarray, widx: jnp.ndarray) -> jnp.ndarray:
    """Each cell's window noise from the window sites.

    Args:
        g: ``(7,)`` standard-normal family level (:data:`WINDOW_G` order).
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


def compound_loglik(d: jnp.ndarray, w: jnp.ndarray, cell: jnp.ndarray, n_cells: int, a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
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
    """``δ = m + sqrt(v)·z``: the conjugate posterior of :func:`compound_loglik`'s
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
    :func:`compound_loglik`'s ``δ_c`` per posterior draw (the prior ``N(0, a²)``
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
    p_succ = burst_sf(x, window[..., 3], window[..., 4], window[..., 5])
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
    :func:`burst_sf` on logit success. Analytic, vectorised, and
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
