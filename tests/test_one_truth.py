"""One truth from every door: the same fit gives the same numbers, in the data's units, whether it came
from ``bnn-zoo fit``, ``bz.fit`` or ``bz.load``; every function that takes targets takes (N,) and (N, 1)
alike; the evidence of raw arrays is the fitted model's; a classifier's inputs are standardised by both
doors; ``bz.BNN(net)`` is the command line's default model. The relations are exact (the same seed, the
same arithmetic), so they are checked to float tolerance."""

import contextlib
import json
import math
import warnings

import numpy as np
import pyro
import pytest
import torch
import xarray as xr

import bnn_zoo as bz
from bnn_zoo import arviz_compat
from bnn_zoo.cli import main
from bnn_zoo.data import tables
from bnn_zoo.errors import BnnZooError
from bnn_zoo.evaluation import regression_metrics
from bnn_zoo.io import load_inference_data


def _prices(n=120, d=5, seed=0):
    """Friedman #1 in a price's units: a target of mean about 64,000 and sd about 5,000; inputs on scales
    from 1 to 1,000."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, d, generator=g)
    f = 10 * torch.sin(math.pi * u[:, 0] * u[:, 1]) + 20 * (u[:, 2] - 0.5) ** 2 + 10 * u[:, 3] + 5 * u[:, 4]
    y = 50_000 + 1_000 * (f + torch.randn(n, generator=g))
    return u * torch.logspace(0, 3, d), y


@pytest.fixture(scope="module")
def cli_fit(tmp_path_factory):
    """A price table fitted by ``bnn-zoo fit --data csv`` at the defaults (SVI, mean-field), shortened."""
    folder = tmp_path_factory.mktemp("prices")
    x, y = _prices()
    table = folder / "prices.csv"
    header = ",".join([f"x{i}" for i in range(x.shape[1])] + ["price"])
    np.savetxt(table, torch.cat([x, y[:, None]], 1).numpy(), delimiter=",", header=header, comments="")
    out = folder / "run"
    argv = ["fit", "--data", "csv", "--data.path", str(table), "--data.target", "price"]
    assert (
        main([*argv, "--inference.steps", "400", "--evaluation.elbo_samples", "200", "--out", str(out), "--quiet"]) == 0
    )
    return tables.load_table(table, "price"), out


def test_a_command_line_folder_predicts_its_own_predictions_from_python(cli_fit):
    data, out = cli_fit
    with xr.open_dataset(out / "predictions.nc", engine="h5netcdf") as ds:
        folder_mean = torch.as_tensor(ds["mean"].values)
        assert ds.attrs["units"] == "data's units"
    again = bz.load(out)
    assert torch.allclose(again.predict(data.x_test).mean[:, 0], folder_mean, rtol=1e-5)
    assert abs(float(folder_mean.mean()) - float(data.y_test.mean())) < 0.5 * float(data.y_test.std())


def test_the_command_line_and_python_give_the_same_fit_and_the_same_numbers(cli_fit):
    """bz.fit with the command line's model (bz.BNN's defaults) and seed: every metric equal."""
    data, out = cli_fit
    metrics = json.loads((out / "metrics.json").read_text())
    model = bz.BNN(bz.models.MLP(data.in_features))
    assert {k: metrics[k] for k in ("model", "prior", "likelihood")} == model.describe()
    posterior = bz.fit(model, *data.train, bz.SVI(steps=400, seed=0, progress=False))
    pyro.set_rng_seed(0)  # as the command line scores
    test = regression_metrics(posterior.predict(data.x_test), data.y_test)
    idata = posterior.to_inference_data()
    elbo, _ = posterior.elbo(num_samples=200)
    loo = arviz_compat.loo(idata)
    for name, value in [("rmse", test["rmse"]), ("test_log_likelihood", test["test_log_likelihood"])]:
        assert metrics[name] == pytest.approx(value, rel=1e-5), name
    assert metrics["elbo"] == pytest.approx(elbo, rel=1e-5) and metrics["loo_elpd"] == pytest.approx(loo.elpd, rel=1e-5)
    assert metrics["units"] == "data's units" and "inputs and targets" in metrics["fitted_on"]
    folder = load_inference_data(out / "posterior.nc")
    observed = float(arviz_compat.group(folder, "observed_data")["y"].mean())
    assert observed == pytest.approx(float(data.y_train.mean()), rel=1e-5)  # the data's units, not 0
    assert arviz_compat.group(folder, "posterior").attrs["units"] == "data's units"


@pytest.fixture(scope="module")
def fits():
    """A regression and a classifier, each fitted briefly by Laplace (draws stored) and SVI (a guide)."""
    x, y = _prices(n=60)
    labels = (y > y.median()).long()
    quick = {"progress": False, "seed": 0}
    regression = bz.BNN(bz.models.MLP(5, [8]))
    classifier = bz.BNN(bz.models.MLP(5, [8], 2), likelihood=bz.likelihoods.Categorical())
    out = {}
    for task, model, targets in (("regression", regression, y), ("classification", classifier, labels)):
        for name, method in (("laplace", bz.Laplace(map_steps=200, **quick)), ("svi", bz.SVI(steps=200, **quick))):
            with _quiet():
                out[task, name] = (bz.fit(model, x, targets, method), x, targets)
    return out


@contextlib.contextmanager
def _quiet():
    """Short fits may warn (collapse, LOO): only their numbers are checked here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("method", ["laplace", "svi"])
