"""The Laplace approximation (MacKay 1992): the MAP of the same BNN model, a Gaussian at it whose
precision is the generalised Gauss-Newton (GGN) matrix plus the prior precision, and the Laplace
log evidence, under the model's declared prior or (``optimize_prior=True``) a prior precision fitted
by type-II maximum likelihood, labelled so wherever it is reported.

Why not laplace-torch: it is the well-kept library for this (its API is the model here:
``subset_of_weights``, ``hessian_structure``, ``optimize_prior_precision``) and the reference the
tests compare with, but its requirements pull in torchvision, whose PyPI build does not import
against the CPU torch this project pins, so it cannot be a dependency (the manual install is in the
inference guide). The GGN, its diagonal and the KFAC blocks are written here for the bnn-zoo model
itself: its Normal prior per site, its learned-noise site, and its point-estimated parameters.

For a linear model with Gaussian noise the GGN is the exact Hessian and the Laplace posterior and
evidence are exact; a test checks both against the closed form, with the prior precision fixed and
fitted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.distributions import Independent, Normal, biject_to
from torch.func import functional_call, hessian, vmap
from tqdm.auto import tqdm

from bnn_zoo import saving
from bnn_zoo.bnn import BNN, last_layer
from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.io import bar_disabled
from bnn_zoo.likelihoods import Gaussian
from bnn_zoo.methods import Family, register
from bnn_zoo.posterior import Posterior, load_posterior
from bnn_zoo.priors import FanInNormal

MAX_FULL = 5000  # a full D x D precision in float64: 5000 weights is 200 MB


@register
@dataclass
class Laplace:
    """A Gaussian at the MAP of the BNN (GGN full, diagonal or Kronecker) with MacKay's evidence, and the
    prior precision and noise by type-II maximum likelihood.

    N(w*, (GGN + c P)^-1), with P the model's prior precision and c = 1 (the declared prior) or a scale
    fitted by type-II maximum likelihood of the Laplace evidence (MacKay 1992, eq. 4.29:
    log Z = log p(y | w*) + log p(w*) + D/2 log 2 pi - 1/2 log det(GGN + c P)).
    ``info["type_ii"]`` names what was fitted by type II ("" when nothing was: the evidence is then
    the declared model's).

    Args:
        subset: ``"all"`` Bayesian parameters, or ``"last_layer"`` (the network's last parametrised
            module; the others are held at the MAP, as point estimates).
        hessian: ``"full"`` GGN (up to 5000 weights), its ``"diag"``onal, ``"kron"`` (KFAC blocks
            per dense layer, which needs one prior scale per layer), or ``"auto"`` (the default): full up
            to 5000 weights, diag above (what works for any network).
        prior_precision: a fixed scale c of the model's prior precision (1: the model's prior as it is;
            any other value is reported as a changed prior); with ``optimize_prior`` it is the starting value.
        optimize_prior: opt-in type II: fit c by maximising the Laplace evidence at each MAP (post hoc, as
            laplace-torch's ``optimize_prior_precision``), and re-fit the MAP at the new c for ``rounds`` rounds
            (MacKay's iteration, secant steps); the round with the most evidence is kept. For a
            linear model this is type-II maximum likelihood exactly.
        rounds: MAP and prior-precision rounds when ``optimize_prior``.
        map_steps: Adam steps for the first round's MAP (then full-batch L-BFGS polishes it; later
            rounds start at the last MAP and use L-BFGS alone).
        lr: Adam's learning rate.
        batch_size: Adam's minibatch size (default: full batch).
        num_draws: draws kept for prediction and the InferenceData.
        predictive: ``"glm"`` evaluates draws through the network linearised at the MAP,
            f(x, w*) + J(x)(w - w*) (Immer et al. 2021; laplace-torch's default), or ``"nn"`` through the
            network itself, which with draws from the whole network's Laplace is known to underfit.
        seed: seeds the optimiser's minibatches and the draws.
        progress: show a progress bar.

    A learned Gaussian noise (``Gaussian.learned()``) is a hyperparameter here, fitted by type-II
    maximum likelihood with the prior precision (MacKay's evidence framework; laplace-torch also
    treats the noise as a hyperparameter): its prior is not used, and the evidence is conditional on it,
    so it is labelled type-II too.
    """

    # a recurrent network's prior at this method's defaults (bnn_zoo.priors.default_prior):
    # its prior precision is a Normal's
    recurrent_prior = FanInNormal()

    subset: Literal["all", "last_layer"] = "all"
    hessian: Literal["auto", "full", "diag", "kron"] = "auto"
    prior_precision: float = 1.0
    optimize_prior: bool = False
    rounds: int = 3
    map_steps: int = 2000
    lr: float = 1e-2
    batch_size: int | None = None
    num_draws: int = 1000
    predictive: Literal["glm", "nn"] = "glm"
    seed: int = 0
    progress: bool = True

    name = "laplace"
    family = Family.GAUSSIAN
    stores = "draws"
    evidence = ("evidence_laplace", "evidence_laplace_type_ii")
    reference = False
    copies = None
    draws = ("num_draws",)
    fits = "bnn"
    quick = {"map_steps": 200, "num_draws": 100}  # seconds on a small table (the conformance suite)

    def __post_init__(self):
        check_field_types(self)
        for name in ("rounds", "map_steps", "num_draws"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise BnnZooError(f"Laplace {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise BnnZooError(
                f"Laplace batch_size must be a whole number >= 1 or None (full batch), got {self.batch_size!r}"
            )
        if not (self.prior_precision > 0 and math.isfinite(self.prior_precision) and self.lr > 0):
            raise BnnZooError(f"Laplace needs prior_precision > 0 and lr > 0, got {self.prior_precision}, {self.lr}")

    def settings(self) -> dict:
        return {"method": self.name, **{k: getattr(self, k) for k in self.__dataclass_fields__ if k != "progress"}}

    def resolved(self, model: BNN, n: int) -> Laplace:
        """This method as it runs on ``model`` (its ``"auto"`` Hessian is chosen when the weights are counted)."""
        return self

    def run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        start = time.perf_counter()
        if model.likelihood.task == "language-model":
            raise BnnZooError(
                "Laplace needs the likelihood's Hessian per output; a language model's (N, T, V) outputs are too large"
            )
        target = _subset_model(model, self.subset)
        names = list(target.params)
        precision = _prior_precision(target, names)
        # every site and point estimate
        values = {k: v.double() for k, v in {**model.network_init(self.seed), **model.fixed}.items()}
        scale, history = float(self.prior_precision), []
        xd, yd = x.double(), y.double() if torch.is_floating_point(y) else y  # the MAP and the curvature in float64
        # A learned Gaussian noise is a hyperparameter here, fitted by type-II ML with the prior precision
        # (MacKay's evidence framework, his alpha and beta): at its MAP alone, 20 points drive it to 0.
        noise = Gaussian.site if isinstance(model.likelihood, Gaussian) and model.likelihood.scale is None else None
        # a network it cannot take fails now, not after the MAP
        _curvature(target, values, xd[:2], yd[:2], names, self.hessian)
        with torch.random.fork_rng(device_type="cuda"):
            torch.manual_seed(self.seed)
            previous, best = None, None  # (log scale, evidence gradient) of the last round; the best round
            for r in range(self.rounds if self.optimize_prior or noise else 1):
                # a later round starts at the last MAP: L-BFGS alone follows it to the new prior's
                values = _map(model, values, precision, scale, xd, yd, self, {noise} - {None}, adam=r == 0)
                curvature = _curvature(target, values, xd, yd, names, self.hessian)
                # Post-hoc type II at this MAP (laplace-torch's optimize_prior_precision): never below the start.
                posthoc = scale
                if noise:
                    posthoc, sigma = curvature.fit_scale_and_noise(
                        values, precision, scale, target, xd, yd, self.optimize_prior
                    )
                    values = {**values, noise: torch.tensor(sigma, dtype=torch.float64, device=xd.device)}
                    curvature = _curvature(target, values, xd, yd, names, self.hessian)  # the GGN at the new noise
                elif self.optimize_prior:
                    posthoc = curvature.fit_scale(values, precision, scale)
                log_lik = float(_log_likelihood(target, values, xd, yd))
                evidence = curvature.log_evidence({k: values[k] for k in names}, precision, posthoc, log_lik)
                history.append([posthoc, evidence])
                # For a network the MAP moves with the hyperparameters and a later round can end lower
                # (MacKay's iteration is exact only for linear models): keep the round with the most evidence.
                if best is None or evidence > best[0]:
                    best = (evidence, values, curvature, posthoc, log_lik)
                if r == self.rounds - 1 or not (self.optimize_prior or noise):
                    break
                if noise:
                    scale = posthoc
                    continue
                # The next MAP's scale: secant steps on d log Z / d log c across rounds, whose root is type-II
                # ML (exactly so for a linear model, where the MAP's own dependence on c drops out).
                log_c, grad = math.log(scale), curvature.scale_gradient(values, precision, scale)
                if abs(grad) < 1e-9:
                    break
                scale, previous = _secant_step(log_c, grad, previous, posthoc), (log_c, grad)
            evidence, values, curvature, scale, log_lik = best
            theta = {k: values[k] for k in names}
            draws = curvature.sample(theta, precision, scale, self.num_draws)
        fitted = target.with_fixed({k: values[k].to(x.dtype) for k in target.fixed})
        samples = {k: v[None] for k, v in draws.items()}
        for k in fitted.latent_shapes():
            if k not in samples:  # the learned noise: held at its type-II value
                samples[k] = values[k].to(x.dtype).expand(1, self.num_draws, *values[k].shape).clone()
        label = type_ii_label(scale, self.optimize_prior, float(values[noise]) if noise else None)
        info = {
            evidence_key(label): evidence,
            "prior_precision_scale": scale,
            "scale_and_evidence_by_round": history,
            "log_likelihood_at_map": log_lik,
            **({"noise_scale": float(values[noise]), "fitted_sites": [noise]} if noise else {}),
            "num_weights": sum(theta[k].numel() for k in names),
            "type_ii": label,
        }
        post = LaplacePosterior(
            fitted, x, y, samples, self.settings(), sample_stats={}, runtime_s=time.perf_counter() - start, info=info
        )
        post.map = {k: theta[k].to(x.dtype) for k in names}
        return post


def _secant_step(log_c: float, grad: float, previous: tuple | None, first: float) -> float:
    """The next round's prior-precision scale: a secant step on d log Z / d log c through this round's
    (log c, gradient) and the last's ``previous``, at most a factor e^2 either way (``first`` on the first round)."""
    if previous is None or grad == previous[1]:
        return first
    step = -grad * (log_c - previous[0]) / (grad - previous[1])
    return math.exp(log_c + max(-2.0, min(2.0, step)))


def evidence_key(type_ii: str) -> str:
    """The name of a Laplace evidence in ``info`` and metrics.json: of the declared model, or of the one
    type II changed (``type_ii`` says how)."""
    return "evidence_laplace_type_ii" if type_ii else "evidence_laplace"


def type_ii_label(scale: float, fitted: bool, noise: float | list[float] | None) -> str:
    """How the evidence's model differs from the declared one: "" when not at all, else e.g.
    "prior precision x 3.21 (type-II), noise sd 0.412 (type-II)" (one sd per target where the data's
    units differ by target); a scale set by hand says "(set)"."""
    parts = [f"prior precision x {scale:.3g} ({'type-II' if fitted else 'set'})"] if fitted or scale != 1.0 else []
    sds = noise if isinstance(noise, list) else [noise]
    parts += [f"noise sd {', '.join(f'{s:.3g}' for s in sds)} (type-II)"] if noise is not None else []
    return ", ".join(parts)


class LaplacePosterior(Posterior):
    """A Laplace posterior: draws of N(w*, (GGN + c P)^-1), evaluated through the network linearised
    at the MAP w* (``predictive="glm"``, the default) or through the network itself (``"nn"``)."""

    kind = "laplace"
    map: dict[str, torch.Tensor]

    def fitted_in(self, scaling):
        """Its evidence, MAP log-likelihood and type-II noise in the data's units as well."""
        super().fitted_in(scaling)
        if scaling is None or not scaling.scales_targets:
            return self
        info, n = self.info, len(self.y)
        key = evidence_key(info["type_ii"])
        info[key] = self.to_data_units(info[key], n)
        info["log_likelihood_at_map"] = self.to_data_units(info["log_likelihood_at_map"], n)
        info["scale_and_evidence_by_round"] = [
            [c, self.to_data_units(e, n)] for c, e in info["scale_and_evidence_by_round"]
        ]
        if "noise_scale" in info:  # one standardised sd: in the data's units, one per target
            sds = [info["noise_scale"] * s for s in scaling.y_std.reshape(-1).tolist()]
            info["noise_scale"] = sds[0] if len(sds) == 1 else sds
            info["type_ii"] = type_ii_label(
                info["prior_precision_scale"], self.settings["optimize_prior"], info["noise_scale"]
            )
        return self

    def _forward(self, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        if self.settings.get("predictive") == "nn":
            return super()._forward(weights, x)
        name = next(iter(self.map))
        batch = weights[name].shape[: weights[name].dim() - self.map[name].dim()]
        delta = {k: weights[k].reshape(-1, *self.map[k].shape) - self.map[k] for k in self.map}

        def f(w):
            return functional_call(self.model.net, {**self.model.fixed, **w}, (x,))

        jv = vmap(lambda d: torch.func.jvp(f, (self.map,), (d,))[1])(delta)
        return (f(self.map) + jv).reshape(*batch, *jv.shape[1:])

    def mean_weights(self) -> dict[str, torch.Tensor]:
        """The MAP (the Gaussian's mean) and the other latent sites' draw means."""
        return {**super().mean_weights(), **{k: v[None] for k, v in self.map.items()}}

    def to(self, device: torch.device | str) -> LaplacePosterior:
        other = super().to(device)
        other.map = {k: v.to(device) for k, v in self.map.items()}
        return other

    def _extra_state(self) -> dict:
        return {"map": self.map}


@saving.register_loader("laplace")
def _load(header: dict, state: dict, model=None, guide=None) -> LaplacePosterior:
    post = load_posterior(header, state, model=model, cls=LaplacePosterior)
    post.map = state["map"]
    return post


def _subset_model(model: BNN, subset: str) -> BNN:
    if subset == "all":
        return model
    return BNN(model.net, model.prior, model.likelihood, expose=[last_layer(model.net)])


def _prior_precision(model: BNN, names: list[str]) -> dict[str, torch.Tensor]:
    """1 / s^2 per weight of each site: the Laplace prior must be a zero-mean Normal (its Hessian)."""
    out = {}
    for name in names:
        d = model.site_prior(name)
        base = d.base_dist if isinstance(d, Independent) else d
        if not (isinstance(base, Normal) and torch.all(base.loc == 0)):
            raise BnnZooError(
                f"Laplace needs a zero-mean Normal prior on every weight it covers; {name} has {model.prior!r}: use "
                "--prior fanin or normal"
            )
        out[name] = (1.0 / base.scale**2).expand(model.params[name].shape).double()
    return out


def _log_likelihood(
    model: BNN, values: dict, x: torch.Tensor, y: torch.Tensor, scale_to: int | None = None
) -> torch.Tensor:
    """sum_n log p(y_n | x_n, w) at ``values`` (scaled to ``scale_to`` points for a minibatch)."""
    weights = {k: values[k] for k in model.net.state_dict() if k in values}
    f = functional_call(model.net, weights, (x,))
    latent = {k: values[k] for k in model.likelihood.latent_prior()}
    total = model.likelihood.distribution(f, latent).log_prob(y).sum()
    return total * (scale_to / x.shape[0]) if scale_to else total


def _map(
    model: BNN,
    values: dict,
    precision: dict,
    scale: float,
    x,
    y,
    settings: Laplace,
    hold: set = frozenset(),
    adam: bool = True,
) -> dict:
    """The MAP of log p(y | w) + log p(w) (the prior on the Laplace sites scaled by ``scale``; the
    point estimates have none), by Adam (unless ``adam`` is false) and then full-batch L-BFGS, in
    unconstrained coordinates. The sites in ``hold`` (a noise fitted by type II) keep their values."""
    transforms = {k: biject_to(d.support) for k, d in model.likelihood.latent_prior().items() if k not in hold}
    free = {
        k: (transforms[k].inv(v) if k in transforms else v).detach().clone().requires_grad_(True)
        for k, v in values.items()
        if k not in hold
    }
    held = {k: values[k] for k in hold}
    others = [k for k in model.params if k not in precision]

    def loss(index=None):
        vals = {**held, **{k: transforms[k](v) if k in transforms else v for k, v in free.items()}}
        xb, yb = (x, y) if index is None else (x[index], y[index])
        log_joint = _log_likelihood(model, vals, xb, yb, scale_to=x.shape[0])
        log_joint = log_joint - 0.5 * scale * sum((precision[k] * free[k] ** 2).sum() for k in precision)
        log_joint = log_joint + sum(model.site_prior(k).log_prob(vals[k]) for k in others)
        for k, t in transforms.items():
            prior = model.likelihood.latent_prior()[k]
            log_joint = log_joint + prior.log_prob(vals[k]) + t.log_abs_det_jacobian(free[k], vals[k]).sum()
        return -log_joint

    optim = torch.optim.Adam(free.values(), lr=settings.lr)
    n = x.shape[0]
    batch = settings.batch_size if settings.batch_size and settings.batch_size < n else None
    steps = settings.map_steps if adam else 0
    for _ in tqdm(range(steps), desc="Laplace MAP", disable=bar_disabled(settings.progress)):
        optim.zero_grad()
        loss(None if batch is None else torch.randint(n, (batch,))).backward()
        optim.step()
    _minimise(list(free.values()), loss)
    return {**held, **{k: (transforms[k](v) if k in transforms else v).detach() for k, v in free.items()}}


def _minimise(tensors: list[torch.Tensor], loss) -> None:
    """Full-batch L-BFGS with a strong-Wolfe line search on ``loss()``, in place: polishes a MAP, fits
    hyperparameters to machine precision."""
    optim = torch.optim.LBFGS(
        tensors, max_iter=200, tolerance_grad=1e-10, tolerance_change=1e-14, line_search_fn="strong_wolfe"
    )

    def closure():
        optim.zero_grad()
        value = loss()
        value.backward()
        return value

    optim.step(closure)


def _output_hessians(model: BNN, f: torch.Tensor, y: torch.Tensor, latent: dict) -> torch.Tensor:
    """Lambda_n = d^2 (-log p(y_n | f_n)) / d f_n^2 for every datum: (N, out, out); the likelihood's Fisher
    information where it states one (a heteroscedastic Gaussian, whose Hessian is indefinite)."""
    if hasattr(model.likelihood, "fisher"):
        return model.likelihood.fisher(f, latent)

    def nll(fn, yn):
        return -model.likelihood.distribution(fn[None], latent).log_prob(yn[None]).sum()

    return vmap(hessian(nll))(f, y)


class _Curvature:
    """The GGN of the Laplace sites at the MAP in one of three structures, with what the evidence, the
    prior-precision fit and the draws need."""

    def __init__(self, names, shapes, kind, full=None, diag=None, kron=None):
        self.names, self.shapes, self.kind = names, shapes, kind
        self.full, self.diag, self.kron = full, diag, kron

    def _flat(self, tensors: dict) -> torch.Tensor:
        return torch.cat([tensors[k].reshape(-1).double() for k in self.names])

    def _unflat(self, vector: torch.Tensor) -> dict:
        out, i = {}, 0
        for k in self.names:
            size = math.prod(self.shapes[k])
            out[k] = vector[..., i : i + size].reshape(*vector.shape[:-1], *self.shapes[k])
            i += size
        return out

    def _eigen(self, precision, scale):
        """Eigenvalues of the posterior precision (GGN + scale P) relative to P, for every block, and
        what sampling needs; the full GGN's eigendecomposition is computed once."""
        p = self._flat(precision)
        if self.kind == "full":
            if getattr(self, "_full_eigh", None) is None:
                root = p.rsqrt()
                self._full_eigh = (*torch.linalg.eigh(root[:, None] * self.full * root[None, :]), root)
            e, q, root = self._full_eigh
            return e.clamp_min(0) + scale, (q, root), p.log().sum()
        if self.kind == "diag":
            return self.diag / p + scale, None, p.log().sum()
        values, logdet_p = [], 0.0
        for layer in self.kron:
            lam = layer["precision"]
            values.append((layer["g_eig"][:, None] * layer["a_eig"][None, :]).clamp_min(0) / lam + scale)
            logdet_p = logdet_p + layer["size"] * math.log(lam)
        return values, None, logdet_p

    def log_evidence(self, theta, precision, scale, log_lik) -> float:
        """MacKay's Laplace evidence, eq. 4.29 of his 1992 thesis, with the prior N(0, (scale P)^-1)."""
        w, p = self._flat(theta), self._flat(precision)
        d = w.numel()
        eig, _, logdet_p = self._eigen(precision, scale)
        eigs = torch.cat([e.reshape(-1) for e in eig]) if isinstance(eig, list) else eig
        log_prior = 0.5 * (torch.log(scale * p).sum() - scale * (p * w**2).sum() - d * math.log(2 * math.pi))
        log_det = eigs.log().sum() + logdet_p  # det(GGN + s P) = det(P) det(P^-1/2 GGN P^-1/2 + s)
        return float(log_lik + log_prior + 0.5 * d * math.log(2 * math.pi) - 0.5 * log_det)

    def _scale_objective(self, values, precision):
        """The terms of the evidence that depend on the prior-precision scale, as a function of log scale."""
        w, p = self._flat({k: values[k] for k in self.names}), self._flat(precision)
        eig, _, _ = self._eigen(precision, 0.0)
        eigs = (torch.cat([e.reshape(-1) for e in eig]) if isinstance(eig, list) else eig).detach()
        return lambda ls: 0.5 * (w.numel() * ls - ls.exp() * (p * w**2).sum()) - 0.5 * torch.log(eigs + ls.exp()).sum()

    def scale_gradient(self, values, precision, scale) -> float:
        """d log Z / d log scale at this MAP."""
        log_s = torch.tensor(
            math.log(scale), dtype=torch.float64, device=precision[self.names[0]].device, requires_grad=True
        )
        return float(torch.autograd.grad(self._scale_objective(values, precision)(log_s), log_s)[0])

    def fit_scale_and_noise(self, values, precision, scale, model, x, y, fit_scale: bool) -> tuple[float, float]:
        """MacKay's re-estimation step for a Gaussian likelihood: the prior-precision scale and the noise
        sd maximising the Laplace evidence at this MAP, using that the GGN scales as 1 / sigma^2."""
        sigma = float(values[Gaussian.site])
        w, p = self._flat({k: values[k] for k in self.names}), self._flat(precision)
        eig, _, _ = self._eigen(precision, 0.0)
        unit = (
            torch.cat([e.reshape(-1) for e in eig]) if isinstance(eig, list) else eig
        ).detach() * sigma**2  # the GGN at sigma = 1
        weights = {k: values[k] for k in model.net.state_dict() if k in values}
        sse = float(((y - functional_call(model.net, weights, (x,))) ** 2).sum())
        params = torch.tensor(
            [math.log(scale), math.log(sigma)], dtype=torch.float64, device=w.device, requires_grad=True
        )

        def negative_evidence():
            ls, lsig = (
                params[0] if fit_scale else torch.tensor(math.log(scale), dtype=torch.float64, device=w.device),
                params[1],
            )
            log_lik = -y.numel() * lsig - sse / (2 * torch.exp(2 * lsig))
            log_prior = 0.5 * (w.numel() * ls - ls.exp() * (p * w**2).sum())
            return -(log_lik + log_prior - 0.5 * torch.log(unit * torch.exp(-2 * lsig) + ls.exp()).sum())

        _minimise([params], negative_evidence)
        return (math.exp(params[0].item()) if fit_scale else scale), math.exp(params[1].item())

    def fit_scale(self, values, precision, scale) -> float:
        """The prior-precision scale maximising the Laplace evidence at this MAP (over its logarithm)."""
        objective = self._scale_objective(values, precision)
        log_s = torch.tensor(
            math.log(scale), dtype=torch.float64, device=precision[self.names[0]].device, requires_grad=True
        )
        _minimise([log_s], lambda: -objective(log_s))
        return log_s.exp().item()

    def sample(self, theta, precision, scale, num) -> dict:
        """``num`` draws of N(theta, (GGN + scale P)^-1), float32 like the model."""
        mean = self._flat(theta)
        eig, extra, _ = self._eigen(precision, scale)
        if self.kind == "full":
            q, root = extra
            z = torch.randn(num, mean.numel(), dtype=torch.float64, device=mean.device)
            draws = mean + root * ((z * eig.rsqrt()) @ q.T)
            return {k: v.float() for k, v in self._unflat(draws).items()}
        if self.kind == "diag":
            p = self._flat(precision)
            draws = mean + torch.randn(num, mean.numel(), dtype=torch.float64, device=mean.device) * (eig * p).rsqrt()
            return {k: v.float() for k, v in self._unflat(draws).items()}
        out = {}
        for layer, e in zip(self.kron, eig):
            m = torch.cat([theta[layer["weight"]].double(), theta[layer["bias"]].double()[:, None]], 1)  # (out, in + 1)
            z = torch.randn(num, *m.shape, dtype=torch.float64, device=m.device) * (e * layer["precision"]).rsqrt()
            draws = m + layer["q_g"] @ z @ layer["q_a"].T
            out[layer["weight"]], out[layer["bias"]] = draws[..., :-1].float(), draws[..., -1].float()
        return out


def _curvature(model: BNN, values: dict, x, y, names: list[str], kind: str) -> _Curvature:
    try:
        return _ggn(model, values, x, y, names, kind)
    except RuntimeError as exc:
        if "vmap" not in str(exc):
            raise
        raise BnnZooError(
            "Laplace takes per-example Jacobians under torch.func.vmap, which this network does not support (its "
            "forward reads tensor values, as the recurrent models' token lookups do); use SVI or SG-MCMC"
        ) from None


def _ggn(model: BNN, values: dict, x, y, names: list[str], kind: str) -> _Curvature:
    shapes = {k: model.params[k].shape for k in names}
    latent = {k: values[k] for k in model.likelihood.latent_prior()}
    fixed = {k: v for k, v in values.items() if k in model.net.state_dict() and k not in names}
    if kind == "kron":
        return _Curvature(names, shapes, kind, kron=_kron(model, values, x, y, names, latent))
    d = sum(math.prod(s) for s in shapes.values())
    if kind == "auto":
        kind = "full" if d <= MAX_FULL else "diag"
    if kind == "full" and d > MAX_FULL:
        raise BnnZooError(
            f"a full Hessian over {d} weights needs a {d} x {d} matrix; use hessian='kron' or 'diag', or "
            "subset='last_layer'"
        )

    def f_of(theta_flat, xn):
        theta, i = {}, 0
        for k in names:
            size = math.prod(shapes[k])
            theta[k] = theta_flat[i : i + size].reshape(shapes[k])
            i += size
        return functional_call(model.net, {**fixed, **theta}, (xn[None],))[0]

    theta_flat = torch.cat([values[k].reshape(-1) for k in names])
    with torch.no_grad():
        f = functional_call(model.net, {**fixed, **{k: values[k] for k in names}}, (x,))
    lam = _output_hessians(model, f, y, latent).double()
    out_dim = f.shape[-1]
    chunk = max(1, int(2e7 // (out_dim * d)))
    full = torch.zeros(d, d, dtype=torch.float64, device=x.device) if kind == "full" else None
    diag = torch.zeros(d, dtype=torch.float64, device=x.device) if kind == "diag" else None
    jac = vmap(torch.func.jacrev(f_of), in_dims=(None, 0))
    for i in range(0, x.shape[0], chunk):
        j = jac(theta_flat, x[i : i + chunk]).double()  # (n, out, D)
        lj = lam[i : i + chunk] @ j
        if kind == "full":
            full += torch.einsum("nod,noe->de", j, lj)
        else:
            diag += (j * lj).sum((0, 1))
    return _Curvature(names, shapes, kind, full=full, diag=diag)


def _kron(model: BNN, values, x, y, names, latent) -> list[dict]:
    """KFAC blocks (A over a dense layer's inputs with a 1 for the bias, G over its outputs) of the
    GGN: sum_n a_n a_n^T (x) sum_n g_n g_n^T / N, with g_n the backpropagated columns of Lambda_n^1/2
    (Martens & Grosse 2015; exact for a linear model with Gaussian noise)."""
    layers = {}
    for name, module in model.net.named_modules():
        if isinstance(module, nn.Linear) and f"{name}.weight" in names:
            if module.bias is None or f"{name}.bias" not in names:
                raise BnnZooError(f"hessian='kron' needs the weight and bias of {name} both Bayesian")
            layers[name] = module
    covered = {f"{n}.{p}" for n in layers for p in ("weight", "bias")}
    if covered != set(names):
        raise BnnZooError(
            f"hessian='kron' covers dense layers only; {sorted(set(names) - covered)} are not; use 'diag' or "
            "subset='last_layer'"
        )
    precision = _prior_precision(model, names)
    inputs, outputs = {}, {}

    def record(name):
        def hook(module, args, out):
            inputs[name], outputs[name] = args[0], out

        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in layers.items()]
    try:
        params = {k: v.detach().requires_grad_(True) for k, v in values.items() if k in model.net.state_dict()}
        f = functional_call(model.net, params, (x,))
    finally:
        for h in hooks:
            h.remove()
    lam = _output_hessians(model, f.detach(), y, latent).double()
    evals, evecs = torch.linalg.eigh(lam)
    root = evecs * evals.clamp_min(0).sqrt()[:, None, :]  # Lambda_n^1/2 columns: (N, out, out)
    blocks = []
    for name in layers:
        a = torch.cat([inputs[name].detach(), torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1).double()
        g_cov = torch.zeros(outputs[name].shape[-1], outputs[name].shape[-1], dtype=torch.float64, device=x.device)
        for o in range(f.shape[-1]):  # one backward per output column gives every datum's g_n
            (grad,) = torch.autograd.grad((f * root[:, :, o].to(f.dtype)).sum(), outputs[name], retain_graph=True)
            g_cov += grad.double().T @ grad.double()
        lams = {float(precision[f"{name}.weight"].unique()[0])} | {float(v) for v in precision[f"{name}.bias"].unique()}
        if len(lams) != 1 or len(precision[f"{name}.weight"].unique()) != 1:
            raise BnnZooError(
                f"hessian='kron' needs one prior scale for all of {name} (e.g. priors.Normal(s)); use 'diag' or 'full'"
            )
        a_eig, q_a = torch.linalg.eigh(a.T @ a)
        g_eig, q_g = torch.linalg.eigh(g_cov / x.shape[0])
        blocks.append(
            {
                "weight": f"{name}.weight",
                "bias": f"{name}.bias",
                "a_eig": a_eig,
                "q_a": q_a,
                "g_eig": g_eig,
                "q_g": q_g,
                "precision": lams.pop(),
                "size": a.shape[1] * g_cov.shape[0],
            }
        )
    return blocks
