"""The dropout guide with a learned p on regression, trained on every row or stopped early on a tenth held
out (the default), through `bz.fit` at otherwise default settings: test RMSE, log-likelihood and 90%
band coverage, the step kept and the fitted p. Tables: UCI split 0 of each folder given (../shared/data/uci)
and the real tables of benchmarks/real_tables.py (Friedman #1, diabetes).

python benchmarks/dropout_validation.py --uci ../shared/data/uci [--only bostonHousing,yacht]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import real_tables
import torch
from results import write

import bnn_zoo as bz
from bnn_zoo.evaluation import regression_metrics

SETTINGS = {"every row (validation=0)": 0.0, "a tenth held out (the default)": None}
UCI = ["bostonHousing", "yacht", "energy", "wine-quality-red"]


def tables(uci: Path, only: list[str]) -> dict:
    """name -> ((x, y) train, (x, y) test) in the data's units."""
    out = {name: (d.train, d.test) for name in UCI for d in [bz.data.load_uci(uci / name)]}
    for name in ("friedman", "diabetes"):
        _, x, y = real_tables.tables()[name]
        train, test = real_tables.split(x, y)
        out[name] = tuple(tuple(torch.as_tensor(a, dtype=torch.float32) for a in part) for part in (train, test))
    return {k: v for k, v in out.items() if not only or k in only}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uci", type=Path, required=True, help="the folder of UCI datasets")
    parser.add_argument("--only", default="", help="tables, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, (train, test) in tables(args.uci, args.only.split(",") if args.only else []).items():
        for label, validation in SETTINGS.items():
            model = bz.BNN(bz.models.MLP(train[0].shape[1], [50]))
            start = time.perf_counter()
            method = bz.SVI(guide="dropout", validation=validation, progress=False)
            posterior = bz.fit(model, *train, method)
            scores = regression_metrics(posterior.predict(test[0]), test[1])
            rows.append(
                {
                    "table": name,
                    "setting": label,
                    "rmse": scores["rmse"],
                    "test_log_likelihood": scores["test_log_likelihood"],
                    "coverage_90": scores["coverage_90"],
                    "step_kept": posterior.info.get("best_step"),
                    "largest_p": max(posterior.info["dropout_p"].values()),
                    "time_s": round(time.perf_counter() - start, 1),
                }
            )
            print(rows[-1], flush=True)
    print(write("dropout-validation", rows, command=f"python benchmarks/dropout_validation.py --uci {args.uci}"))


if __name__ == "__main__":
    main()
