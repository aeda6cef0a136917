"""Result files from finished sweeps (``bnn-zoo reproduce`` or ``bnn-zoo sweep`` folders).

python benchmarks/sweep_tables.py deep-ensembles runs/de runs/de-no-at  # vs ../shared/reference/uci_deep_ensembles.csv
python benchmarks/sweep_tables.py uci-zoo runs/uci-guides [--splits 12]  # the zoo's own UCI table
python benchmarks/sweep_tables.py uci-zoo-baselines runs/uci-guides --methods ensemble swag multiswag --splits 10
python benchmarks/sweep_tables.py uci-gap runs/uci-gap
python benchmarks/sweep_tables.py digits-shift runs/digits-shift     # and digits-ood from the same folder
python benchmarks/sweep_tables.py text-ood runs/toy-text-ood
python benchmarks/sweep_tables.py dropout-learned runs/uci-dropout-learned  # vs mean-field in dropout-default.json
python benchmarks/sweep_tables.py uci-reference runs/uci-guides runs/uci-reference  # every guide against NUTS
python benchmarks/sweep_tables.py digits-reference runs/digits-shift runs/digits-reference  # agreement and TV to NUTS
python benchmarks/sweep_tables.py uci-gap runs/gap-reference --add  # one method's rows into the existing table

Each writes benchmarks/results/NAME.json: mean +- standard error over splits (or gap columns) per dataset
and method, with the summed fit time (uci-gap: and the worst column's test log-likelihood); for digits the
shift curves at a few intensities and the OOD scores. With ``--add`` the folders' methods replace or join
their rows in the existing file; the other rows stay as measured (the file's settings say when and by what).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from results import RESULTS, write

from bnn_zoo.experiments import protocols, table

REFERENCE = Path(__file__).parents[1] / ".." / "shared" / "reference" / "uci_deep_ensembles.csv"


def cells(folder: Path) -> pd.DataFrame:
    """Every finished cell of the sweeps in ``folder`` (one sweep, or one per dataset below it)."""
    sweeps = [folder] if (folder / "cells").is_dir() else sorted(p for p in folder.iterdir() if (p / "cells").is_dir())
    return pd.concat([table.collect(p) for p in sweeps])


def pm(mean: float, se: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def mean_se(values: pd.Series) -> str:
    if len(values) == 1:
        return f"{values.iloc[0]:.3f}"
    return pm(values.mean(), values.std(ddof=1) / len(values) ** 0.5)


def summary(frame: pd.DataFrame, by: list[str]) -> list[dict]:
    rows = []
    for keys, group in frame.groupby(by, sort=True):
        row = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        row |= {"n": len(group), "RMSE": mean_se(group.rmse), "test LL": mean_se(group.test_log_likelihood)}
        row |= {"coverage 95%": f"{group.coverage_95.mean():.3f}", "fit time": f"{group.runtime_s.sum() / 60:.1f} min"}
        rows.append(row)
    return rows


def uci_zoo(frame: pd.DataFrame) -> list[dict]:
    """The table ``bnn-zoo table DIR --by dataset,inference`` prints, as rows."""
    by = ["dataset", "inference"]
    header, _, *lines = table.markdown(table.aggregate(frame, by), by).splitlines()
    split = lambda line: [cell.strip() for cell in line.strip("|").split("|")]  # noqa: E731
    return [dict(zip(split(header), split(line))) for line in lines]


def convergence(group: pd.DataFrame) -> dict:
    """An MCMC row's convergence: how many cells could serve as a reference, the median R-hat and bulk ESS of f."""
    return {
        "converged": f"{sum(map(table.converged, group.folder))} of {len(group)}",
        "R-hat of f": f"{group.max_rhat_test_f.median():.3f}",
        "ESS of f": f"{group.min_ess_bulk_test_f.median():.0f}",
    }


def deep_ensembles(frame: pd.DataFrame) -> list[dict]:
    """Ours beside the paper's, with (ours - published) / sqrt(se_ours^2 + pm_published^2)."""
    published = pd.read_csv(REFERENCE, comment="#").set_index("dataset")
    settings = [json.loads((Path(f) / "metrics.json").read_text())["settings"] for f in frame.folder]
    frame = frame.assign(adversarial=[s["adversarial"] for s in settings])
    rows = []
    for (dataset, adversarial), group in frame.groupby(["dataset", "adversarial"], sort=True):
        n, ref = len(group), published.loc[dataset]
        rmse, ll = group.rmse, group.test_log_likelihood
        rmse_se, ll_se = rmse.std(ddof=1) / n**0.5, ll.std(ddof=1) / n**0.5
        rows.append(
            {
                "dataset": dataset,
                "adversarial": adversarial,
                "splits": n,
                "RMSE": pm(rmse.mean(), rmse_se),
                "published RMSE": f"{ref.rmse:.2f} ± {ref.rmse_pm:.2f}",
                "diff / se (RMSE)": f"{(rmse.mean() - ref.rmse) / (rmse_se**2 + ref.rmse_pm**2) ** 0.5:+.2f}",
                "NLL": pm(-ll.mean(), ll_se),
                "published NLL": f"{ref.nll:.2f} ± {ref.nll_pm:.2f}",
                "diff / se (NLL)": f"{(-ll.mean() - ref.nll) / (ll_se**2 + ref.nll_pm**2) ** 0.5:+.2f}",
                "fit time": f"{group.runtime_s.sum() / 60:.1f} min",
            }
        )
    return rows


