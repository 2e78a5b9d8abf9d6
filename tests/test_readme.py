"""The user documents: README's Python example is the shipped example, its CLI table is the CLI,
the README and benchmarks/published/ stay small, and no document narrates development history.

These read the repository's files (README.md, docs/, examples/, benchmarks/published/),
located from this test file, so they run against the installed wheel as well.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from fleetsieve_bayes.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PUBLISHED = REPO / "benchmarks" / "published"


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_readme_python_example_is_examples_python_api_byte_for_byte() -> None:
    blocks = _python_blocks(_readme())
    assert len(blocks) == 1, f"README has {len(blocks)} python blocks; the example is one"
    shipped = (REPO / "examples" / "python_api.py").read_bytes()
    assert blocks[0].encode("utf-8") == shipped


def test_python_block_extraction_finds_each_block_whole() -> None:
    text = "x\n```python\na = 1\n# ```not a fence\n```\n```bash\nb\n```\n```python\nc = 2\n```\n"
    assert _python_blocks(text) == ["a = 1\n# ```not a fence\n", "c = 2\n"]


def test_readme_is_at_most_400_lines() -> None:
    n = len(_readme().splitlines())
    assert n <= 400, f"README.md has {n} lines"


def test_published_keeps_at_most_35_files_plus_the_manifest() -> None:
    # 31 studies' files, the configuration worlds' two (docs/results.md, "Configurations") and
    # the ranked alternatives' two ("Ranked alternatives under a profiling budget").
    files = [p for p in PUBLISHED.rglob("*") if p.is_file() and p.name != "MANIFEST.json"]
    assert len(files) <= 35, sorted(p.name for p in files)
    assert not [p for p in PUBLISHED.iterdir() if p.is_dir()], "one flat folder, one file per study"


def test_manifest_names_every_published_file_and_each_study_has_its_results_section() -> None:
    manifest = json.loads((PUBLISHED / "MANIFEST.json").read_text())["studies"]
    listed = {f for e in manifest.values() for f in e["files"]}
    on_disk = {p.name for p in PUBLISHED.iterdir() if p.name != "MANIFEST.json"}
    assert listed == on_disk
    results = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    for study, entry in manifest.items():
        assert f"{study}.json" in entry["files"]
        assert {"script", "command", "commit", "date", "machine"} <= set(entry)
        assert (REPO / entry["script"]).is_file(), entry["script"]
        section = re.search(
            f"<!-- study:{re.escape(study)} -->\n(.*?)<!-- /study:{re.escape(study)} -->", results, re.S
        )
        assert section and entry["command"] in section.group(1), f"docs/results.md lacks {study}'s figure"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps sub-commands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _cli_table_rows(text: str) -> list[str]:
    section = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(fleetsieve-bayes [^`]*)`", section, re.M)


def test_every_command_and_flag_of_the_readme_cli_table_exists() -> None:
    rows = _cli_table_rows(_readme())
    commands = _subparsers(build_parser())
    assert len(rows) >= len(commands), "every command has a row"
    seen = set()
    for row in rows:
        words = row.split()[1:]
        assert words[0] in commands, f"README names `{words[0]}`, which the CLI lacks"
        seen.add(words[0])
        parser = commands[words[0]]
        nested = _subparsers(parser)
        if nested:
            assert words[1] in nested, f"README names `{words[0]} {words[1]}`, which the CLI lacks"
            parser = nested[words[1]]
        options = {s for a in parser._actions for s in a.option_strings}
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", row):
            assert flag in options, f"README's `{words[0]}` row names {flag}, which the CLI lacks"
    assert seen == set(commands), f"commands without a README row: {set(commands) - seen}"


HISTORY = re.compile(
    r"\bsession \d+|\bsession\d+|\bissue[ -]?\d+\b|\b(?:first|second|third) wave\b|\biteration \d+"
    r"|\btried (?:and|in)\b|\bnot kept\b|\bused to\b|\bpredates?\b",
    re.I,
)


@pytest.mark.parametrize(
    "path", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_documents_do_not_narrate_development_history(path: Path) -> None:
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not hits, "\n".join(hits)
