"""Gal & Ghahramani's Mauna Loa CO2 extrapolation (the dropout slides' "model uncertainty" figure):
standard dropout and MC dropout on the same ReLU network, MC dropout with TanH units, and a GP with a
squared-exponential (RBF) kernel, all trained on 1958-1990 and asked to extrapolate to 2001.

    pip install -e '.[examples]' && python examples/mauna_loa_co2.py [--out runs/mauna-loa] [--quick]

Data: the weekly Mauna Loa series bundled with statsmodels, averaged by month. The networks are
1-512-512-512-512-1 with dropout p = 0.1 on every layer's inputs but the first (Gal used 5 x 1024),
a N(0, 1) prior and the noise fixed at 0.05 of the series' sd (Gal: a fixed model precision tau).
Standard dropout is one pass at the guide's mean weights (weight scaling); MC dropout averages
passes with sampled masks (Gal eq. 3.16). Writes <out>/mauna_loa_co2.png and prints the table.
"""

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import bnn_zoo as bz  # noqa: E402
from bnn_zoo.data import Dataset  # noqa: E402
from bnn_zoo.experiments.demo import print_table  # noqa: E402
from bnn_zoo.experiments.run import run  # noqa: E402


def mauna_loa(split_year: float = 1991.0) -> Dataset:
    try:
        from statsmodels.datasets import co2
    except ImportError:
        raise SystemExit(
            "this example reads the CO2 series bundled with statsmodels: pip install -e '.[examples]'"
        ) from None
    monthly = co2.load_pandas().data["co2"].resample("MS").mean().dropna()
    year = torch.tensor(monthly.index.year + (monthly.index.month - 0.5) / 12, dtype=torch.float32)[:, None]
    ppm = torch.tensor(monthly.values, dtype=torch.float32)
    train = year[:, 0] < split_year
    return Dataset("mauna-loa-co2", year[train], ppm[train], year[~train], ppm[~train])


def main(out: Path, quick: bool) -> list:
    """Fit, print and plot the comparison; the Results of the two networks and the GP."""
    data = mauna_loa()
    steps = 300 if quick else 6000
    dropout = {"p": [0.0, 0.1, 0.1, 0.1, 0.1], "masks": "example"}

    def net(activation):
        return bz.BNN(
            bz.models.MLP(1, [512] * 4, 1, activation=activation),
            bz.priors.Normal(1.0),
            bz.likelihoods.Gaussian(0.05 * data.y_std),  # 0.05 of the series' sd, in ppm
        )

    relu = run(
        "mc-dropout-relu",
        data,
        net("relu"),
        bz.SVI(guide="dropout", guide_options=dropout, steps=steps, lr=1e-3, num_draws=200),
        out / "relu",
    )
    tanh = run(
        "mc-dropout-tanh",
        data,
        net("tanh"),
        bz.SVI(guide="dropout", guide_options=dropout, steps=steps, lr=1e-3, num_draws=200),
        out / "tanh",
    )
    gp = run("gp-se", data, bz.GP("rbf"), bz.TypeII(steps=300, lr=0.05), out / "gp")
    print_table([relu, tanh, gp], title=f"{data.name}: trained before 1991, tested on 1991-2001; figure in {out}")

    grid = torch.linspace(1958, 2020, 400)[:, None]
    x = grid  # years: every posterior takes and gives the data's units
    panels = [
        ("Standard dropout, ReLU", relu.posterior.predict(x, at_mean=True)),
        ("MC dropout, ReLU", relu.posterior.predict(x)),
        ("MC dropout, TanH", tanh.posterior.predict(x)),
        ("GP, SE covariance", gp.posterior.predict(x)),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True, sharey=True)
    for ax, (title, pred) in zip(axes.ravel(), panels):
        mean = pred.mean[:, 0]
        sd = pred.variance[:, 0].sqrt()
        for k, alpha in ((2, 0.15), (1, 0.3)):
            ax.fill_between(grid[:, 0], mean - k * sd, mean + k * sd, color="C0", alpha=alpha, lw=0)
        ax.plot(grid[:, 0], mean, "C0", lw=1)
        ax.plot(data.x_train[:, 0], data.y_train, "k", lw=0.6)
        ax.plot(data.x_test[:, 0], data.y_test, "C3", lw=0.6)
        ax.axvline(1991, color="0.5", ls=":")
        ax.set_title(title)
    axes[1][0].set(xlabel="year", ylabel="CO2 (ppm)")
    fig.suptitle("Mauna Loa CO2: mean +- 1 and 2 sd; black: training data, red: held-out 1991-2001")
    fig.tight_layout()
    fig.savefig(out / "mauna_loa_co2.png", dpi=120)
    print(f"figure: {out / 'mauna_loa_co2.png'}")
    return [relu, tanh, gp]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/mauna-loa"))
    parser.add_argument("--quick", action="store_true", help="a short run to check that everything works")
    args = parser.parse_args()
    main(args.out, args.quick)