def uci_gap(frame: pd.DataFrame) -> list[dict]:
    """Per dataset and method over the gap columns: the summary and the worst column's test log-likelihood;
    NUTS has a row per chain count, with its convergence."""
    if "inference.num_chains" in frame:
        chains = frame["inference.num_chains"].map(lambda c: f"nuts ({c:.0f} chains)", na_action="ignore")
        frame = frame.assign(inference=chains.where(frame.inference == "nuts", frame.inference))
    rows = summary(frame, ["dataset", "inference"])
    for row, (_, group) in zip(rows, frame.groupby(["dataset", "inference"], sort=True)):
        row["worst column's test LL"] = f"{group.test_log_likelihood.min():.3f}"
        row |= convergence(group) if row["inference"].startswith("nuts") else {}
    return rows


def digits_shift(frame: pd.DataFrame) -> list[dict]:
    """Accuracy, NLL and ECE on the clean test set and at every other shift intensity."""
    rows = protocols.shift_curves(frame)
    keep = {("rotate", 0.0), ("rotate", 30.0), ("rotate", 60.0), ("rotate", 90.0), ("noise", 2.0), ("noise", 8.0)}
    return [
        {
            "inference": r["inference"],
            "shift": "none" if r["intensity"] == 0 else f"{r['transform']} {r['intensity']:g}",
        }
        | {m: round(r[m], 3) for m in ("accuracy", "nll", "ece")}
        for r in rows
        if (r["transform"], r["intensity"]) in keep
    ]


def ood(frame: pd.DataFrame) -> list[dict]:
    """Per method, over the cells scored on out-of-distribution inputs (digits: those trained on 0-4):
    accuracy and the AUROC and FPR at 95% TPR of each score."""
    rows = []
    for inference, group in frame[frame["ood_auroc_entropy"].notna()].groupby("inference", sort=True):
        rows.append(
            {"inference": inference, "accuracy": round(group.accuracy.mean(), 3)}
            | {
                f"{kind} {score}": round(group[f"ood_{kind}_{score}"].mean(), 3)
                for score in ("entropy", "mutual_information", "max_probability")
                for kind in ("auroc", "fpr95")
            }
            | (convergence(group) if inference == "nuts" else {})
        )
    return rows


def uci_reference(frame: pd.DataFrame) -> list[dict]:
    """The zoo's UCI table with each split's NUTS reference: per dataset and method the test scores, the
    W2 distance to the reference's predictive and the variance ratio (splits whose reference converged),
    and for NUTS how many splits converged with the median R-hat and bulk ESS of f. Only the splits with a
    NUTS run count, so that every row of a dataset averages the same splits."""
    nuts = frame[frame.inference == "nuts"]
    sampled = set(zip(nuts.dataset, nuts["data.split"]))
    frame = frame[[cell in sampled for cell in zip(frame.dataset, frame["data.split"])]]
    scored = table.with_posterior_reference(frame, "nuts")
    rows = summary(scored, ["dataset", "inference"])
    for row, (_, group) in zip(rows, scored.groupby(["dataset", "inference"], sort=True)):
        if row["inference"] == "nuts":
            row |= convergence(group)
            continue
        w2 = group["w2"].dropna() if "w2" in group else pd.Series(dtype=float)
        row["W2 to NUTS"] = mean_se(w2) if len(w2) else "-"
        row["variance ratio"] = f"{group.variance_ratio.dropna().median():.2f}" if len(w2) else "-"
    return rows


def digits_reference(frame: pd.DataFrame) -> list[dict]:
    """Per class set and method: accuracy and NLL, and against the NUTS reference of the same data the
    top-1 agreement and total variation of the predictive probabilities; for NUTS its convergence."""
    scored = table.with_posterior_reference(frame, "nuts")
    rows = []
    for (classes, inference), group in scored.groupby(["data.classes", "inference"], sort=True):
        cell = group.iloc[0]
        row = {"classes": int(classes), "inference": inference, "accuracy": round(cell.accuracy, 3)}
        row |= {"NLL": round(cell.nll, 3), "fit time": f"{cell.runtime_s / 60:.1f} min"}
        if inference == "nuts":
            row |= {"R-hat of f": f"{cell.max_rhat_test_f:.3f}", "ESS of f": f"{cell.min_ess_bulk_test_f:.0f}"}
            row["converged"] = bool(cell.reference_converged)
        elif "agreement" in group and pd.notna(cell.get("agreement")):
            row |= {"agreement with NUTS": round(cell.agreement, 3), "TV to NUTS": round(cell.total_variation, 3)}
        rows.append(row)
    return rows


