"""Baselines that sit next to the BNNs in every comparison: GPyTorch Gaussian processes."""

from bnn_zoo.baselines.gp import GP, GPPosterior, NNGPKernel, TypeII

__all__ = ["GP", "GPPosterior", "NNGPKernel", "TypeII"]
