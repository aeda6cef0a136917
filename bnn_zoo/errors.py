"""The one exception bnn-zoo raises for bad input: its message says what is wrong and how to fix it."""

import functools
import inspect
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
    dict, list, tuple, or None where allowed) or not one of its Literal's values: ``lr="0.01"``,
    ``steps=True`` or ``objective="ELBO"`` fail here, with the field's name, not deep inside training. An
    int passes for a float; a bool never passes for a number."""
    hints = typing.get_type_hints(type(settings))
    for name in settings.__dataclass_fields__:
        check_value(f"{type(settings).__name__} {name}", getattr(settings, name), hints[name])


def checked(fn):
    """Decorate a public function (or ``__init__``) so that its arguments annotated as a boolean or a
    Literal are checked as :func:`check_field_types` checks a dataclass's fields, before it runs: a
    boolean or a choice is never coerced from another value (``standardize="no"``)."""
    signature = inspect.signature(fn)
    owner = fn.__qualname__.removesuffix(".__init__")

    @functools.wraps(fn)
    def checking(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # Python's own error for a missing or unknown argument
        hints = _resolved_hints(fn)
        for name, value in bound.arguments.items():
            if name in hints:
                check_value(f"{owner} {name}", value, hints[name])
        return fn(*args, **kwargs)

    return checking


@functools.cache
def _resolved_hints(fn) -> dict:
    """fn's annotations that allow a boolean or a Literal's values (a function's other plain types, e.g.
    a list where a tuple would serve, are left to it); one naming a type-checking-only import is skipped."""
    hints = {}
    for name, hint in fn.__annotations__.items():
        try:
            hints[name] = eval(hint, fn.__globals__) if isinstance(hint, str) else hint  # as get_type_hints does
        except NameError:
            continue
    return {n: h for n, h in hints.items() if any(k is bool or isinstance(k, tuple) for k in _allowed(h) or ())}


def check_value(where: str, value, hint) -> None:
    """Refuse ``value`` unless it is of one of ``hint``'s plain types or a value of its Literal; a hint
    allowing anything else (a class, a path, a callable) is not checked here."""
    allowed = _allowed(hint)
    if allowed is None or any(_fits(value, kind) for kind in allowed):
        return
    raise BnnZooError(
        f"{where} must be {' or '.join(_wanted(k) for k in allowed)}, got {value!r} ({type(value).__name__})"
    )


def _allowed(hint) -> tuple | None:
    """The plain types, None and Literal value tuples a hint allows, or None where it allows more."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = []
    for a in args:
        if typing.get_origin(a) is typing.Literal:
            kinds.append(typing.get_args(a))
        elif (typing.get_origin(a) or a) in PLAIN or a is type(None):
            kinds.append(typing.get_origin(a) or a)
        else:
            return None
    return tuple(kinds)


def _fits(value, kind) -> bool:
    if isinstance(kind, tuple):  # a Literal's values: equal, and of the same type (True is not 1)
        return any(value == v and type(value) is type(v) for v in kind)
    if isinstance(value, bool):
        return kind is bool
    if isinstance(value, int) and kind is float:
        return True
    return isinstance(value, kind)


def _wanted(kind) -> str:
    if isinstance(kind, tuple):
        return "one of " + ", ".join(repr(v) for v in kind)
    return PLAIN.get(kind, "None")
