"""How far an approximate posterior's predictions are from those of a reference posterior of the same
model and data: a converged MCMC run (Wilson, Izmailov et al. 2021, "Evaluating Approximate Inference
in Bayesian Deep Learning"; the NeurIPS 2021 BDL competition's metrics).

- Regression: the 1-D Wasserstein-2 distance between the two predictive distributions of y at each
  test point, W2^2 = int_0^1 (F^-1(u) - G^-1(u))^2 du, by the midpoint rule on ``QUANTILE_LEVELS``
  (the quantiles each run stores in predictions.nc, in original units), averaged over test points.
  Its Monte Carlo floor, the W2 of a predictive to itself, is about 0.04 predictive sds (the sample
  quantiles of ``Y_DRAWS`` draws; more from few draws of f);
  and the ratio of predictive variances, sd^2 / sd_ref^2, as a geometric mean over all test points
  and over the thirds of the test points where the reference is least and most uncertain (below 1:
  over-confident against the posterior).
- Classification: top-1 agreement of the predictive class probabilities, and their total variation
  (1/2) sum_c |p_c - p_ref,c|, averaged over test points.

A reference must have converged: R-hat of f at the test inputs below ``RHAT_MAX`` across at least
``CHAINS_MIN`` chains and bulk ESS of f above ``ESS_MIN`` (:func:`convergence`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import xarray as xr

from bnn_zoo import diagnostics
from bnn_zoo.errors import BnnZooError

QUANTILE_LEVELS = (torch.arange(100, dtype=torch.float64) + 0.5) / 100
Y_DRAWS = 4000  # y draws per test point behind the stored quantiles (each f draw repeated with fresh noise)
RHAT_MAX, ESS_MIN, CHAINS_MIN = 1.01, 400, 4
SCORES = ["w2", "variance_ratio", "variance_ratio_certain", "variance_ratio_uncertain", "agreement", "total_variation"]


def predictive_quantiles(pred, seed: int = 0) -> torch.Tensor:
    """Quantiles of the predictive distribution of y at ``QUANTILE_LEVELS``: (levels, N, outputs), in
    the prediction's units.

    From at least ``Y_DRAWS`` draws of y (each draw of f with fresh noise), under a generator of its
    own so the run's other random numbers are unchanged."""
    repeats = max(1, math.ceil(Y_DRAWS / pred.f.shape[0]))
    with torch.random.fork_rng(device_type="cuda"):
        torch.manual_seed(seed)
        draws = (
            pred.likelihood.distribution(pred.f, pred.latent).sample((repeats,)).reshape(-1, *pred.f.shape[1:]).double()
        )
    index = (QUANTILE_LEVELS * draws.shape[0]).long()  # the midpoint level's order statistic
    q = torch.cat([chunk.sort(0).values[index] for chunk in draws.split(256, dim=1)], dim=1).float()
    return q if pred.units is None else pred.units.unscaled_targets(q)


def convergence(f: torch.Tensor, tree_depth: torch.Tensor | None = None, max_tree_depth: int | None = None) -> dict:
    """Whether draws of f (chains, draws, test points) can serve as a reference: max R-hat and min bulk
    ESS of f over the test points, with the verdict and why. Where R-hat fails, the note says which way:
    the R-hat of f between the two halves of each chain (below ``RHAT_MAX``: each chain is stationary,
    in a mode of its own, and more chains are what helps; above: the chains have not mixed at all) and,
    given NUTS's tree depths (chains, draws), the share of transitions that hit ``max_tree_depth``."""
    chains, draws = f.shape[:2]
    f = f.reshape(chains, draws, -1)
    rhat, ess = diagnostics.rhat_and_ess_bulk(f, rhat=chains > 1)
    rhat = diagnostics.nanmax(rhat) if rhat is not None else float("nan")
    ess = diagnostics.nanmin(ess)
    within = None
    if draws >= 8:  # each chain's halves as two chains of their own
        halves = f[:, : draws // 2 * 2].reshape(chains, 2, draws // 2, -1).permute(1, 2, 0, 3)
        within = diagnostics.nanmax(diagnostics.rhat(halves.reshape(2, draws // 2, -1)))
    failed = [
        *([f"{chains} chains < {CHAINS_MIN}"] if chains < CHAINS_MIN else []),
        *([f"R-hat of f {rhat:.3f} >= {RHAT_MAX}"] if not rhat < RHAT_MAX else []),
        *([f"bulk ESS of f {ess:.0f} <= {ESS_MIN}"] if not ess > ESS_MIN else []),
    ]
    if failed and within is not None and chains > 1 and not rhat < RHAT_MAX:
        why = "each chain is stationary in a mode of its own" if within < RHAT_MAX else "not even each chain has mixed"
        failed.append(f"R-hat of f within a chain {within:.3f}: {why}")
    if failed and tree_depth is not None and max_tree_depth is not None:
        capped = float((tree_depth >= max_tree_depth).double().mean())
        failed += [f"{capped:.0%} of transitions at the maximum tree depth {max_tree_depth}"] if capped >= 0.1 else []
    note = (
        "; ".join(failed)
        if failed
        else f"R-hat of f {rhat:.3f} < {RHAT_MAX}, bulk ESS of f {ess:.0f} > {ESS_MIN}, {chains} chains"
    )
    return {
        "max_rhat_test_f": rhat,
        "min_ess_bulk_test_f": ess,
        "max_rhat_within_chain_test_f": within,
        "reference_converged": not failed,
        "reference_note": note,
    }


def check_reference(metrics: dict, name: str) -> None:
    """Refuse a run whose metrics do not say it converged (see :func:`convergence`)."""
    if not metrics.get("reference_converged", False):
        why = metrics.get("reference_note", "it is not an MCMC run with its convergence measured")
        raise BnnZooError(
            f"{name} cannot serve as a reference posterior: {why}; run MCMC longer or with more chains (at least "
            f"{CHAINS_MIN}; examples/sweeps/uci-reference.yaml is one), or score against it anyway, marked "
            "unconverged: compare(..., allow_unconverged=True), bnn-zoo compare --reference-unconverged"
        )


def scores(predictions: xr.Dataset, reference: xr.Dataset) -> dict:
    """The distance of one run's test predictions (predictions.nc) from the reference's (see module)."""
    if predictions.sizes.get("obs") != reference.sizes.get("obs") or not np.array_equal(
        predictions["y"].values, reference["y"].values
    ):
        raise BnnZooError("the reference was scored on other test data; fit it on the same dataset and split")
    if "probs" in predictions and "probs" in reference:
        p, q = predictions["probs"].values, reference["probs"].values
        return {
            "agreement": float(np.mean(p.argmax(-1) == q.argmax(-1))),
            "total_variation": float(0.5 * np.abs(p - q).sum(-1).mean()),
        }
    if "quantile" not in predictions or "quantile" not in reference:
        raise BnnZooError(
            "a run's predictions.nc holds no predictive quantiles (runs fitted before they were stored); fit it again"
        )
    gap = predictions["quantile"].values - reference["quantile"].values  # (obs, level)
    log_ratio = 2 * (np.log(predictions["sd"].values) - np.log(reference["sd"].values))
    order = np.argsort(reference["sd"].values)
    third = max(1, len(order) // 3)
    return {
        "w2": float(np.sqrt((gap**2).mean(-1)).mean()),
        "variance_ratio": float(np.exp(log_ratio.mean())),
        "variance_ratio_certain": float(np.exp(log_ratio[order[:third]].mean())),
        "variance_ratio_uncertain": float(np.exp(log_ratio[order[-third:]].mean())),
    }
