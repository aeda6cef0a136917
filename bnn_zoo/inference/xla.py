"""The XLA backend of NUTS and ChEES: the BNN's own torch log density, run under JAX.

torchax traces :class:`~bnn_zoo.inference.potential.LogPosterior` (the network, its prior and the
likelihood, as written in torch: no network is written again in JAX) into a JAX function of the flat
unconstrained coordinates q. NumPyro's NUTS and BlackJAX's ChEES sample it, compiled by XLA, where a
small network's gradient costs a fraction of eager PyTorch's (docs/benchmarks.md).

Before a run the traced log density and its gradient are compared with the torch potential at the
first chain's start; a network that cannot be traced, or a mismatch, falls back to the torch
samplers with one warning saying why. The optional extra: ``pip install 'bnn-zoo[jax]'``.
"""

from __future__ import annotations

import importlib.util
import math
import re
import warnings
from pathlib import Path

import pyro
import torch

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.potential import LogPosterior
from bnn_zoo.models import architecture

EXTRA = ("jax", "numpyro", "blackjax", "optax", "torchax")
BACKENDS = ("auto", "torch", "jax")
VALUE_RTOL, GRADIENT_RTOL = 1e-4, 1e-3  # float32 sums of N terms: agreement measured at 1e-7 (value), 3e-7 (gradient)
LENGTH_FLOOR_MAX_DIM = 4096  # BlackJAX's slow-direction length floor keeps a d x d covariance
INITIAL_STEP_SIZE = 0.01  # BlackJAX's ChEES adapted from here on Boston 13-50-1, not from larger steps


def available() -> bool:
    """Whether the ``jax`` extra is installed."""
    return all(importlib.util.find_spec(name) is not None for name in EXTRA)


