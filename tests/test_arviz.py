"""One model object fitted by SVI and by NUTS; both results go through ArviZ and netCDF."""

import json

import arviz as az
import numpy as np
import pytest
import torch
import xarray as xr

import bnn_zoo as bz
from bnn_zoo import arviz_compat
from bnn_zoo.io import load_inference_data, save_inference_data

DRAWS = 50


@pytest.fixture(scope="module")
def two_fits():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(25, 1, generator=g) * 4 - 2
    y = 0.5 * x[:, 0] + 0.3 * torch.sin(2 * x[:, 0]) + 0.3 * torch.randn(25, generator=g)
    model = bz.BNN(bz.models.MLP(1, [4], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    svi = bz.fit(model, x, y, bz.SVI(steps=800, lr=0.03, num_particles=2, num_draws=400, seed=1, progress=False))
    # 50 + 50 draws: what the ArviZ checks need (two chains for R-hat), at half the time of 100 + 100
    nuts = bz.fit(
        model, x, y, bz.NUTS(num_warmup=50, num_samples=DRAWS, num_chains=2, init=svi, seed=1, progress=False)
    )
    return model, svi, nuts


def test_same_model_object_through_summary_loo_and_compare(two_fits):
    model, svi, nuts = two_fits
    assert svi.model is model and nuts.model is model
    data = {"svi": svi.to_inference_data(), "nuts": nuts.to_inference_data()}
    for idata in data.values():
        summary = az.summary(idata)
        n_weights = sum(p.numel() for p in model.params.values())
        assert len(summary) == n_weights + 1  # every weight and the noise scale
        loo = arviz_compat.loo(idata)
        assert np.isfinite(loo.elpd) and loo.se > 0 and loo.pareto_k.shape == (25,)
    table = arviz_compat.compare(data)
    assert set(table.index) == {"svi", "nuts"} and np.isfinite(table["elpd"]).all()
    assert float(az.rhat(data["nuts"])["noise_scale"]) < 1.2


def test_inference_data_groups_dims_and_attrs(two_fits):
    model, svi, nuts = two_fits
    idata = nuts.to_inference_data()
    assert set(arviz_compat.group_names(idata)) >= {
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
        "sample_stats",
    }
    assert idata.posterior["layers.0.weight"].dims == ("chain", "draw", "layers.0.out", "layers.0.in")
    assert idata.posterior["layers.0.bias"].dims == ("chain", "draw", "layers.0.out")
    assert idata.posterior.sizes["chain"] == 2 and idata.posterior.sizes["draw"] == DRAWS
    assert idata.log_likelihood["y"].shape == (2, DRAWS, 25)
    np.testing.assert_allclose(idata.log_likelihood["y"].values, nuts.log_likelihood().numpy())
    for stat in ("diverging", "tree_depth", "n_steps", "step_size", "energy", "lp", "acceptance_rate"):
        assert idata.sample_stats[stat].dims == ("chain", "draw")
    assert idata.sample_stats["diverging"].dtype == bool
    attrs = idata.posterior.attrs
    assert (
        attrs["method"] == "nuts"
        and attrs["seed"] == 1
        and "FanInNormal" in attrs["prior"]
        and "Gaussian" in attrs["likelihood"]
    )
    assert (
        "MLP" in attrs["model"]
        and attrs["inference_library_version"]
        and attrs["torch_version"]
        and attrs["arviz_version"]
    )
    assert json.loads(attrs["settings"])["num_chains"] == 2
    svi_data = svi.to_inference_data()
    assert "sample_stats" not in arviz_compat.group_names(svi_data)  # its loss is per optimisation step, not per draw
    assert svi_data.optimization["loss"].dims == ("step",) and svi_data.optimization.sizes["step"] == 800


@pytest.mark.parametrize("which", ["svi", "nuts"])
def test_netcdf_round_trip_is_lossless(two_fits, tmp_path, which):
    post = two_fits[1] if which == "svi" else two_fits[2]
    idata = post.to_inference_data()
    save_inference_data(idata, tmp_path / "posterior.nc")
    back = load_inference_data(tmp_path / "posterior.nc")
    assert type(back) is type(idata)  # the installed ArviZ's own object
    assert arviz_compat.group_names(back) == arviz_compat.group_names(idata)
    for group in arviz_compat.group_names(idata):
        xr.testing.assert_identical(arviz_compat.group(idata, group), arviz_compat.group(back, group))
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left nothing behind


def test_elbo_only_for_variational_posteriors(two_fits):
    _, svi, nuts = two_fits
    value, se = svi.elbo(num_samples=300)
    assert np.isfinite(value) and se > 0
    with pytest.raises(bz.BnnZooError, match="needs a variational guide"):
        nuts.elbo()


def test_predict_thins_stored_draws_or_draws_afresh_from_the_guide(two_fits):
    _, svi, nuts = two_fits
    x = torch.linspace(-2, 2, 5)[:, None]
    assert nuts.predict(x, num_samples=30).f.shape == (30, 5, 1)
    assert svi.predict(x, num_samples=1000).f.shape == (1000, 5, 1)  # more than the 400 stored
    with pytest.raises(bz.BnnZooError, match=f"only {2 * DRAWS} posterior draws"):
        nuts.predict(x, num_samples=2 * DRAWS + 1)
    q = nuts.predict(x).quantiles([0.05, 0.5, 0.95])
    assert q.shape == (3, 5, 1) and torch.all(q[0] <= q[1]) and torch.all(q[1] <= q[2])


def test_waic_from_the_pointwise_log_likelihood():
    """Ground truth: draws that agree on every log p(y_i) give elpd = sum log p(y_i), p_waic = 0; and
    on random draws, what ArviZ 0.2x's az.waic gives (ArviZ 1.x has no WAIC to compare with)."""
    constant = np.broadcast_to(np.log([0.1, 0.5, 0.2]), (2, 30, 3))
    waic = arviz_compat.waic_from_log_likelihood(constant)
    assert waic.elpd == pytest.approx(np.log(0.01)) and waic.p == pytest.approx(0, abs=1e-12) and not waic.warning
    if arviz_compat.MAJOR >= 1:
        pytest.skip("ArviZ 1.x has no az.waic to compare with")
    log_lik = np.random.default_rng(0).normal(-1.0, 0.8, size=(2, 200, 40))
    idata = az.from_dict(posterior={"w": np.zeros((2, 200))}, log_likelihood={"y": log_lik})
    expected = az.waic(idata)
    waic = arviz_compat.waic_from_log_likelihood(log_lik)
    assert waic.elpd == pytest.approx(expected.elpd_waic, rel=1e-12) and waic.se == pytest.approx(expected.se, rel=1e-9)
    assert waic.p == pytest.approx(expected.p_waic, rel=1e-12) and waic.warning == expected.warning == True  # noqa: E712
