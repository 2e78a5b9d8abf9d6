"""Every hostile input of the resume/report/status paths ends with one line and exit 2 (bad
input) or 1 (environment), never a traceback, and leaves no stray file behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from tiny_campaign import write_tiny

from fleetsieve_bayes import cli
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.journal import Cell, Header, MeasurementRecord, RoundRecord, Side
from fleetsieve_bayes.resources import data_dir

CARD = data_dir("priors") / "dense-31b-fp8-h100.toml"


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fleetsieve-bayes {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _campaign_dir(d: Path, *, row_tp: object = 2, result: object = None) -> Path:
    """A small campaign directory as `run` leaves it (header, two measurements, one round)."""
    d.mkdir(parents=True, exist_ok=True)
    cells = (Cell("chat", 2, "C16"), Cell("chat", 4, "C16"))
    header = Header(
        campaign="hand", strategy="fleetsieve", seed=0, cells=cells, gpus=8, epsilon=0.05,
        workloads=({"name": "chat", "demand_rps": 1.0, "slo": {"success_min": 0.99, "ttft_p99_s": 2.0}},),
    )
    lines = [header.to_json()]
    for i, c in enumerate(cells):
        row = {"workload": c.workload, "tp": c.tp, "load": c.load, "offered_rps": 1.6, "throughput_rps": 1.5,
               "ttft_p99_s": float("inf") if i else 0.8, "completion_p99_s": 10.0, "success_rate": 0.999,
               "duration_s": 300.0}
        lines.append(MeasurementRecord(seq=i, round=0, phase="design", cell=c, row=row, gpu_seconds=600.0 * c.tp).to_json())
    side = Side({"chat": {"tp": 2, "load": "C16", "replicas": 1}}, {"feasible": True, "min_fulfillment": 1.0,
                                                                      "goodput_rps": 1.0, "gpus_used": 2})
    lines.append(RoundRecord(
        round=1, certificate="certified-feasible", outcome="certified-feasible", reason="ok",
        gap={"critical": 0.0, "min_fulfillment": 0.0, "goodput": float("inf")}, conservative=side,
        optimistic=side, measured_cells=2, candidates=2, gpu_seconds=3600.0, chosen=None, timings={"fit_s": 1.0},
        final=side,
    ).to_json())
    lines[1]["cell"]["tp"] = row_tp
    if row_tp is None:
        del lines[1]["cell"]["tp"]
    (d / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if result is not None:
        (d / "result.json").write_text(json.dumps(result))
    return d


# --- run --out --------------------------------------------------------------------


def test_out_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = write_tiny(tmp_path / "c")
    (tmp_path / "f").write_text("x")
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(tmp_path / "f"), "--quiet")
    assert rc == 2
    assert "is a file, not a campaign directory" in _one_line(err, "run")
    assert (tmp_path / "f").read_text() == "x"


def test_out_under_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = write_tiny(tmp_path / "c")
    (tmp_path / "f").write_text("x")
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(tmp_path / "f" / "sub"), "--quiet")
    assert rc == 2
    assert f"is under {tmp_path / 'f'}, which is a file" in _one_line(err, "run")


def test_out_on_a_read_only_file_system_is_an_environment_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign = write_tiny(tmp_path / "c")

    mount = tmp_path / "ro"
    real_mkdir = Path.mkdir

    def read_only(self: Path, *a: object, **k: object) -> None:
        # What a read-only mount at `mount` answers (root ignores chmod); every other
        # directory (ArviZ's cache on a first import, say) stays writable.
        if self == mount or mount in self.parents:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", read_only)
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(tmp_path / "ro" / "o"), "--quiet")
    assert rc == 1
    assert "cannot write the campaign directory (Read-only file system)" in _one_line(err, "run")


def test_config_error_leaves_no_lock_or_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = write_tiny(tmp_path / "c", family="dense-31b-fp8-h10")
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(tmp_path / "o"), "--quiet")
    assert rc == 2
    _one_line(err, "run")
    assert not (tmp_path / "o").exists()
    # A bad table found after the directory is locked: the lock goes too.
    bad = write_tiny(tmp_path / "d")
    (bad.parent / "grid.csv").write_text((bad.parent / "grid.csv").read_text().replace("1.596", "9.0"))
    (tmp_path / "o2").mkdir()
    rc, _, err = _main(capsys, "run", str(bad), "--out", str(tmp_path / "o2"), "--quiet")
    assert rc == 2
    assert "line 2, column 'throughput_rps'" in _one_line(err, "run")
    assert list((tmp_path / "o2").iterdir()) == []


# --- campaign files -------------------------------------------------------------


def test_relative_family_path_resolves_against_the_campaign_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "campaigns"
    (folder / "cards").mkdir(parents=True)
    shutil.copy(CARD, folder / "cards" / "mine.toml")
    campaign = write_tiny(folder, family="cards/mine.toml")
    monkeypatch.chdir(tmp_path)  # not the campaign's folder
    c = load_campaign(campaign)
    assert c.family == str(folder / "cards" / "mine.toml")
    from fleetsieve_bayes.model.priors import load_card

    assert load_card(c.family).path == str(folder / "cards" / "mine.toml")


@pytest.mark.parametrize(
    ("kw", "field", "says"),
    [
        ({"family": "no-such-card"}, "[model] family", "prior card 'no-such-card' not found"),
        ({"family": "cards/missing.toml"}, "[model] family", "prior card not found"),
        ({"model_extra": 'repeatability = 0.0\n'}, None, None),
        ({"model_extra": 'repeatability = 0.0\n'}, "[model] certify_inference",
         "the certifying fit needs a NUTS preset, "),
        ({"model_extra": 'repeatability = 0.0\n'}, "[model] certify_inference", "unknown key 'sample'"),
    ],
    ids=["family-name", "family-path", "preset", "certify-svi", "certify-typo"],
)
def test_family_and_preset_errors_name_the_campaign_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kw: dict, field: str | None, says: str | None
) -> None:
    campaign = write_tiny(tmp_path / "c", **kw)
    if field is None:  # the preset: break the tiny SVI preset instead
        (campaign.parent / "tiny-svi.toml").write_text('method = "svi"\n[svi]\nstepz = 5\n')
        field, says = "[model] inference", "unknown key 'stepz' (did you mean 'steps'?)"
    elif field == "[model] certify_inference":  # the certifying preset: not NUTS, or a typo
        certifying = campaign.parent / "tiny-certify.toml"
        certifying.write_text(
            (campaign.parent / "tiny-svi.toml").read_text() if "NUTS" in says
            else certifying.read_text().replace("samples =", "sample =")
        )
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(tmp_path / "o"), "--quiet")
    assert rc == 2
    line = _one_line(err, "run")
    assert f"{campaign}: {field}: " in line and says in line


def test_table_path_that_is_a_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    campaign = write_tiny(tmp_path / "c")
    (campaign.parent / "grid.csv").unlink()
    (campaign.parent / "grid.csv").mkdir()
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(tmp_path / "o"), "--quiet")
    assert rc == 2
    assert "[measurement] table: " in _one_line(err, "run") and "is a directory, not a table file" in err


# --- journal / result.json ---------------------------------------------------------


def test_journal_record_lacking_a_field_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _campaign_dir(tmp_path / "d", row_tp=None)
    for argv in (["status", str(d)], ["report", str(d)]):
        rc, _, err = _main(capsys, *argv)
        assert rc == 2
        assert "journal.jsonl: line 2: measurement record: field 'cell.tp' is missing" in _one_line(err, argv[0])
    d2 = _campaign_dir(tmp_path / "d2", row_tp="four")
    rc, _, err = _main(capsys, "status", str(d2))
    assert rc == 2 and "field 'cell.tp' must be an integer, got 'four'" in _one_line(err, "status")
    # `run` on such a directory stops the same way before doing anything.
    campaign = write_tiny(tmp_path / "c")
    rc, _, err = _main(capsys, "run", str(campaign), "--out", str(d), "--quiet")
    assert rc == 2 and "field 'cell.tp' is missing" in _one_line(err, "run")


@pytest.mark.parametrize(
    ("result", "says"),
    [
        ({"allocation": 5}, "field 'status' must be a string"),
        ({"status": "certified-feasible", "allocation": 5}, "field 'allocation' must be an object"),
        ({"status": "x", "allocation": {"chat": 3}}, "field 'allocation.chat' must be {tp, load, replicas}"),
        ([1, 2], "expected a JSON object, got list"),
    ],
)
def test_result_json_of_the_wrong_shape_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], result: object, says: str
) -> None:
    d = _campaign_dir(tmp_path / "d", result=result)
    for command in ("status", "report"):
        rc, _, err = _main(capsys, command, str(d))
        assert rc == 2
        assert says in _one_line(err, command)


def test_status_json_is_valid_json_even_with_infinite_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _campaign_dir(tmp_path / "d")
    rc, out, err = _main(capsys, "status", str(d), "--json")
    assert rc == 0 and err == ""
    assert "Infinity" not in out and "NaN" not in out
    s = json.loads(out)
    assert s["measured"][1]["row"]["ttft_p99_s"] is None  # a failed tail: unbounded, shown as null
    assert s["certificate"]["gap"]["goodput"] is None


# --- report ------------------------------------------------------------------------


def test_report_out_dir_writes_inside_it_and_leaves_nothing_stray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _campaign_dir(tmp_path / "d")
    (tmp_path / "reports").mkdir()
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    rc, out, err = _main(capsys, "report", str(d), "--out", str(tmp_path / "reports"))
    assert rc == 0, err
    assert (tmp_path / "reports" / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert list(work.iterdir()) == [] and sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["report.html"]
    # --out under a file: bad input.
    (tmp_path / "plain").write_text("x")
    rc, _, err = _main(capsys, "report", str(d), "--out", str(tmp_path / "plain" / "r.html"))
    assert rc == 2 and "is a file, not a directory" in _one_line(err, "report")


def test_report_into_a_read_only_directory_is_an_environment_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleetsieve_bayes.atomic as atomic

    d = _campaign_dir(tmp_path / "d")
    real_open = open

    def read_only(path: object, mode: str = "r", *a: object, **k: object) -> object:
        if "w" in mode:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, mode, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(atomic, "open", read_only, raising=False)
    rc, _, err = _main(capsys, "report", str(d))
    assert rc == 1
    assert "cannot write the report (Read-only file system)" in _one_line(err, "report")
    assert sorted(p.name for p in d.iterdir()) == ["journal.jsonl"]
