"""Why mean-field's band is wide on real tables: how many hidden units its guide prunes, and how much of
the function's variance they carry.

The mean-field guide at its defaults fits ``bz.BNN(bz.models.MLP(features, [50], 1))`` on the regression
tables of ``real_tables.py`` (the same split), under two seeds. A hidden unit is pruned when the guide
cannot tell the sign of any of its output weights (|mean| < sd for every output): its input weights then
sit at the prior and its output weights at noise, so it adds variance to every prediction and explains
nothing (Trippe & Turner 2018, "Overpruning in variational Bayesian neural networks"). A row gives the
pruned units, the guide's function variance at the training inputs with and without them (in the fit's
standardised units), the learned noise variance there, and the test coverage of the 90% band.

python benchmarks/mean_field_pruning.py [--seeds 2]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import real_tables
import torch
from results import write

import bnn_zoo as bz

DRAWS = 500


def pruning(posterior) -> dict:
    """Pruned hidden units of the output layer and their share of the function's variance."""
    weights = [k for k in posterior.model.params if k.endswith("weight")]
    last = weights[-1]
    loc, scale = posterior.guide.loc_and_scale(last)
    pruned = ((loc.abs() / scale) < 1).all(0)  # (hidden,): no output weight's sign is known
    draws = posterior.draws(DRAWS)
    noise = draws.pop("noise_scale")
    without = dict(draws, **{last: draws[last] * (~pruned).to(draws[last].dtype)})
    with torch.no_grad():
        variance = posterior._forward(draws, posterior.x).var(0).mean().item()
        kept = posterior._forward(without, posterior.x).var(0).mean().item()
    return {
        "pruned_units": int(pruned.sum()),
        "hidden_units": pruned.numel(),
        "f_variance": variance,
        "f_variance_without_pruned": kept,
        "noise_variance": float((noise**2).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for table, (task, x, y) in real_tables.tables().items():
        if task != "regression":
            continue
        train, test = real_tables.split(x, y)
        for seed in range(args.seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                posterior = bz.fit(real_tables.model(task, *train, "svi"), *train, bz.SVI(seed=seed, progress=False))
            x_test, y_test = (torch.as_tensor(np.asarray(a), dtype=torch.get_default_dtype()) for a in test)
            with torch.no_grad():
                pit = posterior.predict(x_test).cdf(y_test)
            coverage = float(((pit - 0.5).abs() <= 0.45).float().mean())
            rows.append({"table": table, "seed": seed, **pruning(posterior), "coverage_90": coverage})
            print(rows[-1], flush=True)
    print(write("mean-field-pruning", rows, command="python benchmarks/mean_field_pruning.py"))


if __name__ == "__main__":
    main()
