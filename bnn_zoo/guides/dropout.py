"""Dropout as variational inference (Gal's thesis ch. 3.2; Gal & Ghahramani 2016).

Conventions (DESIGN.md): p is the DROP probability; a torch weight W has shape (out, in), so Gal's
rows (input units) are our columns. Each input unit j of a weight matrix is kept, W[:, j] = M[:, j],
with probability 1 - p and zeroed otherwise: the mixture q = (1-p) N(M[:, j], s^2) + p N(0, s^2) in
the limit s -> 0. Biases are deterministic (a point mass). Masks are NOT rescaled by 1/(1-p) (Gal's
convention, not PyTorch's inverted dropout), so M is the mean of the kept component and
E_q[W] = (1-p) M is what standard dropout's weight scaling predicts with.

With a prior N(0, l^-2) per weight (``priors.Normal.from_length_scale(l)``), Gal's KL approximation
KL = sum_j (1-p) l^2 / 2 ||M[:, j]||^2 + const is registered below, and a point mass against the prior
gives l^2 / 2 ||b||^2 + const. SVI's negative ELBO on a Gaussian likelihood N(f, 1/tau) is then
N tau times Gal's dropout objective (eq. 3.11) with weight decay lambda = l^2 (1-p) / (2 N tau)
(eq. 3.14) on M and l^2 / (2 N tau) on biases, up to constants: the gradients agree exactly.

The constant is -(entropy of a point mass) = +infinity as s -> 0, so this guide has no density and
no finite ELBO: ``Posterior.elbo`` and the Renyi objective refuse it.
"""

from __future__ import annotations

import math
from typing import Literal

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.nn import PyroParam
from torch.distributions import kl_divergence, register_kl

from bnn_zoo.errors import BnnZooError
from bnn_zoo.guides.mean_field import MeanField
from bnn_zoo.guides.registry import register
from bnn_zoo.local_noise import InputDropout, relaxed_keep_mask
from bnn_zoo.priors import half_square_sum, zero_mean_normal_terms
from bnn_zoo.protocols import PlacesDropout
from bnn_zoo.variational import LocalParamModule, sample_sites


class DropoutMixture(TorchDistribution):
    """Gal's dropout distribution of one weight (out, *in) as s -> 0: input units kept w.p. 1 - p."""

    arg_constraints = {}
    has_rsample = True

    def __init__(
        self,
        loc: torch.Tensor,
        p: float | torch.Tensor,
        event_dim: int | None = None,
        temperature: float | None = None,
        validate_args=None,
    ):
        event_dim = loc.dim() if event_dim is None else event_dim
        # a tensor p is learned (concrete dropout): its masks are relaxed with the temperature in training
        self.loc, self.p, self.temperature = loc, p if isinstance(p, torch.Tensor) else float(p), temperature
        super().__init__(
            loc.shape[: loc.dim() - event_dim], loc.shape[loc.dim() - event_dim :], validate_args=validate_args
        )

    @constraints.dependent_property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        loc = self.loc.expand(batch_shape + self.event_shape)
        return DropoutMixture(loc, self.p, len(self.event_shape), self.temperature)

    @property
    def mean(self):
        return (1 - self.p) * self.loc.expand(self.batch_shape + self.event_shape)

    def rsample(self, sample_shape=()):
        """M with whole input columns zeroed: one mask per draw, shared by every output unit."""
        shape = torch.Size(sample_shape) + self.batch_shape
        mask_shape = shape + (1,) + self.event_shape[1:]
        if self.temperature is not None:
            return self.loc * relaxed_keep_mask(mask_shape, 1 - self.p, self.temperature, self.loc)
        keep = torch.rand(mask_shape, dtype=self.loc.dtype, device=self.loc.device) >= self.p
        return self.loc * keep.to(self.loc.dtype)

    def log_prob(self, value):
        """Log mass of the value's mask pattern. The Gaussian part is a point mass (s -> 0), whose density
        is infinite, so this is log q only up to that infinite constant (the KL above never uses it)."""
        event_dims = tuple(range(-len(self.event_shape), 0))
        kept = value.abs().amax(dim=-len(self.event_shape)) > 0  # (..., *in): was column j kept?
        p = torch.as_tensor(self.p, dtype=value.dtype, device=value.device)
        lp = torch.where(kept, torch.log1p(-p), torch.log(p))
        return lp.sum(event_dims[1:]) if len(event_dims) > 1 else lp


