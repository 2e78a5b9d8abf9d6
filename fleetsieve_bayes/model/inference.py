"""Fitting :func:`fleetsieve_bayes.model.joint.fleet_model` with NUTS or SVI: the sampler driver and the Posterior.

Presets (TOML under ``fleetsieve_bayes/data/presets/``) are parsed in
:mod:`fleetsieve_bayes.model.presets` and posteriors stored by
:mod:`fleetsieve_bayes.model.storage` (both re-exported here). The compiled
pieces of a run are NamedTuples (:class:`NutsKernel`, :class:`SviKernel`) and
each NUTS transition is recorded as a :class:`NutsTrace` (as BlackJAX's
``HMCInfo``). :func:`prior_predictive` simulates fleets from the prior.

Compile once per campaign: the compiled sampler is cached per (grid shape,
card, preset), and the model's arrays are *arguments* of the compiled program
(``jit_model_args``), so later rounds — where only the measured mask and values
change — reuse it.

Warm start (``fit(..., warm_start=previous)``):

* NUTS: when ``previous.state`` is the last sampler state of a run with the same
  parameter space/card/preset (the number of measured windows may differ),
  warmup is skipped: the adapted step size and mass matrix
  are reused and each chain starts from its last position (potential energy and
  gradient recomputed for the new data). If that run diverges in more than 2 %
  of transitions, it is redone from the same positions and mass with the step
  size re-tuned over a short warm-up, and if that diverges too, with a full
  warmup. Otherwise (e.g. a Posterior read from disk) a full warmup starts
  from the previous posterior median.
* SVI: the optimisation starts from the previous guide parameters and runs
  ``warm_steps`` instead of ``steps``.

``n_draws`` is fixed per preset (NUTS: chains × samples; SVI: draws), so
posterior arrays keep their shapes across rounds.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from jax.flatten_util import ravel_pytree
from numpyro.infer import SVI, Predictive, Trace_ELBO, autoguide
from numpyro.infer.hmc import hmc
from numpyro.infer.hmc_util import build_adaptation_schedule
from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.arviz_import import import_arviz
from fleetsieve_bayes.jax_cache import on_release
from fleetsieve_bayes.model import sampling_progress as _progress
from fleetsieve_bayes.model.class_prior import init_unconstrained
from fleetsieve_bayes.model.data import (
    ModelData,
    fit_cells,
    free_departures,
    gpu_dev_count,
    model_data,
    restrict,
    tp_dev_count,
)
from fleetsieve_bayes.model.diagnostics import minor_mode_chains
from fleetsieve_bayes.model.gpu_axis import grid_gpu_inputs
from fleetsieve_bayes.model.joint import COORDINATES, fleet_model
from fleetsieve_bayes.model.lattice import on_lattice, snap_start
from fleetsieve_bayes.model.observation import NOISE_DF, from_transformed, obs_from_normals
from fleetsieve_bayes.model.presets import InferencePreset, list_presets, load_preset
from fleetsieve_bayes.model.priors import PriorCard, load_card
from fleetsieve_bayes.model.storage import load_idata, save_posterior
from fleetsieve_bayes.numerics import snap_step_size
from fleetsieve_bayes.table import METRICS

az = import_arviz()

__all__ = [
    "InferencePreset",
    "Posterior",
    "NutsKernel",
    "NutsTrace",
    "SviKernel",
    "fit",
    "assemble",
    "mass_from_draws",
    "restart_chains",
    "bind_model",
    "prior_predictive",
    "load_preset",
    "list_presets",
    "save_posterior",
    "load_idata",
]

# Deterministic sites worth keeping in InferenceData besides the cell latents.
_DERIVED = (
    "noise",
    "knee",
    "curvature",
    "cap_level",
    "tail_base",
    "tail_blowup",
    "tail_elasticity",
    "succ_base",
    "succ_drop",
    "sharpness",
    "exponent",
    "tail_slope",
    "overload",
    "window",
    "gpu_dev",
    "tp_dev",
    "prefill_share",
    "decode_gain",
    "kv_cost",
    "disagg_tail",
    "engine_coef",
)
_WARM_DIVERGENCE_LIMIT = 0.02
# A warm refit over the limit re-tunes its step size over this many transitions
# (mass and positions kept) before falling back to a full warm-up
# (docs/results.md, "Warm refits across window buckets").
_RETUNE_STEPS = 200
# A warm refit most of whose transitions run to max_tree_depth is sampling under a mass
# matrix adapted on another posterior (new windows of a cell sharpen its departure and its
# class's noise): 255 leapfrog steps a transition, 40-115 s a round on the noisy suite's
# fleet 37 (2 cores). It is re-massed from its own draws (:func:`_remassed`).
_SATURATED_SHARE = 0.5
# The random stream of the free departures' fresh draws (redraw_free), apart from the chains' keys.
_FREE_DRAW_STREAM = 0x7F5E
# The model's sample sites (see fleetsieve_bayes.model.joint.fleet_model).
_SITES = ("class_z", "global", "noise_raw", "window_g", "window_z", "gpu_z", "tp_z", "role_z", "engine_z")


class Posterior(NamedTuple):
    """A fitted posterior over all candidate cells.

    ``latent`` ``(n_draws, n_cells, 4)`` natural units (METRICS order);
    ``noise`` ``(n_draws, 4)`` Student-t scales on the transformed scale;
    ``params`` dict of ``(n_draws, ...)`` sample-site draws (warm start);
    ``idata`` arviz.InferenceData (posterior, posterior_predictive,
    observed_data, sample_stats); ``state`` the sampler state to resume from
    (None after a round trip through disk); ``window`` ``(n_draws, n_cells, 6)``
    the window noise of each cell (:data:`fleetsieve_bayes.model.joint.WINDOW_COLUMNS`)
    when the fit used the window-noise likelihood, else None; ``windows`` the
    :class:`~fleetsieve_bayes.model.joint.WindowRows` it was fitted to.
    """

    latent: np.ndarray
    noise: np.ndarray
    params: dict[str, np.ndarray]
    idata: Any
    state: Any = None
    window: np.ndarray | None = None
    windows: Any = None


# --- fitting ---------------------------------------------------------------


def bind_model(card: PriorCard) -> Any:
    """``fleet_model`` with the card closed over: ``model(data, obs)``."""

    def model(data: ModelData, obs: jnp.ndarray | None = None) -> None:
        fleet_model(data, card, obs)

    return model


def prior_predictive(
    grid: CellGrid, card: PriorCard | str | Path, n: int, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """``n`` draws of every site of the model under the prior, nothing measured.

    Returns:
        site name → ``(n, ...)`` arrays, e.g. ``latent (n, n_cells, 4)``,
        ``knee (n, n_classes)`` and ``y (n, n_cells, 4)``: simulated
        measurements in natural units (the model's observation site is on the
        modelling scale; it is mapped back here).
    """
    card = card if isinstance(card, PriorCard) else load_card(card)
    data = model_data(
        grid, np.ones((grid.n_cells, 4)), np.zeros(grid.n_cells, bool), gpu=grid_gpu_inputs(grid, card)
    )
    pred = Predictive(bind_model(card), num_samples=n)(jax.random.PRNGKey(seed), data, None)
    out = {k: np.asarray(v) for k, v in pred.items()}
    out["y"] = np.asarray(from_transformed(pred["y"]))
    return out


class NutsTrace(NamedTuple):
    """Per-transition record of one NUTS chain (as BlackJAX's ``HMCInfo``); each ``(n_steps, ...)``."""

    z: dict[str, Any]  # unconstrained position
    diverging: Any  # bool
    accept_prob: Any
    num_steps: Any  # leapfrog steps
    step_size: Any
    potential_energy: Any


class NutsKernel(NamedTuple):
    """Compiled pieces of one (shape, card, preset) NUTS run (see :func:`_nuts_kernel`)."""

    model: Any  # the bound model
    init: Any  # (z | None, rng, data) -> HMCState
    init_fixed_mass: Any  # (z, rng, data, inverse_mass (dim, dim)) -> HMCState, mass never re-estimated
    init_point: Any  # (rng, data) -> the random start ``init`` draws from ``rng`` (z=None)
    unconstrain: Any  # (sites of n draws, data) -> (n, dim) flat unconstrained positions
    flatten: Any  # (unconstrained positions of n draws) -> (n, dim), the mass matrix's order
    chunk: Any  # (state, data) -> (state, NutsTrace of chunk_len transitions)
    chunk_len: int
    energy: Any  # (z, data) -> (potential energy, gradient)
    post: Any  # (zs, data) -> constrained sites incl. deterministic ones
    key: tuple  # cache key; a warm start must match it


class SviKernel(NamedTuple):
    """Compiled pieces of one (shape, card, preset) SVI run (see :func:`_svi_kernel`)."""

    svi: Any  # numpyro.infer.SVI
    init: Any  # (rng, data, params | None) -> SVIState
    chunk: Any  # (state, data) -> (state, losses (warm_steps,))
    draw: Any  # (rng, params, data) -> sites (draws, ...)
    key: tuple


_CACHE: dict[tuple, Any] = {}
# NUTS kernels whose init has been traced in this process (see _fit_nuts).
_KERNEL_READY: set[tuple] = set()
# Kernels whose warm-refit programs (``energy``, ``init_fixed_mass``) were compiled
# ahead of the first warm refit (:func:`_prime_warm_refit`).
_WARM_PRIMED: set[tuple] = set()
_PRIMING: list[threading.Thread] = []


def _resolve(
    card: PriorCard | str | Path, preset: InferencePreset | str | Path
) -> tuple[PriorCard, InferencePreset]:
    card = card if isinstance(card, PriorCard) else load_card(card)
    preset = preset if isinstance(preset, InferencePreset) else load_preset(preset)
    return card, preset


def fit(
    grid: CellGrid,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    card: PriorCard | str | Path,
    preset: InferencePreset | str | Path,
    *,
    seed: int,
    warm_start: Posterior | None = None,
    failed: np.ndarray | None = None,
    mass_from: Posterior | None = None,
    server_failed: np.ndarray | None = None,
    rows: np.ndarray | None = None,
    row_cell: np.ndarray | None = None,
    prime_warm_refit: bool = False,
    step_scale: float = 1.0,
) -> Posterior:
    """Fit the model to the measured cells and return draws for every cell.

    Args:
        grid: candidate cells.
        observed: ``(n_cells, 4)`` METRICS values (read where measured).
        measured_mask: bool ``(n_cells,)``.
        card: prior card (object, name or path).
        preset: inference preset (object, name or path).
        seed: PRNG seed.
        warm_start: the previous round's Posterior (same grid) to start from.
        failed: optional bool ``(n_cells,)`` failure labels (see
            :func:`fleetsieve_bayes.model.joint.model_data`; the synthetic
            suite passes them).
        mass_from: NUTS with ``adaptation = "pooled"``, cold start only: a fit
            of the same data (e.g. the round's cheap posterior) whose draws'
            covariance, in the unconstrained space, is the fixed mass of the
            warm-up's first half (see :func:`mass_from_draws`,
            :func:`_pooled_warmup`); ignored by the windowed warm-up.
        server_failed: optional bool ``(n_cells,)``: failed cells whose server
            never served (start-up failures; see
            :func:`fleetsieve_bayes.model.joint.load_failures`).
        rows, row_cell: every measurement window ``(n_rows, 4)`` and its cell
            ``(n_rows,)``: fit the window-noise likelihood (several windows
            per cell; :func:`fleetsieve_bayes.model.joint.model_data`). None:
            one value per cell (``observed``), the Student-t likelihood.
        prime_warm_refit: NUTS, cold start: also compile, on a background
            thread, the programs a warm refit of this fit will run (a
            campaign's next round; see :func:`_prime_warm_refit`).
        step_scale: NUTS, warm start of the same sampler only: every chain goes on
            with ``step_scale`` times its adapted step size (its mass and position
            kept, no warm-up, no re-tuning), e.g. smaller steps after divergent
            transitions (:func:`fleetsieve_bayes.model.converged_fit.fit_certifying`).
    """
    card, preset = _resolve(card, preset)
    data = model_data(
        grid, observed, measured_mask, failed=failed, server_failed=server_failed, rows=rows, row_cell=row_cell,
        gpu=grid_gpu_inputs(grid, card),
    )
    if preset.method == "svi":
        return _fit_svi(data, card, preset, seed, warm_start)
    return _fit_nuts(data, card, preset, seed, warm_start, mass_from, prime_warm_refit, step_scale)


def _init_point(key: jax.Array, card: PriorCard, data: ModelData) -> dict[str, jnp.ndarray]:
    """:func:`~fleetsieve_bayes.model.joint.init_unconstrained` for this data's sites."""
    return init_unconstrained(key, card, int(data.cap_ref.shape[0]), data.windows is not None, gpu_dev_count(data),
                              tp_dev_count(data, card), roles=data.roles is not None)


def _shape_key(data: ModelData) -> tuple[int, ...]:
    gpu = () if data.gpu_offset is None else ("gpu", gpu_dev_count(data))
    if data.windows is None:
        return (int(data.u.shape[0]), int(data.cap_ref.shape[0]), *gpu)
    return (int(data.u.shape[0]), int(data.cap_ref.shape[0]), int(data.windows.rows.shape[0]), int(data.windows.shared.shape[0]), *gpu)


def _sampler_key(data: ModelData, card: PriorCard, preset: InferencePreset) -> tuple:
    """What a NUTS sampler state depends on: the parameter space (classes, the
    window-noise sites, the GPU and TP deviations, and what its coordinates mean:
    :data:`~fleetsieve_bayes.model.joint.COORDINATES`), the card and the preset —
    not how many windows are measured. A state adapted on a round with fewer
    window rows (another row bucket, hence another compiled program) warm-starts
    the next round's fit: the new program is compiled, but the 800-step warm-up
    is not rerun (docs/results.md, "Warm refits across window buckets")."""
    return ("nuts-sampler", COORDINATES, int(data.u.shape[0]), int(data.cap_ref.shape[0]), data.windows is not None,
            gpu_dev_count(data), tp_dev_count(data, card), card, preset)


def _on_lattice(state: Any) -> Any:
    """``state`` after a NUTS transition, its step size on the step lattice
    (:func:`fleetsieve_bayes.numerics.snap_step_size`): the position is on the
    integrator's lattice already (:mod:`fleetsieve_bayes.model.lattice`)."""
    adapt = state.adapt_state._replace(step_size=snap_step_size(state.adapt_state.step_size))
    return state._replace(adapt_state=adapt)


def _nuts_kernel(data: ModelData, card: PriorCard, preset: InferencePreset) -> NutsKernel:
    """Compiled pieces of one (shape, card, preset): a single-chain NUTS chunk
    runner (``lax.scan`` of ``chunk`` transitions, data as an argument), the
    energy/gradient for re-targeting a saved state, and the constrained-space
    post-processing. Chains run one after the other through the same compiled
    program (cheaper to compile than a vectorised NUTS, and fine on 2 cores).

    Nothing here runs the model eagerly: the potential and the constrained
    values are traced inside ``jit`` only (an eager model run compiles every
    primitive separately — tens of seconds on a cold CPU). The warm-up's kind is not in
    the key: a pooled and a windowed run of one preset share the compiled programs."""
    key = ("nuts", COORDINATES, _shape_key(data), card, preset._replace(adaptation="pooled"))
    if key not in _CACHE:
        model = bind_model(card)

        def pe_gen(d: ModelData, obs: jnp.ndarray) -> Any:
            return on_lattice(lambda z: potential_energy(model, (d, obs), {}, z))

        init_kernel, sample_kernel = hmc(potential_fn_gen=pe_gen, algo="NUTS")
        # A pooled warm-up stops at its half and its quarter (see _pooled_warmup); a windowed
        # one runs through the same chunks.
        chunk_len = math.gcd(math.gcd(preset.warmup, preset.warmup // 4), preset.samples)

        @jax.jit
        def chunk(state: Any, d: ModelData) -> tuple[Any, NutsTrace]:
            def body(s: Any, _: None) -> tuple[Any, NutsTrace]:
                s = _on_lattice(sample_kernel(s, model_args=(d, d.observed)))
                return s, NutsTrace(
                    s.z, s.diverging, s.accept_prob, s.num_steps, s.adapt_state.step_size, s.potential_energy
                )

            return jax.lax.scan(body, state, None, length=chunk_len)

        def start(
            z: dict[str, jnp.ndarray] | None, rng: jax.Array, d: ModelData, inverse_mass: jnp.ndarray | None
        ) -> Any:
            # ``z=None``: a random start near the prior's centre; ``inverse_mass`` None: the identity.
            r_init, r_run = jax.random.split(rng)
            if z is None:
                z = _init_point(r_init, card, d)
            if inverse_mass is not None and not preset.dense_mass and not isinstance(inverse_mass, dict):
                inverse_mass = jnp.diagonal(inverse_mass)
            return init_kernel(
                snap_start(z),
                num_warmup=preset.warmup,
                target_accept_prob=preset.target_accept,
                max_tree_depth=preset.max_tree_depth,
                dense_mass=preset.dense_mass,
                inverse_mass_matrix=inverse_mass,
                model_args=(d, d.observed),
                rng_key=r_run,
            )

        @jax.jit
        def init(z: dict[str, jnp.ndarray] | None, rng: jax.Array, d: ModelData) -> Any:
            # Jitted so that a cold start in a later round reuses the compiled program.
            return start(z, rng, d, None)

        @jax.jit
        def init_point(rng: jax.Array, d: ModelData) -> dict[str, jnp.ndarray]:
            # ``init(None, rng, d)``'s start, given to init_fixed_mass (one program for both kinds)
            return _init_point(jax.random.split(rng)[0], card, d)

        n_windows = len(build_adaptation_schedule(preset.warmup))

        @jax.jit
        def init_fixed_mass(z: dict[str, jnp.ndarray], rng: jax.Array, d: ModelData, inverse_mass: jnp.ndarray) -> Any:
            # ``init``'s transitions (one compiled ``chunk``), the adaptation starting in its terminal
            # window: the step size tuned over the whole warm-up, the given mass kept. NumPyro's
            # dense mass from its 25- and 50-draw windows underweights slow directions: trees ran to
            # max_tree_depth for most of the warm-up (1023 leapfrog steps per transition over steps
            # 100-350, against ~110 with a mass from posterior draws).
            state = start(z, rng, d, inverse_mass)
            adapt = state.adapt_state._replace(window_idx=jnp.asarray(n_windows - 1, state.adapt_state.window_idx.dtype))
            return state._replace(adapt_state=adapt)

        @jax.jit
        def flatten(zs: dict[str, jnp.ndarray]) -> jnp.ndarray:
            return jax.vmap(lambda z: ravel_pytree(z)[0])(zs)

        @jax.jit
        def unconstrain(sites: dict[str, jnp.ndarray], d: ModelData) -> jnp.ndarray:
            zs = jax.vmap(lambda draw: unconstrain_fn(model, (d, d.observed), {}, draw))(sites)
            return flatten(zs)

        @jax.jit
        def energy(z: dict[str, jnp.ndarray], d: ModelData) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
            return jax.value_and_grad(pe_gen(d, d.observed))(z)

        @jax.jit
        def post(zs: dict[str, jnp.ndarray], d: ModelData) -> dict[str, jnp.ndarray]:
            def one(z: dict[str, jnp.ndarray]) -> dict[str, jnp.ndarray]:
                return constrain_fn(model, (d, d.observed), {}, z, return_deterministic=True)

            return jax.vmap(one)(zs)

        _CACHE[key] = NutsKernel(
            model, init, init_fixed_mass, init_point, unconstrain, flatten, chunk, chunk_len, energy, post, key
        )
    return _CACHE[key]


def _nuts_chain(
    objs: NutsKernel, state: Any, data: ModelData, n_iter: int, keep: int
) -> tuple[Any, NutsTrace]:
    """Advance one chain ``n_iter`` transitions (a multiple of the chunk); keep the last ``keep``."""
    outs = []
    for _ in range(n_iter // objs.chunk_len):
        state, out = objs.chunk(state, data)
        outs.append(out)
        _progress.advance(objs.chunk_len)
    kept = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs])[-keep:], *outs)
    return state, kept


def _map_chains(preset: InferencePreset, run_chain: Any) -> list[Any]:
    """``[run_chain(c) for c in range(chains)]``, concurrently for ``chain_method = "parallel"``.

    Each chain is its own compiled XLA call, which releases the GIL: with
    ``parallel`` the chains run in threads, one per CPU core (about 2× on 2
    cores; NumPyro's ``vectorized`` chains measured 3× *slower* there, so
    ``vectorized`` and ``sequential`` both run the chains one after another
    through the same program). Each chain has its own key, so the draws do not
    depend on the method or on scheduling.
    """
    n = preset.chains
    workers = min(n, os.cpu_count() or 1) if preset.chain_method == "parallel" else 1
    if workers <= 1:
        return [run_chain(c) for c in range(n)]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nuts-chain") as pool:
        return list(pool.map(run_chain, range(n)))


def mass_from_draws(flat: np.ndarray, free: np.ndarray | None = None) -> np.ndarray:
    """Inverse mass matrix from posterior draws: Stan's regularised covariance.

    Args:
        flat: ``(n_draws, dim)`` unconstrained positions.
        free: bool ``(dim,)``, the free departure coordinates (:func:`_free_flat`), or None.
            Their posterior is known exactly, N(0, 1) independent of the rest: their rows
            and columns are those of the identity, whatever the draws did with them.

    Returns:
        ``(dim, dim)``: ``n/(n+5) · cov + 1e-3 · 5/(n+5) · I``, shrunk towards
        a small identity as Stan and NumPyro do, so that a direction the draws
        barely explored still gets a positive variance.
    """
    flat = np.asarray(flat, np.float64)
    n = flat.shape[0]
    cov = np.cov(flat, rowvar=False).reshape(flat.shape[1], flat.shape[1])
    out = (n / (n + 5.0)) * cov + 1e-3 * (5.0 / (n + 5.0)) * np.eye(flat.shape[1])
    if free is not None:
        out[free, :] = 0.0
        out[:, free] = 0.0
        out[free, free] = 1.0
    return out


def _free_flat(objs: NutsKernel, data: ModelData, card: PriorCard) -> np.ndarray | None:
    """bool ``(dim,)``: the free departure coordinates
    (:func:`~fleetsieve_bayes.model.data.free_departures`) of a flattened position, in
    ``objs.flatten``'s order; None where there are none."""
    free = free_departures(data, card)
    if free is None:
        return None
    z = objs.init_point(jax.random.PRNGKey(0), data)
    mask = {k: (jnp.asarray(free, jnp.float64) if k == "tp_z" else jnp.zeros(jnp.shape(v))) for k, v in z.items()}
    return np.asarray(ravel_pytree(mask)[0]) > 0.5


def _pooled_warmup(
    objs: NutsKernel,
    preset: InferencePreset,
    data: ModelData,
    keys: jax.Array,
    inits: list[Any],
    inverse_mass: jnp.ndarray | None,
    free: np.ndarray | None = None,
) -> list[tuple[Any, NutsTrace]]:
    """Cold chains with a two-half warm-up whose second mass matrix pools every chain.

    First half: each chain from its own start, the mass fixed at
    ``inverse_mass`` (identity when None), the step size tuned. Second half:
    each chain goes on from where it is under one mass matrix, the regularised
    covariance of the *pooled* second quarter of all chains' warm-up draws,
    with the step size tuned afresh; then ``preset.samples`` draws.

    Why: NumPyro's per-chain windows estimate a dense mass from 25, 50 and
    200 of one chain's own draws. On the hard suite those estimates leave the
    trees at ``max_tree_depth`` for most of the warm-up and often for the
    draws (fleet c012: 1023 leapfrog steps a transition until step 350,
    ~400 after), and the four chains disagree (r_hat fails until 2,000 draws
    per chain). A mass from 4 × ``warmup/4`` pooled draws: c012 converged
    after 800–1,200 draws per chain, at ~300 leapfrog steps a transition.

    Args:
        keys: ``(chains, 2)`` PRNG keys; inits: per chain an unconstrained
            start or None (a random start near the prior's centre).
        inverse_mass: ``(dim, dim)`` first-half mass, e.g. from the round's
            cheap posterior (:func:`mass_from_draws`), or None.
        free: the free departure coordinates (:func:`_free_flat`): the pooled mass is
            the identity on them.

    A chain whose first-half log density sits in a minor mode
    (:func:`~fleetsieve_bayes.model.diagnostics.minor_mode_chains`) is left out
    of the pool and starts its second half at a main-mode chain's position.

    Returns:
        Per chain (last state, NutsTrace of the ``preset.samples`` draws).
    """
    half = preset.warmup // 2
    starts = [objs.init_point(keys[c], data) if z is None else z for c, z in enumerate(inits)]
    if inverse_mass is None:  # NumPyro's own default, given explicitly: one compiled init_fixed_mass
        inverse_mass = jnp.eye(sum(int(np.size(x)) for x in jax.tree.leaves(starts[0])), dtype=jnp.float64)

    def first(c: int) -> tuple[Any, NutsTrace]:
        state = objs.init_fixed_mass(starts[c], keys[c], data, inverse_mass)
        return _nuts_chain(objs, state, data, half, half // 2)

    firsts = _map_chains(preset, first)
    # A chain stuck in a minor mode would pool the distance between the modes
    # into the mass matrix (every chain then crawls): pool the chains in the
    # main mode only, and move the stuck ones to a main-mode chain's position
    # (their own key makes them diverge from it in the second half).
    lp = np.stack([-np.asarray(r[1].potential_energy, np.float64) for r in firsts])
    stuck = minor_mode_chains(lp)
    flat = np.concatenate([np.asarray(objs.flatten(r[1].z)) for c, r in enumerate(firsts) if c not in stuck])
    pooled = jnp.asarray(mass_from_draws(flat, free), jnp.float64)

    def second(c: int) -> tuple[Any, NutsTrace]:
        # The warm-up clock resumes at the half, so the step size is averaged
        # and adaptation stops exactly at ``preset.warmup``.
        start = firsts[stuck.get(c, c)][0].z
        return _fixed_mass_chain(objs, preset, data, start, jax.random.fold_in(keys[c], 1), pooled, half)

    return _map_chains(preset, second)


def _may_remass(data: ModelData, preset: InferencePreset, step_scale: float) -> bool:
    """Whether a saturated warm refit is re-massed (:func:`_remassed`): a dense mass, the window-noise
    model (at ``"point"`` every fit stays as it was), and not a certifying fit's smaller steps."""
    return step_scale == 1.0 and preset.dense_mass and data.windows is not None


def _saturated(results: list[tuple[Any, NutsTrace]], preset: InferencePreset) -> bool:
    """Whether more than :data:`_SATURATED_SHARE` of every chain's kept transitions ran
    to ``preset.max_tree_depth`` (``2^depth − 1`` leapfrog steps)."""
    full = 2 ** int(preset.max_tree_depth) - 1
    share = np.mean([float(np.mean(np.asarray(r[1].num_steps) >= full)) for r in results])
    return bool(share > _SATURATED_SHARE)


def _remassed(
    objs: NutsKernel, preset: InferencePreset, data: ModelData, results: list[tuple[Any, NutsTrace]],
    keys: jax.Array, steps: int,
) -> list[tuple[Any, NutsTrace]]:
    """Every chain from its last position under one new mass matrix, the regularised
    covariance of all chains' kept draws pooled (:func:`mass_from_draws`), its step size
    tuned afresh over ``steps`` warm-up transitions, then ``preset.samples`` draws."""
    flat = np.concatenate([np.asarray(objs.flatten(r[1].z)) for r in results])
    pooled = jnp.asarray(mass_from_draws(flat), jnp.float64)
    return _map_chains(preset, lambda c: _fixed_mass_chain(
        objs, preset, data, results[c][0].z, jax.random.fold_in(keys[c], 3), pooled, preset.warmup - steps))


def _divergence(results: list[tuple[Any, NutsTrace]]) -> float:
    """The share of divergent transitions over every chain's kept draws."""
    return float(np.mean([r[1].diverging.mean() for r in results]))


def _fixed_mass_chain(
    objs: NutsKernel, preset: InferencePreset, data: ModelData, z: Any, key: jax.Array, inverse_mass: Any,
    from_step: int,
) -> tuple[Any, NutsTrace]:
    """One chain from ``z`` under ``inverse_mass`` (kept), its step size tuned from warm-up
    step ``from_step`` to ``preset.warmup``, then ``preset.samples`` draws."""
    state = objs.init_fixed_mass(z, key, data, inverse_mass)
    state = state._replace(i=jnp.asarray(from_step, state.i.dtype))
    return _nuts_chain(objs, state, data, preset.warmup - from_step + preset.samples, preset.samples)


def _prime_warm_refit(objs: NutsKernel, data: ModelData, last: Any, key: jax.Array) -> None:
    """Compile the programs the next round's warm refit runs, on a background thread.

    A cold fit is followed by warm refits (:func:`_fit_nuts` with ``warm``),
    whose first call compiles ``energy`` and, when the refit re-tunes,
    ``init_fixed_mass``: seconds of compile that would land in the second
    round's planning. Compiled here, after the cold fit, they overlap the
    first round's allocation and acquisition instead (docs/results.md,
    "Speed"). Results are discarded, so the fit's numbers do not depend on it.
    Once per compiled kernel (``objs.key``, which includes the data's shapes).
    """
    if objs.key in _WARM_PRIMED:
        return
    _WARM_PRIMED.add(objs.key)
    z, mass = last.z, last.adapt_state.inverse_mass_matrix

    def compile_both() -> None:
        try:
            jax.block_until_ready(objs.energy(z, data))
            jax.block_until_ready(objs.init_fixed_mass(z, key, data, mass))
        except Exception:  # noqa: BLE001 - a failed warm-up compile is retried by the refit itself
            _WARM_PRIMED.discard(objs.key)

    thread = threading.Thread(target=compile_both, name="fsb-prime-warm-refit", daemon=True)
    thread.start()
    _PRIMING[:] = [t for t in _PRIMING if t.is_alive()] + [thread]


def _join_priming() -> None:
    """At exit, let a compile in flight finish (the interpreter must not tear down under XLA)."""
    for thread in _PRIMING:
        thread.join(timeout=120)


atexit.register(_join_priming)


@on_release
def _drop_kernels() -> None:
    """Forget every built kernel (after any compile in flight finishes): the next fit builds,
    traces and compiles its kernel afresh (:func:`fleetsieve_bayes.jax_cache.release_compiled`).
    A warm start saved by an earlier fit still applies: its kernel key is rebuilt identical."""
    _join_priming()
    _PRIMING.clear()
    _CACHE.clear()
    _KERNEL_READY.clear()
    _WARM_PRIMED.clear()


def _retuned_chain(
    objs: NutsKernel, preset: InferencePreset, data: ModelData, last: Any, key: jax.Array, steps: int
) -> tuple[Any, NutsTrace]:
    """One chain from ``last``'s position under ``last``'s mass matrix, the step
    size tuned afresh over ``steps`` warm-up transitions, then ``preset.samples`` draws."""
    return _fixed_mass_chain(objs, preset, data, last.z, jax.random.fold_in(key, 2),
                             last.adapt_state.inverse_mass_matrix, preset.warmup - steps)


def _mass_for(data: ModelData, card: PriorCard, preset: InferencePreset) -> InferencePreset:
    """The preset a fit of ``data`` runs: a catalogue's configurations bring a departure per
    (class, configuration), hundreds of coordinates whose dense mass a warm-up of a few hundred
    draws cannot estimate, so their mass is diagonal. Except under the pooled warm-up on a grid
    with free departures (:func:`~fleetsieve_bayes.model.data.free_departures`): most of those
    coordinates are free, their mass is known (the identity, :func:`mass_from_draws`), and the
    rest, the coordinates the data reach, are few enough for a dense estimate. On the first
    full-size configuration world (1,134 cells, 35 measured) a diagonal mass left the
    certifying chains at 447 leapfrog steps a transition (windowed warm-up, 302 s an attempt)
    or at the maximum depth, 1,023 (pooled), against 127 with this mass. It is not enough: two
    later attempts on such worlds still ran 523-794 steps a transition, with chains in minor
    modes, before the windowed fallback (converged_fit.fit_certifying)."""
    if data.roles is not None and preset.dense_mass:
        if preset.adaptation == "pooled" and free_departures(data, card) is not None:
            return preset
        return preset._replace(dense_mass=False)
    return preset


def _sampled(data: ModelData) -> ModelData:
    """What NUTS samples on: a large grid's measured cells (exact; model.data.fit_cells), else
    ``data``; the draws' deterministic sites are then computed on every cell of ``data``."""
    cells = fit_cells(data)
    return data if cells is None else restrict(data, cells)


def _warm_refit(
    objs: NutsKernel, preset: InferencePreset, data: ModelData, states: list[Any], keys: jax.Array, step_scale: float,
) -> list[tuple[Any, NutsTrace]] | None:
    """Every chain on from its warm state for ``preset.samples`` draws; re-tuned when its draws
    diverge, re-massed when its trees run to max depth (:func:`_saturated`); None when the
    re-tuned draws still diverge (the caller starts cold)."""
    results = _map_chains(preset, lambda c: _nuts_chain(objs, states[c], data, preset.samples, preset.samples))
    retune = min(preset.warmup, objs.chunk_len * -(-_RETUNE_STEPS // objs.chunk_len))
    if step_scale == 1.0 and _divergence(results) > _WARM_DIVERGENCE_LIMIT:
        # New data moved the posterior (typically sharper): keep the mass,
        # re-tune the step size over a short warm-up from the same positions.
        _progress.expect_more(preset.chains * (retune + preset.samples))
        results = _map_chains(preset, lambda c: _retuned_chain(objs, preset, data, states[c], keys[c], retune))
        if _divergence(results) > _WARM_DIVERGENCE_LIMIT:
            return None
    if _may_remass(data, preset, step_scale) and _saturated(results, preset):
        # New windows changed the posterior's shape under the old mass: every tree runs to
        # max_tree_depth. A mass from this refit's own draws, the step size tuned afresh.
        _progress.expect_more(preset.chains * (retune + preset.samples))
        results = _remassed(objs, preset, data, results, keys, retune)
    return results


def redraw_free(z: dict[str, Any], data: ModelData, card: PriorCard, seed: int) -> dict[str, Any]:
    """The draws ``z`` (unconstrained sites, leading axis the draws) with every free departure
    coordinate (:func:`~fleetsieve_bayes.model.data.free_departures`) drawn afresh from its
    standard-normal posterior, i.i.d. per draw (seeded by ``seed``; each value on the start
    lattice, :func:`~fleetsieve_bayes.model.lattice.snap_start`).

    Exact: those coordinates enter the log density only through their own prior, so their
    posterior is N(0, 1) independent of the rest. The chains leave them where NUTS put them,
    which on a catalogue's grid (hundreds of such coordinates, a diagonal mass, warm refits
    of a few hundred draws) is a slow random walk: measured on the first full-size
    configuration world (1,134 cells, round 11), their chains' spread ranged over 0.04–0.5
    instead of 1. Unmeasured configurations' hopes then read too narrow or too wide, and the
    certifying warm-up that took its first mass from those draws ran every tree to max depth
    (docs/method.md §2, "Large grids")."""
    free = free_departures(data, card)
    if free is None or "tp_z" not in z:
        return z
    tz = np.array(z["tp_z"], np.float64)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, _FREE_DRAW_STREAM]))
    tz[:, free] = np.asarray(snap_start(jnp.asarray(rng.standard_normal((tz.shape[0], int(free.sum()))))))
    return {**z, "tp_z": jnp.asarray(tz)}


def _fit_nuts(
    data: ModelData,
    card: PriorCard,
    preset: InferencePreset,
    seed: int,
    warm: Posterior | None,
    mass_from: Posterior | None = None,
    prime_warm_refit: bool = False,
    step_scale: float = 1.0,
) -> Posterior:
    preset = _mass_for(data, card, preset)
    full, data, sampler = data, _sampled(data), _sampler_key(data, card, preset)
    objs = _nuts_kernel(data, card, preset)
    keys = jax.random.split(jax.random.PRNGKey(seed), preset.chains)
    args = (data, data.observed)
    states: list[Any] | None = None
    digest = data_digest(data)
    if warm is not None and isinstance(warm.state, dict) and (
        warm.state.get("key") == objs.key or warm.state.get("sampler") == sampler
    ):
        # numpyro's sample_kernel reads settings (tree depth, adaptation) that
        # only its init_kernel sets; a state loaded from disk arrives in a
        # process where init never ran, so trace it once (no compile, no run).
        if objs.key not in _KERNEL_READY:
            jax.eval_shape(objs.init, warm.state["states"][0].z, keys[0], data)
            _KERNEL_READY.add(objs.key)
        states = []
        same_data = warm.state.get("data") == digest
        for c, last in enumerate(warm.state["states"]):
            # The same data (a certifying fit's next run): the state's energy and gradient hold.
            pe, grad = (last.potential_energy, last.z_grad) if same_data else objs.energy(last.z, data)
            adapt = last.adapt_state._replace(step_size=last.adapt_state.step_size * step_scale)
            states.append(last._replace(potential_energy=pe, z_grad=grad, rng_key=keys[c], adapt_state=adapt))
    elif step_scale != 1.0:
        raise ValueError("step_scale needs a warm start of the same NUTS sampler")
    results = None
    cold_total = preset.chains * (preset.warmup + preset.samples)
    _progress.begin(preset.name, preset.chains * preset.samples if states is not None else cold_total)
    if states is not None:
        results = _warm_refit(objs, preset, data, states, keys, step_scale)
        if results is None:
            _progress.expect_more(cold_total)
    if results is None:
        inits: list[Any] = []
        if states is not None:
            inits = [s.z for s in states]
        elif warm is not None and warm.params and _fits_shapes(warm.params, data, card):
            z0 = _init_from_median(objs.model, args, warm.params)
            inits = [z0] * preset.chains

        inverse_mass = None
        free = _free_flat(objs, data, card) if preset.adaptation == "pooled" else None
        if preset.adaptation == "pooled" and mass_from is not None and mass_from.params and _fits_shapes(mass_from.params, data, card):
            sites = {k: jnp.asarray(v) for k, v in mass_from.params.items() if k in _SITES}
            inverse_mass = jnp.asarray(mass_from_draws(np.asarray(objs.unconstrain(sites, data)), free), jnp.float64)
        chain_inits = [inits[c] if inits else None for c in range(preset.chains)]
        if preset.adaptation == "pooled":
            results = _pooled_warmup(objs, preset, data, keys, chain_inits, inverse_mass, free)
        else:

            def cold(c: int) -> tuple[Any, NutsTrace]:
                # NumPyro's windows re-estimate the mass from the first window on,
                # so ``mass_from`` is for the pooled warm-up only.
                state = objs.init(chain_inits[c], keys[c], data)
                return _nuts_chain(objs, state, data, preset.warmup + preset.samples, preset.samples)

            results = _map_chains(preset, cold)
        _KERNEL_READY.add(objs.key)  # its init has run here: a warm start need not trace it again
    # Every field stacked over chains: (chains, samples, ...).
    trace: NutsTrace = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *[r[1] for r in results])
    flat = redraw_free(jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), trace.z), full, card, seed)
    constrained = objs.post(flat, full)
    samples = {
        k: np.asarray(v).reshape(preset.chains, preset.samples, *v.shape[1:])
        for k, v in constrained.items()
    }
    stats = {
        "diverging": trace.diverging.astype(bool),
        "acceptance_rate": trace.accept_prob,
        "n_steps": trace.num_steps,
        "tree_depth": np.floor(np.log2(np.maximum(trace.num_steps, 1))).astype(np.int64) + 1,
        "step_size": trace.step_size,
        "lp": -trace.potential_energy,
    }
    last_states = [jax.device_get(r[0]) for r in results]
    if prime_warm_refit and states is None:
        _prime_warm_refit(objs, data, last_states[0], keys[0])
    return assemble(
        samples, stats, full, seed, method="nuts",
        state={"key": objs.key, "sampler": sampler, "states": last_states, "data": digest},
    )


