"""Publish a benchmark's current figure: its JSON, its section of docs/results.md, MANIFEST.json.

Every benchmark script takes ``--publish`` and, at its end, calls
:func:`publish` with its study name, its JSON payload, the markdown table it
printed and the command line that produced it. That writes

- ``benchmarks/published/<study>.json`` (the payload; one current file per study),
- the study's section of ``docs/results.md``, between the markers
  ``<!-- study:NAME -->`` and ``<!-- /study:NAME -->`` (appended when absent):
  the command, the table and where the data lives,
- the study's entry of ``benchmarks/published/MANIFEST.json``: the script, the
  command, the commit (``git rev-parse HEAD``), the date and the machine
  (CPUs, memory, platform, Python and JAX versions, load average).

Nothing else writes those sections: docs/results.md's figures are the
benchmarks' own output. ``python -m benchmarks.publish --render`` rewrites
every section from the published JSON and the manifest (no benchmark is run),
with each script's ``published_table(payload)``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = Path("benchmarks") / "published"
RESULTS_MD = Path("docs") / "results.md"
MANIFEST = "MANIFEST.json"
_STUDY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that reproduces a run: ``python benchmarks/<script> <argv>`` (argv: ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *args])


def machine() -> dict[str, Any]:
    """CPUs, memory, platform, the Python / JAX versions and the 1-minute load average of this
    machine (timings on a shared machine read with the load)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count()
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        ram = None
    try:
        from importlib.metadata import version

        jax_version: str | None = version("jax")
    except Exception:  # noqa: BLE001 - jax not installed: record its absence
        jax_version = None
    try:
        load: float | None = round(os.getloadavg()[0], 1)
    except (OSError, AttributeError):
        load = None
    return {
        "nproc": cpus,
        "ram_gib": None if ram is None else round(ram, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax_version,
        "load_1m": load,
    }


def git_commit(root: Path = REPO) -> str | None:
    """``git rev-parse HEAD`` of ``root``, or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def publish(
    study: str,
    payload: Mapping[str, Any],
    table_md: str,
    command: str,
    *,
    files: Sequence[str] = (),
    root: Path = REPO,
    commit: str | None = None,
    date: str | None = None,
    machine_info: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``<study>.json``, the study's section of docs/results.md and its MANIFEST entry.

    Args:
        study: the study's stable name (letters, digits, ``_.+-``); the file is ``<study>.json``.
        payload: the benchmark's JSON result (written as is; NaN becomes null).
        table_md: the markdown the benchmark printed (one or more tables).
        command: the command line that reproduces it (see :func:`command_line`).
        files: further files under ``benchmarks/published/`` that belong to the study
            (e.g. the per-run JSONL a summary was made from), recorded in the manifest.
        root: the repository root (tests point it at a copy).
        commit, date, machine_info: override what is recorded (default: ``git rev-parse
            HEAD``, today in UTC, :func:`machine`).

    Returns:
        The path of ``<study>.json``.
    """
    if not _STUDY.match(study):
        raise ValueError(f"study name {study!r}: letters, digits and _.+- only")
    pub = root / PUBLISHED
    pub.mkdir(parents=True, exist_ok=True)
    out = pub / f"{study}.json"
    _write(out, json.dumps(_finite(payload), indent=1, default=_json_default) + "\n")
    entry = {
        "script": _script_of(command),
        "command": command,
        "commit": commit if commit is not None else git_commit(root),
        "date": date or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "machine": dict(machine_info) if machine_info is not None else machine(),
        "files": [out.name, *[Path(f).name for f in files]],
    }
    manifest = read_manifest(root)
    manifest["studies"][study] = entry
    manifest["studies"] = dict(sorted(manifest["studies"].items()))
    _write(pub / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    update_section(root / RESULTS_MD, study, section_text(study, entry, table_md))
    return out


def read_manifest(root: Path = REPO) -> dict[str, Any]:
    """``benchmarks/published/MANIFEST.json`` as ``{"studies": {name: entry}}`` (empty when absent)."""
    path = root / PUBLISHED / MANIFEST
    if not path.exists():
        return {"studies": {}}
    data = json.loads(path.read_text())
    data.setdefault("studies", {})
    return data


def section_text(study: str, entry: Mapping[str, Any], table_md: str) -> str:
    """The body of a study's section: command, table, and where the data lives."""
    m = entry.get("machine") or {}
    where = ", ".join(
        s
        for s in (
            f"{m['nproc']} CPUs" if m.get("nproc") else "",
            f"{m['ram_gib']} GiB" if m.get("ram_gib") else "",
            m.get("platform") or "",
            f"Python {m['python']}" if m.get("python") else "",
            f"JAX {m['jax']}" if m.get("jax") else "",
            f"load average {m['load_1m']}" if m.get("load_1m") is not None else "",
        )
        if s
    )
    commit = (entry.get("commit") or "")[:10] or "unknown"
    files = " · ".join(f"[`{f}`](../benchmarks/published/{f})" for f in entry.get("files", []))
    return (
        f"```bash\n{entry['command']}\n```\n\n{table_md.strip()}\n\n"
        f"Data: {files}. Commit `{commit}`, {entry.get('date', '')}"
        + (f"; {where}" if where else "; machine not recorded")
        + "."
    )


def update_section(path: Path, study: str, body: str) -> None:
    """Replace the text between ``<!-- study:NAME -->`` and ``<!-- /study:NAME -->`` in ``path``
    (append the marked section, under a heading, when the file lacks it)."""
    start, end = f"<!-- study:{study} -->", f"<!-- /study:{study} -->"
    text = path.read_text() if path.exists() else "# Results\n"
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + f"\n\n## {study}\n\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, text if text.endswith("\n") else text + "\n")


def rendered_sections(root: Path = REPO) -> dict[str, str]:
    """Every study's section body as its script renders it from the published JSON and manifest entry."""
    bench = str(root / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    out = {}
    for study, entry in read_manifest(root)["studies"].items():
        module = importlib.import_module(Path(entry["script"]).stem)
        payload = json.loads((root / PUBLISHED / f"{study}.json").read_text())
        out[study] = section_text(study, entry, module.published_table(payload))
    return out


def section_of(text: str, study: str) -> str | None:
    """The body of ``study``'s marked section in ``text`` (None when absent)."""
    start, end = f"<!-- study:{study} -->", f"<!-- /study:{study} -->"
    m = re.search(re.escape(start) + r"\n(.*?)\n" + re.escape(end), text, re.S)
    return None if m is None else m.group(1)


def render_all(root: Path = REPO) -> list[str]:
    """Rewrite every study's section of docs/results.md from its published JSON and manifest entry."""
    sections = rendered_sections(root)
    for study, body in sections.items():
        update_section(root / RESULTS_MD, study, body)
    return list(sections)


def add_publish_flag(parser: argparse.ArgumentParser, *, named: bool = False) -> None:
    """``--publish``: publish this run's figure (``named``: the flag takes the study name)."""
    help_ = "write benchmarks/published/<study>.json, its docs/results.md section and MANIFEST.json"
    if named:
        parser.add_argument("--publish", metavar="STUDY", default=None, help=help_)
    else:
        parser.add_argument("--publish", action="store_true", help=help_)


def _script_of(command: str) -> str | None:
    for tok in shlex.split(command):
        if tok.startswith("benchmarks/") and tok.endswith(".py"):
            return tok
    return None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _finite(o: Any) -> Any:
    """NaN and ±inf become None, so the file is valid JSON."""
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    if isinstance(o, Mapping):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_finite(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return _finite(o.item())
        if isinstance(o, np.ndarray):
            return _finite(o.tolist())
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--render",
        action="store_true",
        help="rewrite every docs/results.md section from benchmarks/published/ and MANIFEST.json",
    )
    args = ap.parse_args(argv)
    if args.render:
        for study in render_all():
            print(f"rendered {study}")
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
