"""NUTS on a lattice: a leapfrog integrator whose every step is exact on every machine.

A leapfrog trajectory amplifies the last bits of its arithmetic, so two CPUs
that round one product differently (a fused multiply-add, another vector width
or reduction order) start chains that part within a few hundred transitions,
and the decisions that read their draws part with them. Here each half-step
is a *shear* whose increment is rounded to a grid before it is added:

    r ← r − S_r · q(½ ε ∇U(z) / S_r)
    z ← z + S_z · q(ε M⁻¹ r / S_z)
    r ← r − S_r · q(½ ε ∇U(z) / S_r)

``q`` rounds to a grid of ``2^-bits`` and ``S_z``, ``S_r`` are per-coordinate
powers of two near the posterior and momentum scales (the square roots of the
inverse mass matrix's diagonal and of its reciprocal). A shear whose increment
depends only on the other variable is exactly invertible, so the integrator
stays reversible and volume-preserving on the lattice (Levy's reversible
integer leapfrog), which is what NUTS's correctness rests on. Positions are
sums of exact dyadic increments: two machines whose gradients differ in the
last bits add the same increment unless the exact value sits within ~1e-15 of
a grid boundary (probability ~1e-11 per coordinate and step), so their chains,
their draws and every decision read from them are the same bits.

The grids (``POSITION_BITS``, ``MOMENTUM_BITS``: 2^-16 and 2^-12 of each
coordinate's scale) are far below any posterior scale: the lattice moves no
posterior summary beyond its Monte Carlo error.

Only potentials marked with :func:`on_lattice` use this integrator; NumPyro's
own ``velocity_verlet`` serves every other caller in the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpyro.infer.hmc as _hmc
import numpyro.infer.hmc_util as _hmc_util
from jax.flatten_util import ravel_pytree
from numpyro.infer.hmc_util import IntegratorState

from fleetsieve_bayes.numerics import MOMENTUM_BITS, POSITION_BITS, START_BITS

__all__ = ["on_lattice", "snap_start", "velocity_verlet", "install"]

_NUMPYRO_VELOCITY_VERLET = _hmc_util.velocity_verlet


def on_lattice(potential_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Mark ``potential_fn`` so that NUTS integrates it on the lattice; returns it."""
    potential_fn.on_lattice = True  # type: ignore[attr-defined]
    return potential_fn


def snap_start(z: Any) -> Any:
    """A starting position (pytree) rounded to a grid of ``2^-START_BITS``: starts drawn or
    read with other rounding on another machine become the same bits."""
    scale = float(2**START_BITS)
    return jax.tree.map(lambda x: jnp.round(x * scale) / scale, z)


def _grid(x: jnp.ndarray, scale_exp: jnp.ndarray, bits: int) -> jnp.ndarray:
    """``x`` rounded to a grid of ``2^(scale_exp - bits)`` per coordinate (exact scaling by powers of two)."""
    return jnp.ldexp(jnp.round(jnp.ldexp(x, bits - scale_exp)), scale_exp - bits)


def _scale_exponents(inverse_mass_matrix: Any) -> jnp.ndarray:
    """``(dim,)`` int: log2 of each coordinate's posterior scale, √(M⁻¹)ᵢᵢ, to the nearest integer."""
    diag = jnp.diagonal(inverse_mass_matrix) if jnp.ndim(inverse_mass_matrix) == 2 else inverse_mass_matrix
    return jnp.round(0.5 * jnp.log2(jnp.maximum(diag, 1e-300))).astype(jnp.int32)


def velocity_verlet(
    potential_fn: Callable[[Any], Any], kinetic_fn: Callable[..., Any], forward_mode_differentiation: bool = False
) -> tuple[Callable[..., IntegratorState], Callable[..., IntegratorState]]:
    """NumPyro's ``velocity_verlet`` interface; the lattice integrator for a potential
    marked :func:`on_lattice`, NumPyro's own otherwise."""
    init_fn, plain_update = _NUMPYRO_VELOCITY_VERLET(potential_fn, kinetic_fn, forward_mode_differentiation)
    if not getattr(potential_fn, "on_lattice", False):
        return init_fn, plain_update

    def update_fn(step_size: Any, inverse_mass_matrix: Any, state: IntegratorState) -> IntegratorState:
        z, r, _, z_grad = state
        z_flat, unravel = ravel_pytree(z)
        r_flat, unravel_r = ravel_pytree(r)
        g_flat = ravel_pytree(z_grad)[0]
        e_z = _scale_exponents(inverse_mass_matrix)  # position scale 2^e_z; momentum scale 2^-e_z
        e_r = -e_z
        r_flat = r_flat - _grid(0.5 * step_size * g_flat, e_r, MOMENTUM_BITS)
        if jnp.ndim(inverse_mass_matrix) == 2:
            v = inverse_mass_matrix @ r_flat
        else:
            v = inverse_mass_matrix * r_flat
        z_flat = z_flat + _grid(step_size * v, e_z, POSITION_BITS)
        z_new = unravel(z_flat)
        potential_energy, z_grad = jax.value_and_grad(potential_fn)(z_new)
        g_flat = ravel_pytree(z_grad)[0]
        r_flat = r_flat - _grid(0.5 * step_size * g_flat, e_r, MOMENTUM_BITS)
        return IntegratorState(z_new, unravel_r(r_flat), potential_energy, z_grad)

    return init_fn, update_fn


def install() -> None:
    """Route NumPyro's HMC/NUTS (and its step-size search) through :func:`velocity_verlet`
    (idempotent; unmarked potentials keep NumPyro's integrator)."""
    _hmc.velocity_verlet = velocity_verlet
    _hmc_util.velocity_verlet = velocity_verlet


install()
