"""Plots written as PNGs: predictive bands for 1-D regression, SVI loss, NUTS/HMC energy (E-BFMI)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import arviz as az  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def predictive_bands(results, dataset, path, num_points: int = 200):
    """One panel per result: predictive mean and 50%/95% intervals (noise included), in original units."""
    x_all = torch.cat([dataset.x_train, dataset.x_test])[:, 0]
    lo, hi = x_all.min().item(), x_all.max().item()
    pad = 0.25 * (hi - lo)
    grid = torch.linspace(lo - pad, hi + pad, num_points)[:, None]
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), sharey=True, squeeze=False)
    for ax, result in zip(axes[0], results):
        pred = result.posterior.predict((grid - dataset.x_mean) / dataset.x_std)
        q = pred.quantiles([0.025, 0.25, 0.75, 0.975])[..., 0] * dataset.y_std + dataset.y_mean
        mean = pred.mean[:, 0] * dataset.y_std + dataset.y_mean
        g = grid[:, 0].numpy()
        ax.fill_between(g, q[0], q[3], alpha=0.25, color="C0", label="95% predictive")
        ax.fill_between(g, q[1], q[2], alpha=0.35, color="C0", label="50% predictive")
        ax.plot(g, mean, color="C0", label="predictive mean")
        if dataset.name == "toy-cubic":
            ax.plot(g, g**3, "k--", lw=1, label="y = x^3")
        ax.plot(dataset.x_test[:, 0], dataset.y_test, ".", color="0.6", ms=3, label="test")
        ax.plot(dataset.x_train[:, 0], dataset.y_train, "o", color="C3", ms=4, label="train")
        ax.set_title(f"{result.name}: test RMSE {result.metrics['rmse']:.2f}, LL {result.metrics['test_log_likelihood']:.2f}")
        ax.set_xlabel("x")
    axes[0][0].set_ylabel("y")
    axes[0][0].legend(loc="upper left", fontsize=8)
    span = dataset.y_train.abs().max().item()
    axes[0][0].set_ylim(-2 * span, 2 * span)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def diagnostics(result, out_dir):
    """SVI: the loss trace (loss.png). NUTS/HMC: ArviZ's energy plot with E-BFMI (energy.png)."""
    stats = result.posterior.sample_stats
    if "loss" in stats:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(stats["loss"].numpy(), lw=0.8)
        ax.set(xlabel="step", ylabel="negative ELBO", yscale="symlog", title=f"{result.name}: SVI loss")
        fig.tight_layout()
        fig.savefig(out_dir / "loss.png", dpi=120)
        plt.close(fig)
    elif "energy" in stats:
        ax = az.plot_energy(result.idata)
        ax.figure.savefig(out_dir / "energy.png", dpi=120)
        plt.close(ax.figure)
