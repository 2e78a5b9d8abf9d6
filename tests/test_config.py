"""Campaign validation: every bad input is one line naming the file and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.decision.intervals import MODEL_MARGIN
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.settings import DecisionSettings

GOOD = """
name = "t"
[fleet]
gpus = 16
[model]
family = "dense-31b-fp8-h100"
[measurement]
backend = "replay"
table = "grid.csv"
[stopping]
epsilon = 0.05
credible_level = 0.9
[[workloads]]
name = "chat"
demand_rps = 12.0
slo = { success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }
[[workloads]]
name = "code"
demand_rps = 16.0
critical = true
floor = 0.5
slo = { success_min = 0.99, ttft_p99_s = 5.0 }
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "grid.csv").write_text("workload,tp\n")
    p = tmp_path / "c.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_good_campaign_parses(tmp_path: Path) -> None:
    c = load_campaign(write(tmp_path, GOOD))
    assert c.gpus == 16 and c.family == "dense-31b-fp8-h100"
    assert c.workload_names == ("chat", "code")
    assert c.workloads[0].slo.completion_p99_s == 30.0
    assert c.workloads[1].slo.completion_p99_s is None
    assert c.workloads[1].critical and c.workloads[1].floor == 0.5
    assert c.measurement.table == (tmp_path / "grid.csv").resolve()
    assert c.scaled(1.3).workloads[0].demand_rps == pytest.approx(15.6)
    assert c.tail_margin == MODEL_MARGIN == 0.1
    assert c.knee_guard == 1


def test_tail_margin_is_read_and_reaches_the_fingerprint(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.fingerprint import campaign_inputs

    text = GOOD.replace('family = "dense-31b-fp8-h100"', 'family = "dense-31b-fp8-h100"\ntail_margin = 0.25')
    c = load_campaign(write(tmp_path, text))
    assert c.tail_margin == 0.25
    assert campaign_inputs(c)["model"]["tail_margin"] == 0.25


def test_uncertified_answer_is_read_and_reaches_the_fingerprint_only_when_set(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.fingerprint import campaign_inputs

    default = load_campaign(write(tmp_path, GOOD))
    assert default.uncertified_answer == "credible"
    assert "uncertified_answer" not in campaign_inputs(default)["stopping"]  # older directories resume
    p = load_campaign(write(tmp_path, GOOD.replace("epsilon = 0.05", "epsilon = 0.05\nuncertified_answer = 0.7")))
    assert p.uncertified_answer == 0.7 and campaign_inputs(p)["stopping"]["uncertified_answer"] == 0.7
    c = load_campaign(write(tmp_path, GOOD.replace("epsilon = 0.05", 'epsilon = 0.05\nuncertified_answer = "conservative"')))
    assert c.uncertified_answer == "conservative"
    assert campaign_inputs(c)["stopping"]["uncertified_answer"] == "conservative"
    assert DecisionSettings.from_campaign(c).uncertified_answer == "conservative"
    pr = load_campaign(write(tmp_path, GOOD.replace("epsilon = 0.05", 'epsilon = 0.05\nuncertified_answer = "probable"')))
    assert pr.uncertified_answer == "probable" and campaign_inputs(pr)["stopping"]["uncertified_answer"] == "probable"


def test_knee_guard_is_read_and_reaches_the_fingerprint(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.fingerprint import campaign_inputs

    text = GOOD.replace('family = "dense-31b-fp8-h100"', 'family = "dense-31b-fp8-h100"\nknee_guard = 0')
    c = load_campaign(write(tmp_path, text))
    assert c.knee_guard == 0
    assert campaign_inputs(c)["model"]["knee_guard"] == 0


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("gpus = 16", "gpu = 16", "[fleet]: unknown key 'gpu' (did you mean 'gpus'?)"),
        ("gpus = 16", 'gpus = "16"', "[fleet] gpus: expected an integer"),
        ("demand_rps = 12.0", "demand_rps = -1.0", "[[workloads]] 'chat' demand_rps: must be > 0"),
        ("floor = 0.5", "floor = 1.5", "[[workloads]] 'code' floor: must be <= 1"),
        ('table = "grid.csv"', 'table = "nope.csv"', "[measurement] table: file not found"),
        ('name = "code"', 'name = "chat"', "[[workloads]] 'chat' name: duplicate workload name"),
        ("epsilon = 0.05", "epsilon = 2", "[stopping] epsilon: must be <= 1"),
        ('family = "dense-31b-fp8-h100"', 'family = "dense-31b-fp8-h100"\ntail_margin = -0.1', "[model] tail_margin: must be >= 0"),
        ('family = "dense-31b-fp8-h100"', 'family = "dense-31b-fp8-h100"\ntail_margn = 0.1', "(did you mean 'tail_margin'?)"),
        ('family = "dense-31b-fp8-h100"', 'family = "dense-31b-fp8-h100"\nknee_guard = 1.5', "[model] knee_guard: expected an integer"),
        ('family = "dense-31b-fp8-h100"', 'family = "dense-31b-fp8-h100"\nknee_guard = -1', "[model] knee_guard: must be >= 0"),
        ("credible_level = 0.9", "credible_level = 1.0", "[stopping] credible_level: must be < 1"),
        ("epsilon = 0.05", 'epsilon = 0.05\nuncertified_answer = "best"',
         "[stopping] uncertified_answer: expected one of 'credible', 'best-estimate', 'probable', 'conservative' "
         "or a confidence in [0.5, 1), got 'best'"),
        ("epsilon = 0.05", "epsilon = 0.05\nuncertified_answer = 0.3", "[stopping] uncertified_answer: must be >= 0.5"),
        ("epsilon = 0.05", "epsilon = 0.05\nuncertified_answer = 1", "[stopping] uncertified_answer: must be < 1"),
        ("epsilon = 0.05", 'epsilon = 0.05\nuncertified_anwser = "conservative"', "(did you mean 'uncertified_answer'?)"),
        ("success_min = 0.99, ttft_p99_s = 2.0", "success_min = 0.99, ttft_p99 = 2.0", "unknown key 'ttft_p99'"),
        ("critical = true", 'critical = "yes"', "critical: expected true or false"),
        ('backend = "replay"', 'backend = "rep"', None),
    ],
)
def test_bad_campaign_names_file_and_field(tmp_path: Path, old: str, new: str, message: str | None) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    if message is None:  # unknown backend is caught when the backend is made
        from fleetsieve_bayes.backends import make_backend

        with pytest.raises(InputError, match="unknown backend 'rep'"):
            make_backend(load_campaign(path), tmp_path)
        return
    with pytest.raises(InputError) as err:
        if message.startswith("[measurement] table"):  # a backend's own key: checked when it is built
            from fleetsieve_bayes.backends import make_backend

            make_backend(load_campaign(path), tmp_path)
        else:
            load_campaign(path)
    text = str(err.value)
    assert str(path) in text
    assert message in text
    assert "\n" not in text


def test_missing_sections_and_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="campaign file not found"):
        load_campaign(tmp_path / "absent.toml")
    with pytest.raises(InputError, match=r"\[fleet\]: missing section"):
        load_campaign(write(tmp_path, GOOD.replace("[fleet]\ngpus = 16\n", "")))
    with pytest.raises(InputError, match="not valid TOML"):
        load_campaign(write(tmp_path, "name = = 1"))
    with pytest.raises(InputError, match="workloads"):
        load_campaign(write(tmp_path, GOOD.split("[[workloads]]")[0]))
