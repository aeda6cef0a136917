"""The network and guide contracts, stated as ``typing.Protocol``s.

A network is any ``torch.nn.Module``; the optional attributes below are how it tells bnn-zoo more
(its widths, where a dropout guide puts masks). A guide is any Pyro guide; one that also states its
per-site distributions (:class:`SiteDistributions`) gets SVI's direct ELBO. The posterior contract,
which the BNN ``Posterior`` and the GP baseline's ``GPPosterior`` both implement, is
:class:`bnn_zoo.posterior.PosteriorLike`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch.distributions import Distribution


@runtime_checkable
class Network(Protocol):
    """What :class:`bnn_zoo.BNN` needs of an architecture: a torch module mapping inputs (N, features)
    to outputs (N, out). Every parameter it owns becomes a sample site named after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor: ...

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Any: ...


@runtime_checkable
class DeclaresWidths(Protocol):
    """Optional: a network that declares its input and output widths (checked against the data
    before any training; otherwise they are read off one forward pass)."""

    in_features: int
    out_features: int


@runtime_checkable
class PlacesDropout(Protocol):
    """Optional: a network that says which weights a dropout guide masks (LeNet's lenet-all and
    lenet-ip); other weights get drop probability 0."""

    @property
    def dropout_layers(self) -> list[str]: ...


@runtime_checkable
class MovesMasks(Protocol):
    """Optional: a network whose per-example input mask for a weight acts on another module's input
    (LeNet: before the pooling that precedes the next convolution). Maps weight name to module name."""

    @property
    def mask_sites(self) -> dict[str, str]: ...


@runtime_checkable
class HandlesLocalNoise(Protocol):
    """Optional, on a submodule: it applies its own per-example noise (recurrent layers, embeddings),
    reading it from ``module._local_noise`` instead of through forward hooks."""

    handles_local_noise: bool


@runtime_checkable
class ForwardsDraws(Protocol):
    """Optional: a network that evaluates a batch of weight draws itself, faster than ``torch.func.vmap``
    over its ``forward`` (bnn_zoo's MLP: batched matrix products; its LeNet: grouped convolutions).
    ``weights[name]`` is (B, *shape); ``x`` is (N, in), shared by the draws, or (B, N, in), one
    minibatch per draw; ``input_masks[name]``, (B, N, *that layer's input shape), multiplies the input
    of the layer owning weight ``name`` (per-example dropout).
    Returns (B, N, out): what vmap over ``forward`` returns, to floating-point rounding."""

    def forward_draws(
        self, weights: dict[str, torch.Tensor], x: torch.Tensor, input_masks: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor: ...


@runtime_checkable
class BackpropagatesDraws(Protocol):
    """Optional: a network that evaluates B weight draws on shared inputs (N, in) and returns, with the
    outputs (B, N, out), its own backward: a function from the outputs' gradient (B, N, out) to the
    weights' gradients, by name, each (B, *shape). Samplers whose potential is evaluated at every
    leapfrog step (ChEES) use it instead of autograd (bnn_zoo's MLP: 2.2x per gradient on Boston
    13-50-1, docs/benchmarks.md). The outputs may be computed in a faster form that differs from
    ``forward`` by floating-point rounding; the backward must be the exact gradient of those outputs."""

    def forward_draws_vjp(
        self, weights: dict[str, torch.Tensor], x: torch.Tensor
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], dict[str, torch.Tensor]]]: ...


@runtime_checkable
class SiteDistributions(Protocol):
    """Optional, on a guide: q(w) = prod_s q_s(w_s), one reparameterised distribution per latent site.

    ``site_distributions()`` maps each latent site, in the model's order, to ``(q_s, infer)``: the
    distribution the guide samples the site from and the ``infer`` dict it passes to ``pyro.sample``
    (``{"local_noise": ...}`` for per-example noise). The guide's ``forward`` samples exactly these, so
    SVI can write the ELBO out from them (:class:`bnn_zoo.inference.elbo.DirectELBO`) instead of
    tracing guide and model at every step.
    """

    def site_distributions(self) -> dict[str, tuple[Distribution, dict]]: ...


@runtime_checkable
class HoldsOut(Protocol):
    """Optional: a method that holds out validation rows, which it never trains on (SVI's early stopping,
    an ensemble's band check); ``bnn_zoo.fit`` judges the fitted band on them."""

    def split(self, x: torch.Tensor, y: torch.Tensor) -> tuple[tuple, tuple | None]: ...


@runtime_checkable
class BoundsNoise(Protocol):
    """Optional, on a regression posterior whose Gaussian noise was fitted inside a constraint (the GP's
    type II): ``noise_and_bound()`` gives (its noise variance, the constraint's lower bound), on the targets
    as they were fitted (standardised by default). The collapse check says when the noise sits on the bound."""

    def noise_and_bound(self) -> tuple[float, float]: ...
