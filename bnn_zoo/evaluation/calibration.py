"""Calibration: for classifiers Brier, ECE/MCE, Heek's expected vs observed accuracy, calibration bins
and calibration ROC (Heek's thesis sec. 3.1, eqs. 3.1-3.7), selective prediction and temperature
scaling; for regressors split-conformal intervals.

``probs`` is the predictive p(c | x) averaged over posterior draws (eq. 3.2), shape (N, C); ``y`` the
labels (N,). Binary classifiers pass both columns (1 - p, p).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bnn_zoo.errors import BnnZooError


def brier_score(probs: torch.Tensor, y: torch.Tensor) -> float:
    """(1/N) sum_n sum_c (p(c | x_n) - [y_n = c])^2, in [0, 2]."""
    onehot = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).to(probs.dtype)
    return ((probs - onehot) ** 2).sum(-1).mean().item()


def _confidence_gaps(probs, y, bins):
    """Equal-width bins of the top-class probability: (examples per bin, sum of correct - confidence)."""
    confidence, labels = probs.max(-1)
    correct = (labels == y.long()).to(probs.dtype)
    which = (confidence * bins).long().clamp(max=bins - 1)
    count = torch.zeros(bins, dtype=probs.dtype).index_add_(0, which, torch.ones_like(confidence))
    gap = torch.zeros(bins, dtype=probs.dtype).index_add_(0, which, correct - confidence)
    return count, gap


def expected_calibration_error(probs: torch.Tensor, y: torch.Tensor, bins: int = 10) -> float:
    """ECE = sum_b (n_b / N) |accuracy_b - confidence_b| over equal-width bins of the top-class
    probability (Guo et al. 2017)."""
    count, gap = _confidence_gaps(probs, y, bins)
    return (gap.abs().sum() / count.sum()).item()


def maximum_calibration_error(probs: torch.Tensor, y: torch.Tensor, bins: int = 10) -> float:
    """MCE = max over non-empty bins of |accuracy_b - confidence_b| (Guo et al. 2017)."""
    count, gap = _confidence_gaps(probs, y, bins)
    filled = count > 0
    return (gap[filled].abs() / count[filled]).max().item()


def expected_accuracy(probs: torch.Tensor) -> float:
    """Heek eq. 3.1: the accuracy the model expects of itself, (1/N) sum_n max_c p(c | x_n). Compare it
    with the observed accuracy: expected > observed is overconfidence."""
    return probs.max(-1).values.mean().item()


@dataclass
class CalibrationBins:
    """Heek's calibration bins over every (example, class) probability: per bin [lower, upper), the count,
    the observed accuracy A (eq. 3.3), its expectation E[A] under the model (eq. 3.4) and Var[A] (eq. 3.5)."""

    lower: torch.Tensor
    upper: torch.Tensor
    count: torch.Tensor
    observed: torch.Tensor
    expected: torch.Tensor
    variance: torch.Tensor

    def significant(self, z: float = 1.96) -> torch.Tensor:
        """Bins where the observed accuracy lies outside E[A] +- z sd (miscalibrated at that level)."""
        return (self.observed - self.expected).abs() > z * self.variance.sqrt()


def calibration_bins(probs: torch.Tensor, y: torch.Tensor, bins: int = 10) -> CalibrationBins:
    """Heek eqs. 3.3-3.5 over equal-width bins (the last closed at 1). Every class probability p(c | x_n)
    is a prediction "c" that comes true with probability p if the model is calibrated, so
        A = #(true among those in the bin) / n_b,  E[A] = sum p / n_b,  Var[A] = sum p (1 - p) / n_b^2.
    Empty bins have NaN accuracies."""
    p = probs.reshape(-1)
    hit = torch.nn.functional.one_hot(y.long(), probs.shape[-1]).to(probs.dtype).reshape(-1)
    which = (p * bins).long().clamp(max=bins - 1)

    def per_bin(values):
        return torch.zeros(bins, dtype=probs.dtype).index_add_(0, which, values)

    count = per_bin(torch.ones_like(p))
    edges = torch.linspace(0, 1, bins + 1, dtype=probs.dtype)
    return CalibrationBins(
        edges[:-1], edges[1:], count, per_bin(hit) / count, per_bin(p) / count, per_bin(p * (1 - p)) / count**2
    )


@dataclass
class CalibrationROC:
    """Heek's calibration ROC (eqs. 3.6-3.7): true and false positive rates of "the top class is right"
    as the confidence threshold tau moves, observed and as the model expects them."""

    threshold: torch.Tensor
    tpr: torch.Tensor
    fpr: torch.Tensor
    expected_tpr: torch.Tensor
    expected_fpr: torch.Tensor


def calibration_roc(probs: torch.Tensor, y: torch.Tensor, thresholds: int | torch.Tensor = 101) -> CalibrationROC:
    """Positive = correct top-class prediction, scored by its confidence p_n = max_c p(c | x_n):
        TPR(tau) = #(correct, p_n > tau) / #correct,       FPR(tau) = #(wrong, p_n > tau) / #wrong    (eq. 3.6)
        E[TPR(tau)] = sum_n p_n [p_n > tau] / #correct,  E[FPR(tau)] = sum_n (1 - p_n) [p_n > tau] / #wrong  (eq. 3.7)
    The thesis prints E[FPR]'s numerator as p_n (1 - p_n); the probability that prediction n is a false
    positive is 1 - p_n, which is what is used here. Rates are NaN when no prediction is right (wrong)."""
    confidence, labels = probs.max(-1)
    correct = labels == y.long()
    tau = (
        torch.linspace(0, 1, thresholds, dtype=probs.dtype)
        if isinstance(thresholds, int)
        else torch.as_tensor(thresholds, dtype=probs.dtype)
    )
    above = (confidence[None] > tau[:, None]).to(probs.dtype)  # (thresholds, N)
    n_right, n_wrong = correct.sum().to(probs.dtype), (~correct).sum().to(probs.dtype)
    return CalibrationROC(
        tau,
        (above * correct).sum(1) / n_right,
        (above * ~correct).sum(1) / n_wrong,
        (above * confidence).sum(1) / n_right,
        (above * (1 - confidence)).sum(1) / n_wrong,
    )


@dataclass
class SelectiveCurve:
    """Accuracy on the retained examples when the most uncertain are abstained on, for every coverage."""

    coverage: torch.Tensor  # fraction of examples kept, k / N for k = 1..N
    accuracy: torch.Tensor
    threshold: torch.Tensor  # keep an example when its uncertainty is <= threshold

    def accuracy_at(self, coverage: float) -> float:
        """Accuracy when keeping the ``coverage`` fraction of examples with the lowest uncertainty."""
        k = max(1, round(coverage * len(self.coverage)))
        return self.accuracy[k - 1].item()

    @property
    def area(self) -> float:
        """Mean accuracy over coverages (area under the curve; 1 for a perfect ranking of errors)."""
        return self.accuracy.mean().item()


def selective_prediction(
    probs: torch.Tensor, y: torch.Tensor, uncertainty: torch.Tensor | None = None
) -> SelectiveCurve:
    """Abstain above an uncertainty threshold; as it moves, coverage falls and (for a useful uncertainty)
    accuracy rises. ``uncertainty`` per example defaults to 1 - max_c p(c | x); pass predictive entropy
    or mutual information (``bnn_zoo.evaluation.uncertainty``) to rank by those."""
    confidence, labels = probs.max(-1)
    score = 1 - confidence if uncertainty is None else uncertainty
    order = torch.argsort(score, stable=True)
    correct = (labels == y.long())[order].to(probs.dtype)
    kept = torch.arange(1, len(y) + 1, dtype=probs.dtype)
    return SelectiveCurve(kept / len(y), correct.cumsum(0) / kept, score[order])


def fit_temperature(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Temperature scaling (Guo et al. 2017) of a Bayesian predictive: the T > 0 that minimises the NLL of
    ``temper(probs, T)`` on held-out (validation) labels. Tempering the predictive's log-probabilities,
    not each draw's logits, keeps every example's most probable class, so accuracy does not change."""
    logp = probs.double().clamp_min(1e-300).log()
    labels = y.long()

    def nll(log_t: float) -> float:
        return -torch.log_softmax(logp / math.exp(log_t), -1).gather(-1, labels[:, None]).mean().item()

    lo, hi = math.log(1e-2), math.log(1e2)  # golden-section search: the NLL is unimodal in log T
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        lo, hi = (lo, b) if nll(a) < nll(b) else (a, hi)
    return math.exp((lo + hi) / 2)


