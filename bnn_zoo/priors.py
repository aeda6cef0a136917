"""Priors over network weights: one distribution per parameter, event shape = parameter shape.

A prior is any callable ``(name, param) -> Distribution`` (the :class:`Prior` protocol). The library's
own: :class:`Normal` (Gal's thesis eq. 3.11 writes p(w) = N(0, l^{-2} I), i.e. ``scale = 1 / l``),
:class:`FanInNormal` (Neal's infinite-width scaling), :class:`ScaleMixture` (Blundell et al.'s
spike-and-slab-like mixture of two Normals) and :class:`PerSite`, which gives each parameter,
chosen by name pattern or module, its own prior: another prior or any torch/Pyro distribution.
"""

from __future__ import annotations

import fnmatch
import math
import weakref
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import pyro.distributions as dist
import torch
from torch import nn
from torch.distributions import Distribution, constraints

from bnn_zoo.errors import BnnZooError, checked


@runtime_checkable
class Prior(Protocol):
    """The prior contract: the distribution of the sample site for parameter ``name`` (value ``param``),
    with event shape ``param.shape``."""

    def __call__(self, name: str, param: torch.Tensor) -> Distribution: ...


class NormalPrior:
    """Zero-mean Normal priors with a scale per parameter (``scale_of``): closed-form KL for every guide."""

    def __call__(self, name: str, param: torch.Tensor) -> dist.Distribution:
        loc = torch.zeros_like(param)
        return dist.Normal(loc, self.scale_of(name, param)).to_event(param.dim())

    def scale_of(self, name: str, param: torch.Tensor) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        return repr(self)


class Normal(NormalPrior):
    """Isotropic Normal N(0, scale^2) on every weight, with optional per-layer scales. Gal's thesis
    (eq. 3.11) writes p(w) = N(0, l^-2 I): ``scale = 1 / l`` (:meth:`from_length_scale`).

    Args:
        scale: the prior standard deviation.
        layer_scales: parameter-name prefix (``"layers.0"`` or ``"layers.0.bias"``) to its own scale;
            the longest matching prefix wins.
    """

    def __init__(self, scale: float = 1.0, layer_scales: dict[str, float] | None = None):
        scales = [scale, *(layer_scales or {}).values()]
        if not all(math.isfinite(s) and s > 0 for s in scales):
            raise BnnZooError(f"prior scales must be positive and finite, got {scales}")
        self.scale = float(scale)
        self.layer_scales = dict(layer_scales or {})

    @classmethod
    def from_length_scale(cls, length_scale: float) -> Normal:
        """Gal's prior p(w) = N(0, l^{-2} I) (thesis eq. 3.11)."""
        return cls(scale=1.0 / length_scale)

    @classmethod
    def gal_keras(cls, p: float, y_std: float, length_scale: float = 1e-2) -> Normal:
        """The Normal prior under which the dropout ELBO equals Gal & Ghahramani's published Keras objective.

        Their code trains on standardised targets with MSE plus weight decay l^2 (1-p) / (2 N tau) on the
        inverted-dropout weights, tau being the original-units precision of the test likelihood. With the
        likelihood N(f, 1 / tau) in original units (sigma = 1 / (sqrt(tau) y_std) on standardised targets)
        and Gal's KL (1-p) l'^2 / 2 ||M||^2 on non-inverted weights M = W / (1-p), the negative ELBO is
        proportional to that objective exactly when l' = l (1-p) y_std / sqrt(2) (biases, which Keras
        leaves undecayed, get the same tiny decay l'^2 / 2).

        Args:
            p: the dropout guide's drop probability.
            y_std: the training targets' standard deviation (original units).
            length_scale: Gal's prior length-scale l in his Keras weight decay l^2 (1 - p) / (2 N tau).
        """
        return cls.from_length_scale(length_scale * (1 - p) * y_std / math.sqrt(2))

    def scale_of(self, name: str, param: torch.Tensor) -> float:
        matches = [p for p in self.layer_scales if name == p or name.startswith(p + ".")]
        return self.layer_scales[max(matches, key=len)] if matches else self.scale

    def __repr__(self) -> str:
        extra = f", layer_scales={self.layer_scales}" if self.layer_scales else ""
        return f"Normal(scale={self.scale}{extra})"


class FanInNormal(NormalPrior):
    """Weights ~ N(0, gain^2 / fan_in), biases ~ N(0, bias_scale^2) (Neal 1996's infinite-width scaling).

    fan_in is the number of inputs of a unit: the product of all but the first weight dimension, so
    the prior variance of each pre-activation stays O(1) whatever the layer width.

    Args:
        gain: the weights' standard deviation times sqrt(fan_in).
        bias_scale: the biases' standard deviation.
    """

    def __init__(self, gain: float = 1.0, bias_scale: float = 1.0):
        if not (gain > 0 and bias_scale > 0):
            raise BnnZooError(f"gain and bias_scale must be positive, got {gain}, {bias_scale}")
        self.gain = float(gain)
        self.bias_scale = float(bias_scale)

    def scale_of(self, name: str, param: torch.Tensor) -> float:
        if param.dim() < 2:
            return self.bias_scale
        return self.gain / math.sqrt(param[0].numel())

    def __repr__(self) -> str:
        return f"FanInNormal(gain={self.gain}, bias_scale={self.bias_scale})"


