"""Evidence estimators against the exact log evidence of Bayesian linear regression (conftest's blr_*)."""

import math

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.evaluation import evidence
from bnn_zoo.evaluation.exact import linear_regression


@pytest.fixture(scope="module")
def mean_field(blr_model, blr_data):
    return bz.fit(
        blr_model,
        *blr_data,
        bz.SVI(steps=1500, lr=0.05, lr_decay=0.02, num_particles=16, seed=0, progress=False),
        standardize=False,
    )


def test_ais_is_within_half_a_nat_and_its_error_bar_covers_the_truth(blr_model, blr_data, blr_exact):
    est, se = evidence.ais(blr_model, *blr_data, num_steps=300, num_particles=16, seed=0, standardize=False)
    assert 0 < se < 0.4
    assert abs(est - blr_exact.log_evidence) < min(0.5, 3 * se), (est, se, blr_exact.log_evidence)


def test_ais_integrates_a_learned_noise_scale(blr_data):
    """Noise sd ~ HalfNormal(1) is sampled on the log scale: compare with 1-D quadrature of the exact
    evidence over the noise scale."""
    x, y = blr_data
    model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned())
    sd = torch.linspace(0.05, 3, 2000, dtype=torch.float64)
    log_evidence = torch.tensor(
        [linear_regression(x, y, 1.0, 1.0, float(s)).log_evidence for s in sd], dtype=torch.float64
    )
    truth = (
        torch.logsumexp(log_evidence + torch.distributions.HalfNormal(1.0).log_prob(sd), 0) + math.log(sd[1] - sd[0])
    ).item()
    est, se = evidence.ais(model, x, y, num_steps=500, num_particles=16, seed=1, standardize=False)
    assert abs(est - truth) < min(0.5, 3 * se), (est, se, truth)


def test_importance_weighted_bound_rises_with_k_and_stays_below_the_evidence(mean_field, blr_exact):
    bounds = [evidence.importance_weighted(mean_field, k=k, num_repeats=200) for k in (1, 10, 100)]
    elbo, elbo_se = evidence.elbo(mean_field, num_samples=4000)
    assert elbo + 4 * elbo_se < blr_exact.log_evidence
    assert abs(bounds[0][0] - elbo) < 4 * bounds[0][1]  # L_1 is the ELBO
    for (lo, lo_se), (hi, hi_se) in zip(bounds, bounds[1:]):
        assert hi - lo > 2 * math.hypot(lo_se, hi_se), bounds
    assert bounds[-1][0] + 2 * bounds[-1][1] < blr_exact.log_evidence, (bounds, blr_exact.log_evidence)
    # K = 100 closes over half the gap
    assert blr_exact.log_evidence - bounds[-1][0] < 0.5 * (blr_exact.log_evidence - elbo)


def test_ais_accepts_a_fitted_posterior(mean_field, blr_exact):
    est, se = evidence.ais(mean_field, num_steps=100, num_particles=8, seed=0)
    assert abs(est - blr_exact.log_evidence) < 1.0


def test_evidence_refuses_what_it_cannot_estimate(blr_model, blr_data):
    dropout = bz.fit(blr_model, *blr_data, bz.SVI(guide="dropout", steps=5, progress=False), standardize=False)
    with pytest.raises(bz.BnnZooError, match="log q"):
        evidence.importance_weighted(dropout, k=10)
    with pytest.raises(bz.BnnZooError, match="num_repeats >= 2"):
        evidence.importance_weighted(
            bz.fit(blr_model, *blr_data, bz.SVI(steps=5, progress=False), standardize=False), k=10, num_repeats=1
        )
    with pytest.raises(bz.BnnZooError, match="log_marginal_likelihood"):
        evidence.ais(bz.GP(), *blr_data)
    with pytest.warns(
        UserWarning, match="of HMC moves were accepted"
    ):  # steps far too long: particles stay at their prior draws
        evidence.ais(blr_model, *blr_data, num_steps=3, step_size=1e3)
    with pytest.raises(bz.BnnZooError, match="needs data"):
        evidence.ais(blr_model)
    with pytest.raises(bz.BnnZooError, match="NaN"):
        evidence.ais(blr_model, blr_data[0], blr_data[1] * float("nan"))


def test_ais_resumes_from_its_checkpoint_exactly(blr_model, blr_data, tmp_path, monkeypatch):
    """Ctrl-C during AIS saves the last completed temperature; running again ends where an uninterrupted run ends."""
    settings = dict(num_steps=60, num_particles=4, seed=3)
    uninterrupted = evidence.ais(blr_model, *blr_data, **settings)
    path, real_move, calls = tmp_path / "ais.pt", evidence._hmc_move, []

    def interrupted_move(*args):
        calls.append(1)
        if len(calls) == 40:
            raise KeyboardInterrupt
        return real_move(*args)

    monkeypatch.setattr(evidence, "_hmc_move", interrupted_move)
    with pytest.raises(KeyboardInterrupt):
        evidence.ais(blr_model, *blr_data, **settings, checkpoint=path)
    monkeypatch.setattr(evidence, "_hmc_move", real_move)
    assert path.exists()
    with pytest.raises(bz.BnnZooError, match="delete it"):  # a checkpoint of another run is refused
        evidence.ais(blr_model, *blr_data, num_steps=60, num_particles=8, seed=3, checkpoint=path)
    assert evidence.ais(blr_model, *blr_data, **settings, checkpoint=path) == uninterrupted
    assert not path.exists()  # the finished estimate supersedes it
