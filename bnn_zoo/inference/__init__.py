"""One entry point for inference: ``fit(model, x, y, method)`` with method SVI, NUTS or HMC (a BNN), or
``bnn_zoo.TypeII`` (a ``bnn_zoo.GP``)."""

from bnn_zoo.data.validation import check_data
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.mcmc import HMC, NUTS
from bnn_zoo.inference.svi import SVI

METHODS = {"svi": SVI, "nuts": NUTS, "hmc": HMC}


def fit(model, x, y, method):
    """Fit ``model`` (a :class:`bnn_zoo.BNN`, or a :class:`bnn_zoo.GP` with ``TypeII``) to (x, y) with
    ``method``; returns a :class:`bnn_zoo.Posterior` (a GP: a ``GPPosterior`` with the same interface).

    Inputs are validated first (shapes, NaN/inf, labels), so bad data fails before any training.
    """
    if not hasattr(method, "run"):
        raise BnnZooError(f"method must be bnn_zoo.SVI(...), bnn_zoo.NUTS(...), bnn_zoo.HMC(...) or bnn_zoo.TypeII(...), got {method!r}")
    from bnn_zoo.baselines import GP, TypeII

    if isinstance(model, GP) != isinstance(method, TypeII):
        raise BnnZooError("a bnn_zoo.GP is fitted by bnn_zoo.TypeII(...), and a BNN by SVI, NUTS or HMC")
    x, y = check_data(model, x, y)
    return method.run(model, x, y)


__all__ = ["HMC", "METHODS", "NUTS", "SVI", "fit"]
