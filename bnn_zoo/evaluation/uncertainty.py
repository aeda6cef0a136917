"""Uncertainty of a classifier's prediction from per-draw class probabilities p_s = p(c | x, w_s), shape
(S, N, C) (Gal's thesis sec. 3.3.1): predictive entropy (total), mutual information (the model's part,
BALD) and variation ratio. Each returns one value per example, shape (N,), in nats."""

from __future__ import annotations

import torch


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum(-1)  # 0 log 0 = 0


def predictive_entropy(draw_probs: torch.Tensor) -> torch.Tensor:
    """H[y | x, D] = -sum_c pbar_c log pbar_c with pbar = (1/S) sum_s p_s."""
    return _entropy(draw_probs.mean(0))


def mutual_information(draw_probs: torch.Tensor) -> torch.Tensor:
    """I[y, w | x, D] = H[y | x, D] - (1/S) sum_s H[p_s] (BALD; Houlsby et al. 2011): high when draws
    disagree confidently, zero when they agree (however uncertain each is). Clamped at 0 against
    round-off."""
    return (predictive_entropy(draw_probs) - _entropy(draw_probs).mean(0)).clamp_min(0)


def variation_ratio(draw_probs: torch.Tensor) -> torch.Tensor:
    """1 - f_mode / S, where f_mode counts the draws whose top class is the most common top class."""
    top = draw_probs.argmax(-1)  # (S, N)
    counts = torch.nn.functional.one_hot(top, draw_probs.shape[-1]).sum(0)  # (N, C)
    return 1 - counts.max(-1).values.to(draw_probs.dtype) / draw_probs.shape[0]
