"""Runs side by side: one table of architecture, inference, evidence, LOO (az.compare, with its Pareto-k
warnings), WAIC, test metrics and run time, from fitted results or from result folders on disk."""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path

import pandas as pd
import xarray as xr

from bnn_zoo import arviz_compat, methods
from bnn_zoo.data.validation import check_data
from bnn_zoo.errors import BnnZooError, checked
from bnn_zoo.evaluation import evidence, predictions
from bnn_zoo.evaluation import reference as ref
from bnn_zoo.evaluation.metrics import classification_metrics, regression_metrics
from bnn_zoo.inference import health
from bnn_zoo.io import load_inference_data
from bnn_zoo.posterior import PosteriorLike

EVIDENCE = [
    "elbo",
    "elbo_se",
    "evidence_iw",
    "evidence_iw_se",
    "evidence_ais",
    "evidence_ais_se",
    "evidence_laplace",
    "evidence_laplace_type_ii",
    "type_ii",  # what a type-II Laplace fitted: its evidence is of that prior, not the declared one
    "log_marginal_likelihood",
]
TEST = [
    "rmse",
    "test_log_likelihood",
    "coverage_50",
    "coverage_90",
    "coverage_95",
    "accuracy",
    "nll",
    "brier",
    "ece",
    "mce",
    "expected_accuracy",
    "entropy",
    "mutual_information",
    "perplexity",
    "rmse_at_mean",
    "accuracy_at_mean",
    "nll_at_mean",
    "nll_tempered",
    "ece_tempered",
    "conformal_coverage_90",
    "conformal_width_90",
    "ood_auroc_entropy",
    "ood_auroc_mutual_information",
    "ood_auroc_max_probability",
    "ood_fpr95_entropy",
]
DIAGNOSTICS = [
    "max_rhat",
    "min_ess_bulk",
    "max_rhat_function",
    "min_ess_bulk_function",
    "divergences",
    *health.WARNINGS,
]


class _Loaded:
    """A result read back from its folder: the same fields compare() uses on a fitted Result."""

    def __init__(self, folder: Path):
        self.name = folder.name
        metrics_path = folder / "metrics.json"
        if not metrics_path.is_file():
            raise BnnZooError(
                f"{folder} has no metrics.json; pass folders written by `bnn-zoo fit --out DIR` or `bnn-zoo demo`"
            )
        try:
            self.metrics = json.loads(metrics_path.read_text())
        except json.JSONDecodeError as exc:
            raise BnnZooError(
                f"{metrics_path} is not valid JSON ({exc.msg} at line {exc.lineno}); re-run the fit"
            ) from None
        if not isinstance(self.metrics, dict):
            raise BnnZooError(
                f"{metrics_path} holds a JSON {type(self.metrics).__name__}, not the mapping of metrics a fit writes; "
                "re-run the fit"
            )
        self.idata = load_inference_data(folder / "posterior.nc")
        path = folder / "predictions.nc"
        self.predictions = load_predictions(path) if path.is_file() else None


def load_predictions(path):
    """A result folder's predictions.nc (test predictions in original units), read into memory."""
    try:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            return ds.load()
    except Exception as exc:
        raise BnnZooError(f"{path} is not a readable netCDF file ({type(exc).__name__}); re-run the fit") from None


class _Scored:
    """A posterior from ``bnn_zoo.fit``, scored here with the fields compare() uses on a Result: its
    evidence and InferenceData always; test metrics and predictions with ``test`` data (the data's units)."""

    def __init__(self, posterior, test=None):
        settings = posterior.settings
        self.name = settings["method"] + (f"-{settings['guide']}" if settings.get("guide") else "")
        self.idata = posterior.to_inference_data()
        self.metrics = {
            "settings": settings,
            **posterior.model.describe(),
            "n_train": len(posterior.x),
            "runtime_s": posterior.runtime_s,
            **posterior.units_attrs(),
            **{k: v for k, v in posterior.info.items() if isinstance(v, str | int | float) and v != ""},
            **evidence.of(posterior),
        }
        self.predictions = None
        if test is not None:
            self._score(posterior, *test)

    def _score(self, posterior, x, y):
        x, y = check_data(posterior.model, x, y)
        pred = posterior.predict(x)
        task = pred.likelihood.task
        self.metrics.update(regression_metrics(pred, y) if task == "regression" else classification_metrics(pred, y))
        self.metrics["n_test"] = len(y)
        if task == "regression" and not self.metrics.get("band_warning"):
            self.metrics["band_warning"] = health.band_on(pred, y)
        attrs = {"name": self.name, "task": task, "model": self.metrics.get("model", ""), "method": posterior.method}
        attrs.update(posterior.units_attrs())
        self.predictions = predictions.test_predictions(pred, y, attrs)
        if methods.traits_of(posterior).reference:  # can it serve as a reference posterior?
            f = pred.f.reshape(posterior.num_chains, -1, *pred.f.shape[1:])
            depth = posterior.sample_stats.get("tree_depth")
            self.metrics.update(ref.convergence(f, depth, posterior.settings.get("max_tree_depth")))


