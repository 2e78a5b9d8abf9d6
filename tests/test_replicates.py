"""Repeated windows of a cell: the table's `replicate` column and the replay backend's windows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_campaign import GRID, write_tiny

from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.backends import make_backend, no_window_limit
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.journal import (
    JOURNAL_NAME,
    Cell,
    MeasurementRecord,
    open_journal,
    read_records,
)
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import (
    COLUMNS,
    METRICS,
    first_windows,
    read_table,
    replicates,
    validate_table,
    write_table,
)

HEADER = ",".join(COLUMNS) + ",replicate"


def _write(tmp_path: Path, lines: list[str], name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(HEADER + "\n" + "\n".join(lines) + "\n")
    return p


def _row(load: str = "C96", success: float = 0.99, rep: object = 0, tp: int = 4) -> str:
    return f"chat,{tp},{load},9.6,8.9,1.5,24.0,{success},300,{rep}"


def test_several_windows_of_a_cell_read_in_file_order(tmp_path: Path) -> None:
    p = _write(tmp_path, [_row(success=0.99, rep=1), _row("C64", rep=0), _row(success=0.943, rep=0),
                          _row(success=0.97, rep=2)])
    df = read_table(p)
    assert replicates(df).tolist() == [1, 0, 0, 2] and df["replicate"].dtype == np.int64
    first = first_windows(df)
    assert first["load"].tolist() == ["C64", "C96"] and first["success_rate"].tolist() == [0.99, 0.943]
    # The grid has each cell once, valued by its replicate-0 row.
    grid = grid_from_table(df, ("chat",))
    assert grid.n_cells == 2
    vals = values_from_table(grid, df)
    assert vals[grid.index()[("chat", 4, "C96")], METRICS.index("success_rate")] == 0.943


def test_table_without_the_column_is_replicate_zero_each(tmp_path: Path) -> None:
    p = tmp_path / "grid.csv"
    p.write_text(GRID)
    df = read_table(p)
    assert "replicate" not in df.columns and (replicates(df) == 0).all() and first_windows(df) is df


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_row(rep=0), _row(rep=2)],
         "line 3: replicate 2 of cell (workload=chat, tp=4, load=C96) but no replicate 1 "
         "(a cell's replicates are 0, 1, … without gaps; it has 0, 2)"),
        ([_row(rep=1)], "line 2: replicate 1 of cell (workload=chat, tp=4, load=C96) but no replicate 0"),
        ([_row(rep=0), _row("C64"), _row(rep=0)],
         "line 4: duplicate replicate 0 of cell (workload=chat, tp=4, load=C96), first at line 2"),
        ([_row(rep=-1)], "line 2, column 'replicate': expected an integer >= 0"),
        ([_row(rep=1.5)], "line 2, column 'replicate': expected an integer >= 0"),
        ([_row(rep="")], "line 2, column 'replicate': expected an integer >= 0"),
    ],
)
def test_bad_replicates_are_one_line_naming_file_line_and_cell(tmp_path: Path, lines: list[str],
                                                               message: str) -> None:
    p = _write(tmp_path, lines)
    with pytest.raises(InputError) as err:
        read_table(p)
    text = str(err.value)
    assert text.startswith(str(p)) and message in text and "\n" not in text


def test_parquet_gap_is_named_by_row(tmp_path: Path) -> None:
    df = pd.read_csv(_write(tmp_path, [_row(rep=0), _row(rep=0, tp=2), _row(rep=2)]))
    p = tmp_path / "t.parquet"
    df.to_parquet(p, index=False)
    with pytest.raises(InputError, match=r"t.parquet: row 2: replicate 2 of cell \(workload=chat, tp=4, load=C96\)"):
        read_table(p)


cells = st.tuples(st.sampled_from(["chat", "code"]), st.sampled_from([1, 2, 4]), st.sampled_from(["C8", "C16"]))
metric = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=30, deadline=None)
@given(
    windows=st.lists(st.tuples(cells, st.integers(1, 4)), min_size=1, max_size=6, unique_by=lambda w: w[0]),
    values=st.lists(st.tuples(metric, metric, metric, st.floats(0, 1)), min_size=24, max_size=24),
    order=st.randoms(use_true_random=False),
    suffix=st.sampled_from([".csv", ".parquet"]),
)
def test_round_trip_with_replicates(tmp_path_factory: pytest.TempPathFactory, windows, values, order,
                                    suffix: str) -> None:
    rows = []
    for (w, tp, load), k in windows:
        for rep in range(k):
            thr, ttft, comp, succ = values[len(rows)]
            rows.append((w, tp, load, 1e4, thr, ttft, comp, succ, 300.0, rep))
    order.shuffle(rows)  # replicates of a cell in any order
    df = pd.DataFrame(rows, columns=[*COLUMNS, "replicate"])
    path = tmp_path_factory.mktemp("rt") / f"t{suffix}"
    write_table(df, path)
    back = read_table(path)
    pd.testing.assert_frame_equal(back, df.astype({"tp": np.int64, "replicate": np.int64}), check_dtype=False)
    assert len(first_windows(back)) == len(windows)


def _reference_valid(keys: list[tuple[str, int, str]], reps: list[int]) -> bool:
    """Plain restatement of the rule: per cell, the replicates are exactly 0..k-1."""
    by: dict[tuple[str, int, str], list[int]] = {}
    for k, r in zip(keys, reps, strict=True):
        by.setdefault(k, []).append(r)
    return all(sorted(v) == list(range(len(v))) for v in by.values())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(cells, st.integers(0, 3)), min_size=1, max_size=10))
def test_validation_agrees_with_the_rule_stated_plainly(rows) -> None:
    keys = [r[0] for r in rows]
    reps = [r[1] for r in rows]
    df = pd.DataFrame(
        [(w, tp, load, 5.0, 1.0, 0.5, 1.0, 1.0, 300.0, rep) for (w, tp, load), rep in rows],
        columns=[*COLUMNS, "replicate"],
    )
    try:
        validate_table(df)
        ok = True
    except InputError as err:
        ok = False
        assert "replicate" in str(err) and "\n" not in str(err)
    assert ok == _reference_valid(keys, reps)


REPLICATED = GRID + "chat,4,C96,9.6,8.1,2.4,31.0,0.943,300\nchat,4,C96,9.6,8.8,1.7,25.0,0.985,300\n"


def _replay_backend(tmp_path: Path, table: str):
    path = write_tiny(tmp_path)
    lines = table.strip().splitlines()
    seen: dict[str, int] = {}
    out = [lines[0] + ",replicate"]
    for line in lines[1:]:
        key = ",".join(line.split(",")[:3])
        out.append(f"{line},{seen.get(key, 0)}")
        seen[key] = seen.get(key, 0) + 1
    (tmp_path / "grid.csv").write_text("\n".join(out) + "\n")
    return make_backend(load_campaign(path), tmp_path / "out")


def test_replay_gives_the_kth_row_for_the_kth_window_and_refuses_one_more(tmp_path: Path) -> None:
    backend = _replay_backend(tmp_path, REPLICATED)
    index = backend.grid.index()
    c96, c64 = index[("chat", 4, "C96")], index[("chat", 4, "C64")]
    assert backend.grid.n_cells == 10
    assert backend.windows_available(c96) == 3 and backend.windows_available(c64) == 1
    assert [backend.measure(c96, k)["success_rate"] for k in range(3)] == [0.992, 0.943, 0.985]
    assert backend.measure(c96)["success_rate"] == 0.992  # the first window by default
    with pytest.raises(InputError) as err:
        backend.measure(c64, 1)
    text = str(err.value)
    assert "\n" not in text and str(tmp_path / "grid.csv") in text
    assert "cell chat TP4@C64: window 2 (replicate 1)" in text and "holds 1 window(s)" in text


def test_a_backend_without_a_limit_says_none() -> None:
    assert no_window_limit(3) is None


def _record(replicate: int = 0) -> MeasurementRecord:
    row = {"workload": "chat", "tp": 4, "load": "C96", "offered_rps": 9.6, "throughput_rps": 8.1,
           "ttft_p99_s": 2.4, "completion_p99_s": 31.0, "success_rate": 0.943, "duration_s": 300.0}
    return MeasurementRecord(seq=replicate, round=1, phase="acquire", cell=Cell("chat", 4, "C96"), row=row,
                             gpu_seconds=1200.0, replicate=replicate)


def test_journal_keeps_every_window_with_its_replicate(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    for k in range(3):
        j.append(_record(k))
    j.close()
    back = open_journal(tmp_path)
    assert [m.replicate for m in back.measurements] == [0, 1, 2]
    assert [m.repeat for m in back.measurements] == [False, True, True]
    back.close()
    line = json.loads((tmp_path / JOURNAL_NAME).read_text().splitlines()[1])
    assert line["replicate"] == 1


def test_an_old_measurement_record_reads_as_replicate_zero(tmp_path: Path) -> None:
    raw = _record(0).to_json()
    del raw["replicate"]
    assert MeasurementRecord.from_json(raw).replicate == 0
    raw["replicate"] = -1
    (tmp_path / JOURNAL_NAME).write_text(json.dumps(raw) + "\n")
    with pytest.raises(InputError, match=r"line 1: measurement record: field 'replicate' must be an integer >= 0"):
        read_records(tmp_path / JOURNAL_NAME)


VLLM_RESULT = {
    "date": "20250101-000000", "backend": "vllm", "model_id": "m", "num_prompts": 100,
    "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None, "duration": 25.0,
    "completed": 98, "p99_ttft_ms": 850.0, "p99_e2el_ms": 12500.0, "workload": "chat", "tp": "4", "load": "C32",
}


def _result(tmp_path: Path, name: str, **changes: object) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({**VLLM_RESULT, **changes}))
    return p


def test_ingest_several_results_of_one_cell_gives_replicate_rows(tmp_path: Path, capsys) -> None:
    a = _result(tmp_path, "a.json")
    b = _result(tmp_path, "b.json", completed=93, p99_ttft_ms=1900.0)
    other = _result(tmp_path, "c.json", load="C16", request_rate=2.0, completed=50)
    out = tmp_path / "seed.csv"
    assert main(["ingest", str(other), str(a), "--out", str(out)]) == 0
    assert "replicate" not in read_table(out).columns  # one window per cell: the old shape
    assert main(["ingest", str(b), "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["replicate"] for r in printed] == [1]
    df = read_table(out)
    assert list(zip(df["load"], df["replicate"], df["success_rate"], strict=True)) == [
        ("C16", 0, 0.5), ("C32", 0, 0.98), ("C32", 1, 0.93)]
    # Two files for one cell in one command: windows in command-line order.
    both = tmp_path / "both.parquet"
    assert main(["ingest", str(b), str(a), "--out", str(both)]) == 0
    back = read_table(both)
    assert back["replicate"].tolist() == [0, 1] and back["success_rate"].tolist() == [0.93, 0.98]


def test_ingesting_the_same_result_twice_is_refused_and_nothing_is_lost(tmp_path: Path, capsys) -> None:
    a = _result(tmp_path, "a.json")
    out = tmp_path / "seed.csv"
    assert main(["ingest", str(a), "--out", str(out)]) == 0
    before = out.read_bytes()
    assert main(["ingest", str(a), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(a) in err and "duplicate cell (workload=chat, tp=4, load=C32)" in err
    assert f"already in {out}" in err and out.read_bytes() == before
    assert main(["ingest", str(a), str(a)]) == 2
    assert f"the same window as a result of {a}" in capsys.readouterr().err
