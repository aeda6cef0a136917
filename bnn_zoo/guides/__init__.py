"""The guide library: variational families chosen by name (``SVI(guide="mean-field")``, ``--guide``).

A guide factory takes the model and initial weight values (the network's own initialisation) plus its
own options, and returns a Pyro guide: a callable with the model's signature whose sample sites are the
model's latent sites. ``fit`` never branches on the guide; new families only register here.
"""

from __future__ import annotations

from bnn_zoo.guides import dropout, flow, matrix_normal, mean_field  # noqa: F401  (they register themselves)
from bnn_zoo.guides.registry import DESCRIPTIONS, GUIDES, build, flag, is_autoguide_class, make, register, source

__all__ = ["DESCRIPTIONS", "GUIDES", "build", "flag", "is_autoguide_class", "make", "register", "source"]
