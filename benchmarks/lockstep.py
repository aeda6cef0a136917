"""Lockstep SVI against one-at-a-time SVI: time per fit-step on the UCI protocol's network.

The job is Gal & Ghahramani's UCI fit (13-50-1 ReLU, dropout guide with per-example masks, batch 128
of 364 rows: Boston's validation split) and the mean-field guide on the same network. The alternative
named in the same run is bnn-zoo's own SVI (Pyro's TraceMeanField_ELBO loop), one fit after another;
the lockstep engine fits K of them at once. One torch thread throughout.

    python benchmarks/lockstep.py [--steps 500] [--ks 1 12 60 240]
    python benchmarks/lockstep.py --features 9 --hidden 100 --rows 32926 --ks 5 30   # protein's grid fits
"""

from __future__ import annotations

import argparse
import time

import torch

import bnn_zoo as bz
from bnn_zoo.inference.lockstep import Job, fit_lockstep


def job(seed: int, guide: str, steps: int, x, y, hidden: int = 50) -> Job:
    model = bz.BNN(bz.models.MLP(x.shape[1], [hidden], 1, "relu"), bz.priors.Normal(10.0), bz.likelihoods.Gaussian(0.3))
    options = {"p": 0.05, "masks": "example"} if guide == "dropout" else {}
    svi = bz.SVI(
        guide=guide,
        guide_options=options,
        steps=steps,
        lr=1e-3,
        batch_size=128,
        seed=seed,
        progress=False,
        num_draws=10,
    )
    return Job(model, x, y, svi)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 12, 60, 240])
    parser.add_argument("--features", type=int, default=13)
    parser.add_argument("--hidden", type=int, default=50)
    parser.add_argument("--rows", type=int, default=364)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.rows, args.features, generator=g)
    y = x.sum(1) + 0.3 * torch.randn(args.rows, generator=g)
    print("| guide | K | lockstep ms per fit-step | sequential ms per fit-step | speed-up |\n|---|---|---|---|---|")
    for guide in ("dropout", "mean-field"):
        start = time.perf_counter()
        for seed in range(3):
            j = job(seed, guide, args.steps, x, y, args.hidden)
            bz.fit(j.model, j.x, j.y, j.method)
        sequential = (time.perf_counter() - start) / (3 * args.steps) * 1e3
        for k in args.ks:
            jobs = [job(seed, guide, args.steps, x, y, args.hidden) for seed in range(k)]
            start = time.perf_counter()
            fit_lockstep(jobs)
            per = (time.perf_counter() - start) / (k * args.steps) * 1e3
            print(f"| {guide} | {k} | {per:.3f} | {sequential:.3f} | {sequential / per:.1f}x |")


if __name__ == "__main__":
    main()