@register_kl(DropoutMixture, dist.Independent)
def _kl_dropout_normal(q, p):
    """Gal's KL approximation to a zero-mean Normal prior: sum (1-p) M^2 / (2 sigma^2) - K H(p) + const,
    K the input units and H(p) the Bernoulli entropy (Gal, Hron & Kendall 2017, eq. 3). With p fixed
    -K H(p) is a constant and left out; a learned p needs it."""
    terms = zero_mean_normal_terms(p, q.event_shape)
    if terms is None:
        raise NotImplementedError
    half_precision, _ = terms
    kl = half_square_sum(q.loc, half_precision, len(q.event_shape)) * (1 - q.p)
    if isinstance(q.p, torch.Tensor):
        entropy = -(q.p * q.p.log() + (1 - q.p) * torch.log1p(-q.p))
        kl = kl - q.event_shape[1:].numel() * entropy
    return kl


@register_kl(dist.Delta, dist.Independent)
def _kl_point_mass_normal(q, p):
    """KL of a point mass at v to a prior p: -log p(v) (Pyro's value for a Delta). For a zero-mean Normal it is
    written out, sum v^2 / (2 sigma^2) + log(sigma sqrt(2 pi)), so a bias costs SVI three graph nodes, not eight."""
    terms = zero_mean_normal_terms(p, q.event_shape)
    if terms is None:
        return -p.log_prob(q.v)
    half_precision, log_normaliser = terms
    return half_square_sum(q.v, half_precision, len(q.event_shape)) + log_normaliser


