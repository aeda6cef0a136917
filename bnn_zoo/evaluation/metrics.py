"""Test metrics from a :class:`bnn_zoo.Prediction`, in its units (a posterior's: the data's)."""

from __future__ import annotations

import torch

from bnn_zoo.errors import BnnZooError
from bnn_zoo.evaluation import calibration, uncertainty

COVERAGES = (0.5, 0.9, 0.95)


def regression_metrics(pred, y) -> dict[str, float]:
    """RMSE, average per-point test log-likelihood (Gal eq. 3.18), coverage of the central 50/90/95%
    predictive intervals, and the mean predictive variance split into its noise part E_s[Var(y | f_s)]
    and model part Var_s[f_s] (law of total variance), in the units of ``pred`` (a posterior's
    prediction: the data's). ``y`` is (N,) for one output or (N, outputs).
    """
    y = _matching_targets(y, pred.mean.shape)
    rmse = ((pred.mean - y) ** 2).mean().sqrt()
    ll = pred.log_likelihood(y).mean()
    pit = pred.cdf(y)
    out = {"rmse": rmse.item(), "test_log_likelihood": ll.item()}
    out.update(
        {f"coverage_{round(100 * c)}": ((pit - 0.5).abs() <= c / 2).to(y.dtype).mean().item() for c in COVERAGES}
    )
    out.update(
        noise_variance=pred.noise_variance.mean().item(),
        model_variance=pred.model_variance.mean().item(),
    )
    return out


def _matching_targets(y: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """y as (N, outputs), the predictions' shape: (N,) for one output is reshaped; any other shape would
    broadcast against the predictions into a silently wrong RMSE, so it is refused."""
    if y.dim() == 1 and tuple(shape) == (y.shape[0], 1):
        y = y[:, None]
    if y.shape != shape:
        raise BnnZooError(
            f"y has shape {tuple(y.shape)} but the predictions {tuple(shape)}; give y as (N,) or (N, outputs)"
        )
    return y


def classification_metrics(pred, y, bins: int = 10) -> dict[str, float]:
    """Accuracy, NLL (mean -log predictive probability of the true label), Brier, ECE and MCE over
    ``bins`` confidence bins, Heek's expected accuracy (eq. 3.1) next to the observed one, and the mean
    predictive entropy, mutual information (BALD) and variation ratio over test points."""
    draws = pred.draw_probs
    probs = draws.mean(0)
    # Bernoulli takes 0./1.
    nll = -pred.log_likelihood(y.to(pred.f.dtype) if pred.f.shape[-1] == 1 else y.long()).mean().item()
    y = y.long()
    return {
        "accuracy": (probs.argmax(-1) == y).to(probs.dtype).mean().item(),
        "nll": nll,
        "brier": calibration.brier_score(probs, y),
        "ece": calibration.expected_calibration_error(probs, y, bins),
        "mce": calibration.maximum_calibration_error(probs, y, bins),
        "expected_accuracy": calibration.expected_accuracy(probs),
        "entropy": uncertainty.predictive_entropy(draws).mean().item(),
        "mutual_information": uncertainty.mutual_information(draws).mean().item(),
        "variation_ratio": uncertainty.variation_ratio(draws).mean().item(),
    }


def language_model_metrics(probs, y) -> dict[str, float]:
    """Test perplexity per token, exp(-mean log p(token)), from token probabilities (N, T, V) averaged
    over draws (MC dropout's predictive, Gal & Ghahramani 2016); padding (-1) is left out."""
    valid = y >= 0
    logp = probs.gather(-1, y.clamp(min=0)[..., None])[..., 0].clamp_min(1e-30).log()
    nll = -(logp * valid).sum() / valid.sum()
    return {"perplexity": nll.exp().item(), "nll_per_token": nll.item()}
