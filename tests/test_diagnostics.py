"""bnn_zoo.evaluation.diagnostics: R-hat, bulk ESS and ESS of the mean of many quantities at once equal
ArviZ's own, quantity by quantity, on draws whose answers differ (independent, autocorrelated, shifted
chains, ties, one chain, anticorrelated), and their edge cases follow ArviZ's; LOO's relative
efficiency is ArviZ's."""

import math

import numpy as np
import pytest
import torch
import xarray as xr

from bnn_zoo import arviz_compat, diagnostics


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
    mean = diagnostics.ess_mean(torch.from_numpy(draws)).numpy()
    np.testing.assert_allclose(mean, arviz_compat.ess(ds, method="mean")["f"].values, rtol=1e-10)
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


def test_loo_given_our_relative_efficiency_equals_arvizs_own():
    """r_eff from the posterior group's ESS of the mean, as az.loo computes it when given none: the same
    elpd and Pareto k; and r_eff matters (1 gives other k), so the comparison can fail."""
    rng = np.random.default_rng(2)
    weights = _ar1(rng, 4, 100, 30, 0.8)
    log_lik = -0.5 * (rng.normal(size=(4, 100, 25)) + weights[..., :1]) ** 2
    idata = arviz_compat.inference_data(
        {
            "posterior": xr.Dataset({"w": (("chain", "draw", "w_dim_0"), weights)}),
            "log_likelihood": xr.Dataset({"y": (("chain", "draw", "obs"), log_lik)}),
        }
    )
    reff = diagnostics.loo_relative_efficiency(torch.from_numpy(weights), 400)
    ours, arvizs = arviz_compat.loo(idata, reff), arviz_compat.loo(idata)
    assert reff < 0.5
    assert ours.elpd == pytest.approx(arvizs.elpd, rel=1e-10)
    np.testing.assert_allclose(ours.pareto_k, arvizs.pareto_k, rtol=1e-10)
    assert not np.allclose(arviz_compat.loo(idata, 1.0).pareto_k, arvizs.pareto_k, rtol=1e-6)
    assert diagnostics.loo_relative_efficiency(torch.from_numpy(weights[:1]), 100) == 1.0
