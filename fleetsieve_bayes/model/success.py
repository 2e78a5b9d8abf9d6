"""The success mixture: a window's logit success around its cell's truth.

A window's logit-success residual is normal (sd ``success_sd``) or, with the burst
probability ``π``, normal minus an exponential drop (:func:`burst_logpdf`, its survival
:func:`burst_sf`). A cell's windows share its departure ``δ_s ~ N(0, a²)`` from the
curve; :func:`success_loglik` integrates it out (closed form for a cell with one window,
:func:`success_node_loglik`'s Gauss-Hermite sum over which of a cell's highest windows
burst for the rest), and :func:`success_offsets` draws ``δ_s`` given the windows
``(n_draws, n_cells)``. The window scales it reads are
:func:`fleetsieve_bayes.model.window_noise.window_scales`' ``(n_cells, 6)``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.model.data import ROW_BUCKET, WindowRows
from fleetsieve_bayes.model.observation import to_transformed
from fleetsieve_bayes.model.scales import SUCCESS_EPS

__all__ = [
    "burst_logpdf",
    "burst_sf",
    "success_offsets",
    "success_loglik",
    "success_node_loglik",
]

# A cell's windows share its logit-success departure δ_s ~ N(0, a²), and each
# window is plain or in a burst (burst_logpdf). Summed over which of a cell's
# _BURST_LABELLED highest windows burst (every subset, _SUBSETS), the plain
# windows and the prior make a normal in δ_s that integrates exactly; what is
# left (a burst window's normal cdf, the mixture density of any lower window)
# is integrated by Gauss-Hermite on that normal (success_node_loglik).
_BURST_LABELLED = 3
_SUBSETS = np.array([[(b >> j) & 1 for j in range(_BURST_LABELLED)] for b in range(2**_BURST_LABELLED)], bool)
# windows a subset needs: one more than its highest burst position (0 for none)
_SUBSET_NEEDS = np.array([int(b).bit_length() for b in range(2**_BURST_LABELLED)])
# 9 nodes: docs/results.md "Success quadrature" (error and cost against 7 and 15).
_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(9)
_GH_LOGW = np.log(_GH_WEIGHTS / math.sqrt(2 * math.pi))


def burst_logpdf(x: jnp.ndarray, sd: jnp.ndarray, p: jnp.ndarray, drop: jnp.ndarray) -> jnp.ndarray:
    """Log density of a window's logit-success residual ``x``: ``N(0, sd²)`` with
    probability ``1 − p``, else ``N(0, sd²) − D`` with ``D`` exponential of mean
    ``drop`` (an exponentially modified normal). Elementwise, all ``(...)``."""
    lam = 1.0 / drop
    core = -0.5 * (x / sd) ** 2 - jnp.log(sd) - 0.5 * math.log(2 * math.pi)
    # f(x) = λ exp(λ²sd²/2 + λx) Φ(−x/sd − λ sd)
    burst = jnp.log(lam) + 0.5 * (lam * sd) ** 2 + lam * x + jax.scipy.special.log_ndtr(-x / sd - lam * sd)
    return jnp.logaddexp(jnp.log1p(-p) + core, jnp.log(p) + burst)


def burst_sf(x: jnp.ndarray, sd: jnp.ndarray, p: jnp.ndarray, drop: jnp.ndarray) -> jnp.ndarray:
    """``P(residual ≥ −x)``: the probability that a window's logit success is at
    least ``truth − x`` under :func:`burst_logpdf`'s mixture; ``(...)``."""
    lam = 1.0 / drop
    core = jax.scipy.special.ndtr(x / sd)
    # P(D + sd·N ≤ x) = Φ(x/sd) − exp(λ²sd²/2 − λx) Φ(x/sd − λ sd)
    tail = jnp.exp(0.5 * (lam * sd) ** 2 - lam * x + jax.scipy.special.log_ndtr(x / sd - lam * sd))
    burst = jnp.clip(core - tail, 0.0, 1.0)
    return (1.0 - p) * core + p * burst


def success_offsets(
    key: jax.Array, latent: jnp.ndarray, noise: jnp.ndarray, window: jnp.ndarray, windows: WindowRows
) -> jnp.ndarray:
    """Draws ``(n_draws, n_cells)`` of each cell's logit-success departure ``δ_s``
    from the curve given its windows: per posterior draw, one of the quadrature
    nodes of :func:`success_node_loglik` (prior ``N(0, a²)``, ``a =
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
    terms, nodes = success_node_loglik(d, mask, local, rank, success.shape[1], a, window)
    cdf = jnp.cumsum(jax.nn.softmax(terms, axis=-1), axis=-1)  # (D, n_slots, S·K)
    node = jnp.minimum(jnp.sum(cdf < u[..., None], axis=-1), terms.shape[-1] - 1)
    return jnp.take_along_axis(nodes, node[..., None], axis=-1)[..., 0]


def success_loglik(d: jnp.ndarray, wr: WindowRows, a: jnp.ndarray, window: jnp.ndarray) -> jnp.ndarray:
    """Log density ``()`` of every cell's success windows, the departure ``δ_s ~ N(0, a²)``
    they share integrated out: closed form for a cell with one window (a normal
    departure plus the burst mixture is the burst mixture with sd ``√(sd² + a²)``),
    :func:`success_node_loglik` over the cells with more.

    Args:
        d: ``(n_rows,)`` logit-success residuals from the curve; ``a`` ``()``;
            ``window (n_cells, 6)`` (:func:`~fleetsieve_bayes.model.window_noise.window_scales`).
    """
    wc = window[wr.cell]  # (R, 6)
    one = burst_logpdf(d, jnp.sqrt(wc[:, 3] ** 2 + a * a), wc[:, 4], wc[:, 5])
    total = jnp.sum(jnp.where(wr.single, one, 0.0))
    n_shared = int(wr.shared.shape[0])
    if n_shared:
        ls, _ = success_node_loglik(
            d[wr.shared], wr.shared_mask, wr.shared_cell, wr.rank[wr.shared], n_shared, a, window[wr.shared_slot]
        )
        seen = jnp.zeros(n_shared, bool).at[wr.shared_cell].max(wr.shared_mask)
        per_cell = jax.nn.logsumexp(ls, axis=-1)
        total = total + jnp.sum(jnp.where(seen, per_cell, 0.0))
    return total


def success_node_loglik(
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
    burst (:func:`burst_logpdf`); for each labelling (:data:`_SUBSETS`, those
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
    mix = burst_logpdf(r_d - at, r_sd, r_p, r_drop)
    lf = jnp.where(burst_b[..., None] > 0, cdf, 0.0)
    lf = lf + jnp.where(lower.reshape(by_row + (1, 1)), mix, 0.0)
    data = jnp.moveaxis(jax.ops.segment_sum(lf, cell, n_cells), 0, -3)  # (..., C, S, K)
    terms = log_gauss[..., None] + jnp.asarray(_GH_LOGW, d.dtype) + data
    terms = jnp.where(valid[..., None], terms, -jnp.inf)
    flat = terms.shape[:-2] + (terms.shape[-2] * terms.shape[-1],)
    return terms.reshape(flat), nodes.reshape(flat)
