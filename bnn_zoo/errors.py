"""The one exception bnn-zoo raises for bad input: its message says what is wrong and how to fix it."""

import math


class BnnZooError(ValueError):
    """Bad input caught at the boundary, before any training starts."""


def positive(what: str, value, integer: bool = False, least: float = 0):
    """``value`` if it is a finite number above ``least`` (a whole number if ``integer``, at least 1 unless
    ``least`` says otherwise), or one BnnZooError naming ``what`` and the value that was given."""
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = number and float(value).is_integer() and value >= max(least, 1)
        if not ok:
            raise BnnZooError(f"{what} must be a whole number >= {max(least, 1):g}, got {value!r}")
    elif not (number and value > least):
        raise BnnZooError(f"{what} must be a finite number > {least:g}, got {value!r}")
    return int(value) if integer else value


def check_seed(seed) -> int:
    """A random seed as NumPy, torch and Pyro all accept it."""
    if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32):
        raise BnnZooError(f"seed must be a whole number in 0..4294967295 (2**32 - 1), got {seed!r}")
    return seed


def check_device(device) -> "torch.device":  # noqa: F821 (torch is imported when called: errors stays import-light)
    """The torch device named, or one clear error: unknown, not cpu or cuda, or cuda without a GPU."""
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise BnnZooError(f"unknown device {device!r}; use 'cpu' or 'cuda' (or 'cuda:N')") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BnnZooError("device='cuda' was asked for, but this torch sees no CUDA device (torch.cuda.is_available() is False); use 'cpu'")
    if device.type not in ("cpu", "cuda"):
        raise BnnZooError(f"bnn-zoo fits on 'cpu' or 'cuda', not {device.type!r}")
    return device
