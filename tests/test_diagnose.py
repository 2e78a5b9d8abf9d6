import json

import numpy as np
import pytest

from fleetsieve_bayes.arviz_import import import_arviz
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.diagnostics import diagnose_file

az = import_arviz()


def _idata(seed=0, diverge=3):
    rng = np.random.default_rng(seed)
    div = np.zeros((2, 200), bool)
    div[0, :diverge] = True
    return az.from_dict(
        posterior={"a": rng.normal(size=(2, 200)), "v": rng.normal(size=(2, 200, 3)), "latent": rng.normal(size=(2, 200, 5, 4))},
        sample_stats={"diverging": div},
    )


def test_diagnose_json_and_text(tmp_path, capsys):
    _idata().to_netcdf(str(tmp_path / "posterior.nc"))
    out = diagnose_file(tmp_path / "posterior.nc")
    assert out["divergences"] == 3
    assert len(out["parameters"]) == 4  # a, v[0..2]; latent skipped
    assert 0.98 < out["r_hat_max"] < 1.05 and out["ess_bulk_min"] > 100
    assert main(["diagnose", str(tmp_path), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert {"r_hat_max", "ess_bulk_min", "divergences", "parameters"} <= set(js)
    assert main(["diagnose", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "v[2]" in text and "read as overload" not in text
    assert js["failed_under_load"] == []


def test_diagnose_lists_the_failed_runs_read_as_overload(tmp_path, capsys):
    rng = np.random.default_rng(0)
    idata = az.from_dict(
        posterior={"a": rng.normal(size=(2, 200)), "latent": rng.normal(size=(2, 200, 5, 4))},
        constant_data={"failed_under_load": np.array([False, False, True, False, True])},
        sample_stats={"diverging": np.zeros((2, 200), bool)},
    )
    idata.to_netcdf(str(tmp_path / "posterior.nc"))
    assert diagnose_file(tmp_path / "posterior.nc")["failed_under_load"] == [2, 4]
    assert main(["diagnose", str(tmp_path)]) == 0
    assert "failed runs read as overload (log sigmoid(8 log rho) each): cells 2, 4" in capsys.readouterr().out


def test_diagnose_missing_and_corrupt(tmp_path):
    with pytest.raises(InputError, match="posterior file not found"):
        diagnose_file(tmp_path / "posterior.nc")
    (tmp_path / "posterior.nc").write_bytes(b"not a netcdf file")
    with pytest.raises(InputError, match="cannot read posterior"):
        diagnose_file(tmp_path / "posterior.nc")
    assert main(["diagnose", str(tmp_path)]) == 2


def test_decision_diagnostics_leave_out_cells_measured_as_failures(tmp_path):
    # Cell 1 was measured as a start-up OOM (no metric observed): its latent
    # chains disagree, which the certificate does not read. Cell 0 is measured
    # and working, cell 2 unmeasured; both mix.
    rng = np.random.default_rng(1)
    latent = rng.normal(size=(4, 300, 3, 4))
    latent[:, :, 1, 0] += np.arange(4)[:, None]
    observed = np.full((3, 4), np.nan)
    observed[0] = [1.0, 0.5, 5.0, 0.99]
    idata = az.from_dict(
        posterior={"a": rng.normal(size=(4, 300)), "latent": latent, "noise": rng.normal(size=(4, 300, 4))},
        observed_data={"y": observed},
        constant_data={"measured": np.array([True, True, False])},
        sample_stats={"diverging": np.zeros((4, 300), bool)},
    )
    idata.to_netcdf(str(tmp_path / "posterior.nc"))
    out = diagnose_file(tmp_path / "posterior.nc")
    assert out["decision_r_hat_max"] < 1.01 and out["decision_ess_bulk_min"] > 400
    # Without the measured mask every cell counts, the failed one included.
    del idata.constant_data
    idata.to_netcdf(str(tmp_path / "all.nc"))
    assert diagnose_file(tmp_path / "all.nc")["decision_r_hat_max"] > 1.5
