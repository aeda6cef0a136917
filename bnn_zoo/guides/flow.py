"""Normalizing-flow guides: a flow over all weights (small nets) or one flow per weight matrix (large ones).

q(w) is the push-forward of N(0, I) through K learned bijections f_K ... f_1 followed by an affine map
w = mu + sigma * u, with mu at the network's own initialisation and sigma small, so the fit starts
where the mean-field guide does. Transform families are Pyro's: ``affine`` (affine autoregressive,
an IAF in Kingma et al.'s (2016) numerically stable form, s z + (1 - s) m with s in (0, 1): the plain
form's per-layer scale of up to e^3 diverged on 11 of Boston's 20 UCI splits at lr 0.01) and
``spline`` (rational-quadratic spline coupling; Durkan et al. 2019), with a random permutation (drawn
under the fit's seed) after each layer. ``scope="joint"`` puts one flow over every latent (weights,
biases, noise): it captures correlations across layers, with cost that grows with the
total number of weights. ``scope="layer"`` gives each weight matrix its own flow and the remaining
sites a mean-field guide, the scalable form (Heek's thesis sec. 2.6; the survey's sec. 2.6).
"""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.distributions import constraints
from pyro.distributions.transforms import (
    AffineTransform,
    ComposeTransform,
    Permute,
    affine_autoregressive,
    spline_coupling,
)
from pyro.infer.autoguide import AutoContinuous
from pyro.infer.autoguide.initialization import init_to_value
from pyro.nn import PyroParam
from torch import nn

from bnn_zoo.errors import BnnZooError, positive
from bnn_zoo.guides.mean_field import MeanField
from bnn_zoo.guides.registry import register
from bnn_zoo.variational import LocalParamModule

TRANSFORMS = ("auto", "affine", "spline")  # auto: affine up to MAX_AFFINE_DIM latents, spline coupling above
MAX_AFFINE_DIM = 1024
WIDE_DIM = 4096  # the widest latent vector whose coupling nets get the full default width


