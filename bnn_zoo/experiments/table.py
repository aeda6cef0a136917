"""A sweep's results as one table: mean and standard error over splits and seeds of every metric,
grouped by the labels asked for, optionally next to published numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bnn_zoo.errors import BnnZooError
from bnn_zoo.experiments.sweep import read_status, sweep_status
from bnn_zoo.io import read_json_mapping

ALIASES = {"test_ll": "test_log_likelihood"}  # reference-table names for the zoo's metric names
SHOWN = [
    "rmse",
    "test_log_likelihood",
    "coverage_95",
    "accuracy",
    "nll",
    "elbo",
    "evidence_laplace",
    "evidence_laplace_type_ii",
    "type_ii",
    "log_marginal_likelihood",
    "w2",
    "variance_ratio",
    "agreement",
    "nll_tempered",
    "ece_tempered",
    "conformal_coverage_90",
    "ood_auroc_entropy",
    "ood_auroc_mutual_information",
    "ood_fpr95_entropy",
    "total_variation",
    "max_rhat_test_f",
    "min_ess_bulk_test_f",
    "runtime_s",
]


def collect(sweep_dir, stage: str = "final") -> pd.DataFrame:
    """One row per finished cell of ``stage``: its labels and its numeric metrics."""
    rows = []
    for info in sweep_status(sweep_dir)["done"]:
        if info.get("stage", "final") != stage:
            continue
        folder = Path(sweep_dir) / "cells" / info["key"]
        metrics = read_status(folder).get("metrics", {})
        rows.append({"key": info["key"], "folder": str(folder), **info["labels"], **metrics})
    if not rows:
        raise BnnZooError(f"no finished cells in {sweep_dir}; see bnn-zoo sweep --status {sweep_dir}")
    return pd.DataFrame(rows)


def aggregate(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: the number of cells n, and for every metric its mean and standard error
    (sample standard deviation / sqrt(n), the "+-" of the UCI tables). A fit's own Monte Carlo error of
    a metric (``elbo_se`` beside ``elbo`` in metrics.json) is left out: its name is the column of the
    standard error over cells, which includes that error."""
    missing = [b for b in by if b not in frame]
    if missing:
        labels = [c for c in frame.columns if frame[c].dtype == object and c not in ("key", "folder")]
        known = (
            f"the cells are labelled by {', '.join(labels)}"
            if labels
            else "the cells carry no labels (their cell.json is missing)"
        )
        raise BnnZooError(f"cannot group by {', '.join(missing)}; {known}")
    metrics = [c for c in frame.columns if c not in by and pd.api.types.is_numeric_dtype(frame[c]) and not _is_label(c)]
    metrics = [m for m in metrics if not (m.endswith("_se") and m.removesuffix("_se") in metrics)]
    grouped = frame.groupby(by, sort=True)[metrics]
    mean, se, n = grouped.mean(), grouped.std(ddof=1) / grouped.count() ** 0.5, frame.groupby(by, sort=True).size()
    columns = {"n": n} | {name: values[m] for m in metrics for name, values in ((m, mean), (f"{m}_se", se))}
    return pd.DataFrame(columns).reset_index()


def _is_label(column: str) -> bool:
    return column in ("seed", "selection_score") or "." in column or column.startswith("selected:")


def with_posterior_reference(frame: pd.DataFrame, method: str) -> pd.DataFrame:
    """Every cell scored against the cell whose inference is ``method`` (a reference posterior, e.g.
    ``chees``) and whose other labels (dataset, model, seed, the data axes) it shares: the columns of
    :func:`bnn_zoo.evaluation.reference.scores`. A reference that did not converge scores nothing; the
    ``reference_converged`` column says which did."""
    from bnn_zoo.evaluation import reference
    from bnn_zoo.evaluation.compare import load_predictions

    if method not in set(frame["inference"]):
        raise BnnZooError(
            f"no finished cell has inference {method!r}; the cells' inference labels are "
            f"{', '.join(sorted(set(frame['inference'])))}"
        )
    keys = [
        c
        for c in frame.columns
        if c in ("dataset", "model", "seed") or ("." in c and not c.startswith(("inference.", "guide.")))
    ]
    frame = frame.reset_index(drop=True)
    frame["reference_converged"] = [
        converged(row["folder"]) if row["inference"] == method else None for _, row in frame.iterrows()
    ]
    label = lambda row: tuple(None if pd.isna(row[k]) else row[k] for k in keys)  # noqa: E731
    truths = frame[frame["reference_converged"].eq(True)]
    truth_of = {label(row): load_predictions(Path(row["folder"]) / "predictions.nc") for _, row in truths.iterrows()}
    scored = []
    for _, row in frame.iterrows():
        truth, path = truth_of.get(label(row)), Path(row["folder"]) / "predictions.nc"
        scored.append(reference.scores(load_predictions(path), truth) if truth is not None and path.is_file() else {})
    return pd.concat([frame, pd.DataFrame(scored)], axis=1)


