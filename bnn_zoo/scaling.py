"""Standardisation with the training statistics, and its way back to the data's own units.

A regression is fitted on z = (x - x_mean) / x_std and (y - y_mean) / y_std: the priors bnn-zoo ships
(fan-in, N(0, 1)) and the methods' defaults are scaled for unit inputs and targets, so a table in its
own units (a target of mean 1,000, inputs from 1e-2 to 1e3) would otherwise be a different, badly
scaled model. Predictions are mapped back by y = y_mean + y_std * y_z, whose Jacobian makes every
density in the data's units p_z(y_z) / prod(y_std).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def moments(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Column means and standard deviations of t; a constant column (or a single row) keeps sd 1."""
    std = t.std(0) if t.shape[0] > 1 else torch.ones(t.shape[1:], dtype=t.dtype)
    return t.mean(0), torch.where(std > 0, std, torch.ones_like(std))


@dataclass
class Scaling:
    """The training statistics a fit standardised with: inputs (x_mean, x_std) and targets (y_mean, y_std),
    one value per column."""

    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: torch.Tensor
    y_std: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor, y: torch.Tensor) -> Scaling:
        return cls(*moments(x), *moments(y))

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.x_mean.to(x)) / self.x_std.to(x)

    def targets(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.y_mean.to(y)) / self.y_std.to(y)

    def unscaled_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self.x_mean.to(x) + self.x_std.to(x) * x

    def unscaled_targets(self, y: torch.Tensor) -> torch.Tensor:
        return self.y_mean.to(y) + self.y_std.to(y) * y

    @property
    def log_jacobian(self) -> torch.Tensor:
        """log |dy_z / dy| per datum: add it to a log density of standardised targets for the data's units."""
        return -self.y_std.log().sum()

    def state(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k) for k in ("x_mean", "x_std", "y_mean", "y_std")}

    def to(self, device) -> Scaling:
        return Scaling(**{k: v.to(device) for k, v in self.state().items()})
