"""Metrics on predictions: regression (RMSE, test log-likelihood), classification (accuracy, NLL, ECE),
language models (perplexity)."""

from bnn_zoo.evaluation.metrics import classification_metrics, expected_calibration_error, language_model_metrics, regression_metrics

__all__ = ["classification_metrics", "expected_calibration_error", "language_model_metrics", "regression_metrics"]
