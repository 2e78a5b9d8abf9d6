"""`priors derive` / `priors show`: the GPU table, architectures, the roofline, derived
cards (round trip, coverage of the shipped grids, knee placement), errors, and the
vLLM memory guard reading a card's per-TP feasibility."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.derive import (
    Workload,
    architecture_from_fields,
    derive,
    gpu_spec,
    load_architecture,
    load_gpus,
    render_card,
    roofline,
)
from fleetsieve_bayes.model.priors import load_card
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

EXAMPLES = data_dir("examples")
# The example cards' commands name the shipped architecture by its path in the source tree.
SOURCE_ROOT = data_dir("priors").parents[2]
H100 = "h100-sxm-80gb"
CHAT = Workload(1000, 250)


def test_gpu_table_holds_the_public_specs() -> None:
    gpus = load_gpus()
    assert {"h100-sxm-80gb", "h200-141gb", "a100-80gb", "l40s-48gb"} <= set(gpus)
    h100, h200, a100, l40s = (gpus[n] for n in ("h100-sxm-80gb", "h200-141gb", "a100-80gb", "l40s-48gb"))
    assert (h100.memory_gb, h100.hbm_bandwidth_tb_s, h100.fp8_dense_tflops, h100.nvlink_gb_s) == (80, 3.35, 1979, 900)
    assert (h200.memory_gb, h200.hbm_bandwidth_tb_s) == (141, 4.8)
    assert a100.fp8_dense_tflops is None and a100.peak_flops("fp8") == a100.peak_flops("bf16") == 312e12
    assert l40s.nvlink_gb_s is None and l40s.link_bytes_s() == l40s.pcie_gb_s * 1e9 / 2


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        ("llama-3.1-8b", 8.03, 8.03),
        ("llama-3.1-70b", 70.55, 70.55),
        ("mistral-nemo-12b", 12.25, 12.25),
        ("mixtral-8x7b", 46.70, 12.88),
        ("dense-31b", 32.76, 32.76),
    ],
)
def test_shipped_architectures_match_public_parameter_counts(name: str, total_b: float, active_b: float) -> None:
    arch = load_architecture(name)
    assert arch.params_total / 1e9 == pytest.approx(total_b, abs=0.01)
    assert arch.params_active / 1e9 == pytest.approx(active_b, abs=0.01)


def test_flags_with_a_parameter_count_match_the_config() -> None:
    """--parameters instead of --intermediate-size: the experts' share is what is
    left after attention and embeddings, so the active count comes out the same."""
    cfg = load_architecture("mixtral-8x7b")
    flags = architecture_from_fields(
        {"parameters": cfg.params_total / 1e9, "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
         "vocab": 32000, "experts": 8, "active_experts": 2},
        source="flags", name="mixtral",
    )
    assert flags.params_active == pytest.approx(cfg.params_active, rel=1e-9)
    assert flags.head_dim == 128


def test_moe_memory_uses_all_parameters_compute_the_active_ones() -> None:
    moe = load_architecture("mixtral-8x7b")
    dense_twin = moe._replace(experts=1, active_experts=1, params_total=moe.params_active)
    kw = dict(dtype="bf16", kv_dtype="bf16", workload=Workload(1000, 250), tps=[2, 4])
    r_moe, r_dense = roofline(moe, gpu_spec("h200-141gb"), **kw), roofline(dense_twin, gpu_spec("h200-141gb"), **kw)
    for a, b in zip(r_moe, r_dense, strict=True):
        assert a.weights_gb / b.weights_gb == pytest.approx(moe.params_total / moe.params_active, rel=0.01)
        assert a.prefill_s == pytest.approx(b.prefill_s, rel=1e-6)  # FLOPs: active parameters only


def _derived(arch: str, dtype: str, tps=(1, 2, 4, 8), gpu: str = H100, workload=CHAT):
    return derive(load_architecture(arch), gpu_spec(gpu), dtype=dtype, workload=workload, tps=tps)


def test_knee_placement_matches_the_hardware() -> None:
    big = _derived("llama-3.1-70b", "fp8")
    rows = {r.tp: r for r in big.rows}
    assert not rows[1].feasible and "KV cache" in rows[1].why  # 70 GB of FP8 weights on 80 GB
    assert all(rows[t].feasible for t in (2, 4, 8))
    assert max((r for r in big.rows if r.feasible), key=lambda r: r.per_gpu_rps).tp == 2  # peaks at a low TP
    assert big.sections["feasibility"]["infeasible_tp"] == [1]
    assert 1.0 < big.sections["knee"]["tp"] < 2.9
    small = _derived("llama-3.1-8b", "bf16")
    assert all(r.feasible for r in small.rows)
    assert max(small.rows, key=lambda r: r.per_gpu_rps).tp == 1  # an 8B model peaks at TP1
    assert small.sections["knee"]["tp"] < 1.45
    # More memory per GPU makes TP1 feasible for the 70B FP8 model.
    assert _derived("llama-3.1-70b", "fp8", gpu="h200-141gb").rows[0].feasible


def test_derived_card_round_trips(tmp_path: Path) -> None:
    d = _derived("mixtral-8x7b", "fp8", tps=(1, 2, 4, 8), gpu="l40s-48gb")
    path = tmp_path / "card.toml"
    path.write_text(render_card(d))
    card = load_card(path)
    for section, values in d.sections.items():
        for key, value in values.items():
            got = getattr(card, f"{section}_{key}")
            want = tuple(value) if isinstance(value, list) else value
            assert got == want, f"{section}.{key}: {got!r} != {want!r}"
    assert card.tp_feasible(1) is False and card.tp_feasible(4) is True and card.tp_feasible(16) is None
    # Rendering the same derivation again gives the same bytes (deterministic).
    assert render_card(d) == path.read_text()


@pytest.mark.parametrize(
    ("example", "table", "workloads"),
    [
        ("derived_31b_fp8", "h100_31b_fp8/grid.csv", ("chat", "code")),
        ("derived_8b_bf16", "h100_8b_bf16/grid_synthetic.csv", ("chat", "summarize")),
    ],
)
def test_derived_card_covers_the_shipped_grid(example: str, table: str, workloads) -> None:
    """The derived card's 90 % prior-predictive intervals of throughput contain the
    measured throughput of >= 85 % of the cells, and of >= 85 % of the saturated ones
    (the cells that measured a capacity)."""
    from fleetsieve_bayes.model.prior_check import throughput_coverage

    card = load_card(EXAMPLES / example / "card.toml")
    cov = throughput_coverage(card, read_table(EXAMPLES / table), workloads, n_draws=2000)
    assert cov["covered"].mean() >= 0.85
    sat = cov[cov["saturated"]]
    assert len(sat) >= 4 and sat["covered"].mean() >= 0.85
    # Not vacuous: the intervals are finite and the medians track the measured scale.
    ratio = np.exp(np.median(np.log(cov["median"] / cov["throughput_rps"])))
    assert 0.5 < ratio < 2.0


def test_shipped_derived_cards_are_current(tmp_path: Path) -> None:
    """The example cards are what the command in their first line writes today."""
    for example in ("derived_31b_fp8", "derived_8b_bf16"):
        shipped = EXAMPLES / example / "card.toml"
        first = shipped.read_text().splitlines()[0]
        argv = first.removeprefix("# fleetsieve-bayes ").split()
        out = tmp_path / f"{example}.toml"
        argv[argv.index("--out") + 1] = str(out)
        argv[argv.index("--config") + 1] = str(SOURCE_ROOT / argv[argv.index("--config") + 1])
        assert main(argv) == 0
        strip = lambda text: text.split("\n", 1)[1]  # noqa: E731 - the command line names the paths
        assert strip(out.read_text()).replace(str(SOURCE_ROOT) + "/", "") == strip(shipped.read_text())


def test_priors_derive_cli(tmp_path: Path, capsys) -> None:
    out = tmp_path / "c.toml"
    assert main(["priors", "derive", "--config", str(data_dir("priors") / "architectures" / "llama-3.1-70b.json"),
                 "--gpu", H100, "--dtype", "fp8", "--tp", "1,2,4,8", "--out", str(out)]) == 0
    assert "knee TP" in capsys.readouterr().out
    card = load_card(out)
    assert card.feasibility_infeasible_tp == (1,) and card.derivation_dtype == "fp8"
    assert card.derivation_architecture == "llama-3.1-70b" and card.derivation_tp == (1, 2, 4, 8)
    # Flags instead of a config (Llama-3.1-8B's public numbers).
    out2 = tmp_path / "f.toml"
    assert main(["priors", "derive", "--parameters", "8.03", "--layers", "32", "--hidden-size", "4096",
                 "--heads", "32", "--kv-heads", "8", "--vocab", "128256", "--gpu", H100, "--dtype", "bf16",
                 "--prompt-tokens", "1500", "--output-tokens", "300", "--out", str(out2)]) == 0
    assert load_card(out2).derivation_prompt_tokens == 1500.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "{cfg}", "--gpu", H100, "--dtype", "bf16"], "incomplete architecture: missing 'num_hidden_layers'"),
        (["--layers", "32", "--hidden-size", "4096", "--heads", "32", "--parameters", "8", "--gpu", H100,
          "--dtype", "bf16"], "incomplete architecture: missing --vocab"),
        (["--config", "llama-3.1-8b", "--gpu", "h100", "--dtype", "bf16"], "unknown GPU 'h100' (did you mean"),
        (["--config", "llama-3.1-8b", "--gpu", "tpu-v5", "--dtype", "bf16"], "known GPUs: a100-80gb, h100-sxm-80gb"),
        (["--config", "lama-3.1-8b", "--gpu", H100, "--dtype", "bf16"], "did you mean 'llama-3.1-8b'"),
        (["--config", "llama-3.1-70b", "--gpu", "l40s-48gb", "--dtype", "bf16", "--tp", "1"], "does not fit l40s-48gb"),
        (["--config", "llama-3.1-8b", "--layers", "3", "--gpu", H100, "--dtype", "bf16"], "not both"),
    ],
)
def test_priors_derive_errors_are_one_line(tmp_path: Path, capsys, argv, message) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000,
                               "intermediate_size": 11008}))
    argv = [a.replace("{cfg}", str(cfg)) for a in argv]
    assert main(["priors", "derive", *argv, "--out", str(tmp_path / "x.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    if "{cfg}" in " ".join(argv) or str(cfg) in argv:
        assert str(cfg) in err
    assert not (tmp_path / "x.toml").exists()


def test_priors_show_json_contract(capsys) -> None:
    card = str(EXAMPLES / "derived_31b_fp8" / "card.toml")
    assert main(["priors", "show", card, "--json", "--draws", "1000"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"knee_tp", "tp"} and set(out["knee_tp"]) == {"median", "lo", "hi"}
    assert list(out["tp"]) == ["2", "4", "8"]
    for row in out["tp"].values():
        assert set(row) == {"feasible", "capacity_per_gpu"} and row["feasible"] is True
        c = row["capacity_per_gpu"]
        assert set(c) == {"median", "lo", "hi"} and 0 < c["lo"] < c["median"] < c["hi"]
    k = out["knee_tp"]
    assert k["lo"] <= k["median"] <= k["hi"]
    # The prior median at the knee is the card's level (within Monte-Carlo error).
    level = load_card(card).capacity_per_gpu_at_knee
    assert max(r["capacity_per_gpu"]["median"] for r in out["tp"].values()) == pytest.approx(level, rel=0.25)


def test_priors_show_marks_infeasible_tps(tmp_path: Path, capsys) -> None:
    out = tmp_path / "c.toml"
    assert main(["priors", "derive", "--config", "llama-3.1-70b", "--gpu", H100, "--dtype", "fp8",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["priors", "show", str(out), "--json", "--draws", "500"]) == 0
    tp = json.loads(capsys.readouterr().out)["tp"]
    assert tp["1"] == {"feasible": False, "capacity_per_gpu": {"median": 0.0, "lo": 0.0, "hi": 0.0}}
    assert tp["2"]["feasible"] and tp["2"]["capacity_per_gpu"]["median"] > 0
    assert main(["priors", "show", str(out), "--draws", "500"]) == 0
    text = capsys.readouterr().out
    assert "TP1   infeasible" in text and "knee TP" in text and "feasibility.infeasible_tp" in text


def test_card_feasibility_schema_errors(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[feasibility]\nchecked_tp = [2, 4]\ninfeasible_tp = [1]\n")
    with pytest.raises(InputError, match=r"c\.toml: 'feasibility.infeasible_tp' lists TP \[1\] not in"):
        load_card(p)
    p.write_text("[feasibility]\ninfeasible_tp = [1.5]\n")
    with pytest.raises(InputError, match="list of positive integers"):
        load_card(p)
    p.write_text("[derivation]\ngpu_typ = 'x'\n")
    with pytest.raises(InputError, match=r"did you mean derivation\.'gpu'"):
        load_card(p)


def test_derived_example_campaign_resolves_its_card_next_to_it(monkeypatch, tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.config import load_campaign

    monkeypatch.chdir(tmp_path)  # the card path is relative to the campaign file, not the CWD
    campaign = load_campaign(EXAMPLES / "derived_31b_fp8" / "campaign.toml")
    assert Path(campaign.family).is_absolute()
    assert load_card(campaign.family).derivation_architecture == "dense-31b"


def test_vllm_memory_guard_reads_the_cards_feasibility(tmp_path: Path) -> None:
    """A TP the card marks infeasible is skipped at zero GPU-seconds; the others are
    measured (nothing is launched by a preflight)."""
    import pandas as pd
    from fake_vllm import fake_vllm_campaign

    from fleetsieve_bayes.backends import make_backend
    from fleetsieve_bayes.table import COLUMNS, validate_table
    from fleetsieve_bayes.testing import fake_server_command

    (tmp_path / "card.toml").write_text("[feasibility]\nchecked_tp = [1, 2]\ninfeasible_tp = [1]\n")
    campaign = fake_vllm_campaign(tmp_path, fake_server_command(), name="guard", family="card.toml", tp=(1, 2),
                                  loads="{ low = 1.0 }", warmup_s=0.1, duration_s=1.0, slo="{ success_min = 0.99 }")
    backend = make_backend(campaign, tmp_path / "out")
    g = backend.grid
    for c in range(g.n_cells):
        row = backend.preflight(c)
        if g.tp[c] == 1:
            assert row is not None and row["failure"] == "memory-guard" and row["duration_s"] == 0.0
            assert "marks TP1 infeasible" in row["detail"]
            validate_table(pd.DataFrame([{k: row[k] for k in (*COLUMNS, "failure")}]))
        else:
            assert row is None
    backend.close()
    assert not (tmp_path / "out").exists()


def test_derive_writes_the_roles_from_the_roofline() -> None:
    """[roles]: the prefill share's logit mean is the mean over feasible TPs of
    logit(prefill / (prefill + output x step / batch)); the KV cost the geometric mean of
    log(1 + a prompt's KV per GPU over the link / prefill); the rest the generic card's."""
    import math

    from fleetsieve_bayes.model.derive import ATTAINABLE, DTYPE_BYTES
    from fleetsieve_bayes.model.priors import ROLE_DEFAULTS

    d = _derived("llama-3.1-8b", "bf16", tps=(1, 2, 4, 8))
    roles = d.sections["roles"]
    arch, gpu = load_architecture("llama-3.1-8b"), gpu_spec(H100)
    ok = [r for r in d.rows if r.feasible]
    share = [r.prefill_s / (r.prefill_s + CHAT.output_tokens * r.step_s / r.batch) for r in ok]
    assert roles["prefill_share_logit_mean"] == pytest.approx(np.mean([math.log(s / (1 - s)) for s in share]), rel=5e-3)
    link = gpu.link_bytes_s() * ATTAINABLE["link_efficiency"]
    kv = [math.log1p(CHAT.prompt_tokens * 2 * arch.layers * max(1, arch.kv_heads / r.tp) * arch.head_dim
                     * DTYPE_BYTES["bf16"] / link / r.prefill_s) for r in ok]
    assert roles["kv_cost_median"] == pytest.approx(math.exp(np.mean(np.log(kv))), rel=5e-3)
    assert 0.001 < roles["kv_cost_median"] < 0.05  # an in-node transfer: about 1 % of a prefill
    for key in ("decode_gain_log_mean", "decode_gain_log_sd", "disagg_tail_sd", "engine_coef_sd"):
        assert roles[key] == ROLE_DEFAULTS[f"roles.{key}"]
    # a prompt-heavier request spends more of its time in prefill
    heavy = derive(arch, gpu, dtype="bf16", workload=Workload(4000, 100), tps=(1, 2, 4, 8))
    assert heavy.sections["roles"]["prefill_share_logit_mean"] > roles["prefill_share_logit_mean"] + 1.0
    assert list(d.sections)[-3:] == ["roles", "feasibility", "derivation"]


@pytest.mark.parametrize(("card", "example"), [("dense-31b-fp8-h100", "derived_31b_fp8"),
                                               ("dense-8b-bf16-h100", "derived_8b_bf16")])
def test_the_hand_written_cards_carry_the_derived_roles_of_their_model(card: str, example: str) -> None:
    derived = load_card(EXAMPLES / example / "card.toml")
    hand = load_card(card)
    assert hand.has_roles and derived.has_roles
    for key in [k for k in vars(hand) if k.startswith("roles_")]:
        assert getattr(hand, key) == getattr(derived, key), key
