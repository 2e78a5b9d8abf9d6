"""Persisting the model's warm-start state between rounds.

Round r's fit starts from round r−1's posterior. So that a resumed campaign
makes exactly the decisions an uninterrupted one would, the state each round
starts from is saved per round (``warm_start/round_<r>.npz``) and a resumed
round r loads the newest state saved by a round before r. Only the last two
are kept.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.journal import atomic_write_bytes

__all__ = ["save_warm_start", "load_warm_start"]

_NAME = re.compile(r"round_(\d+)\.npz$")


def _folder(path: Path) -> Path:
    return path.with_suffix("") if path.suffix == ".npz" else path


def save_warm_start(path: Path, posterior: Any, *, round_no: int) -> None:
    """Save ``posterior.params`` (a dict of arrays) as the state after round ``round_no``."""
    folder = _folder(path)
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in dict(posterior.params).items()})
    atomic_write_bytes(folder / f"round_{round_no}.npz", buf.getvalue())
    saved = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.search(p.name)))
    for _, old in saved[:-2]:
        old.unlink(missing_ok=True)


def load_warm_start(path: Path, *, before_round: int) -> Any:
    """The newest state saved by a round ``< before_round``, as a params-only Posterior, or None."""
    folder = _folder(path)
    if not folder.is_dir():
        return None
    saved = sorted(
        (int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.search(p.name)) and int(m.group(1)) < before_round
    )
    if not saved:
        return None
    from fleetsieve_bayes.inference import Posterior

    with np.load(saved[-1][1]) as data:
        params = {k: data[k] for k in data.files}
    return Posterior(latent=None, noise=None, params=params, idata=None)
