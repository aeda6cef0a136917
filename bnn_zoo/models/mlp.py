"""Multi-layer perceptron as a plain torch module (bnn_zoo.BNN makes it Bayesian)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bnn_zoo.errors import BnnZooError

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "elu": nn.ELU, "gelu": nn.GELU}
IN_PLACE = {"tanh": torch.tanh_, "relu": torch.relu_, "sigmoid": torch.sigmoid_, "elu": F.elu_}


class Dense(nn.Linear):
    """``nn.Linear`` that applies SVI's per-example noise itself (:class:`~bnn_zoo.protocols.HandlesLocalNoise`):
    the arithmetic of the forward hooks in :func:`bnn_zoo.local_noise.hooks`, without registering and
    removing two hooks per layer at every step, which cost the dropout guide's small-net step a fifth
    of its time (docs/benchmarks.md)."""

    handles_local_noise = True
    _local_noise: dict = {}  # set for the duration of a noisy forward pass; none otherwise

    def forward(self, x):
        noise = self._local_noise.get("weight")
        if noise is None:
            return F.linear(x, self.weight, self.bias)
        x = noise.inputs(self, x)
        return noise.outputs(self, x, F.linear(x, self.weight, self.bias))


class MLP(nn.Module):
    """in_features -> hidden[0] -> ... -> out_features, with ``activation`` between layers.

    ``hidden=[]`` is a single linear layer: with a Normal prior and a Gaussian likelihood of known
    noise, the Bayesian version is Bayesian linear regression. Parameters are named
    ``layers.{i}.weight`` (shape (out, in)) and ``layers.{i}.bias``.

    Args:
        in_features: input columns.
        hidden: widths of the hidden layers.
        out_features: outputs.
        activation: ``"tanh"``, ``"relu"``, ``"sigmoid"``, ``"elu"`` or ``"gelu"``.
    """

    def __init__(self, in_features: int, hidden: Sequence[int] = (50,), out_features: int = 1, activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise BnnZooError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        widths = [in_features, *hidden, out_features]
        if not all(isinstance(w, int) and w > 0 for w in widths):
            raise BnnZooError(f"layer widths must be positive integers, got {widths}")
        self.in_features, self.out_features, self.hidden = in_features, out_features, list(hidden)
        self.activation = activation
        self.layers = nn.ModuleList(Dense(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.act = ACTIVATIONS[activation]()

    def forward(self, x):
        *hidden, out = self.layers  # iterating, not slicing: a ModuleList slice builds a new ModuleList per call
        for layer in hidden:
            x = self.act(layer(x))
        return out(x)

    def forward_draws(self, weights: dict[str, torch.Tensor], x: torch.Tensor, input_masks: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """B weight draws at once (:class:`~bnn_zoo.protocols.ForwardsDraws`): (B, N, out).

        Batched matrix products instead of ``vmap`` over ``forward``: 3x faster for 9-100-1 at 32
        draws x 512 rows, and half of a lockstep step (docs/benchmarks.md). A layer with one output is a
        broadcast product and sum, whose backward is elementwise (bmm's matrix-vector backward took
        3x as long on the same network).

        Args:
            weights: ``layers.{i}.weight`` (B, out, in) and ``layers.{i}.bias`` (B, out).
            x: inputs (N, in) shared by the draws, or (B, N, in).
            input_masks: per-example masks (B, N, in) on a layer's input, by its weight's name.
        """
        masks = input_masks or {}
        last = len(self.layers) - 1
        for i in range(last + 1):
            name = f"layers.{i}.weight"
            w, b = weights[name], weights[f"layers.{i}.bias"].unsqueeze(1)
            if name in masks:
                x = x * masks[name].to(x.dtype)
            if w.shape[1] == 1 and torch.is_grad_enabled():
                x = (x * w).sum(-1, keepdim=True) + b
            else:
                x = torch.baddbmm(b, x.expand(w.shape[0], *x.shape[-2:]), w.transpose(1, 2))
            if i < last:  # in place where torch has it: one activation-sized buffer alive, not two (see below)
                x = IN_PLACE[self.activation](x) if self.activation in IN_PLACE else self.act(x)
        return x

    def extra_repr(self):
        return f"in_features={self.in_features}, hidden={self.hidden}, out_features={self.out_features}, activation={self.activation!r}"
