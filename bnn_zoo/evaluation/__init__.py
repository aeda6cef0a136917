"""Evaluation: test metrics (regression, classification, language models), calibration, uncertainty,
evidence (ELBO, importance-weighted bound, annealed importance sampling) and the exact ground truths."""

from bnn_zoo.evaluation import calibration, predictions, uncertainty
from bnn_zoo.evaluation.calibration import expected_calibration_error
from bnn_zoo.evaluation.metrics import classification_metrics, language_model_metrics, regression_metrics

__all__ = [
    "calibration",
    "classification_metrics",
    "expected_calibration_error",
    "language_model_metrics",
    "predictions",
    "regression_metrics",
    "uncertainty",
]
