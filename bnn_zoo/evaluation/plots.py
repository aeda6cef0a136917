"""Plots written as PNGs: predictive bands for 1-D regression, reliability diagrams with Heek's variance
bands, SVI loss, NUTS/HMC energy, trace and rank plots, ArviZ's compare plot, evidence by architecture.

Plots read the stored test predictions (``predictions.nc``, see ``experiments.run.test_predictions``),
so ``bnn-zoo compare`` can draw them from result folders without refitting anything.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt  # the backend is matplotlib's own choice (Agg when there is no display)
import numpy as np
import torch

from bnn_zoo import arviz_compat
from bnn_zoo.evaluation import calibration


def _save(fig, path):
    from bnn_zoo.io import atomic_write

    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def predictive_bands(predictions, path):
    """One panel per run with a 1-D input grid: predictive mean and 50%/95% intervals (noise included),
    in original units, over the training and test points."""
    fig, axes = plt.subplots(1, len(predictions), figsize=(5 * len(predictions), 4), sharey=True, squeeze=False)
    for ax, p in zip(axes[0], predictions):
        g, q = p["x_grid"].values, p["grid_quantile"].values
        ax.fill_between(g, q[:, 0], q[:, 3], alpha=0.25, color="C0", label="95% predictive")
        ax.fill_between(g, q[:, 1], q[:, 2], alpha=0.35, color="C0", label="50% predictive")
        ax.plot(g, p["grid_mean"].values, color="C0", label="predictive mean")
        if p.attrs.get("truth") == "x^3":
            ax.plot(g, g**3, "k--", lw=1, label="y = x^3")
        ax.plot(p["x_test"].values, p["y"].values, ".", color="0.6", ms=3, label="test")
        ax.plot(p["x_train"].values, p["y_train"].values, "o", color="C3", ms=4, label="train")
        ax.set_title(f"{p.attrs['name']}: test RMSE {p.attrs['rmse']:.2f}, LL {p.attrs['test_log_likelihood']:.2f}")
        ax.set_xlabel("x")
        span = np.abs(p["y_train"].values).max()
        ax.set_ylim(-2 * span, 2 * span)
    axes[0][0].set_ylabel("y")
    axes[0][0].legend(loc="upper left", fontsize=8)
    _save(fig, path)


def reliability(predictions, path, bins: int = 10):
    """Classification: Heek's calibration bins (eqs. 3.3-3.5), observed accuracy against the model's own
    expectation with a +-2 sd band. Regression: observed coverage of central predictive intervals
    against their nominal level, with the +-2 sd binomial band of a calibrated predictor."""
    fig, axes = plt.subplots(1, len(predictions), figsize=(4.2 * len(predictions), 4), squeeze=False)
    for ax, p in zip(axes[0], predictions):
        if "probs" in p:
            b = calibration.calibration_bins(torch.as_tensor(p["probs"].values), torch.as_tensor(p["y"].values), bins)
            centre, expected, sd = ((b.lower + b.upper) / 2).numpy(), b.expected.numpy(), b.variance.sqrt().numpy()
            ax.fill_between(
                centre, expected - 2 * sd, expected + 2 * sd, color="C0", alpha=0.25, step="mid", label="E[A] +- 2 sd"
            )
            ax.plot(centre, expected, "C0-", lw=1, label="expected E[A]")
            ax.plot(centre, b.observed.numpy(), "ko", ms=4, label="observed A")
            ax.set(xlabel="predicted probability (bin)", ylabel="fraction true")
        else:
            nominal = np.linspace(0.02, 0.98, 25)
            pit = p["pit"].values
            observed = [(np.abs(pit - 0.5) <= c / 2).mean() for c in nominal]
            sd = np.sqrt(nominal * (1 - nominal) / len(pit))
            ax.fill_between(
                nominal, nominal - 2 * sd, nominal + 2 * sd, color="C0", alpha=0.25, label="calibrated +- 2 sd"
            )
            ax.plot(nominal, observed, "ko", ms=3, label="observed")
            ax.set(xlabel="nominal coverage of the central interval", ylabel="observed coverage")
        ax.plot([0, 1], [0, 1], color="0.5", lw=0.8, ls=":")
        ax.set(xlim=(0, 1), ylim=(0, 1), title=p.attrs["name"])
    axes[0][0].legend(loc="upper left", fontsize=8)
    _save(fig, path)


def diagnostics(name, idata, out_dir, prefix: str = ""):
    """SVI and GP type II: the loss trace (loss.png). NUTS/HMC: ArviZ's energy plot with E-BFMI (energy.png),
    and trace and rank plots of the four parameters with the worst R-hat (trace.png, rank.png). File
    names start with ``prefix``."""
    stats = arviz_compat.group(idata, "sample_stats") or {}
    trace = arviz_compat.group(idata, "optimization") or {}  # a per-step loss
    if "loss" in trace:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(trace["loss"].values, lw=0.8)
        ax.set(xlabel="step", ylabel="negative ELBO or log ML", yscale="symlog", title=f"{name}: training loss")
        _save(fig, out_dir / f"{prefix}loss.png")
    elif "energy" in stats:
        _save(arviz_compat.plot_energy(idata), out_dir / f"{prefix}energy.png")
        worst = _worst_mixing(idata)
        for kind, plot in (("trace", arviz_compat.plot_trace), ("rank", arviz_compat.plot_rank)):
            fig = plot(worst)
            fig.suptitle(f"{name}: the 4 parameters with the worst R-hat")
            _save(fig, out_dir / f"{prefix}{kind}.png")


def _worst_mixing(idata, count: int = 4):
    """The ``count`` scalar parameters with the highest R-hat, as a small InferenceData (trace plots of
    thousands of weights are unreadable)."""
    rhat = arviz_compat.rhat(idata)
    flat = [(float(v), name, idx) for name in rhat.data_vars for idx, v in np.ndenumerate(rhat[name].values)]
    flat.sort(key=lambda t: -np.nan_to_num(t[0], nan=np.inf))
    post = arviz_compat.group(idata, "posterior")
    chosen = {
        f"{name}{list(idx) if idx else ''}": post[name].values[(slice(None), slice(None), *idx)]
        for _, name, idx in flat[:count]
    }
    return arviz_compat.from_samples(chosen)


def compare_plot(idatas: dict, path):
    """ArviZ's plot_compare: LOO elpd of each run (by name) with its SE, and the difference to the best."""
    _save(arviz_compat.plot_compare(idatas), path)


