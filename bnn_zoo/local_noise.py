"""Local noise: a guide's randomness applied where a weight is used, drawn afresh for every example.

Two things need it, both during SVI training only:

- the local reparameterisation trick (Kingma, Salimans & Welling 2015): rather than one weight draw
  shared by the whole minibatch, each example's pre-activations are drawn from their exact Gaussian
  given the guide, e.g. N(x mu^T, x^2 (sigma^2)^T) for a mean-field dense layer. The expected ELBO is
  unchanged; the gradient variance drops because examples no longer share one noise draw;
- per-example dropout masks (Gal's thesis eq. 3.9: a new mask, i.e. a new draw of the weights from the
  dropout mixture, for every data point), which is ordinary dropout: a mask on the layer's input.

A guide in training mode attaches a :class:`LocalNoise` to a weight's sample site through
``infer={"local_noise": ...}``. Pyro's replay copies a guide site's ``infer`` to the model's site, where
:func:`collect` picks it up, and :func:`hooks` runs that layer at ``noise.centre`` with the noise added
on its input or output by forward hooks, so the network module itself never changes.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from pyro.poutine.messenger import Messenger
from torch import nn

from bnn_zoo.errors import BnnZooError


class LocalNoise:
    """Run the layer at ``centre`` (a fixed weight) with per-example noise on its input or output."""

    def __init__(self, centre: torch.Tensor):
        self.centre = centre

    def inputs(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x

    def outputs(self, module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out


class InputDropout(LocalNoise):
    """x -> x * e with e ~ Bernoulli(keep) per example and input unit (no 1/keep rescaling: Gal's convention).

    For a dense layer the mask is one per example, shared over any middle dims (time steps: one weight
    draw per sequence); for a convolution it is per input pixel, as in Gal's convolutional dropout.
    With a ``temperature`` the masks are concrete relaxations (:func:`relaxed_keep_mask`), through which
    a learned ``keep`` (a tensor) gets its gradient.
    """

    def __init__(self, centre, keep: float | torch.Tensor, temperature: float | None = None):
        super().__init__(centre)
        self.keep, self.temperature = keep, temperature

    def inputs(self, module, x):
        shape = (x.shape[0], *[1] * (x.dim() - 2), x.shape[-1]) if isinstance(module, nn.Linear) else x.shape
        if self.temperature is None:
            return x * keep_mask(shape, self.keep, x)  # multiplied as bool: a cast less per layer and step
        return x * self.draw(shape, x)

    def draw(self, shape, like: torch.Tensor) -> torch.Tensor:
        """A mask of ``shape`` in ``like``'s dtype, 1 = kept (relaxed with a temperature)."""
        if self.temperature is not None:
            return relaxed_keep_mask(shape, self.keep, self.temperature, like)
        return bernoulli_mask(shape, self.keep, like)


def keep_mask(shape, keep: float, like: torch.Tensor) -> torch.Tensor:
    """True with probability ``keep`` (a fresh draw per particle under ``vmap(randomness="different")``)."""
    return torch.rand(shape, dtype=like.dtype, device=like.device) < keep


def bernoulli_mask(shape, keep: float, like: torch.Tensor) -> torch.Tensor:
    """1 with probability ``keep``, else 0, in ``like``'s dtype."""
    return keep_mask(shape, keep, like).to(like.dtype)


def relaxed_keep_mask(shape, keep: torch.Tensor, temperature: float, like: torch.Tensor) -> torch.Tensor:
    """Concrete dropout's mask (Gal, Hron & Kendall 2017, eq. 5): 1 - sigmoid((logit p + logit u) / t) with
    p = 1 - keep and u ~ U(0, 1); as t -> 0 it is Bernoulli(keep), and it is differentiable in keep."""
    u = torch.rand(shape, dtype=like.dtype, device=like.device).clamp(1e-7, 1 - 1e-7)
    drop = 1 - torch.as_tensor(keep, dtype=like.dtype, device=like.device)
    return torch.sigmoid(-(torch.logit(drop) + torch.logit(u)) / temperature)


class GaussianWeights(LocalNoise):
    """Independent N(loc, scale^2) weights: pre-activations x loc^T + sqrt(x^2 (scale^2)^T) eps, dense or conv."""

    def __init__(self, loc, scale):
        super().__init__(loc)
        self.scale = scale

    def outputs(self, module, x, out):
        var = linear_op(module, x * x, self.scale * self.scale)
        return out + var.clamp_min(1e-30).sqrt() * torch.randn_like(out)


class MatrixNormalWeights(LocalNoise):
    """W (out, in) ~ MN(M, U, V), U = L_U L_U^T over outputs, V = L_V L_V^T over inputs:
    x W^T ~ N(x M^T, (x V x^T) U) (Louizos & Welling 2016), dense layers only."""

    def __init__(self, loc, row_factor, col_factor):
        super().__init__(loc)
        self.row_factor, self.col_factor = row_factor, col_factor

    def outputs(self, module, x, out):
        if not isinstance(module, nn.Linear):
            raise BnnZooError(
                f"matrix-normal local reparameterisation supports dense layers only, not {type(module).__name__}; set "
                "local_reparam=false for this model"
            )
        spread = (x @ self.col_factor).pow(2).sum(-1, keepdim=True)  # x V x^T per example
        z = torch.randn(*out.shape[:-1], self.row_factor.shape[-1], dtype=out.dtype, device=out.device)
        return out + spread.sqrt() * (z @ self.row_factor.T)


def linear_op(module: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The layer's linear map of x by ``weight``, without bias (dense and convolutional layers)."""
    if isinstance(module, nn.Linear):
        return F.linear(x, weight)
    if isinstance(module, nn.modules.conv._ConvNd):
        return module._conv_forward(x, weight, None)
    raise BnnZooError(
        f"local reparameterisation supports Linear and Conv layers, not {type(module).__name__}; set "
        "local_reparam=false for this model"
    )


class collect(Messenger):
    """Record the local noise that the guide attached to the model's sample sites: ``.noise[name]``."""

    def __init__(self):
        super().__init__()
        self.noise: dict[str, LocalNoise] = {}

    def _postprocess_message(self, msg):
        if msg["type"] == "sample" and "local_noise" in (msg.get("infer") or {}):
            self.noise[msg["name"]] = msg["infer"]["local_noise"]


def input_dropout(module: nn.Module, weight: str) -> InputDropout | None:
    """For modules that apply their own noise (``handles_local_noise = True``: recurrent layers, embeddings):
    the per-example dropout on ``weight``'s input units, or None without noise."""
    noise = getattr(module, "_local_noise", {}).get(weight)
    if noise is None or isinstance(noise, InputDropout):
        return noise
    raise BnnZooError(
        f"{type(module).__name__} takes per-example dropout masks only: local reparameterisation would draw new "
        "weight noise at every step of a sequence; set local_reparam=false"
    )


def input_mask(module: nn.Module, weight: str, shape, like: torch.Tensor) -> torch.Tensor | None:
    """A per-example dropout mask of ``shape`` for ``weight``'s input units, or None without noise."""
    noise = input_dropout(module, weight)
    return None if noise is None else noise.draw(shape, like)


_SUBMODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def submodule(net: nn.Module, name: str) -> nn.Module:
    """``net.get_submodule(name)``, found once per network: get_submodule walks the path with hasattr
    and getattr, a cost SVI would pay for every layer at every step."""
    found = _SUBMODULES.setdefault(net, {})
    if name not in found:
        found[name] = net.get_submodule(name)
    return found[name]


@contextmanager
def hooks(net: nn.Module, noise: dict[str, LocalNoise]):
    """While active, every layer owning a noisy weight gets its input and output hooks; a module that
    handles its own noise (recurrences, embeddings) finds it in ``module._local_noise`` instead."""
    handles, owners, aware = [], set(), {}
    try:
        for name, n in noise.items():
            owner, _, attr = name.rpartition(".")
            module = submodule(net, owner)
            # attribute reads, not isinstance on the runtime Protocols: this runs at every SVI step
            if getattr(module, "handles_local_noise", False):  # HandlesLocalNoise
                aware.setdefault(module, {})[attr] = n
                continue
            if owner in owners:
                raise BnnZooError(
                    f"module {owner!r} has more than one weight with local noise; turn local noise off for it"
                )
            owners.add(owner)
            # a network may move a weight's input mask upstream (LeNet: before pooling, as in Gal's lenet-all)
            # MovesMasks
            site = (
                submodule(net, getattr(net, "mask_sites", {}).get(name, owner))
                if isinstance(n, InputDropout)
                else module
            )
            # only the hooks the noise overrides: each one puts the module on torch's slower call path
            if type(n).inputs is not LocalNoise.inputs:
                handles.append(site.register_forward_pre_hook(lambda m, args, n=n: (n.inputs(m, args[0]), *args[1:])))
            if type(n).outputs is not LocalNoise.outputs:
                handles.append(module.register_forward_hook(lambda m, args, out, n=n: n.outputs(m, args[0], out)))
        for module, found in aware.items():
            module.__dict__["_local_noise"] = found  # a plain attribute: nn.Module's __setattr__ checks would cost more
        yield
    finally:
        for h in handles:
            h.remove()
        for module in aware:
            module.__dict__.pop("_local_noise", None)
