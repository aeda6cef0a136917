"""Multi-layer perceptron as a plain torch module (bnn_zoo.BNN makes it Bayesian)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from bnn_zoo.errors import BnnZooError, checked

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "elu": nn.ELU, "gelu": nn.GELU}
IN_PLACE = {"tanh": torch.tanh_, "relu": torch.relu_, "sigmoid": torch.sigmoid_, "elu": F.elu_}


def _sigmoid_slope_(u: torch.Tensor) -> torch.Tensor:
    """sigmoid's derivative from its output u, u (1 - u), written into u's buffer."""
    return u.addcmul_(u, u, value=-1)


class _Parts(NamedTuple):
    """An activation as forward_draws_vjp computes it: u = fn_(pre * a) in place, h = scale * u + shift,
    and du/d(pre a) from u alone, in place. Only u is stored; scale and shift are folded into the small
    weight and bias tensors of the layer that reads it, and pre into the layer that writes a."""

    pre: float
    scale: float
    shift: float
    fn_: Callable[[torch.Tensor], torch.Tensor]
    slope_: Callable[[torch.Tensor], torch.Tensor]


# tanh(a) = 2 sigmoid(2a) - 1: torch's float32 tanh costs 2.6 ns an element on this CPU kind, its sigmoid
# 0.4, and with the factors folded away the activation and its derivative are one pass each (the same
# absolute error, 2e-7; docs/benchmarks.md)
VJP_PARTS = {
    "tanh": _Parts(2.0, 2.0, -1.0, torch.sigmoid_, _sigmoid_slope_),
    "sigmoid": _Parts(1.0, 1.0, 0.0, torch.sigmoid_, _sigmoid_slope_),
    "relu": _Parts(1.0, 1.0, 0.0, torch.relu_, lambda u: u.gt_(0)),  # 1 where u > 0
    "elu": _Parts(1.0, 1.0, 0.0, F.elu_, lambda u: u.clamp_(max=0).add_(1)),  # 1 where u > 0, exp(a) = u + 1 elsewhere
}


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
        hidden: widths of the hidden layers ([] is a linear model).
        out_features: outputs.
        activation: the hidden layers' nonlinearity.
    """

    @checked
    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int] = (50,),
        out_features: int = 1,
        activation: Literal["tanh", "relu", "sigmoid", "elu", "gelu"] = "tanh",
    ):
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

    def forward_draws(
        self, weights: dict[str, torch.Tensor], x: torch.Tensor, input_masks: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """B weight draws at once (:class:`~bnn_zoo.protocols.ForwardsDraws`): (B, N, out).

        Batched matrix products instead of ``vmap`` over ``forward``, which is slower on small layers
        (docs/benchmarks-speed.md). A layer with one output is a broadcast product and sum, whose
        backward is elementwise (bmm's matrix-vector backward is slower there).

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

    def forward_draws_vjp(self, weights: dict[str, torch.Tensor], x: torch.Tensor):
        """B weight draws on shared inputs x (N, in), with the hand-derived backward
        (:class:`~bnn_zoo.protocols.BackpropagatesDraws`): returns (outputs (B, N, out), backward), where
        ``backward(g)`` maps the outputs' gradient g (B, N, out) to the weights' gradients (call it once:
        it reuses the activations' buffers).

        The first layer is one (N, in) x (in, B * width) product for all draws (B small products with
        ``in`` = 13 ran at a third of the speed), tanh is computed through sigmoid (:data:`VJP_PARTS`),
        and no autograd graph is recorded, which with the priors and likelihood written out is about half
        autograd's cost (docs/benchmarks.md). GELU's derivative needs its input, so a GELU network
        takes autograd's vjp instead."""
        if self.activation not in VJP_PARTS:
            f, vjp = torch.func.vjp(lambda w: self.forward_draws(w, x), weights)
            return f, lambda g: vjp(g)[0]
        act = VJP_PARTS[self.activation]
        draws, n = weights["layers.0.weight"].shape[0], x.shape[0]
        last = len(self.layers) - 1
        stored = [x]  # each layer's input as stored: x, then the activations' u (B, N, width)
        for i in range(last + 1):
            # the activation's factors go into the small weight and bias tensors: scaling the (B, N, width)
            # products instead (addmm's alpha included) cost a pass over them each
            w, bias = weights[f"layers.{i}.weight"], weights[f"layers.{i}.bias"]
            pre = act.pre if i < last else 1.0
            if i == 0:  # (N, B, out) in memory, seen as (B, N, out)
                columns = w.permute(2, 0, 1).reshape(x.shape[1], -1)
                a = torch.addmm(pre * bias.reshape(1, -1), x, pre * columns).view(n, draws, -1).transpose(0, 1)
            else:  # h W^T + b with h = scale u + shift; bmm for one output too (cheaper than a broadcast product)
                bias = bias + act.shift * w.sum(-1) if act.shift else bias
                a = torch.baddbmm(pre * bias.unsqueeze(1), stored[-1], (pre * act.scale) * w.transpose(1, 2))
            if i < last:
                stored.append(act.fn_(a))

        def backward(g: torch.Tensor) -> dict[str, torch.Tensor]:
            grads = {}
            for i in range(last, -1, -1):
                w, u = weights[f"layers.{i}.weight"], stored[i]
                grads[f"layers.{i}.bias"] = g.sum(1)
                if i == 0:
                    by_column = g.transpose(0, 1).reshape(n, -1)  # (N, B * out)
                    grads["layers.0.weight"] = torch.mm(x.t(), by_column).view(x.shape[1], draws, -1).permute(1, 2, 0)
                    break
                # every product below is written into u's own layout: mixing the first layer's (N, B, width)
                # memory with a (B, N, width) operand made each of them several times slower
                grad_w = torch.bmm(g.transpose(1, 2), u).mul_(act.scale)
                grads[f"layers.{i}.weight"] = (
                    grad_w.add_(act.shift * grads[f"layers.{i}.bias"].unsqueeze(-1)) if act.shift else grad_w
                )
                w = (act.scale * act.pre) * w  # dh/da = scale pre du/d(pre a)
                # with one output, g w is an outer product: two broadcast products (71 us) beat bmm (151)
                g = act.slope_(u).mul_(g).mul_(w) if w.shape[1] == 1 else act.slope_(u).mul_(torch.bmm(g, w))
            return grads

        return a, backward

    def extra_repr(self):
        return (
            f"in_features={self.in_features}, hidden={self.hidden}, out_features={self.out_features}, "
            f"activation={self.activation!r}"
        )
