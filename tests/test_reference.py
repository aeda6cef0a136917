"""Scores against a reference posterior (bnn_zoo.evaluation.reference) against their closed forms, the
convergence verdict, and compare(reference=...) from Python and the command line."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr

import bnn_zoo as bz
from bnn_zoo.cli import main
from bnn_zoo.evaluation import reference
from bnn_zoo.posterior import Prediction

N = 200


def _gaussian_predictions(mean: float, sd: float, seed: int = 0) -> xr.Dataset:
    """What predictions.nc holds for a predictive N(mean, sd^2) at every one of N test points."""
    pred = Prediction(torch.full((1, N, 1), mean), {}, bz.likelihoods.Gaussian(sd))
    q = reference.predictive_quantiles(pred, seed=seed)[..., 0]
    return xr.Dataset(
        {
            "y": ("obs", np.zeros(N)),
            "sd": ("obs", pred.variance.sqrt()[:, 0].numpy()),
            "quantile": (("obs", "level"), q.T.numpy()),
        }
    )


def test_w2_between_two_gaussians_is_the_closed_form():
    """W2(N(1, 2^2), N(0, 1)) = sqrt(1^2 + (2 - 1)^2). Over 20 seeds the estimate's sd is 0.002 and the
    100-level midpoint rule, which leaves out the outer half-percent tails, is 0.005 low: 0.012 is 3
    sds beyond that bias."""
    distance = reference.scores(_gaussian_predictions(1.0, 2.0, seed=1), _gaussian_predictions(0.0, 1.0, seed=2))
    assert distance["w2"] == pytest.approx(math.sqrt(2.0), abs=0.012)
    assert distance["variance_ratio"] == pytest.approx(4.0, rel=1e-5)  # from the stored sds: exact


def test_w2_of_a_distribution_to_itself_is_the_monte_carlo_floor():
    """Two sets of Y_DRAWS draws of N(0, 1) differ by their sample quantiles' noise: Var q_p = p (1 - p)
    / (n phi(z_p)^2) per run, so the expected W2 is about sqrt(mean_p 2 Var q_p), 0.038."""
    p = reference.QUANTILE_LEVELS
    density = (
        torch.distributions.Normal(0.0, 1.0)
        .log_prob(torch.distributions.Normal(0.0, 1.0).icdf(p.float()))
        .exp()
        .double()
    )
    floor = float((2 * p * (1 - p) / (reference.Y_DRAWS * density**2)).mean().sqrt())
    same = reference.scores(_gaussian_predictions(0.0, 1.0, seed=3), _gaussian_predictions(0.0, 1.0, seed=4))
    assert same["w2"] == pytest.approx(floor, rel=0.2) and same["variance_ratio"] == pytest.approx(1.0, rel=1e-5)


def test_variance_ratio_by_region_names_where_a_method_is_overconfident():
    truth, method = _gaussian_predictions(0.0, 1.0), _gaussian_predictions(0.0, 1.0)
    wide = np.linspace(0.5, 3.0, N)  # the reference grows uncertain; the method stays at sd 1
    truth["sd"] = ("obs", wide)
    distance = reference.scores(method, truth)
    certain, uncertain = wide[: N // 3], wide[-(N // 3) :]
    assert distance["variance_ratio_certain"] == pytest.approx(np.exp(np.mean(-2 * np.log(certain))), rel=1e-6)
    assert distance["variance_ratio_uncertain"] == pytest.approx(np.exp(np.mean(-2 * np.log(uncertain))), rel=1e-6)
    assert distance["variance_ratio_uncertain"] < 1 < distance["variance_ratio_certain"]


def test_agreement_and_total_variation_for_classifiers():
    y = np.array([0, 1, 2, 0])
    p = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.2, 0.3], [1.0, 0.0, 0.0]])
    q = np.array([[0.5, 0.4, 0.1], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [1.0, 0.0, 0.0]])
    distance = reference.scores(
        xr.Dataset({"y": ("obs", y), "probs": (("obs", "class"), p)}),
        xr.Dataset({"y": ("obs", y), "probs": (("obs", "class"), q)}),
    )
    assert distance["agreement"] == 0.5
    assert distance["total_variation"] == pytest.approx((0.1 + 0.4 + 0.4 + 0.0) / 4)


def test_scores_refuse_other_test_data():
    other = _gaussian_predictions(0.0, 1.0)
    other["y"] = ("obs", np.ones(N))
    with pytest.raises(bz.BnnZooError, match="the reference was scored on other test data"):
        reference.scores(_gaussian_predictions(0.0, 1.0), other)


def test_convergence_verdict():
    g = torch.Generator().manual_seed(0)
    mixed = torch.randn(4, 1000, 5, generator=g)
    verdict = reference.convergence(mixed)
    assert verdict["reference_converged"] and verdict["max_rhat_test_f"] < 1.01 and verdict["min_ess_bulk_test_f"] > 400
    stuck = mixed + torch.arange(4.0)[:, None, None]  # every chain in its own place
    verdict = reference.convergence(stuck)
    assert not verdict["reference_converged"] and "R-hat of f" in verdict["reference_note"]
    verdict = reference.convergence(mixed[:2])
    assert not verdict["reference_converged"] and verdict["reference_note"].startswith("2 chains < 4")


def test_convergence_says_why_it_failed():
    """Chains stationary in separate modes are told apart from chains that drift (the R-hat of f between
    each chain's halves), and NUTS trajectories capped at the maximum tree depth are counted."""
    g = torch.Generator().manual_seed(0)
    mixed = torch.randn(4, 1000, 5, generator=g)
    apart = reference.convergence(mixed + torch.arange(4.0)[:, None, None])
    assert apart["max_rhat_within_chain_test_f"] < 1.01
    assert "each chain is stationary in a mode of its own" in apart["reference_note"]
    drifting = torch.randn(4, 1000, 5, generator=g).cumsum(1)  # random walks: no chain is stationary
    depth = torch.full((4, 1000), 10)
    depth[:, :250] = 7
    verdict = reference.convergence(drifting, depth, max_tree_depth=10)
    assert verdict["max_rhat_within_chain_test_f"] > 1.1
    assert "not even each chain has mixed" in verdict["reference_note"]
    assert "75% of transitions at the maximum tree depth 10" in verdict["reference_note"]
    assert "tree depth" not in reference.convergence(mixed, depth, max_tree_depth=10)["reference_note"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A converged ChEES reference, an unconverged one and a mean-field fit of the toy problem."""
    root = tmp_path_factory.mktemp("runs")
    quick = ["--quiet", "--evaluation.plots", "false"]
    chees = ["--inference", "chees", "--inference.backend", "torch"]
    long, short = ["--inference.num_warmup", "200", "--inference.num_samples", "400"], ["--inference.num_warmup", "20"]
    assert main(["fit", *quick, *chees, *long, "--inference.num_chains", "8", "--out", str(root / "ref")]) == 0
    # refused for its chain count whatever its length
    assert (
        main(
            [
                "fit",
                *quick,
                *chees,
                *short,
                "--inference.num_samples",
                "20",
                "--inference.num_chains",
                "2",
                "--out",
                str(root / "short"),
            ]
        )
        == 0
    )
    assert main(["fit", *quick, "--inference.steps", "500", "--out", str(root / "svi")]) == 0
    return root


def test_compare_scores_every_run_against_the_reference(runs):
    table = bz.compare([runs / "svi", runs / "ref"], reference=runs / "ref").set_index("run")
    assert table.loc["ref", "w2"] == 0 and table.loc["ref", "variance_ratio"] == pytest.approx(1.0)
    assert table.loc["svi", "w2"] > 0 and np.isfinite(table.loc["svi", "variance_ratio"])


def test_an_unconverged_reference_is_refused_in_one_line(runs, capsys):
    assert main(["compare", str(runs / "svi"), "--reference", str(runs / "short"), "--out", str(runs / "cmp")]) == 2
    err = capsys.readouterr().err
    assert "short cannot serve as a reference posterior: 2 chains < 4" in err and err.count("\n") == 1
    assert main(["compare", str(runs / "ref"), "--reference", str(runs / "svi"), "--out", str(runs / "cmp")]) == 2
    assert "svi cannot serve as a reference posterior: it is not an MCMC run" in capsys.readouterr().err


def test_an_unconverged_reference_scores_when_asked_and_every_row_says_so(runs, capsys):
    out = runs / "cmp-unconverged"
    argv = ["compare", str(runs / "svi"), "--reference", str(runs / "short"), "--out", str(out)]
    assert main([*argv, "--reference-unconverged"]) == 0
    table = pd.read_csv(out / "comparison.csv")
    assert np.isfinite(table["w2"]).all() and table["reference_unconverged"].str.startswith("2 chains < 4").all()


def test_posteriors_from_fit_compare_against_a_reference_posterior_on_test_data():
    """The objects bz.fit returns, in the data's units, scored as folders are: test metrics, and W2 to a
    reference posterior (here two short NUTS chains: unconverged, refused unless allowed)."""
    g = torch.Generator().manual_seed(0)
    x = 40 + 10 * torch.randn(60, 1, generator=g)
    y = 500 + 100 * torch.sin(x[:, 0] / 10) + 10 * torch.randn(60, generator=g)
    model = bz.BNN(bz.models.MLP(1, [10], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    svi = bz.fit(model, x[:40], y[:40], bz.SVI(steps=500, num_draws=200, progress=False))
    nuts = bz.fit(model, x[:40], y[:40], bz.NUTS(num_warmup=30, num_samples=30, init=svi, progress=False))
    test = (x[40:], y[40:])
    with pytest.raises(bz.BnnZooError, match="cannot serve as a reference posterior: 2 chains < 4.*allow_unconverged"):
        bz.compare([svi], reference=nuts, test=test)
    with pytest.raises(bz.BnnZooError, match="pass test=\\(x_test, y_test\\)"):
        bz.compare([svi], reference=nuts, allow_unconverged=True)
    table = bz.compare([svi, nuts], reference=nuts, test=test, allow_unconverged=True).set_index("run")
    assert table.loc["nuts", "w2"] == 0 and table.loc["svi-mean-field", "w2"] > 0
    assert 5 < table.loc["svi-mean-field", "rmse"] < 60  # in the data's units (target sd about 70)
    assert table["reference_unconverged"].str.contains("2 chains < 4").all()
    assert "elbo" in table and np.isfinite(table.loc["svi-mean-field", "elbo"])