def temper(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(log p / T): T > 1 softens an overconfident predictive, T < 1 sharpens it."""
    if not temperature > 0:
        raise BnnZooError(f"a temperature must be positive, got {temperature}")
    return torch.softmax(probs.clamp_min(1e-300).log() / temperature, -1).to(probs.dtype)


@dataclass
class SplitConformal:
    """Split-conformal intervals (Vovk et al. 2005; Lei et al. 2018) around a regressor's predictive mean,
    scaled by its predictive sd: on calibration data the scores |y - mean| / sd, q their
    ceil((n + 1)(1 - alpha))-th smallest; the interval mean +- q sd then covers a new exchangeable point
    with probability at least 1 - alpha (and below 1 - alpha + 1 / (n + 1) when scores do not tie).

    Build it with :meth:`fit`; ``interval(mean, sd)`` gives (lower, upper)."""

    quantile: float
    alpha: float

    @classmethod
    def fit(cls, mean: torch.Tensor, sd: torch.Tensor, y: torch.Tensor, alpha: float = 0.1) -> SplitConformal:
        """From calibration predictions (mean, sd) and targets y, all of one shape."""
        if not 0 < alpha < 1:
            raise BnnZooError(f"alpha is a miscoverage rate in (0, 1), got {alpha}")
        if not (mean.shape == sd.shape == y.shape):
            raise BnnZooError(f"mean, sd and y must share a shape, got {mean.shape}, {sd.shape}, {y.shape}")
        scores = ((y - mean).abs() / sd).flatten()
        n = scores.numel()
        rank = math.ceil((n + 1) * (1 - alpha))
        if rank > n:
            raise BnnZooError(
                f"{n} calibration points cannot certify {1 - alpha:.0%} coverage; give at least "
                f"{math.ceil((1 - alpha) / alpha)} points or a larger alpha"
            )
        return cls(scores.kthvalue(rank).values.item(), alpha)

    def interval(self, mean: torch.Tensor, sd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mean - self.quantile * sd, mean + self.quantile * sd
