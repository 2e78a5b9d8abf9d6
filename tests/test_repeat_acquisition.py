"""The fleetsieve strategy asks for repeats by itself, through both drivers.

The tiny replay campaign (10 cells, SVI) at ``slo_attainment = 0.9`` with
three windows of every cell in its table (TTFT and completion scattered
log-normally). Once the unmeasured cells are spent, the gap lies in
committed cells whose attainment straddles 0.9: the campaign measures them
again, journals those rounds as repeats, never takes more than
``max_windows_per_cell`` windows of a cell nor more than the table holds, and
a resume from the middle makes the same decisions.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tiny_campaign import GRID, write_tiny

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.hooks import RunHooks
from fleetsieve_bayes.campaign.journal import RoundRecord, read_records
from fleetsieve_bayes.campaign.runner import run_campaign

pytestmark = pytest.mark.slow


class _Stop(Exception):
    pass


def _noisy_tiny(folder: Path, *, cap: int = 3, rows: int = 3, pool: bool = False) -> Path:
    path = write_tiny(folder, measurement_extra="pool_gpus = 8" if pool else "")
    lines = GRID.strip().splitlines()
    rng = np.random.default_rng(0)
    out = [lines[0] + ",replicate"]
    for line in lines[1:]:
        f = line.split(",")
        for r in range(rows):
            g = list(f)
            if r:
                g[5] = f"{float(f[5]) * np.exp(rng.normal(0, 0.15)):.3f}"
                g[6] = f"{float(f[6]) * np.exp(rng.normal(0, 0.1)):.2f}"
            out.append(",".join(g) + f",{r}")
    (folder / "grid.csv").write_text("\n".join(out) + "\n")
    text = path.read_text().replace(
        'slo_attainment = "point"', f"slo_attainment = 0.9\nmax_windows_per_cell = {cap}"
    )
    assert "slo_attainment = 0.9" in text
    path.write_text(text)
    return path


def _windows(out: Path) -> list[tuple[str, int]]:
    records, _ = read_records(out / "journal.jsonl")
    return [(r.cell.label, r.replicate) for r in records if hasattr(r, "replicate")]


def _repeat_rounds(out: Path) -> list[str]:
    records, _ = read_records(out / "journal.jsonl")
    return [r.chosen.label for r in records if isinstance(r, RoundRecord) and r.repeat]


def test_the_sequential_campaign_repeats_committed_cells_within_the_cap_and_resumes(tmp_path: Path) -> None:
    path = _noisy_tiny(tmp_path / "c")
    out = tmp_path / "run"
    result = run_campaign(load_campaign(path), out).result
    windows = _windows(out)
    repeats = _repeat_rounds(out)
    assert repeats, "no repeat was chosen"
    per_cell = Counter(label for label, _ in windows)
    assert max(per_cell.values()) <= 3
    # every repeat round measured exactly the next window of its cell
    for label in set(repeats):
        assert sorted(r for lab, r in windows if lab == label) == list(range(per_cell[label]))
    assert len(result["measured"]) == len(windows)
    # A resume after the first repeat's round record makes the same decisions.
    stop_at = next(k for k, r in enumerate(read_records(out / "journal.jsonl")[0], 1)
                   if isinstance(r, RoundRecord) and r.repeat)
    again = tmp_path / "again"

    def on_append(k: int) -> None:
        if k >= stop_at:
            raise _Stop

    with pytest.raises(_Stop):
        run_campaign(load_campaign(path), again, hooks=RunHooks(on_append=on_append))
    resumed = run_campaign(load_campaign(path), again).result
    assert _windows(again) == windows and resumed["status"] == result["status"]


@pytest.mark.parametrize(("cap", "rows"), [(1, 3), (3, 2)])
def test_no_cell_gets_more_windows_than_the_cap_or_the_table(tmp_path: Path, cap: int, rows: int) -> None:
    path = _noisy_tiny(tmp_path / "c", cap=cap, rows=rows)
    out = tmp_path / "run"
    result = run_campaign(load_campaign(path), out).result  # no error: a used-up cell is never chosen
    per_cell = Counter(label for label, _ in _windows(out))
    assert max(per_cell.values()) <= min(cap, rows)
    if cap == 1:
        assert not _repeat_rounds(out)
    if result.get("repeat"):
        assert result["repeat"]["windows"] <= min(cap, rows)
        assert result["repeat"]["limit"] == min(cap, rows)
        assert result["repeat"]["limited_by"] == ("backend" if rows < cap else "max_windows_per_cell")


def test_the_pool_driver_repeats_too(tmp_path: Path) -> None:
    path = _noisy_tiny(tmp_path / "c", pool=True)
    out = tmp_path / "run"
    run_campaign(load_campaign(path), out)
    windows = _windows(out)
    assert len(set(windows)) == len(windows)  # no (cell, replicate) twice
    assert max(Counter(label for label, _ in windows).values()) <= 3
    assert any(r > 0 for _, r in windows)
