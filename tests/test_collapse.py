"""The collapse check (bnn_zoo.inference.collapse) on predictions whose information content is known
by construction: it must name a constant predictor, and leave alone a fit that learned something."""

from types import SimpleNamespace

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.inference.collapse import diagnose
from bnn_zoo.posterior import Prediction


def _posterior(likelihood, f, y, loss=None):
    """A stand-in posterior whose predictions on its training inputs are the draws ``f`` (draws, N, out)."""
    predict = lambda x, num_samples: Prediction(f[:num_samples], {}, likelihood)  # noqa: E731
    stats = {} if loss is None else {"loss": torch.as_tensor(loss)}
    model = SimpleNamespace(likelihood=likelihood)
    x = torch.zeros(len(y), 1)
    return SimpleNamespace(
        model=model, training_data=lambda: (x, y), predict=predict, sample_stats=stats, num_draws=f.shape[0]
    )


LABELS = torch.tensor([0] * 61 + [1] * 39)  # the majority class alone is right on 61%


@pytest.mark.parametrize(
    "logits, collapsed",
    [
        (torch.zeros(100), True),  # the same probabilities for every input
        (torch.full((100,), 0.4), True),  # the class frequencies for every input: majority accuracy
        (torch.where(LABELS == 1, 0.1, -0.1), False),  # hedged (p = 0.52 / 0.48) but every label right: not a collapse
        (torch.where(LABELS == 1, 6.0, -6.0), False),  # confident and right
    ],
)
def test_a_classifier_is_collapsed_when_its_predictions_neither_inform_nor_beat_the_majority(logits, collapsed):
    f = torch.stack([logits.unsqueeze(-1)] * 3)  # 3 identical draws, N = 100, one Bernoulli logit
    found = diagnose(_posterior(bz.likelihoods.Bernoulli(), f, LABELS), {})
    assert bool(found) == collapsed, found
    if collapsed:
        assert "61.0%" in found  # it names the majority-class rate it is compared with


def test_a_constant_regression_and_a_loss_that_never_moved_are_named():
    y = torch.linspace(-2, 2, 50).unsqueeze(-1)
    likelihood = bz.likelihoods.Gaussian(1.0)
    constant = _posterior(likelihood, torch.zeros(4, 50, 1), y, loss=[100.0] * 40)
    assert "explains 0.0% of the training targets' variance" in diagnose(constant, {})
    assert "the loss never moved" in diagnose(constant, {})
    fitted = _posterior(
        likelihood, torch.stack([y + 0.1 * torch.randn_like(y) for _ in range(4)]), y, loss=torch.linspace(100, 10, 40)
    )
    assert diagnose(fitted, {}) == ""


def test_a_language_model_at_uniform_perplexity_is_named():
    lm = SimpleNamespace(model=SimpleNamespace(likelihood=SimpleNamespace(task="language-model")), sample_stats={})
    assert "guessing uniformly among 40 tokens" in diagnose(lm, {"perplexity": 39.0}, vocabulary=40)
    assert diagnose(lm, {"perplexity": 12.0}, vocabulary=40) == ""
