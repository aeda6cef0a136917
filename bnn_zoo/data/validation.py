"""Checks at the boundary: inputs and targets are turned into tensors and validated before any training."""

from __future__ import annotations

import numpy as np
import torch

from bnn_zoo.errors import BnnZooError, first_line
from bnn_zoo.protocols import DeclaresWidths


def as_tensor(name: str, value) -> torch.Tensor:
    """Convert an array-like to a tensor, rejecting non-numeric data and NaN/inf with the first bad row."""
    if not isinstance(value, torch.Tensor):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise BnnZooError(
                f"{name} could not be read as a numeric array ({exc}); pass a tensor or numpy array"
            ) from None
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise BnnZooError(f"{name} has non-numeric dtype {arr.dtype}; convert it to numbers first")
        value = torch.as_tensor(arr)
    if value.is_complex():
        raise BnnZooError(f"{name} is complex; pass real numbers")
    if value.dim() == 0 or value.shape[0] == 0:
        raise BnnZooError(f"{name} is empty (shape {tuple(value.shape)}); pass at least one data point")
    if value.numel() == 0:
        raise BnnZooError(f"{name} has shape {tuple(value.shape)}: its rows hold no values; pass at least one feature")
    if torch.is_floating_point(value):
        bad = ~torch.isfinite(value)
        if bad.any():
            row = int(bad.reshape(value.shape[0], -1).any(-1).nonzero()[0])
            raise BnnZooError(
                f"{name} contains NaN or inf ({int(bad.sum())} value(s), first in row {row}); drop or impute those rows"
            )
        # beyond it, squares (variances, Gaussian log densities) overflow
        limit = torch.finfo(value.dtype).max ** 0.5 / 10
        if value.abs().max() > limit:
            row = int((value.abs() > limit).reshape(value.shape[0], -1).any(-1).nonzero()[0])
            raise BnnZooError(
                f"{name} holds values up to {float(value.abs().max()):.3g} (first in row {row}), beyond {limit:.1g} "
                f"where {value.dtype} arithmetic overflows; rescale those columns"
            )
    return value


def check_inputs(model, x) -> torch.Tensor:
    """x as a float tensor of shape (N, in_features) that the network accepts."""
    x = as_tensor("x", x)
    if x.dtype == torch.bool:
        raise BnnZooError(
            "x is boolean; pass numbers (x.float() for 0/1 features), so that the encoding is your choice"
        )
    x = x.to(torch.get_default_dtype())
    expected = model.in_features
    if x.dim() != 2:
        hint = f"(N, {expected})" if expected else "(N, features)"
        raise BnnZooError(f"x has shape {tuple(x.shape)}; expected {hint}; reshape it, e.g. x.reshape(len(x), -1)")
    if expected is not None and x.shape[1] != expected:
        raise BnnZooError(
            f"x has {x.shape[1]} feature(s) but the network expects {expected}; check the data or the model's "
            "in_features"
        )
    return x


def output_width(model, x: torch.Tensor) -> int:
    """The network's number of outputs: declared (``net.out_features``) or read off one forward pass,
    which must give finite numbers on the first rows of x at the network's initial weights."""
    if isinstance(getattr(model, "out_features", None), int):  # a GP declares its outputs
        return model.out_features
    rows, net = x[:2], type(getattr(model, "net", model))
    try:
        with torch.no_grad():
            out = model.forward(model.params, rows)
    except RuntimeError as exc:
        raise BnnZooError(
            f"the network cannot take x of shape {tuple(x.shape)} ({first_line(exc)}); check the number of features"
        ) from None
    except Exception as exc:  # a user's network raising its own error: show it as theirs
        raise BnnZooError(
            f"the network {net.__module__}.{net.__qualname__} fails on the first 2 rows of x: {type(exc).__name__}: "
            f"{first_line(exc)}"
        ) from None
    if not torch.isfinite(out).all():
        raise BnnZooError(
            f"your network {net.__module__}.{net.__qualname__} returns {_nonfinite(out)} for the first "
            f"{rows.shape[0]} rows of x at its initial weights; check its forward (a fit would only learn NaN)"
        )
    declared = model.net.out_features if isinstance(getattr(model, "net", None), DeclaresWidths) else None
    dims = 3 if model.likelihood.task == "language-model" else 2  # (N, T, vocabulary) or (N, outputs)
    if out.dim() != dims or out.shape[0] != rows.shape[0] or out.shape[-1] != (declared or out.shape[-1]):
        n, width = rows.shape[0], declared or "out_features"
        expected = f"({n}, T, {width})" if dims == 3 else f"({n}, {width})"
        raise BnnZooError(
            f"the network {net.__module__}.{net.__qualname__} returns shape {tuple(out.shape)} for {n} input rows; "
            f"it must return {expected}, e.g. out.reshape(len(x), -1) (a likelihood would broadcast any other shape "
            "silently)"
        )
    return out.shape[-1]


def _nonfinite(out: torch.Tensor) -> str:
    kinds = [k for k, bad in (("NaN", out.isnan()), ("inf", out.isinf())) if bad.any()]
    return f"{' and '.join(kinds)} in {int((~torch.isfinite(out)).sum())} of its {out.numel()} outputs"


def check_data(model, x, y) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated (x, y): matching lengths, finite values, targets in the likelihood's canonical form."""
    x = check_inputs(model, x)
    y = as_tensor("y", y)
    if y.dtype == torch.bool and model.likelihood.task == "regression":
        raise BnnZooError(
            "y is boolean but the likelihood is for regression; use likelihoods.Bernoulli() for two classes, or pass "
            "y.float()"
        )
    if y.shape[0] != x.shape[0]:
        raise BnnZooError(f"x has {x.shape[0]} rows but y has {y.shape[0]}; pass one target per input row")
    if torch.is_floating_point(y):  # NumPy's float64 targets: in the network's precision, as x is
        y = y.to(x.dtype)
    return x, model.likelihood.check_targets(y, output_width(model, x))
