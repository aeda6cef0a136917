"""The JAX backend of NUTS and ChEES (bnn_zoo.inference.xla): the traced log density equals torch's,
its samplers match the exact posterior of Bayesian linear regression, and what cannot be traced falls
back to torch with one warning. Runs where the ``jax`` extra is installed."""

import warnings

import pytest
import torch
from conftest import assert_matches_exact_posterior_within_4_mcse

import bnn_zoo as bz
from bnn_zoo.inference import xla

if not xla.available():
    pytest.skip("the jax extra is not installed (pip install 'bnn-zoo[jax]')", allow_module_level=True)


class DataDependent(torch.nn.Module):
    """A network that reads a tensor's value in Python: fine in eager torch, untraceable under jit."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.layer = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.layer(x) / float(x.abs().max())


def _starts(model, chains=2):
    return bz.inference.potential.chain_starts(model, None, chains, 0, torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "net, likelihood, x, y",
    [
        (bz.models.MLP(3, [8], 1), bz.likelihoods.Gaussian.learned(), torch.randn(20, 3), torch.randn(20, 1)),
        (
            bz.models.MLP(3, [8, 8], 4, activation="relu"),
            bz.likelihoods.Categorical(),
            torch.randn(20, 3),
            torch.randint(0, 4, (20,)),
        ),
        (bz.models.LeNet(), bz.likelihoods.Categorical(), torch.rand(12, 64), torch.randint(0, 10, (12,))),
    ],
    ids=["mlp-learned-noise", "mlp-classifier", "cnn"],
)
def test_traced_log_density_and_gradient_equal_torchs(net, likelihood, x, y):
    """At several points, not only the start that the run-time check uses."""
    import jax
    import jax.numpy as jnp

    model = bz.BNN(net, bz.priors.FanInNormal(), likelihood)
    target = xla.JaxTarget(model, x, y)
    q = target.start(_starts(model, 3)) + 0.3 * torch.randn(
        3, sum(target.sizes), generator=torch.Generator().manual_seed(1)
    )
    value_and_grad = jax.jit(jax.value_and_grad(target.logdensity))
    for point in q:
        target.check(point)
        leaf = point.clone().requires_grad_(True)
        value = target.torch_target(target.unflatten(leaf), (x, y))[0]
        (grad,) = torch.autograd.grad(value, leaf)
        jv, jg = value_and_grad(jnp.asarray(point.numpy()))
        assert float(jv) == pytest.approx(float(value), rel=1e-5)
        assert torch.allclose(
            torch.from_numpy(jax.device_get(jg).copy()), grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max())
        )


def test_jax_nuts_matches_the_exact_posterior(blr_model, blr_data, blr_exact):
    fit = bz.fit(
        blr_model,
        *blr_data,
        bz.NUTS(num_warmup=300, num_samples=1000, num_chains=2, seed=0, progress=False, backend="jax"),
    )
    assert fit.settings["backend"] == "jax"
    assert_matches_exact_posterior_within_4_mcse(fit, blr_exact)
    stats = fit.sample_stats
    assert stats["diverging"].shape == (2, 1000) and stats["diverging"].dtype == torch.bool
    assert torch.all(2 ** (stats["tree_depth"] - 1) <= stats["n_steps"]) and torch.all(
        stats["n_steps"] < 2 ** stats["tree_depth"]
    )
    assert len(torch.unique(stats["step_size"][0])) == 1  # adapted in warm-up, then fixed
    assert {"posterior", "sample_stats", "log_likelihood"} <= set(fit.to_inference_data().groups())


def test_jax_chees_matches_the_exact_posterior(blr_model, blr_data, blr_exact, tmp_path):
    fit = bz.fit(
        blr_model,
        *blr_data,
        bz.ChEES(num_chains=16, num_warmup=150, num_samples=200, seed=0, progress=False, backend="jax"),
    )
    assert fit.settings["backend"] == "jax" and fit.sample_stats["n_steps"].shape == (16, 200)
    assert_matches_exact_posterior_within_4_mcse(fit, blr_exact)
    fit.save(tmp_path / "run")
    again = bz.load(tmp_path / "run")
    x = blr_data[0]
    assert torch.equal(again.predict(x).f, fit.predict(x).f)


def test_the_same_seed_gives_the_same_draws(blr_model, blr_data):
    method = bz.ChEES(num_chains=4, num_warmup=20, num_samples=10, seed=3, progress=False, backend="jax")
    first, second = (bz.fit(blr_model, *blr_data, method) for _ in range(2))
    assert all(torch.equal(first.samples[k], second.samples[k]) for k in first.samples)


def test_an_untraceable_network_falls_back_to_torch_with_one_warning(blr_data):
    model = bz.BNN(DataDependent(3, 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    with pytest.warns(
        UserWarning, match=r"NUTS backend='jax' falls back to torch: the log density could not be traced to JAX"
    ) as caught:
        fit = bz.fit(
            model, *blr_data, bz.NUTS(num_warmup=20, num_samples=20, num_chains=1, progress=False, backend="jax")
        )
    assert len([w for w in caught if "falls back" in str(w.message)]) == 1
    assert fit.settings["backend"] == "torch" and fit.samples["layer.weight"].shape == (1, 20, 1, 3)


def test_a_mismatch_at_the_start_falls_back_to_torch(blr_model, blr_data, monkeypatch):
    trace = xla.JaxTarget._trace
    monkeypatch.setattr(
        xla.JaxTarget, "_trace", lambda self, *args: (lambda f: lambda q: f(q) + 1.0)(trace(self, *args))
    )
    method = bz.ChEES(num_chains=2, num_warmup=5, num_samples=5, progress=False, backend="jax")
    with pytest.warns(
        UserWarning,
        match=r"ChEES backend='jax' falls back to torch: the traced log density differs from torch's at the start",
    ):
        fit = bz.fit(blr_model, *blr_data, method)
    assert fit.settings["backend"] == "torch"


def test_auto_takes_jax_except_where_the_traced_gradient_is_slower(blr_model):
    """benchmarks/backends.py: the MLP's traced gradient is cheaper than eager torch's, the CNN's and LSTMs' not."""
    assert xla.resolve_backend("auto", blr_model) == "jax"
    lstm = bz.BNN(bz.models.TextRNN(20, 4, 4, "tied"), likelihood=bz.likelihoods.Categorical())
    cnn = bz.BNN(bz.models.LeNet(), likelihood=bz.likelihoods.Categorical())
    assert xla.resolve_backend("auto", lstm) == xla.resolve_backend("auto", cnn) == "torch"
    assert xla.resolve_backend("jax", lstm) == "jax"  # asked for: tried, and checked


def test_bad_backend_settings_are_one_clear_error(monkeypatch):
    with pytest.raises(bz.BnnZooError, match="NUTS backend must be one of 'auto', 'torch', 'jax', got 'xla'"):
        bz.NUTS(backend="xla")
    with pytest.raises(bz.BnnZooError, match="mass_matrix='within' exists only with backend='torch'"):
        bz.ChEES(backend="jax", mass_matrix="within")
    monkeypatch.setattr(xla, "available", lambda: False)
    with pytest.raises(bz.BnnZooError, match=r"needs the jax extra: pip install 'bnn-zoo\[jax\]'"):
        bz.ChEES(backend="jax")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xla.resolve_backend("auto", bz.BNN(bz.models.MLP(1, [2], 1))) == "torch"
