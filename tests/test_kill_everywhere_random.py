"""The exhaustive kill test of ``test_kill_everywhere.py`` with the random strategy (seed 1),
at every fourth journal append and inside every fourth measurement (the first and the
last append always): the random strategy journals the same kinds of records as the
``fleetsieve`` one, which is killed at every point.

A file of its own so that the slow stage's two workers, each running one
file at a time, run the two strategies' kills side by side.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_kill_everywhere import exhaustive_kill_points, tiny  # noqa: F401 (tiny: the module fixture)


@pytest.mark.slow
def test_exhaustive_every_kill_point_with_the_random_strategy(tiny: tuple[Path, dict, list[dict]],  # noqa: F811
                                                              tmp_path: Path) -> None:
    exhaustive_kill_points(tiny, tmp_path, "random", 1, every=4)
