"""Every method's posterior object (InferenceData, or a DataTree under ArviZ 1.x) through the installed
ArviZ's own functions: the same dims for y in the predictive, observed and log-likelihood groups
(LOO-PIT), MCMC sample_stats under ArviZ's names (plot_energy, bfmi), no optimisation trace posing as
per-draw stats, fitted constants outside the posterior."""

import re
import warnings

import arviz as az
import matplotlib
import numpy as np
import pytest
import torch

import bnn_zoo as bz
from bnn_zoo import arviz_compat

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = dict(progress=False)
METHODS = {
    "svi-mean-field": bz.SVI(steps=300, num_draws=100, **QUICK),
    "svi-dropout": bz.SVI(guide="dropout", steps=300, num_draws=100, **QUICK),
    "svi-matrix-normal": bz.SVI(guide="matrix-normal", steps=300, num_draws=100, **QUICK),
    "svi-flow": bz.SVI(guide="flow", steps=300, num_draws=100, **QUICK),
    "nuts": bz.NUTS(num_warmup=40, num_samples=40, num_chains=2, **QUICK),
    "hmc": bz.HMC(num_warmup=40, num_samples=40, num_chains=2, **QUICK),
    "chees": bz.ChEES(num_warmup=40, num_samples=40, num_chains=4, backend="torch", **QUICK),
    "laplace": bz.Laplace(map_steps=200, num_draws=100, **QUICK),
    "sgmcmc": bz.SGMCMC(num_samples=50, burn_in=300, thinning=2, **QUICK),
    "ensemble": bz.Ensemble(members=3, steps=200, **QUICK),
    "swag": bz.SWAG(steps=300, **QUICK),
}
MCMC = ("nuts", "hmc", "chees")


def _data(task):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 1, generator=g) * 4 - 2
    if task == "regression":
        return x, torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(30, generator=g)
    return x, (x[:, 0] + 0.3 * torch.randn(30, generator=g) > 0).long()


def _fit(name, task):
    x, y = _data(task)
    likelihood = bz.likelihoods.Gaussian.learned() if task == "regression" else bz.likelihoods.Categorical()
    model = bz.BNN(bz.models.MLP(1, [4], 1 if task == "regression" else 2), bz.priors.FanInNormal(), likelihood)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short fits may collapse or not converge: only the schema is checked
        if name == "gp":
            gp = (
                bz.GP("rbf")
                if task == "regression"
                else bz.GP("rbf", likelihood=bz.likelihoods.Categorical(), num_classes=2, num_inducing=10)
            )
            return bz.fit(gp, x, y, bz.TypeII(steps=30, **QUICK)).to_inference_data()
        return bz.fit(model, x, y, METHODS[name]).to_inference_data()


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("name", [*METHODS, "gp"])
def test_arviz_functions_run_on_every_methods_inference_data(name, task):
    idata = _fit(name, task)
    assert (
        idata.posterior_predictive["y"].dims[2:] == idata.observed_data["y"].dims == idata.log_likelihood["y"].dims[2:]
    )
    if "sample_stats" in arviz_compat.group_names(idata):
        assert all(v.dims[:2] == ("chain", "draw") for v in idata.sample_stats.data_vars.values()), idata.sample_stats
    weights = ["layers.1.bias"] if name != "gp" else None
    draws = idata.posterior_predictive.sizes["chain"] * idata.posterior_predictive.sizes["draw"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k and few-draw warnings: the calls must run, not be good
        az.summary(idata)
        if arviz_compat.MAJOR >= 1:
            _arviz_1(idata, weights, draws)
        else:
            assert np.isfinite(az.loo(idata).elpd_loo)
            assert np.isfinite(az.loo_pit(idata, y="y")).all()
            az.compare({"a": idata, "b": idata})
            az.plot_trace(idata, var_names=weights)
            az.plot_posterior(idata, var_names=weights)
            az.plot_ppc(idata, num_pp_samples=min(20, draws))
        if name in MCMC:
            assert {"lp", "acceptance_rate", "step_size", "diverging", "energy"} <= set(idata.sample_stats)
            az.plot_energy(idata)
            bfmi = az.bfmi(idata)
            assert np.isfinite(bfmi["energy"] if arviz_compat.MAJOR >= 1 else bfmi).all()
    plt.close("all")


def _arviz_1(idata, weights, draws):
    """ArviZ 1.x's own functions. Its PSIS refuses what 0.2x smoothed (a point whose log-likelihood is
    the same in every draw, as a saturated classifier's can be; fewer than about 25 draws, as an
    ensemble's 3): it raises, and bnn-zoo's LOO is then NaN and flagged."""
    try:
        assert np.isfinite(az.loo(idata).elpd)
    except (ValueError, IndexError) as refused:
        assert re.search("tail values are the same|at least 5|out of bounds", str(refused)), refused
        assert np.isnan(arviz_compat.loo(idata).elpd) and arviz_compat.loo(idata).warning
    else:
        assert np.isfinite(az.loo_pit(idata)["y"]).all()
        az.compare({"a": idata, "b": idata})
    with az.rc_context({"plot.max_subplots": 100}):  # the GP classifier's f: 2 classes x 30 points
        az.plot_trace(idata, var_names=weights)
        az.plot_dist(idata, var_names=weights)
    az.plot_ppc_dist(idata, num_samples=min(20, draws))
