"""Datasets and input validation."""

from bnn_zoo.data.datasets import DATASETS, Dataset, load, load_uci, toy_cubic
from bnn_zoo.data.validation import check_data, check_inputs

__all__ = ["DATASETS", "Dataset", "check_data", "check_inputs", "load", "load_uci", "toy_cubic"]
