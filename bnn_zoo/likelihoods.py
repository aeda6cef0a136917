"""Likelihoods p(y | f(x; w)): each turns network outputs into a distribution over one target per datum.

A likelihood may own global latent sites (the learned noise scale); their values arrive with a leading
batch shape equal to the draws' batch shape of ``f`` minus its last two dims (data, outputs).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch.distributions import Distribution, Independent

from bnn_zoo.errors import BnnZooError


class Likelihood:
    task = "regression"

    def sample_latent(self) -> dict[str, torch.Tensor]:
        """Sample this likelihood's own global sites (called once per model run, outside the data plate)."""
        return {}

    def latent_prior(self) -> dict[str, dist.Distribution]:
        return {}

    def distribution(self, f: torch.Tensor, latent: dict) -> dist.Distribution:
        """Distribution of y given outputs f of shape (..., N, out); batch shape (..., N)."""
        raise NotImplementedError

    def log_prob(self, f: torch.Tensor, latent: dict, y: torch.Tensor) -> torch.Tensor:
        """log p(y | f) per datum, shape (..., N): the distribution's log density, which a likelihood may
        write out where building the distribution costs more than the arithmetic (SVI's every step)."""
        return self.distribution(f, latent).log_prob(y)

    def value_log_prob(self, f: torch.Tensor, latent: dict, y: torch.Tensor) -> torch.Tensor:
        """log p(y | f) per observed value: (..., N, out) for several real targets, independent given f (the
        InferenceData's log_likelihood, which ArviZ pairs with observed_data value by value); else (..., N)."""
        d = self.distribution(f, latent)
        several = self.task == "regression" and y.dim() == 2 and y.shape[-1] > 1
        return d.base_dist.log_prob(y) if several and isinstance(d, Independent) else d.log_prob(y)

    def mean(self, f: torch.Tensor, latent: dict) -> torch.Tensor:
        """E[y | f] per draw, shape (..., N, out)."""
        raise NotImplementedError

    def noise_variance(self, f: torch.Tensor, latent: dict) -> torch.Tensor:
        """Var[y | f] per draw, shape (..., N, out)."""
        raise NotImplementedError

    def cdf(self, f: torch.Tensor, latent: dict, y: torch.Tensor) -> torch.Tensor:
        """P(Y <= y | f) per draw and output, shape (..., N, out) (regression likelihoods)."""
        raise BnnZooError(f"{type(self).__name__} has no CDF; interval coverage is defined for regression")

    def check_targets(self, y: torch.Tensor, out_features: int) -> torch.Tensor:
        """Validate y (already finite, N rows) and return it in this likelihood's canonical form."""
        raise NotImplementedError

    def outputs(self, targets: int) -> int:
        """The network outputs this likelihood reads for ``targets`` target columns (or classes)."""
        return targets

    def to(self, device: torch.device | str) -> Likelihood:
        """A copy whose distributions' tensors (a learned noise's prior) live on ``device``."""
        other = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, Distribution):
                setattr(other, name, move_distribution(value, device))
        return other


def move_distribution(d: Distribution, device: torch.device | str) -> Distribution:
    """A copy of a torch/Pyro distribution with every tensor it holds (and its base distribution's)
    on ``device``; torch distributions have no ``.to``, and their parameters are plain attributes."""
    other = copy.copy(d)
    for name, value in vars(d).items():
        if isinstance(value, torch.Tensor):
            setattr(other, name, value.to(device))
        elif isinstance(value, Distribution):
            setattr(other, name, move_distribution(value, device))
    return other


