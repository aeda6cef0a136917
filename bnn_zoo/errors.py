"""The one exception bnn-zoo raises for bad input: its message says what is wrong and how to fix it."""

import math
import types
import typing


class BnnZooError(ValueError):
    """Bad input caught at the boundary, before any training starts."""


class ResourceError(BnnZooError):
    """A run that needs more of the machine (memory) than it has: every run like it fails the same way."""


def first_line(exc: BaseException) -> str:
    """An exception's message on one line (the first), for errors that quote another library's."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


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
        raise BnnZooError(
            "device='cuda' was asked for, but this torch sees no CUDA device (torch.cuda.is_available() is False); use "
            "'cpu'"
        )
    if device.type not in ("cpu", "cuda"):
        raise BnnZooError(f"bnn-zoo fits on 'cpu' or 'cuda', not {device.type!r}")
    return device


PLAIN = {
    int: "a whole number",
    float: "a number",
    bool: "True or False",
    str: "text",
    dict: "a dict",
    list: "a list",
    tuple: "a tuple",
}


def check_field_types(settings) -> None:
    """Refuse a dataclass's field whose value is not of its annotated plain type (int, float, bool, str,
    dict, list, tuple, or None where allowed): ``lr="0.01"`` or ``steps=True`` fail here, with the
    field's name, not deep inside training. An int passes for a float; a bool never passes for a number."""
    hints = typing.get_type_hints(type(settings))
    for name in settings.__dataclass_fields__:
        kinds = _plain_kinds(hints[name])
        value = getattr(settings, name)
        if kinds is None or _is_kind(value, kinds):
            continue
        wanted = " or ".join(PLAIN[k] if k in PLAIN else "None" for k in kinds)
        raise BnnZooError(f"{type(settings).__name__} {name} must be {wanted}, got {value!r} ({type(value).__name__})")


def _plain_kinds(hint) -> tuple | None:
    """The plain types a hint allows, or None where it allows something else (a class, a callable)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = tuple(typing.get_origin(a) or a for a in args)
    return kinds if all(k in PLAIN or k is type(None) for k in kinds) else None


def _is_kind(value, kinds: tuple) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)
