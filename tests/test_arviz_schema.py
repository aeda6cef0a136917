"""Every method's InferenceData through ArviZ's own functions: the same dims for y in the predictive,
observed and log-likelihood groups (az.loo_pit), MCMC sample_stats under ArviZ's names (az.plot_energy,
az.bfmi), no optimisation trace posing as per-draw stats, fitted constants outside the posterior."""

import warnings

import arviz as az
import matplotlib
import numpy as np
import pytest
import torch

import bnn_zoo as bz

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
    "sgmcmc": bz.SGMCMC(num_samples=50, **QUICK),
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
    if "sample_stats" in idata.groups():
        assert all(v.dims[:2] == ("chain", "draw") for v in idata.sample_stats.data_vars.values()), idata.sample_stats
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k and few-draw warnings: the calls must run, not be good
        az.summary(idata)
        loo = az.loo(idata)
        assert np.isfinite(loo.elpd_loo)
        assert np.isfinite(az.loo_pit(idata, y="y")).all()
        az.compare({"a": idata, "b": idata})
        az.plot_trace(idata, var_names=["layers.1.bias"] if name != "gp" else None)
        az.plot_posterior(idata, var_names=["layers.1.bias"] if name != "gp" else None)
        draws = idata.posterior_predictive.sizes["chain"] * idata.posterior_predictive.sizes["draw"]
        az.plot_ppc(idata, num_pp_samples=min(20, draws))
        if name in MCMC:
            assert {"lp", "acceptance_rate", "step_size", "diverging", "energy"} <= set(idata.sample_stats)
            az.plot_energy(idata)
            assert np.isfinite(az.bfmi(idata)).all()
    plt.close("all")
