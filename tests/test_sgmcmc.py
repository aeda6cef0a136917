"""SG-MCMC against Bayesian linear regression's exact posterior: full-batch SGLD is the unadjusted
Langevin algorithm, whose stationary law for a Gaussian target of precision P is exactly
N(mu, (P - eps P^2 / 2)^-1); the tests check that bias, its growth with the step size, SGHMC and
cyclical SGLD, and an interrupted run resuming exactly."""

import arviz as az
import pytest
import torch
from conftest import flat

import bnn_zoo as bz

pytest.importorskip("posteriors")

# 750 draws a chain: the tolerances are in Monte Carlo standard errors, and the step-size bias checked
# below (62% and 94% of the sd) is 21 and 25 of them at 750 draws; 1,500 took twice the time.
RUN = dict(num_samples=750, thinning=4, burn_in=300, num_chains=2, progress=False)


def _draws(post):
    return flat({k: v.double() for k, v in post.samples.items()}).reshape(-1, 4)


def _mcse(post):
    idata = post.to_inference_data()
    return (
        flat({k: torch.as_tensor(az.mcse(idata, method="mean")[k].values) for k in post.samples}).reshape(-1).double()
    )


def _ula_sd(exact, eps):
    return torch.linalg.inv(exact.precision - eps * exact.precision @ exact.precision / 2).diagonal().sqrt()


def _mcse_sd(post):
    idata = post.to_inference_data()
    return flat({k: torch.as_tensor(az.mcse(idata, method="sd")[k].values) for k in post.samples}).reshape(-1).double()


@pytest.mark.slow  # fixed step sizes; the default, adapted, is tested below in the default suite
def test_full_batch_sgld_has_the_exact_mean_and_the_theoretical_step_size_bias(blr_model, blr_data, blr_exact):
    exact_sd = blr_exact.cov.diagonal().sqrt()
    runs = {
        eps: bz.fit(
            blr_model, *blr_data, bz.SGMCMC(kind="sgld", step_size=eps, **{**RUN, "burn_in": 1000}), standardize=False
        )
        for eps in (2e-3, 1e-2)
    }
    for eps, post in runs.items():
        draws, theory = _draws(post), _ula_sd(blr_exact, eps)
        assert torch.all((draws.mean(0) - blr_exact.mean).abs() < 4 * _mcse(post)), eps
        # (P - eps P^2 / 2)^-1
        assert torch.all((draws.std(0) - theory).abs() < 4 * _mcse_sd(post)), (
            eps,
            draws.std(0),
            theory,
        )
    large = runs[1e-2]
    assert torch.all(_ula_sd(blr_exact, 1e-2)[2:] > 1.6 * exact_sd[2:])  # the theory's bias at this step size...
    # ...is there, far beyond Monte Carlo error
    assert torch.all(_draws(large).std(0)[2:] - exact_sd[2:] > 4 * _mcse_sd(large)[2:])
    small = runs[2e-3]  # and shrinks with the step: a fifth of the step, under a quarter of the bias
    assert torch.all(
        _draws(small).std(0)[2:] - exact_sd[2:]
        < 0.25 * (_draws(large).std(0)[2:] - exact_sd[2:]) + 4 * _mcse_sd(small)[2:]
    )
    assert {"step_size", "log_posterior", "minibatch_log_likelihood"} <= set(large.sample_stats)
    assert large.sample_stats["step_size"].shape == (2, RUN["num_samples"])