class ScaleMixture:
    """Blundell et al.'s (2015, eq. 7) scale mixture on every weight and bias:
    p(w) = pi N(0, scale1^2) + (1 - pi) N(0, scale2^2), a wide component for the weights the data need
    and a narrow one that keeps the rest quiet.

    Under a single Normal a weight the data do not need still carries its prior noise into every
    unit it feeds; on an LSTM that noise drowns the signal and mean-field SVI keeps the prior (the
    majority class on toy-text, docs/guide/defaults.md). Fortunato et al. (2017) use this prior for
    Bayesian LSTMs. Its KL against a Gaussian guide has no closed form: SVI uses the one-draw estimate.

    Args:
        pi: the weight of the wide component.
        scale1: the wide component's standard deviation.
        scale2: the narrow component's (0.0025 is about e^-6; Blundell et al. try e^-6 to e^-8).
    """

    def __init__(self, pi: float = 0.5, scale1: float = 1.0, scale2: float = 0.0025):
        if not (0 < pi < 1 and math.isfinite(scale1) and 0 < scale2 < scale1):
            raise BnnZooError(
                f"a scale mixture needs 0 < pi < 1 and 0 < scale2 < scale1 < inf, got pi={pi}, scale1={scale1}, "
                f"scale2={scale2}"
            )
        self.pi, self.scale1, self.scale2 = float(pi), float(scale1), float(scale2)

    def __call__(self, name: str, param: torch.Tensor) -> Distribution:
        weights = torch.tensor([self.pi, 1 - self.pi], dtype=param.dtype, device=param.device)
        scales = torch.tensor([self.scale1, self.scale2], dtype=param.dtype, device=param.device)
        mixture = _RealMixture(dist.Categorical(weights), dist.Normal(torch.zeros_like(scales), scales))
        return mixture.expand(param.shape).to_event(param.dim())

    def __repr__(self) -> str:
        return f"ScaleMixture(pi={self.pi}, scale1={self.scale1}, scale2={self.scale2})"


class _RealMixture(dist.MixtureSameFamily):
    """A mixture of real-valued components, whose support says so: torch's MixtureSameFamily reports a
    constraint wrapper that ``biject_to`` cannot map, which the flow guide needs."""

    support = constraints.real


def site_distribution(prior: Prior | Distribution, name: str, param: torch.Tensor) -> Distribution:
    """The site distribution for ``param`` from a prior or a distribution: a distribution whose event
    shape is the parameter's is used as is; a scalar one, or one with batch shape ``param.shape``, is
    expanded and made one event (i.i.d. weights)."""
    d = prior if isinstance(prior, Distribution) else prior(name, param)
    if tuple(d.event_shape) == tuple(param.shape):
        return d
    if d.event_shape == torch.Size() and d.batch_shape in (torch.Size(), param.shape):
        return dist.Independent(d.expand(param.shape), param.dim()) if param.dim() else d
    raise BnnZooError(
        f"the prior for {name} has batch shape {tuple(d.batch_shape)} and event shape {tuple(d.event_shape)}, but the "
        f"parameter has shape {tuple(param.shape)}; give a scalar distribution or one of that shape"
    )


class PerSite:
    """A prior per parameter, chosen by the first matching rule, else ``default``.

    ``rules`` maps a key to a prior (:class:`Normal`, :class:`FanInNormal`, any :class:`Prior`) or a
    torch/Pyro distribution (scalar: i.i.d. over the parameter's elements; or of the parameter's
    shape). A key is a glob pattern on parameter names (``"layers.*.bias"``), a module name (``"out"``
    covers ``out.weight`` and ``out.bias``) or a module of the network (resolved when the BNN is built).

    Example (a heavy-tailed output layer, Normal elsewhere)::

        prior = bz.priors.PerSite({net.layers[-1]: dist.StudentT(3.0, 0.0, 1.0)}, default=bz.priors.Normal(1.0))
    """

    def __init__(
        self, rules: Mapping[str | nn.Module, Prior | Distribution], default: Prior | Distribution | None = None
    ):
        self.rules = dict(rules)
        self.default = default if default is not None else Normal(1.0)
        for value in [*self.rules.values(), self.default]:
            if not (isinstance(value, Distribution) or callable(value)):
                raise BnnZooError(f"a PerSite rule must map to a prior or a torch/Pyro distribution, got {value!r}")

    def named(self, net: nn.Module) -> PerSite:
        """The same rules with module keys replaced by their names in ``net``."""
        names = {id(m): n for n, m in net.named_modules()}
        rules = {}
        for key, value in self.rules.items():
            if isinstance(key, nn.Module):
                if id(key) not in names:
                    raise BnnZooError(f"a PerSite rule names a module that is not part of the network: {key!r}")
                key = names[id(key)]
            rules[key] = value
        return PerSite(rules, self.default)

    def rule_for(self, name: str) -> Prior | Distribution:
        for key, value in self.rules.items():
            if isinstance(key, str) and matches(name, key):
                return value
        return self.default

    def __call__(self, name: str, param: torch.Tensor) -> Distribution:
        return site_distribution(self.rule_for(name), name, param)

    def __repr__(self) -> str:
        rules = ", ".join(f"{k!r}: {v!r}" for k, v in self.rules.items())
        return f"PerSite({{{rules}}}, default={self.default!r})"


