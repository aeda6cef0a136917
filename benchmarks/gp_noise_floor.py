"""The RBF GP's type-II noise on wine-quality-red splits, with ARD length-scales (the sweep's GP) and
with one length-scale: where the noise variance falls onto GPyTorch's lower bound the fit interpolates
its training targets and says so (``collapse_warning``). Writes results/gp-noise-floor.json.

    python benchmarks/gp_noise_floor.py ../shared/data/uci/wine-quality-red --splits 2 7
"""

from __future__ import annotations

import argparse
import warnings

import torch
from results import write

import bnn_zoo as bz
from bnn_zoo.data import load_uci
from bnn_zoo.evaluation import regression_metrics


def row(folder: str, split: int, ard: bool) -> dict:
    data = load_uci(folder, split)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        post = bz.fit(bz.GP("rbf", ard=ard), data.x_train, data.y_train, bz.TypeII(progress=False))
    noise, bound = post.noise_and_bound()
    metrics = regression_metrics(post.predict(data.x_test), data.y_test[:, None])
    return {
        "split": split,
        "kernel": "rbf, ard" if ard else "rbf",
        "noise variance / bound": noise / bound,
        "log ML": post.log_marginal_likelihood(),
        "test RMSE": metrics["rmse"],
        "test LL": metrics["test_log_likelihood"],
        "says it collapsed": any("noise variance fell onto its lower bound" in str(w.message) for w in caught),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a UCI folder (wine-quality-red)")
    parser.add_argument("--splits", type=int, nargs="+", default=[2, 7])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row(args.folder, split, ard) for split in args.splits for ard in (True, False)]
    for r in rows:
        print(r, flush=True)
    splits = " ".join(map(str, args.splits))
    write("gp-noise-floor", rows, command=f"python benchmarks/gp_noise_floor.py wine-quality-red --splits {splits}")


if __name__ == "__main__":
    main()
