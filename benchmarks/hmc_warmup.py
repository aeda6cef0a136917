"""Pyro's HMC warm-up under several priors: step size, leapfrog steps and acceptance per iteration.

Dual averaging sets HMC's step size from each iteration's acceptance, and a trajectory of fixed length
takes trajectory_length / step size leapfrog steps, so a prior whose log density bends sharply (the
scale mixture's narrow component) shows here as acceptance near 0 and a step size that keeps falling.
Each prior runs the same model, data and start (the network's seeded initialisation), one thread.
Usage:

    python benchmarks/hmc_warmup.py --data toy-text --model lstm-tied \
        --priors fanin scale-mixture scale-mixture:scale2=0.05 --iterations 10

Results: docs/guide/defaults.md (the recurrent models' prior under NUTS, HMC and ChEES).
"""

from __future__ import annotations

import argparse
import time

import pyro
import torch
from pyro.infer import mcmc
from pyro.infer.autoguide.initialization import init_to_value

from bnn_zoo.experiments import config as cfg
from bnn_zoo.experiments.run import prepare


def prior_config(spec: str) -> cfg.PriorConfig:
    """``name`` or ``name:option=value,...``, e.g. ``scale-mixture:scale2=0.05``."""
    name, _, options = spec.partition(":")
    return cfg.REGISTRY["prior"][name](**{k: float(v) for k, v in (o.split("=") for o in options.split(",") if o)})


def warmup(data: str, model: str, prior: str, iterations: int, seed: int) -> list[dict]:
    config = cfg.RunConfig(
        data=cfg.REGISTRY["data"][data](),
        model=cfg.REGISTRY["model"][model](),
        inference=cfg.HMC(),
        prior=prior_config(prior),
    )
    run = prepare(config, progress=False)
    pyro.set_rng_seed(seed)
    # bz.HMC's settings: trajectory length 1, step size 0.01 to start
    start = init_to_value(values=run.model.network_init(seed))
    kernel = mcmc.HMC(
        run.model,
        step_size=0.01,
        trajectory_length=1.0,
        init_strategy=start,
        jit_compile=True,
        ignore_jit_warnings=True,
    )
    rows, clock = [], [time.perf_counter()]

    def logged(step):  # Pyro's adapter sees each iteration's acceptance before it moves the step size
        def record(t, z, accept_prob, z_grad=None):
            now = time.perf_counter()
            steps = kernel.num_steps
            rows.append(
                {
                    "iteration": t,
                    "step size": kernel.step_size,
                    "leapfrog steps": steps,
                    "acceptance": float(accept_prob),
                    "seconds": now - clock[0],
                }
            )
            clock[0] = now
            return step(t, z, accept_prob, z_grad)

        return record

    setup = kernel.setup

    def setup_and_log(*args, **kwargs):
        setup(*args, **kwargs)
        kernel._adapter.step = logged(kernel._adapter.step)

    kernel.setup = setup_and_log
    mcmc.MCMC(kernel, num_samples=1, warmup_steps=iterations, disable_progbar=True).run(*run.dataset.train)
    return rows[:iterations]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="toy-text")
    parser.add_argument("--model", default="lstm-tied")
    parser.add_argument("--priors", nargs="+", default=["fanin", "scale-mixture", "scale-mixture:scale2=0.05"])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for prior in args.priors:
        print(
            f"\n{args.data} {args.model}, prior {prior}\n\n| iteration | step size | leapfrog steps | acceptance | "
            "seconds |\n|---|---|---|---|---|"
        )
        for row in warmup(args.data, args.model, prior, args.iterations, args.seed):
            print(
                f"| {row['iteration']} | {row['step size']:.2g} | {row['leapfrog steps']} | {row['acceptance']:.2g} | "
                f"{row['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