def converged(folder) -> bool:
    """Whether a cell's metrics.json says it can serve as a reference (status.json keeps numbers only)."""
    return bool((read_json_mapping(Path(folder) / "metrics.json") or {}).get("reference_converged", False))


def with_reference(table: pd.DataFrame, reference, by: list[str]) -> pd.DataFrame:
    """Add published numbers: ``reference`` is a CSV in long form (dataset, metric, mean, se) or wide
    form (dataset, M, M_se, ...); each metric gets ref_M, ref_M_se and M_diff_se = (ours - published) /
    published se, the difference in the published standard errors."""
    if not Path(reference).is_file():
        raise BnnZooError(f"reference table {reference} does not exist")
    try:
        ref = pd.read_csv(reference, comment="#")
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise BnnZooError(f"reference table {reference} is not a readable CSV ({str(exc).splitlines()[0]})") from None
    wide = {c for c in ref.columns if c != "dataset" and not c.endswith("_se")}
    if not ({"metric", "mean", "se"} <= set(ref.columns) or (wide and all(f"{c}_se" in ref for c in wide))):
        raise BnnZooError(
            f"reference table {reference} needs columns dataset, metric, mean, se or dataset, M, M_se, ..."
        )
    if "dataset" not in ref or "dataset" not in by:
        raise BnnZooError("a reference table needs a dataset column, and the table must be grouped --by dataset")
    if {"metric", "mean", "se"} <= set(ref.columns):
        wide = ref.pivot(index="dataset", columns="metric", values=["mean", "se"])
        ref = pd.DataFrame({"dataset": wide.index})
        for metric in wide["mean"].columns:
            ref[metric], ref[f"{metric}_se"] = wide["mean"][metric].values, wide["se"][metric].values
    ref = ref.rename(columns={k: v for a, b in ALIASES.items() for k, v in ((a, b), (f"{a}_se", f"{b}_se"))})
    metrics = [c for c in ref.columns if c != "dataset" and not c.endswith("_se")]
    ref = ref.rename(columns={c: f"ref_{c}" for c in ref.columns if c != "dataset"})
    out = table.merge(ref, on="dataset", how="left")
    for m in metrics:
        if m in out:
            out[f"{m}_diff_se"] = (out[m] - out[f"ref_{m}"]) / out[f"ref_{m}_se"].where(out[f"ref_{m}_se"] > 0)
    return out


def markdown(table: pd.DataFrame, by: list[str]) -> str:
    """The main metrics as "mean +- se" columns (every metric is in the CSV)."""
    shown = [m for m in SHOWN if m in table]
    header = [*by, "n", *shown]
    refs = [m for m in shown if f"ref_{m}" in table]
    header += [f"published {m}" for m in refs] + [f"{m} diff / published se" for m in refs]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [str(row[b]) for b in by] + [str(int(row["n"]))]
        cells += [_pm(row[m], row[f"{m}_se"]) for m in shown]
        cells += [_pm(row[f"ref_{m}"], row[f"ref_{m}_se"]) for m in refs] + [_fmt(row[f"{m}_diff_se"]) for m in refs]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pm(mean, se) -> str:
    return "-" if _missing(mean) else f"{_fmt(mean)} ± {_fmt(se)}" if not _missing(se) else _fmt(mean)


def _fmt(value) -> str:
    if _missing(value):
        return "-"
    return f"{value:.3g}" if abs(value) >= 100 or abs(value) < 0.01 else f"{value:.3f}"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def write(table: pd.DataFrame, by: list[str], out_prefix) -> tuple[Path, Path]:
    """OUT.csv (every column) and OUT.md (the main metrics), written atomically."""
    from bnn_zoo.io import atomic_write

    csv, md = Path(f"{out_prefix}.csv"), Path(f"{out_prefix}.md")
    atomic_write(csv, lambda tmp: table.to_csv(tmp, index=False))
    atomic_write(md, lambda tmp: Path(tmp).write_text(markdown(table, by)))
    return csv, md


def write_uci(table: pd.DataFrame, out_prefix) -> str:
    """The UCI tables' form: OUT.csv with dataset, rmse, rmse_se, test_ll, test_ll_se (and n, time per
    fit) and OUT.md; returns the markdown."""
    from bnn_zoo.io import atomic_write

    wide = table.rename(columns={"test_log_likelihood": "test_ll", "test_log_likelihood_se": "test_ll_se"})
    columns = ["dataset", "rmse", "rmse_se", "test_ll", "test_ll_se", "n", "runtime_s"]
    atomic_write(Path(f"{out_prefix}.csv"), lambda tmp: wide[columns].to_csv(tmp, index=False))
    text = markdown(table, ["dataset"])
    atomic_write(Path(f"{out_prefix}.md"), lambda tmp: Path(tmp).write_text(text))
    return text