@pytest.mark.slow  # fixed step sizes; the default, adapted, is tested below in the default suite
def test_sghmc_and_cyclical_sgld_find_the_exact_posterior_within_monte_carlo_error(blr_model, blr_data, blr_exact):
    """Means within 4 MCSE; sds within 4 MCSE plus 5% (the discretisation bias at these step sizes)."""
    exact_sd = blr_exact.cov.diagonal().sqrt()
    sghmc = bz.fit(
        blr_model, *blr_data, bz.SGMCMC(kind="sghmc", step_size=5e-3, friction=5.0, **RUN), standardize=False
    )
    cyclical = bz.fit(
        blr_model, *blr_data, bz.SGMCMC(kind="cyclical", step_size=4e-3, cycles=20, **RUN), standardize=False
    )
    for post in (sghmc, cyclical):
        draws = _draws(post)
        assert torch.all((draws.mean(0) - blr_exact.mean).abs() < 4 * _mcse(post)), post.settings["kind"]
        assert torch.all((draws.std(0) - exact_sd).abs() < 4 * _mcse_sd(post) + 0.05 * exact_sd), post.settings["kind"]
    steps = cyclical.sample_stats["step_size"][0]
    # draws come from the whole cosine schedule's sampling part
    assert steps.max() <= 4e-3 and steps.min() < 0.5 * steps.max()


def _assert_resumes_to_the_same_draws(model, data, settings: dict, checkpoint, at: int) -> None:
    """Interrupt a checkpointed fit at the network's ``at``-th forward call, resume it: the draws of an
    uninterrupted fit, bit for bit."""
    Interrupting = type(model.net)
    full = bz.fit(model, *data, bz.SGMCMC(**settings), standardize=False)
    Interrupting.calls, Interrupting.at = 0, at
    with pytest.raises(KeyboardInterrupt):
        bz.fit(model, *data, bz.SGMCMC(checkpoint=checkpoint, **settings), standardize=False)
    Interrupting.at = 0
    resumed = bz.fit(model, *data, bz.SGMCMC(checkpoint=checkpoint, **settings), standardize=False)
    for k in full.samples:
        assert torch.equal(resumed.samples[k], full.samples[k]), k


