"""Collapse: a fit that has learned (almost) nothing about the inputs, or whose learned noise has
vanished, said in words.

A BNN whose prior or KL term overwhelms the data predicts the same thing for every input: a constant
mean with everything else called noise (regression), the class frequencies (classification), or the
uniform next token (language models); a loss that never moved is the same failure seen from the
optimiser. The opposite collapse calls nothing noise: a GP whose type-II noise variance fell onto its
constraint's lower bound interpolates its training targets: unless they have no noise, its evidence
rises as its predictions for new inputs fail. Test metrics show either only to a reader who knows
what to look for, so ``diagnose`` names it, and :mod:`bnn_zoo.inference.health` warns of it after
every fit (``collapse_warning``).
"""

from __future__ import annotations

import math

import torch

from bnn_zoo.protocols import BoundsNoise

MIN_EXPLAINED = 0.10  # regression: share of the training targets' variance the predictive mean explains
MIN_INFORMATION = 0.10  # classification: share of the labels' entropy the predictions carry about the input
MIN_ACCURACY_GAIN = 0.10  # ... or share of the gap from the majority class's accuracy to 1 the fit closes
MAX_PERPLEXITY = 0.9  # language models: perplexity as a share of the vocabulary size (uniform guessing is 1)
MIN_LOSS_CHANGE = 1e-3  # relative change of the loss from its first to its last 5% of steps
DRAWS = 100  # posterior draws for the training-set prediction
ON_BOUND = 1.5  # a learned noise variance under this many times its constraint's lower bound sits on it


def diagnose(posterior, metrics: dict, vocabulary: int | None = None) -> str:
    """What collapsed, as one sentence ("" when nothing did), from predictions on the training data
    (regression, classification), the test perplexity (language models) and the loss trace (SVI)."""
    task = posterior.model.likelihood.task
    signs = []
    if task == "language-model":
        if vocabulary and metrics.get("perplexity", 0) >= MAX_PERPLEXITY * vocabulary:
            signs.append(
                f"test perplexity {metrics['perplexity']:.1f} is that of guessing uniformly among {vocabulary} tokens"
            )
    else:
        # a chain's draws are all it has
        stored = getattr(posterior, "num_draws", DRAWS) * getattr(posterior, "num_chains", 1)
        x, y = posterior.training_data()
        with torch.no_grad():
            pred = posterior.predict(x, num_samples=min(DRAWS, stored))
        signs.append(_regression(pred, y) if task == "regression" else _classification(pred, y))
        signs.append(_noise_on_bound(posterior) if task == "regression" else "")
    signs.append(_flat_loss(getattr(posterior, "sample_stats", {}).get("loss")))
    return "; ".join(s for s in signs if s)


def _regression(pred, y) -> str:
    explained = 1 - float(((pred.mean - y) ** 2).mean() / y.var(unbiased=False).mean())
    if explained >= MIN_EXPLAINED:
        return ""
    return (
        f"the predictive mean explains {explained:.1%} of the training targets' variance: the fit predicts a "
        "constant and calls the rest noise"
    )


def _noise_on_bound(posterior) -> str:
    """Type II's maximum on the boundary: the noise is not fitted, the training targets are interpolated."""
    if not isinstance(posterior, BoundsNoise):
        return ""
    noise, bound = posterior.noise_and_bound()
    if noise > ON_BOUND * bound:
        return ""
    return (
        f"its noise variance fell onto its lower bound ({noise:.3g}, bound {bound:.3g}): it "
        "interpolates the training targets, which is right only if they have no noise; where they do, its evidence and "
        "its predictions for new inputs cannot be trusted (with ARD length-scales, try ard=False)"
    )


def _classification(pred, y) -> str:
    """Mutual information between input and predicted label, I = H(mean_i p_i) - mean_i H(p_i), as a
    share of H(mean_i p_i): 1 when every prediction is certain, 0 when all inputs get the same one.
    Hedged predictions carry little information even when they rank the classes right, so a fit is
    collapsed only if its training accuracy also closes under 10% of the gap from the majority class
    to 1 (an SGLD LSTM at 0.87 accuracy against a majority of 0.61 carried 7.8%)."""
    probs = pred.draw_probs.mean(0).clamp_min(1e-12)  # (N, C), a Bernoulli's as (1 - p, p)
    marginal = probs.mean(0)
    label_entropy = float(-(marginal * marginal.log()).sum())
    mean_entropy = float(-(probs * probs.log()).sum(-1).mean())
    share = (label_entropy - mean_entropy) / label_entropy if label_entropy > 0 else 0.0
    labels = y.long().reshape(-1)
    majority = float(torch.bincount(labels).max()) / labels.numel()
    accuracy = float((probs.argmax(-1) == labels).float().mean())
    if share >= MIN_INFORMATION or accuracy >= majority + MIN_ACCURACY_GAIN * (1 - majority):
        return ""
    return (
        f"its predictions carry {share:.1%} of the labels' information and {accuracy:.1%} of the training labels are "
        f"right (the majority class alone: {majority:.1%}): nearly every input gets the same class probabilities"
    )


def _flat_loss(loss) -> str:
    if loss is None or loss.numel() < 20:
        return ""
    k = max(1, loss.numel() // 20)
    first, last = float(loss[:k].mean()), float(loss[-k:].mean())
    if not (math.isfinite(first) and math.isfinite(last)) or abs(first - last) > MIN_LOSS_CHANGE * abs(first):
        return ""
    return f"the loss never moved ({first:.4g} at the start, {last:.4g} at the end)"
