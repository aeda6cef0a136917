"""BNN: any torch module + a prior + a likelihood = one Pyro model.

Every Bayesian parameter of the network becomes a sample site named after it (``layers.0.weight``);
the targets are observed inside ``pyro.plate("data", N, subsample_size=M)``, so a minibatch
log-likelihood is scaled by N/M while the prior (and so the KL of any guide) is counted once.
``expose``/``hide`` choose which parameters are Bayesian; the others are point estimates (fitted
with the guide by SVI, held fixed by MCMC), so a last-layer BNN is
``BNN(net, prior, likelihood, expose=[last_layer(net)])``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable
from contextlib import contextmanager

import pyro
import torch
from torch import nn
from torch.distributions import Distribution
from torch.func import functional_call, vmap

from bnn_zoo import local_noise
from bnn_zoo.errors import BnnZooError
from bnn_zoo.likelihoods import Likelihood, default_likelihood
from bnn_zoo.models import architecture
from bnn_zoo.priors import PerSite, Prior, default_prior, matches, site_distribution
from bnn_zoo.protocols import DeclaresWidths, ForwardsDraws

Selection = Iterable["str | nn.Module"]


class BNN:
    """A Bayesian neural network as a Pyro model: call it as ``model(x, y=None, batch_size=None)``.

    The same object is fitted by SVI with any guide and by NUTS/HMC. Weight draws with a leading batch
    shape (vectorised particles, posterior draws) are evaluated with ``torch.func.vmap``, never a loop.

    Args:
        net: the architecture, any ``torch.nn.Module`` mapping (N, features) to (N, outputs)
            (see :class:`bnn_zoo.protocols.Network`).
        prior: a :class:`bnn_zoo.priors.Prior` (``(name, param) -> Distribution``) or one torch/Pyro
            distribution for every weight (i.i.d.); default :func:`bnn_zoo.priors.default_prior` for the
            network's architecture and the likelihood's task, as ``bnn-zoo fit`` chooses it (the fan-in
            Normal on dense and convolutional networks). It acts on the weights of the network that
            ``bnn_zoo.fit`` fits to standardised data.
        likelihood: a :class:`bnn_zoo.likelihoods.Likelihood`; default a Gaussian with a learned noise
            (HalfNormal(1) prior, on the standardised targets), as ``bnn-zoo fit`` uses on regression.
        expose: only these parameters are Bayesian: name patterns (``"layers.2.*"``), module names or
            modules of ``net``.
        hide: these parameters are not Bayesian (point estimates); the complement of ``expose``.
    """

    def __init__(
        self,
        net: nn.Module,
        prior: Prior | Distribution | None = None,
        likelihood: Likelihood | None = None,
        expose: Selection | None = None,
        hide: Selection | None = None,
    ):
        if not isinstance(net, nn.Module):
            raise BnnZooError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        likelihood = default_likelihood() if likelihood is None else likelihood
        if not isinstance(likelihood, Likelihood):
            raise BnnZooError(
                "likelihood must be a bnn_zoo.likelihoods object (e.g. bz.likelihoods.Gaussian(0.1)), got "
                f"{likelihood!r}"
            )
        prior = default_prior(architecture(net), likelihood.task) if prior is None else prior
        if not (isinstance(prior, Distribution) or callable(prior)):
            raise BnnZooError(
                "prior must be a bnn_zoo.priors prior (e.g. bz.priors.Normal(1.0)) or a torch/Pyro distribution, got "
                f"{prior!r}"
            )
        self.net = net
        self.prior = prior.named(net) if isinstance(prior, PerSite) else prior
        self.likelihood = likelihood
        bayesian = _select(net, expose, hide)
        self.params = {name: p.detach() for name, p in net.named_parameters() if name in bayesian}
        self.fixed = {name: p.detach() for name, p in net.named_parameters() if name not in bayesian}
        if not self.params:
            raise BnnZooError(
                "no parameter of the network is Bayesian: check the expose/hide selection (or the network has no "
                "parameters)"
            )
        self.expose, self.hide = _names(net, expose), _names(net, hide)  # as names, so the description is plain data

    def site_prior(self, name: str) -> Distribution:
        """The prior distribution of weight site ``name`` (event shape = the parameter's shape)."""
        return site_distribution(self.prior, name, self.params[name])

    @property
    def task(self) -> str:
        """The likelihood's task: regression, classification or language-model."""
        return self.likelihood.task

    @property
    def in_features(self) -> int | None:
        """Input width when the network declares it (``net.in_features``), else None."""
        return self.net.in_features if isinstance(self.net, DeclaresWidths) else None

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None, batch_size: int | None = None):
        with local_noise.collect() as noisy:  # a guide in training mode may ask for per-example noise
            weights = {name: pyro.sample(name, self.site_prior(name)) for name in self.params}
        latent = self.likelihood.sample_latent()
        # Under an outer vectorising plate (particles, predictive draws) global sites carry a singleton
        # for the data plate at dim -1 of their batch shape; drop it so draws line up with f's leading dims.
        weights = {k: _drop_data_dim(v, self.params[k].dim()) for k, v in weights.items()}
        latent = {k: _drop_data_dim(v, 0) for k, v in latent.items()}
        with pyro.plate("data", x.shape[0], subsample_size=batch_size, dim=-1) as idx:
            f = self.forward(weights, x[idx], noisy.noise)
            pyro.sample("y", self.likelihood.distribution(f, latent), obs=None if y is None else y[idx])
        return f

    def forward(self, weights: dict[str, torch.Tensor], x: torch.Tensor, noise: dict | None = None) -> torch.Tensor:
        """Network outputs for weights with any leading batch shape B: returns (*B, N, out).

        ``weights`` holds the Bayesian parameters; the point-estimated ones (``fixed``) are shared by
        every draw. ``noise`` maps weight names to :class:`~bnn_zoo.local_noise.LocalNoise`: those
        layers run at the noise's centre with per-example noise (local reparameterisation, dropout masks).
        """
        name, ref = next(iter(self.params.items()))
        batch = weights[name].shape[: weights[name].dim() - ref.dim()]
        noise = noise or {}
        weights = {
            **weights,
            **{
                k: n.centre if n.centre.shape == weights[k].shape else n.centre.expand(weights[k].shape)
                for k, n in noise.items()
            },
        }
        with local_noise.hooks(self.net, noise):
            if not batch:
                with _bound(self.net, {**self.fixed, **weights}):
                    return self.net(x)
            flat = {k: v.reshape(-1, *self.params[k].shape) for k, v in weights.items()}
            if (
                not noise and not self.fixed and x.dim() == 2 and isinstance(self.net, ForwardsDraws)
            ):  # e.g. the MLP: 3x vmap
                f = self.net.forward_draws(flat, x)
                return f.reshape(*batch, *f.shape[1:])
            f = vmap(lambda w: functional_call(self.net, {**self.fixed, **w}, (x,)), randomness="different")(flat)
        return f.reshape(*batch, *f.shape[1:])

    def point_estimates(self) -> dict[str, torch.Tensor]:
        """The non-Bayesian parameters as fresh leaf tensors that require grad, for SVI to fit."""
        return {k: v.detach().clone().requires_grad_(True) for k, v in self.fixed.items()}

    def with_fixed(self, values: dict[str, torch.Tensor]) -> BNN:
        """The same model (network, prior, likelihood, selection) with other point-estimate values."""
        other = copy.copy(self)
        other.fixed = {k: values[k] for k in self.fixed}
        return other

    def network(self, values: dict[str, torch.Tensor] | None = None) -> nn.Module:
        """A standalone copy of the network with ``values`` (e.g. a MAP estimate or a posterior mean;
        default: the network's own) for the Bayesian parameters and the point estimates elsewhere.

        Only the Bayesian parameters require grad, so a library that works on a plain module, such
        as laplace-torch (whose ``subset_of_weights="all"`` takes the parameters that require grad),
        sees exactly the BNN's latent weights: the hook for a Laplace approximation.
        """
        values = {**self.params, **(values or {})}
        net = copy.deepcopy(self.net)
        with torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(values[name] if name in self.params else self.fixed[name])
                p.requires_grad_(name in self.params)
        return net

    def to(self, device: torch.device | str) -> BNN:
        """A copy of the model with the network, its parameters and the likelihood on ``device``."""
        device = torch.device(device)
        other = copy.copy(self)
        other.net = copy.deepcopy(self.net).to(device)
        other.params = {k: v.to(device) for k, v in self.params.items()}
        other.fixed = {k: v.to(device) for k, v in self.fixed.items()}
        other.likelihood = self.likelihood.to(device)
        return other

    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device

    def latent_shapes(self) -> dict[str, torch.Size]:
        """Event shape of every latent site: weights, then the likelihood's own (noise scale)."""
        shapes = {k: v.shape for k, v in self.params.items()}
        shapes.update({k: d.event_shape for k, d in self.likelihood.latent_prior().items()})
        return shapes

    def network_init(self, seed: int) -> dict[str, torch.Tensor]:
        """Weights from the network's own initialiser, re-drawn under ``seed`` by each submodule's
        ``reset_parameters``, plus prior medians. SVI starts its guide here and the samplers each chain.
        A Bayesian weight that no ``reset_parameters`` re-draws keeps the value the network was built
        with, whatever the seed, so runs do not reproduce and chains share their start: warned."""
        net = copy.deepcopy(self.net)
        before = {name: p.detach().clone() for name, p in net.named_parameters() if name in self.params}
        owned = set()  # weights a reset_parameters re-draws (constant ones, e.g. a norm's, come back equal)
        with torch.random.fork_rng(device_type="cuda"):
            torch.manual_seed(seed)
            for prefix, module in net.named_modules():
                if module is not net and hasattr(module, "reset_parameters"):
                    module.reset_parameters()
                    owned.update(f"{prefix}.{name}" for name, _ in module.named_parameters(recurse=False))
        values = {name: p.detach() for name, p in net.named_parameters() if name in self.params}
        kept = [name for name, v in values.items() if name not in owned and torch.equal(v, before[name])]
        if kept:
            warnings.warn(
                f"{', '.join(kept)}: no reset_parameters() re-draws these weights, so every seed and every chain "
                "starts them "
                "where the network was built; give their module a reset_parameters() (docs/extending.md)",
                stacklevel=2,
            )
        for name, d in self.likelihood.latent_prior().items():
            values[name] = d.icdf(torch.tensor(0.5)) if hasattr(d, "icdf") else d.mean
        return values

    def describe(self) -> dict[str, str]:
        """Human-readable names of the network, prior, likelihood (and the Bayesian subset, if any)."""
        net = f"{type(self.net).__name__}({self.net.extra_repr()})"
        out = {"model": net, "prior": repr(self.prior), "likelihood": repr(self.likelihood)}
        if self.fixed:
            out["bayesian_parameters"] = ", ".join(self.params)
        return out