def test_an_interrupted_sgmcmc_run_resumes_to_the_same_draws(blr_data, tmp_path, interrupting_mlp):
    Interrupting = interrupting_mlp
    model = bz.BNN(Interrupting(3, [4], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    settings = dict(
        kind="sghmc",
        step_size=5e-3,
        friction=5.0,
        batch_size=10,
        num_samples=30,
        thinning=2,
        burn_in=20,
        num_chains=2,
        checkpoint_every=15,
        progress=False,
    )
    _assert_resumes_to_the_same_draws(model, blr_data, settings, tmp_path / "ck.pt", at=110)  # chain 1, mid-way
    assert not (tmp_path / "ck.pt").exists()
    Interrupting.calls, Interrupting.at = 0, 30
    with pytest.raises(KeyboardInterrupt):
        bz.fit(model, *blr_data, bz.SGMCMC(checkpoint=tmp_path / "ck.pt", **settings), standardize=False)
    other = bz.BNN(bz.models.MLP(3, [7], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    with pytest.raises(
        bz.BnnZooError, match="belongs to a different fit"
    ):  # a stale checkpoint is refused, not resumed
        bz.fit(other, *blr_data, bz.SGMCMC(checkpoint=tmp_path / "ck.pt", **settings), standardize=False)


def test_bad_sgmcmc_settings_are_refused():
    with pytest.raises(bz.BnnZooError, match="SGMCMC kind must be one of .sgld., .sghmc., .cyclical."):
        bz.SGMCMC(kind="nuts")
    with pytest.raises(bz.BnnZooError, match="step_size > 0"):
        bz.SGMCMC(step_size=0)


@pytest.mark.parametrize("inference", ["svi", "sgld", "sghmc", "cyclical"])
def test_minibatches_of_128_are_the_default_above_a_thousand_training_rows(inference):
    from bnn_zoo.experiments import config as cfg
    from bnn_zoo.experiments.run import prepare

    def batch(data):
        config = cfg.RunConfig(
            data=data, model=cfg.REGISTRY["model"]["mlp"](), inference=cfg.REGISTRY["inference"][inference]()
        )
        return prepare(config, progress=False).method.batch_size

    assert batch(cfg.REGISTRY["data"]["digits"]()) == 128  # 1,347 training rows
    assert batch(cfg.REGISTRY["data"]["toy-cubic"]()) is None  # 20 rows: full batch


def correlated_regression():
    """(x, y, model, exact posterior): 40 rows, three inputs with correlations 0.83-0.95 (posterior
    condition number 59), a linear model with N(0, 1) weights and noise sd 0.5. The defaults test below
    and ``benchmarks/sgmcmc_real_tables.py --only blr`` fit it."""
    from bnn_zoo.evaluation.exact import linear_regression

    g = torch.Generator().manual_seed(3)
    z = torch.randn(40, 3, generator=g)
    x = torch.stack([z[:, 0], 0.95 * z[:, 0] + 0.3 * z[:, 1], 0.9 * z[:, 0] + 0.4 * z[:, 2]], 1)
    y = x @ torch.tensor([1.0, -0.5, 0.3]) + 0.2 + 0.5 * torch.randn(40, generator=g)
    exact = linear_regression(x, y, weight_scale=1.0, bias_scale=1.0, noise_scale=0.5)
    model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    return x, y, model, exact


# cyclical runs SGLD's step under a cyclical schedule (its exact-posterior check is slow too): slow lane
@pytest.mark.parametrize("kind", ["sgld", "sghmc", pytest.param("cyclical", marks=pytest.mark.slow)])
def test_every_kind_at_its_defaults_finds_a_correlated_posterior(kind):
    """No step size given, adapted over 2,000 burn-in steps (the default 5,000 only adds windows): 40
    rows, three inputs with correlations 0.83-0.95 (posterior condition number
    59). Means within 0.3 posterior sds and sds within 30% of the exact posterior; both tolerances are
    at least 2.5 Monte Carlo standard errors of these draws (the default 500 draws hold 70-300
    effective ones), so a pass is not luck and an unbiased chain fails with odds near 1% a value."""
    x, y, model, exact = correlated_regression()
    # 2,000 of the default 5,000
    post = bz.fit(model, x, y, bz.SGMCMC(kind=kind, burn_in=2000, num_chains=1, progress=False), standardize=False)
    draws, sd = _draws(post), exact.cov.diagonal().sqrt()
    assert torch.all(2.5 * _mcse(post) < 0.3 * sd) and torch.all(2.5 * _mcse_sd(post) < 0.3 * sd)
    assert torch.all((draws.mean(0) - exact.mean).abs() < 0.3 * sd), (draws.mean(0) - exact.mean) / sd
    assert torch.all((draws.std(0) / sd - 1).abs() < 0.3), draws.std(0) / sd


def test_an_adapted_run_interrupted_in_burn_in_resumes_to_the_same_draws(blr_data, tmp_path, interrupting_mlp):
    """The preconditioner, its window's running moments and the step size are in the checkpoint."""
    Interrupting = interrupting_mlp
    model = bz.BNN(Interrupting(3, [4], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    settings = dict(
        kind="sghmc", batch_size=10, num_samples=20, thinning=2, burn_in=100, checkpoint_every=7, progress=False
    )
    # in burn-in, between two windows
    _assert_resumes_to_the_same_draws(model, blr_data, settings, tmp_path / "ck.pt", at=200)


def test_adapted_sgmcmc_samples_a_learned_noise_with_the_weights():
    """The learned noise is a site of its own dtype beside the weights (the whitened frame keeps each
    site's dtype); its draws are positive and every draw is finite."""
    model = bz.BNN(bz.models.MLP(2, [5], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g)
    post = bz.fit(
        model,
        x,
        x.sum(1) + 0.3 * torch.randn(30, generator=g),
        bz.SGMCMC(kind="sghmc", burn_in=200, num_samples=20, progress=False),
        standardize=False,
    )
    assert all(torch.isfinite(v).all() for v in post.samples.values()) and (post.samples["noise_scale"] > 0).all()
