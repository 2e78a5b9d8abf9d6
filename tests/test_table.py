"""Measurement tables: validation names the row, CSV and Parquet round-trip."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import COLUMNS, gpu_seconds, read_table, write_table

HEADER = ",".join(COLUMNS)
ROW = "chat,4,C96,6.6,6.596,0.93,15.98,0.992,300"


def test_shipped_grid_is_the_reference_h100_grid_and_reads() -> None:
    # examples/h100_31b_fp8/grid.csv is the measured H100 grid (31B FP8) byte for byte.
    path = data_dir("examples") / "h100_31b_fp8" / "grid.csv"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "f0af001111d487e244f9d8a7c8b16e1bb381eec8c3fe82183e2f982bc94c4a21"
    )
    df = read_table(path)
    assert len(df) == 22
    assert df["tp"].dtype == np.int64
    assert df["calibration"].sum() == 4  # the code TP2 calibration cells
    assert gpu_seconds(df) == 30600.0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (ROW.replace("6.596", "abc"), "line 3, column 'throughput_rps': not a number"),
        (ROW.replace("6.596", "nan"), "line 3, column 'throughput_rps': value is NaN"),
        (ROW.replace("6.596", "-1"), "line 3, column 'throughput_rps': negative value"),
        (ROW.replace("0.992", "1.2"), "line 3, column 'success_rate': success rate 1.2 outside [0, 1]"),
        (ROW.replace("0.992", "-0.1"), "line 3, column 'success_rate': success rate -0.1 outside [0, 1]"),
        (ROW.replace("6.596", "66"), "line 3, column 'throughput_rps': throughput 66 req/s exceeds the offered 6.6 req/s"),
        (ROW.replace("6.596", "6.94"), "line 3, column 'throughput_rps': throughput 6.94 req/s exceeds the offered"),
        (ROW.replace("15.98", "1e39"), "line 3, column 'completion_p99_s': value 1e+39 is too large to represent"),
        (ROW.replace(",4,", ",2.5,"), "line 3, column 'tp': tensor-parallel degree must be a positive integer"),
        (ROW, "line 3: duplicate cell (workload=chat, tp=4, load=C96), first at line 2"),
    ],
)
def test_bad_rows_are_named(tmp_path: Path, row: str, message: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(f"{HEADER}\n{ROW}\n{row}\n")
    with pytest.raises(InputError) as err:
        read_table(p)
    assert str(p) in str(err.value) and message in str(err.value)


def test_throughput_up_to_five_percent_above_offered_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text(f"{HEADER}\n{ROW.replace('6.596', '6.93')}\n")  # 6.6 x 1.05: arrival noise
    assert read_table(p)["throughput_rps"][0] == 6.93


def test_parquet_rows_are_named_by_row_number(tmp_path: Path) -> None:
    df = read_table_text(f"{HEADER}\n{ROW}\n{ROW.replace('C96', 'C128').replace('6.596', '66')}\n", tmp_path)
    p = tmp_path / "t.parquet"
    df.to_parquet(p, index=False)
    with pytest.raises(InputError, match=r"t.parquet: row 1, column 'throughput_rps': throughput 66"):
        read_table(p)


def read_table_text(text: str, tmp_path: Path) -> pd.DataFrame:
    """The raw (unvalidated) frame of a CSV text."""
    p = tmp_path / "raw.csv"
    p.write_text(text)
    return pd.read_csv(p)


def test_missing_column_and_file(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("workload,tp,load\nchat,4,C96\n")
    with pytest.raises(InputError, match="missing column.*offered_rps"):
        read_table(p)
    with pytest.raises(InputError, match="not found"):
        read_table(tmp_path / "none.csv")
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(InputError, match="dir.csv: is a directory, not a measurement table"):
        read_table(tmp_path / "dir.csv")


def test_infinite_tail_allowed_for_failed_cells(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text(f"{HEADER},failure\nchat,8,C96,6.6,0,inf,inf,0,300,startup-oom\n")
    df = read_table(p)
    assert np.isinf(df["ttft_p99_s"][0]) and df["failure"][0] == "startup-oom"


finite = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["chat", "code", "rank"]),
            st.sampled_from([1, 2, 4, 8]),
            st.sampled_from(["C8", "C16", "C32"]),
            finite,
            finite,
            finite,
            finite,
            st.floats(0, 1),
            st.floats(1, 600),
        ),
        min_size=1,
        max_size=12,
        unique_by=lambda r: r[:3],
    ),
    suffix=st.sampled_from([".csv", ".parquet"]),
)
def test_round_trip(tmp_path_factory: pytest.TempPathFactory, rows: list[tuple], suffix: str) -> None:
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["throughput_rps"] = np.minimum(df["throughput_rps"], df["offered_rps"])  # served <= offered
    path = tmp_path_factory.mktemp("rt") / f"t{suffix}"
    write_table(df, path)
    back = read_table(path)
    pd.testing.assert_frame_equal(back[list(COLUMNS)], df.astype({"tp": np.int64}), check_dtype=False)


def test_empty_completion_is_unobserved_and_startup_s_is_optional(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"{HEADER},startup_s\n{ROW},61.5\n" + "code,4,C96,6.6,6.596,0.93,,0.992,300,\n")
    df = read_table(path)
    assert np.isnan(df["completion_p99_s"][1]) and df["completion_p99_s"][0] == 15.98
    assert df["startup_s"][0] == 61.5 and np.isnan(df["startup_s"][1])
    pq = tmp_path / "t.parquet"
    write_table(df, pq)
    back = read_table(pq)
    assert np.isnan(back["completion_p99_s"][1]) and back["startup_s"][0] == 61.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{HEADER}\n" + ROW.replace("6.596", ""), "column 'throughput_rps': not a number"),
        (f"{HEADER},startup_s\n{ROW},-1", "column 'startup_s': start-up seconds must be finite and >= 0"),
    ],
)
def test_only_completion_may_be_empty(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text + "\n")
    with pytest.raises(InputError, match=message):
        read_table(path)


def test_startup_gpu_seconds_leaves_out_failed_startups_and_missing_values() -> None:
    from fleetsieve_bayes.table import startup_gpu_seconds

    rows = [
        {"tp": 2, "startup_s": 60.0, "failure": ""},  # started a server: 120
        {"tp": 2, "startup_s": 0.0, "failure": ""},  # reused it
        {"tp": 4, "startup_s": 30.0, "failure": "startup-oom"},  # its wait is its duration_s
        {"tp": 8, "failure": ""},  # replayed: no start-up recorded
        {"tp": 1, "startup_s": float("nan"), "failure": ""},
        {"tp": 1, "startup_s": 5.0, "failure": "died-mid-run"},  # started, then died: 5
    ]
    assert startup_gpu_seconds(rows) == 125.0
