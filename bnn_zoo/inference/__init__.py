"""One entry point for inference: ``fit(model, x, y, method)`` with method SVI, NUTS, HMC, ChEES, Laplace, SGMCMC,
Ensemble or SWAG (a BNN), or ``bnn_zoo.TypeII`` (a ``bnn_zoo.GP``)."""

from collections.abc import Sequence

import numpy as np
import torch

from bnn_zoo.baselines import GP, GPPosterior, TypeII
from bnn_zoo.bnn import BNN
from bnn_zoo.data.validation import check_data
from bnn_zoo.errors import BnnZooError, check_device, check_seed, checked
from bnn_zoo.inference import health, lockstep
from bnn_zoo.inference.chees import ChEES
from bnn_zoo.inference.ensemble import SWAG, Ensemble
from bnn_zoo.inference.laplace import Laplace
from bnn_zoo.inference.mcmc import HMC, NUTS
from bnn_zoo.inference.sgmcmc import SGMCMC
from bnn_zoo.inference.svi import SVI
from bnn_zoo.posterior import Posterior
from bnn_zoo.protocols import HoldsOut
from bnn_zoo.scaling import in_fit_units, scaling_for

ArrayLike = torch.Tensor | np.ndarray | Sequence

METHODS = {
    "svi": SVI,
    "nuts": NUTS,
    "hmc": HMC,
    "chees": ChEES,
    "laplace": Laplace,
    "sgmcmc": SGMCMC,
    "ensemble": Ensemble,
    "swag": SWAG,
}


@checked
def fit(
    model: BNN | GP,
    x: ArrayLike,
    y: ArrayLike,
    method: SVI | NUTS | HMC | ChEES | Laplace | SGMCMC | Ensemble | SWAG | TypeII,
    device: str | torch.device | None = None,
    standardize: bool = True,
) -> Posterior | GPPosterior:
    """Fit ``model`` to (x, y) with ``method``.

    Inputs are validated first (shapes, NaN/inf, labels), so bad data fails before any training. A
    regression is fitted on inputs and targets standardised with their own means and sds
    (:mod:`bnn_zoo.scaling`: the shipped priors and defaults assume unit scales; the command line fits
    through here too), and the posterior takes and gives the data's units: predictions, log-likelihoods,
    ELBO and evidence, the InferenceData's function-space groups; only the weights (``posterior`` group)
    act on the standardised data (``posterior.scaling``).
    A classifier's inputs are standardised the same way (token ids never are). A fixed Gaussian noise is
    stated in the data's units (:meth:`bnn_zoo.likelihoods.Gaussian.in_units`); the prior acts on the
    weights of the network of standardised data. A fit that fails its own diagnostics
    (:mod:`bnn_zoo.inference.health`: collapse, R-hat, ESS, divergences, a band its validation rows
    find over- or under-confident) warns in one line and keeps the sentence in ``posterior.info``.

    Args:
        model: a :class:`bnn_zoo.BNN`, fitted by SVI, NUTS, HMC, ChEES, Laplace, SGMCMC, Ensemble or SWAG; or a
            :class:`bnn_zoo.GP`, fitted by TypeII.
        x: inputs, (N, features): a tensor, array or nested list.
        y: targets, (N,) or (N, outputs) for regression, class labels (N,) for classifiers.
        method: ``bnn_zoo.SVI(...)``, ``bnn_zoo.NUTS(...)``, ``bnn_zoo.HMC(...)``, ``bnn_zoo.ChEES(...)``,
            ``bnn_zoo.Laplace(...)``, ``bnn_zoo.SGMCMC(...)``,
            ``bnn_zoo.Ensemble(...)``, ``bnn_zoo.SWAG(...)`` or ``bnn_zoo.TypeII(...)``.
        device: where to fit a BNN: ``"cpu"`` (default: where the model is) or ``"cuda"``; the model is
            copied there with its data, and the posterior lives there.
        standardize: standardise a regression's inputs and targets, a classifier's inputs (False: fit them
            as given, e.g. data already standardised, or a prior chosen for the data's own units). Token ids
            are never scaled.

    Returns:
        A :class:`bnn_zoo.Posterior` (a GP: a ``GPPosterior`` with the same interface).
    """
    if isinstance(method, type):
        raise BnnZooError(
            f"method is the class {method.__name__}; pass an instance, e.g. bnn_zoo.{method.__name__}() with its "
            "settings"
        )
    if not isinstance(method, (*METHODS.values(), TypeII)):
        raise BnnZooError(
            f"method must be bnn_zoo.SVI(...), NUTS, HMC, ChEES, Laplace, SGMCMC, Ensemble, SWAG or TypeII (a GP), got "
            f"{method!r}"
        )
    if not isinstance(model, (BNN, GP)):
        raise BnnZooError(f"model must be a bnn_zoo.BNN or a bnn_zoo.GP, got {type(model).__name__}")
    if isinstance(model, GP) != isinstance(method, TypeII):
        raise BnnZooError(
            "a bnn_zoo.GP is fitted by bnn_zoo.TypeII(...), and a BNN by SVI, NUTS, HMC, ChEES, Laplace, SGMCMC, "
            "Ensemble or SWAG"
        )
    check_seed(getattr(method, "seed", 0))
    x, y = check_data(model, x, y)
    if device is not None:
        if isinstance(model, GP):
            raise BnnZooError("the GP baseline fits on the CPU (exact Cholesky in float64); drop device=")
        model = model.to(check_device(device))
        x, y = x.to(model.device), y.to(model.device)
    if isinstance(method, SVI) and method.lockstep:
        job = lockstep.Job(model, x, y, method, standardize)
        return lockstep.fit_lockstep([job], device=model.device)[0]  # it checks its fits itself
    scaling = scaling_for(model, x, y, standardize)
    posterior = method.run(*in_fit_units(model, x, y, scaling)).fitted_in(scaling)
    held_out = method.resolved(model, len(x)).split(x, y)[1] if isinstance(method, HoldsOut) else None
    health.check(posterior, held_out)
    return posterior


__all__ = ["HMC", "METHODS", "NUTS", "SWAG", "ChEES", "Ensemble", "SGMCMC", "SVI", "Laplace", "fit"]
