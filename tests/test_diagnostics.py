"""bnn_zoo.evaluation.diagnostics: R-hat and bulk ESS of many quantities at once equal ArviZ's own,
quantity by quantity, on draws whose answers differ (independent, autocorrelated, shifted chains, ties,
one chain, anticorrelated), and their edge cases follow ArviZ's."""

import math

import numpy as np
import pytest
import torch
import xarray as xr

from bnn_zoo import arviz_compat
from bnn_zoo.evaluation import diagnostics


def _ar1(rng, chains, draws, points, phi):
    x = np.zeros((chains, draws, points))
    noise = rng.normal(size=x.shape)
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + noise[:, t]
    return x


def _cases():
    rng = np.random.default_rng(0)
    return {
        "independent": rng.normal(size=(4, 100, 30)),
        "autocorrelated": _ar1(rng, 4, 101, 30, 0.9),
        "nearly stuck": _ar1(rng, 3, 60, 30, 0.99),
        "chains apart": rng.normal(size=(4, 80, 30)) + np.arange(4)[:, None, None],
        "ties": np.round(rng.normal(size=(4, 100, 30)), 1),  # rejected proposals repeat draws
        "one chain": _ar1(rng, 1, 100, 20, 0.5),
        "anticorrelated": rng.normal(size=(4, 100, 20)) * (-1.0) ** np.arange(100)[None, :, None],
        "four draws": rng.normal(size=(4, 4, 20)),
        "seven draws": _ar1(rng, 2, 7, 20, 0.5),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_rhat_and_bulk_ess_equal_arviz(name):
    draws = _cases()[name]
    ds = xr.Dataset({"f": (("chain", "draw", "point"), draws)})
    ess = diagnostics.ess_bulk(torch.from_numpy(draws)).numpy()
    np.testing.assert_allclose(ess, arviz_compat.ess(ds)["f"].values, rtol=1e-10)
    rhat = diagnostics.rhat(torch.from_numpy(draws)).numpy()
    if draws.shape[0] == 1:
        assert np.isnan(rhat).all()  # split R-hat of one chain: ArviZ asks for two
    else:
        np.testing.assert_allclose(rhat, arviz_compat.rhat(ds)["f"].values, rtol=1e-10)
    assert rhat.shape == ess.shape == (draws.shape[2],)


def test_any_leading_quantity_shape_and_edge_cases():
    rng = np.random.default_rng(1)
    draws = torch.from_numpy(rng.normal(size=(2, 50, 3, 4)))
    assert diagnostics.rhat(draws).shape == (12,)
    draws[:, :, 0, 0] = math.nan
    draws[:, :, 1, 1] = 2.0  # constant: ArviZ's ESS is the number of draws, its R-hat undefined
    rhat, ess = diagnostics.rhat(draws), diagnostics.ess_bulk(draws)
    assert math.isnan(rhat[0]) and math.isnan(ess[0]) and ess[5] == 100 and math.isnan(rhat[5])
    assert torch.isnan(diagnostics.rhat(draws[:, :3])).all()  # fewer than 4 draws
