"""Fitting :func:`fleetsieve_bayes.model.joint.fleet_model`: presets, NUTS/SVI, the Posterior.

Presets are TOML files under ``inference/`` (``default``, ``fast``, ``svi``),
referenced by name or path (:func:`load_preset`).

Compile once per campaign: the compiled sampler is cached per (grid shape,
card, preset), and the model's arrays are *arguments* of the compiled program
(``jit_model_args``), so later rounds — where only the measured mask and values
change — reuse it.

Warm start (``fit(..., warm_start=previous)``):

* NUTS: when ``previous.state`` is the last sampler state of a run with the same
  shapes/card/preset, warmup is skipped: the adapted step size and mass matrix
  are reused and each chain starts from its last position (potential energy and
  gradient recomputed for the new data). If that run diverges in more than 2 %
  of transitions, the fit is redone with a full warmup started from the same
  positions. Otherwise (e.g. a Posterior read from disk) a full warmup starts
  from the previous posterior median.
* SVI: the optimisation starts from the previous guide parameters and runs
  ``warm_steps`` instead of ``steps``.

``n_draws`` is fixed per preset (NUTS: chains × samples; SVI: draws), so
posterior arrays keep their shapes across rounds.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from numpyro.infer import SVI, Predictive, Trace_ELBO, autoguide
from numpyro.infer.hmc import hmc
from numpyro.infer.util import constrain_fn, potential_energy, unconstrain_fn

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.joint import (
    ModelData,
    fleet_model,
    init_unconstrained,
    model_data,
    sample_obs,
)
from fleetsieve_bayes.model.priors import PriorCard, load_card
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import METRICS

__all__ = [
    "InferencePreset",
    "Posterior",
    "fit",
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
)
_WARM_DIVERGENCE_LIMIT = 0.02
# The model's sample sites (see fleetsieve_bayes.model.joint.fleet_model).
_SITES = ("class_z", "global", "noise_raw")


class InferencePreset(NamedTuple):
    """A validated inference preset."""

    name: str
    method: str  # "nuts" | "svi"
    chains: int = 2
    chain_method: str = "vectorized"
    warmup: int = 500
    samples: int = 500
    target_accept: float = 0.9
    max_tree_depth: int = 8
    dense_mass: bool = True
    guide: str = "AutoMultivariateNormal"
    optimizer: str = "adam"
    learning_rate: float = 0.01
    steps: int = 4000
    warm_steps: int = 500
    draws: int = 400

    @property
    def n_draws(self) -> int:
        """Posterior draws per fit (fixed per preset)."""
        return self.chains * self.samples if self.method == "nuts" else self.draws


class Posterior(NamedTuple):
    """A fitted posterior over all candidate cells.

    ``latent`` ``(n_draws, n_cells, 4)`` natural units (METRICS order);
    ``noise`` ``(n_draws, 4)`` Student-t scales on the transformed scale;
    ``params`` dict of ``(n_draws, ...)`` sample-site draws (warm start);
    ``idata`` arviz.InferenceData (posterior, posterior_predictive,
    observed_data, sample_stats); ``state`` the sampler state to resume from
    (None after a round trip through disk).
    """

    latent: np.ndarray
    noise: np.ndarray
    params: dict[str, np.ndarray]
    idata: Any
    state: Any = None


# --- presets ---------------------------------------------------------------

_NUTS_KEYS = {
    "chains",
    "chain_method",
    "warmup",
    "samples",
    "target_accept",
    "max_tree_depth",
    "dense_mass",
}
_SVI_KEYS = {"guide", "optimizer", "learning_rate", "steps", "warm_steps", "draws"}
_GUIDES = (
    "AutoNormal",
    "AutoMultivariateNormal",
    "AutoDiagonalNormal",
    "AutoLowRankMultivariateNormal",
)


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in data_dir("inference").glob("*.toml"))


def load_preset(name_or_path: str | Path) -> InferencePreset:
    """Load an inference preset by name (``inference/<name>.toml``) or path.

    Raises:
        InputError: not found, bad TOML, unknown key (did-you-mean), bad value.
    """
    import difflib

    s = str(name_or_path)
    p = Path(s)
    if not (p.suffix == ".toml" or "/" in s):
        p = data_dir("inference") / f"{s}.toml"
        if not p.is_file():
            names = list_presets()
            close = difflib.get_close_matches(s, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"inference preset {s!r} not found{hint}; shipped: {', '.join(names)}")
    if not p.is_file():
        raise InputError(f"{p}: inference preset not found")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{p}: cannot read inference preset: {exc}") from None
    method = raw.get("method")
    if method not in ("nuts", "svi"):
        raise InputError(f'{p}: \'method\' must be "nuts" or "svi", got {method!r}')
    for key in raw:
        if key not in ("method", "nuts", "svi"):
            close = difflib.get_close_matches(key, ["method", "nuts", "svi"], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"{p}: unknown key {key!r}{hint}")
    table = raw.get(method, {})
    allowed = _NUTS_KEYS if method == "nuts" else _SVI_KEYS
    values: dict[str, Any] = {}
    defaults = InferencePreset(name="", method=method)
    for key, value in table.items():
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(
                f"{p}: unknown key [{method}] {key!r}{hint}; allowed: {', '.join(sorted(allowed))}"
            )
        want = type(getattr(defaults, key))
        if want is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError(f"{p}: [{method}] {key!r} must be a positive integer, got {value!r}")
        if want is float and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
        ):
            raise InputError(f"{p}: [{method}] {key!r} must be a positive number, got {value!r}")
        if want is bool and not isinstance(value, bool):
            raise InputError(f"{p}: [{method}] {key!r} must be true or false, got {value!r}")
        if want is str and not isinstance(value, str):
            raise InputError(f"{p}: [{method}] {key!r} must be a string, got {value!r}")
        values[key] = want(value)
    preset = defaults._replace(name=p.stem, **values)
    if preset.chain_method not in ("vectorized", "sequential", "parallel"):
        raise InputError(f"{p}: [nuts] 'chain_method' must be vectorized, sequential or parallel")
    if preset.target_accept >= 1.0:
        raise InputError(f"{p}: [nuts] 'target_accept' must be < 1")
    if preset.guide not in _GUIDES:
        raise InputError(f"{p}: [svi] 'guide' must be one of {', '.join(_GUIDES)}")
    if not hasattr(optax, preset.optimizer):
        raise InputError(f"{p}: [svi] 'optimizer' {preset.optimizer!r} is not an optax optimizer")
    if method == "svi" and preset.steps % preset.warm_steps:
        raise InputError(f"{p}: [svi] 'steps' must be a multiple of 'warm_steps'")
    return preset


# --- fitting ---------------------------------------------------------------


def _bind(card: PriorCard) -> Any:
    """``fleet_model`` with the card closed over: ``model(data, obs)``."""

    def model(data: ModelData, obs: jnp.ndarray | None = None) -> None:
        fleet_model(data, card, obs)

    return model


_CACHE: dict[tuple, Any] = {}


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
    n_classes_max: int | None = None,
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
        failed: optional bool ``(n_cells,)`` failure labels (see :mod:`model`).
        n_classes_max: pad classes (fixed shapes across campaigns).
    """
    card, preset = _resolve(card, preset)
    data = model_data(grid, observed, measured_mask, n_classes_max, failed=failed)
    if preset.method == "svi":
        return _fit_svi(data, card, preset, seed, warm_start)
    return _fit_nuts(data, card, preset, seed, warm_start)


