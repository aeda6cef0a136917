"""One entry point for inference: ``fit(model, x, y, method)`` with any registered method (:mod:`bnn_zoo.methods`):
SVI, NUTS, HMC, ChEES, Laplace, SGMCMC, Ensemble or SWAG (a BNN), ``bnn_zoo.TypeII`` (a ``bnn_zoo.GP``), or your own."""

from collections.abc import Sequence

import numpy as np
import torch

from bnn_zoo import methods
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


@checked
def fit(
    model: BNN | GP,
    x: ArrayLike,
    y: ArrayLike,
    method: methods.InferenceMethod,
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
        model: a :class:`bnn_zoo.BNN` or a :class:`bnn_zoo.GP`.
        x: inputs, (N, features): a tensor, array or nested list.
        y: targets, (N,) or (N, outputs) for regression, class labels (N,) for classifiers.
        method: an instance of a registered method that fits this kind of model (its ``fits`` trait,
            :class:`bnn_zoo.methods.InferenceMethod`): a BNN's ``bnn_zoo.SVI(...)``, ``NUTS``, ``HMC``, ``ChEES``,
            ``Laplace``, ``SGMCMC``, ``Ensemble``, ``SWAG``; a GP's ``bnn_zoo.TypeII(...)``; or your own.
        device: where to fit a BNN: ``"cpu"`` (default: where the model is) or ``"cuda"``; the model is
            copied there with its data, and the posterior lives there.
        standardize: standardise a regression's inputs and targets, a classifier's inputs (False: fit them
            as given, e.g. data already standardised, or a prior chosen for the data's own units). Token ids
            are never scaled.

    Returns:
        A :class:`bnn_zoo.Posterior` (a GP: a ``GPPosterior`` with the same interface).
    """
    _check_method(model, method)
    check_seed(method.seed)
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


def _check_method(model, method) -> None:
    """Refuse a method that is not a registered method's instance, or that takes the other kind of model."""
    if isinstance(method, type):
        raise BnnZooError(
            f"method is the class {method.__name__}; pass an instance, e.g. bnn_zoo.{method.__name__}() with its "
            "settings"
        )
    by_kind = {kind: ", ".join(c.__name__ for c in methods.registered(kind).values()) for kind in ("bnn", "gp")}
    if methods.REGISTRY.get(getattr(method, "name", None)) is not type(method):
        raise BnnZooError(
            f"method must be an instance of a registered inference method ({by_kind['bnn']} for a BNN; "
            f"{by_kind['gp']} for a GP; your own: bnn_zoo.methods.register), got {method!r}"
        )
    if not isinstance(model, (BNN, GP)):
        raise BnnZooError(f"model must be a bnn_zoo.BNN or a bnn_zoo.GP, got {type(model).__name__}")
    kind = "gp" if isinstance(model, GP) else "bnn"
    if method.fits != kind:
        fits = method.fits.upper()
        raise BnnZooError(
            f"a bnn_zoo.{kind.upper()} is fitted by {by_kind[kind]}; {type(method).__name__} fits a {fits}"
        )


__all__ = ["HMC", "NUTS", "SWAG", "ChEES", "Ensemble", "SGMCMC", "SVI", "Laplace", "TypeII", "fit"]
