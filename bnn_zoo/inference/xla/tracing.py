"""The BNN's own torch log density traced into a JAX function by torchax, checked against torch's at the
first chain's start, and the cells' data padded to one shape so that one traced function serves them all."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import torch

from bnn_zoo.bnn import BNN
from bnn_zoo.inference.potential import LogPosterior
from bnn_zoo.inference.xla.devices import jax_device
from bnn_zoo.inference.xla.environment import FallBack, load_torchax

VALUE_RTOL, GRADIENT_RTOL = 1e-4, 1e-3  # float32 sums of N terms: agreement measured at 1e-7 (value), 3e-7 (gradient)


class JaxTarget:
    """The log posterior on flat unconstrained coordinates q (d,), as a JAX function (``logdensity``).

    Args:
        model: the BNN; its network, prior and likelihood are traced as torch code.
        x: the training inputs (every leapfrog step sees all of them).
        y: the training targets.
    """

    def __init__(self, model: BNN, x: torch.Tensor, y: torch.Tensor, device: torch.device | str | None = None):
        self.torch_target = LogPosterior(model, x.shape[0])
        self.shapes = model.latent_shapes()
        self.sizes = [math.prod(s) for s in self.shapes.values()]
        self.x, self.y = x, y
        self.torch_device = torch.device(device or x.device)
        self.device = jax_device(self.torch_device)
        try:
            self.data_logdensity = self._trace(model.to("cpu"))
        except Exception as exc:  # torchax raises many types for an op it cannot lower
            raise FallBack(f"the log density could not be traced to JAX ({first_line(exc)})") from None
        with self.placed():
            self.data = tuple(a[0] for a in padded([(x, y)]))

    def placed(self):
        """A context in which new JAX arrays, and the programs that take them, live on this target's device."""
        import jax

        return jax.default_device(self.device)

    def logdensity(self, q):
        """The log posterior at q (d,) on this target's training data."""
        return self.data_logdensity(q, *self.data)

    def _trace(self, model: BNN):
        """The log posterior as a JAX function of (q, x, y, mask): the data are arguments, so one traced
        function serves every cell of a batch (:func:`padded`)."""
        torchax = load_torchax()
        env = torchax.default_env()
        with env, pyro.validation_enabled(False):  # argument checks have no JAX lowering (aten::_is_all_true)
            on_jax = LogPosterior(model.to("jax"), 0)
        view = torchax.interop.jax_view(lambda q, x, y, mask: on_jax(self.unflatten(q), (x, y, mask))[0])

        def logdensity(q, x, y, mask):
            with env, pyro.validation_enabled(False), warnings.catch_warnings():
                # labels as int32: exact below 2^31
                warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")
                return view(q, x, y, mask)

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
            with self.placed():
                jv, jg = jax.jit(jax.value_and_grad(self.logdensity))(jnp.asarray(q.detach().cpu().numpy()))
        except Exception as exc:
            raise FallBack(f"the log density could not be traced to JAX ({first_line(exc)})") from None
        value_error = abs(float(jv) - value) / max(1.0, abs(value))
        grad_error = float(torch.linalg.vector_norm(torch.from_numpy(jax.device_get(jg).copy()) - grad.cpu())) / max(
            float(torch.linalg.vector_norm(grad)), 1e-12
        )
        if not (value_error <= VALUE_RTOL and grad_error <= GRADIENT_RTOL):
            raise FallBack(
                f"the traced log density differs from torch's at the start (value {value_error:.1e}, gradient "
                f"{grad_error:.1e} relative)"
            )

    def to_torch(self, draws) -> dict:
        """Draws (C, S, d) from JAX (or torch) as constrained site values (C, S, *site shape)."""
        import jax

        flat = draws if isinstance(draws, torch.Tensor) else torch.from_numpy(np.array(jax.device_get(draws)))
        return self.torch_target.constrained(self.unflatten(flat.to(self.x.device)))


def padded(data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple:
    """K cells' training data (x, y) as JAX arrays (K, N, ...) with a row mask (K, N), N the most rows
    of any cell: a shorter cell repeats its first row, masked out, so every padded term is finite and
    adds exactly 0 to the log-likelihood (:meth:`LogPosterior.__call__`)."""
    import jax.numpy as jnp

    n = max(x.shape[0] for x, _ in data)

    def pad(a):
        return torch.cat([a, a[:1].expand(n - a.shape[0], *a.shape[1:])]).cpu().numpy()

    x, y = (jnp.stack([jnp.asarray(pad(part[i])) for part in data]) for i in (0, 1))
    mask = jnp.stack([jnp.asarray(np.arange(n) < a.shape[0], dtype=x.dtype) for a, _ in data])
    return x, y, mask


def jax_target(method: str, model: BNN, x, y, starts: dict, device=None) -> JaxTarget | None:
    """The model's :class:`JaxTarget` on ``device`` (default: the data's), checked at the first chain's
    start (``starts``: site values (C, *site shape)); or None, after one warning saying why the run
    falls back to torch."""
    try:
        target = JaxTarget(model, x, y, device)
        target.check(target.start(starts)[0])
        return target
    except FallBack as reason:
        warnings.warn(f"{method} backend='jax' falls back to torch: {reason}", stacklevel=3)
        return None


def first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