def evidence_by_architecture(table, path):
    """Every log-evidence estimate of every run (+-2 SE), grouped by architecture."""
    estimates = [
        ("elbo", "ELBO"),
        ("evidence_iw", "IW bound"),
        ("evidence_ais", "AIS"),
        ("evidence_laplace", "Laplace"),
        ("evidence_laplace_type_ii", "Laplace, type-II prior (not the declared one)"),
        ("log_marginal_likelihood", "GP log ML"),
    ]
    estimates = [(k, label) for k, label in estimates if k in table and table[k].notna().any()]
    rows = table.sort_values(["architecture", "run"])
    fig, ax = plt.subplots(figsize=(max(5, 2.0 * len(rows)), 4.5))
    positions = np.arange(len(rows))
    for i, (key, label) in enumerate(estimates):
        se = rows[f"{key}_se"].fillna(0).values if f"{key}_se" in rows else np.zeros(len(rows))
        ax.errorbar(
            positions + 0.12 * (i - len(estimates) / 2), rows[key].values, yerr=2 * se, fmt="o", capsize=3, label=label
        )
    # long constructor descriptions wrap under their run's name instead of running into the next label
    ax.set_xticks(positions, [f"{r.run}\n{textwrap.fill(r.architecture, 24)}" for r in rows.itertuples()], fontsize=7)
    ax.set(ylabel="log evidence (nats)", title="evidence by architecture (+-2 SE)")
    ax.legend(fontsize=8)
    _save(fig, path)


def shift_curves(rows: list[dict], path):
    """Accuracy and ECE against shift intensity, one line per method, a column per transform (rows as
    :func:`bnn_zoo.experiments.protocols.shift_curves` gives them)."""
    transforms = sorted({r["transform"] for r in rows})
    methods = sorted({r["inference"] for r in rows})
    colours = plt.get_cmap("tab20").colors  # the zoo has more methods than the default cycle's 10 colours
    fig, axes = plt.subplots(2, len(transforms), figsize=(5.5 * len(transforms), 7), squeeze=False)
    for j, transform in enumerate(transforms):
        for k, method in enumerate(methods):
            own = [r for r in rows if r["transform"] == transform and r["inference"] == method]
            for i, metric in enumerate(("accuracy", "ece")):
                xy = [r["intensity"] for r in own], [r[metric] for r in own]
                axes[i, j].plot(*xy, "o-", ms=3, color=colours[k % len(colours)], label=method)
                axes[i, j].set_xlabel("degrees" if transform == "rotate" else "pixel noise sd")
                axes[i, j].set_ylabel(metric)
                axes[i, j].set_title(f"{metric} under {transform}")
    axes[0, -1].legend(fontsize=7)
    _save(fig, path)
