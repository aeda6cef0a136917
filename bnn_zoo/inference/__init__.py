"""One entry point for inference: ``fit(model, x, y, method)`` with method SVI, NUTS or HMC."""

from bnn_zoo.data.validation import check_data
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.mcmc import HMC, NUTS
from bnn_zoo.inference.svi import SVI

METHODS = {"svi": SVI, "nuts": NUTS, "hmc": HMC}


def fit(model, x, y, method):
    """Fit ``model`` (a :class:`bnn_zoo.BNN`) to (x, y) with ``method``; returns a :class:`bnn_zoo.Posterior`.

    Inputs are validated first (shapes, NaN/inf, labels), so bad data fails before any training.
    """
    if not hasattr(method, "run"):
        raise BnnZooError(f"method must be bnn_zoo.SVI(...), bnn_zoo.NUTS(...) or bnn_zoo.HMC(...), got {method!r}")
    x, y = check_data(model, x, y)
    return method.run(model, x, y)


__all__ = ["HMC", "METHODS", "NUTS", "SVI", "fit"]