class DropoutGuide(LocalParamModule):
    """Dropout mixture on every weight with 2 or more dims, point masses on biases, mean field on the
    likelihood's own latents (a learned noise scale).

    ``p``: one drop probability for every weight matrix, or one per weight matrix in order (the first
    drops network inputs). A network with a ``dropout_layers`` attribute (e.g. LeNet) limits dropout
    to those weights; the others get p = 0, a point mass whose KL is the prior's weight decay.
    ``masks="step"`` draws one mask per weight draw (shared by the minibatch); ``masks="example"``
    gives every data point its own mask during training, as ordinary dropout does. Left as None, both
    follow the task (:func:`default_options`). ``learn_p`` makes each weight matrix's p a variational
    parameter started at ``p`` (None: learned for regression when p is not given): concrete dropout
    (Gal, Hron & Kendall 2017), whose masks are relaxed at temperature ``TEMPERATURE`` in training and
    Bernoulli at prediction.
    """

    has_density = False

    def __init__(self, model, init_values, p=None, masks: str | None = None, learn_p: bool | None = None):
        super().__init__()
        p, masks, learn_p = default_options(model.likelihood.task, p, masks, learn_p)
        if not isinstance(learn_p, bool):
            raise BnnZooError(f"dropout learn_p is true or false, got {learn_p!r}")
        if masks not in ("step", "example"):
            raise BnnZooError(
                f"unknown dropout masks {masks!r}; choose step (one per draw) or example (one per data point)"
            )
        self.masks = masks
        self.weights = [k for k, v in model.params.items() if v.dim() >= 2]
        self.biases = [k for k, v in model.params.items() if v.dim() < 2]
        self.order = list(model.params)
        # an architecture may say where dropout goes (LeNet's lenet-all / lenet-ip): other weights keep p = 0
        placed = model.net.dropout_layers if isinstance(model.net, PlacesDropout) else None
        dropped = [k for k in self.weights if placed is None or k in placed]
        self.p = {k: 0.0 for k in self.weights} | dict(zip(dropped, _per_layer(p, len(dropped))))
        self.learned = [k for k in dropped if self.p[k] > 0] if learn_p else []
        if learn_p and not self.learned:  # logit 0 is -inf: nothing to learn from, and no dropout at all
            raise BnnZooError(
                f"dropout learn_p starts each p where it is given, and p = {p} leaves none above 0 to learn; give "
                "p > 0 (e.g. 0.1), or learn_p false for a fit without dropout"
            )
        self.logits = LocalParamModule()  # each learned p as logit p
        for name in self.learned:
            logit = math.log(self.p[name] / (1 - self.p[name]))
            setattr(self.logits, name.replace(".", "__"), PyroParam(torch.tensor(logit, dtype=init_values[name].dtype)))
        self.locs = LocalParamModule()
        for name in self.order:
            setattr(self.locs, name.replace(".", "__"), PyroParam(init_values[name].detach().clone()))
        for name in self.weights:  # Gal's KL condition needs a zero-mean Normal prior
            try:
                kl_divergence(DropoutMixture(init_values[name], self.p[name]), model.site_prior(name))
            except NotImplementedError:
                raise BnnZooError(
                    f"the dropout guide needs a zero-mean Normal prior on every weight, got {model.prior!r}"
                ) from None
        self.rest = MeanField(model, init_values, sites=[k for k in model.latent_shapes() if k not in model.params])
        self._sites_key = None  # what the cached site distributions were built from (site_distributions)

    def loc(self, name: str) -> torch.Tensor:
        return getattr(self.locs, name.replace(".", "__"))

    def rate(self, name: str) -> float | torch.Tensor:
        """Weight ``name``'s drop probability: a tensor where it is learned, else a float."""
        return torch.sigmoid(getattr(self.logits, name.replace(".", "__"))) if name in self.learned else self.p[name]

    def rates(self) -> dict[str, float]:
        """Every dropped weight's drop probability now (the learned ones' fitted values)."""
        return {
            k: float(self.rate(k).detach()) if k in self.learned else self.p[k] for k in self.weights if self.p[k] > 0
        }

    def site_distributions(self) -> dict[str, tuple[dist.Distribution, dict]]:
        locs = [getattr(self.locs, name.replace(".", "__")) for name in self.order]
        # Every site is a function of its loc tensor alone, which Adam updates in place, so the same
        # tensors give the same distributions: built again only when a loc or the mode changes.
        key = (self.training, *map(id, locs))
        if self._sites_key != key or self.learned:  # a learned p changes at every step
            self._sites, self._sites_key = self._build_sites(locs), key
        return self._sites | self.rest.site_distributions()

    def _apply(self, fn, *args, **kwargs):
        self._sites_key = (
            None  # .to() moves the locs in place (same ids), but a cached point mass keeps its own log-density tensor
        )
        return super()._apply(fn, *args, **kwargs)

    def _build_sites(self, locs: list[torch.Tensor]) -> dict[str, tuple[dist.Distribution, dict]]:
        sites = {}
        for name, m in zip(self.order, locs):  # the model's order, which Pyro's mean-field check expects
            if name in self.p:
                p = self.rate(name)
                relax = TEMPERATURE if self.training and isinstance(p, torch.Tensor) else None
                per_example = self.masks == "example" and self.training and self.p[name] > 0
                sites[name] = (
                    DropoutMixture(m, p, temperature=relax),
                    {"local_noise": InputDropout(m, 1 - p, relax)} if per_example else {},
                )
            else:
                sites[name] = (dist.Delta(m, event_dim=m.dim()), {})
        return sites

    def forward(self, *args, **kwargs):
        return sample_sites(self.site_distributions())

    def mean(self) -> dict[str, torch.Tensor]:
        """E_q[w]: (1-p) M for weights (standard dropout's weight scaling), biases as they are."""
        rates = self.rates()
        means = {name: (1 - rates.get(name, 0.0)) * self.loc(name) for name in self.weights}
        means.update({name: self.loc(name) for name in self.biases})
        means.update(self.rest.mean())
        return means


