"""Datasets and input validation."""

from bnn_zoo.data.datasets import Dataset, digits, load_uci, toy_cubic
from bnn_zoo.data.validation import check_data, check_inputs

__all__ = ["Dataset", "check_data", "check_inputs", "digits", "load_uci", "toy_cubic"]
