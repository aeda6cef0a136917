"""Estimates of the log evidence log p(y | x) = log int p(y | x, w) p(w) dw, each with its standard error.

- :func:`elbo`: E_q[log p(y, w | x) - log q(w)] <= log p(y | x), from a fitted guide.
- :func:`importance_weighted`: E[log (1/K) sum_k p(y, w_k | x) / q(w_k)], w_k ~ q (Burda et al. 2016);
  a lower bound that rises with K towards the evidence.
- :func:`ais`: annealed importance sampling (Neal 2001) from the prior to the posterior through
  p(w) p(y | x, w)^beta with HMC moves; needs only the model, so it also scores NUTS fits and priors.

Pyro has no AIS, and its HMC kernel runs one chain at a time; AIS needs hundreds of temperatures times
many particles, so the HMC move here is written out, vectorised over particles (``BNN.forward``).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pyro
import torch
from pyro.distributions import constraints
from pyro.distributions.transforms import biject_to

from bnn_zoo.bnn import BNN
from bnn_zoo.data.validation import check_data
from bnn_zoo.errors import BnnZooError, checked
from bnn_zoo.inference.budget import TimeLimit
from bnn_zoo.inference.driver import Checkpoint, run_steps
from bnn_zoo.io import fingerprint
from bnn_zoo.posterior import Posterior
from bnn_zoo.scaling import in_fit_units, scaling_for
from bnn_zoo.variational import log_weights


def elbo(posterior, x=None, y=None, num_samples: int = 1000) -> tuple[float, float]:
    """The ELBO of a fitted guide on (x, y) (training data by default), with its Monte Carlo SE."""
    return posterior.elbo(x, y, num_samples)


def of(posterior, elbo_samples: int = 1000) -> dict[str, float]:
    """The evidence a fit carries by its method, under metrics.json's names (``posterior.own_evidence``): a
    guide's ``elbo`` with ``elbo_se``; Laplace's ``evidence_laplace`` (the declared model's) or
    ``evidence_laplace_type_ii`` (a type-II prior or noise, named by the posterior's ``type_ii`` label); a
    regression GP's exact ``log_marginal_likelihood`` (a classifier GP's ELBO). Empty for samplers: their
    evidence is :func:`ais`."""
    return posterior.own_evidence(elbo_samples)


def importance_weighted(posterior, x=None, y=None, k: int = 100, num_repeats: int = 10) -> tuple[float, float]:
    """The importance-weighted bound L_K = E[logsumexp_k (log p(y, w_k | x) - log q(w_k)) - log K] with
    K = ``k`` guide draws, averaged over ``num_repeats`` independent sets; SE from the spread of the sets.
    L_1 is the ELBO; L_K <= L_{K+1} <= log p(y | x)."""
    _check_density(posterior, "the importance-weighted bound")
    if not (k >= 1 and num_repeats >= 2):
        raise BnnZooError(
            f"importance_weighted needs k >= 1 and num_repeats >= 2 (for a standard error), got k={k}, "
            f"num_repeats={num_repeats}"
        )
    x, y = posterior.data(x, y)
    with torch.no_grad():
        lw = log_weights(posterior.guide, posterior.model, x, y, k * num_repeats).double().reshape(num_repeats, k)
    bounds = torch.logsumexp(lw, 1) - math.log(k)
    return posterior.to_data_units(bounds.mean().item(), len(y)), (bounds.std() / math.sqrt(num_repeats)).item()


def _check_density(posterior, what):
    if posterior.guide is None:
        raise BnnZooError(
            f"{what} needs a variational guide; this posterior came from {posterior.method.upper()} (use ais)"
        )
    if not getattr(posterior.guide, "has_density", True):
        raise BnnZooError(
            f"{what} needs log q(w), which the {posterior.settings.get('guide')} guide does not have (use ais)"
        )


@checked
def ais(
    model,
    x=None,
    y=None,
    num_steps: int = 500,
    num_particles: int = 16,
    seed: int = 0,
    num_runs: int = 4,
    leapfrog_steps: int = 10,
    step_size: float = 0.1,
    target_accept: float = 0.65,
    progress: bool = False,
    checkpoint: str | Path | None = None,
    standardize: bool = True,
) -> tuple[float, float]:
    """Annealed importance sampling estimate of log p(y | x) with its standard error, in the data's units.

    ``model`` is a fitted Posterior (x, y default to its training data, taken as its fit took them) or a
    :class:`bnn_zoo.BNN` with data, which is standardised as ``bnn_zoo.fit`` would (``standardize``,
    :mod:`bnn_zoo.scaling`), so the two score the same model.
    ``num_runs`` independent runs of ``num_particles`` particles each (all vectorised) start from prior
    draws and pass through ``num_steps`` temperatures 0 = beta_0 < ... < beta_T = 1 (a sigmoid schedule,
    dense near both ends). Particle n gathers log w_n = sum_t (beta_t - beta_{t-1}) log p(y | x, w_n^{(t-1)})
    and then takes one HMC move (``leapfrog_steps`` steps) that leaves p(w) p(y | x, w)^beta_t invariant.
    Moves are made in coordinates whitened by the prior's scale, in the unconstrained space of each site;
    the step size adapts between temperatures towards ``target_accept`` (as in Grosse et al.'s BDMC),
    halving at once when nearly every move fails; under 10% acceptance overall raises a warning.

    The estimate is log (1/P) sum_n w_n over all P = runs x particles; the SE is the standard deviation
    of the runs' own estimates over sqrt(runs). Like every AIS estimate it is stochastically a lower
    bound: too few temperatures bias it low, and the error bar does not see that bias.

    ``checkpoint``: a path written every 25 temperatures and on Ctrl-C; an existing one is resumed, and
    it is deleted once the estimate is complete.
    """
    if isinstance(model, Posterior):  # its data as it saw them, and the estimate in the data's units
        x, y = model.data(x, y)
        model, units = model.model, model.to_data_units
    else:
        if not isinstance(model, BNN):
            raise BnnZooError(
                f"ais needs a bnn_zoo.BNN or a Posterior fitted to one, got {type(model).__name__} (a GP's evidence is "
                "its log_marginal_likelihood())"
            )
        if x is None or y is None:
            raise BnnZooError("ais needs data: pass x and y (or a fitted Posterior, whose training data is used)")
        x, y = check_data(model, x, y)
        scaling = scaling_for(model, x, y, standardize)
        model, x, y = in_fit_units(model, x, y, scaling)
        jacobian = 0.0 if scaling is None else float(scaling.log_jacobian)
        units = lambda estimate, n: estimate + n * jacobian  # noqa: E731
    if not (num_steps >= 1 and num_particles >= 1 and num_runs >= 2 and leapfrog_steps >= 1 and step_size > 0):
        raise BnnZooError("ais needs num_steps, num_particles, leapfrog_steps >= 1, num_runs >= 2 and step_size > 0")
    # A leapfrog trajectory that diverges gives NaN, which the Metropolis test rejects; distributions
    # must not raise on it first.
    with torch.random.fork_rng(device_type="cuda"), pyro.validation_enabled(False):
        torch.manual_seed(seed)
        log_w, accept = _anneal(
            _Target(model, x, y),
            num_runs * num_particles,
            num_steps,
            leapfrog_steps,
            step_size,
            target_accept,
            progress,
            checkpoint,
        )
    if accept < 0.1:
        warnings.warn(
            f"AIS: only {accept:.0%} of HMC moves were accepted, so particles barely left their prior draws and the "
            "estimate is close to simple Monte Carlo from the prior (biased low); use more num_steps or a smaller "
            "step_size",
            stacklevel=2,
        )
    runs = torch.logsumexp(log_w.reshape(num_runs, num_particles), 1) - math.log(num_particles)
    estimate = torch.logsumexp(log_w, 0) - math.log(len(log_w))
    return units(estimate.item(), len(y)), (runs.std() / math.sqrt(num_runs)).item()


class _Target:
    """log prior and log likelihood of a BNN as functions of whitened unconstrained coordinates z, shape (P, D)."""

    def __init__(self, model, x, y):
        self.model, self.x, self.y = model, x, y
        shapes = model.latent_shapes()
        self.priors = {**{k: model.site_prior(k) for k in model.params}, **model.likelihood.latent_prior()}
        self.transforms = {k: biject_to(d.support) for k, d in self.priors.items()}
        self.shapes = {k: shapes[k] for k in self.priors}
        self.sizes = [math.prod(s) for s in self.shapes.values()]
        # Whiten real-valued sites by their prior sd, so that at beta = 0 every coordinate is N(0, 1).
        scales = [
            (d.stddev if _real(d) else torch.ones(())).expand(self.shapes[k]).reshape(-1)
            for k, d in self.priors.items()
        ]
        self.scale = torch.cat(scales).to(x.dtype)

    def sample_prior(self, n):
        u = [self.transforms[k].inv(d.sample((n,))).reshape(n, -1) for k, d in self.priors.items()]
        return torch.cat(u, 1) / self.scale

    def __call__(self, z):
        """(log prior density of z, log likelihood), each shape (P,)."""
        values, log_prior = {}, 0.0
        for (k, d), u in zip(self.priors.items(), torch.split(z * self.scale, self.sizes, dim=1)):
            u = u.reshape(len(z), *self.shapes[k])
            t = self.transforms[k]
            v = t(u)
            jac = t.log_abs_det_jacobian(u, v)
            log_prior = log_prior + d.log_prob(v).reshape(len(z), -1).sum(1) + jac.reshape(len(z), -1).sum(1)
            values[k] = v
        weights = {k: values[k] for k in self.model.params}
        latent = {k: v for k, v in values.items() if k not in weights}
        f = self.model.forward(weights, self.x)
        return log_prior, self.model.likelihood.distribution(f, latent).log_prob(self.y).reshape(len(z), -1).sum(1)


def _real(d) -> bool:
    return getattr(d.support, "base_constraint", d.support) is constraints.real


def _anneal(
    target, n, num_steps, leapfrog_steps, step_size, target_accept, progress, checkpoint=None, checkpoint_every=25
):
    """Log importance weights (n,) and the mean acceptance rate of the HMC moves. With ``checkpoint``
    the state (particles, weights, step size, RNG) is written atomically every ``checkpoint_every``
    temperatures and on Ctrl-C, and an existing checkpoint is resumed: the run ends exactly where an
    uninterrupted one ends."""
    annealing = _Annealing(target, n, num_steps, leapfrog_steps, step_size, target_accept)
    settings = {"particles": n, "steps": num_steps, "leapfrog": leapfrog_steps, "step_size": step_size}
    identity = fingerprint(settings | {"target_accept": target_accept}, target.model.describe(), target.x, target.y)
    saving = Checkpoint.at(checkpoint, identity, "AIS", checkpoint_every, None)
    limit = lambda first: TimeLimit("AIS", None, num_steps - first)  # noqa: E731
    run_steps(annealing, num_steps, "AIS", progress, limit, saving, unit="temperature")
    log_w = annealing.now["log_w"]
    if not torch.isfinite(log_w).all():
        raise BnnZooError(
            "AIS produced non-finite weights; the likelihood is -inf under some prior draws (check the data and prior "
            "scales)"
        )
    return log_w, annealing.now["accepted"] / num_steps


class _Annealing:
    """AIS's temperatures as the driver's steps (:class:`~bnn_zoo.inference.driver.Stepper`): step i moves
    every particle by HMC at temperature i + 1 and adds its weight increment. Its state is the particles,
    their weights and log densities, the step size and the acceptance so far."""

    def __init__(self, target, n: int, num_steps: int, leapfrog_steps: int, step_size: float, target_accept: float):
        self.target, self.leapfrog_steps, self.target_accept = target, leapfrog_steps, target_accept
        t = torch.linspace(-4, 4, num_steps + 1, dtype=torch.float64).sigmoid()
        self.betas = ((t - t[0]) / (t[-1] - t[0])).tolist()  # sigmoid schedule from 0 to 1 (Grosse et al. 2015)
        z = target.sample_prior(n)
        log_prior, log_lik = target(z)
        self.now = {
            "z": z,
            "log_prior": log_prior.detach(),
            "log_lik": log_lik.detach(),
            "log_w": torch.zeros(n, dtype=torch.float64),
            "step_size": step_size,
            "accepted": 0.0,
        }

    def step(self, i: int) -> None:
        now, b_prev, b = self.now, self.betas[i], self.betas[i + 1]
        log_w = now["log_w"] + (b - b_prev) * now["log_lik"].double()
        z, log_prior, log_lik, rate = _hmc_move(
            self.target, now["z"], now["log_prior"], now["log_lik"], b, now["step_size"], self.leapfrog_steps
        )
        # grow slowly while moves succeed; halve at once when nearly all fail (a step far too long for
        # the sharpening target would otherwise leave every particle at its prior draw)
        grow = 1.02 if rate > self.target_accept else (0.5 if rate < 0.05 else 0.98)
        now.update(
            z=z.detach(),
            log_prior=log_prior,
            log_lik=log_lik,
            log_w=log_w,
            step_size=now["step_size"] * grow,
            accepted=now["accepted"] + rate,
        )

    def state(self) -> dict:
        return dict(self.now)

    def load(self, state: dict) -> None:
        if set(state) != set(self.now):
            raise BnnZooError("the checkpoint is not an AIS checkpoint; delete it to start afresh")
        self.now = dict(state)


def _hmc_move(target, z, log_prior, log_lik, beta, step_size, leapfrog_steps):
    """One HMC transition per particle for the density p(z) p(y | z)^beta, with a Metropolis test each."""

    def grad(z):
        z = z.detach().requires_grad_(True)
        lp, ll = target(z)
        (g,) = torch.autograd.grad((lp + beta * ll).sum(), z)
        return g, lp.detach(), ll.detach()

    r0 = torch.randn_like(z)
    g, _, _ = grad(z)
    z1, r = z.detach(), r0 + 0.5 * step_size * g
    for i in range(leapfrog_steps):
        z1 = z1 + step_size * r
        g, lp1, ll1 = grad(z1)
        r = r + (step_size if i < leapfrog_steps - 1 else 0.5 * step_size) * g
    log_accept = (lp1 + beta * ll1 - 0.5 * (r**2).sum(1)) - (log_prior + beta * log_lik - 0.5 * (r0**2).sum(1))
    accept = torch.log(torch.rand_like(log_accept)) < torch.nan_to_num(log_accept, nan=-math.inf)
    keep = accept[:, None]
    return (
        torch.where(keep, z1, z.detach()),
        torch.where(accept, lp1, log_prior),
        torch.where(accept, ll1, log_lik),
        accept.to(z.dtype).mean().item(),
    )
