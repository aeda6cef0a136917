"""bnn-zoo: Bayesian neural networks on Pyro, fitted by any guide or by NUTS/HMC, inspected in ArviZ."""

import warnings

import pyro

with warnings.catch_warnings():  # ArviZ 0.2x announces its 1.0 refactor on import
    warnings.simplefilter("ignore", FutureWarning)
    import arviz  # noqa: F401

# Each guide keeps its own parameters instead of Pyro's global param store, so several fits (guides
# with the same site names) live side by side in one process and a guide's state_dict is complete.
pyro.settings.set(module_local_params=True)

__version__ = "0.1.0"

from bnn_zoo import baselines, guides, likelihoods, models, priors  # noqa: E402
from bnn_zoo.baselines import GP, TypeII  # noqa: E402
from bnn_zoo.bnn import BNN  # noqa: E402
from bnn_zoo.errors import BnnZooError  # noqa: E402
from bnn_zoo.evaluation import evidence  # noqa: E402
from bnn_zoo.evaluation.compare import compare  # noqa: E402
from bnn_zoo.inference import HMC, NUTS, SVI, fit  # noqa: E402
from bnn_zoo.posterior import Posterior, Prediction  # noqa: E402

__all__ = ["BNN", "GP", "HMC", "NUTS", "SVI", "BnnZooError", "Posterior", "Prediction", "TypeII", "baselines", "compare", "evidence", "fit", "guides",
           "likelihoods", "models", "priors"]