def _shape_key(data: ModelData) -> tuple[int, int]:
    return (int(data.u.shape[0]), int(data.cap_ref.shape[0]))


def _nuts_objects(data: ModelData, card: PriorCard, preset: InferencePreset) -> dict[str, Any]:
    """Compiled pieces of one (shape, card, preset): a single-chain NUTS chunk
    runner (``lax.scan`` of ``chunk`` transitions, data as an argument), the
    energy/gradient for re-targeting a saved state, and the constrained-space
    post-processing. Chains run one after the other through the same compiled
    program (cheaper to compile than a vectorised NUTS, and fine on 2 cores).

    Nothing here runs the model eagerly: the potential and the constrained
    values are traced inside ``jit`` only (an eager model run compiles every
    primitive separately — tens of seconds on a cold CPU)."""
    key = ("nuts", _shape_key(data), card, preset)
    if key not in _CACHE:
        model = _bind(card)

        def pe_gen(d: ModelData, obs: jnp.ndarray) -> Any:
            return lambda z: potential_energy(model, (d, obs), {}, z)

        init_kernel, sample_kernel = hmc(potential_fn_gen=pe_gen, algo="NUTS")
        chunk_len = math.gcd(preset.warmup, preset.samples)

        @jax.jit
        def chunk(state: Any, d: ModelData) -> tuple[Any, tuple]:
            def body(s: Any, _: None) -> tuple[Any, tuple]:
                s = sample_kernel(s, model_args=(d, d.observed))
                return s, (
                    s.z,
                    s.diverging,
                    s.accept_prob,
                    s.num_steps,
                    s.adapt_state.step_size,
                    s.potential_energy,
                )

            return jax.lax.scan(body, state, None, length=chunk_len)

        @jax.jit
        def init(z: dict[str, jnp.ndarray] | None, rng: jax.Array, d: ModelData) -> Any:
            # Jitted so that a cold start in a later round reuses the compiled
            # program. ``z=None``: a random start near the prior's centre.
            r_init, r_run = jax.random.split(rng)
            if z is None:
                z = init_unconstrained(r_init, card, int(d.cap_ref.shape[0]))
            return init_kernel(
                z,
                num_warmup=preset.warmup,
                target_accept_prob=preset.target_accept,
                max_tree_depth=preset.max_tree_depth,
                dense_mass=preset.dense_mass,
                model_args=(d, d.observed),
                rng_key=r_run,
            )

        @jax.jit
        def energy(
            z: dict[str, jnp.ndarray], d: ModelData
        ) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
            return jax.value_and_grad(pe_gen(d, d.observed))(z)

        @jax.jit
        def post(zs: dict[str, jnp.ndarray], d: ModelData) -> dict[str, jnp.ndarray]:
            def one(z: dict[str, jnp.ndarray]) -> dict[str, jnp.ndarray]:
                return constrain_fn(model, (d, d.observed), {}, z, return_deterministic=True)

            return jax.vmap(one)(zs)

        _CACHE[key] = {
            "model": model,
            "init": init,
            "chunk": chunk,
            "chunk_len": chunk_len,
            "energy": energy,
            "post": post,
            "key": key,
        }
    return _CACHE[key]


