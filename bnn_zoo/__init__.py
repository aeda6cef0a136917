"""bnn-zoo: Bayesian neural networks on Pyro, fitted by any guide or by NUTS/HMC, inspected in ArviZ.

Importing bnn-zoo changes no global state: Pyro settings are scoped to bnn-zoo's own guides and fits,
and matplotlib's backend is left to matplotlib.
"""

import warnings

with warnings.catch_warnings():  # ArviZ 0.2x announces its 1.0 refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz  # noqa: F401

from bnn_zoo import baselines, guides, likelihoods, models, priors  # noqa: E402
from bnn_zoo.baselines import GP, TypeII  # noqa: E402
from bnn_zoo.bnn import BNN  # noqa: E402
from bnn_zoo.errors import BnnZooError  # noqa: E402
from bnn_zoo.evaluation import evidence  # noqa: E402
from bnn_zoo.evaluation.compare import compare  # noqa: E402
from bnn_zoo.inference import HMC, NUTS, SGMCMC, SVI, Laplace, fit  # noqa: E402
from bnn_zoo.posterior import Posterior, PosteriorLike, Prediction  # noqa: E402
from bnn_zoo.protocols import Network  # noqa: E402
from bnn_zoo.saving import load  # noqa: E402
from bnn_zoo.version import __version__  # noqa: E402,F401  (the package version)

__all__ = [
    "BNN",
    "GP",
    "HMC",
    "NUTS",
    "SVI",
    "SGMCMC",
    "BnnZooError",
    "Laplace",
    "Network",
    "Posterior",
    "PosteriorLike",
    "Prediction",
    "TypeII",
    "baselines",
    "compare",
    "evidence",
    "fit",
    "guides",
    "likelihoods",
    "load",
    "models",
    "priors",
]