def test_every_function_that_takes_targets_gives_the_same_for_n_and_n_by_1(fits, task, method):
    posterior, x, y = fits[task, method]
    flat, column = y, y[:, None]
    pred = posterior.predict(x[:20])
    assert torch.equal(pred.log_likelihood(flat[:20]), pred.log_likelihood(column[:20]))
    assert pred.log_likelihood(flat[:20]).shape == (20,)
    assert torch.equal(posterior.log_likelihood(x, flat), posterior.log_likelihood(x, column))
    if task == "regression":
        assert pred.cdf(flat[:20]).shape == (20, 1) and torch.equal(pred.cdf(flat[:20]), pred.cdf(column[:20]))
    with pytest.raises(BnnZooError, match="one target per input"):
        pred.log_likelihood(flat[:10])
    tables_ = [bz.compare([posterior], test=(x, t)) for t in (flat, column)]
    key = "rmse" if task == "regression" else "accuracy"
    assert tables_[0][key].iloc[0] == tables_[1][key].iloc[0]
    ais = bz.evidence.ais(posterior, x, flat, num_steps=3, num_particles=2, seed=0)
    assert ais == bz.evidence.ais(posterior, x, column, num_steps=3, num_particles=2, seed=0)
    if method == "svi":
        for fn in (posterior.elbo, lambda a, b: bz.evidence.importance_weighted(posterior, a, b, k=5)):
            values = []
            for t in (flat, column):
                torch.manual_seed(0)
                values.append(fn(x, t))
            assert values[0] == values[1]


def test_the_evidence_of_raw_arrays_is_the_fitted_models():
    """ais(model, x, y) standardises as bz.fit does: equal to AIS on the data standardised by hand (a fixed
    noise in the data's units there in standardised units), less N log y_sd."""
    x, y = _prices(n=40)
    s = float(y.std())
    hand = bz.BNN(bz.models.MLP(5, [4]), likelihood=bz.likelihoods.Gaussian(0.3))
    raw = bz.BNN(hand.net, likelihood=bz.likelihoods.Gaussian(0.3 * s))
    settings = {"num_steps": 20, "num_particles": 4, "seed": 0}
    estimate, se = bz.evidence.ais(raw, x, y, **settings)
    zx, zy = (x - x.mean(0)) / x.std(0), (y - y.mean()) / s
    by_hand, se_hand = bz.evidence.ais(hand, zx, zy, standardize=False, **settings)
    assert estimate == pytest.approx(by_hand - len(y) * math.log(s), rel=1e-5) and se == pytest.approx(
        se_hand, rel=1e-4
    )  # float32 rounding


def test_a_classifier_is_standardised_by_both_doors_and_bad_flags_are_refused():
    x, y = _prices(n=60)
    labels = (y > y.median()).long()
    model = bz.BNN(bz.models.MLP(5, [8], 2), likelihood=bz.likelihoods.Categorical())
    method = bz.SVI(steps=100, seed=0, progress=False)
    with _quiet():
        own = bz.fit(model, x, labels, method)
        hand = bz.fit(model, (x - x.mean(0)) / x.std(0), labels, method, standardize=False)
    assert (
        own.scaling is not None
        and own.scaling.y_std is None
        and own.units_attrs()["fitted_on"].startswith("standardised inputs ")
    )
    assert torch.allclose(own.predict(x).probs, hand.predict((x - x.mean(0)) / x.std(0)).probs, atol=1e-6)
    for flag in ("no", 1, None):
        with pytest.raises(BnnZooError, match="standardize must be True or False"):
            bz.fit(model, x, labels, method, standardize=flag)