def load_results(results, test: tuple | None = None) -> list:
    """Fitted ``Result`` objects pass through; paths are read as result folders; posteriors from
    ``bnn_zoo.fit`` are scored (on ``test`` = (x, y) when given). Names are made unique."""
    loaded = [_result(r, test) for r in results]
    if not loaded:
        raise BnnZooError("nothing to compare: pass at least one result or result folder")
    names = [r.name for r in loaded]
    for i, r in enumerate(loaded):
        if names.count(r.name) > 1:
            r.name = f"{r.name}-{i}"
    return loaded


def _result(r, test=None):
    if hasattr(r, "idata"):
        return r
    if isinstance(r, str | os.PathLike):
        return _Loaded(Path(r))
    if isinstance(r, PosteriorLike):
        return _Scored(r, test)
    raise BnnZooError(
        f"compare takes posteriors from bnn_zoo.fit, result folders (bnn-zoo fit --out DIR) or Results of "
        f"bnn_zoo.experiments.run.execute, not a {type(r).__name__}"
    )


@checked
def compare(
    results: list, reference: object | None = None, test: tuple | None = None, allow_unconverged: bool = False
) -> pd.DataFrame:
    """One row per run: run, data, model (architecture), inference, the log-evidence estimates with SEs,
    LOO elpd/SE/p_loo and the worst Pareto k, WAIC with its SE, test metrics, diagnostics (R-hat, ESS,
    divergences and the fit's own warnings: :mod:`bnn_zoo.inference.health`) and run time.

    Runs on the same training data are ranked (``rank``, 0 best), and ``ranked_by`` says by what. By
    ``az.compare``'s PSIS-LOO (with elpd_diff, dse and stacking weight) when every run's LOO is reliable;
    a warning names the runs whose Pareto k exceed ArviZ's threshold (0.7 at most) or whose LOO could
    not be computed, and the ``loo_warning`` column marks them. Such a LOO is never ranked or weighted:
    with test data for every run, all runs are ranked by test log-likelihood instead (no weights);
    without, only the reliable runs are ranked by LOO, and ``unranked`` gives the others' reason.

    Every number is in the data's units (the ``units`` column; a folder written before folders said so
    holds its evidence of the standardised targets, and says "standardised targets").

    Args:
        results: posteriors from ``bnn_zoo.fit``, result folders (posterior.nc and metrics.json, as
            ``bnn-zoo fit --out`` writes them) or ``bnn_zoo.experiments.run.Result`` objects.
        reference: a converged MCMC run of the same model and data (any of the above): each run's
            predictions are scored against it (:mod:`bnn_zoo.evaluation.reference`: W2 and the
            predictive variance ratios for regression, agreement and total variation for classifiers).
        test: (x_test, y_test) in the data's units, which posteriors from ``bnn_zoo.fit`` are scored on
            (test metrics, and the distances to ``reference``); folders and Results carry their own.
        allow_unconverged: score against a reference that did not converge; every row then names it in
            a ``reference_unconverged`` column (why it failed), beside the distances.

    Returns:
        The comparison table, one row per run.
    """
    runs = load_results(results, test)
    distances = _against_reference(runs, reference, test, allow_unconverged) if reference is not None else {}
    table = pd.DataFrame([_row(r, distances.get(r.name, {})) for r in runs])
    unreliable = table.loc[table["loo_warning"], "run"].tolist()
    if unreliable:
        warnings.warn(
            f"LOO is unreliable for {', '.join(unreliable)}: some Pareto k exceed ArviZ's threshold (or the importance "
            "weights could not be smoothed); see the max_pareto_k column",
            UserWarning,
            stacklevel=2,
        )
    flagged = table.loc[table["band_warning"].fillna("").astype(bool), "run"].tolist()
    if flagged:
        warnings.warn(f"the bands of {', '.join(flagged)} cannot be trusted; see the band_warning column", stacklevel=2)
    ranked = _ranked(runs, table)
    if ranked is not None:
        table = table.merge(ranked, left_on="run", right_index=True, how="left")
        table = table.sort_values("rank") if "rank" in table else table
    return table.dropna(axis=1, how="all").reset_index(drop=True)


def _row(r, distances: dict) -> dict:
    """One run's row of the comparison table."""
    m = r.metrics
    settings = m.get("settings", {})
    detail = settings.get("guide") or settings.get("kernel")  # SVI's guide, a GP's kernel
    inference = settings.get("method", "?") + (f" ({detail})" if detail else "")
    with warnings.catch_warnings():  # flagged in the loo_warning / waic_warning columns instead
        warnings.simplefilter("ignore", UserWarning)
        loo, waic = arviz_compat.loo(r.idata), arviz_compat.waic(r.idata)
    return {
        "run": r.name,
        "data": m.get("data", ""),
        "architecture": architecture(m.get("model", "")),
        "model": m.get("model", ""),
        "inference": inference,
        **{k: m.get(k) for k in EVIDENCE},
        # a folder written before its metrics said so holds the evidence of its standardised targets
        "units": m.get("units", "standardised targets" if "rmse" in m else "as given"),
        "loo_elpd": loo.elpd,
        "loo_se": loo.se,
        "p_loo": loo.p,
        "max_pareto_k": math.nan if loo.pareto_k is None else float(loo.pareto_k.max()),
        "loo_warning": loo.warning,
        "waic_elpd": waic.elpd,
        "waic_se": waic.se,
        "waic_warning": waic.warning,
        **{k: m.get(k) for k in TEST + DIAGNOSTICS},
        "runtime_s": m.get("runtime_s"),
        "n_train": m.get("n_train"),
        **distances,
    }


