import json

import arviz as az
import numpy as np
import pytest

from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.diagnostics import diagnose_file


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
    assert "v[2]" in capsys.readouterr().out


def test_diagnose_missing_and_corrupt(tmp_path):
    with pytest.raises(InputError, match="posterior file not found"):
        diagnose_file(tmp_path / "posterior.nc")
    (tmp_path / "posterior.nc").write_bytes(b"not a netcdf file")
    with pytest.raises(InputError, match="cannot read posterior"):
        diagnose_file(tmp_path / "posterior.nc")
    assert main(["diagnose", str(tmp_path)]) == 2
