"""One conformance suite over every registered inference method (bnn_zoo.methods), the SVI guide library and
the method docs/extending.md defines, on a regression and a classification table: a method added to the
registry is checked here with no test written for it.

Each method fits with its ``quick`` settings; the fit must then give predictions and an InferenceData in the
data's units, round-trip through save and load to the same predictions, carry only the evidence its
``evidence`` trait names (a finite ELBO where it stores a guide with a density), refuse bad input in one line,
and pass the installed ArviZ's own functions (same dims for y in the predictive, observed and log-likelihood
groups, MCMC sample_stats under ArviZ's names). A method that keeps a checkpoint, stopped by its time limit,
says so in one line and resumes to the uninterrupted fit (tests/test_resume.py stops each at random moments)."""

import dataclasses
import math
import re
import sys
import types
import warnings
from pathlib import Path

import arviz as az
import matplotlib
import numpy as np
import pytest
import torch

import bnn_zoo as bz
import bnn_zoo.inference  # noqa: F401  (registers the zoo's methods)
from bnn_zoo import arviz_compat, guides, methods
from bnn_zoo.inference import defaults
from bnn_zoo.methods import Family

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EXTENDING = Path(__file__).parent.parent / "docs" / "extending.md"


def _docs_method() -> None:
    """Import the docs' example method as module ``mymethods``, as a reader would: it registers itself."""
    if "mymethods" not in sys.modules:
        code = re.findall(r"```python\n(# mymethods.py\n.*?)```", EXTENDING.read_text(), flags=re.S)[0]
        module = types.ModuleType("mymethods")
        sys.modules["mymethods"] = module
        exec(compile(code, str(EXTENDING), "exec"), module.__dict__)


_docs_method()
CASES = {name: (cls, {}) for name, cls in methods.registered().items()}
CASES |= {f"svi-{g}": (bz.SVI, {"guide": g}) for g in guides.GUIDES if g != defaults.guide("dense")}  # "svi" has it
LOCATION, SCALE = 50.0, 10.0  # the regression targets' units: far from standardised ones


def _method(cls, options):
    return cls(**getattr(cls, "quick", {}) | options, **({"progress": False} if "progress" in _fields(cls) else {}))


def _data(task):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 1, generator=g) * 4 - 2
    if task == "regression":
        return x, LOCATION + SCALE * (torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(30, generator=g))
    return x, (x[:, 0] + 0.3 * torch.randn(30, generator=g) > 0).long()


def _model(cls, task):
    if cls.fits == "gp":
        if task == "regression":
            return bz.GP("rbf")
        return bz.GP("rbf", likelihood=bz.likelihoods.Categorical(), num_classes=2, num_inducing=10)
    likelihood = bz.likelihoods.Gaussian.learned() if task == "regression" else bz.likelihoods.Categorical()
    return bz.BNN(bz.models.MLP(1, [4], 1 if task == "regression" else 2), bz.priors.FanInNormal(), likelihood)


TASKS = ["regression", "classification"]


FITTED = {}  # (name, task) -> the fit: the resume check's uninterrupted fit where this worker made it


def _fit(name, task, **more):
    cls, options = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short fits may collapse or not converge: conformance is checked
        return bz.fit(_model(cls, task), *_data(task), _method(cls, options | more))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", CASES)
def test_every_method_conforms(name, task, tmp_path):
    """One fit, every check in turn (one fit per case, whichever test worker runs it)."""
    cls, _ = CASES[name]
    x, y = _data(task)
    posterior = FITTED[name, task] = _fit(name, task)
    _answers_in_the_data_units(posterior, cls, x, y)
    _loads_to_the_same_predictions(posterior, x, tmp_path)
    _carries_the_evidence_its_traits_name(posterior)
    _passes_arviz_functions(posterior, cls)


def _answers_in_the_data_units(posterior, cls, x, y):
    assert posterior.method == cls.name and posterior.settings["method"] == cls.name
    pred = posterior.predict(x)
    if pred.likelihood.task == "regression":  # standardised predictions would sit near 0, five sds away
        assert abs(pred.mean.mean().item() - LOCATION) < 2 * SCALE, pred.mean.mean()
        observed = arviz_compat.group(posterior.to_inference_data(), "observed_data")["y"].values
        assert np.allclose(observed.reshape(-1), y.numpy(), atol=1e-4)
    else:
        assert torch.allclose(pred.mean.sum(-1), torch.ones(len(x)), atol=1e-4)


def _loads_to_the_same_predictions(posterior, x, tmp_path):
    posterior.save(tmp_path / "fit")
    again = bz.load(tmp_path / "fit")
    assert again.method == posterior.method
    assert torch.equal(again.predict(x).f, posterior.predict(x).f)


def _carries_the_evidence_its_traits_name(posterior):
    traits = methods.traits_of(posterior)
    own = posterior.own_evidence(50)
    assert set(own) - {"elbo_se"} <= set(traits.evidence), (own, traits.evidence)
    assert all(math.isfinite(v) for v in own.values()), own
    if traits.stores == "guide" and getattr(posterior.guide, "has_density", True):
        assert "elbo" in own