_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class Gaussian(Likelihood):
    """y ~ N(f(x), sigma^2 I) with sigma fixed or learned. Gal's model precision is tau = 1 / sigma^2
    (thesis eq. 3.18 for the test log-likelihood).

    A fixed sigma is in the data's units: ``bnn_zoo.fit``, which fits standardised targets, divides it
    by the targets' sd (:meth:`in_units`). A learned sigma is a site of the standardised model, so its
    prior acts on standardised targets.

    Args:
        scale: the fixed noise standard deviation sigma, in the targets' units; None to learn it (the
            sample site ``noise_scale``).
        scale_prior: the learned scale's prior; default HalfNormal(1), which suits standardised targets.
    """

    site = "noise_scale"
    fitted_scale: float | tuple[float, ...] | None = None  # set by in_units: sigma / y_std, per output

    def __init__(self, scale: float | None = 1.0, scale_prior: dist.Distribution | None = None):
        if scale is not None and not (scale > 0 and float(scale) < float("inf")):
            raise BnnZooError(f"Gaussian noise scale must be positive and finite, got {scale}")
        if scale is not None and scale_prior is not None:
            raise BnnZooError("give either a fixed Gaussian scale or a scale_prior, not both")
        self.scale = None if scale is None else float(scale)
        self.scale_prior = scale_prior if scale_prior is not None or scale is not None else dist.HalfNormal(1.0)

    @classmethod
    def from_precision(cls, precision: float) -> Gaussian:
        """A fixed noise of precision tau = 1 / sigma^2 in the targets' units (Gal & Ghahramani's tau):
        sigma = 1 / sqrt(tau). The test log-likelihood is then Gal's eq. 3.18 with this tau."""
        if not (precision > 0 and float(precision) < float("inf")):
            raise BnnZooError(f"Gaussian precision must be positive and finite, got {precision}")
        return cls(1.0 / math.sqrt(precision))

    @classmethod
    def learned(cls, scale_prior: dist.Distribution | None = None) -> Gaussian:
        return cls(scale=None, scale_prior=scale_prior)

    @classmethod
    def fixed_or_learned(cls, scale: float | None = None, precision: float | None = None):
        """The noise a run states: fixed by ``scale`` or by ``precision``, else learned (HalfNormal(1) prior).

        Args:
            scale: fixed noise sd in the targets' units (None: learned, unless precision is given).
            precision: fixed noise precision tau = 1 / sigma^2 in the targets' units (None: learned, unless
                scale is given); see :meth:`from_precision`.
        """
        if scale is not None and precision is not None:
            raise BnnZooError("give the Gaussian likelihood a scale or a precision, not both")
        if precision is not None:
            return cls.from_precision(precision)
        return cls.learned() if scale is None else cls(scale)

    def in_units(self, y_std: torch.Tensor) -> Gaussian:
        """This likelihood for targets divided by ``y_std`` (one per output): a fixed sigma becomes
        sigma / y_std; a learned one is the standardised model's own, unchanged."""
        if self.scale is None:
            return self
        other = copy.copy(self)
        # plain numbers: a traced log density (the XLA samplers) takes them as constants
        sigma = [self.scale / s for s in y_std.reshape(-1).tolist()]
        other.fitted_scale = sigma[0] if len(sigma) == 1 else tuple(sigma)
        return other

    @property
    def fixed_sigma(self) -> float | tuple[float, ...] | None:
        """The fixed sigma the fit uses: the stated scale, over y_std when fitted standardised (a float for
        one output, else one per output); None when learned."""
        return self.scale if self.fitted_scale is None else self.fitted_scale

    def latent_prior(self):
        return {} if self.scale is not None else {self.site: self.scale_prior}

    def sample_latent(self):
        return {name: pyro.sample(name, d) for name, d in self.latent_prior().items()}

    def _sigma(self, latent):
        if self.scale is not None:
            sigma = self.fixed_sigma
            return sigma if isinstance(sigma, float) else torch.tensor(sigma)  # one per output
        return latent[self.site][..., None, None]  # broadcast over (N, out)

    def distribution(self, f, latent):
        return dist.Normal(f, self._sigma(latent)).to_event(1)

    def log_prob(self, f, latent, y):
        """sum over outputs of -(y - f)^2 / (2 sigma^2) - log(sigma sqrt(2 pi)), without building the Normal
        (torch's Normal.log_prob to rounding); with one fixed sigma its terms are numbers, worked out once."""
        sigma = self._sigma(latent)
        if isinstance(sigma, float):
            return (y - f).pow(2).sum(-1) * (-0.5 / sigma**2) - y.shape[-1] * (math.log(sigma) + _LOG_SQRT_2PI)
        sigma = torch.as_tensor(sigma, dtype=f.dtype, device=f.device)
        return (-((y - f) ** 2) / (2 * sigma**2) - sigma.log() - _LOG_SQRT_2PI).sum(-1)

    def mean(self, f, latent):
        return f

    def noise_variance(self, f, latent):
        return torch.ones_like(f) * self._sigma(latent) ** 2

    def cdf(self, f, latent, y):
        return dist.Normal(f, self._sigma(latent)).cdf(y)

    def check_targets(self, y, out_features):
        return _real_targets(y, out_features)

    def __repr__(self):
        return (
            f"Gaussian(scale={self.scale})" if self.scale is not None else f"Gaussian(scale_prior={self.scale_prior})"
        )


