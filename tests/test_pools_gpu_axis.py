"""The GPU axis: roofline ratios between GPU types (model/gpu_axis.py), per TP and per cell."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import grid_from_table
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.derive import load_architecture, load_gpus, roofline
from fleetsieve_bayes.model.gpu_axis import cell_log_ratios, gpu_axis
from fleetsieve_bayes.table import read_table

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "pools"
GPUS = load_gpus()


def _axis(arch: str = "dense-31b", dtype: str = "fp8", names: tuple[str, ...] = tuple(GPUS)):
    return gpu_axis(load_architecture(arch), [GPUS[n] for n in names], "h100-sxm-80gb", dtype=dtype)


def test_ratios_are_the_roofline_rows() -> None:
    ax = _axis()
    ref = ax.row("H100-SXM-80GB")
    assert np.all(ax.log_capacity[ref] == 0) and np.all(ax.log_ttft[ref] == 0)
    arch = load_architecture("dense-31b")
    a100 = roofline(arch, GPUS["a100-80gb"], dtype="fp8", kv_dtype="bf16", workload=ax_workload(), tps=ax.tps)
    h100 = roofline(arch, GPUS["h100-sxm-80gb"], dtype="fp8", kv_dtype="bf16", workload=ax_workload(), tps=ax.tps)
    j = ax.tps.index(4)
    i = ax.row("a100-80gb")
    assert ax.log_capacity[i, j] == pytest.approx(np.log(a100[j].per_gpu_rps / h100[j].per_gpu_rps))
    assert ax.log_completion[i, j] == pytest.approx(np.log(a100[j].completion_s / h100[j].completion_s))


def ax_workload():
    from fleetsieve_bayes.model.derive import DEFAULT_WORKLOAD

    return DEFAULT_WORKLOAD


def test_more_bandwidth_same_flops_is_faster() -> None:
    """H200 vs H100: the same FLOP/s, 4.8 vs 3.35 TB/s and 141 vs 80 GB."""
    ax = _axis()
    i = ax.row("h200-141gb")
    assert np.all(ax.feasible[i])
    assert np.all(ax.log_capacity[i] > 0) and np.all(ax.log_capacity[i] < np.log(4.8 / 3.35) + 0.1)
    assert np.all(ax.log_completion[i] < 0)


def test_a_gpu_the_model_does_not_fit() -> None:
    """Llama 3.1 70B in BF16 (about 141 GB of weights) fits no 48 GB L40S at TP1 or TP2, but TP8."""
    ax = _axis("llama-3.1-70b", "bf16", ("h100-sxm-80gb", "l40s-48gb"))
    i = ax.row("l40s-48gb")
    arch = load_architecture("llama-3.1-70b")
    fits = {
        g: [r.feasible for r in roofline(arch, GPUS[g], dtype="bf16", kv_dtype="bf16", workload=ax_workload(), tps=ax.tps)]
        for g in ("h100-sxm-80gb", "l40s-48gb")
    }
    assert fits["l40s-48gb"][:2] == [False, False]
    # A ratio exists where the model fits both the GPU and the reference.
    assert ax.feasible[i].tolist() == [a and b for a, b in zip(fits["l40s-48gb"], fits["h100-sxm-80gb"], strict=True)]
    assert np.isneginf(ax.log_capacity[i, 0]) and np.isposinf(ax.log_ttft[i, 0])
    assert ax.feasible[i, -1] and np.isfinite(ax.log_capacity[i, -1])


def test_cell_log_ratios_follow_each_cells_pool_and_tp() -> None:
    ax = _axis()
    df = read_table(FIXTURE / "grid.csv")
    grid = grid_from_table(df, ("chat", "code"), pools=("h100-sxm-80gb", "a100-80gb"))
    r = cell_log_ratios(grid, ax)
    assert r.shape == (grid.n_cells, 3)
    for c in range(grid.n_cells):
        i, j = ax.row(grid.gpu_name(c)), ax.tps.index(int(grid.tp[c]))
        assert r[c].tolist() == [ax.log_capacity[i, j], ax.log_ttft[i, j], ax.log_completion[i, j]]
    on_h100 = grid.gpu == 0
    assert np.all(r[on_h100] == 0) and np.all(r[~on_h100, 0] < 0)
    plain = grid_from_table(read_table(FIXTURE.parent.parent.parent / "examples" / "h100_31b_fp8" / "grid.csv"), ("chat", "code"))
    assert np.all(cell_log_ratios(plain, ax) == 0)


def test_gpu_axis_bad_input() -> None:
    with pytest.raises(InputError, match="reference GPU 'h100-sxm-80gb' is not among a100-80gb"):
        gpu_axis(load_architecture("dense-31b"), [GPUS["a100-80gb"]], "h100-sxm-80gb", dtype="fp8")
    ax = _axis(names=("h100-sxm-80gb", "a100-80gb"))
    df = read_table(FIXTURE / "grid.csv")
    grid = grid_from_table(df, ("chat", "code"), pools=("h100-sxm-80gb", "a100-80gb"))
    with pytest.raises(InputError, match=r"GPU 'l40s-48gb' is not on the GPU axis"):
        cell_log_ratios(grid._replace(pools=("h100-sxm-80gb", "l40s-48gb")), ax)
    with pytest.raises(InputError, match=r"covers TP \[1, 2, 4, 8\], not TP \[16\]"):
        cell_log_ratios(grid._replace(tp=np.where(grid.tp == 8, 16, grid.tp)), ax)


# ----------------------------------------------------------------------------- [gpu_axis] in a card


def test_priors_derive_writes_one_card_covering_several_gpus(tmp_path: Path) -> None:
    from fleetsieve_bayes.cli import main
    from fleetsieve_bayes.model.gpu_axis import axis_from_card
    from fleetsieve_bayes.model.priors import load_card

    out = tmp_path / "card.toml"
    argv = ["priors", "derive", "--config", "llama-3.1-70b", "--gpu", "h100-sxm-80gb",
            "--also-gpus", "a100-80gb,l40s-48gb", "--dtype", "bf16", "--out", str(out)]
    assert main(argv) == 0
    card = load_card(out)
    assert card.gpu_axis_reference == "h100-sxm-80gb" and card.gpu_axis_gpus == ("h100-sxm-80gb", "a100-80gb", "l40s-48gb")
    got = axis_from_card(card)
    want = _axis("llama-3.1-70b", "bf16", ("h100-sxm-80gb", "a100-80gb", "l40s-48gb"))
    assert got.gpus == want.gpus and got.tps == want.tps
    assert got.feasible.tolist() == want.feasible.tolist()
    for name in ("log_capacity", "log_ttft", "log_completion"):
        a, b = getattr(got, name), getattr(want, name)
        assert np.array_equal(np.isinf(a), np.isinf(b))
        np.testing.assert_allclose(a[np.isfinite(a)], b[np.isfinite(b)], rtol=1e-3)
    # The card's own prior sections are those of the single-GPU derivation.
    plain = tmp_path / "plain.toml"
    assert main([a for a in argv if a not in ("--also-gpus", "a100-80gb,l40s-48gb")][:-1] + [str(plain)]) == 0
    import tomllib

    with_axis, without = tomllib.loads(out.read_text()), tomllib.loads(plain.read_text())
    # ... but for the departures a mixed-GPU fit converges with (model/joint.py::tp_departure)
    assert with_axis["capacity"].pop("tp_departures") == "orthogonal" and "tp_departures" not in without["capacity"]
    assert with_axis.pop("gpu_axis") and with_axis == without


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('reference = "h100-sxm-80gb"\n', ""), "[gpu_axis] is missing 'gpu_axis.reference'"),
        (lambda t: t.replace("tp = [1, 2, 4, 8]\nlog_capacity", "tp = [1, 2, 8, 4]\nlog_capacity"), "strictly increasing"),
        (lambda t: t.replace("tp = [1, 2, 4, 8]\nlog_capacity", "tp = [1, 2, 4]\nlog_capacity"), "must have 3 rows (gpu_axis.gpus) of 3 values"),
        (lambda t: t.replace("[gpu_axis]\n", "[gpu_axis]\nratio = 1.0\n"), "unknown key 'gpu_axis.ratio'"),
        (lambda t: t.replace('reference = "h100-sxm-80gb"', 'reference = "h200-141gb"'), "'h200-141gb' is not in 'gpu_axis.gpus'"),
    ],
)
def test_gpu_axis_card_schema_errors(tmp_path: Path, edit, message: str) -> None:
    from fleetsieve_bayes.cli import main
    from fleetsieve_bayes.model.priors import load_card

    out = tmp_path / "card.toml"
    assert main(["priors", "derive", "--config", "dense-31b", "--gpu", "h100-sxm-80gb",
                 "--also-gpus", "a100-80gb,l40s-48gb", "--dtype", "fp8", "--out", str(out)]) == 0
    out.write_text(edit(out.read_text()))
    with pytest.raises(InputError) as err:
        load_card(out)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_also_gpus_bad_input(tmp_path: Path, capsys) -> None:
    from fleetsieve_bayes.cli import main

    base = ["priors", "derive", "--config", "dense-31b", "--gpu", "h100-sxm-80gb", "--dtype", "fp8",
            "--out", str(tmp_path / "c.toml")]
    assert main([*base, "--also-gpus", "a100-80gb,h100-sxm-80gb"]) == 2
    assert "--also-gpus: 'a100-80gb,h100-sxm-80gb' repeats a GPU" in capsys.readouterr().err
    assert main([*base, "--also-gpus", "a1000"]) == 2
    assert "unknown GPU 'a1000'" in capsys.readouterr().err
