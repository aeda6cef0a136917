"""Laplace: on Bayesian linear regression the GGN is the exact Hessian, so the Laplace posterior and
MacKay's evidence are the closed form (the declared prior by default, and type-II as opted into, then
labelled so); on the toy regression a last-layer Laplace is sensible, saves and loads, and sits in the
evidence table."""

import json
import math

import pytest
import torch
from conftest import NOISE, flat
from scipy.optimize import minimize_scalar

import bnn_zoo as bz
from bnn_zoo.evaluation.exact import linear_regression

QUICK = dict(map_steps=200, progress=False)


def _moments(post):
    draws = flat({k: v.double() for k, v in post.draws().items() if k in post.model.params})
    return draws.mean(0), torch.cov(draws.T)


@pytest.mark.parametrize("hessian", ["full", "kron"])
def test_laplace_on_linear_regression_is_the_exact_posterior_and_evidence(hessian, blr_model, blr_data, blr_exact):
    """At its defaults, of the declared model: its prior, its noise."""
    post = bz.fit(blr_model, *blr_data, bz.Laplace(hessian=hessian, num_draws=20000, **QUICK), standardize=False)
    assert (
        post.info["evidence_laplace"] == pytest.approx(blr_exact.log_evidence, abs=1e-6) and post.info["type_ii"] == ""
    )
    assert torch.allclose(flat(post.map).double(), blr_exact.mean, atol=1e-5)
    mean, cov = _moments(post)  # 20000 draws: Monte Carlo error of the mean about sd / 141
    sd = blr_exact.cov.diagonal().sqrt()
    assert torch.all((mean - blr_exact.mean).abs() < 4 * sd / math.sqrt(20000))
    assert torch.allclose(cov.diagonal().sqrt(), sd, rtol=0.03)


def test_laplace_type_two_prior_precision_maximises_the_exact_evidence_and_says_so(blr_model, blr_data, tmp_path):
    from bnn_zoo.experiments.run import run
    from bnn_zoo.io import load_inference_data

    x, y = blr_data

    def exact(log_scale):
        s = math.exp(log_scale)
        return linear_regression(x, y, weight_scale=s, bias_scale=s, noise_scale=NOISE).log_evidence

    best = minimize_scalar(lambda ls: -exact(ls), bounds=(-5, 5), method="bounded", options={"xatol": 1e-10})
    method = bz.Laplace(hessian="full", optimize_prior=True, rounds=8, **QUICK)
    post = bz.fit(blr_model, x, y, method, standardize=False)
    assert post.info["evidence_laplace_type_ii"] == pytest.approx(exact(best.x), rel=1e-8)
    # precision = 1 / scale^2
    assert post.info["prior_precision_scale"] == pytest.approx(math.exp(-2 * best.x), rel=1e-3)
    post = run("laplace", bz.data.Dataset("blr", x, y, x, y), blr_model, method, tmp_path).posterior
    # never in the declared prior's column: its own, with what was fitted
    label = f"prior precision x {post.info['prior_precision_scale']:.3g} (type-II)"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert (
        "evidence_laplace" not in saved and saved["evidence_laplace_type_ii"] == post.info["evidence_laplace_type_ii"]
    )
    assert (
        saved["type_ii"] == label and load_inference_data(tmp_path / "posterior.nc").posterior.attrs["type_ii"] == label
    )
    row = bz.compare([tmp_path]).iloc[0]
    assert row["evidence_laplace_type_ii"] == post.info["evidence_laplace_type_ii"] and row["type_ii"] == label
    assert "evidence_laplace" not in row


def test_diagonal_laplace_has_the_exact_mean_and_the_mean_field_variances(blr_model, blr_data, blr_exact):
    post = bz.fit(
        blr_model,
        *blr_data,
        bz.Laplace(hessian="diag", optimize_prior=False, num_draws=20000, **QUICK),
        standardize=False,
    )
    _, cov = _moments(post)
    assert torch.allclose(flat(post.map).double(), blr_exact.mean, atol=1e-5)
    assert torch.allclose(cov.diagonal(), blr_exact.mean_field_variance, rtol=0.05)  # 1 / diag(precision)


