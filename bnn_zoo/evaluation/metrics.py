"""Test metrics from a :class:`bnn_zoo.Prediction`, in the targets' original units."""

from __future__ import annotations

import torch


def regression_metrics(pred, y, y_std=1.0) -> dict[str, float]:
    """RMSE and average per-point test log-likelihood (Gal eq. 3.18), both in original units.

    ``pred`` and ``y`` are in standardised units y_s = (y - mean) / y_std; the density picks up the
    Jacobian: log p(y) = log p(y_s) - sum_d log y_std_d.
    """
    y_std = torch.as_tensor(y_std, dtype=y.dtype).reshape(-1)
    rmse = (((pred.mean - y) * y_std) ** 2).mean().sqrt()
    ll = pred.log_likelihood(y).mean() - torch.log(y_std.expand(y.shape[-1])).sum()
    return {"rmse": rmse.item(), "test_log_likelihood": ll.item()}


def classification_metrics(pred, y, bins: int = 10) -> dict[str, float]:
    """Accuracy, NLL (average negative log predictive probability of the true label) and ECE."""
    probs = pred.probs
    if probs.shape[-1] == 1:  # Bernoulli: p(y = 1)
        probs = torch.cat([1 - probs, probs], -1)
    labels = probs.argmax(-1)
    return {"accuracy": (labels == y.long()).float().mean().item(), "nll": -pred.log_likelihood(y).mean().item(),
            "ece": expected_calibration_error(probs, y, bins)}


def expected_calibration_error(probs: torch.Tensor, y: torch.Tensor, bins: int = 10) -> float:
    """ECE = sum_b (n_b / N) |accuracy_b - confidence_b| over equal-width bins of the top-class
    probability (Guo et al. 2017; Heek's thesis sec. 3.1)."""
    confidence, labels = probs.max(-1)
    correct = (labels == y.long()).to(probs.dtype)
    which = (confidence * bins).long().clamp(max=bins - 1)
    total = torch.zeros(bins).index_add_(0, which, torch.ones_like(confidence))
    gap = torch.zeros(bins).index_add_(0, which, correct - confidence).abs()
    return (gap.sum() / total.sum()).item()


def language_model_metrics(probs, y) -> dict[str, float]:
    """Test perplexity per token, exp(-mean log p(token)), from token probabilities (N, T, V) averaged
    over draws (MC dropout's predictive, Gal & Ghahramani 2016); padding (-1) is left out."""
    valid = y >= 0
    logp = probs.gather(-1, y.clamp(min=0)[..., None])[..., 0].clamp_min(1e-30).log()
    nll = -(logp * valid).sum() / valid.sum()
    return {"perplexity": nll.exp().item(), "nll_per_token": nll.item()}
