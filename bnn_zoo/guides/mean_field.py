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

import math
from typing import Literal

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroParam
from torch.distributions import biject_to, kl_divergence, register_kl

from bnn_zoo.errors import BnnZooError, positive
from bnn_zoo.guides.registry import flag, register
from bnn_zoo.local_noise import GaussianWeights
from bnn_zoo.priors import zero_mean_normal_terms
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
            q = DiagonalNormal(dist.Normal(loc, scale), loc.dim()) if loc.dim() else dist.Normal(loc, scale)
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


class DiagonalNormal(dist.Independent):
    """The mean-field guide's q_s over a weight tensor: a Normal per weight, its event the tensor's shape.
    Its own type so that its KL to a zero-mean Normal prior is :func:`_kl_diagonal_normal`."""


_HALF_LOG_2PI_E = 0.5 * (math.log(2 * math.pi) + 1)


@register_kl(DiagonalNormal, dist.Independent)
def _kl_diagonal_normal(q, p):
    """KL(N(m, s^2) || N(0, sigma^2)) summed over the site, sum (s^2 + m^2) / (2 sigma^2) - log s +
    log sigma - 1/2: torch's Normal-Normal KL written with the prior's terms worked out once, so SVI's
    every step differentiates fewer nodes; torch's own KL for any other prior."""
    terms = zero_mean_normal_terms(p, q.event_shape)
    if terms is None:
        return kl_divergence(dist.Independent(q.base_dist, q.reinterpreted_batch_ndims), p)
    half_precision, log_normaliser = terms  # the latter: sum of log(sigma sqrt(2 pi))
    m, s = q.base_dist.loc, q.base_dist.scale
    inner = (s.pow(2) + m.pow(2)) * half_precision - s.log()
    return inner.sum(tuple(range(-len(q.event_shape), 0))) + log_normaliser - q.event_shape.numel() * _HALF_LOG_2PI_E


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
