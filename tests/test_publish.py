"""benchmarks/publish.py: a benchmark's figure lands in its JSON, its marked section of
docs/results.md and MANIFEST.json, replacing the previous figure and nothing else."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _publish_module():
    spec = importlib.util.spec_from_file_location("publish", REPO / "benchmarks" / "publish.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


pub = _publish_module()


def _root(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(
        "# Results\n\nintro\n\n## A\n\n<!-- study:a -->\nold figure\n<!-- /study:a -->\n\nafter\n"
    )
    return tmp_path


def _publish(root: Path, study: str, table: str, command: str, payload: dict | None = None) -> Path:
    return pub.publish(
        study, payload or {"x": 1}, table, command, root=root, commit="c0ffee", date="2026-01-02",
        machine_info={"nproc": 2, "ram_gib": 8.0, "platform": "Linux", "python": "3.11.9", "jax": "0.4"},
    )


def test_publish_replaces_the_marked_section_and_keeps_the_rest(tmp_path) -> None:
    root = _root(tmp_path)
    out = _publish(root, "a", "| t |\n|---|\n| 1 |", "python benchmarks/x.py --publish", {"v": math.nan})
    text = (root / "docs" / "results.md").read_text()
    assert "old figure" not in text
    assert text.startswith("# Results\n\nintro\n\n## A\n\n<!-- study:a -->\n```bash\npython benchmarks/x.py --publish\n```")
    assert text.endswith("<!-- /study:a -->\n\nafter\n")
    assert "| 1 |" in text and "Commit `c0ffee`, 2026-01-02; 2 CPUs, 8.0 GiB, Linux, Python 3.11.9, JAX 0.4." in text
    assert json.loads(out.read_text()) == {"v": None}  # NaN is written as null
    entry = json.loads((root / "benchmarks" / "published" / "MANIFEST.json").read_text())["studies"]["a"]
    assert entry == {
        "script": "benchmarks/x.py", "command": "python benchmarks/x.py --publish", "commit": "c0ffee",
        "date": "2026-01-02",
        "machine": {"nproc": 2, "ram_gib": 8.0, "platform": "Linux", "python": "3.11.9", "jax": "0.4"},
        "files": ["a.json"],
    }


def test_publishing_again_replaces_the_figure_once_and_a_new_study_is_appended(tmp_path) -> None:
    root = _root(tmp_path)
    _publish(root, "a", "first", "python benchmarks/x.py")
    _publish(root, "a", "second", "python benchmarks/x.py --seed 1")
    _publish(root, "b.1x", "other", "python benchmarks/y.py")
    text = (root / "docs" / "results.md").read_text()
    assert text.count("<!-- study:a -->") == 1 and "first" not in text and "second" in text
    assert text.index("after") < text.index("## b.1x\n\n<!-- study:b.1x -->")
    studies = json.loads((root / "benchmarks" / "published" / "MANIFEST.json").read_text())["studies"]
    assert list(studies) == ["a", "b.1x"] and studies["a"]["command"] == "python benchmarks/x.py --seed 1"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "a b", ".hidden"])
def test_a_study_name_that_is_not_a_plain_file_name_is_refused(tmp_path, bad) -> None:
    with pytest.raises(ValueError, match="study name"):
        _publish(_root(tmp_path), bad, "t", "python benchmarks/x.py")


def test_command_line_quotes_what_the_shell_would_split() -> None:
    assert pub.command_line("/any/where/benchmarks/x.py", ["--fleets", "1,2", "--out", "a b.json"]) == (
        "python benchmarks/x.py --fleets 1,2 --out 'a b.json'"
    )


def test_machine_records_cpus_memory_versions_and_load() -> None:
    m = pub.machine()
    assert set(m) == {"nproc", "ram_gib", "platform", "python", "jax", "load_1m"}
    assert m["nproc"] >= 1 and m["python"].count(".") == 2


def test_every_results_section_is_what_its_benchmark_renders_from_the_published_json() -> None:
    """docs/results.md's figures are the benchmarks' own output: a hand edit fails here."""
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    for study, body in pub.rendered_sections(REPO).items():
        assert pub.section_of(text, study) == body.strip(), f"{study}: run python -m benchmarks.publish --render"
