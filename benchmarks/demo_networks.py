"""How the demo's network and prior were chosen: mean-field SVI at the demo's settings on Heek's toy
regression, for each network and fan-in gain tried, with the test RMSE (overall and beyond the training
inputs) and the ELBO, both in the data's units.

    python benchmarks/demo_networks.py   (about 2 minutes, one thread)

Results: results/demo-networks.json, rendered in docs/benchmarks-defaults.md.
"""

from __future__ import annotations

import torch
from results import write

import bnn_zoo as bz
from bnn_zoo.experiments.run import run

# (row label, hidden width, activation, fan-in gain)
NETWORKS = [
    ("1-50-1 tanh, fan-in gain 1 (the demo)", 50, "tanh", 1.0),
    ("1-100-1 ReLU, gain 1 (Heek's network)", 100, "relu", 1.0),
    ("1-100-1 ReLU, gain 1.41 (He)", 100, "relu", 2**0.5),
    ("1-100-1 ReLU, gain 2", 100, "relu", 2.0),
    ("1-100-1 ReLU, gain 3", 100, "relu", 3.0),
    ("1-50-1 tanh, gain 2", 50, "tanh", 2.0),
    ("1-50-1 tanh, gain 3", 50, "tanh", 3.0),
]


def main() -> None:
    torch.set_num_threads(1)
    data = bz.data.toy_cubic()
    lo, hi = float(data.x_train.min()), float(data.x_train.max())
    beyond = (data.x_test[:, 0] < lo) | (data.x_test[:, 0] > hi)
    rows = []
    for label, width, activation, gain in NETWORKS:
        model = bz.BNN(
            bz.models.MLP(1, [width], 1, activation=activation),
            bz.priors.FanInNormal(gain=gain),
            bz.likelihoods.Gaussian(data.info["noise_scale"]),
        )
        # the demo's mean-field fit (bnn_zoo.experiments.demo)
        svi = bz.SVI(steps=3000, lr=0.02, lr_decay=0.1, num_particles=4, seed=0, progress=False)
        result = run(label, data, model, svi, plots=False)
        err = torch.as_tensor(result.predictions["mean"].values - result.predictions["y"].values) ** 2
        row = {
            "network and prior": label,
            "SVI test RMSE (beyond)": f"{result.metrics['rmse']:.2f} ({err[beyond].mean().sqrt():.1f})",
            "ELBO": f"{result.metrics['elbo']:.1f}",
        }
        print(row, flush=True)
        rows.append(row)
    write(
        "demo-networks",
        rows,
        command="python benchmarks/demo_networks.py",
        units=result.metrics["units"],
    )


if __name__ == "__main__":
    main()
