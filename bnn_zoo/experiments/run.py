"""One fit end to end: fit on the training split, score on the test split, write the result files."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bnn_zoo import arviz_compat, diagnostics, methods, resources
from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError
from bnn_zoo.evaluation import (
    calibration,
    classification_metrics,
    evidence,
    language_model_metrics,
    predictions,
    reference,
    regression_metrics,
)
from bnn_zoo.experiments.config import DEFAULT_LIKELIHOOD, Dropout, RunConfig, build_network, to_dict
from bnn_zoo.inference import collapse, fit, health
from bnn_zoo.inference.collapse import diagnose
from bnn_zoo.inference.defaults import batch_size
from bnn_zoo.io import announce, bar_disabled, save_dataset, writable_folder, write_json, write_yaml
from bnn_zoo.methods import Family
from bnn_zoo.posterior import function_space_draws


@dataclass
class Result:
    name: str
    posterior: object
    idata: object
    metrics: dict
    predictions: object = None  # xr.Dataset of test predictions (see test_predictions); None for language models


def run(
    name,
    dataset,
    model,
    method,
    out_dir=None,
    elbo_samples: int = 1000,
    evidence=(),
    ais_steps: int = 500,
    iw_k: int = 100,
    device=None,
    predict_samples=None,
    plots: bool = True,
) -> Result:
    """Fit ``model`` to ``dataset`` with ``method``; metrics and, with ``out_dir``, posterior.nc, metrics.json, plots.

    ``predict_samples`` posterior draws score each test point (default: every stored draw; more than
    are stored draws fresh ones from a guide, as Gal's T = 10,000 MC dropout passes do).

    ``evidence`` names extra log-evidence estimates on the training data: "ais" (annealed importance
    sampling, ``ais_steps`` temperatures, checkpointed to out_dir/ais_checkpoint.pt; any model) and
    "iw" (the importance-weighted bound with K = ``iw_k``; guides with a density), stored as
    evidence_ais(_se) and evidence_iw(_se).

    Every number is in the data's units (``*_at_mean``: one pass at the guide's mean weights, i.e.
    standard dropout for the dropout guide): the fit is ``bnn_zoo.fit``'s, which standardises what it fits.
    """
    announce(f"fitting {name} on {dataset.name}")
    posterior = fit(model, *dataset.train, method, device=device)
    if device is not None:
        posterior = posterior.to("cpu")  # metrics, plots and files are made on the CPU
    return evaluate(
        name,
        dataset,
        model,
        posterior,
        out_dir,
        elbo_samples,
        evidence,
        ais_steps,
        iw_k,
        predict_samples,
        plots,
        getattr(method, "progress", False),
    )


def evaluate(
    name,
    dataset,
    model,
    posterior,
    out_dir=None,
    elbo_samples=1000,
    evidence=(),
    ais_steps=500,
    iw_k=100,
    predict_samples=None,
    plots=True,
    progress=False,
    training_evidence=True,
    shift=False,
) -> Result:
    """Score a fitted posterior on the test split and the training data (see :func:`run`) and, with
    ``out_dir``, write its files. ``training_evidence=False`` skips the ELBO, LOO and ``evidence`` on
    the training data (a protocol's selection runs read only their held-out score). ``shift`` scores an
    image classifier on rotated and noised test images; a dataset holding out-of-distribution
    examples (``info["ood_x"]``) is scored on detecting them (:mod:`bnn_zoo.evaluation.shift`)."""
    announce(f"scoring {name} on {dataset.name}")
    x = dataset.train[0]
    x_test, y_test = dataset.test
    pred = None
    if model.likelihood.task == "language-model":  # (draws, N, T, V) outputs are too large to hold: averaged in chunks
        metrics = language_model_metrics(posterior.predictive_mean(x_test, predict_samples), y_test)
    else:
        pred = posterior.predict(x_test, num_samples=predict_samples)
        metrics = _test_metrics(pred, model, y_test, dataset)
        metrics.update(_shift_metrics(posterior, dataset, pred, shift, predict_samples))
    if hasattr(posterior.guide, "mean"):  # one pass at E_q[w]: standard dropout's weight scaling for the dropout guide
        at_mean = _test_metrics(posterior.predict(x_test, at_mean=True), model, y_test, dataset)
        metrics.update({f"{k}_at_mean": v for k, v in at_mean.items()})
    idata = posterior.to_inference_data()
    if training_evidence:
        metrics.update(_evidence(posterior, idata, elbo_samples))
        ais_checkpoint = None if out_dir is None else Path(out_dir) / "ais_checkpoint.pt"
        metrics.update(_extra_evidence(posterior, evidence, ais_steps, iw_k, progress, ais_checkpoint))
    metrics.update(
        runtime_s=posterior.runtime_s,
        data=dataset.name,
        n_train=int(posterior.x.shape[0]),
        n_test=int(x_test.shape[0]),
        settings=posterior.settings,
        **model.describe(),
        **posterior.units_attrs(),
    )
    if methods.traits_of(posterior).reference and pred is not None:  # can it serve as a reference posterior?
        f = pred.f if predict_samples is None else posterior.predict(x_test).f
        depth = posterior.sample_stats.get("tree_depth")  # NUTS's: (chains, draws)
        f = f.reshape(posterior.num_chains, -1, *f.shape[1:])
        metrics.update(reference.convergence(f, depth, posterior.settings.get("max_tree_depth")))
    if posterior.x.shape[0] < x.shape[0]:
        metrics["n_validation"] = int(x.shape[0] - posterior.x.shape[0])  # held out: early stopping, the band
    metrics.update({k: v for k, v in posterior.info.items() if v != ""})  # stop_reason, the fit's own warnings
    if model.likelihood.task == "regression" and "band_warning" not in metrics:
        band = health.band_on(pred, y_test)
        if band:
            metrics["band_warning"] = band
            warnings.warn(f"{name} on {dataset.name} has a band that cannot be trusted: {band}", stacklevel=2)
    if model.likelihood.task == "language-model":  # judged by the test perplexity; fit checked the others
        collapse = diagnose(posterior, metrics, len(dataset.info["vocab"]))
        if collapse:
            metrics["collapse_warning"] = collapse
            warnings.warn(f"{name} on {dataset.name} collapsed: {collapse}", stacklevel=2)
    result = Result(
        name,
        posterior,
        idata,
        metrics,
        None if pred is None else test_predictions(name, posterior, dataset, metrics, pred),
    )
    if out_dir is not None:
        save(result, Path(out_dir), plots, progress)
    return result


@dataclass
class Prepared:
    """A run config turned into what a fit needs, before anything trains."""

    config: RunConfig  # resolved: the data's default likelihood and SVI's guide written out
    dataset: object
    model: object
    method: object
    name: str
    out: Path | None

    @property
    def lockstep(self) -> bool:
        return bool(getattr(self.config.inference, "lockstep", False))

    def fit(self):
        """The fitted posterior, on the CPU (metrics, plots and files are made there)."""
        announce(f"fitting {self.name} on {self.dataset.name}")
        posterior = fit(self.model, *self.dataset.train, self.method, device=self.config.device)
        return posterior if self.config.device is None else posterior.to("cpu")

    def evaluate(self, posterior) -> Result:
        """Score and save a fitted posterior; the draws it makes start from the run's seed, so its metrics
        do not depend on what else ran in the process before it."""
        import pyro

        pyro.set_rng_seed(self.config.seed)
        ev = self.config.evaluation
        progress = getattr(self.method, "progress", False)
        if self.out is not None:
            write_yaml(to_dict(self.config), self.out / "config.yaml")
        result = evaluate(
            self.name,
            self.dataset,
            self.model,
            posterior,
            self.out,
            ev.elbo_samples,
            ev.evidence,
            ev.ais_steps,
            ev.iw_k,
            ev.predict_samples,
            ev.plots,
            progress,
            ev.training_evidence,
            ev.shift,
        )
        if self.out is not None:
            (self.out / "checkpoint.pt").unlink(missing_ok=True)  # the finished result supersedes it
        return result


def prepare(config: RunConfig, out_dir=None, progress: bool = True, resume: bool = False) -> Prepared:
    """Load the data and build the model and method a config names (every check runs here)."""
    from bnn_zoo import likelihoods

    config.check()
    out = None if out_dir is None else Path(out_dir)
    dataset = config.data.load(config.seed)
    if config.evaluation.calibrate:
        if not 0 < config.evaluation.calibrate < 1 or dataset.task == "language-model":
            raise BnnZooError(
                f"evaluation.calibrate is the fraction of training rows held out to calibrate a regressor or "
                f"classifier, in (0, 1); got {config.evaluation.calibrate} on {dataset.task} data"
            )
        dataset = dataset.calibration_part(config.evaluation.calibrate)
        held = len(dataset.info["calibration"][0])
        if dataset.task == "regression" and held < 9:  # ceil((n + 1) * 0.9) <= n needs n >= 9
            raise BnnZooError(
                f"{dataset.name}: --evaluation.calibrate {config.evaluation.calibrate} holds out {held} training rows; "
                "split-conformal 90% intervals need at least 9: hold out a larger fraction or use more data"
            )
    config = config.resolved(dataset)
    likelihood = config.likelihood.build(dataset)
    if likelihood.task != dataset.task:
        use = DEFAULT_LIKELIHOOD[dataset.task].registered_name
        raise BnnZooError(
            f"the likelihood is for {likelihood.task} but {dataset.name} is a {dataset.task} dataset; use {use}"
        )
    if config.evaluation.shift and ("image_shape" not in dataset.info or dataset.task != "classification"):
        raise BnnZooError(f"evaluation.shift scores image classifiers; {dataset.name} is not an image dataset")
    classes = (
        len(dataset.info["vocab"])
        if dataset.task == "language-model"
        else len(dataset.info.get("labels", ())) or int(dataset.y_train.max()) + 1  # a table names every class
    )
    checkpoint = None
    if out is not None:
        writable_folder(out)
        (out / "metrics.json").unlink(missing_ok=True)  # written last: until then the folder holds no finished run
        checkpoint = out / "checkpoint.pt"
        if not resume:  # a fresh run must not pick up an old run's state
            for stale in (checkpoint, out / "ais_checkpoint.pt"):
                stale.unlink(missing_ok=True)
    if getattr(config.model, "embedding_dropout", False) and not isinstance(config.guide, Dropout):
        warnings.warn(
            "the embedding-rnn's word-type dropout acts only under the dropout guide; this fit is the "
            f"lstm-{config.model.gates} model's",
            stacklevel=2,
        )
    if config.inference.bnn:
        out_features = likelihood.outputs(classes if isinstance(likelihood, likelihoods.Categorical) else 1)
        check_memory(config, dataset, lambda: build_network(config.model, dataset, out_features), out_features)
        net = build_network(config.model, dataset, out_features)
        check_scoring_time(config, dataset, net)
        model = BNN(net, config.prior.build(dataset, likelihood, config.guide), likelihood)
        config = config.for_model(model, dataset.x_train.shape[0])
    else:
        model = config.inference.model(config, likelihood, classes, dataset)
    method = config.inference.build(config, model, dataset, checkpoint, progress)
    name = config.inference.registered_name + (f"-{config.guide.registered_name}" if config.guide is not None else "")
    return Prepared(config, dataset, model, method, name, out)


def check_memory(config: RunConfig, dataset, build, out_features: int) -> None:
    """Refuse a run whose memory, estimated from its network built on the meta device, exceeds what the
    machine has: the weights, one training step, and the predictions the scoring holds at once (test
    draws, the collapse check's draws on the training rows; a language model's averaged test outputs)."""
    meta = resources.on_meta(build)
    if meta is None:
        return
    method, (n, n_test) = config.inference, (len(dataset.x_train), len(dataset.x_test))
    params, per_row = resources.footprint(meta, tuple(dataset.x_train.shape[1:]))
    copies, draws = methods.copies_of(method, method.method), methods.draws_of(method, method.method)
    if dataset.task == "language-model":  # (N, T, vocabulary) outputs, averaged over draws in place
        outputs = math.prod(dataset.x_test.shape[1:]) * out_features
        predictions = {"the test outputs' running average": 2 * n_test * outputs}
    else:
        predictions = {
            "the test predictions": draws * n_test * out_features,
            "the collapse check's predictions on the training rows": collapse.DRAWS * n * out_features,
        }
    rows = batch_size(getattr(method, "batch_size", None), n) if hasattr(method, "batch_size") else None
    resources.check_fit_memory(
        params,
        per_row,
        rows or n,
        copies,
        predictions,
        "use fewer rows, a smaller network, minibatches (--inference.batch_size) or fewer draws",
    )


def check_scoring_time(config: RunConfig, dataset, net) -> None:
    """Refuse a run whose scoring is estimated, from one timed forward pass of ``net``, to exceed
    evaluation.max_scoring_hours: the test predictions over every draw and, on the training rows, the
    InferenceData's predictive and log-likelihood draws, the collapse check and the ELBO."""
    ev, (x, y), n_test = config.evaluation, dataset.train, len(dataset.x_test)
    draws = methods.draws_of(config.inference, config.inference.method)
    passes = {"the test predictions": (ev.predict_samples or draws) * n_test}
    per_row = resources.seconds_per_row(net, x)
    if per_row is None or ev.max_scoring_hours is None:
        return
    with torch.no_grad():
        out = net(x[:2])
    if out.dim() < 2 or out.shape[0] != len(x[:2]):
        return  # no estimate from a network of the wrong shape: bz.fit refuses it, naming the shape, before fitting
    if ev.training_evidence:
        outputs = out[0].numel() * len(x)
        kept = min(draws, function_space_draws(y.numel(), outputs))
        passes["the InferenceData's draws on the training rows"] = 2 * int(kept) * len(x)
        if config.inference.takes_guide and not isinstance(config.guide, Dropout):  # the dropout guide has no ELBO
            passes["the ELBO on the training rows"] = ev.elbo_samples * len(x)
    if dataset.task != "language-model":
        passes["the collapse check"] = min(collapse.DRAWS, draws) * len(x)
    resources.check_scoring_time(
        per_row,
        passes,
        ev.max_scoring_hours,
        "use less data, fewer draws (--evaluation.predict_samples, --evaluation.elbo_samples), "
        "--evaluation.training_evidence false, or raise --evaluation.max_scoring_hours",
    )


def execute(config: RunConfig, out_dir=None, progress: bool = True, resume: bool = False) -> Result:
    """Fit and score the run ``config`` describes. With ``out_dir``: the result files of :func:`run` and
    the resolved ``config.yaml`` that re-runs it (``bnn-zoo fit --config DIR/config.yaml``). SVI,
    SG-MCMC, ChEES, ensembles and SWAG checkpoint to out_dir/checkpoint.pt; ``resume`` continues from it,
    otherwise it is discarded."""
    run = prepare(config, out_dir, progress, resume)
    return run.evaluate(run.fit())


def _test_metrics(pred, model, y_test, dataset):
    task = model.likelihood.task
    if task == "regression":
        return regression_metrics(pred, model.likelihood.check_targets(y_test, pred.f.shape[-1]))
    return (
        language_model_metrics(pred.mean, y_test) if task == "language-model" else classification_metrics(pred, y_test)
    )


def _shift_metrics(posterior, dataset, pred, shift: bool, predict_samples) -> dict:
    from bnn_zoo.evaluation import shift as shifts

    out = {}
    if shift:
        out.update(shifts.shifted_metrics(posterior, dataset, predict_samples))
    if "ood_x" in dataset.info:
        ood = posterior.predict(dataset.info["ood_x"], num_samples=predict_samples)
        out.update(shifts.ood_metrics(pred.draw_probs, ood.draw_probs))
    if "calibration" in dataset.info:
        out.update(_calibrated_metrics(posterior, dataset, pred, predict_samples))
    return out


def _calibrated_metrics(posterior, dataset, pred, predict_samples) -> dict:
    """Temperature scaling (classifiers) or split-conformal 90% intervals (regression), fitted on the
    calibration rows the fit did not see and scored on the test rows."""
    x_cal, y_cal = dataset.calibration
    cal = posterior.predict(x_cal, num_samples=predict_samples)
    y_test = dataset.test[1]
    if dataset.task == "classification":
        t = calibration.fit_temperature(cal.draw_probs.mean(0), y_cal)
        probs = calibration.temper(pred.draw_probs.mean(0), t)
        nll = -probs.gather(-1, y_test.long()[:, None]).clamp_min(1e-30).log().mean().item()
        return {
            "temperature": t,
            "nll_tempered": nll,
            "ece_tempered": calibration.expected_calibration_error(probs, y_test),
        }
    y_cal, y_test = (y.reshape(len(y), -1) for y in (y_cal, y_test))
    conformal = calibration.SplitConformal.fit(cal.mean, cal.variance.sqrt(), y_cal, alpha=0.1)
    lower, upper = conformal.interval(pred.mean, pred.variance.sqrt())
    covered = ((y_test >= lower) & (y_test <= upper)).to(y_test.dtype).mean().item()
    width = (upper - lower).mean().item()
    return {"conformal_coverage_90": covered, "conformal_width_90": width}


def _evidence(posterior, idata, elbo_samples):
    out = evidence.of(posterior, elbo_samples)  # a type-II label reaches metrics with the rest of info
    log_lik = arviz_compat.group(idata, "log_likelihood")
    draws = log_lik.sizes["chain"] * log_lik.sizes["draw"]
    traits = methods.traits_of(posterior)
    if traits.stores == "points" or draws < 2:  # K point estimates, or one draw: too few to importance-sample
        return out
    several = log_lik.sizes["chain"] > 1  # one chain: ArviZ's r_eff is 1
    weights = _chain_draws(arviz_compat.group(idata, "posterior")) if several else None
    loo = arviz_compat.loo(idata, diagnostics.loo_relative_efficiency(weights, draws) if several else None)
    if loo.pareto_k is None:
        out["loo_warning"] = "ArviZ could not smooth the importance weights: no LOO estimate"
    else:
        out.update(loo_elpd=loo.elpd, loo_se=loo.se, loo_max_pareto_k=float(np.max(loo.pareto_k)))
        if loo.warning:
            out["loo_warning"] = "some Pareto k are high: LOO is unreliable for those points"
    if traits.family is Family.CHAINS:  # the weights' R-hat; the fit's own check did f's (health)
        weights = _chain_draws(arviz_compat.group(idata, "posterior")) if weights is None else weights
        rhat, ess = diagnostics.rhat_and_ess_bulk(weights, rhat=posterior.num_chains > 1)
        if rhat is not None:
            out["max_rhat"] = diagnostics.nanmax(rhat)
        out["min_ess_bulk"] = diagnostics.nanmin(ess)
    return out


def _chain_draws(ds) -> torch.Tensor:
    """Every variable of a Dataset of draws as one tensor (chain, draw, quantities)."""
    return torch.cat([torch.from_numpy(ds[v].values).reshape(*ds[v].shape[:2], -1) for v in ds.data_vars], 2)


def _extra_evidence(posterior, names, ais_steps, iw_k, progress, ais_checkpoint):
    out = {}
    if "iw" in names:
        out["evidence_iw"], out["evidence_iw_se"] = evidence.importance_weighted(posterior, k=iw_k, num_repeats=10)
    if "ais" in names:
        seed = int(posterior.settings.get("seed", 0))
        out["evidence_ais"], out["evidence_ais_se"] = evidence.ais(
            posterior, num_steps=ais_steps, seed=seed, progress=progress, checkpoint=ais_checkpoint
        )
    return out


def test_predictions(name, posterior, dataset, metrics, pred):
    """What the comparison plots need, in original units, from the test-set prediction ``pred``
    (:func:`bnn_zoo.evaluation.predictions.test_predictions`); for 1-D regression also the predictive
    mean and 2.5/25/75/97.5% quantiles on a grid. (Language models keep none: token probabilities are
    too large.)"""
    attrs = {
        "name": name,
        "task": posterior.model.likelihood.task,
        "model": metrics.get("model", ""),
        "method": posterior.method,
        **{k: metrics[k] for k in ("rmse", "test_log_likelihood", "accuracy", "nll") if k in metrics},
        **posterior.units_attrs(),
    }
    regression = attrs["task"] == "regression"
    ds = predictions.test_predictions(pred, dataset.y_test, attrs)
    if regression and dataset.in_features == 1 and "quantile" in ds:
        x_all = torch.cat([dataset.x_train, dataset.x_test])[:, 0]
        lo, hi = x_all.min().item(), x_all.max().item()
        grid = torch.linspace(lo - 0.25 * (hi - lo), hi + 0.25 * (hi - lo), 200)[:, None]
        band = posterior.predict(grid)
        quantile = ds["quantile"]  # its name is also the grid's quantile dimension: assigned after it, as files have it
        ds = ds.drop_vars("quantile").assign(
            x_test=("obs", dataset.x_test[:, 0].numpy()),
            x_grid=("grid", grid[:, 0].numpy()),
            grid_mean=("grid", band.mean[:, 0].numpy()),
            grid_quantile=(("grid", "quantile"), band.quantiles([0.025, 0.25, 0.75, 0.975])[..., 0].T.numpy()),
            x_train=("train", dataset.x_train[:, 0].numpy()),
            y_train=("train", dataset.y_train.reshape(-1).numpy()),
        )
        ds = ds.assign(quantile=quantile)
        ds.attrs["truth"] = "x^3" if dataset.name == "toy-cubic" else ""
    return ds


def save(result: Result, out_dir: Path, with_plots: bool = True, progress: bool = False):
    """The saved posterior (loadable with ``bnn_zoo.load``), metrics.json, predictions.nc (all written
    atomically) and the run's plots, a bar step each: compressing a large posterior takes minutes."""
    from tqdm.auto import tqdm

    from bnn_zoo.evaluation import plots

    def draw():
        if result.predictions is not None and "x_grid" in result.predictions:
            plots.predictive_bands([result.predictions], out_dir / "predictive.png")
        plots.diagnostics(result.name, result.idata, out_dir)

    steps = {"posterior.nc and state.pt": lambda: result.posterior.save(out_dir, idata=result.idata)}
    if result.predictions is not None:
        steps["predictions.nc"] = lambda: save_dataset(result.predictions, out_dir / "predictions.nc")
    if with_plots:
        steps["plots"] = draw
    steps["metrics.json"] = lambda: write_json(result.metrics, out_dir / "metrics.json")  # last: says all is written
    with tqdm(total=len(steps), desc=f"writing {out_dir}", unit="file", disable=bar_disabled(progress)) as bar:
        for what, write in steps.items():
            announce(f"writing {what} to {out_dir}")  # the heartbeat's line where no bar shows
            bar.set_postfix_str(what)
            write()
            bar.update()
