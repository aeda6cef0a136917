"""Mean-field Gaussian guide (Bayes by Backprop; Blundell et al. 2015, Heek's thesis sec. 2.3).

q(w) = prod_i N(w_i; mu_i, sigma_i^2), sigma = softplus(rho) (Blundell et al.) or exp(rho)
(``parametrization="log"``). Means start at the network's own
initialisation and scales small (Heek's thesis shows large initial scales collapse to the prior).
Real-valued sites are sampled from the Normal itself, so ``TraceMeanField_ELBO`` uses the closed-form
KL against a Normal prior. Pyro's AutoNormal samples an auxiliary variable and a Delta instead, which
turns that KL into a Monte Carlo estimate, hence this guide. Constrained sites (a learned noise
scale) get a Normal in unconstrained space pushed through ``biject_to(support)``.

``local_reparam=True`` samples pre-activations instead of weights during training (Kingma et al.
2015; see :mod:`bnn_zoo.local_noise`) for dense and convolutional layers; biases are still
drawn once per particle.
"""

from __future__ import annotations

from typing import Literal

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam
from torch.distributions import biject_to

from bnn_zoo.errors import BnnZooError, positive
from bnn_zoo.guides.registry import flag, register
from bnn_zoo.local_noise import GaussianWeights
from bnn_zoo.variational import LocalParamModule, sample_sites


class MeanField(LocalParamModule):
    """Diagonal Gaussian over ``sites`` (default: every latent site of ``model``)."""

    def __init__(
        self,
        model,
        init_values,
        init_scale: float = 1e-2,
        sites=None,
        parametrization: str = "softplus",
        local_reparam: bool = False,
    ):
        super().__init__()
        if parametrization not in ("softplus", "log"):
            raise BnnZooError(f"unknown scale parametrization {parametrization!r}; choose softplus or log")
        positive = constraints.softplus_positive if parametrization == "softplus" else constraints.positive  # exp
        shapes = model.latent_shapes()
        supports = {k: d.support for k, d in model.likelihood.latent_prior().items()}
        self.sites = [k for k in shapes if sites is None or k in sites]
        self.transforms = {k: biject_to(supports[k]) for k in self.sites if k in supports}  # weights are real
        self.local = {k for k in self.sites if local_reparam and k in model.params and model.params[k].dim() >= 2}
        self.locs, self.scales = LocalParamModule(), LocalParamModule()
        for name in self.sites:
            key = name.replace(".", "__")
            init = torch.as_tensor(init_values[name], dtype=torch.get_default_dtype(), device=model.device).reshape(
                shapes[name]
            )
            if name in self.transforms:
                init = self.transforms[name].inv(init)
            setattr(self.locs, key, PyroParam(init.detach().clone()))
            setattr(
                self.scales, key, PyroParam(torch.full(shapes[name], float(init_scale), device=model.device), positive)
            )

    def loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Variational mean and standard deviation of site ``name`` (unconstrained space)."""
        key = name.replace(".", "__")
        return getattr(self.locs, key), getattr(self.scales, key)

    def site_distributions(self) -> dict[str, tuple[dist.Distribution, dict]]:
        sites = {}
        for name in self.sites:
            loc, scale = self.loc_and_scale(name)
            q = dist.Normal(loc, scale).to_event(loc.dim())
            if name in self.transforms:
                q = dist.TransformedDistribution(q, self.transforms[name])
            sites[name] = (
                q,
                {"local_noise": GaussianWeights(loc, scale)} if name in self.local and self.training else {},
            )
        return sites

    def forward(self, *args, **kwargs):
        return sample_sites(self.site_distributions())

    def mean(self) -> dict[str, torch.Tensor]:
        """E_q[w] for weights; for a constrained site (noise scale) the transformed mean, i.e. its median."""
        return {
            k: self.transforms[k](self.loc_and_scale(k)[0]) if k in self.transforms else self.loc_and_scale(k)[0]
            for k in self.sites
        }


@register(
    "mean-field",
    "diagonal Gaussian over every weight (Bayes by Backprop); init_scale, parametrization=softplus|log, "
    "local_reparam=true|false",
)
def mean_field(
    model,
    init_values,
    init_scale: float = 1e-2,
    parametrization: Literal["softplus", "log"] = "softplus",
    local_reparam: bool = False,
):
    """A diagonal Gaussian over every weight (Blundell et al. 2015), started at ``init_values``.

    Args:
        init_scale: every weight's starting sd.
        parametrization: sd = softplus(rho) or exp(rho).
        local_reparam: sample pre-activations instead of weights in training (Kingma et al. 2015; dense and conv
            layers).
    """
    init_scale = positive("the mean-field guide's init_scale (the starting sd of every weight)", init_scale)
    return MeanField(
        model, init_values, init_scale=init_scale, parametrization=parametrization, local_reparam=flag(local_reparam)
    )
