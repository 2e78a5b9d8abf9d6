"""The journal survives a kill mid-write; the lock excludes a second run."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from fleetsieve_bayes.campaign.journal import (
    Cell,
    Header,
    MeasurementRecord,
    RoundRecord,
    Side,
    campaign_lock,
    open_journal,
    plan_seconds,
    read_journal,
    read_records,
    rounds_of,
    unique_rounds,
)
from fleetsieve_bayes.errors import InputError

_HEADER = Header(campaign="c", strategy="fleetsieve", seed=0, cells=(Cell("chat", 2, "C16"),))


def _meas(seq: int, tp: int = 2) -> MeasurementRecord:
    row = {"workload": "chat", "tp": tp, "load": "C16", "offered_rps": 1.0, "throughput_rps": 0.9,
           "ttft_p99_s": float("inf"), "completion_p99_s": 3.0, "success_rate": 0.5, "duration_s": 10.0}
    return MeasurementRecord(seq=seq, round=0, phase="design", cell=Cell("chat", tp, "C16"), row=row, gpu_seconds=20.0)


def _round(no: int, chosen: Cell | None = None) -> RoundRecord:
    side = Side({"chat": {"tp": 2, "load": "C16", "replicas": 3}}, {"feasible": True, "min_fulfillment": 1.0})
    return RoundRecord(
        round=no, certificate="undecided", outcome="measure" if chosen else "exhausted", reason="r",
        gap={"critical": 0.0, "min_fulfillment": 0.1, "goodput": 0.2}, conservative=side,
        optimistic=Side(None, {"feasible": False}), measured_cells=1, candidates=1, gpu_seconds=20.0,
        chosen=chosen, timings={"fit_s": 1.0}, final=None if chosen else side,
    )


def test_append_and_reopen(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append(_HEADER)
    j.append(_meas(0))
    j.append(_round(1, Cell("chat", 2, "C16")))
    j.append(_round(2))
    j.close()
    j2 = open_journal(tmp_path)
    assert j2.records == [_HEADER, _meas(0), _round(1, Cell("chat", 2, "C16")), _round(2)]
    assert j2.header == _HEADER and j2.measurements == [_meas(0)] and len(j2.rounds) == 2
    assert j2.measurements[0].row["ttft_p99_s"] == float("inf")  # a failed tail survives the trip
    j2.close()


def test_partial_last_line_is_truncated(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append(_HEADER)
    j.append(_meas(0))
    j.close()
    path = tmp_path / "journal.jsonl"
    good = path.read_bytes()
    # A kill during a write leaves an unfinished line.
    path.write_bytes(good + b'{"type": "measurement", "se')
    records, nbytes = read_journal(path)
    assert len(records) == 2 and nbytes == len(good)
    j = open_journal(tmp_path)
    assert path.read_bytes() == good
    j.append(_meas(1, tp=4))
    j.close()
    assert [json.loads(x)["seq"] for x in path.read_text().splitlines()[1:]] == [0, 1]


@pytest.mark.parametrize(
    ("drop", "named"),
    [(("cell", "tp"), "cell.tp"), (("row", "throughput_rps"), "row.throughput_rps"), (("gpu_seconds",), "gpu_seconds")],
)
def test_a_record_lacking_a_field_is_named_with_its_line(tmp_path: Path, drop: tuple[str, ...], named: str) -> None:
    raw = _meas(0).to_json()
    target = raw
    for k in drop[:-1]:
        target = target[k]
    del target[drop[-1]]
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps(_HEADER.to_json()) + "\n" + json.dumps(raw) + "\n")
    with pytest.raises(InputError, match=rf"journal.jsonl: line 2: measurement record: field '{named}' is missing"):
        read_records(path)


def test_a_round_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    raw = _round(1).to_json()
    raw["conservative"]["allocation"] = 5
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps(_HEADER.to_json()) + "\n" + json.dumps(raw) + "\n")
    with pytest.raises(InputError, match=r"line 2: round record: field 'conservative.allocation' must be an object"):
        read_records(path)


def test_repeated_round_counts_once() -> None:
    a, b = _round(1, Cell("chat", 2, "C16")), _round(1, Cell("chat", 4, "C16"))
    assert unique_rounds([a, b, _round(2)]) == [b, _round(2)]
    assert rounds_of([a.to_json(), _HEADER]) == [a]


def test_planning_time_is_each_rounds_timings_summed_once(tmp_path: Path) -> None:
    j = open_journal(tmp_path)
    j.append(_HEADER)
    j.append(_round(1, Cell("chat", 2, "C16"))._replace(timings={"fit_s": 4.0, "acquire_s": 1.5}))
    j.append(_round(1, Cell("chat", 2, "C16"))._replace(timings={"fit_s": 2.0, "certify_s": 30.0}))  # re-run: last wins
    j.append(_meas(0))
    j.append(_round(2)._replace(timings={}))
    j.close()
    assert plan_seconds(tmp_path / "journal.jsonl") == [32.0, 0.0]


def test_corrupt_middle_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"type": "header"}\nGARBAGE\n{"type": "round"}\n')
    with pytest.raises(InputError, match=r"journal.jsonl: line 2: corrupt journal record"):
        read_journal(path)


def _hold_lock(directory: str, ready: mp.Event, release: mp.Event) -> None:  # type: ignore[valid-type]
    with campaign_lock(Path(directory)):
        ready.set()
        release.wait(10)


def test_lock_excludes_a_second_run(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    proc.start()
    try:
        assert ready.wait(30)
        with pytest.raises(InputError, match="another fleetsieve-bayes run holds"), campaign_lock(tmp_path):
            pass
    finally:
        release.set()
        proc.join(10)
    with campaign_lock(tmp_path):  # released once the holder is gone
        pass


def test_lock_released_by_kill(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    proc.start()
    assert ready.wait(30)
    proc.kill()
    proc.join(10)
    with campaign_lock(tmp_path):
        pass
