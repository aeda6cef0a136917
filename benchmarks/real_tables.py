"""Every method at its defaults through `bz.fit` on real tables in their own units: what a newcomer gets.

Each table is split once (a seeded quarter held out for testing), and every method fits
``bz.BNN(bz.models.MLP(features, [50], outputs))`` (the fan-in prior, a learned noise) with nothing else
set; the GP baseline fits beside them. ``bz.compare`` scores each on the test rows, against NUTS as the
reference. Each row gives the test metrics (regression: coverage of the 50/90/95% bands and the test
log-likelihood; classification: accuracy, NLL and ECE), the distance to NUTS, the R-hat and ESS a
Markov chain method reports, the time, every warning the fit gave (``bz.fit``'s own, before any test
row is seen) and the band's judgment on the test rows (``bnn_zoo.inference.health.band_on``, as
``bz.compare`` gives it). Tables, 133 to 1,500 training rows: diabetes (scikit-learn's, in its raw
units), breast cancer, wine and digits (scikit-learn's), Friedman #1 made here in a price's units (300
training rows, noise sd 1,000), and Friedman #2 in its own units (inputs from 0-1 to 125-1,760; 1,500
training rows, noise sd 50).

python benchmarks/real_tables.py [--only diabetes,friedman] [--methods svi,nuts] [--name real-tables]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from results import write

import bnn_zoo as bz
from bnn_zoo.inference import health

METHODS = {
    "svi (mean-field)": lambda: bz.SVI(progress=False),
    "svi (dropout)": lambda: bz.SVI(guide="dropout", progress=False),
    "nuts": lambda: bz.NUTS(progress=False),
    "hmc": lambda: bz.HMC(progress=False),
    "chees": lambda: bz.ChEES(progress=False),
    "laplace": lambda: bz.Laplace(),
    "sghmc": lambda: bz.SGMCMC(progress=False),
    "sgld": lambda: bz.SGMCMC(kind="sgld", progress=False),
    "ensemble": lambda: bz.Ensemble(progress=False),
    "swag": lambda: bz.SWAG(progress=False),
    "gp": lambda: bz.TypeII(),
}
COLUMNS = [
    "coverage_50",
    "coverage_90",
    "coverage_95",
    "test_log_likelihood",
    "rmse",
    "accuracy",
    "nll",
    "ece",
    "w2",
    "variance_ratio",
    "agreement",
    "total_variation",
    "max_rhat_function",
    "min_ess_bulk_function",
    "divergences",
]


def tables() -> dict:
    """name -> (task, x, y): real tables as their sources give them."""
    from sklearn import datasets

    diabetes = datasets.load_diabetes(scaled=False)
    cancer = datasets.load_breast_cancer()
    wine = datasets.load_wine()
    digits = datasets.load_digits()
    x, y = datasets.make_friedman1(n_samples=400, noise=1.0, random_state=0)
    scales = np.logspace(-2, 3, x.shape[1])  # inputs from hundredths to thousands
    x2, y2 = datasets.make_friedman2(n_samples=2000, noise=50.0, random_state=0)
    return {
        "diabetes": ("regression", diabetes.data, diabetes.target),
        "friedman": ("regression", x * scales, 50_000 + 1_000 * y),
        "friedman2": ("regression", x2, y2),
        "breast-cancer": ("classification", cancer.data, cancer.target),
        "wine": ("classification", wine.data, wine.target),
        "digits": ("classification", digits.data, digits.target),
    }


def split(x, y, seed: int = 0):
    order = np.random.default_rng(seed).permutation(len(y))
    cut = len(y) * 3 // 4
    train, test = order[:cut], order[cut:]
    return (x[train], y[train]), (x[test], y[test])


def model(task: str, x, y, method: str):
    if method == "gp":
        return bz.GP() if task == "regression" else None  # the GP baseline classifies by a variational GP: left out
    outputs = 1 if task == "regression" else int(y.max()) + 1
    likelihood = None if task == "regression" else bz.likelihoods.Categorical()
    return bz.BNN(bz.models.MLP(x.shape[1], [50], outputs), likelihood=likelihood)


def fit_all(task: str, train, methods: list[str]) -> tuple[dict, list[dict]]:
    posteriors, rows = {}, []
    for name in methods:
        bnn = model(task, *train, name)
        if bnn is None:
            continue
        torch.manual_seed(0)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                posteriors[name] = bz.fit(bnn, *train, METHODS[name]())
                error = None
            except bz.BnnZooError as exc:
                error = str(exc)
        rows.append(
            {
                "method": name,
                "time_s": round(time.perf_counter() - start, 1),
                "warnings": sorted({str(w.message) for w in caught if issubclass(w.category, UserWarning)}),
                "error": error,
            }
        )
        print(rows[-1], flush=True)
    return posteriors, rows


def scores(posterior, reference, test) -> dict:
    """The test metrics and distance to NUTS that ``bz.compare`` gives ``posterior``, and a regression
    band's judgment on the test rows alone (``bz.compare`` shows a fit's own judgment where it has one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = bz.compare([posterior], reference=reference, test=test, allow_unconverged=True).iloc[0]
    scored = {k: float(row[k]) for k in COLUMNS if k in row and row[k] == row[k]}
    if "coverage_90" not in scored:
        return scored
    x, y = (torch.as_tensor(np.asarray(a), dtype=torch.get_default_dtype()) for a in test)
    with torch.no_grad():
        return scored | {"test_band_warning": health.band_on(posterior.predict(x), y)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="tables, comma-separated")
    parser.add_argument("--methods", default="", help="methods, comma-separated (nuts is always fitted)")
    parser.add_argument("--name", default="real-tables")
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = args.methods.split(",") if args.methods else list(METHODS)
    methods = ["nuts"] + [m for m in chosen if m != "nuts"]
    results = []
    for table, (task, x, y) in tables().items():
        if args.only and table not in args.only.split(","):
            continue
        train, test = split(x, y)
        posteriors, rows = fit_all(task, train, methods)
        for row in rows:
            if row["error"] is None:
                row.update(scores(posteriors[row["method"]], posteriors.get("nuts"), test))
        for row in rows:
            results.append({"table": table, "task": task, "n_train": len(train[1]), **row})
    print(write(args.name, results, command="python benchmarks/real_tables.py"))


if __name__ == "__main__":
    main()