def _fields(cls) -> set:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()


WHOLE_CHAINS = {"nuts", "hmc"}  # checkpointed a finished chain at a time (bnn_zoo.inference.driver.FinishedChains)
RESUMABLE = [name for name, (cls, _) in CASES.items() if {"checkpoint", "max_hours"} <= _fields(cls)]


@pytest.mark.parametrize("name", RESUMABLE)
def test_a_stopped_fit_resumes_to_the_uninterrupted_one(name, tmp_path, monkeypatch):
    """Past its time limit at the first check (no grace period here), the fit stops with one line that
    names its checkpoint where it kept one, and the same fit run again ends where the uninterrupted one does."""
    from bnn_zoo.inference import budget

    x, _ = _data("regression")
    full = FITTED.get((name, "regression")) or _fit(name, "regression")
    checkpoint = tmp_path / "checkpoint.pt"
    monkeypatch.setattr(budget, "GRACE_S", 0.0)
    with pytest.raises(budget.TimeLimitExceeded) as stopped:
        _fit(name, "regression", checkpoint=checkpoint, max_hours=1e-9)
    said = str(stopped.value)
    assert "\n" not in said and "raise max_hours" in said, said
    assert ("the same fit resumes it" in said) == checkpoint.exists(), said
    # a method that steps saves its first step; NUTS and HMC keep whole chains, none finished at the first check
    assert checkpoint.exists() or name in WHOLE_CHAINS, f"{name} stopped without saving what it had done"
    assert torch.equal(_fit(name, "regression", checkpoint=checkpoint).predict(x).f, full.predict(x).f)
    assert not checkpoint.exists()  # the result supersedes it


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_in_one_line(name):
    cls, options = CASES[name]
    model, (x, y) = _model(cls, "regression"), _data("regression")
    x[3, 0] = float("nan")
    for bad in [(model, x, y, _method(cls, options)), (model, *_data("regression"), cls)]:
        with pytest.raises(bz.BnnZooError) as refused:
            bz.fit(*bad)
        assert "\n" not in str(refused.value), str(refused.value)


def _passes_arviz_functions(posterior, cls):
    idata = posterior.to_inference_data()
    assert (
        idata.posterior_predictive["y"].dims[2:] == idata.observed_data["y"].dims == idata.log_likelihood["y"].dims[2:]
    )
    if "sample_stats" in arviz_compat.group_names(idata):
        assert all(v.dims[:2] == ("chain", "draw") for v in idata.sample_stats.data_vars.values()), idata.sample_stats
    weights = ["layers.1.bias"] if cls.fits == "bnn" else None
    draws = idata.posterior_predictive.sizes["chain"] * idata.posterior_predictive.sizes["draw"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k and few-draw warnings: the calls must run, not be good
        az.summary(idata)
        if arviz_compat.MAJOR >= 1:
            _arviz_1(idata, weights, draws)
        else:
            assert np.isfinite(az.loo(idata).elpd_loo)
            assert np.isfinite(az.loo_pit(idata, y="y")).all()
            az.compare({"a": idata, "b": idata})
            az.plot_trace(idata, var_names=weights)
            az.plot_posterior(idata, var_names=weights)
            az.plot_ppc(idata, num_pp_samples=min(20, draws))
        if cls.reference:  # HMC-family stats under ArviZ's names
            assert {"lp", "acceptance_rate", "step_size", "diverging", "energy"} <= set(idata.sample_stats)
            az.plot_energy(idata)
            bfmi = az.bfmi(idata)
            assert np.isfinite(bfmi["energy"] if arviz_compat.MAJOR >= 1 else bfmi).all()
        if cls.family is Family.CHAINS:  # the fit's own health check read R-hat and ESS off its draws
            assert "max_rhat_function" in posterior.info or posterior.num_draws < 4
    plt.close("all")


def _arviz_1(idata, weights, draws):
    """ArviZ 1.x's own functions. Its PSIS refuses what 0.2x smoothed (a point whose log-likelihood is
    the same in every draw, as a saturated classifier's can be; fewer than about 25 draws, as an
    ensemble's 3): it raises, and bnn-zoo's LOO is then NaN and flagged."""
    try:
        assert np.isfinite(az.loo(idata).elpd)
    except (ValueError, IndexError) as refused:
        assert re.search("tail values are the same|at least 5|out of bounds", str(refused)), refused
        assert np.isnan(arviz_compat.loo(idata).elpd) and arviz_compat.loo(idata).warning
    else:
        assert np.isfinite(az.loo_pit(idata)["y"]).all()
        az.compare({"a": idata, "b": idata})
    with az.rc_context({"plot.max_subplots": 100}):  # the GP classifier's f: 2 classes x 30 points
        az.plot_trace(idata, var_names=weights)
        az.plot_dist(idata, var_names=weights)
    az.plot_ppc_dist(idata, num_samples=min(20, draws))
