"""Guides as objects: the Pyro settings a guide runs under, its parameters, its joint draws and the
importance weights log p(y, w | x) - log q(w).

These sit in the core layer because the Posterior, the evidence estimators and SVI all need them.
A guide is anything Pyro accepts as one: a bnn-zoo guide, a ``pyro.infer.autoguide`` instance or
any callable with the model's signature whose sample sites are the model's latent sites.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions import constraints
from pyro.infer import Predictive
from pyro.infer.importance import vectorized_importance_weights
from pyro.nn import PyroModule
from torch.distributions import Distribution, Transform, transform_to

from bnn_zoo.protocols import SiteDistributions

LOCAL_PARAMS = {"module_local_params": True}


class LocalParamModule(PyroModule):
    """A PyroModule whose parameters live in the module, never in Pyro's global parameter store.

    bnn-zoo's guides use this so that several fits (guides with the same site names) live side by
    side in one process and a guide's ``state_dict`` is complete, without flipping the global
    ``pyro.settings`` for the user's other Pyro models: the setting is scoped to construction, to every
    call and to every attribute read. Containers and sub-modules of a guide must be LocalParamModules
    too: a plain PyroModule read outside that scope resolves its parameters by name in the global
    store, where another fit's parameters of the same name may live.
    """

    def __init__(self, *args, **kwargs):
        with pyro.settings.context(**LOCAL_PARAMS):
            super().__init__(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        with pyro.settings.context(**LOCAL_PARAMS):
            return super().__call__(*args, **kwargs)

    def __getattr__(self, name):
        # Outside a model or guide call (``mean()``, SVI's direct ELBO) no branch of PyroModule's read
        # depends on the setting, and inside ours it is already set: the context (a few registry
        # lookups) is needed only inside another caller's, and every guide parameter is read each step.
        if not self._pyro_context.active:
            # there a PyroParam is its unconstrained leaf through transform_to(constraint), as PyroModule
            # gives it, without its registry lookup, its tag and its second __getattr__ (~10 us per read)
            constraint, _ = self.__dict__.get("_pyro_params", {}).get(name, (None, None))
            if constraint is constraints.real:
                return self._parameters[name + "_unconstrained"]
            if constraint is not None:
                return _transform(constraint)(self._parameters[name + "_unconstrained"])
            return super().__getattr__(name)
        if pyro.settings.get("module_local_params"):
            return super().__getattr__(name)
        with pyro.settings.context(**LOCAL_PARAMS):
            return super().__getattr__(name)


@functools.lru_cache(maxsize=64)  # constraints hash by identity: a guide's are the library's singletons
def _transform(constraint) -> Transform:
    return transform_to(constraint)


def sample_sites(sites: dict[str, tuple[Distribution, dict]]) -> dict[str, torch.Tensor]:
    """A :class:`~bnn_zoo.protocols.SiteDistributions` guide's forward: sample every site from its q."""
    # a copy: messengers may edit it
    return {name: pyro.sample(name, q, infer=dict(infer)) for name, (q, infer) in sites.items()}


def scope(guide: Callable) -> contextlib.AbstractContextManager:
    """The Pyro settings ``guide`` must run under: the parameter mode a PyroModule guide was built in
    (module-local or the global parameter store), and no change for a plain callable."""
    if isinstance(guide, PyroModule) and not isinstance(guide, LocalParamModule):  # which scopes itself
        return pyro.settings.context(module_local_params=hasattr(guide._pyro_context, "param_state"))
    return contextlib.nullcontext()


def parameters(guide: Callable, *args) -> list[torch.Tensor]:
    """Every trainable tensor of ``guide``: its ``pyro.param`` sites (the unconstrained tensors, as
    Pyro's SVI collects them) and, for a torch module, its ``nn.Parameter``s."""
    with scope(guide), poutine.trace(param_only=True) as capture:
        guide(*args)
    found = {id(p): p for p in (_unconstrained(site["value"]) for site in capture.trace.nodes.values())}
    if isinstance(guide, torch.nn.Module):
        found.update({id(p): p for p in guide.parameters()})
    return [p for p in found.values() if p.requires_grad]


def _unconstrained(value: torch.Tensor) -> torch.Tensor:
    """The leaf tensor behind a param site's value (a real-valued module-local param is the leaf itself)."""
    ref = getattr(value, "unconstrained", None)
    return value if ref is None else ref()


def sample_guide(guide: Callable, model, num_samples: int, *args) -> dict[str, torch.Tensor]:
    """``num_samples`` joint draws of the model's latent sites from ``guide``, vectorised: (S, *event).

    A :class:`~bnn_zoo.protocols.SiteDistributions` guide samples each site's q directly; any other
    guide runs under ``pyro.infer.Predictive``."""
    shapes = model.latent_shapes()
    with scope(guide):
        if isinstance(guide, SiteDistributions):  # its sites are independent: draw each from its q, untraced
            draws = {k: q.sample((num_samples,)) for k, (q, _) in guide.site_distributions().items()}
        else:
            draws = Predictive(guide, num_samples=num_samples, parallel=True, return_sites=list(shapes))(*args)
    return {k: draws[k].reshape(num_samples, *shapes[k]) for k in shapes}


def log_weights(
    guide: Callable, model, x: torch.Tensor, y: torch.Tensor, num_samples: int, chunk: int = 256
) -> torch.Tensor:
    """log p(y, w_s | x) - log q(w_s) for ``num_samples`` draws w_s ~ q on the full data: shape (S,).

    Pyro's ``vectorized_importance_weights`` in chunks of ``chunk`` draws, so memory stays bounded.
    """
    out = []
    with scope(guide):
        for size in _chunks(num_samples, chunk):
            lw, _, _ = vectorized_importance_weights(model, guide, x, y, num_samples=size, max_plate_nesting=1)
            out.append(lw.reshape(size))
    return torch.cat(out)


def _chunks(total: int, chunk: int) -> Iterator[int]:
    for start in range(0, total, chunk):
        yield min(chunk, total - start)


def guide_state(guide: Callable) -> dict[str, torch.Tensor] | None:
    """A torch-module guide's ``state_dict`` (copied); None for a plain callable, whose ``pyro.param``
    values live in Pyro's global store under names only the callable knows."""
    if not isinstance(guide, torch.nn.Module):
        return None
    return {k: v.detach().clone() for k, v in guide.state_dict().items()}
