"""Tutorial: one model, several posteriors. Heek's toy regression (N = 20, y = x^3 + N(0, 3^2)) with a
1-50-1 tanh BNN under a fan-in prior and the generating noise, fitted by mean-field SVI, the dropout
guide (MC dropout), a last-layer BNN, NUTS (started from the SVI fit) and a GP baseline.

    python examples/tutorial_guides_vs_nuts.py [--out runs/tutorial-toy]    (under a minute on 2 cores)

Prints a markdown table and writes bands.png (every predictive band) and the result folders.
"""

import argparse
from pathlib import Path

import torch

import bnn_zoo as bz
from bnn_zoo.evaluation import plots
from bnn_zoo.experiments.run import run

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default="runs/tutorial-toy")
out = Path(parser.parse_args().out)

data = bz.data.toy_cubic(seed=0)
noise = data.info["noise_scale"]  # the generating noise, in the data's units
torch.manual_seed(0)  # the last-layer BNN starts its point-estimated features at the network's own values
net = bz.models.MLP(1, [50], 1, activation="tanh")
model = bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Gaussian(noise))
last_layer = bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Gaussian(noise), expose=[bz.bnn.last_layer(net)])
svi = dict(steps=3000, lr=0.02, lr_decay=0.1, num_particles=4, progress=False)

mean_field = run("mean-field", data, model, bz.SVI(**svi), out / "mean-field")
results = [
    mean_field,
    run(
        "dropout p=0.1",
        data,
        model,
        bz.SVI(guide="dropout", guide_options={"p": 0.1, "masks": "example"}, **svi),
        out / "dropout",
    ),
    run("last-layer mean-field", data, last_layer, bz.SVI(**svi), out / "last-layer"),
    run(
        "nuts",
        data,
        model,
        bz.NUTS(num_warmup=300, num_samples=300, num_chains=2, init=mean_field.posterior, progress=False),
        out / "nuts",
    ),
    run("gp rbf", data, bz.GP("rbf"), bz.TypeII(steps=300, progress=False), out / "gp"),
]
plots.predictive_bands([r.predictions for r in results], out / "bands.png")

columns = [
    ("test RMSE", "rmse", "{:.2f}"),
    ("test LL", "test_log_likelihood", "{:.3f}"),
    ("ELBO", "elbo", "{:.1f}"),
    ("GP log ML", "log_marginal_likelihood", "{:.1f}"),
    ("LOO elpd (SE)", "loo_elpd", "{:.1f}"),
    ("max R-hat", "max_rhat", "{:.3f}"),
    ("time s", "runtime_s", "{:.1f}"),
]
print("| run | " + " | ".join(c[0] for c in columns) + " |")
print("|---" * (len(columns) + 1) + "|")
for r in results:
    cells = []
    for _, key, fmt in columns:
        value = fmt.format(r.metrics[key]) if key in r.metrics else "-"
        if key == "loo_elpd" and key in r.metrics:
            value += f" ({r.metrics['loo_se']:.1f})"
        cells.append(value)
    print(f"| {r.name} | " + " | ".join(cells) + " |")
print(f"\nfigure: {out / 'bands.png'}")
