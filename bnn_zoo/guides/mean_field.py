"""Mean-field Gaussian guide (Bayes by Backprop; Blundell et al. 2015, Heek's thesis sec. 2.3).

q(w) = prod_i N(w_i; mu_i, sigma_i^2) with sigma = softplus(rho). Means start at the network's own
initialisation and scales small (Heek's thesis shows large initial scales collapse to the prior).
Built on Pyro's AutoNormal; with a Normal prior, ``TraceMeanField_ELBO`` uses the closed-form KL.
"""

from __future__ import annotations

import torch
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_value

from bnn_zoo.guides import register


class MeanField(AutoNormal):
    def loc_and_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Variational mean and standard deviation of site ``name`` (unconstrained space)."""
        return self._get_loc_and_scale(name)


@register("mean-field", "diagonal Gaussian over every weight (Bayes by Backprop)")
def mean_field(model, init_values, init_scale: float = 1e-2):
    return MeanField(model, init_loc_fn=init_to_value(values=init_values), init_scale=float(init_scale))