def test_bz_bnn_defaults_are_the_command_lines_model():
    from bnn_zoo.experiments import config
    from bnn_zoo.experiments.run import prepare

    for argv in (["--data", "digits", "--model", "cnn"], ["--data", "toy-text", "--model", "lstm-untied"]):
        p = config.parser()
        run = prepare(config.from_argv(p, argv), progress=False)
        model = bz.BNN(run.model.net, likelihood=bz.likelihoods.Categorical())
        assert model.describe() == run.model.describe()  # (a regression's: see the command-line fit above)


def test_a_fixed_noise_is_stated_in_the_datas_units():
    """Gaussian(sigma) on data in its own units is sigma in those units: the predictive's noise variance."""
    x, y = _prices(n=60)
    model = bz.BNN(bz.models.MLP(5, [8]), likelihood=bz.likelihoods.Gaussian(2_000.0))
    with _quiet():
        post = bz.fit(model, x, y, bz.Laplace(map_steps=50, progress=False))
    assert float(post.predict(x[:5]).noise_variance.mean()) == pytest.approx(2_000.0**2, rel=1e-5)
    assert "Gaussian(scale=2000.0)" == post.model.describe()["likelihood"]


def test_one_name_per_quantity_in_metrics_json_python_and_the_table(tmp_path):
    """A Laplace fit from the command line (toy-cubic's known noise: the declared model's evidence): what
    Python calls each number (evidence.of, info, the test metrics) is its key in metrics.json and its
    column in bz.compare, with the same value."""
    from bnn_zoo.evaluation import evidence

    out = tmp_path / "laplace"
    assert main(["fit", "--inference", "laplace", "--inference.map_steps", "100", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    post = bz.load(out)
    data = bz.data.toy_cubic()
    python = {**evidence.of(post), **{k: v for k, v in post.info.items() if v != ""}}
    python.update(regression_metrics(post.predict(data.x_test), data.y_test))
    assert "evidence_laplace" in python and set(python) <= set(metrics), set(python) - set(metrics)
    for key, value in python.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5) if isinstance(value, float) else metrics[key] == value
    table = bz.compare([out])
    assert table["evidence_laplace"].iloc[0] == pytest.approx(python["evidence_laplace"])


def test_several_outputs_work_with_arvizs_own_functions():
    """Three targets on their own scales: log_likelihood holds each value's density (summing to the
    posterior's per-datum one), so az.loo, az.loo_pit and the predictive checks pair it with observed_data."""
    import arviz as az

    x, y = _prices(n=40)
    y3 = torch.stack([y, x[:, 0], x[:, 1] ** 2], 1)
    with _quiet():
        post = bz.fit(bz.BNN(bz.models.MLP(5, [8], 3)), x, y3, bz.Laplace(map_steps=100, progress=False))
        idata = post.to_inference_data()
        pit = az.loo_pit(idata)["y"] if arviz_compat.MAJOR >= 1 else az.loo_pit(idata, y="y")
        elpd = arviz_compat.loo(idata).elpd
    values = arviz_compat.group(idata, "log_likelihood")["y"]
    assert values.dims == ("chain", "draw", "obs", "y_dim_1") and tuple(pit.shape) == (40, 3) and math.isfinite(elpd)
    # the learned noise is one standardised sd: in the data's units, one per target
    assert post.info["noise_scale"] == pytest.approx(
        [post.samples["noise_scale"].mean().item() * s for s in y3.std(0).tolist()], rel=1e-4
    )
    kept = torch.as_tensor(values["draw"].values)
    per_datum = torch.as_tensor(values.values).double().sum(-1)
    assert torch.allclose(per_datum, post.log_likelihood()[:, kept].double(), rtol=1e-5)


def test_a_folder_from_before_folders_stored_their_scaling_says_so_on_load(cli_fit, tmp_path):
    import shutil

    _, out = cli_fit
    old = shutil.copytree(out, tmp_path / "old")
    metrics = json.loads((old / "metrics.json").read_text())
    (old / "metrics.json").write_text(json.dumps({k: v for k, v in metrics.items() if k not in ("units", "fitted_on")}))
    state = torch.load(old / "state.pt", weights_only=True)
    torch.save({**state, "scaling": None}, old / "state.pt")
    with pytest.warns(UserWarning, match="before result folders stored their scaling.*bnn-zoo fit --config"):
        bz.load(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bz.load(out)  # a folder that stores its scaling loads without a word
