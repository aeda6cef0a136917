"""bnn_zoo.compare: the table, ArviZ's Pareto-k warning, result folders on disk and their errors."""

import numpy as np
import pytest
import xarray as xr

import bnn_zoo as bz
from bnn_zoo import arviz_compat
from bnn_zoo.evaluation.compare import report, to_markdown
from bnn_zoo.experiments.run import Result


def _result(name, log_lik, **metrics):
    samples = ("chain", "draw")
    idata = arviz_compat.inference_data(
        {
            "posterior": xr.Dataset({"w": (samples, np.zeros((2, log_lik.shape[1])))}),
            "log_likelihood": xr.Dataset({"y": ((*samples, "obs"), log_lik)}),
            "observed_data": xr.Dataset({"y": (("obs",), np.zeros(log_lik.shape[-1]))}),
        }
    )
    return Result(
        name,
        None,
        idata,
        {
            "data": "toy",
            "n_train": log_lik.shape[-1],
            "model": "MLP(in_features=1, hidden=[50])",
            "settings": {"method": "svi", "guide": "mean-field"},
            **metrics,
        },
    )


def _heavy_tailed(rng, mean=-1.2):
    """Pointwise log-likelihoods with one point whose importance ratios 1 / p(y_0 | theta) have a Pareto
    tail of known shape k = 1.5: its LOO is unreliable."""
    log_lik = rng.normal(mean, 0.1, size=(2, 500, 30))
    log_lik[..., 0] = -1.5 * rng.exponential(size=(2, 500)) - 1
    return log_lik


def test_compare_ranks_runs_and_flags_high_pareto_k():
    rng = np.random.default_rng(0)
    good = rng.normal(-1.0, 0.1, size=(2, 500, 30))
    fair = rng.normal(-1.1, 0.1, size=(2, 500, 30))
    with pytest.warns(UserWarning, match="Pareto"):
        table = bz.compare(
            [
                _result("good", good, elbo=-40.0, elbo_se=0.1, rmse=1.0),
                _result("bad", _heavy_tailed(rng, -0.5), elbo=-45.0, rmse=2.0),  # the best LOO, but unreliable
                _result("fair", fair, rmse=1.5),
            ]
        )
    by_run = table.set_index("run")
    assert list(table["run"][:2]) == ["good", "fair"] and list(table["rank"][:2]) == [0, 1]
    assert set(by_run.loc[["good", "fair"], "ranked_by"]) == {"loo"}
    # a flagged LOO gets no rank and no weight, and says why
    assert np.isnan(by_run.loc["bad", "rank"]) and np.isnan(by_run.loc["bad", "weight"])
    assert by_run.loc["bad", "unranked"].startswith("LOO unreliable (worst Pareto k")
    assert by_run.loc["bad", "max_pareto_k"] > 0.7 and by_run.loc["bad", "loo_warning"]
    assert not by_run.loc["good", "loo_warning"]
    assert by_run.loc["good", "weight"] + by_run.loc["fair", "weight"] == pytest.approx(1.0)
    assert table.loc[0, "loo_elpd"] == pytest.approx(arviz_compat.loo(_result("g", good).idata).elpd)
    assert table.loc[0, "architecture"] == "MLP(1, [50])" and table.loc[0, "inference"] == "svi (mean-field)"
    assert {"waic_elpd", "waic_se", "elpd_diff", "weight", "elbo", "rmse"} <= set(table.columns)
    assert "evidence_ais" not in table  # columns no run has are dropped


def test_a_five_draw_ensemble_is_ranked_by_test_log_likelihood_not_by_its_loo():
    """Five members are five draws: ArviZ cannot smooth their importance weights (Pareto k inf or NaN).
    Its LOO looks best here; with test data every run is ranked by test log-likelihood instead, under
    either ArviZ major, with no stacking weights."""
    rng = np.random.default_rng(1)
    ensemble = rng.normal(-0.2, 0.01, size=(5, 1, 30))
    nuts = rng.normal(-1.0, 0.1, size=(2, 500, 30))
    with pytest.warns(UserWarning, match="LOO is unreliable for ensemble"):
        table = bz.compare(
            [
                _result("ensemble", ensemble, test_log_likelihood=-27.1, rmse=2.0),
                _result("nuts", nuts, test_log_likelihood=-8.7, rmse=1.4),
            ]
        )
    assert list(table["run"]) == ["nuts", "ensemble"] and list(table["rank"]) == [0, 1]
    assert set(table["ranked_by"]) == {"test_log_likelihood"}
    assert "weight" not in table and table.set_index("run").loc["ensemble", "loo_warning"]
    with pytest.warns(UserWarning, match="LOO is unreliable for ensemble"):  # classifiers: by their test NLL
        classifiers = bz.compare([_result("ensemble", ensemble, nll=0.2), _result("nuts", nuts, nll=0.3)])
    assert list(classifiers["run"]) == ["ensemble", "nuts"] and set(classifiers["ranked_by"]) == {"test_log_likelihood"}


def test_markdown_table_by_hand():
    import pandas as pd

    assert (
        to_markdown(pd.DataFrame({"run": ["a"], "x": [1.23456], "y": [float("nan")]}))
        == "| run | x | y |\n|---|---|---|\n| a | 1.235 |  |\n"
    )


def test_result_folders_with_problems_are_refused(tmp_path):
    with pytest.raises(bz.BnnZooError, match="no metrics.json"):
        bz.compare([tmp_path])
    (tmp_path / "metrics.json").write_text("{not json")
    with pytest.raises(bz.BnnZooError, match="not valid JSON"):
        bz.compare([tmp_path])
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "posterior.nc").write_bytes(b"truncated")
    with pytest.raises(bz.BnnZooError, match="truncated or corrupt"):
        bz.compare([tmp_path])
    with pytest.raises(bz.BnnZooError, match="nothing to compare"):
        report([], tmp_path / "out")


def test_reliability_diagram_for_classifiers_and_regressors(tmp_path):
    import xarray as xr

    from bnn_zoo.evaluation import plots

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=200)
    labels = np.array([rng.choice(3, p=p) for p in probs])
    classifier = xr.Dataset({"probs": (("obs", "class"), probs), "y": ("obs", labels)}, attrs={"name": "calibrated"})
    regressor = xr.Dataset({"pit": ("obs", rng.uniform(size=200))}, attrs={"name": "regression"})
    plots.reliability([classifier, regressor], tmp_path / "reliability.png")
    assert (tmp_path / "reliability.png").stat().st_size > 10_000