def last_layer(net: nn.Module) -> str:
    """The name of the last module (in registration order) that owns parameters: for the usual
    feature-extractor-then-head networks, the output layer. ``BNN(..., expose=[last_layer(net)])``."""
    owners = [name for name, m in net.named_modules() if any(True for _ in m.parameters(recurse=False))]
    if not owners:
        raise BnnZooError("the network has no parameters")
    return owners[-1]


def _names(net: nn.Module, selection: Selection | None) -> list[str] | None:
    """A selection as strings: modules replaced by their names in ``net``."""
    if selection is None:
        return None
    if isinstance(selection, (str, nn.Module)):
        selection = [selection]
    names = {id(m): n for n, m in net.named_modules()}
    out = []
    for item in selection:
        if isinstance(item, nn.Module):
            if id(item) not in names:
                raise BnnZooError(f"expose/hide names a module that is not part of the network: {type(item).__name__}")
            item = names[id(item)]
        elif not isinstance(item, str):
            raise BnnZooError(f"expose/hide take parameter-name patterns, module names or modules, got {item!r}")
        out.append(item)
    return out


def _select(net: nn.Module, expose: Selection | None, hide: Selection | None) -> set[str]:
    """Names of the Bayesian parameters under an expose or hide selection (as poutine.block's)."""
    if expose is not None and hide is not None:
        raise BnnZooError("give expose (the Bayesian parameters) or hide (the point-estimated ones), not both")
    names = [n for n, _ in net.named_parameters()]
    for key in _names(net, expose) or _names(net, hide) or []:
        if not any(matches(n, key) for n in names):
            raise BnnZooError(f"{key!r} matches no parameter of the network; its parameters are: {', '.join(names)}")
    if expose is not None:
        return {n for n in names if any(matches(n, k) for k in _names(net, expose))}
    return {n for n in names if not any(matches(n, k) for k in _names(net, hide) or [])}


@contextmanager
def _bound(net: nn.Module, weights: dict[str, torch.Tensor]):
    """Run ``net`` with ``weights`` in place of its parameters.

    This is what ``torch.func.functional_call`` does, but functional_call refuses to run under
    ``torch.jit.trace``, which Pyro's ``jit_compile=True`` uses for the NUTS/HMC potential.
    """
    saved = {}
    try:
        for name, w in weights.items():
            module_name, _, attr = name.rpartition(".")
            module = local_noise.submodule(net, module_name)
            saved[name] = (module, attr, module._parameters[attr])
            module._parameters[attr] = w
        yield
    finally:
        for module, attr, param in saved.values():
            module._parameters[attr] = param


def _drop_data_dim(value: torch.Tensor, event_dim: int) -> torch.Tensor:
    if value.dim() > event_dim:
        return value.squeeze(value.dim() - event_dim - 1)
    return value
