"""Architectures as plain torch modules; :class:`bnn_zoo.BNN` turns any of them into a Pyro model."""

from bnn_zoo.models.mlp import MLP

__all__ = ["MLP"]
