"""Uncertainty where the data stop: image classifiers under growing shift (Ovadia et al. 2019) and
out-of-distribution detection by the predictive's uncertainty.

Shift: the test images rotated by growing angles and with Gaussian pixel noise of growing sd, scored
by accuracy, NLL, Brier and ECE at each intensity. OOD: examples of classes the classifier never saw
are the positives, the in-distribution test examples the negatives, ranked by predictive entropy,
mutual information (BALD) and 1 - max probability; AUROC, AUPR (average precision) and the FPR at 95%
TPR.
"""

from __future__ import annotations

import math

import torch

from bnn_zoo.evaluation import uncertainty
from bnn_zoo.evaluation.metrics import classification_metrics

ROTATIONS = (15, 30, 45, 60, 75, 90)  # degrees
NOISE = (1.0, 2.0, 4.0, 8.0)  # pixel sd, on scikit-learn digits' 0..16 scale
SHIFT_METRICS = ("accuracy", "nll", "brier", "ece")
SCORES = {
    "entropy": uncertainty.predictive_entropy,
    "mutual_information": uncertainty.mutual_information,
    "max_probability": lambda draws: 1 - draws.mean(0).max(-1).values,
}


def rotate(images: torch.Tensor, degrees: float, shape: tuple[int, int, int]) -> torch.Tensor:
    """Flattened images (N, C*H*W) rotated by ``degrees`` about their centre (bilinear, zeros outside)."""
    theta = math.radians(degrees)
    affine = torch.tensor([[math.cos(theta), -math.sin(theta), 0.0], [math.sin(theta), math.cos(theta), 0.0]])
    x = images.reshape(-1, *shape)
    grid = torch.nn.functional.affine_grid(affine.expand(len(x), 2, 3).to(x.dtype), list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, align_corners=False).reshape(images.shape)


def noisy(images: torch.Tensor, sd: float, seed: int = 0) -> torch.Tensor:
    """The images plus N(0, sd^2) noise per pixel, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return images + sd * torch.randn(images.shape, generator=g, dtype=images.dtype)


def shifted_metrics(posterior, dataset, num_samples: int | None = None) -> dict[str, float]:
    """``shift_rotate_<deg>_<metric>`` and ``shift_noise_<sd>_<metric>`` for every intensity, on the
    test images of an image dataset (``dataset.info["image_shape"]``), in its original pixel units."""
    out = {}
    shape = dataset.info["image_shape"]
    transforms = [(f"rotate_{d}", lambda x, d=d: rotate(x, d, shape)) for d in ROTATIONS]
    transforms += [(f"noise_{s:g}", lambda x, s=s: noisy(x, s)) for s in NOISE]
    for name, transform in transforms:
        x = transform(dataset.x_test)  # in pixel units: the posterior standardises as its fit did
        metrics = classification_metrics(posterior.predict(x, num_samples=num_samples), dataset.y_test)
        out.update({f"shift_{name}_{m}": metrics[m] for m in SHIFT_METRICS})
    return out


def ood_metrics(draws_in: torch.Tensor, draws_out: torch.Tensor) -> dict[str, float]:
    """``ood_<auroc|aupr|fpr95>_<score>`` from per-draw class probabilities (draws, N, C) of the
    in-distribution and the out-of-distribution examples."""
    out = {}
    for name, score in SCORES.items():
        s_in, s_out = score(draws_in), score(draws_out)
        out[f"ood_auroc_{name}"] = auroc(s_in, s_out)
        out[f"ood_aupr_{name}"] = average_precision(s_in, s_out)
        out[f"ood_fpr95_{name}"] = fpr_at_tpr(s_in, s_out, 0.95)
    return out


def auroc(negatives: torch.Tensor, positives: torch.Tensor) -> float:
    """P(score of a positive > score of a negative) + P(tie) / 2: the Mann-Whitney form of the AUROC."""
    scores = torch.cat([negatives, positives]).double()
    ranks = _average_ranks(scores)
    n_pos, n_neg = len(positives), len(negatives)
    return ((ranks[n_neg:].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)).item()


def average_precision(negatives: torch.Tensor, positives: torch.Tensor) -> float:
    """Area under the precision-recall curve of the positives, as average precision: the mean over
    positives of the precision among examples scored at least as high."""
    scores = torch.cat([negatives, positives]).double()
    is_pos = torch.cat([torch.zeros(len(negatives)), torch.ones(len(positives))]).double()
    above = (scores[None, :] >= scores[is_pos.bool(), None]).double()  # (positives, all)
    return ((above * is_pos).sum(1) / above.sum(1)).mean().item()


def fpr_at_tpr(negatives: torch.Tensor, positives: torch.Tensor, tpr: float = 0.95) -> float:
    """The fraction of negatives scored at or above the threshold that catches ``tpr`` of the positives."""
    threshold = positives.double().sort(descending=True).values[math.ceil(tpr * len(positives)) - 1]
    return (negatives.double() >= threshold).double().mean().item()


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """1-based ranks, ties given their average rank."""
    order = values.argsort(stable=True)
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(1, len(values) + 1, dtype=values.dtype)
    unique, inverse = values.unique(return_inverse=True)
    sums = torch.zeros(len(unique), dtype=values.dtype).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(unique), dtype=values.dtype).index_add_(0, inverse, torch.ones_like(ranks))
    return (sums / counts)[inverse]


__all__ = ["auroc", "average_precision", "fpr_at_tpr", "ood_metrics", "rotate", "shifted_metrics"]
