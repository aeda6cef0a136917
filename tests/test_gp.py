"""The GPyTorch baseline against closed forms in numpy, the NNGP kernel against wide random networks,
and classification through the BNN interface."""

import math
import warnings

import gpytorch
import numpy as np
import pytest
import torch

import bnn_zoo as bz
from bnn_zoo import arviz_compat
from bnn_zoo.baselines import NNGPKernel
from bnn_zoo.evaluation import classification_metrics, regression_metrics
from bnn_zoo.evaluation.exact import gp_regression
from bnn_zoo.inference.collapse import ON_BOUND


def _data(n=40, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(n, d, generator=g) - 1
    return x, torch.sin(3 * x[:, 0]) + (x[:, 1:] ** 2).sum(1) + 0.1 * torch.randn(n, generator=g)


def _numpy_kernel(kind, h, a, b):
    """Kernel matrices written independently of GPyTorch, from the fitted hyperparameters h."""
    if kind == "nngp":
        w, c = h["covar_module.weight_var"][0], h["covar_module.bias_var"][0]
        d = a.shape[1]
        kab, kaa, kbb = c + w * a @ b.T / d, c + w * (a**2).sum(1) / d, c + w * (b**2).sum(1) / d
        norm = np.sqrt(np.outer(kaa, kbb))
        t = np.arccos(np.clip(kab / norm, -1, 1))
        return c + w * norm * (np.sin(t) + (np.pi - t) * np.cos(t)) / (2 * np.pi)
    ls = np.array(h["covar_module.base_kernel.lengthscale"])
    r = np.sqrt((((a[:, None, :] - b[None, :, :]) / ls) ** 2).sum(-1))
    s = h["covar_module.outputscale"][0]
    return s * (
        np.exp(-0.5 * r**2) if kind == "rbf" else (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)
    )


@pytest.mark.parametrize("kind", ["rbf", "matern52", "nngp"])
def test_log_marginal_likelihood_and_predictive_equal_the_numpy_closed_form(kind):
    x, y = _data()
    post = bz.fit(bz.GP(kind), x, y, bz.TypeII(steps=60, lr=0.05, progress=False), standardize=False)
    h = post.hyperparameters()
    x_new = torch.tensor([[0.3, -0.2], [1.5, 1.5]])
    xn, xt = x.double().numpy(), x_new.double().numpy()
    k_test = np.diag(_numpy_kernel(kind, h, xt, xt))
    lml, mean, var = gp_regression(
        _numpy_kernel(kind, h, xn, xn),
        _numpy_kernel(kind, h, xn, xt),
        k_test,
        y.double().numpy(),
        h["likelihood.noise_covar.noise"][0],
        h["mean_module.constant"][0],
    )
    assert post.log_marginal_likelihood() == pytest.approx(lml, rel=1e-6)
    got_mean, got_var = post.latent(x_new)
    np.testing.assert_allclose(got_mean[:, 0].numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(got_var[:, 0].numpy(), var, rtol=1e-5)
    assert post.sample_stats["loss"][-1] < post.sample_stats["loss"][0]  # type II improved the evidence


def test_nngp_kernel_is_the_wide_relu_network_prior():
    """Covariance of a 1-hidden-layer ReLU MLP's output under FanInNormal(gain 1.5, bias 0.5) over 20,000
    networks of width 512 (sampling error of each entry < 2%) equals the NNGP kernel."""
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([[1.0, 0.0, 0.5], [0.2, -1.0, 0.3], [-0.7, 0.4, 0.9]], dtype=torch.float64)
    s, width, gain, bias = 20000, 512, 1.5, 0.5
    w1 = torch.randn(s, width, 3, generator=g, dtype=torch.float64) * gain / math.sqrt(3)
    b1 = torch.randn(s, width, 1, generator=g, dtype=torch.float64) * bias
    h = torch.relu(w1 @ x.T + b1)  # (s, width, 3 points)
    w2 = torch.randn(s, 1, width, generator=g, dtype=torch.float64) * gain / math.sqrt(width)
    f = (w2 @ h)[:, 0] + bias * torch.randn(s, 1, generator=g, dtype=torch.float64)
    empirical = f.T @ f / s
    kernel = NNGPKernel(depth=1, weight_var=gain**2, bias_var=bias**2).double()
    with torch.no_grad():
        exact = kernel(x, x).to_dense()
        np.testing.assert_allclose(kernel(x, x, diag=True).numpy(), exact.diagonal().numpy(), rtol=1e-6)
    # sd of a Gaussian covariance estimate
    se = (exact.diagonal()[:, None] * exact.diagonal()[None] + exact**2).sqrt() / math.sqrt(s)
    assert torch.all((empirical - exact).abs() < 4 * se), (empirical, exact)


def test_regression_gp_has_the_posterior_interface(tmp_path):
    x, y = _data(60, 1, seed=1)
    post = bz.fit(bz.GP("matern52"), x, y, bz.TypeII(steps=100, progress=False), standardize=False)
    x_test, y_test = _data(200, 1, seed=2)
    out = regression_metrics(post.predict(x_test), y_test[:, None])
    assert out["rmse"] < 0.2 and 0.8 < out["coverage_90"] <= 1.0
    mean, var = post.latent(x_test)
    pred = post.predict(x_test, num_samples=4000)
    assert torch.all((pred.mean - mean).abs() < 5 * (var / 4000).sqrt())  # draws of f come from its marginals
    idata = post.to_inference_data()
    assert idata.log_likelihood["y"].shape == (1, 1000, 60) and "hyperparameters" in idata.posterior.attrs
    assert np.isfinite(arviz_compat.loo(idata).elpd)


@pytest.mark.parametrize("noise, collapses", [(0.0, True), (0.1, False)])
def test_a_noise_variance_on_its_lower_bound_is_said_to_collapse(noise, collapses):
    """Noise-free targets drive type II's noise onto GPyTorch's bound (1e-4): the fit interpolates and says so.
    The same function with noise of sd 0.1 (variance 100 times the bound) keeps an interior noise and no warning."""
    g = torch.Generator().manual_seed(0)
    x = 2 * torch.rand(30, 1, generator=g) - 1
    y = torch.sin(3 * x[:, 0]) + noise * torch.randn(30, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        post = bz.fit(bz.GP("rbf"), x, y, bz.TypeII(steps=300, progress=False), standardize=False)
    variance, bound = post.noise_and_bound()
    said = [str(w.message) for w in caught if "noise variance fell onto its lower bound" in str(w.message)]
    assert (variance < ON_BOUND * bound) == collapses and bool(said) == collapses, (variance, said)
    assert ("collapse_warning" in post.info) == collapses


@pytest.mark.parametrize("likelihood", ["bernoulli", "categorical"])
def test_variational_gp_classification(likelihood):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 2, generator=g)
    if likelihood == "bernoulli":
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
        gp = bz.GP("rbf", bz.likelihoods.Bernoulli(), num_inducing=24)
    else:
        y = (x[:, 0] > 0.5).long() + (x[:, 0] > -0.5).long()
        gp = bz.GP("rbf", bz.likelihoods.Categorical(), num_classes=3, num_inducing=24)
    post = bz.fit(gp, x, y, bz.TypeII(steps=150, lr=0.05, progress=False), standardize=False)
    out = classification_metrics(post.predict(x), y)
    assert out["accuracy"] > 0.93 and out["nll"] < 0.3
    elbo, se = post.elbo()
    assert elbo < 0 and elbo > -300 * math.log(3)  # better than chance, below the perfect log-likelihood 0
    if (
        likelihood == "bernoulli"
    ):  # our logits of the probit link reproduce GPyTorch's ELBO (quadrature) and predictive E[Phi(f)]
        with torch.no_grad():
            gpytorch_elbo = 300 * gpytorch.mlls.VariationalELBO(post.gp_likelihood, post.module, num_data=300)(
                post.module(x.double()), y.double()
            )
            expected = post.gp_likelihood(post.module(x.double())).mean
        assert abs(elbo - gpytorch_elbo.item()) < 4 * se + 1e-3, (elbo, se, gpytorch_elbo)
        assert torch.allclose(post.predict(x, num_samples=20000).probs[:, 0].double(), expected, atol=0.01)


def test_gp_bad_input_is_refused_with_the_fix():
    x, y = _data()
    with pytest.raises(bz.BnnZooError, match="GP kernel must be one of .rbf., .matern52., .nngp."):
        bz.GP("periodic")
    with pytest.raises(bz.BnnZooError, match="num_classes"):
        bz.GP(likelihood=bz.likelihoods.Categorical())
    with pytest.raises(bz.BnnZooError, match="TypeII"):
        bz.fit(bz.GP(), x, y, bz.SVI(steps=5), standardize=False)
    with pytest.raises(bz.BnnZooError, match="TypeII"):
        bz.fit(bz.BNN(bz.models.MLP(2, [4], 1)), x, y, bz.TypeII(steps=5), standardize=False)
    with pytest.raises(bz.BnnZooError, match="no closed-form"):
        bz.fit(
            bz.GP(likelihood=bz.likelihoods.Bernoulli(), num_inducing=8),
            x,
            (y > 0).long(),
            bz.TypeII(steps=2, progress=False),
            standardize=False,
        ).log_marginal_likelihood()