def restart_chains(
    posterior: Posterior, restart: dict[int, int], data: ModelData, *, seed: int
) -> Posterior:
    """A warm start in which chain ``c`` restarts at a posterior draw of chain ``restart[c]``.

    Every other chain continues from its last state. A restarted chain takes
    its donor's adapted step size and mass matrix and starts at a draw of the
    donor's *sampling phase* picked at random (not its last position, so the
    two chains do not start together), with its own random key: an exact
    sample of the donor's region needs no new warm-up. Used by the certifying
    posterior to pull a chain out of a minor mode
    (:func:`fleetsieve_bayes.model.converged_fit.minor_mode_chains`).

    Args:
        posterior: a NUTS fit of this process (``state`` set), ``params``
            chain-major ``(chains · draws, ...)``.
        restart: ``{chain: donor chain}``.
        data: the model data of the fit.
        seed: picks the donors' draws.

    Returns:
        ``posterior`` with ``state`` replaced, for ``fit(..., warm_start=…)``.
    """
    if not isinstance(posterior.state, dict) or posterior.state.get("key") not in _CACHE:
        raise ValueError("restart_chains needs the sampler state of a NUTS fit in this process")
    objs = _CACHE[posterior.state["key"]]
    states = list(posterior.state["states"])
    n_chains = len(states)
    per_chain = int(next(iter(posterior.params.values())).shape[0]) // n_chains
    rng = np.random.default_rng(seed)
    for chain, donor in restart.items():
        i = donor * per_chain + int(rng.integers(per_chain // 2, per_chain))
        draw = {k: jnp.asarray(v[i]) for k, v in posterior.params.items() if k in _SITES}
        z = unconstrain_fn(objs.model, (data, data.observed), {}, draw)
        states[chain] = states[donor]._replace(z=z)
    # A moved chain keeps its donor's energy and gradient: not its position's, so recomputed.
    return posterior._replace(state={**posterior.state, "states": states, "data": None})


def data_digest(data: ModelData) -> str:
    """A digest of every array of ``data``: equal digests, the same potential energy."""
    h = hashlib.blake2b(digest_size=16)
    for leaf in jax.tree.leaves(data):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _fits_shapes(params: dict[str, np.ndarray], data: ModelData, card: PriorCard) -> bool:
    """Whether ``params`` (draws, chain-major) have this model's site shapes — a
    warm start saved by another version of the model (e.g. before a class-level
    parameter was added) starts cold instead of failing."""
    # Shapes only: an eager draw would compile its random programs (a second of a cold start).
    want = jax.eval_shape(lambda k: _init_point(k, card, data), jax.random.PRNGKey(0))
    return all(k in params and tuple(np.shape(params[k])[1:]) == tuple(v.shape) for k, v in want.items())


def _init_from_median(
    model: Any, args: tuple, params: dict[str, np.ndarray]
) -> dict[str, jnp.ndarray]:
    """Unconstrained init from the posterior median of ``params`` (each ``(n_draws, ...)``)."""
    med = {k: jnp.median(jnp.asarray(v), axis=0) for k, v in params.items()}
    return unconstrain_fn(model, args, {}, med)


def _svi_kernel(data: ModelData, card: PriorCard, preset: InferencePreset) -> SviKernel:
    key = ("svi", COORDINATES, _shape_key(data), card, preset)
    if key not in _CACHE:
        model = bind_model(card)
        guide_cls = getattr(autoguide, preset.guide)
        guide = guide_cls(model, init_loc_fn=numpyro.infer.init_to_median(num_samples=15))
        optim = getattr(optax, preset.optimizer)(preset.learning_rate)
        svi = SVI(model, guide, optim, Trace_ELBO())

        @jax.jit
        def chunk(svi_state: Any, d: ModelData) -> tuple[Any, jnp.ndarray]:
            def body(s: Any, _: None) -> tuple[Any, jnp.ndarray]:
                s, loss = svi.update(s, d, d.observed)
                return s, loss

            return jax.lax.scan(body, svi_state, None, length=preset.warm_steps)

        @jax.jit
        def init(rng: jax.Array, d: ModelData, params: dict[str, jnp.ndarray] | None) -> Any:
            # The guide keeps the prototype of the trace that first called it, values of that
            # trace included. A kernel first traced warm (``params`` given: a campaign's later
            # round, or the first fit of a resumed process) and then cold (a new campaign in
            # the same process) would start from those stale values: each trace sets up its own.
            guide.prototype_trace = None
            return svi.init(rng, d, d.observed, init_params=params)

        @jax.jit
        def draw(
            rng: jax.Array, params: dict[str, jnp.ndarray], d: ModelData
        ) -> dict[str, jnp.ndarray]:
            pred = Predictive(
                model,
                guide=guide,
                params=params,
                num_samples=preset.draws,
                return_sites=[*_SITES, *_DERIVED, "latent", "capacity"],
            )
            return pred(rng, d, None)

        _CACHE[key] = SviKernel(svi, init, chunk, draw, key)
    return _CACHE[key]


def _fit_svi(
    data: ModelData, card: PriorCard, preset: InferencePreset, seed: int, warm: Posterior | None
) -> Posterior:
    objs = _svi_kernel(data, card, preset)
    rng_init, rng_draw = jax.random.split(jax.random.PRNGKey(seed))
    prev = None
    sampler = _sampler_key(data, card, preset)
    if warm is not None and isinstance(warm.state, dict) and (
        warm.state.get("key") == objs.key or warm.state.get("sampler") == sampler
    ):
        prev = warm.state["params"]
    svi_state = objs.init(rng_init, data, prev)
    n_chunks = 1 if prev is not None else preset.steps // preset.warm_steps
    losses = []
    _progress.begin(preset.name, n_chunks * preset.warm_steps)
    for _ in range(n_chunks):
        svi_state, loss = objs.chunk(svi_state, data)
        _progress.advance(preset.warm_steps)
        losses.append(loss)
    params = objs.svi.get_params(svi_state)
    draws = objs.draw(rng_draw, params, data)
    # Guide draws are i.i.d.; split them into 2 pseudo-chains so r_hat/ESS are defined.
    n = preset.draws
    half = n // 2
    samples = {
        k: np.asarray(v)[: 2 * half].reshape(2, half, *v.shape[1:])
        for k, v in draws.items()
        if k != "y"
    }
    stats = {"diverging": np.zeros((2, half), dtype=bool)}
    loss_trace = np.concatenate([np.asarray(x) for x in losses])
    post = assemble(
        samples,
        stats,
        data,
        seed,
        method="svi",
        state={"key": objs.key, "params": jax.device_get(params)},
    )
    post.idata.sample_stats.attrs["final_elbo_loss"] = float(np.mean(loss_trace[-50:]))
    return post


def assemble(
    samples: dict[str, Any],
    stats: dict[str, np.ndarray],
    data: ModelData,
    seed: int,
    *,
    method: str,
    state: Any,
) -> Posterior:
    """Posterior + InferenceData from chain-grouped draws ``(chains, draws, ...)``."""
    samples = {k: np.asarray(v) for k, v in samples.items()}
    latent_c = samples["latent"]  # (chains, draws, n_cells, 4)
    noise_c = samples["noise"]  # (chains, draws, 4)
    n_chains, n_draw = latent_c.shape[:2]
    # The posterior predictive, drawn in NumPy: a JAX draw compiles a program for every
    # number of draws (a certifying fit's runs and their concatenations: a second each).
    normals = np.random.default_rng(seed + 1).standard_normal((int(NOISE_DF) + 1, *latent_c.shape), np.float64)
    y = obs_from_normals(latent_c, noise_c[:, :, None, :], normals)
    param_names = [k for k in samples if k not in ("latent", "capacity", "y") and k not in _DERIVED]
    params = {k: samples[k].reshape(n_chains * n_draw, *samples[k].shape[2:]) for k in param_names}
    observed = np.where(np.asarray(data.measured)[:, None], np.asarray(data.observed), np.nan)
    observed = np.where(np.asarray(data.fit_mask), observed, np.nan)
    posterior = {k: samples[k] for k in samples if k != "y"}
    dims = {
        "latent": ["cell", "quantity"],
        "capacity": ["cell"],
        "y": ["cell", "quantity"],
        "noise": ["quantity"],
        "failed_under_load": ["cell"],
    }
    idata = az.from_dict(
        posterior=posterior,
        posterior_predictive={"y": y},
        observed_data={"y": observed},
        constant_data={
            "measured": np.asarray(data.measured, bool),
            # failed runs the model reads as overload (joint.load_failures)
            "failed_under_load": np.asarray(data.failed_under_load, bool),
        },
        sample_stats=stats,
        coords={"cell": np.arange(latent_c.shape[2]), "quantity": list(METRICS)},
        dims=dims,
        attrs={"inference_method": method, "seed": seed},
    )
    for group in ("posterior", "sample_stats"):  # from_dict does not place attrs on groups
        idata[group].attrs.update({"inference_method": method, "seed": seed})
    window = samples.get("window")
    return Posterior(
        latent=latent_c.reshape(n_chains * n_draw, *latent_c.shape[2:]),
        noise=noise_c.reshape(n_chains * n_draw, 4),
        params=params,
        idata=idata,
        state=state,
        window=None if window is None else window.reshape(n_chains * n_draw, *window.shape[2:]),
        windows=data.windows,
    )
