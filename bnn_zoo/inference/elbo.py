"""Pyro's ``TraceMeanField_ELBO`` written out for guides that state their site distributions.

For a guide q(w) = prod_s q_s(w_s) (:class:`bnn_zoo.protocols.SiteDistributions`) on a
:class:`bnn_zoo.BNN`, the negative ELBO of one step is

    loss = -(N / M) sum_{n in batch} log p(y_n | x_n, w) + kl_weight sum_s KL_s,    w_s ~ q_s,

with KL_s = KL(q_s || p_s) in closed form where torch has it registered (Normal against Normal,
Gal's dropout KL, the matrix-normal KL) and the one-draw estimate log q_s(w_s) - log p_s(w_s)
elsewhere: exactly the terms ``TraceMeanField_ELBO`` computes (Blundell et al. 2015, eq. 1; Gal's
thesis eq. 3.7), averaged over vectorised particles as Pyro averages them. Writing it out skips
Pyro's per-step tracing of guide and model, its messengers and its argument checks, which cost
more than the arithmetic on small networks (docs/benchmarks.md); tests/test_elbo.py checks value
and gradient against ``TraceMeanField_ELBO`` for the same draws on every guide and model.
"""

from __future__ import annotations

import contextlib
import functools
import operator

import torch
from torch.distributions import Distribution, kl_divergence

from bnn_zoo.bnn import BNN
from bnn_zoo.protocols import SiteDistributions
from bnn_zoo.variational import scope


def applies(model, guide) -> bool:
    """Whether the direct ELBO can stand in for ``TraceMeanField_ELBO``: a guide that states its site
    distributions, on a BNN whose Pyro model is BNN's own (a subclass may add sites to ``__call__``)."""
    return isinstance(guide, SiteDistributions) and isinstance(model, BNN) and type(model).__call__ is BNN.__call__


@contextlib.contextmanager
def _no_argument_checks():
    before = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(before)


LARGE = 2**20  # rows past which a permutation per step costs more than the step (benchmarks/portability.py)


def minibatch(n: int, size: int, device=None) -> torch.Tensor:
    """``size`` distinct row indices drawn uniformly, as Pyro's subsampling plate draws them. Up to
    LARGE rows, a permutation's first ``size``; beyond, i.i.d. indices redrawn until distinct (which
    conditions them on being a sample without replacement, and takes under 1.7 draws on average
    while size^2 <= n), so a step costs O(size), not O(n)."""
    if n <= LARGE or size * size > n:
        return torch.randperm(n, device=device)[:size]
    while True:
        idx = torch.randint(n, (size,), device=device)
        if len(torch.unique(idx)) == size:
            return idx


class DirectELBO:
    """The mean-field ELBO of a :class:`~bnn_zoo.protocols.SiteDistributions` guide, with Pyro's
    ``differentiable_loss(model, guide, *args)`` signature.

    Args:
        model: the BNN the guide approximates; its priors are built once here.
        num_particles: draws of w per step, vectorised (the BNN evaluates stacked weights with vmap).
    """

    def __init__(self, model: BNN, num_particles: int = 1):
        self.num_particles = num_particles
        self.priors = {name: model.site_prior(name) for name in model.params} | model.likelihood.latent_prior()
        self.closed_form: dict[str, bool] = {}  # per site: does torch have KL(q_s || p_s)? found on first use

    def differentiable_loss(
        self, model: BNN, guide, x, y, batch_size: int | None = None, kl_weight: float = 1.0
    ) -> torch.Tensor:
        """-ELBO for one draw of w (per particle) and one minibatch of ``batch_size`` rows (None: all)."""
        shape = torch.Size([self.num_particles]) if self.num_particles > 1 else torch.Size()
        # the NaN guard in SVI's loop catches what argument checks would (a NaN loss or gradient); only
        # torch's distributions are used here, so only their checks need turning off
        with _no_argument_checks(), scope(guide):
            values, noise, kls = {}, {}, []
            for name, (q, infer) in guide.site_distributions().items():
                local, closed = infer.get("local_noise"), self._closed_form_kl(name, q)
                if local is not None and closed is not None:
                    # the layer runs at the centre with per-example noise: no draw needed
                    noise[name] = local
                    values[name] = local.centre.expand(shape + local.centre.shape) if shape else local.centre
                    kls.append(closed)
                    continue
                values[name] = q.rsample(shape)
                if local is not None:
                    noise[name] = local
                if closed is None:
                    closed = self._mean((q.log_prob(values[name]) - self.priors[name].log_prob(values[name])).sum())
                kls.append(closed)
            kl = functools.reduce(operator.add, kls)  # not sum(): 0 + the first term is one more node
            n = x.shape[0]
            if batch_size is not None and batch_size < n:
                idx = minibatch(n, batch_size, x.device)
                x, y = x[idx], y[idx]
            weights = {k: v for k, v in values.items() if k in model.params}
            latent = {k: v for k, v in values.items() if k not in model.params}
            f = model.forward(weights, x, noise)
            log_lik = self._mean(model.likelihood.log_prob(f, latent, y).sum())
            return log_lik * -(n / x.shape[0]) + (kl if kl_weight == 1 else kl * kl_weight)

    def _mean(self, total: torch.Tensor) -> torch.Tensor:
        """A sum over particles as their mean (with one particle, no division: a node less to differentiate)."""
        return total if self.num_particles == 1 else total / self.num_particles

    def _closed_form_kl(self, name: str, q: Distribution) -> torch.Tensor | None:
        """KL(q_s || p_s) where torch has it registered, else None (then the one-draw estimate is used)."""
        if self.closed_form.get(name, True):
            try:
                return kl_divergence(q, self.priors[name])
            except NotImplementedError:
                self.closed_form[name] = False
        return None
