"""Scoring a 16-chain digits CNN run on the CPU against its sampling: `bnn-zoo fit --data digits --model
cnn --inference chees` (16 chains, short trajectories so the run fits a benchmark), then the run's
scoring (test predictions, convergence of f, InferenceData, LOO, R-hat and ESS of every weight, files)
timed apart; and the R-hat and ESS of the same draws by ArviZ's own functions (the scoring's former
path, a Python loop per quantity under ArviZ 0.2x) against bnn_zoo.evaluation.diagnostics.

python benchmarks/scoring.py [--warmup 20] [--samples 100] [--max-leapfrog 4] [--name scoring]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from results import write

from bnn_zoo import arviz_compat, diagnostics
from bnn_zoo.experiments import config as cfg
from bnn_zoo.experiments.run import _chain_draws, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--max-leapfrog", type=int, default=4)
    parser.add_argument("--name", default="scoring")
    args = parser.parse_args()
    inference = cfg.node(
        cfg.ChEES, num_chains=args.chains, num_warmup=args.warmup, num_samples=args.samples,
        max_leapfrog=args.max_leapfrog,
    )  # fmt: skip
    config = cfg.from_dict({"data": "digits", "model": "cnn", "inference": inference, "evaluation": {"plots": False}})
    with tempfile.TemporaryDirectory() as out:
        run = prepare(config, out, progress=False)
        start = time.perf_counter()
        posterior = run.fit()
        sampling = time.perf_counter() - start
        start = time.perf_counter()
        result = run.evaluate(posterior)
        scoring = time.perf_counter() - start
    f = posterior.predict(run.dataset.test[0]).f
    f = f.reshape(posterior.num_chains, -1, *f.shape[1:])
    weights = _chain_draws(arviz_compat.group(result.idata, "posterior"))
    timings = {}
    for name, both in (
        ("ArviZ", lambda d: (arviz_compat.rhat(_dataset(d)), arviz_compat.ess(_dataset(d)))),
        ("bnn_zoo.evaluation.diagnostics", diagnostics.rhat_and_ess_bulk),
    ):
        start = time.perf_counter()
        for draws in (f, weights):
            both(draws)
        timings[name] = round(time.perf_counter() - start, 1)
    rows = [
        {
            "chains x draws": f"{args.chains} x {args.samples}",
            "weights": weights.shape[-1],
            "test outputs": f[0, 0].numel(),
            "sampling s": round(sampling, 1),
            "scoring s": round(scoring, 1),
            "scoring / sampling": round(scoring / sampling, 2),
            "R-hat and ESS by ArviZ s": timings["ArviZ"],
            "by diagnostics s": timings["bnn_zoo.evaluation.diagnostics"],
        }
    ]
    print(rows)
    print(
        write(
            args.name,
            rows,
            command="python benchmarks/scoring.py "
            + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "name"),
        )
    )


def _dataset(draws: torch.Tensor):
    import xarray as xr

    return xr.Dataset({"x": (("chain", "draw", "q"), draws.reshape(*draws.shape[:2], -1).numpy())})


if __name__ == "__main__":
    main()
