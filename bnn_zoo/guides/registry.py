"""The guide registry: names (``SVI(guide="mean-field")``, ``--guide``) mapped to guide factories."""

from __future__ import annotations

from collections.abc import Callable

import pyro
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.initialization import init_to_value

from bnn_zoo.errors import BnnZooError
from bnn_zoo.variational import LOCAL_PARAMS

GUIDES: dict[str, Callable] = {}
DESCRIPTIONS: dict[str, str] = {}


def register(name: str, description: str):
    def decorate(factory):
        GUIDES[name] = factory
        DESCRIPTIONS[name] = description
        return factory

    return decorate


def flag(value) -> bool:
    """A boolean guide option from Python or the command line (true/false, 1/0)."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value in (True, False, 0, 1):
        return bool(value)
    raise BnnZooError(f"expected true or false, got {value!r}")


def build(name: str, model, init_values: dict, **options):
    if name not in GUIDES:
        raise BnnZooError(f"unknown guide {name!r}; available guides: {', '.join(sorted(GUIDES))}")
    try:
        return GUIDES[name](model, init_values, **options)
    except TypeError as exc:
        raise BnnZooError(f"bad options for guide {name!r}: {exc}") from None


def is_autoguide_class(guide) -> bool:
    return isinstance(guide, type) and issubclass(guide, AutoGuide)


def make(guide: str | type | Callable, model, init_values: dict, options: dict | None = None):
    """The guide to fit from what a user gave: a registered name (built by its factory), a Pyro
    ``AutoGuide`` class (built on the model, started at ``init_values``, parameters local to the
    module) or a guide instance or callable (returned as it is)."""
    options = options or {}
    check_options(guide, options)
    if isinstance(guide, str):
        return build(guide, model, init_values, **options)
    if is_autoguide_class(guide):
        with pyro.settings.context(**LOCAL_PARAMS):
            return guide(model, init_loc_fn=init_to_value(values=init_values), **options)
    return guide


def check_options(guide, options: dict) -> None:
    """Options go to guides bnn-zoo builds; a guide instance or function was configured when it was made."""
    if options and source(guide) == "user":
        raise BnnZooError(
            "guide_options apply to a guide built by bnn-zoo (a registered name or an AutoGuide class); configure a "
            "guide instance when you create it"
        )


def source(guide) -> str:
    """How a guide was given: ``registry``, ``class`` (an AutoGuide class) or ``user`` (an instance or function)."""
    return "registry" if isinstance(guide, str) else "class" if is_autoguide_class(guide) else "user"
