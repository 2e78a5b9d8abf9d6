"""Persisting the model's warm-start state between rounds, as arrays + JSON.

Round r's fit starts from round r−1's posterior: its parameter draws and, for
NUTS, the sampler state (position, step size, mass matrix). So that a resumed
campaign makes exactly the decisions an uninterrupted one would, that state is
saved per round (``warm_start/round_<r>.npz``) and a resumed round r loads the
newest state saved by a round before r. Only the last two are kept.

Never pickle: a campaign directory may come from someone else, and unpickling
runs code. Each file is a NumPy ``.npz`` read with ``allow_pickle=False``: the
arrays, plus one ``tree.json`` entry describing how they nest (dicts, lists,
tuples, and NamedTuples of an allow-listed module such as numpyro's sampler
states). The sampler-state cache keys (the compiled program's: grid and
window shapes, prior card, preset; and the parameter space's) are kept as
digests: a state is reused only by a fit with the very same key. Leftover
``round_<r>.pkl`` files of older versions are never opened.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fleetsieve_bayes.atomic import atomic_write_bytes

__all__ = ["save_warm_start", "load_warm_start", "encode_tree", "decode_tree"]

_NAME = re.compile(r"^round_(\d+)\.npz$")
_TREE = "tree.json"
_VERSION = 1
# NamedTuple classes are rebuilt only from these modules (by name, never by code in the file).
_TRUSTED_MODULES = ("numpyro.infer.", "fleetsieve_bayes.")
# Sampler-state cache keys (see fleetsieve_bayes.model.inference): saved as digests.
_KEYS = ("key", "sampler")


class KeyDigest:
    """Stands for a cache key that was saved as a digest: equal to any key with that digest."""

    def __init__(self, digest: str) -> None:
        self.digest = digest

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KeyDigest):
            return other.digest == self.digest
        return _digest(other) == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"KeyDigest({self.digest[:12]}…)"


def _digest(key: Any) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()


def encode_tree(x: Any, arrays: dict[str, np.ndarray]) -> Any:
    """A JSON-able description of the pytree ``x``; its arrays go into ``arrays``.

    Raises:
        TypeError: a leaf that is neither a number, string, None nor a
            numeric/bool array.
    """
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x
    if isinstance(x, KeyDigest):
        return {"__digest__": x.digest}
    if isinstance(x, (np.ndarray, np.generic, jax.Array)):
        a = np.asarray(x)
        if a.dtype.kind not in "biufc":
            raise TypeError(f"warm-start array of dtype {a.dtype} cannot be stored without pickle")
        name = f"a{len(arrays)}"
        arrays[name] = a
        return {"__array__": name}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        cls = type(x)
        if not cls.__module__.startswith(_TRUSTED_MODULES):
            raise TypeError(f"warm-start NamedTuple {cls.__module__}.{cls.__qualname__} is not allow-listed")
        return {
            "__namedtuple__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": [encode_tree(v, arrays) for v in x],
        }
    if isinstance(x, tuple):
        return {"__tuple__": [encode_tree(v, arrays) for v in x]}
    if isinstance(x, list):
        return [encode_tree(v, arrays) for v in x]
    if isinstance(x, dict):
        return {"__dict__": [[encode_tree(k, arrays), encode_tree(v, arrays)] for k, v in x.items()]}
    raise TypeError(f"warm-start value of type {type(x).__name__} cannot be stored without pickle")


def _namedtuple_class(spec: str) -> type:
    module, _, qualname = spec.partition(":")
    if not module.startswith(_TRUSTED_MODULES):
        raise ValueError(f"NamedTuple class from untrusted module {module!r}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise ValueError(f"{spec} is not a NamedTuple")
    return obj


def decode_tree(x: Any, arrays: Any) -> Any:
    """Inverse of :func:`encode_tree` (``arrays``: a mapping of the stored arrays)."""
    if isinstance(x, list):
        return [decode_tree(v, arrays) for v in x]
    if not isinstance(x, dict):
        return x
    if "__array__" in x:
        return np.asarray(arrays[x["__array__"]])
    if "__digest__" in x:
        return KeyDigest(str(x["__digest__"]))
    if "__tuple__" in x:
        return tuple(decode_tree(v, arrays) for v in x["__tuple__"])
    if "__dict__" in x:
        return {_hashable(decode_tree(k, arrays)): decode_tree(v, arrays) for k, v in x["__dict__"]}
    if "__namedtuple__" in x:
        cls = _namedtuple_class(str(x["__namedtuple__"]))
        return cls(*[decode_tree(v, arrays) for v in x["fields"]])
    raise ValueError(f"unknown warm-start tree node {sorted(x)}")


def _hashable(k: Any) -> Any:
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def _saved(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name)))


def save_warm_start(folder: Path, posterior: Any, *, round_no: int) -> None:
    """Save ``posterior``'s params and sampler state as the state after round ``round_no``."""
    folder.mkdir(parents=True, exist_ok=True)
    state = jax.device_get(getattr(posterior, "state", None))
    if isinstance(state, dict):
        state = {k: KeyDigest(_digest(v)) if k in _KEYS and not isinstance(v, KeyDigest) else v for k, v in state.items()}
    arrays: dict[str, np.ndarray] = {}
    tree = {
        "version": _VERSION,
        "params": encode_tree({k: np.asarray(v) for k, v in dict(posterior.params).items()}, arrays),
        "state": encode_tree(state, arrays),
    }
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{_TREE: np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8)})
    atomic_write_bytes(folder / f"round_{round_no}.npz", buf.getvalue())
    for _, old in _saved(folder)[:-2]:
        old.unlink(missing_ok=True)


def load_warm_start(folder: Path, *, before_round: int) -> Any:
    """The newest state saved by a round ``< before_round`` as a Posterior without draws, or None.

    A file that cannot be read (truncated, another version, or crafted) is
    ignored: the round then starts cold, which costs time but not correctness.
    """
    saved = [(r, p) for r, p in _saved(folder) if r < before_round]
    if not saved:
        return None
    from fleetsieve_bayes.model.inference import Posterior

    try:
        with np.load(saved[-1][1], allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        tree = json.loads(arrays.pop(_TREE).tobytes().decode())
        if tree.get("version") != _VERSION:
            return None
        params = decode_tree(tree["params"], arrays)
        state = decode_tree(tree["state"], arrays)
    except Exception:  # noqa: BLE001 - a stale or foreign cache is not an error
        return None
    if not isinstance(params, dict):
        return None
    return Posterior(latent=None, noise=None, params=params, idata=None, state=state)
