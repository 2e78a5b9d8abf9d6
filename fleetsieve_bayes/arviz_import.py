"""ArviZ, imported so that concurrent processes and a read-only home cannot break it.

ArviZ 0.23 writes a once-a-day stamp under the user's cache directory when it is first
imported that day, through a temporary file of one fixed name. Two processes importing it
at the same moment (pytest-xdist workers, Ray workers, two campaigns started together)
race on that file, and one of them fails with ``FileNotFoundError``; a read-only cache
directory fails every import with ``OSError``. Neither says anything about the campaign.

:func:`import_arviz` first writes today's stamp itself through a temporary file of its
own process (so ArviZ finds it and writes nothing), and if the import still fails on the
file system, imports it once more with the cache directory pointed at a temporary folder.
Every module of the package takes ArviZ from here.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import uuid
import warnings
from pathlib import Path
from types import ModuleType

__all__ = ["import_arviz", "seed_daily_stamp"]

# platformdirs' user_cache_dir("arviz", "arviz") on Linux reads this variable at call time.
_CACHE_ENV = "XDG_CACHE_HOME"


def seed_daily_stamp(cache_dir: Path | None = None) -> bool:
    """Write today's date to ArviZ's daily stamp, atomically and with a temporary file of
    this process's own; True when the stamp holds today's date afterwards.

    Never raises: a read-only or missing cache directory gives False.
    """
    try:
        if cache_dir is None:
            from platformdirs import user_cache_dir

            cache_dir = Path(user_cache_dir("arviz", "arviz"))
        stamp = cache_dir / "daily_warning"
        today = datetime.date.today().isoformat()
        try:
            if stamp.read_text().strip() == today:
                return True
        except (OSError, ValueError):
            pass
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f"daily_warning.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            tmp.write_text(today)
            tmp.replace(stamp)
        finally:
            tmp.unlink(missing_ok=True)
        return True
    except Exception:  # noqa: BLE001 - any failure here only means ArviZ may write it itself
        return False


def import_arviz() -> ModuleType:
    """The ``arviz`` module, imported without its daily-stamp race (module docstring)."""
    import sys

    module = sys.modules.get("arviz")
    if module is not None:
        return module
    seed_daily_stamp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            import arviz
        except OSError:
            old = os.environ.get(_CACHE_ENV)
            with tempfile.TemporaryDirectory(prefix="fleetsieve-arviz-") as tmp:
                os.environ[_CACHE_ENV] = tmp
                try:
                    import arviz
                finally:
                    if old is None:
                        os.environ.pop(_CACHE_ENV, None)
                    else:
                        os.environ[_CACHE_ENV] = old
    return arviz
