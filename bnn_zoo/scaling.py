"""Standardisation with the training statistics, and its way back to the data's own units.

``bnn_zoo.fit`` fits a regression on z = (x - x_mean) / x_std and (y - y_mean) / y_std, and a classifier
on standardised inputs: the priors bnn-zoo ships (fan-in, N(0, 1)) and the methods' defaults are scaled
for unit inputs and targets, so a table in its own units (a target of mean 1,000, inputs from 1e-2 to
1e3) would otherwise be a different, badly scaled model. Token ids are never scaled. Predictions are
mapped back by y = y_mean + y_std * y_z, whose Jacobian makes every density in the data's units
p_z(y_z) / prod(y_std). :func:`in_fit_units` is the one place that decides; the command line, sweeps,
protocols and the evidence estimators all go through it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

DATA_UNITS = "data's units"  # what every number of a fit made through bnn_zoo.fit is in
AS_GIVEN = "as given"  # a fit of data the user scaled (standardize=False)


def moments(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means and standard deviations of t; a constant column (or a single row) keeps sd 1."""
    std = t.std(0) if t.shape[0] > 1 else torch.ones(t.shape[1:], dtype=t.dtype)
    return t.mean(0), torch.where(std > 0, std, torch.ones_like(std))


@dataclass
class Scaling:
    """The training statistics a fit standardised with: inputs (x_mean, x_std) and, for a regression,
    targets (y_mean, y_std), one value per column. A classifier's targets are labels: ``y_mean`` and
    ``y_std`` are None and the target maps are the identity."""

    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: torch.Tensor | None = None
    y_std: torch.Tensor | None = None

    @classmethod
    def of(cls, x: torch.Tensor, y: torch.Tensor | None = None) -> Scaling:
        """The statistics of inputs x and, when given, real targets y."""
        return cls(*moments(x), *(moments(y) if y is not None else (None, None)))

    @property
    def scales_targets(self) -> bool:
        return self.y_std is not None

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean.to(x)) / self.x_std.to(x)

    def targets(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.y_std is None else (y - self.y_mean.to(y)) / self.y_std.to(y)

    def unscaled_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self.x_mean.to(x) + self.x_std.to(x) * x

    def unscaled_targets(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.y_std is None else self.y_mean.to(y) + self.y_std.to(y) * y

    def unscaled_variance(self, v: torch.Tensor) -> torch.Tensor:
        return v if self.y_std is None else v * self.y_std.to(v) ** 2

    def value_log_jacobian(self, log_density: torch.Tensor, per_output: bool) -> torch.Tensor:
        """A log density of standardised targets in the data's units: per datum (the Jacobian summed over
        outputs) or, ``per_output``, per target value (..., out)."""
        if self.y_std is None:
            return log_density
        return log_density - self.y_std.to(log_density).log() if per_output else log_density + self.log_jacobian

    @property
    def log_jacobian(self) -> torch.Tensor:
        """log |dy_z / dy| per datum: add it to a log density of standardised targets for the data's units."""
        return torch.zeros(()) if self.y_std is None else -self.y_std.log().sum()

    def state(self) -> dict[str, torch.Tensor | None]:
        return {k: getattr(self, k) for k in ("x_mean", "x_std", "y_mean", "y_std")}

    def to(self, device) -> Scaling:
        return Scaling(**{k: None if v is None else v.to(device) for k, v in self.state().items()})


def takes_token_ids(net) -> bool:
    """Whether a network's inputs are token ids (it has an embedding): never standardised."""
    from bnn_zoo.models.rnn import Embedding

    return any(isinstance(m, torch.nn.Embedding | Embedding) for m in net.modules())


def scaling_for(model, x: torch.Tensor, y: torch.Tensor, standardize: bool = True) -> Scaling | None:
    """The scaling ``bnn_zoo.fit`` fits (x, y) with (validated data): a regression's inputs and targets, a
    classifier's inputs, nothing for token ids or with ``standardize=False``."""
    net = getattr(model, "net", None)  # a GP has none
    if not standardize or model.task == "language-model" or (net is not None and takes_token_ids(net)):
        return None
    return Scaling.of(x, y if model.task == "regression" else None)


def in_fit_units(model, x: torch.Tensor, y: torch.Tensor, scaling: Scaling | None):
    """(model, x, y) as a fit under ``scaling`` sees them: the data standardised, and a fixed noise stated
    in the data's units turned into the standardised targets' (the likelihood's ``in_units``)."""
    if scaling is None:
        return model, x, y
    return fitted_model(model, scaling), scaling.inputs(x), scaling.targets(y)


def fitted_model(model, scaling: Scaling | None):
    """``model`` as fitted under ``scaling``: the same object unless its likelihood states a fixed noise in
    the data's units (a copy whose likelihood divides it by y_std)."""
    likelihood = getattr(model, "likelihood", None)
    if scaling is None or not scaling.scales_targets or likelihood is None or not hasattr(likelihood, "in_units"):
        return model
    converted = likelihood.in_units(scaling.y_std)
    if converted is likelihood:
        return model
    other = copy.copy(model)
    other.likelihood = converted
    return other
