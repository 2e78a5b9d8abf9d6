"""The transforms and the observation model, as pure JAX functions.

The model works on a transformed scale per metric (``(..., 4)``, METRICS order): log
throughput, log TTFT p99, log completion p99 and the logit of success clipped to
``[SUCCESS_EPS, 1 - SUCCESS_EPS]`` (:func:`to_transformed`, :func:`from_transformed`).
One observation of a cell is Student-t on that scale around the cell's latent metrics:
one scale per metric, ``noise (..., 4)`` (:data:`NOISE_FLOOR` plus a half-normal part,
sampled by the model), and one number of degrees of freedom per metric
(:data:`NOISE_DFS`): heavy tails (:data:`NOISE_DF` = 5) for the tails and success,
practically Gaussian (:data:`THROUGHPUT_NOISE_DF` = 1000) for throughput.

:func:`obs_logpdf` and :func:`sample_obs` (used by the acquisition kernel) need no
card: the degrees of freedom are module constants, not card fields.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.model.scales import metric_transform

__all__ = [
    "NOISE_DF",
    "THROUGHPUT_NOISE_DF",
    "NOISE_DFS",
    "NOISE_FLOOR",
    "to_transformed",
    "from_transformed",
    "obs_logpdf",
    "sample_obs",
    "obs_from_normals",
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
