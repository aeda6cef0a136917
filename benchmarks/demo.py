"""The main job's table as data: `bnn-zoo demo` at its defaults, each run's metrics (test RMSE in and
beyond the training range, W2 and variance ratio to NUTS, evidence, diagnostics, time) written to
benchmarks/results/demo.json.

python benchmarks/demo.py [--out runs/demo-benchmark] [--name demo]

NUTS runs on XLA (the default install's backend for this MLP).
"""

from __future__ import annotations

import argparse

from results import write

from bnn_zoo.experiments.demo import demo

KEYS = (
    "rmse",
    "rmse_in_range",
    "rmse_beyond",
    "test_log_likelihood",
    "elbo",
    "evidence_laplace",
    "log_marginal_likelihood",
    "w2",
    "variance_ratio",
    "max_rhat",
    "min_ess_bulk",
    "runtime_s",
    "units",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/demo-benchmark", help="the demo's result folders")
    parser.add_argument("--name", default="demo", help="the result file: benchmarks/results/NAME.json")
    args = parser.parse_args()
    results = demo(args.out, progress=False)
    rows = [
        {"run": r.name, "backend": r.metrics["settings"].get("backend")} | {k: r.metrics.get(k) for k in KEYS}
        for r in results
    ]
    print(write(args.name, rows, command=f"bnn-zoo demo (python benchmarks/demo.py --name {args.name}), defaults"))


if __name__ == "__main__":
    main()
