"""The defaults that depend on the network or the data, in one place for the Python API and the command
line: a method's field left None is filled here when it is fitted (``method.resolved(model, n)``), and
the run's ``config.yaml`` records the filled values. docs/guide/defaults.md gives each one's reason."""

from __future__ import annotations

import dataclasses
import math

from bnn_zoo.guides.dropout import default_options
from bnn_zoo.models import Architecture

FULL_BATCH = 1000  # SVI and SG-MCMC: full batch up to this many training rows, minibatches of MINIBATCH above
MINIBATCH = 128


def batch_size(given: int | None, n: int) -> int | None:
    """The minibatch size of a fit on n rows, None for full batch: the one given (full batch if it covers
    the data), else full batch up to FULL_BATCH rows and MINIBATCH above."""
    if given is None:
        return None if n <= FULL_BATCH else MINIBATCH
    return None if given >= n else given


STEPS = 3000  # SVI's and the ensembles' optimisation steps when neither steps nor epochs is given


def optimisation_budget(method, n: int) -> dict:
    """The fields of an optimiser's ``method`` (``batch_size``, ``steps``, ``epochs``) that n training rows
    fill in: the minibatch size by :func:`batch_size`, the steps from epochs or STEPS."""
    size = batch_size(method.batch_size, n)
    filled = {} if size == method.batch_size else {"batch_size": size}
    if method.steps is None:
        steps = STEPS if method.epochs is None else method.epochs * math.ceil(n / (size or n))
        filled |= {"steps": steps, "epochs": None}
    return filled


def chain_length(arch: Architecture) -> int:
    """NUTS's and HMC's warm-up iterations and draws per chain: 500, or 100 where every leapfrog step is a
    pass of a convolutional or recurrent network over all the data."""
    return 500 if arch == "dense" else 100


GUIDE_RULE = "dropout for the recurrent models, mean-field otherwise"  # guide()'s, in words


def guide(arch: Architecture) -> str:
    """SVI's guide when none is given: Gal's dropout on recurrent networks (his variational RNN; mean-field
    on toy-text's LSTMs keeps the prior: 0.66 accuracy, the majority class), mean-field otherwise."""
    return "dropout" if arch == "recurrent" else "mean-field"


HELD_OUT, MIN_HELD_OUT = 0.1, 20  # a tenth of the rows, where that is at least 20 (fewer judge no band)


def held_out_share(n: int) -> float:
    """The share of n rows a method that holds rows out keeps aside when none is given: ``HELD_OUT``
    where that is at least ``MIN_HELD_OUT`` rows, else 0 (a band judged on fewer, or early stopping on
    them, is noise: 20 of 20 inside happens to a calibrated band one time in eight)."""
    return HELD_OUT if round(HELD_OUT * n) >= MIN_HELD_OUT else 0.0


def validation(guide, options: dict, task: str, n: int) -> float:
    """SVI's held-out share of n rows when none is given: :func:`held_out_share` where the dropout guide
    learns p on a regression, 0 otherwise. A learned p falls towards 0 and the network then overfits
    with nothing to stop it: on Friedman #1 its 90% band covered 0.33 of new rows; stopped early on a
    tenth held out, 0.86, and 0.86-0.94 on four UCI tables (benchmarks/results/dropout-validation.json)."""
    if guide != "dropout" or task != "regression":
        return 0.0
    learned = default_options(task, options.get("p"), learn_p=options.get("learn_p"))[2]
    return held_out_share(n) if learned else 0.0


def unset(method, **defaults):
    """``method`` with each of these fields that is None set to its default (the same object if none is)."""
    filled = {k: v for k, v in defaults.items() if getattr(method, k) is None}
    return dataclasses.replace(method, **filled) if filled else method