def _nuts_chain(
    objs: dict[str, Any], state: Any, data: ModelData, n_iter: int, keep: int
) -> tuple[Any, list]:
    """Advance one chain ``n_iter`` transitions (a multiple of the chunk); keep the last ``keep``."""
    outs = []
    for _ in range(n_iter // objs["chunk_len"]):
        state, out = objs["chunk"](state, data)
        outs.append(out)
    kept = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs])[-keep:], *outs)
    return state, kept


def _fit_nuts(
    data: ModelData, card: PriorCard, preset: InferencePreset, seed: int, warm: Posterior | None
) -> Posterior:
    objs = _nuts_objects(data, card, preset)
    keys = jax.random.split(jax.random.PRNGKey(seed), preset.chains)
    args = (data, data.observed)
    states: list[Any] | None = None
    if warm is not None and isinstance(warm.state, dict) and warm.state.get("key") == objs["key"]:
        states = []
        for c, last in enumerate(warm.state["states"]):
            pe, grad = objs["energy"](last.z, data)
            states.append(last._replace(potential_energy=pe, z_grad=grad, rng_key=keys[c]))
    results = None
    if states is not None:
        results = [_nuts_chain(objs, s, data, preset.samples, preset.samples) for s in states]
        div = np.mean([r[1][1].mean() for r in results])
        if div > _WARM_DIVERGENCE_LIMIT:
            results = None
    if results is None:
        inits: list[Any] = []
        if states is not None:
            inits = [s.z for s in states]
        elif warm is not None and warm.params:
            z0 = _init_from_median(objs["model"], args, warm.params)
            inits = [z0] * preset.chains
        results = []
        for c in range(preset.chains):
            state = objs["init"](inits[c] if inits else None, keys[c], data)
            results.append(
                _nuts_chain(objs, state, data, preset.warmup + preset.samples, preset.samples)
            )
    zs = jax.tree.map(
        lambda *xs: np.stack(xs), *[r[1][0] for r in results]
    )  # (chains, samples, ...)
    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), zs)
    constrained = objs["post"](flat, data)
    samples = {
        k: np.asarray(v).reshape(preset.chains, preset.samples, *v.shape[1:])
        for k, v in constrained.items()
    }
    stack = lambda i: np.stack([np.asarray(r[1][i]) for r in results])  # noqa: E731
    num_steps = stack(3)
    stats = {
        "diverging": stack(1).astype(bool),
        "acceptance_rate": stack(2),
        "n_steps": num_steps,
        "tree_depth": np.floor(np.log2(np.maximum(num_steps, 1))).astype(np.int64) + 1,
        "step_size": stack(4),
        "lp": -stack(5),
    }
    last_states = [jax.device_get(r[0]) for r in results]
    return _assemble(
        samples, stats, data, seed, method="nuts", state={"key": objs["key"], "states": last_states}
    )