def _ranked(runs: list, table: pd.DataFrame) -> pd.DataFrame | None:
    """The ranking columns (see :func:`compare`) of two or more runs fitted to the same training data;
    None otherwise."""
    if len(runs) < 2 or table["data"].nunique() != 1 or table["n_train"].nunique() != 1:
        return None
    reliable = table["loo_elpd"].map(math.isfinite) & ~table["loo_warning"].astype(bool)
    # per test point: a regression's test LL, a classifier's -NLL
    test_ll = pd.to_numeric(table["test_log_likelihood"]).fillna(-pd.to_numeric(table["nll"]))
    if not reliable.all() and test_ll.map(_finite).all():
        rank = test_ll.rank(ascending=False, method="min").astype(int) - 1
        return pd.DataFrame({"rank": rank.values, "ranked_by": "test_log_likelihood"}, index=table["run"])
    names = table.loc[reliable, "run"].tolist()
    out = pd.DataFrame(index=table["run"])
    if len(names) >= 2:
        scored = arviz_compat.compare({r.name: r.idata for r in runs if r.name in names})
        out = out.join(scored[["rank", "elpd_diff", "dse", "weight"]])
        out.loc[names, "ranked_by"] = "loo"
    why = table.set_index("run")["max_pareto_k"].map(
        lambda k: f"LOO unreliable (worst Pareto k {k:.2f})" if math.isfinite(k) else "LOO could not be computed"
    )
    out.loc[~reliable.values, "unranked"] = why[~reliable.values]
    return out


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _against_reference(runs: list, reference, test=None, allow_unconverged: bool = False) -> dict:
    """Each run's :func:`~bnn_zoo.evaluation.reference.scores` against ``reference``, by run name; with
    ``allow_unconverged``, an unconverged reference's note marks every row."""
    (truth,) = load_results([reference], test)
    missing = [r.name for r in [truth, *runs] if r.predictions is None]
    if missing:
        raise BnnZooError(
            f"{', '.join(missing)} have no test predictions to score against the reference: pass test=(x_test, "
            "y_test) for posteriors from bnn_zoo.fit; fit folders with bnn-zoo fit --out DIR"
        )
    mark = {}
    if not truth.metrics.get("reference_converged", False):
        if not allow_unconverged:
            ref.check_reference(truth.metrics, truth.name)
        mark = {"reference_unconverged": truth.metrics.get("reference_note", "its convergence was not measured")}
    return {r.name: {**ref.scores(r.predictions, truth.predictions), **mark} for r in runs}


def architecture(model: str) -> str:
    """A short form of a model's description: its constructor's values without their names,
    "MLP(in_features=1, hidden=[50], ...)" -> "MLP(1, [50], ...)"."""
    return re.sub(r"\b\w+=", "", model)


def to_markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (pandas' own needs the optional tabulate package)."""

    def cell(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.{digits}f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def report(
    results, out_dir, reference=None, test: tuple | None = None, allow_unconverged: bool = False
) -> pd.DataFrame:
    """compare() written to ``out_dir``: comparison.csv and comparison.md, and the plots: compare.png
    (az.plot_compare, of the runs ranked by a reliable LOO, where there are two), reliability.png
    (Heek's calibration bins, or interval coverage for regression), bands.png (1-D regression),
    evidence.png (by architecture) and <run>_trace.png / <run>_rank.png / <run>_energy.png for MCMC
    runs; with ``reference``, the distance columns of :func:`compare`."""
    from bnn_zoo.evaluation import plots
    from bnn_zoo.io import atomic_write

    runs = load_results(results, test)
    table = compare(runs, reference, test, allow_unconverged)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "comparison.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write(out / "comparison.md", lambda tmp: Path(tmp).write_text(to_markdown(table)))
    ranked = set(table.loc[table["ranked_by"] == "loo", "run"]) if "ranked_by" in table else set()
    if len(ranked) >= 2:
        plots.compare_plot({r.name: r.idata for r in runs if r.name in ranked}, out / "compare.png")
    predictions = [r.predictions for r in runs if r.predictions is not None]
    if predictions:
        plots.reliability(predictions, out / "reliability.png")
    bands = [p for p in predictions if "x_grid" in p]
    if bands:
        plots.predictive_bands(bands, out / "bands.png")
    if any(k in table for k in EVIDENCE):
        plots.evidence_by_architecture(table, out / "evidence.png")
    for r in runs:
        if "energy" in (arviz_compat.group(r.idata, "sample_stats") or {}):
            plots.diagnostics(r.name, r.idata, out, prefix=f"{r.name}_")
    return table
