"""Result files from finished UCI sweeps (``bnn-zoo reproduce`` or ``bnn-zoo sweep`` folders).

python benchmarks/uci_tables.py deep-ensembles runs/de runs/de-no-at  # vs ../shared/reference/uci_deep_ensembles.csv
python benchmarks/uci_tables.py uci-zoo-baselines runs/uci-guides --methods ensemble swag multiswag --splits 10
python benchmarks/uci_tables.py uci-gap runs/uci-gap

Each writes benchmarks/results/NAME.json: mean +- standard error over splits (or gap columns) per dataset
and method, with the summed fit time (uci-gap: and the worst column's test log-likelihood).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from results import write

from bnn_zoo.experiments import table

REFERENCE = Path(__file__).parents[1] / ".." / "shared" / "reference" / "uci_deep_ensembles.csv"


def cells(folder: Path) -> pd.DataFrame:
    """Every finished cell of the sweeps in ``folder`` (one sweep, or one per dataset below it)."""
    sweeps = [folder] if (folder / "cells").is_dir() else sorted(p for p in folder.iterdir() if (p / "cells").is_dir())
    return pd.concat([table.collect(p) for p in sweeps])


def pm(mean: float, se: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {se:.{digits}f}"


def mean_se(values: pd.Series) -> str:
    return pm(values.mean(), values.std(ddof=1) / len(values) ** 0.5)


def summary(frame: pd.DataFrame, by: list[str]) -> list[dict]:
    rows = []
    for keys, group in frame.groupby(by, sort=True):
        row = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        row |= {"n": len(group), "RMSE": mean_se(group.rmse), "test LL": mean_se(group.test_log_likelihood)}
        row |= {"coverage 95%": f"{group.coverage_95.mean():.3f}", "fit time": f"{group.runtime_s.sum() / 60:.1f} min"}
        rows.append(row)
    return rows


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=["deep-ensembles", "uci-zoo-baselines", "uci-gap"])
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--methods", nargs="*", help="only these inference labels")
    parser.add_argument("--splits", type=int, help="only the splits below this number")
    args = parser.parse_args()
    frame = pd.concat([cells(folder) for folder in args.folders])
    if args.methods:
        frame = frame[frame.inference.isin(args.methods)]
    if args.splits is not None:
        frame = frame[frame["data.split"] < args.splits]
    command = f"python benchmarks/uci_tables.py {args.name} {' '.join(map(str, args.folders))}"
    if args.name == "deep-ensembles":
        rows = deep_ensembles(frame)
        command = f"bnn-zoo reproduce deep-ensembles --data ../shared/data/uci [--adversarial 0]; {command}"
    elif args.name == "uci-gap":
        rows = summary(frame, ["dataset", "inference"])
        worst = frame.groupby(["dataset", "inference"], sort=True).test_log_likelihood.min()
        for row in rows:
            row["worst column's test LL"] = f"{worst[row['dataset'], row['inference']]:.3f}"
    else:
        rows = summary(frame, ["dataset", "inference"])
    print(write(args.name, rows, command=command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
