"""The shipped H100 campaign for tests, at the package's default level or at ``"point"``.

At the default level (0.9) the shipped grid ends undecided: one row per cell, so code
TP4@C96, whose attainment posterior straddles 0.9, cannot be repeated, and no other
hope is left once code TP8@C128, chat TP4@C128 and chat TP8@C128 are measured. The metric rule
(``slo_attainment = "point"``) certifies the oracle fleet at 10,800 GPU-seconds; the
tests pinned to that decision use the variants below.
"""

from __future__ import annotations

from pathlib import Path

from fleetsieve_bayes.campaign.config import Campaign, load_campaign
from fleetsieve_bayes.resources import data_dir

SHIPPED = data_dir("examples") / "h100_31b_fp8" / "campaign.toml"
GRID = SHIPPED.parent / "grid.csv"
POINT_LINE = 'slo_attainment = "point"'


def point_text(text: str | None = None) -> str:
    """The shipped campaign's TOML (or ``text``) with ``[stopping] slo_attainment = "point"``."""
    text = SHIPPED.read_text() if text is None else text
    assert "[stopping]\n" in text and "slo_attainment" not in text
    return text.replace("[stopping]\n", f"[stopping]\n{POINT_LINE}\n", 1)


def point_file(tmp: Path, name: str = "campaign.toml") -> Path:
    """A copy of the shipped campaign at ``"point"`` in ``tmp``, its table by absolute path."""
    path = tmp / name
    path.write_text(point_text().replace('table = "grid.csv"', f'table = "{GRID}"'))
    return path


def load_point() -> Campaign:
    """The shipped campaign, deciding by the metric rule."""
    return load_campaign(SHIPPED).at_level("point")