class Flow(LocalParamModule, AutoContinuous):
    """A flow over the flattened unconstrained latents of ``model``, started at ``init_values``."""

    def __init__(self, model, init_values, transform="auto", num_flows=2, init_scale=1e-2, hidden=None, name="Flow"):
        if transform not in TRANSFORMS:
            raise BnnZooError(f"unknown flow transform {transform!r}; choose one of {', '.join(TRANSFORMS)}")
        hidden = [hidden] * 2 if isinstance(hidden, int) else hidden  # one width for both hidden layers
        self._spec = (transform, int(num_flows), float(init_scale), hidden)
        super().__init__(model, init_loc_fn=init_to_value(values=init_values))
        self._pyro_name = name  # names the auxiliary site _{name}_latent: one per flow in LayerFlows

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        transform, num_flows, init_scale, hidden = self._spec
        d, loc = self.latent_dim, self._init_loc()  # on the model's device, as its prototype trace
        if transform == "auto":
            transform = "affine" if d <= MAX_AFFINE_DIM else "spline"
        if transform == "affine" and d > MAX_AFFINE_DIM:
            raise BnnZooError(
                f"an affine autoregressive flow over {d} latents needs O(d^2) memory (its MADE is at least {d} wide; "
                f"measured: 2951 latents exhausted 24 GiB); use transform=spline, or scope=layer for smaller blocks"
            )
        if transform == "spline" and d < 2:
            raise BnnZooError("spline coupling needs at least 2 latent dimensions; use transform=affine")
        # Width 2d grows as d^2 parameters: cap the default at 256. Pyro's autoregressive nets (MADE)
        # need width >= d, so an affine flow over d latents costs O(d^2) whatever we do; spline
        # coupling's dense nets have no such floor, which is what makes scope=layer + spline scale.
        # Their output layer has about 12 d x width weights, so above WIDE_DIM latents the width falls
        # as 1/d: 256 wide over the digits CNN's 13,706 latents was 84M weights that Adam took to NaN
        # in 14 steps; 38 wide it trains (0.936 accuracy, docs/guide/defaults.md).
        width = min(max(2 * d, 8), 256) if d <= WIDE_DIM else max(16, 2**19 // d)
        hidden_dims = list(hidden) if hidden else [max(width, d) if transform == "affine" else width] * 2
        layers = []
        for _ in range(num_flows):
            if transform == "affine":
                layers.append(affine_autoregressive(d, hidden_dims=hidden_dims, stable=True))
            else:
                layers.append(spline_coupling(d, hidden_dims=hidden_dims))
            # A random (seeded) permutation between layers: with a fixed reversal, coupling layers on 4
            # weights always keep weights 1 and 2 on the same side and never model their correlation.
            layers.append(Permute(torch.randperm(d).to(loc.device), cache_size=1))
        # in place: _layers holds the same modules
        self.flows = nn.ModuleList(t for t in layers if isinstance(t, nn.Module)).to(loc.device)
        self._layers = layers
        self.loc = PyroParam(loc)
        self.scale = PyroParam(torch.full((d,), init_scale, device=loc.device), constraints.softplus_positive)

    def _apply(self, fn, *args, **kwargs):
        """nn.Module's move (``.to``, ``.cuda``, ...), which also moves the permutations: they are
        Transforms, not modules, so ``posterior.to("cpu")`` after a CUDA fit left them on the GPU."""
        super()._apply(fn, *args, **kwargs)
        if hasattr(self, "_layers"):
            self._layers = [
                Permute(fn(t.permutation), cache_size=1) if isinstance(t, Permute) else t for t in self._layers
            ]
        return self

    def get_base_dist(self):
        return dist.Normal(torch.zeros(self.latent_dim, device=self.loc.device), 1.0).to_event(1)

    def get_transform(self, *args, **kwargs):
        # cache_size=1: the density of a draw uses the values that made it. Inverting z = loc + scale * v
        # in float32 loses v once scale is ~1e-7 of loc, and the optimiser exploits the garbage density:
        # uncached, the loss ran to -4e11 (a negative ELBO can go no lower than about -log p(y)).
        return ComposeTransform([*self._layers, AffineTransform(self.loc, self.scale, cache_size=1)], cache_size=1)


class LayerFlows(LocalParamModule):
    """One :class:`Flow` per weight with 2 or more dims; mean-field over the other sites."""

    def __init__(self, model, init_values, init_scale=1e-2, **flow_options):
        super().__init__()
        names = [k for k, p in model.params.items() if p.dim() >= 2]
        self.flows = nn.ModuleList(
            Flow(
                poutine.block(model, expose=[k]), init_values, init_scale=init_scale, name=f"Flow[{k}]", **flow_options
            )
            for k in names
        )
        self.rest = MeanField(
            model, init_values, init_scale, sites=[k for k in model.latent_shapes() if k not in names]
        )

    def forward(self, *args, **kwargs):
        values = {}
        for flow in self.flows:
            values.update(flow(*args, **kwargs))
        values.update(self.rest(*args, **kwargs))
        return values


@register(
    "flow",
    "normalizing flow: transform=auto|affine|spline, num_flows=2, scope=joint (all weights) | layer (one flow per "
    "matrix)",
)
def flow(
    model,
    init_values,
    transform: Literal["auto", "affine", "spline"] = "auto",
    num_flows: int = 2,
    scope: Literal["joint", "layer"] = "joint",
    init_scale: float = 1e-2,
    hidden: int | list[int] | None = None,
):
    """A normalizing flow over the weights, on a diagonal Gaussian base started at ``init_values``.

    Args:
        transform: auto: affine autoregressive up to 1,024 latents, spline coupling above.
        num_flows: flow layers.
        scope: joint: one flow over all latents; layer: one per weight matrix, mean-field elsewhere.
        init_scale: every weight's starting sd.
        hidden: coupling-net widths (None: 256 up to 4,096 latents, about 2^19 / latents above).
    """
    num_flows = positive("the flow guide's num_flows", num_flows, integer=True)
    init_scale = positive("the flow guide's init_scale", init_scale)
    hidden = (
        None
        if hidden is None
        else [
            positive("the flow guide's hidden widths", h, integer=True)
            for h in (hidden if isinstance(hidden, list | tuple) else [hidden] * 2)
        ]
    )
    if scope == "joint":
        return Flow(model, init_values, transform, num_flows, init_scale, hidden)
    if scope == "layer":
        return LayerFlows(
            model, init_values, init_scale=init_scale, transform=transform, num_flows=num_flows, hidden=hidden
        )
    raise BnnZooError(f"unknown flow scope {scope!r}; choose joint or layer")
