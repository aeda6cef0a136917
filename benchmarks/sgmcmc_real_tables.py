"""SGHMC away from its defaults on the real tables of ``real_tables.py``: does a lower friction or a longer
run let its chains agree, and what does the lower friction do to a posterior known exactly?

Each variant is a set of ``bz.SGMCMC`` options over its defaults (adapted step size, friction 2, 5,000
burn-in steps, 2 chains of 500 draws thinned by 10), fitted through ``bz.fit`` on each table in its
own units with the network and split of ``real_tables.py``, under each chain seed. A row gives the
R-hat and bulk ESS of each training point's log-likelihood (the fit's own convergence check), the
test metrics, the time, and the error where a chain diverged. ``--only blr`` fits instead the 40-row
Bayesian linear regression of ``tests/test_sgmcmc.py`` (three inputs correlated at 0.83-0.95): the
smallest bulk ESS of a weight, the largest distance of a posterior mean from the exact one in exact
posterior sds, and the range of the draws' sds over the exact ones.

python benchmarks/sgmcmc_real_tables.py                                   # friction 2 and 0.2, seeds 0 and 1
python benchmarks/sgmcmc_real_tables.py --only blr --name sgmcmc-friction-blr
python benchmarks/sgmcmc_real_tables.py --only diabetes --seeds 0 --name sgmcmc-longer \\
    --variants '[{"burn_in": 20000}, {"thinning": 80}]'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch
from real_tables import model, split, tables
from results import write

import bnn_zoo as bz

COLUMNS = ["coverage_90", "test_log_likelihood", "rmse", "accuracy", "nll"]
CHECKS = ["max_rhat_function", "min_ess_bulk_function"]


def label(options: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"


def fit(task: str, train, test, options: dict, seed: int) -> dict:
    torch.manual_seed(seed)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            posterior = bz.fit(model(task, *train, "sghmc"), *train, bz.SGMCMC(seed=seed, progress=False, **options))
        except bz.BnnZooError as exc:
            return {"time_s": round(time.perf_counter() - start, 1), "error": str(exc)}
        elapsed = round(time.perf_counter() - start, 1)
        row = bz.compare([posterior], test=test, allow_unconverged=True).iloc[0]
    scores = {k: float(row[k]) for k in COLUMNS + CHECKS if k in row and row[k] == row[k]}
    return {"time_s": elapsed, "error": None, **scores}


def blr(options: dict, seed: int) -> dict:
    """SGHMC under ``options`` on the defaults test's correlated regression, against its exact posterior."""
    import arviz as az

    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from test_sgmcmc import correlated_regression  # the problem the defaults test holds SG-MCMC to

    x, y, net, exact = correlated_regression()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = bz.fit(net, x, y, bz.SGMCMC(seed=seed, progress=False, **options), standardize=False)
    draws = torch.cat([post.samples[k].double().flatten(2) for k in post.samples], -1).flatten(0, 1)
    ess = az.ess(post.to_inference_data(), method="bulk")
    sd = exact.cov.diagonal().sqrt()
    ratio = draws.std(0) / sd
    return {
        "min_ess_bulk": min(float(ess[k].min()) for k in post.samples),
        "max_mean_error_sd": float(((draws.mean(0) - exact.mean).abs() / sd).max()),
        "sd_ratio_min": float(ratio.min()),
        "sd_ratio_max": float(ratio.max()),
        **{k: post.info[k] for k in CHECKS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default='[{}, {"friction": 0.2}]', help="a JSON list of SGMCMC options")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--only", default="", help="tables, comma-separated (blr: the exact posterior instead)")
    parser.add_argument("--name", default="sgmcmc-real-tables")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants, seeds = json.loads(args.variants), [int(s) for s in args.seeds.split(",")]
    chosen = tables() if args.only != "blr" else {"blr": None}
    rows = []
    for table, data in chosen.items():
        if args.only and table not in args.only.split(","):
            continue
        if data is not None:
            task, x, y = data
            train, test = split(x, y)
        for options in variants:
            for seed in seeds:
                scores = blr(options, seed) if data is None else fit(task, train, test, options, seed)
                rows.append({"table": table, "options": label(options), "seed": seed, **scores})
                print(rows[-1], flush=True)
    print(write(args.name, rows, command=" ".join(["python benchmarks/sgmcmc_real_tables.py", *sys.argv[1:]])))


if __name__ == "__main__":
    main()
