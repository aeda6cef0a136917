"""The BNN's log posterior in unconstrained coordinates, the target of bnn-zoo's own samplers (SG-MCMC,
ChEES-HMC): log p(w) + log p(noise) + log |d noise / d u| + (N / M) sum_batch log p(y | x, w).

A learned likelihood latent (the Gaussian noise scale) is sampled as u = biject_to(support)^-1(noise),
so the samplers move on R^d; draws are mapped back with :meth:`LogPosterior.constrained`.
"""

from __future__ import annotations

import math

import torch
from torch.distributions import Distribution, Independent, Normal, biject_to
from torch.func import functional_call

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError
from bnn_zoo.likelihoods import Gaussian
from bnn_zoo.posterior import Posterior
from bnn_zoo.protocols import BackpropagatesDraws

# Chains whose saved activations pass this are split into chunks for autograd (see _autograd_in_chunks)
CHUNK_BYTES = 100e6


class LogPosterior:
    """log p(w, u | data) up to a constant, for one parameter set (``__call__``, the ``posteriors``
    package's ``f(params, batch) -> (value, aux)``) or for C of them at once (:meth:`batched`)."""

    def __init__(self, model: BNN, n: int):
        self.model, self.n = model, n
        self.latent_prior = model.likelihood.latent_prior()
        self.weight_prior = {k: model.site_prior(k) for k in model.params}  # fixed: built once, not per step
        self.transforms = {k: biject_to(d.support) for k, d in self.latent_prior.items()}
        shapes = model.latent_shapes()
        normal = {k: _normal_prior_parts(d, shapes[k]) for k, d in self.weight_prior.items()}
        self._normal_priors = None if any(v is None for v in normal.values()) else normal  # for _closed_form
        self._saved_bytes: tuple = (None, 0)  # (input shape, bytes autograd saves per chain), for _autograd_in_chunks

    def initial(self, values: dict) -> dict:
        """Unconstrained coordinates of site values (any leading batch shape)."""
        return {
            k: (self.transforms[k].inv(v) if k in self.transforms else v).detach().clone() for k, v in values.items()
        }

    def constrained(self, params: dict) -> dict:
        """Site values of unconstrained coordinates (any leading batch shape)."""
        return {k: (self.transforms[k](v) if k in self.transforms else v).detach().clone() for k, v in params.items()}

    def __call__(self, params: dict, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch``: a minibatch (x, y), its log-likelihood scaled by N / M; or the whole training data
        padded to a common length, (x, y, mask), mask 1 on its rows and 0 on the padding (unscaled)."""
        x, y, *mask = batch
        model = self.model
        weights = {k: params[k] for k in model.params}
        f = functional_call(model.net, {**model.fixed, **weights}, (x,))
        latent, log_latent = self._latent(params, ())
        log_lik = model.likelihood.distribution(f, latent).log_prob(y)
        log_lik = (log_lik * mask[0]).sum() if mask else log_lik.sum() * (self.n / x.shape[0])
        log_prior = sum(self.weight_prior[k].log_prob(w) for k, w in weights.items()) + log_latent
        return log_lik + log_prior, log_lik.detach()

    def batched(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The full-data log posterior of C parameter sets (every value shaped (C, *site shape)),
        evaluated as one batched computation: shape (C,). Chains never mix, so the gradient of the
        sum is each chain's own gradient."""
        model = self.model
        chains = next(iter(params.values())).shape[:1]
        weights = {k: params[k] for k in model.params}
        latent, log_latent = self._latent(params, chains)
        log_lik = model.likelihood.distribution(model.forward(weights, x), latent).log_prob(y).sum(-1)
        return log_lik + sum(self.weight_prior[k].log_prob(w) for k, w in weights.items()) + log_latent

    def batched_value_and_grad(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """:meth:`batched` (C,) and its gradient by site, each (C, *site shape).

        A network with its own backward (:class:`~bnn_zoo.protocols.BackpropagatesDraws`; bnn_zoo's
        MLP) runs without an autograd graph over the N x width activations. The likelihood, as a
        function of the outputs (C, N, out), and the priors then go through autograd, or, when all are
        Normal with a fixed noise, are written out (:meth:`_closed_form`). Otherwise, autograd through
        :meth:`batched`, a few chains at a time (:meth:`_autograd_in_chunks`)."""
        model = self.model
        net = model.net
        if model.fixed or x.dim() != 2 or not isinstance(net, BackpropagatesDraws):
            return self._autograd_in_chunks(params, x, y)
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            weights = {k: params[k].detach() for k in model.params}
            f, backward = net.forward_draws_vjp(weights, x)
            closed = self._closed_form(weights, f, y)
            if closed is not None:
                logp, grads, g_f = closed
            else:
                f = f.requires_grad_(True)
                latent, log_latent = self._latent(leaves, f.shape[:1])
                log_lik = model.likelihood.distribution(f, latent).log_prob(y).sum(-1)
                logp = log_lik + sum(self.weight_prior[k].log_prob(leaves[k]) for k in model.params) + log_latent
                g_f, *g_leaves = torch.autograd.grad(logp.sum(), [f, *leaves.values()], allow_unused=True)
                grads = {
                    k: torch.zeros_like(v) if g is None else g
                    for (k, v), g in zip(leaves.items(), g_leaves, strict=True)
                }
        for k, g in backward(g_f).items():
            grads[k] = grads[k] + g
        return logp.detach(), grads

    def _autograd_in_chunks(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Autograd through :meth:`batched`, a few chains at a time on the CPU: their activations together
        stay under :data:`CHUNK_BYTES`. A larger batch's tensors are written to freshly mapped pages at
        every call, which costs more than the chunking saves (``benchmarks/chees.py --chunks``)."""
        chains, size = next(iter(params.values())).shape[0], self.chunk_size(params, x, y)
        values, grads = [], []
        for start in range(0, chains, size):
            with torch.enable_grad():
                leaves = {k: v[start : start + size].detach().requires_grad_(True) for k, v in params.items()}
                logp = self.batched(leaves, x, y)
                grads.append(torch.autograd.grad(logp.sum(), list(leaves.values())))
            values.append(logp.detach())
        return torch.cat(values), {k: torch.cat(g) for k, *g in zip(params, *grads, strict=True)}

    def chunk_size(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> int:
        """How many of the chains in ``params`` :meth:`_autograd_in_chunks` takes at a time: equal chunks,
        as few as keep each one's saved tensors under :data:`CHUNK_BYTES`."""
        chains = next(iter(params.values())).shape[0]
        # a GPU wants the whole batch (the chunks are about a CPU core's caches; not measured on a GPU)
        per_chain = self._saved_bytes_per_chain(params, x, y) if x.device.type == "cpu" else 0
        pieces = min(chains, max(1, math.ceil(chains * per_chain / CHUNK_BYTES)))
        return math.ceil(chains / pieces)

    def _saved_bytes_per_chain(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> int:
        """What autograd keeps for one chain's backward on these inputs: measured once per input shape."""
        key = (tuple(x.shape), x.dtype, x.device)
        if self._saved_bytes[0] != key:
            total = 0

            def count(t: torch.Tensor) -> torch.Tensor:
                nonlocal total
                total += t.numel() * t.element_size()
                return t

            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                leaves = {k: v[:1].detach().requires_grad_(True) for k, v in params.items()}
                self.batched(leaves, x, y)
            self._saved_bytes = (key, total)
        return self._saved_bytes[1]

    def _closed_form(
        self, weights: dict, f: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, dict, torch.Tensor] | None:
        """(log posterior, the priors' gradients, the likelihood's gradient in f) written out, when every
        weight's prior and the likelihood (with a fixed noise) are Normal: on a small network the hundred
        small autograd operations per call cost more than the network's own gradient. The priors' parts
        are taken once, in ``__init__``. None otherwise."""
        if self.transforms or self._normal_priors is None or not isinstance(self.model.likelihood, Gaussian):
            return None  # (a heteroscedastic Normal's scale depends on f: not this closed form)
        likelihood = _normal_log_density_and_score(self.model.likelihood.distribution(f, {}), y)
        if likelihood is None:
            return None
        logp, grads = likelihood[0], {}
        for k, w in weights.items():
            loc, inv_scale, constant = self._normal_priors[k]
            z = (w - loc) * inv_scale
            logp = logp + (constant - 0.5 * z.square().reshape(z.shape[0], -1).sum(-1))
            grads[k] = z.mul_(inv_scale).neg_()
        return logp, grads, -likelihood[1]  # d/df = -d/dy for a Normal located at f

    def _latent(self, params: dict, batch: torch.Size | tuple) -> tuple[dict, torch.Tensor | float]:
        """The likelihood's latents and their log prior plus log-Jacobian, summed per batch element."""
        latent, total = {}, 0.0
        for k, t in self.transforms.items():
            latent[k] = t(params[k])
            log_density = self.latent_prior[k].log_prob(latent[k]) + t.log_abs_det_jacobian(params[k], latent[k])
            total = total + log_density.reshape(*batch, -1).sum(-1)
        return latent, total


INITS = ("network", "prior", "svi")  # where chains can start, besides a fitted Posterior or a dict of site values


def check_init(init) -> None:
    """Refuse a chain start that is none of ``INITS`` (None is ``"network"``), a Posterior or a dict."""
    if not (isinstance(init, dict | Posterior) or init is None or init in INITS):
        raise BnnZooError(
            f"init must be 'network', 'prior', 'svi', a fitted Posterior or a dict of site values, got {init!r}"
        )


def chain_starts(model: BNN, init, chains: int, seed: int, generator: torch.Generator) -> dict:
    """Site values where each of ``chains`` chains starts, shaped (chains, *site shape): ``init``
    ``"network"`` (or None), the network's own initialisation under seed + chain; ``"prior"``, prior
    draws; a fitted Posterior, one of its draws per chain; a dict, its values in every chain."""
    if init in (None, "network"):
        starts = [model.network_init(seed + chain) for chain in range(chains)]
        return {k: torch.stack([v[k] for v in starts]) for k in starts[0]}
    if isinstance(init, dict):
        return {
            k: torch.as_tensor(init[k]).expand(chains, *shape).clone() for k, shape in model.latent_shapes().items()
        }
    if init == "prior":
        priors = {**{k: model.site_prior(k) for k in model.params}, **model.likelihood.latent_prior()}
        with torch.random.fork_rng(devices=[], device_type="cuda"):
            torch.manual_seed(int(torch.randint(2**31, (), generator=generator)))
            return {k: d.sample((chains,)) for k, d in priors.items()}
    return init.draws(chains)  # a fitted Posterior


def _normal(d: Distribution) -> Normal | None:
    """d itself if a Normal, its base if a Normal reinterpreted by ``to_event``; None otherwise."""
    while isinstance(d, Independent):
        d = d.base_dist
    return d if isinstance(d, Normal) else None


def _normal_prior_parts(d: Distribution, shape: tuple) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(loc, 1 / scale, the log density's constant: the sum of -log scale - log(2 pi) / 2 over a site of
    ``shape``) of a Normal prior; None for any other distribution."""
    base = _normal(d)
    if base is None:
        return None
    constant = -(base.scale.log() + 0.5 * math.log(2 * math.pi)).expand(shape).sum()
    return base.loc, base.scale.reciprocal(), float(constant)


def _normal_log_density_and_score(d: Distribution, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(log d(value) summed over all but the leading (chain) dimension, its gradient in value) of a
    Normal; None for any other distribution."""
    base = _normal(d)
    if base is None:
        return None
    z = (value - base.loc) / base.scale
    log_density = -0.5 * z * z - base.scale.log() - 0.5 * math.log(2 * math.pi)
    return log_density.reshape(log_density.shape[0], -1).sum(-1), -z / base.scale