def _init_from_median(
    model: Any, args: tuple, params: dict[str, np.ndarray]
) -> dict[str, jnp.ndarray]:
    """Unconstrained init from the posterior median of ``params`` (each ``(n_draws, ...)``)."""
    med = {k: jnp.median(jnp.asarray(v), axis=0) for k, v in params.items()}
    return unconstrain_fn(model, args, {}, med)


def _svi_objects(data: ModelData, card: PriorCard, preset: InferencePreset) -> dict[str, Any]:
    key = ("svi", _shape_key(data), card, preset)
    if key not in _CACHE:
        model = _bind(card)
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

        _CACHE[key] = {"svi": svi, "chunk": chunk, "init": init, "draw": draw, "key": key}
    return _CACHE[key]


def _fit_svi(
    data: ModelData, card: PriorCard, preset: InferencePreset, seed: int, warm: Posterior | None
) -> Posterior:
    objs = _svi_objects(data, card, preset)
    rng_init, rng_draw = jax.random.split(jax.random.PRNGKey(seed))
    prev = None
    if warm is not None and isinstance(warm.state, dict) and warm.state.get("key") == objs["key"]:
        prev = warm.state["params"]
    svi_state = objs["init"](rng_init, data, prev)
    n_chunks = 1 if prev is not None else preset.steps // preset.warm_steps
    losses = []
    for _ in range(n_chunks):
        svi_state, loss = objs["chunk"](svi_state, data)
        losses.append(loss)
    params = objs["svi"].get_params(svi_state)
    draws = objs["draw"](rng_draw, params, data)
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
    post = _assemble(
        samples,
        stats,
        data,
        seed,
        method="svi",
        state={"key": objs["key"], "params": jax.device_get(params)},
    )
    post.idata.sample_stats.attrs["final_elbo_loss"] = float(np.mean(loss_trace[-50:]))
    return post


def _assemble(
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
    y = np.asarray(
        sample_obs(
            jax.random.PRNGKey(seed + 1), jnp.asarray(latent_c), jnp.asarray(noise_c)[:, :, None, :]
        )
    )
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
    }
    idata = az.from_dict(
        posterior=posterior,
        posterior_predictive={"y": y},
        observed_data={"y": observed},
        sample_stats=stats,
        coords={"cell": np.arange(latent_c.shape[2]), "quantity": list(METRICS)},
        dims=dims,
        attrs={"inference_method": method, "seed": seed},
    )
    for group in ("posterior", "sample_stats"):  # from_dict does not place attrs on groups
        idata[group].attrs.update({"inference_method": method, "seed": seed})
    return Posterior(
        latent=latent_c.reshape(n_chains * n_draw, *latent_c.shape[2:]),
        noise=noise_c.reshape(n_chains * n_draw, 4),
        params=params,
        idata=idata,
        state=state,
    )


# --- storage ---------------------------------------------------------------


def save_posterior(posterior: Posterior, path: str | Path) -> None:
    """Write the posterior's InferenceData as netCDF (``posterior.nc``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    posterior.idata.to_netcdf(str(tmp))
    tmp.replace(path)  # atomic: a crash never leaves a half-written posterior


def load_idata(path: str | Path) -> Any:
    """Read an InferenceData netCDF written by :func:`save_posterior`.

    Raises:
        InputError: missing or unreadable file, or no ``posterior`` group.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: posterior file not found")
    try:
        idata = az.from_netcdf(str(path))
    except Exception as exc:  # noqa: BLE001 - any reader failure is bad input
        raise InputError(
            f"{path}: cannot read posterior (netCDF): {type(exc).__name__}: {exc}".splitlines()[0]
        ) from None
    if "posterior" not in idata.groups():
        raise InputError(f"{path}: no 'posterior' group in the file")
    return idata
