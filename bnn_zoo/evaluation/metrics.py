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


def classification_metrics(pred, y) -> dict[str, float]:
    """Accuracy and NLL (average negative log predictive probability of the true label)."""
    probs = pred.probs
    labels = (probs[:, 0] > 0.5).long() if probs.shape[-1] == 1 else probs.argmax(-1)
    return {"accuracy": (labels == y.long()).float().mean().item(), "nll": -pred.log_likelihood(y).mean().item()}