TEMPERATURE = 0.1  # of a learned p's relaxed masks in training (Gal, Hron & Kendall 2017)


def _per_layer(p, count: int) -> list[float]:
    if isinstance(p, str):
        p = [float(v) for v in p.split(",") if v.strip()]
    ps = [float(p)] * count if isinstance(p, (int, float)) else [float(v) for v in p]
    if len(ps) != count:
        raise BnnZooError(
            f"dropout p has {len(ps)} values but {count} weight matrices take dropout; give one or {count}"
        )
    if not all(0 <= v < 1 for v in ps):
        raise BnnZooError(f"dropout probabilities must lie in [0, 1), got {ps}")
    return ps


# Gal's relation between dropout's weight decay and the model (eqs. 3.13, 3.14, 3.17). Under PyTorch's
# inverted dropout (kept units scaled by 1/(1-p) in training) the trained weight is W = (1-p) M, so the
# same objective needs weight decay lambda / (1-p)^2 on W: pass inverted=True.


def weight_decay(p: float, length_scale: float, tau: float, n: int, inverted: bool = False) -> float:
    """lambda = l^2 (1-p) / (2 N tau) (eq. 3.14); l^2 / (2 N tau (1-p)) under inverted dropout."""
    lam = length_scale**2 * (1 - p) / (2 * n * tau)
    return lam / (1 - p) ** 2 if inverted else lam


def length_scale(p: float, weight_decay: float, tau: float, n: int, inverted: bool = False) -> float:
    """l = sqrt(2 N tau lambda / (1-p)) (eq. 3.13), the inverse of :func:`weight_decay`."""
    lam = weight_decay * (1 - p) ** 2 if inverted else weight_decay
    return math.sqrt(2 * n * tau * lam / (1 - p))


def precision(p: float, length_scale: float, weight_decay: float, n: int, inverted: bool = False) -> float:
    """tau = (1-p) l^2 / (2 N lambda) (eq. 3.17): the model precision a tuned weight decay implies."""
    lam = weight_decay * (1 - p) ** 2 if inverted else weight_decay
    return (1 - p) * length_scale**2 / (2 * n * lam)


def default_options(task: str, p=None, masks: str | None = None, learn_p: bool | None = None) -> tuple:
    """(p, masks, learn_p) with None filled in by the task. Regression: p learned (concrete dropout) from
    0.01 with a mask per data point, when p is not given; a fixed p swamps a 50-unit network whose
    noise is small (naval: 60% above mean-field's RMSE at p = 0.01; docs/guide/defaults.md). A given p
    stays fixed unless ``learn_p``. Classification and language models: p = 0.1, fixed, one mask per draw."""
    regression = task == "regression"
    return (
        (0.01 if regression else 0.1) if p is None else p,
        ("example" if regression else "step") if masks is None else masks,
        (regression and p is None) if learn_p is None else learn_p,
    )


@register(
    "dropout",
    "Gal's dropout mixture (MC dropout as VI); p (drop probability, one or per layer), masks=step|example, learn_p",
)
def dropout(
    model,
    init_values,
    p: float | list[float] | None = None,
    masks: Literal["step", "example"] | None = None,
    learn_p: bool | None = None,
):
    """Gal's dropout mixture (MC dropout as variational inference), its means started at ``init_values``.

    Args:
        p: drop probability, one or one per weight matrix (None: 0.01 for regression, 0.1 otherwise).
        masks: one mask per draw (step) or one per data point (example); None: example for regression,
            step otherwise.
        learn_p: fit each weight matrix's p by the ELBO, started at ``p`` (concrete dropout); None:
            learned for regression when ``p`` is not given, fixed otherwise.
    """
    return DropoutGuide(model, init_values, p=p, masks=masks, learn_p=learn_p)
