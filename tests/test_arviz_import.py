"""ArviZ is imported safely: concurrent first imports of the day and an unwritable cache
directory (fleetsieve_bayes.arviz_import)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

from fleetsieve_bayes.arviz_import import seed_daily_stamp

_IMPORT = (
    "from fleetsieve_bayes.arviz_import import import_arviz; "
    "az = import_arviz(); print(az.__name__, hasattr(az, 'from_dict'))"
)


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_CACHE_HOME"] = str(cache)
    env.pop("PYTHONWARNINGS", None)
    return env


def test_seed_writes_todays_stamp_and_leaves_no_temporary_file(tmp_path):
    d = tmp_path / "arviz"
    assert seed_daily_stamp(d)
    assert (d / "daily_warning").read_text() == datetime.date.today().isoformat()
    (d / "daily_warning").write_text("2001-01-01")  # a stale stamp is rewritten
    assert seed_daily_stamp(d)
    assert (d / "daily_warning").read_text() == datetime.date.today().isoformat()
    assert sorted(p.name for p in d.iterdir()) == ["daily_warning"]


def test_seed_under_a_file_is_false_not_an_exception(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    assert seed_daily_stamp(blocker / "arviz") is False


def test_eight_processes_importing_together_on_a_stale_stamp_all_succeed(tmp_path):
    cache = tmp_path / "cache"
    (cache / "arviz").mkdir(parents=True)
    (cache / "arviz" / "daily_warning").write_text("2001-01-01")
    procs = [
        subprocess.Popen([sys.executable, "-c", _IMPORT], env=_env(cache), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [e[-400:] for _, e in outs]
    assert all(o.strip() == "arviz True" for o, _ in outs)
    assert (cache / "arviz" / "daily_warning").read_text() == datetime.date.today().isoformat()


def test_an_unwritable_cache_directory_still_imports(tmp_path):
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("x")  # every write under it fails, as on a read-only home (even as root)
    r = subprocess.run([sys.executable, "-c", _IMPORT], env=_env(blocker), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-600:]
    assert r.stdout.strip() == "arviz True"
    assert "Traceback" not in r.stderr
