"""A fit reads its own diagnostics (bnn_zoo.inference.health): an over-confident band and an unconverged chain
each warn in one line and stay in posterior.info, on data made here. That a
converged NUTS fit does not warn is checked on Bayesian linear regression (test_ground_truth.py)."""

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.inference import health
from bnn_zoo.posterior import Prediction


def _standard_normal(n: int) -> Prediction:
    return Prediction(torch.zeros(1, n, 1), {}, bz.likelihoods.Gaussian(scale=1.0))


@pytest.mark.parametrize(
    ("sd", "verdict"),
    [(1.0, ""), (3.0, "over-confident"), (0.2, "under-confident")],
)
def test_a_band_is_judged_by_its_held_out_coverage(sd, verdict):
    """400 targets from N(0, sd^2) against the predictive N(0, 1): the 90% band covers 0.90 of them at sd 1
    (binomial sd 0.015, far inside [0.75, 0.98]), 0.41 at sd 3 and all of them at sd 0.2."""
    y = sd * torch.randn(400, generator=torch.Generator().manual_seed(0))
    sentence = health.band_on(_standard_normal(400), y)
    assert (verdict in sentence) if verdict else sentence == ""


def test_a_few_rows_inside_the_band_are_no_evidence_of_under_confidence():
    # 20 of 20 inside happens to a calibrated band one time in eight (0.9^20)
    assert health.band_on(_standard_normal(20), torch.zeros(20)) == ""
    assert "100% of 200" in health.band_on(_standard_normal(200), torch.zeros(200))


def test_an_over_confident_dropout_fit_warns_from_its_validation_rows():
    """A noise fixed far below the data's (sd 0.05 against 1) makes the band 20 times too narrow. The
    dropout guide learning p (a regression's default) holds out a tenth of the rows, never trained on,
    and the fit says what they show."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 1, generator=gen)
    y = x[:, 0] + torch.randn(200, generator=gen)
    model = bz.BNN(bz.models.MLP(1, [8]), likelihood=bz.likelihoods.Gaussian(scale=0.05))
    with pytest.warns(
        UserWarning, match="svi fit has a band that cannot be trusted: its 90% band covers .* of 20 valid"
    ):
        posterior = bz.fit(model, x, y, bz.SVI(guide="dropout", steps=300, progress=False))
    assert len(posterior.x) == 180 and "over-confident" in posterior.info["band_warning"]


def test_an_unconverged_sgmcmc_fit_warns():
    gen = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, 100)[:, None]
    y = x[:, 0] ** 3 + 0.3 * torch.randn(100, generator=gen)
    with pytest.warns(UserWarning, match=r"this sgmcmc fit has not converged: R-hat of f \d\.\d+ > 1.05"):
        short = bz.fit(bz.BNN(bz.models.MLP(1, [20])), x, y, bz.SGMCMC(burn_in=100, num_samples=20, progress=False))
    assert short.info["max_rhat_function"] > health.RHAT_MAX and "burn_in" in short.info["convergence_warning"]


def test_an_ensemble_holds_out_rows_to_judge_its_band():
    """Friedman #1 in a price's units: five MAP networks of 50 units fit 270 rows below the noise, and
    their mixture's 90% band covers 21 of the 30 rows held out by default, which a calibrated band does
    one time in 500. validation=0 trains on every row."""
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=300, noise=1.0, random_state=0)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(50_000 + 1_000 * y, dtype=torch.float32)
    with pytest.warns(UserWarning, match="ensemble fit has a band that cannot be trusted: .* of 30 validation"):
        posterior = bz.fit(bz.BNN(bz.models.MLP(10, [50])), x, y, bz.Ensemble(progress=False))
    assert len(posterior.x) == 270 and "over-confident" in posterior.info["band_warning"]
    every_row = bz.Ensemble(members=1, steps=10, validation=0.0, progress=False)
    assert len(bz.fit(bz.BNN(bz.models.MLP(10, [50])), x, y, every_row).x) == 300


def test_ensembles_report_their_draws_as_independent_and_multiswag_its_members_disagreement():
    """A deep ensemble's ESS is its member count; MultiSWAG's is members x draws, with the R-hat of f across
    members beside it. Members started apart on a curve of 40 rows disagree off the data, so that R-hat is
    above the chains' threshold, and it is no warning: an ensemble's members are meant to differ."""
    x = torch.linspace(-2, 2, 40)[:, None]
    y = torch.sin(2 * x[:, 0])
    model = bz.BNN(bz.models.MLP(1, [8]), likelihood=bz.likelihoods.Gaussian(scale=0.1))
    ensemble = bz.fit(model, x, y, bz.Ensemble(members=3, steps=50, validation=0.0, progress=False))
    assert ensemble.info["min_ess_bulk_function"] == 3 and "max_rhat_function" not in ensemble.info
    swag = bz.SWAG(members=2, steps=60, snapshots=4, rank=2, num_draws=8, validation=0.0, progress=False)
    multiswag = bz.fit(model, x, y, swag)
    assert multiswag.info["min_ess_bulk_function"] == 16 and multiswag.info["max_rhat_function"] > health.RHAT_MAX
    assert "convergence_warning" not in multiswag.info
