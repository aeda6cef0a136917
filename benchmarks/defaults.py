"""Every (dataset, model, method) combination `bnn-zoo list` offers, fitted with its default settings.

Each combination runs as `bnn-zoo fit --data D --model M --inference I [--guide G]` would, with nothing
else set, and the table gives its test metric (RMSE for regression, accuracy for classification), time
and any collapse warning. Full-batch MCMC that cannot finish on a laptop CPU stops by itself at the
command line's time limit (``--inference.max_hours``, 2), and its row gives the projection and the time
it took to stop. Usage:

    python benchmarks/defaults.py [--only toy-cubic,digits] [--device cuda] [--out defaults.csv]

Results: docs/guide/defaults.md.
"""

from __future__ import annotations

import argparse
import csv
import time
import warnings

import torch
from results import write

from bnn_zoo.errors import BnnZooError
from bnn_zoo.experiments import config as cfg
from bnn_zoo.experiments.run import execute

DATA = {
    "toy-cubic": ["mlp", "linear"],
    "digits": ["mlp", "linear", "cnn"],
    "toy-text": ["lstm-tied", "lstm-untied", "embedding-rnn"],
}
GUIDES = ["mean-field", "matrix-normal", "flow", "dropout"]
METHODS = ["nuts", "hmc", "chees", "sgld", "sghmc", "cyclical", "laplace", "gp"]


def combinations(only, only_models=None, only_methods=None):
    for data, models in DATA.items():
        if only and data not in only:
            continue
        for model in models:
            if only_models and model not in only_models:
                continue
            for method in [f"svi:{g}" for g in GUIDES] + METHODS:
                if not only_methods or method in only_methods:
                    yield data, model, method


def run_one(data, model, method, device=None, progress=False):
    inference, _, guide = method.partition(":")
    config = cfg.RunConfig(
        data=cfg.REGISTRY["data"][data](),
        model=cfg.REGISTRY["model"][model](),
        inference=cfg.REGISTRY["inference"][inference](),
        guide=cfg.REGISTRY["guide"][guide]() if guide else None,
        evaluation=cfg.Evaluation(plots=False),
        device=device,
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = execute(config, None, progress=progress).metrics
    metric = "rmse" if "rmse" in metrics else "accuracy"
    return {
        "metric": metric,
        "value": round(metrics[metric], 3),
        "time_s": round(time.perf_counter() - start, 1),
        "note": metrics.get("collapse_warning", ""),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="datasets to run, comma-separated (default: all)")
    parser.add_argument("--models", help="models to run, comma-separated (default: all)")
    parser.add_argument("--methods", help="methods to run, comma-separated, e.g. svi:dropout,gp (default: all)")
    parser.add_argument("--device", help="where the fits run: cpu (default) or cuda (as bnn-zoo fit --device)")
    parser.add_argument("--progress", action="store_true", help="progress bars (on a terminal only)")
    parser.add_argument("--out", default="defaults.csv", help="CSV of the results (written as they come)")
    args = parser.parse_args()
    if args.device in (None, "cpu"):
        torch.set_num_threads(1)  # CPU rows on one thread each; a GPU run scores on all the CPU's cores
    only = set(args.only.split(",")) if args.only else None
    print("| data | model | method | metric | value | time (s) | note |\n|---|---|---|---|---|---|---|", flush=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, ["data", "model", "method", "metric", "value", "time_s", "note"])
        writer.writeheader()
        models, methods = (set(a.split(",")) if a else None for a in (args.models, args.methods))
        done = []
        for data, model, method in combinations(only, models, methods):
            start = time.perf_counter()
            try:
                row = run_one(data, model, method, args.device, args.progress)
            except BnnZooError as exc:  # a combination refused or stopped with its reason is a result too
                row = {
                    "metric": "",
                    "value": "",
                    "time_s": round(time.perf_counter() - start, 1),
                    "note": f"refused: {exc}",
                }
            except Exception as exc:  # a crash is a finding: record it and go on
                row = {
                    "metric": "",
                    "value": "",
                    "time_s": "",
                    "note": f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
                }
            row = {"data": data, "model": model, "method": method, **row}
            writer.writerow(row)
            fh.flush()
            print("| " + " | ".join(str(row[k]) for k in writer.fieldnames) + " |", flush=True)
            done.append(row)
    partial = any((args.only, args.models, args.methods, args.device))
    write("defaults-partial" if partial else "defaults", done, command="python benchmarks/defaults.py", threads=1)


if __name__ == "__main__":
    main()
