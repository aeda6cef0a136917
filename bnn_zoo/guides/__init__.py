"""The guide library: variational families chosen by name (``SVI(guide="mean-field")``, ``--guide``).

A guide factory takes the model and initial weight values (the network's own initialisation) plus its
own options, and returns a Pyro guide: a callable with the model's signature whose sample sites are the
model's latent sites. ``fit`` never branches on the guide; new families only register here.
"""

from __future__ import annotations

from collections.abc import Callable

from bnn_zoo.errors import BnnZooError

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


from bnn_zoo.guides import dropout, flow, matrix_normal, mean_field  # noqa: E402,F401  (they register themselves)

__all__ = ["GUIDES", "build", "register"]