def check_backend(method: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise BnnZooError(f"{method} backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "jax" and not available():
        raise BnnZooError(
            f"{method} backend='jax' needs the jax extra: pip install 'bnn-zoo[jax]' (or use backend='torch')"
        )


def resolve_backend(backend: str, model: BNN) -> str:
    """``"auto"``: JAX where the extra is installed and the network has no convolution or recurrent
    layer; torch otherwise. Measured per architecture (benchmarks/backends.py): the MLP's traced
    gradient is several times cheaper than eager torch's, the digits CNN's dearer, and bnn-zoo's
    LSTMs do not trace (their input check reads a value)."""
    if backend != "auto":
        return backend
    return "jax" if available() and architecture(model.net) == "dense" else "torch"


class FallBack(Exception):
    """The JAX backend cannot run this model; the message says why."""


def _torchax():
    """torchax, imported only here: at import it renames torch's PrivateUse1 backend to "jax".

    torchax 0.0.13 names named-tensor overloads (``aten.prod.dim_Dimname``, ...) that torch 2.13
    removed, and fails at import. Each missing overload is aliased to one its packet still has, before
    the import, so the installed package is left as it is; named tensors are never traced here."""
    import sys

    if "torchax" in sys.modules:
        return sys.modules["torchax"]
    root = Path(importlib.util.find_spec("torchax").origin).parent
    for source in root.rglob("*.py"):
        for op, overload in set(re.findall(r"torch\.ops\.aten\.(\w+)\.(\w+)", source.read_text())):
            packet = getattr(torch.ops.aten, op, None)
            if packet is not None and overload not in packet.overloads():
                setattr(packet, overload, getattr(packet, packet.overloads()[0]))
    import torchax

    return torchax


class JaxTarget:
    """The log posterior on flat unconstrained coordinates q (d,), as a JAX function (``logdensity``).

    Args:
        model: the BNN; its network, prior and likelihood are traced as torch code.
        x: the training inputs (every leapfrog step sees all of them).
        y: the training targets.
    """

    def __init__(self, model: BNN, x: torch.Tensor, y: torch.Tensor):
        self.torch_target = LogPosterior(model, x.shape[0])
        self.shapes = model.latent_shapes()
        self.sizes = [math.prod(s) for s in self.shapes.values()]
        self.x, self.y = x, y
        try:
            self.logdensity = self._trace(model, x, y)
        except Exception as exc:  # torchax raises many types for an op it cannot lower
            raise FallBack(f"the log density could not be traced to JAX ({_first_line(exc)})") from None

    def _trace(self, model: BNN, x, y):
        torchax = _torchax()
        env = torchax.default_env()
        with env, pyro.validation_enabled(False):  # argument checks have no JAX lowering (aten::_is_all_true)
            on_jax = LogPosterior(model.to("jax"), x.shape[0])
            xj, yj = x.to("jax"), y.to("jax")
        view = torchax.interop.jax_view(lambda q: on_jax(self.unflatten(q), (xj, yj))[0])

        def logdensity(q):
            with env, pyro.validation_enabled(False), warnings.catch_warnings():
                # labels as int32: exact below 2^31
                warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")
                return view(q)

        return logdensity

    def start(self, values: dict) -> torch.Tensor:
        """Site values (C, *site shape) as flat unconstrained starts (C, d)."""
        return self.flatten(self.torch_target.initial(values))

    def flatten(self, values: dict) -> torch.Tensor:
        """Site values with a leading chain dimension C as (C, d)."""
        c = next(iter(values.values())).shape[0]
        return torch.cat([values[k].reshape(c, -1) for k in self.shapes], dim=1)

    def unflatten(self, q) -> dict:
        """(..., d) as site values shaped (..., *site shape)."""
        parts = q.split(self.sizes, -1)
        return {k: v.reshape((*q.shape[:-1], *s)) for (k, s), v in zip(self.shapes.items(), parts, strict=True)}

    def check(self, q: torch.Tensor) -> None:
        """Raise :class:`FallBack` unless the traced log density and its gradient at ``q`` (d,) equal the
        torch potential's to float32 rounding (``VALUE_RTOL``, ``GRADIENT_RTOL`` relative)."""
        import jax
        import jax.numpy as jnp

        leaf = q.detach().clone().requires_grad_(True)
        with pyro.validation_enabled(False), torch.enable_grad():
            value = self.torch_target(self.unflatten(leaf), (self.x, self.y))[0]
            (grad,) = torch.autograd.grad(value, leaf)
        value = float(value.detach())
        try:
            jv, jg = jax.jit(jax.value_and_grad(self.logdensity))(jnp.asarray(q.detach().numpy()))
        except Exception as exc:
            raise FallBack(f"the log density could not be traced to JAX ({_first_line(exc)})") from None
        value_error = abs(float(jv) - value) / max(1.0, abs(value))
        grad_error = float(torch.linalg.vector_norm(torch.from_numpy(jax.device_get(jg).copy()) - grad)) / max(
            float(torch.linalg.vector_norm(grad)), 1e-12
        )
        if not (value_error <= VALUE_RTOL and grad_error <= GRADIENT_RTOL):
            raise FallBack(
                f"the traced log density differs from torch's at the start (value {value_error:.1e}, gradient "
                f"{grad_error:.1e} relative)"
            )

    def to_torch(self, draws) -> dict:
        """Draws (C, S, d) from JAX as constrained site values (C, S, *site shape)."""
        import jax

        flat = torch.from_numpy(jax.device_get(draws).copy())
        return self.torch_target.constrained(self.unflatten(flat))


def jax_target(method: str, model: BNN, x, y, starts: dict) -> JaxTarget | None:
    """The model's :class:`JaxTarget`, checked at the first chain's start (``starts``: site values
    (C, *site shape)); or None, after one warning saying why the run falls back to torch."""
    try:
        if x.device.type != "cpu":
            raise FallBack(f"the JAX backend runs on the CPU, and the data is on {x.device}")
        target = JaxTarget(model, x, y)
        target.check(target.start(starts)[0])
        return target
    except FallBack as reason:
        warnings.warn(f"{method} backend='jax' falls back to torch: {reason}", stacklevel=3)
        return None


def run_nuts(target: JaxTarget, q0: torch.Tensor, method, progress: bool) -> tuple[dict, dict]:
    """NumPyro's NUTS from starts q0 (C, d): (site draws (C, S, ...), sample stats (C, S)) in the
    torch samplers' names."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import MCMC
    from numpyro.infer import NUTS as NumPyroNUTS

    kernel = NumPyroNUTS(
        potential_fn=lambda q: -target.logdensity(q),
        target_accept_prob=method.target_accept,
        dense_mass=method.dense_mass,
        max_tree_depth=method.max_tree_depth,
    )
    chains = q0.shape[0]
    mcmc = MCMC(
        kernel,
        num_warmup=method.num_warmup,
        num_samples=method.num_samples,
        num_chains=chains,
        # one compiled chain after another, whatever chain_method: in lockstep ("vectorized") every
        # iteration costs the longest of the chains' trees
        chain_method="sequential",
        progress_bar=progress,
    )
    fields = ("diverging", "num_steps", "energy", "potential_energy", "adapt_state.step_size")
    init = jnp.asarray(q0.numpy()) if chains > 1 else jnp.asarray(q0[0].numpy())
    mcmc.run(jax.random.PRNGKey(method.seed), init_params=init, extra_fields=fields)
    draws = mcmc.get_samples(group_by_chain=True)
    extra = {
        k: torch.from_numpy(jax.device_get(v).copy()) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()
    }
    steps = extra["num_steps"].long()
    stats = {
        "diverging": extra["diverging"].bool(),
        "n_steps": steps,
        "tree_depth": torch.floor(torch.log2(steps.clamp(min=1).double())).long() + 1,
        "step_size": extra["adapt_state.step_size"].double(),
        "energy": extra["energy"].double(),
        "lp": -extra["potential_energy"].double(),
    }
    return target.to_torch(draws), stats


def run_chees(target: JaxTarget, q0: torch.Tensor, method) -> tuple[dict, dict, dict]:
    """BlackJAX's ChEES adaptation and jittered dynamic HMC, every chain in one vmapped program, from
    starts q0 (C, d): (site draws (C, S, ...), sample stats (C, S), the adapted step size and
    trajectory length)."""
    import blackjax
    import jax
    import jax.numpy as jnp
    import optax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    chains, dim = q0.shape
    warmup = blackjax.chees_adaptation(
        target.logdensity,
        chains,
        target_acceptance_rate=method.target_accept,
        max_leapfrog_steps=method.max_leapfrog,
        adaptation_info_fn=get_filter_adapt_info_fn(),
        mass_matrix_estimation="diagonal",  # pooled over chains, as the torch sampler's "pooled"
        _length_floor=dim <= LENGTH_FLOOR_MAX_DIM,
    )
    key_warmup, key_sample = jax.random.split(jax.random.PRNGKey(method.seed))
    (states, parameters), _ = warmup.run(
        key_warmup,
        jnp.asarray(q0.numpy()),
        step_size=INITIAL_STEP_SIZE,
        optim=optax.adam(method.trajectory_lr),
        num_steps=method.num_warmup,
        max_sampling_steps=method.num_samples,
    )
    step = blackjax.dynamic_hmc(target.logdensity, **parameters).step

    @jax.jit
    def sample(states, key):
        def one(states, key):
            states, info = jax.vmap(step)(jax.random.split(key, chains), states)
            return states, (
                states.position,
                states.logdensity,
                info.is_divergent,
                info.num_integration_steps,
                info.energy,
                info.acceptance_rate,
            )

        return jax.lax.scan(one, states, jax.random.split(key, method.num_samples))[1]

    drawn = (torch.from_numpy(jax.device_get(a).copy()).transpose(0, 1) for a in sample(states, key_sample))
    position, logdensity, divergent, steps, energy, accept = drawn
    step_size = float(parameters["step_size"])
    stats = {  # the torch ChEES's names
        "acceptance_rate": accept.double(),
        "diverging": divergent.bool(),
        "energy": energy.double(),
        "lp": logdensity.double(),
        "step_size": torch.full(steps.shape, step_size, dtype=torch.float64),
        "n_steps": steps.long(),
        "trajectory_length": steps.double() * step_size,
    }
    length = float(parameters["integration_steps_params"][0]) * step_size
    return target.to_torch(position), stats, {"step_size": step_size, "trajectory_length": length}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
