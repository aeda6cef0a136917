"""The demo at its default size (about 4 minutes): run by benchmarks and with `pytest -m slow`."""

import json

import pytest

from bnn_zoo.cli import main


@pytest.mark.slow
def test_full_demo_converges(tmp_path):
    assert main(["demo", "--out", str(tmp_path), "--quiet"]) == 0
    nuts = json.loads((tmp_path / "nuts" / "metrics.json").read_text())
    svi = json.loads((tmp_path / "svi" / "metrics.json").read_text())
    assert nuts["max_rhat"] < 1.05 and nuts["min_ess_bulk"] > 100 and nuts["divergences"] == 0
    # noise sd is 3 and the test set reaches past the training inputs: both fit far better than the
    # constant predictor (test sd of y is about 25) and NUTS at least as well as mean-field
    assert nuts["rmse"] < 12 and svi["rmse"] < 15 and nuts["test_log_likelihood"] > -5
    gp = json.loads((tmp_path / "gp" / "metrics.json").read_text())
    assert gp["rmse"] < 12 and gp["log_marginal_likelihood"] < 0  # the GP baseline sits in the same table