def dropout_learned(frame: pd.DataFrame) -> list[dict]:
    """Per dataset and prior, the fit with a learned p: its RMSE against mean-field's at the same settings
    (dropout-default.json, split 0), test LL, coverage and the fitted p of each weight matrix."""
    default = json.loads((RESULTS / "dropout-default.json").read_text())["rows"]
    meanfield = {r["dataset"]: r["rmse"] for r in default if r["method"] == "svi-mean-field"}
    rows = []
    for _, cell in frame.sort_values(["dataset", "prior"]).iterrows():
        rates = json.loads((Path(cell.folder) / "metrics.json").read_text())["dropout_p"]
        rows.append(
            {
                "dataset": cell.dataset,
                "prior": cell.prior,
                "rmse": cell.rmse,
                "rmse / mean-field's": cell.rmse / meanfield[cell.dataset],
                "test_ll": cell.test_log_likelihood,
                "coverage_95": cell.coverage_95,
                "fitted p": ", ".join(f"{r:.1e}" for r in rates.values()),
                "runtime_s": cell.runtime_s,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "name",
        choices=[
            "deep-ensembles",
            "uci-zoo",
            "uci-zoo-baselines",
            "uci-gap",
            "digits-shift",
            "digits-ood",
            "text-ood",
            "dropout-learned",
            "uci-reference",
            "digits-reference",
        ],
    )
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--methods", nargs="*", help="only these inference labels")
    parser.add_argument("--splits", type=int, help="only the splits below this number")
    parser.add_argument("--add", action="store_true", help="merge into the existing result file's rows")
    args = parser.parse_args()
    frame = pd.concat([cells(folder) for folder in args.folders])
    if args.methods:
        frame = frame[frame.inference.isin(args.methods)]
    if args.splits is not None:
        frame = frame[frame["data.split"] < args.splits]
    command = f"python benchmarks/sweep_tables.py {args.name} {' '.join(map(str, args.folders))}"
    command += f" --methods {' '.join(args.methods)}" if args.methods else ""
    command += f" --splits {args.splits}" if args.splits is not None else ""
    if args.name == "deep-ensembles":
        rows = deep_ensembles(frame)
        command = f"bnn-zoo reproduce deep-ensembles --data ../shared/data/uci [--adversarial 0]; {command}"
    elif args.name == "uci-gap":
        rows = uci_gap(frame)
        command = (
            "bnn-zoo reproduce uci-gap --data ../shared/data/uci/yacht --out A; "
            f"bnn-zoo sweep examples/sweeps/gap-reference.yaml --out B; {command}"
        )
    elif args.name in ("digits-shift", "digits-ood"):
        rows = (digits_shift if args.name == "digits-shift" else ood)(frame)
        command = (
            f"bnn-zoo reproduce digits-shift; bnn-zoo sweep examples/sweeps/digits-reference.yaml (NUTS); {command}"
        )
    elif args.name == "text-ood":
        rows = ood(frame)
        command = (
            "bnn-zoo sweep examples/sweeps/toy-text-ood.yaml --workers 2 --out A; "
            f"bnn-zoo sweep examples/sweeps/toy-text-ood-nuts.yaml --out B; {command}"
        )
    elif args.name == "uci-reference":
        rows = uci_reference(frame)
        command = (
            "bnn-zoo sweep examples/sweeps/uci-guides.yaml --out A; "
            f"bnn-zoo sweep examples/sweeps/uci-reference.yaml --out B; {command}"
        )
    elif args.name == "digits-reference":
        rows = digits_reference(frame)
        command = (
            "bnn-zoo reproduce digits-shift --out A; "
            f"bnn-zoo sweep examples/sweeps/digits-reference.yaml --out B; {command}"
        )
    elif args.name == "uci-zoo":
        rows = uci_zoo(frame)
        command = f"bnn-zoo sweep examples/sweeps/uci-guides.yaml --workers 2 --no-lockstep --out DIR; {command}"
    elif args.name == "dropout-learned":
        rows = dropout_learned(frame)
        command = f"bnn-zoo sweep examples/sweeps/uci-dropout-learned.yaml --out DIR; {command}"
    else:
        rows = summary(frame, ["dataset", "inference"])
    settings = {"command": command}
    if args.add:
        rows, settings["earlier rows"] = added(args.name, rows)
    print(write(args.name, rows, **settings))
    return 0


def added(name: str, rows: list[dict]) -> tuple[list[dict], dict]:
    """``rows`` merged into RESULTS/name.json's: a new row replaces the old one of its dataset and method,
    the others stay. Also the date, commit and command of the rows kept."""
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"--add merges into {path}, which does not exist: run without --add first")
    record = json.loads(path.read_text())
    key = lambda row: (row.get("dataset"), row.get("classes"), row["inference"])  # noqa: E731
    new = {key(r) for r in rows}
    kept = [r for r in record["rows"] if key(r) not in new]
    earlier = record["settings"].get("earlier rows") or {
        "date": record["date"],
        "commit": record["commit"],
        "command": record["settings"]["command"],
    }
    return sorted(kept + rows, key=lambda r: tuple(str(v) for v in key(r))), earlier


if __name__ == "__main__":
    sys.exit(main())
