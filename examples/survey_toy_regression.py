"""Goan & Fookes' toy regression comparison (survey sec. 3, Fig. 7): mean-field VI (Bayes by Backprop),
MC dropout and a GP with a Matern-5/2 kernel, plus NUTS, on the survey's toy sets from Blundell et al.
(2015) and Hernandez-Lobato & Adams (2015), with training data missing from part of the plotted range.

    pip install -e . && python examples/survey_toy_regression.py [--out runs/survey] [--quick]

Same network for every BNN: 1-20-20-1 ReLU (the survey: "two hidden layers utilising ReLU"), a fan-in
prior, and the noise fixed at its generating value. Deviations: the survey used a spike-and-slab
(mixture) prior, wider layers and GPflow; NUTS is added here as the reference posterior. Writes
<out>/<dataset>.png (one panel a method) and prints the comparison table.
"""

import argparse
import math
from pathlib import Path

import torch

import bnn_zoo as bz
from bnn_zoo.data import Dataset
from bnn_zoo.evaluation import plots
from bnn_zoo.experiments.demo import print_table
from bnn_zoo.experiments.run import run


def blundell(seed=0) -> Dataset:
    """y = x + 0.3 sin(2 pi (x + e)) + 0.3 sin(4 pi (x + e)) + e, e ~ N(0, 0.02); train on x in [0, 0.5]."""
    g = torch.Generator().manual_seed(seed)

    def draw(n, lo, hi):
        x = lo + (hi - lo) * torch.rand(n, 1, generator=g)
        e = math.sqrt(0.02) * torch.randn(n, generator=g)
        return x, x[:, 0] + 0.3 * torch.sin(2 * math.pi * (x[:, 0] + e)) + 0.3 * torch.sin(
            4 * math.pi * (x[:, 0] + e)
        ) + e

    return Dataset("blundell", *draw(100, 0.0, 0.5), *draw(200, -0.2, 1.2), info={"noise_scale": math.sqrt(0.02)})


def cubic(seed=0) -> Dataset:
    """y = x^3 + e, e ~ N(0, 3^2): 20 training points on [-4, 4], tested on [-6, 6]."""
    g = torch.Generator().manual_seed(seed)

    def draw(n, lo, hi):
        x = lo + (hi - lo) * torch.rand(n, 1, generator=g)
        return x, x[:, 0] ** 3 + 3 * torch.randn(n, generator=g)

    return Dataset("toy-cubic", *draw(20, -4.0, 4.0), *draw(200, -6.0, 6.0), info={"noise_scale": 3.0})


def main(out: Path, quick: bool) -> dict:
    """Fit, plot and print each toy set's comparison; the Results of each set's runs, by its name."""
    steps, draws = (500, 50) if quick else (5000, 300)
    fits = {}
    for data in (blundell(), cubic()):
        noise = data.info["noise_scale"]  # the generating noise, in the data's units
        model = bz.BNN(
            bz.models.MLP(1, [20, 20], 1, activation="relu"), bz.priors.FanInNormal(), bz.likelihoods.Gaussian(noise)
        )
        methods = [
            ("mean-field", model, bz.SVI(steps=steps, lr=0.01, num_particles=8, lr_decay=0.1)),
            (
                "mc-dropout",
                model,
                bz.SVI(guide="dropout", guide_options={"p": 0.1, "masks": "example"}, steps=steps, lr=0.01),
            ),
            ("gp-matern52", bz.GP("matern52"), bz.TypeII(steps=300, lr=0.05)),
            ("nuts", model, bz.NUTS(num_warmup=draws, num_samples=draws, num_chains=1)),
        ]
        results = [run(name, data, m, method, out / data.name / name) for name, m, method in methods]
        plots.predictive_bands([r.predictions for r in results], out / f"{data.name}.png")
        print_table(results, title=f"{data.name}: 1-20-20-1 ReLU BNNs and a GP; figure {out / data.name}.png")
        fits[data.name] = results
    return fits


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/survey"))
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    args = parser.parse_args()
    main(args.out, args.quick)
