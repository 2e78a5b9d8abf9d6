"""Repeats through the campaign drivers: journaled as replicates, resumed, never taken twice.

The tiny replay campaign's table holds two windows of chat TP4@C64 (a design
cell) and one of every other cell. A journal is stopped right after the
initial design, and a round that asks for a repeat is appended to it (written
as the fleetsieve strategy would, to place it exactly; tests/test_repeat_acquisition.py
has the strategy ask by itself); resuming runs the repeat.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_campaign import GRID, write_tiny

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.hooks import RunHooks
from fleetsieve_bayes.campaign.journal import Cell, RoundRecord, Side, open_journal, read_records
from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import read_table

C64 = Cell("chat", 4, "C64")
C64_AGAIN = {"throughput_rps": 6.1, "ttft_p99_s": 1.4, "completion_p99_s": 19.0, "success_rate": 0.981}
N_DESIGN = 4  # chat TP2@C16, chat TP4@C64, code TP2@C16, code TP4@C64


class _Stop(Exception):
    pass


def _stop_after(n: int) -> RunHooks:
    def on_append(k: int) -> None:
        if k >= n:
            raise _Stop

    return RunHooks(on_append=on_append)


def _folder(tmp_path: Path, extra: str = "") -> Path:
    path = write_tiny(tmp_path / "c", measurement_extra=extra)
    lines = GRID.strip().splitlines()
    again = "chat,4,C64,6.4,{throughput_rps},{ttft_p99_s},{completion_p99_s},{success_rate},300,1".format(**C64_AGAIN)
    rows = [lines[0] + ",replicate", *(f"{line},0" for line in lines[1:]), again]
    (path.parent / "grid.csv").write_text("\n".join(rows) + "\n")
    text = path.read_text().replace("epsilon = 0.05", "epsilon = 0.05\nmax_rounds = 1")
    path.write_text(text)
    return path


def _design_then_repeat(tmp_path: Path, cell: Cell, extra: str = "") -> tuple[Path, Path]:
    """A campaign directory holding the header, the design and a round asking to repeat ``cell``."""
    path = _folder(tmp_path, extra)
    out = tmp_path / "run"
    with pytest.raises(_Stop):
        run_campaign(load_campaign(path), out, hooks=_stop_after(1 + N_DESIGN))
    side = Side(None, {"feasible": False})
    j = open_journal(out)
    assert len(j.measurements) == N_DESIGN and not j.rounds
    j.append(RoundRecord(round=1, certificate="undecided", outcome="measure", reason="repeat", gap={},
                         conservative=side, optimistic=side, measured_cells=N_DESIGN, candidates=10,
                         gpu_seconds=sum(m.gpu_seconds for m in j.measurements), chosen=cell, timings={},
                         repeat=True))
    j.close()
    return path, out


def _windows(out: Path) -> list[tuple[str, int]]:
    records, _ = read_records(out / "journal.jsonl")
    return [(r.cell.label, r.replicate) for r in records if hasattr(r, "replicate")]


def test_a_journaled_repeat_is_measured_on_resume_once_and_listed_everywhere(tmp_path: Path) -> None:
    path, out = _design_then_repeat(tmp_path, C64)
    # The first resume stops inside the repeat's measurement: nothing of it is journaled.
    def broken(measure):
        def stop(*args, **kwargs):
            raise _Stop
        return stop

    with pytest.raises(_Stop):
        run_campaign(load_campaign(path), out, hooks=RunHooks(wrap_measure=broken))
    assert _windows(out) == [(f"{c}", 0) for c in ("chat TP2@C16", "chat TP4@C64", "code TP2@C16", "code TP4@C64")]
    result = run_campaign(load_campaign(path), out).result
    windows = _windows(out)
    assert windows[-1] == ("chat TP4@C64", 1) and windows.count(("chat TP4@C64", 1)) == 1
    records, _ = read_records(out / "journal.jsonl")
    rep = [r for r in records if hasattr(r, "replicate") and r.replicate == 1][0]
    assert rep.phase == "acquire" and rep.round == 1 and rep.repeat
    assert {k: rep.row[k] for k in C64_AGAIN} == C64_AGAIN  # the table's second window, not its first
    table = read_table(out / "measurements.csv")
    assert table["replicate"].tolist() == [0, 0, 0, 0, 1]
    assert result["measured"][-1] == {**C64.to_json(), "replicate": 1} and len(result["measured"]) == 5
    assert result["gpu_seconds"] == pytest.approx(float((table["duration_s"] * table["tp"]).sum()))
    # Resuming the finished campaign measures nothing again.
    again = run_campaign(load_campaign(path), out).result
    assert _windows(out) == windows and again["measured"] == result["measured"]


def test_a_repeat_past_the_tables_rows_is_one_error_and_loses_nothing(tmp_path: Path) -> None:
    path, out = _design_then_repeat(tmp_path, Cell("chat", 2, "C16"))  # one row only
    before = (out / "journal.jsonl").read_bytes()
    with pytest.raises(InputError) as err:
        run_campaign(load_campaign(path), out)
    text = str(err.value)
    assert "\n" not in text and "cell chat TP2@C16: window 2 (replicate 1)" in text and "holds 1 window(s)" in text
    assert (out / "journal.jsonl").read_bytes() == before


def test_the_pool_driver_resumes_a_repeat_in_flight(tmp_path: Path) -> None:
    path, out = _design_then_repeat(tmp_path, C64)
    # As the pool driver journals it: started (window 1), then killed before its measurement.
    j = open_journal(out)
    j.records  # noqa: B018 - the journal is read
    line = {"type": "started", "seq": N_DESIGN, "round": 1, "phase": "acquire", "cell": C64.to_json(),
            "gpus": [0, 1, 2, 3], "start_s": 1200.0, "started_at": 0.0, "replicate": 1}
    j.close()
    with open(out / "journal.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")
    path.write_text(path.read_text().replace('table = "grid.csv"', 'table = "grid.csv"\npool_gpus = 8'))
    result = run_campaign(load_campaign(path), out).result
    windows = _windows(out)
    assert windows.count(("chat TP4@C64", 1)) == 1 and ("chat TP4@C64", 2) not in windows
    assert {**C64.to_json(), "replicate": 1} in result["measured"]
