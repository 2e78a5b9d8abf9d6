from pathlib import Path

import pytest

from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.priors import card_fields, list_cards, load_card


def test_shipped_cards_load():
    names = list_cards()
    assert {"generic", "dense-31b-fp8-h100", "dense-8b-bf16-h100"} <= set(names)
    for n in names:
        card = load_card(n)
        assert (card.knee_tp is None) != (card.knee_position is None)
        assert (card.capacity_per_gpu_at_knee is None) != (card.capacity_relative_to_offered is None)
    assert load_card("dense-31b-fp8-h100").knee_tp == 4.0
    assert load_card("generic").capacity_relative_to_offered == 1.0


def test_unknown_key_did_you_mean(tmp_path: Path):
    p = tmp_path / "c.toml"
    p.write_text("[knee]\nlogit_sdd = 0.3\n")
    with pytest.raises(InputError, match=r"c\.toml.*knee\.logit_sdd.*did you mean knee\.'logit_sd'"):
        load_card(p)
    p.write_text("[kne]\ntp = 4\n")
    with pytest.raises(InputError, match=r"unknown section \[kne\].*did you mean \[knee\]"):
        load_card(p)


def test_bad_values(tmp_path: Path):
    p = tmp_path / "c.toml"
    p.write_text("[knee]\ntp = 4\nposition = 0.5\n")
    with pytest.raises(InputError, match="either 'tp' or 'position'"):
        load_card(p)
    p.write_text("[noise]\nttft = -1\n")
    with pytest.raises(InputError, match="'noise.ttft' must be > 0"):
        load_card(p)
    p.write_text("[noise\n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_card(p)
    with pytest.raises(InputError, match="did you mean 'generic'"):
        load_card("generik")


def test_defaults_fill_missing(tmp_path: Path):
    p = tmp_path / "mine.toml"
    p.write_text("[knee]\ntp = 2\n")
    card = load_card(p)
    assert card.name == "mine" and card.knee_tp == 2.0 and card.noise_ttft == load_card("generic").noise_ttft
    assert ("knee.tp", 2.0) in card_fields(card)


def test_priors_cli(capsys):
    assert main(["priors", "list"]) == 0
    assert "dense-31b-fp8-h100" in capsys.readouterr().out
    assert main(["priors", "show", "dense-31b-fp8-h100"]) == 0
    out = capsys.readouterr().out
    assert "knee.tp" in out and "4.0" in out
    assert main(["priors", "show", "nope-card"]) == 2


def test_load_elasticity_keys(tmp_path: Path):
    """The tails' load elasticity: the mean may be negative, its scales may not;
    a misspelling is caught with a did-you-mean."""
    p = tmp_path / "c.toml"
    p.write_text("[ttft]\nload_elasticity_mean = -0.1\n[completion]\nload_elasticity_sd = 0.5\n")
    card = load_card(p)
    assert card.ttft_load_elasticity_mean == -0.1 and card.completion_load_elasticity_sd == 0.5
    p.write_text("[ttft]\nload_elasticity_sd = 0\n")
    with pytest.raises(InputError, match="'ttft.load_elasticity_sd' must be > 0"):
        load_card(p)
    p.write_text("[completion]\nload_elasticty_mean = 0.2\n")
    with pytest.raises(InputError, match=r"did you mean completion\.'load_elasticity_mean'"):
        load_card(p)


def test_roles_section_parses_fills_and_is_optional(tmp_path: Path):
    """[roles]: keyed priors of a catalogue's configurations; a given section's missing keys take
    the generic card's values, a card without the section has none."""
    from fleetsieve_bayes.model.priors import ROLE_DEFAULTS

    generic = load_card("generic")
    assert generic.has_roles
    for key, value in ROLE_DEFAULTS.items():
        assert getattr(generic, key.replace(".", "_", 1)) == value, key
    p = tmp_path / "c.toml"
    p.write_text("[roles]\nprefill_share_logit_mean = -0.8\nkv_cost_median = 0.02\n")
    card = load_card(p)
    assert card.has_roles and card.roles_prefill_share_logit_mean == -0.8 and card.roles_kv_cost_median == 0.02
    assert card.roles_decode_gain_log_sd == generic.roles_decode_gain_log_sd == 0.3
    assert ("roles.kv_cost_median", 0.02) in card_fields(card)
    p.write_text("[roles]\n")
    assert load_card(p).has_roles and load_card(p).roles_engine_coef_sd == 0.3
    p.write_text("[knee]\ntp = 2\n")
    none = load_card(p)
    assert not none.has_roles and none.roles_kv_cost_median is None and none.roles_engine_coef_sd is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[roles]\nprefill_share_logit_men = 0.0\n",
         r"c\.toml: unknown key 'roles\.prefill_share_logit_men' \(did you mean roles\.'prefill_share_logit_mean'\?\)"),
        ("[role]\nkv_cost_median = 0.1\n", r"c\.toml: unknown section \[role\] \(did you mean \[roles\]\?\)"),
        ("[roles]\nprefill_share_logit_sd = 0\n", r"c\.toml: 'roles\.prefill_share_logit_sd' must be > 0, got 0$"),
        ("[roles]\nkv_cost_log_sd = -1.0\n", r"c\.toml: 'roles\.kv_cost_log_sd' must be > 0, got -1\.0$"),
        ("[roles]\nkv_cost_median = 0\n", r"c\.toml: 'roles\.kv_cost_median' must be > 0, got 0$"),
        ("[roles]\nengine_coef_sd = \"wide\"\n", r"c\.toml: 'roles\.engine_coef_sd' must be a number, got 'wide'$"),
    ],
)
def test_roles_section_errors_are_one_line(tmp_path: Path, text: str, message: str):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        load_card(p)
    assert "\n" not in str(err.value)


def test_roles_means_may_be_negative(tmp_path: Path):
    p = tmp_path / "c.toml"
    p.write_text("[roles]\nprefill_share_logit_mean = -1.5\ndecode_gain_log_mean = -0.2\n")
    card = load_card(p)
    assert (card.roles_prefill_share_logit_mean, card.roles_decode_gain_log_mean) == (-1.5, -0.2)
