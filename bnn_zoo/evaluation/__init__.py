"""Metrics on predictions: regression (RMSE, test log-likelihood) and classification (accuracy, NLL)."""

from bnn_zoo.evaluation.metrics import classification_metrics, regression_metrics

__all__ = ["classification_metrics", "regression_metrics"]