def test_last_layer_laplace_on_the_toy_regression_saves_loads_and_reports_its_evidence(tmp_path):
    from bnn_zoo.experiments.run import run

    data = bz.data.toy_cubic()
    model = bz.BNN(bz.models.MLP(1, [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned())
    result = run(
        "laplace",
        data,
        model,
        bz.Laplace(subset="last_layer", hessian="kron", map_steps=1500, progress=False),
        tmp_path / "lap",
    )
    post = result.posterior
    y_sd = data.y_std  # the fit's numbers are in the data's units: a good fit's noise and error well under its sd
    assert list(post.model.params) == ["layers.1.weight", "layers.1.bias"] and post.info["noise_scale"] < 0.5 * y_sd
    # the noise is fitted by type II (MacKay's beta), so the evidence is labelled so
    assert result.metrics["evidence_laplace_type_ii"] == post.info["evidence_laplace_type_ii"]
    assert math.isfinite(post.info["evidence_laplace_type_ii"]) and post.info["type_ii"].startswith("noise sd")
    train_rmse = (post.predict(data.train[0]).mean - data.train[1][:, None]).pow(2).mean().sqrt()
    assert train_rmse < 0.5 * y_sd
    sd = post.predict(torch.tensor([[0.0], [6.0]])).variance.sqrt()[:, 0]
    assert sd[1] > sd[0]  # the linearised predictive widens away from the data
    again = bz.load(tmp_path / "lap")
    assert type(again).__name__ == "LaplacePosterior" and torch.equal(
        again.predict(data.test[0]).f, post.predict(data.test[0]).f
    )
    table = bz.compare([tmp_path / "lap"])
    assert table["evidence_laplace_type_ii"].iloc[0] == pytest.approx(post.info["evidence_laplace_type_ii"])


def test_laplace_refuses_what_it_cannot_do(blr_data):
    x, y = blr_data
    with pytest.raises(bz.BnnZooError, match="zero-mean Normal prior"):
        bz.fit(
            bz.BNN(bz.models.MLP(3, [], 1), bz.priors.PerSite({}, default=torch.distributions.Laplace(0.0, 1.0))),
            x,
            y,
            bz.Laplace(**QUICK),
            standardize=False,
        )
    with pytest.raises(bz.BnnZooError, match="one prior scale for all of"):
        bz.fit(
            bz.BNN(bz.models.MLP(3, [4], 1), bz.priors.FanInNormal()),
            x,
            y,
            bz.Laplace(hessian="kron", **QUICK),
            standardize=False,
        )
    with pytest.raises(bz.BnnZooError, match="Laplace hessian must be one of"):
        bz.Laplace(hessian="exact")


def test_auto_hessian_is_full_for_small_networks_and_diag_above_the_full_limit():
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    y = x.sum(1)
    small = bz.BNN(bz.models.MLP(3, [4], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.3))
    # 5,321 weights > MAX_FULL
    large = bz.BNN(bz.models.MLP(3, [70, 70], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.3))
    for model, same_as in ((small, "full"), (large, "diag")):
        auto, explicit = (
            bz.fit(
                model,
                x,
                y,
                bz.Laplace(hessian=h, map_steps=20, optimize_prior=False, seed=0, progress=False),
                standardize=False,
            )
            for h in ("auto", same_as)
        )
        assert auto.info["evidence_laplace"] == explicit.info["evidence_laplace"], same_as


@pytest.mark.parametrize(
    "subset, hessian", [("all", "full"), ("all", "diag"), ("last_layer", "full"), ("last_layer", "diag")]
)
def test_laplace_torch_gives_the_same_evidence_and_glm_predictive_at_the_same_map(subset, hessian):
    """laplace-torch (the reference implementation; install it without torchvision, see the inference
    guide) on bnn-zoo's MAP, prior precision and noise: the evidence to float rounding, and the GLM
    predictive within Monte Carlo error of bnn-zoo's 4,000 draws (mean: 4 / sqrt(4000) = 0.063 sds;
    variance: 4 sqrt(2 / 4000) = 9%)."""
    laplace = pytest.importorskip("laplace")
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 40)[:, None]
    y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(40)
    x_test = torch.linspace(-3, 3, 25)[:, None]
    model = bz.BNN(bz.models.MLP(1, [10], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.2))
    post = bz.fit(
        model,
        x,
        y,
        bz.Laplace(subset=subset, hessian=hessian, optimize_prior=False, num_draws=4000, progress=False),
        standardize=False,
    )
    net = bz.models.MLP(1, [10], 1).double()
    net.load_state_dict({k: v.double() for k, v in {**post.model.fixed, **post.map}.items()})
    reference = laplace.Laplace(
        net, "regression", subset_of_weights=subset, hessian_structure=hessian, sigma_noise=0.2, prior_precision=1.0
    )
    reference.fit(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.double(), y.double()[:, None]), batch_size=40)
    )
    assert post.info["evidence_laplace_type_ii"] == pytest.approx(float(reference.log_marginal_likelihood()), rel=1e-6)
    f_mean, f_var = (v.reshape(len(x_test)).float() for v in reference(x_test.double(), pred_type="glm"))
    pred = post.predict(x_test)
    assert torch.all((pred.mean[:, 0] - f_mean).abs() < 4 / math.sqrt(4000) * f_var.sqrt())
    assert torch.all((pred.model_variance[:, 0] / f_var - 1).abs() < 4 * math.sqrt(2 / 4000))