def _real_targets(y: torch.Tensor, columns: int, outputs: str = "") -> torch.Tensor:
    """Real-valued targets as (N, columns), refusing any other shape."""
    if not torch.is_floating_point(y):
        y = y.to(torch.get_default_dtype())
    if y.dim() == 1 and columns == 1:
        y = y[:, None]
    if y.dim() != 2 or y.shape[1] != columns:
        raise BnnZooError(
            f"y has shape {tuple(y.shape)} but the network has {outputs or columns} output(s); pass y with shape (N,) "
            f"or (N, {columns})"
        )
    return y


class Heteroscedastic(Likelihood):
    """y ~ N(mu(x), sigma(x)^2) with both predicted: the network's 2D outputs are (mu, s) for D targets and
    sigma^2 = softplus(s) + min_variance (Lakshminarayanan et al. 2017, sec. 2.2.1: the NLL
    log sigma^2 / 2 + (y - mu)^2 / (2 sigma^2) + const; Aziz's lecture, "learn to predict both Gaussian
    parameters").

    Args:
        min_variance: the floor added to softplus(s), in standardised units (the paper's 1e-6), so the
            density stays finite where a network drives its variance to zero.
    """

    def __init__(self, min_variance: float = 1e-6):
        if not (min_variance > 0 and float(min_variance) < float("inf")):
            raise BnnZooError(f"Heteroscedastic min_variance must be positive and finite, got {min_variance}")
        self.min_variance = float(min_variance)

    def _split(self, f):
        mu, s = f.chunk(2, dim=-1)
        return mu, torch.nn.functional.softplus(s) + self.min_variance

    def outputs(self, targets):
        return 2 * targets

    def distribution(self, f, latent):
        mu, var = self._split(f)
        return dist.Normal(mu, var.sqrt()).to_event(1)

    def log_prob(self, f, latent, y):
        mu, var = self._split(f)
        return (-((y - mu) ** 2) / (2 * var) - 0.5 * var.log() - 0.5 * math.log(2 * math.pi)).sum(-1)

    def mean(self, f, latent):
        return self._split(f)[0]

    def noise_variance(self, f, latent):
        return self._split(f)[1]

    def cdf(self, f, latent, y):
        mu, var = self._split(f)
        return dist.Normal(mu, var.sqrt()).cdf(y)

    def fisher(self, f, latent):
        """The Fisher information of y | f in f, (N, 2D, 2D): 1 / sigma^2 for mu and
        softplus'(s)^2 / (2 sigma^4) for s, the positive semi-definite curvature a Laplace GGN needs
        (the Hessian of the NLL in s is indefinite away from the MAP)."""
        mu, var = self._split(f)
        dvar = torch.sigmoid(f.chunk(2, dim=-1)[1])
        return torch.diag_embed(torch.cat([1 / var, dvar**2 / (2 * var**2)], -1))

    def check_targets(self, y, out_features):
        if out_features % 2:
            raise BnnZooError(
                f"the heteroscedastic likelihood reads a mean and a scale per target: the network needs 2 outputs per "
                f"target column, this one has {out_features}"
            )
        return _real_targets(y, out_features // 2, f"{out_features} (a mean and a scale per target)")

    def __repr__(self):
        return f"Heteroscedastic(min_variance={self.min_variance})"


class _Discrete(Likelihood):
    """Class labels 0..C-1; ``labels`` names them (a table's class column, in sorted order), so that
    predictions can be read as the data's own labels (:attr:`bnn_zoo.posterior.Prediction.labels`)."""

    task = "classification"

    def __init__(self, labels: Sequence[str] | None = None):
        if labels is not None:
            labels = tuple(labels)
            if not all(isinstance(v, str) for v in labels) or len(set(labels)) < len(labels) or len(labels) < 2:
                raise BnnZooError(f"labels names the classes 0..C-1: at least two distinct strings, got {labels!r}")
        self.labels = labels

    def _check_count(self, num_classes: int) -> None:
        if self.labels is not None and len(self.labels) != num_classes:
            raise BnnZooError(
                f"the likelihood names {len(self.labels)} classes but the network has {num_classes}; give the "
                "network one output per class"
            )

    def __repr__(self):
        return f"{type(self).__name__}({'' if self.labels is None else f'labels={list(self.labels)}'})"

    def _labels(self, y, num_classes):
        if torch.is_floating_point(y) and not torch.equal(y, y.round()):
            raise BnnZooError("class labels must be whole numbers 0..C-1; got fractional values in y")
        y = y.long()
        if y.dim() == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.dim() != 1:
            raise BnnZooError(f"class labels must have shape (N,), got {tuple(y.shape)}")
        if y.numel() and (y.min() < 0 or y.max() >= num_classes):
            raise BnnZooError(
                f"labels must lie in 0..{num_classes - 1} for {num_classes} classes, found "
                f"{int(y.min())}..{int(y.max())}; relabel y or give the network more outputs"
            )
        return y


class Bernoulli(_Discrete):
    """Binary y in {0, 1} with p(y = 1) = sigmoid(f); the network has one output."""

    def distribution(self, f, latent):
        return dist.Bernoulli(logits=f[..., 0])

    def mean(self, f, latent):
        return torch.sigmoid(f)

    def noise_variance(self, f, latent):
        p = torch.sigmoid(f)
        return p * (1 - p)

    def check_targets(self, y, out_features):
        if out_features != 1:
            raise BnnZooError(f"Bernoulli needs a network with 1 output, this one has {out_features}")
        self._check_count(2)
        return self._labels(y, 2).to(torch.get_default_dtype())


class Categorical(_Discrete):
    """y in {0, ..., C-1} with class probabilities softmax(f); the network has C outputs."""

    def distribution(self, f, latent):
        return dist.Categorical(logits=f)

    def mean(self, f, latent):
        return torch.softmax(f, dim=-1)

    def noise_variance(self, f, latent):
        p = torch.softmax(f, dim=-1)
        return p * (1 - p)

    def check_targets(self, y, out_features):
        if out_features < 2:
            raise BnnZooError(f"Categorical needs a network with at least 2 outputs, this one has {out_features}")
        self._check_count(out_features)
        return self._labels(y, out_features)


class Tokens(Categorical):
    """Next-token labels y (N, T) in 0..V-1 under softmax(f), f of shape (N, T, V); -1 marks padding.

    One data point is one sequence: its log-likelihood sums over its real tokens.
    """

    task = "language-model"
    PAD = -1

    def distribution(self, f, latent):
        return _TokenCategorical(f)

    def check_targets(self, y, out_features):
        if torch.is_floating_point(y) and not torch.equal(y, y.round()):
            raise BnnZooError("token labels must be whole numbers; got fractional values in y")
        y = y.long()
        if y.dim() != 2:
            raise BnnZooError(f"token labels must have shape (N, T) with -1 for padding, got {tuple(y.shape)}")
        if y.numel() and (y.min() < self.PAD or y.max() >= out_features):
            raise BnnZooError(
                f"token labels must lie in 0..{out_features - 1} (or -1 for padding), found "
                f"{int(y.min())}..{int(y.max())}"
            )
        return y

    def __repr__(self):
        return "Tokens()"


class _TokenCategorical(dist.TorchDistribution):
    """Independent categoricals over a sequence's positions, padding (-1) contributing nothing."""

    arg_constraints = {}
    support = constraints.independent(constraints.integer_interval(-1, 1 << 30), 1)

    def __init__(self, logits):
        self.logits = logits
        super().__init__(logits.shape[:-2], logits.shape[-2:-1])

    def expand(self, batch_shape, _instance=None):
        return _TokenCategorical(self.logits.expand(*batch_shape, *self.logits.shape[-2:]))

    def log_prob(self, value):
        logp = self.logits.log_softmax(-1).gather(-1, value.clamp(min=0).expand(self.logits.shape[:-1])[..., None])[
            ..., 0
        ]
        return (logp * (value >= 0)).sum(-1)

    def sample(self, sample_shape=()):
        return dist.Categorical(logits=self.logits).sample(sample_shape)


def default_likelihood(task: str = "regression", noise_scale: float | None = None) -> Likelihood:
    """The likelihood bnn-zoo fits when none is given, through every door: a Gaussian with a learned
    noise for regression, or ``noise_scale`` fixed where the data know it (a simulated table: with the
    noise learned, toy-cubic's 20 points let SVI explain the cubic away as noise, test RMSE 23.8);
    ``Categorical`` for classifiers; ``Tokens`` for language models."""
    if task == "regression":
        return Gaussian.learned() if noise_scale is None else Gaussian(noise_scale)
    return {"classification": Categorical, "language-model": Tokens}[task]()
