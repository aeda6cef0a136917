"""The inference-method contract and its registry: what every door (``bnn_zoo.fit``, the experiment layer,
``compare``, the evidence and the command line) asks of a method, by its traits and never by its name.

A method is a class whose instances carry its settings; :func:`register` adds it to the registry under its
``name`` (the name its posteriors and result files carry). Its traits are class attributes
(:class:`InferenceMethod`), so a saved posterior's traits are found from the name it carries
(:func:`traits_of`). A method of your own registers the same way, from a file of its own
(docs/extending.md), and every door then takes it: ``bnn_zoo.fit``, ``bnn-zoo fit --inference file.py:Class``.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from bnn_zoo.errors import BnnZooError


class Family(StrEnum):
    """How a method approximates the posterior, which decides what its draws can be checked by."""

    CHAINS = "chains"  # Markov chains: R-hat and ESS apply
    VARIATIONAL = "variational"  # a fitted guide q(w): the ELBO applies
    GAUSSIAN = "gaussian"  # a point or a Gaussian around it (Laplace, a GP)
    ENSEMBLE = "ensemble"  # independent members, each a point or a Gaussian


@runtime_checkable
class InferenceMethod(Protocol):
    """What ``bnn_zoo.fit`` takes as ``method``.

    Class-level traits:

    - ``name``: the registry key, the name posteriors and result files carry (``posterior.method``).
    - ``family``: a :class:`Family`.
    - ``stores``: what its posterior keeps: ``"draws"`` (samples of the weights), ``"guide"`` (a fitted
      q(w), drawn from on demand) or ``"points"`` (one point estimate per member: too few to importance-sample,
      so no PSIS-LOO).
    - ``evidence``: the metrics.json names of the log-evidence estimates its posteriors carry
      (``posterior.own_evidence``); () for none (AIS estimates anyone's).
    - ``reference``: its draws are exact as its chains converge (full-batch MCMC): it may serve as the
      reference the others are scored against, and its runs get a convergence verdict.
    - ``copies``: the option that counts the weight copies one step evaluates at once (particles, chains,
      members), or None for one; ``draws``: the options (or counts) whose product is the number of draws a fit
      gives, draws per chain or member first.
    - ``fits``: the model it takes, ``"bnn"`` or ``"gp"``.
    - ``remedy`` (optional, chains): what to try when its chains fail their R-hat, ESS or divergence check.
    - ``quick`` (optional): settings under which it fits a table of tens of rows in about a second, which
      the conformance suite (tests/test_conformance.py) runs every registered method with.

    An instance holds the settings, including ``seed``; ``settings()`` is what the posterior records
    (with ``"method": name``), and ``run(model, x, y)`` fits (x, y) as given (``bnn_zoo.fit`` standardises
    first) and returns a :class:`bnn_zoo.PosteriorLike`. ``resolved(model, n)``, where present, gives the
    settings with the defaults that depend on the model and n rows written out.
    """

    name: ClassVar[str]
    family: ClassVar[Family]
    stores: ClassVar[Literal["draws", "guide", "points"]]
    evidence: ClassVar[tuple[str, ...]]
    reference: ClassVar[bool]
    copies: ClassVar[str | None]
    draws: ClassVar[tuple[str | int, ...]]
    fits: ClassVar[Literal["bnn", "gp"]]
    seed: int

    def settings(self) -> dict: ...

    def run(self, model: Any, x: Any, y: Any) -> Any: ...


class Chains:
    """The traits every Markov-chain method of a BNN shares: each chain's draws kept, no evidence of its
    own, ``num_chains`` copies of ``num_samples`` draws."""

    family = Family.CHAINS
    stores = "draws"
    evidence = ()
    copies = "num_chains"
    draws = ("num_samples", "num_chains")
    fits = "bnn"


class FullBatchChains(Chains):
    """The traits HMC's family shares (NUTS, HMC, ChEES): chains on the full data, exact as they converge."""

    reference = True
    remedy = "run longer (num_warmup, num_samples) or more chains; divergences: a tighter prior or target_accept 0.95"


TRAITS = ("name", "family", "stores", "evidence", "reference", "copies", "draws", "fits")
STORES, FITS = ("draws", "guide", "points"), ("bnn", "gp")
REGISTRY: dict[str, type] = {}  # name -> method class


def register(cls: type) -> type:
    """Class decorator: check ``cls`` against :class:`InferenceMethod` and register it under ``cls.name``
    (a later class of the same name replaces the earlier, as when a user's file is read again; bnn-zoo's
    own names are taken)."""
    missing = [t for t in TRAITS if not any(t in vars(c) for c in cls.__mro__[:-1])]  # not object's
    missing += [m for m in ("settings", "run") if not callable(getattr(cls, m, None))]
    if missing:
        raise BnnZooError(
            f"the inference method {cls.__name__} lacks {', '.join(missing)}; see bnn_zoo.methods.InferenceMethod "
            "(docs/extending.md)"
        )
    if cls.family not in tuple(Family) or cls.stores not in STORES or cls.fits not in FITS:
        raise BnnZooError(
            f"the inference method {cls.__name__} has family={cls.family!r}, stores={cls.stores!r}, fits={cls.fits!r}; "
            f"family is one of {', '.join(Family)}, stores one of {', '.join(STORES)}, fits bnn or gp"
        )
    known = REGISTRY.get(cls.name)
    if known is not None and known.__module__.startswith("bnn_zoo.") and known is not cls:
        raise BnnZooError(f"{cls.__name__}'s name {cls.name!r} is bnn-zoo's own {known.__name__}; give yours another")
    REGISTRY[cls.name] = cls
    return cls


def registered(fits: str | None = None) -> dict[str, type]:
    """The registered methods by name (those that take ``fits`` models: "bnn" or "gp")."""
    return {n: c for n, c in REGISTRY.items() if fits is None or c.fits == fits}


class _Unregistered:
    """The traits of a posterior whose method is not registered in this process (a method of a user's own,
    saved, read back without its file): nothing is assumed of its draws."""

    family, stores, evidence, reference, copies, draws, fits = None, "draws", (), False, None, (1,), "bnn"


def traits_of(posterior) -> type:
    """The registered class of the method that made ``posterior`` (anything with ``.method``, its name)."""
    return REGISTRY.get(posterior.method, _Unregistered)


def copies_of(method, traits: type | None = None) -> int:
    """Weight copies a step of ``method`` evaluates at once; ``traits``: its class, where ``method`` is another
    object holding its options (the experiment layer's config)."""
    traits = traits or type(method)
    return (getattr(method, traits.copies) if traits.copies else None) or 1


def draws_of(method, traits: type | None = None, unset: int = 1000) -> int:
    """Posterior draws a fit by ``method`` gives, over every chain or member (``unset`` per chain where its
    option is still unset: its default depends on the model)."""
    traits = traits or type(method)
    counts = [f if isinstance(f, int) else getattr(method, f) for f in traits.draws]
    return math.prod(c or (unset if i == 0 else 1) for i, c in enumerate(counts))
