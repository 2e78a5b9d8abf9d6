"""Windows of a campaign read from its journal: numbering, repeats asked for, what may be repeated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.backends import no_window_limit
from fleetsieve_bayes.campaign.journal import Cell, MeasurementRecord, open_journal
from fleetsieve_bayes.campaign.windows import (
    check_window,
    next_replicate,
    repeatable,
    window_counts,
    window_observations,
    window_rows,
    windows_of,
)
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import validate_table

GRID = CellGrid(
    workloads=("chat",),
    workload_idx=np.zeros(3, dtype=np.int64),
    tp=np.array([4, 4, 8], dtype=np.int64),
    load=("C64", "C96", "C96"),
    offered_rps=np.array([6.4, 9.6, 9.6]),
    duration_s=np.full(3, 300.0),
)


def _rec(c: int, replicate: int, success: float = 0.99, failure: str = "", seq: int = 0) -> MeasurementRecord:
    w, tp, load = GRID.key(c)
    row = {"workload": w, "tp": tp, "load": load, "offered_rps": float(GRID.offered_rps[c]),
           "throughput_rps": 0.0 if failure else 6.0, "ttft_p99_s": float("inf") if failure else 1.0,
           "completion_p99_s": float("inf") if failure else 20.0, "success_rate": 0.0 if failure else success,
           "duration_s": 300.0, "failure": failure}
    return MeasurementRecord(seq=seq, round=0, phase="acquire", cell=Cell(w, tp, load), row=row,
                             gpu_seconds=300.0 * tp, replicate=replicate)


def test_windows_are_counted_and_listed_in_journal_order(tmp_path: Path) -> None:
    records = [_rec(1, 0, 0.99), _rec(0, 0), _rec(1, 1, 0.943), _rec(1, 1, 0.943), _rec(1, 2, 0.97)]
    assert window_counts(GRID, records).tolist() == [1, 3, 0]
    assert [next_replicate(GRID, records, c) for c in range(3)] == [1, 3, 0]
    obs = window_observations(GRID, records)
    assert obs.cell.tolist() == [1, 0, 1, 1] and obs.replicate.tolist() == [0, 0, 1, 2]
    assert obs.rows.shape == (4, 4) and obs.rows[:, 3].tolist() == [0.99, 0.99, 0.943, 0.97]
    rows = window_rows(records)  # the duplicate record (a re-run after a kill) once
    assert [(r["load"], r["replicate"]) for r in rows] == [("C96", 0), ("C64", 0), ("C96", 1), ("C96", 2)]
    validate_table(pd.DataFrame(rows))  # measurements.csv is a valid table with replicates
    # Through a real journal file: the same answer after reopening it.
    j = open_journal(tmp_path)
    for r in records:
        j.append(r)
    j.close()
    assert window_counts(GRID, open_journal(tmp_path).records).tolist() == [1, 3, 0]


def test_a_gap_in_the_journal_is_named() -> None:
    with pytest.raises(InputError, match=r"cell chat TP4@C96 has window replicate 2 but no replicate 1"):
        windows_of([_rec(1, 0), _rec(1, 2)])


def test_a_repeat_must_be_asked_for_and_a_first_window_is_not_one() -> None:
    records = [_rec(1, 0)]
    assert check_window(GRID, records, 0, repeat=False) == 0
    assert check_window(GRID, records, 1, repeat=True) == 1
    with pytest.raises(RuntimeError, match="already has 1 window"):
        check_window(GRID, records, 1, repeat=False)
    with pytest.raises(RuntimeError, match="has no window yet"):
        check_window(GRID, records, 0, repeat=True)


def test_what_may_be_repeated() -> None:
    records = [_rec(0, 0), _rec(1, 0), _rec(1, 1), _rec(2, 0, failure="startup-oom")]
    # No backend limit, cap 3: C64 and C96 (2 windows) may; the server that never started may not.
    assert repeatable(GRID, records, max_windows_per_cell=3, windows_available=no_window_limit).tolist() == [
        True, True, False]
    assert repeatable(GRID, records, max_windows_per_cell=2, windows_available=no_window_limit).tolist() == [
        True, False, False]
    # A replayed table with 1 row of C64 and 3 of C96.
    rows = {0: 1, 1: 3, 2: 1}
    assert repeatable(GRID, records, max_windows_per_cell=3, windows_available=rows.__getitem__).tolist() == [
        False, True, False]
    # An overload failure is evidence about the load: it may be repeated.
    over = [_rec(0, 0, failure="no-success")]
    assert repeatable(GRID, over, max_windows_per_cell=3, windows_available=no_window_limit).tolist() == [
        True, False, False]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=15))
def test_counts_agree_with_distinct_windows_recorded(steps) -> None:
    # A driver that measures the next window of a cell (sometimes journaling it twice, as a kill
    # between a measurement and the next step can) agrees with a plain count of distinct windows.
    records: list[MeasurementRecord] = []
    for c, twice in steps:
        k = next_replicate(GRID, records, c)
        records.append(_rec(c, k))
        if twice:
            records.append(_rec(c, k))
    distinct = {(tuple(r.cell), r.replicate) for r in records}
    want = [sum(1 for key, _ in distinct if key == GRID.key(c)) for c in range(3)]
    assert window_counts(GRID, records).tolist() == want
    assert len(window_rows(records)) == len(distinct) == len(window_observations(GRID, records).cell)


def test_a_round_choosing_a_repeat_says_so_and_older_rounds_read_as_not() -> None:
    from fleetsieve_bayes.campaign.journal import RoundRecord, Side

    side = Side(None, {"feasible": False})
    rec = RoundRecord(round=3, certificate="undecided", outcome="measure", reason="r", gap={"critical": 0.0},
                      conservative=side, optimistic=side, measured_cells=2, candidates=3, gpu_seconds=1.0,
                      chosen=Cell("chat", 4, "C96"), timings={}, repeat=True)
    raw = rec.to_json()
    assert raw["repeat"] is True and RoundRecord.from_json(raw) == rec
    plain = rec._replace(repeat=False).to_json()
    assert "repeat" not in plain and RoundRecord.from_json(plain).repeat is False
    with pytest.raises(InputError, match="field 'repeat' must be true or false"):
        RoundRecord.from_json({**raw, "repeat": 1})


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 5), min_size=3, max_size=3),
    limits=st.lists(st.one_of(st.none(), st.integers(1, 5)), min_size=3, max_size=3),
    failed=st.lists(st.booleans(), min_size=3, max_size=3),
    cap=st.integers(1, 5),
)
def test_repeatable_mask_agrees_with_the_rule_cell_by_cell(counts, limits, failed, cap) -> None:
    from fleetsieve_bayes.campaign.windows import repeatable_mask, window_limits

    got = repeatable_mask(np.array(counts), window_limits(limits.__getitem__, 3), np.array(failed), cap)
    want = [n >= 1 and n < cap and (lim is None or n < lim) and not f
            for n, lim, f in zip(counts, limits, failed, strict=True)]
    assert got.tolist() == want