def matches(name: str, key: str) -> bool:
    """A parameter name matches a glob pattern, or a module name that owns it (``"out"`` -> ``out.weight``)."""
    return fnmatch.fnmatchcase(name, key) or name.startswith(key + ".")


DEFAULT_RULE = (  # what default_prior picks, in the words the command line's help and the docs show
    "normal under the dropout guide on classifiers and language models, the method's recurrent prior on the "
    "recurrent models (the scale mixture unless the method names another), fanin otherwise"
)


@checked
def default_prior(architecture: str, task: str, dropout_guide: bool | None = None, recurrent: Prior | None = None):
    """The prior bnn-zoo fits when none is given, through every door (``bz.BNN(net)``, ``bnn-zoo fit``).

    - ``Normal(1)`` under the dropout guide on classifiers and language models: Gal's KL is a weight decay
      (1 - p) / (2 N s^2) per weight, which under the fan-in prior (s^2 = 1 / fan_in) is hundreds of times
      the usual and collapses a CNN to chance.
    - On a recurrent network, ``recurrent`` (the method's own; default Blundell et al.'s scale mixture,
      whose narrow component lets the weights the data do not need go quiet).
    - ``FanInNormal()`` elsewhere, dropout on regression included: a learned p falls to 1e-4 there, and
      under N(0, 1) the network overfits (docs/guide/defaults.md).

    Args:
        architecture: ``bnn_zoo.models.architecture(net)``: dense, conv or recurrent.
        task: the likelihood's task.
        dropout_guide: whether SVI's dropout guide fits it (None: the default guide, which is dropout on
            recurrent networks and mean-field otherwise).
        recurrent: the method's prior for recurrent networks.
    """
    dropout = architecture == "recurrent" if dropout_guide is None else dropout_guide
    if dropout and task != "regression":
        return Normal(1.0)
    if architecture == "recurrent":
        return recurrent if recurrent is not None else ScaleMixture()
    return FanInNormal()


_PRIOR_TERMS: dict[int, tuple | None] = {}  # by id of a prior's Normal while it lives


def zero_mean_normal_terms(p, event_shape) -> tuple[float | torch.Tensor, float | torch.Tensor] | None:
    """For a zero-mean Normal prior over ``event_shape``: (1 / (2 sigma^2), sum of log(sigma sqrt(2 pi))),
    worked out once per prior object, as numbers where sigma is one number (the library's priors); None
    for any other prior. The guides' closed-form KLs use them with :func:`half_square_sum` (every SVI
    step meets the same prior objects)."""
    base = getattr(p, "base_dist", None)
    if not isinstance(base, dist.Normal) or p.event_shape != event_shape:
        return None
    if base.loc.requires_grad or base.scale.requires_grad:  # a learned prior moves
        return _normal_terms(base, len(event_shape))
    if id(base) not in _PRIOR_TERMS:
        _PRIOR_TERMS[id(base)] = _normal_terms(base, len(event_shape))
        weakref.finalize(base, _PRIOR_TERMS.pop, id(base), None)
    return _PRIOR_TERMS[id(base)]


def half_square_sum(v: torch.Tensor, half_precision: float | torch.Tensor, event_dim: int) -> torch.Tensor:
    """sum v^2 / (2 sigma^2) over the last ``event_dim`` dims, with ``half_precision`` 1 / (2 sigma^2) from
    :func:`zero_mean_normal_terms` (a number: summed first, one product less to differentiate)."""
    dims = tuple(range(-event_dim, 0))
    if isinstance(half_precision, float):
        return v.pow(2).sum(dims) * half_precision
    return (v.pow(2) * half_precision).sum(dims)


def _normal_terms(base, event_dim: int) -> tuple[float | torch.Tensor, float | torch.Tensor] | None:
    if (base.loc != 0).any():
        return None
    scale = base.scale
    if not scale.requires_grad and scale.dim() == event_dim and bool((scale == scale.reshape(-1)[0]).all()):
        sigma = float(scale.reshape(-1)[0])  # one sigma for the site, no batch: plain numbers
        return 1 / (2 * sigma**2), scale.numel() * (math.log(sigma) + 0.5 * math.log(2 * math.pi))
    dims = tuple(range(-event_dim, 0))
    return 1 / (2 * scale.pow(2)), (scale.log() + 0.5 * math.log(2 * math.pi)).sum(dims)
