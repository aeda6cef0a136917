"""Priors over network weights: one distribution per parameter, event shape = parameter shape.

Gal's thesis (ch. 3, eq. 3.11) writes the weight prior as p(w) = N(0, l^{-2} I), with l the prior
length-scale; :class:`Normal` with ``scale = 1 / l`` is that prior.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch


class Prior:
    """Maps a parameter (its name and its tensor) to the prior distribution of its sample site."""

    def __call__(self, name: str, param: torch.Tensor) -> dist.Distribution:
        loc = torch.zeros_like(param)
        return dist.Normal(loc, self.scale_of(name, param)).to_event(param.dim())

    def scale_of(self, name: str, param: torch.Tensor) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        return repr(self)


class Normal(Prior):
    """Isotropic Normal N(0, scale^2) on every weight, with optional per-layer scales.

    ``layer_scales`` maps a parameter-name prefix (``"layers.0"`` or ``"layers.0.bias"``) to its scale;
    the longest matching prefix wins. Gal's length-scale l corresponds to ``scale = 1 / l``.
    """

    def __init__(self, scale: float = 1.0, layer_scales: dict[str, float] | None = None):
        scales = [scale, *(layer_scales or {}).values()]
        if not all(math.isfinite(s) and s > 0 for s in scales):
            raise ValueError(f"prior scales must be positive and finite, got {scales}")
        self.scale = float(scale)
        self.layer_scales = dict(layer_scales or {})

    @classmethod
    def from_length_scale(cls, length_scale: float) -> Normal:
        """Gal's prior p(w) = N(0, l^{-2} I) (thesis eq. 3.11)."""
        return cls(scale=1.0 / length_scale)

    def scale_of(self, name: str, param: torch.Tensor) -> float:
        matches = [p for p in self.layer_scales if name == p or name.startswith(p + ".")]
        return self.layer_scales[max(matches, key=len)] if matches else self.scale

    def __repr__(self) -> str:
        extra = f", layer_scales={self.layer_scales}" if self.layer_scales else ""
        return f"Normal(scale={self.scale}{extra})"


class FanInNormal(Prior):
    """Weights ~ N(0, gain^2 / fan_in), biases ~ N(0, bias_scale^2) (Neal's infinite-width scaling).

    fan_in is the number of inputs of a unit: the product of all but the first weight dimension, so
    the prior variance of each pre-activation stays O(1) whatever the layer width.
    """

    def __init__(self, gain: float = 1.0, bias_scale: float = 1.0):
        if not (gain > 0 and bias_scale > 0):
            raise ValueError(f"gain and bias_scale must be positive, got {gain}, {bias_scale}")
        self.gain = float(gain)
        self.bias_scale = float(bias_scale)

    def scale_of(self, name: str, param: torch.Tensor) -> float:
        if param.dim() < 2:
            return self.bias_scale
        return self.gain / math.sqrt(param[0].numel())

    def __repr__(self) -> str:
        return f"FanInNormal(gain={self.gain}, bias_scale={self.bias_scale})"
