"""Checks at the boundary: inputs and targets are turned into tensors and validated before any training."""

from __future__ import annotations

import numpy as np
import torch

from bnn_zoo.errors import BnnZooError
from bnn_zoo.protocols import DeclaresWidths


def as_tensor(name: str, value) -> torch.Tensor:
    """Convert an array-like to a tensor, rejecting non-numeric data and NaN/inf with the first bad row."""
    if not isinstance(value, torch.Tensor):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise BnnZooError(f"{name} could not be read as a numeric array ({exc}); pass a tensor or numpy array") from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise BnnZooError(f"{name} has non-numeric dtype {arr.dtype}; convert it to numbers first")
        value = torch.as_tensor(arr)
    if value.is_complex():
        raise BnnZooError(f"{name} is complex; pass real numbers")
    if value.dim() == 0 or value.shape[0] == 0:
        raise BnnZooError(f"{name} is empty (shape {tuple(value.shape)}); pass at least one data point")
    if torch.is_floating_point(value):
        bad = ~torch.isfinite(value)
        if bad.any():
            row = int(bad.reshape(value.shape[0], -1).any(-1).nonzero()[0])
            raise BnnZooError(f"{name} contains NaN or inf ({int(bad.sum())} value(s), first in row {row}); drop or impute those rows")
    return value


def check_inputs(model, x) -> torch.Tensor:
    """x as a float tensor of shape (N, in_features) that the network accepts."""
    x = as_tensor("x", x).to(torch.get_default_dtype())
    expected = model.in_features
    if x.dim() != 2:
        hint = f"(N, {expected})" if expected else "(N, features)"
        raise BnnZooError(f"x has shape {tuple(x.shape)}; expected {hint}; reshape it, e.g. x.reshape(len(x), -1)")
    if expected is not None and x.shape[1] != expected:
        raise BnnZooError(f"x has {x.shape[1]} feature(s) but the network expects {expected}; check the data or the model's in_features")
    return x


def output_width(model, x: torch.Tensor) -> int:
    """The network's number of outputs: declared (``net.out_features``) or read off one forward pass."""
    if isinstance(getattr(model, "net", None), DeclaresWidths):  # a BNN whose network declares its widths
        return model.net.out_features
    if isinstance(getattr(model, "out_features", None), int):  # a GP declares its outputs
        return model.out_features
    try:
        with torch.no_grad():
            return model.forward(model.params, x[:1]).shape[-1]
    except RuntimeError as exc:
        raise BnnZooError(f"the network cannot take x of shape {tuple(x.shape)} ({str(exc).splitlines()[0]}); check the number of features") from None


def check_data(model, x, y) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated (x, y): matching lengths, finite values, targets in the likelihood's canonical form."""
    x = check_inputs(model, x)
    y = as_tensor("y", y)
    if y.shape[0] != x.shape[0]:
        raise BnnZooError(f"x has {x.shape[0]} rows but y has {y.shape[0]}; pass one target per input row")
    return x, model.likelihood.check_targets(y, output_width(model, x))
