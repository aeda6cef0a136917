"""BNN: any torch module + a prior + a likelihood = one Pyro model.

Every parameter of the network becomes a sample site named after it (``layers.0.weight``); the
targets are observed inside ``pyro.plate("data", N, subsample_size=M)``, so a minibatch log-likelihood
is scaled by N/M while the prior (and so the KL of any guide) is counted once.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import pyro
import torch
from torch import nn
from torch.func import functional_call, vmap

from bnn_zoo.inference import local_noise
from bnn_zoo.likelihoods import Gaussian, Likelihood
from bnn_zoo.priors import Normal, Prior


class BNN:
    """A Bayesian neural network as a Pyro model: call it as ``model(x, y=None, batch_size=None)``.

    The same object is fitted by SVI with any guide and by NUTS/HMC. Weight draws with a leading batch
    shape (vectorised particles, posterior draws) are evaluated with ``torch.func.vmap``, never a loop.
    """

    def __init__(self, net: nn.Module, prior: Prior | None = None, likelihood: Likelihood | None = None):
        self.net = net
        self.prior = prior if prior is not None else Normal(1.0)
        self.likelihood = likelihood if likelihood is not None else Gaussian(1.0)
        self.params = {name: p.detach() for name, p in net.named_parameters()}
        if not self.params:
            raise ValueError("the network has no parameters to put a prior on")

    @property
    def in_features(self) -> int | None:
        """Input width when the network declares it (``net.in_features``), else None."""
        return getattr(self.net, "in_features", None)

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None, batch_size: int | None = None):
        with local_noise.collect() as noisy:  # a guide in training mode may ask for per-example noise
            weights = {name: pyro.sample(name, self.prior(name, p)) for name, p in self.params.items()}
        latent = self.likelihood.sample_latent()
        # Under an outer vectorising plate (particles, predictive draws) global sites carry a singleton
        # for the data plate at dim -1 of their batch shape; drop it so draws line up with f's leading dims.
        weights = {k: _drop_data_dim(v, self.params[k].dim()) for k, v in weights.items()}
        latent = {k: _drop_data_dim(v, 0) for k, v in latent.items()}
        with pyro.plate("data", x.shape[0], subsample_size=batch_size, dim=-1) as idx:
            f = self.forward(weights, x[idx], noisy.noise)
            pyro.sample("y", self.likelihood.distribution(f, latent), obs=None if y is None else y[idx])
        return f

    def forward(self, weights: dict[str, torch.Tensor], x: torch.Tensor, noise: dict | None = None) -> torch.Tensor:
        """Network outputs for weights with any leading batch shape B: returns (*B, N, out).

        ``noise`` maps weight names to :class:`~bnn_zoo.inference.local_noise.LocalNoise`: those layers
        run at the noise's centre with per-example noise (local reparameterisation, dropout masks).
        """
        name, ref = next(iter(self.params.items()))
        batch = weights[name].shape[: weights[name].dim() - ref.dim()]
        noise = noise or {}
        weights = {**weights, **{k: n.centre.expand(weights[k].shape) for k, n in noise.items()}}
        with local_noise.hooks(self.net, noise):
            if not batch:
                with _bound(self.net, weights):
                    return self.net(x)
            flat = {k: v.reshape(-1, *self.params[k].shape) for k, v in weights.items()}
            f = vmap(lambda w: functional_call(self.net, w, (x,)), randomness="different")(flat)
        return f.reshape(*batch, *f.shape[1:])

    def latent_shapes(self) -> dict[str, torch.Size]:
        """Event shape of every latent site: weights, then the likelihood's own (noise scale)."""
        shapes = {k: v.shape for k, v in self.params.items()}
        shapes.update({k: d.event_shape for k, d in self.likelihood.latent_prior().items()})
        return shapes

    def network_init(self, seed: int) -> dict[str, torch.Tensor]:
        """Weights from the network's own initialiser (re-drawn under ``seed``), plus prior medians."""
        net = copy.deepcopy(self.net)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for module in net.modules():
                if module is not net and hasattr(module, "reset_parameters"):
                    module.reset_parameters()
        values = {name: p.detach() for name, p in net.named_parameters()}
        for name, d in self.likelihood.latent_prior().items():
            values[name] = d.icdf(torch.tensor(0.5)) if hasattr(d, "icdf") else d.mean
        return values

    def describe(self) -> dict[str, str]:
        net = f"{type(self.net).__name__}({self.net.extra_repr()})"
        return {"model": net, "prior": repr(self.prior), "likelihood": repr(self.likelihood)}


@contextmanager
def _bound(net: nn.Module, weights: dict[str, torch.Tensor]):
    """Run ``net`` with ``weights`` in place of its parameters.

    This is what ``torch.func.functional_call`` does, but functional_call refuses to run under
    ``torch.jit.trace``, which Pyro's ``jit_compile=True`` uses for the NUTS/HMC potential.
    """
    saved = {}
    try:
        for name, w in weights.items():
            module_name, _, attr = name.rpartition(".")
            module = net.get_submodule(module_name)
            saved[name] = (module, attr, module._parameters[attr])
            module._parameters[attr] = w
        yield
    finally:
        for module, attr, param in saved.values():
            module._parameters[attr] = param


def _drop_data_dim(value: torch.Tensor, event_dim: int) -> torch.Tensor:
    if value.dim() > event_dim:
        return value.squeeze(value.dim() - event_dim - 1)
    return value
