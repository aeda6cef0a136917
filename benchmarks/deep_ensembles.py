"""What moves deep ensembles on naval and protein (split 0): the learning rate, the adversarial examples
and the epochs, one change at a time from the protocol's settings (``bnn-zoo reproduce deep-ensembles``).

python benchmarks/deep_ensembles.py --data ../shared/data/uci  # writes results/deep-ensembles-split0.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from results import write

from bnn_zoo.experiments import config as cfg
from bnn_zoo.experiments.run import execute

VARIANTS = [  # (dataset, learning rate, adversarial epsilon, epochs)
    ("naval-propulsion-plant", 0.01, 0.01, 40),
    ("naval-propulsion-plant", 0.1, 0.01, 40),
    ("naval-propulsion-plant", 0.01, 0.0, 40),
    ("naval-propulsion-plant", 0.01, 0.0, 200),
    ("protein-tertiary-structure", 0.01, 0.01, 40),
    ("protein-tertiary-structure", 0.1, 0.01, 40),
    ("protein-tertiary-structure", 0.01, 0.0, 40),
]


def run(folder: Path, lr: float, adversarial: float, epochs: int) -> dict:
    hidden = 100 if folder.name.startswith("protein") else 50
    config = cfg.from_dict(
        {
            "data": cfg.node(cfg.UCI, path=str(folder), split=0),
            "model": cfg.node(cfg.MLP, hidden=[hidden], activation="relu"),
            "likelihood": cfg.node(cfg.Heteroscedastic),
            "inference": cfg.node(
                cfg.Ensemble,
                epochs=epochs,
                lr=lr,
                batch_size=100,
                use_prior=False,
                adversarial=adversarial,
                validation=0.0,
            ),
            "evaluation": {"plots": False, "training_evidence": False},
        }
    )
    metrics = execute(config, progress=False).metrics
    return {
        "dataset": folder.name,
        "lr": lr,
        "adversarial": adversarial,
        "epochs": epochs,
        "rmse": metrics["rmse"],
        "nll": -metrics["test_log_likelihood"],
        "fit s": metrics["runtime_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the folder holding the UCI folders")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [run(args.data / name, *settings) for name, *settings in VARIANTS]
    print(write("deep-ensembles-split0", rows, command="python benchmarks/deep_ensembles.py --data ../shared/data/uci"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
