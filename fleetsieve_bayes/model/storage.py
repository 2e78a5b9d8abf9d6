"""Posterior storage: ``posterior.nc`` (ArviZ InferenceData as netCDF), written atomically.

ArviZ only (no JAX), so commands that only read a posterior (``diagnose``,
``status``, ``report``) stay light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetsieve_bayes.arviz_import import import_arviz
from fleetsieve_bayes.errors import InputError

az = import_arviz()

__all__ = ["save_posterior", "load_idata"]


def save_posterior(posterior: Any, path: str | Path) -> None:
    """Write ``posterior.idata`` (a :class:`~fleetsieve_bayes.model.inference.Posterior`'s) as netCDF."""
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
