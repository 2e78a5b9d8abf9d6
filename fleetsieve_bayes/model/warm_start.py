"""Persisting the model's warm-start state between rounds.

Round r's fit starts from round r−1's posterior: its parameter draws and, for
NUTS, the sampler state (position, step size, mass matrix). So that a resumed
campaign makes exactly the decisions an uninterrupted one would, that state is
saved per round (``warm_start/round_<r>.pkl``) and a resumed round r loads the
newest state saved by a round before r. Only the last two are kept.

The files are pickles of NumPy arrays and plain NamedTuples written by this
campaign itself into its own directory (like ``posterior.nc``); they are not an
exchange format.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fleetsieve_bayes.campaign.journal import atomic_write_bytes

__all__ = ["save_warm_start", "load_warm_start"]

_NAME = re.compile(r"round_(\d+)\.pkl$")


def _saved(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.search(p.name)))


def save_warm_start(folder: Path, posterior: Any, *, round_no: int) -> None:
    """Save ``posterior``'s params and sampler state as the state after round ``round_no``."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "params": {k: np.asarray(v) for k, v in dict(posterior.params).items()},
        "state": jax.device_get(getattr(posterior, "state", None)),
    }
    atomic_write_bytes(folder / f"round_{round_no}.pkl", pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    for _, old in _saved(folder)[:-2]:
        old.unlink(missing_ok=True)


def load_warm_start(folder: Path, *, before_round: int) -> Any:
    """The newest state saved by a round ``< before_round`` as a Posterior without draws, or None.

    A file that cannot be read (e.g. written by another version) is ignored:
    the round then starts cold, which costs time but not correctness.
    """
    saved = [(r, p) for r, p in _saved(folder) if r < before_round]
    if not saved:
        return None
    from fleetsieve_bayes.model.inference import Posterior

    try:
        payload = pickle.loads(saved[-1][1].read_bytes())
    except Exception:  # noqa: BLE001 - a stale cache is not an error
        return None
    return Posterior(latent=None, noise=None, params=payload["params"], idata=None, state=payload["state"])
