"""bnn-zoo: Bayesian neural networks on Pyro, fitted by any guide or by NUTS/HMC, inspected in ArviZ.

Importing bnn-zoo changes no global state: Pyro settings are scoped to bnn-zoo's own guides and fits,
and matplotlib's backend is left to matplotlib.

The public names below are imported on first use (PEP 562), so ``import bnn_zoo`` and the command
line's ``--help`` do not pay for torch, Pyro and ArviZ until something needs them.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from bnn_zoo.version import __version__  # noqa: F401  (the package version)

if TYPE_CHECKING:  # what the lazy names resolve to, for type checkers and the API docs
    from bnn_zoo import baselines, guides, likelihoods, models, priors
    from bnn_zoo.baselines import GP, TypeII
    from bnn_zoo.bnn import BNN
    from bnn_zoo.errors import BnnZooError
    from bnn_zoo.evaluation import evidence
    from bnn_zoo.evaluation.compare import compare
    from bnn_zoo.inference import HMC, NUTS, SGMCMC, SVI, SWAG, ChEES, Ensemble, Laplace, fit
    from bnn_zoo.memory import keep_freed_memory
    from bnn_zoo.posterior import Posterior, PosteriorLike, Prediction
    from bnn_zoo.protocols import Network
    from bnn_zoo.saving import load

# public name -> the module that defines it; bnn_zoo's subpackages (models, priors, data, ...) load
# on first use as well, by name
_HOMES = {
    "BNN": "bnn_zoo.bnn",
    "GP": "bnn_zoo.baselines",
    "TypeII": "bnn_zoo.baselines",
    "HMC": "bnn_zoo.inference",
    "ChEES": "bnn_zoo.inference",
    "NUTS": "bnn_zoo.inference",
    "SVI": "bnn_zoo.inference",
    "SGMCMC": "bnn_zoo.inference",
    "Laplace": "bnn_zoo.inference",
    "Ensemble": "bnn_zoo.inference",
    "SWAG": "bnn_zoo.inference",
    "fit": "bnn_zoo.inference",
    "BnnZooError": "bnn_zoo.errors",
    "Network": "bnn_zoo.protocols",
    "Posterior": "bnn_zoo.posterior",
    "PosteriorLike": "bnn_zoo.posterior",
    "Prediction": "bnn_zoo.posterior",
    "compare": "bnn_zoo.evaluation.compare",
    "evidence": "bnn_zoo.evaluation",
    "load": "bnn_zoo.saving",
    "keep_freed_memory": "bnn_zoo.memory",
}
_SUBPACKAGES = ("baselines", "guides", "likelihoods", "models", "priors")  # public, loaded on first use
__all__ = sorted([*_HOMES, *_SUBPACKAGES])


def __getattr__(name: str):
    if name in _HOMES:
        home = importlib.import_module(_HOMES[name])
        # a submodule (evidence) is an attribute of its package only once something has imported it
        value = getattr(home, name) if hasattr(home, name) else importlib.import_module(f"{_HOMES[name]}.{name}")
    elif importlib.util.find_spec(f"bnn_zoo.{name}") is not None:
        value = importlib.import_module(f"bnn_zoo.{name}")
    else:
        raise AttributeError(f"module 'bnn_zoo' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
