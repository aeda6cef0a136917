"""GPyTorch Gaussian processes with the BNN interface: ``bnn_zoo.fit(GP(...), x, y, TypeII(...))`` returns a
posterior with ``predict``, ``to_inference_data`` and the same metrics, plus its evidence.

- Regression: exact GP with a learned Gaussian noise; the log marginal likelihood is exact (Cholesky
  in float64, never GPyTorch's CG/Lanczos estimates).
- Classification: variational GP (Hensman et al. 2015) with learned inducing points; Bernoulli (probit)
  or softmax over C independent latent functions; its evidence is the ELBO.
- Kernels: RBF and Matern-5/2 (ARD, scaled), and "nngp", the infinite-width limit of the bnn-zoo MLP
  with ReLU units under a fan-in prior (Neal 1996; Cho & Saul 2009; Lee et al. 2018).
Hyperparameters (and variational parameters) are fitted by type-II maximum likelihood with Adam.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import gpytorch
import numpy as np
import torch
import xarray as xr
from tqdm.auto import tqdm

from bnn_zoo import likelihoods, priors, saving
from bnn_zoo.errors import BnnZooError, check_field_types, checked
from bnn_zoo.io import bar_disabled
from bnn_zoo.methods import Family, register
from bnn_zoo.posterior import InDataUnits, Prediction, common_attrs, function_space_inference_data

MAX_EXACT = 10_000  # an exact GP's Cholesky is O(N^3) time and O(N^2) float64 memory (10k: 0.8 GB)


class NNGPKernel(gpytorch.kernels.Kernel):
    """Covariance of a ReLU MLP's output with ``depth`` hidden layers of infinite width, weights
    N(0, weight_var / fan_in) and biases N(0, bias_var) (``priors.FanInNormal(gain, bias_scale)`` is
    weight_var = gain^2, bias_var = bias_scale^2). The arc-cosine recursion (Cho & Saul 2009):
        K_0(x, x') = bias_var + weight_var x.x' / d,
        K_l(x, x') = bias_var + weight_var sqrt(K_{l-1}(x, x) K_{l-1}(x', x')) (sin t + (pi - t) cos t) / (2 pi),
    with cos t = K_{l-1}(x, x') / sqrt(K_{l-1}(x, x) K_{l-1}(x', x')); the output's covariance is K_depth.
    GPyTorch has no such kernel (its ArcKernel is a different one), hence this class.
    """

    def __init__(self, depth: int = 1, weight_var: float = 1.0, bias_var: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.depth = depth
        for name, value in (("weight_var", weight_var), ("bias_var", bias_var)):
            self.register_parameter(f"raw_{name}", torch.nn.Parameter(torch.zeros(*self.batch_shape, 1)))
            self.register_constraint(f"raw_{name}", gpytorch.constraints.Positive())
            constraint = getattr(self, f"raw_{name}_constraint")
            getattr(self, f"raw_{name}").data.fill_(float(constraint.inverse_transform(torch.tensor(float(value)))))

    @property
    def weight_var(self):
        return self.raw_weight_var_constraint.transform(self.raw_weight_var)

    @property
    def bias_var(self):
        return self.raw_bias_var_constraint.transform(self.raw_bias_var)

    def forward(self, x1, x2, diag=False, **params):
        w, b = self.weight_var[..., None], self.bias_var[..., None]  # broadcast over (n,) or (n, m)
        d = x1.shape[-1]
        k11 = b[..., 0] + w[..., 0] * (x1**2).sum(-1) / d
        k22 = b[..., 0] + w[..., 0] * (x2**2).sum(-1) / d
        k12 = k11 if diag else b + w * (x1 @ x2.transpose(-1, -2)) / d
        for _ in range(self.depth):
            if diag:  # t = 0: sin t + (pi - t) cos t = pi
                k12 = k11 = b[..., 0] + w[..., 0] * k11 / 2
                continue
            norm = (k11[..., :, None] * k22[..., None, :]).sqrt()
            cos = (k12 / norm).clamp(-1 + 1e-7, 1 - 1e-7)  # arccos has an infinite slope at +-1
            t = torch.arccos(cos)
            k12 = b + w * norm * (torch.sin(t) + (math.pi - t) * cos) / (2 * math.pi)
            k11, k22 = b[..., 0] + w[..., 0] * k11 / 2, b[..., 0] + w[..., 0] * k22 / 2
        return k12


@saving.allow
class GP:
    """A Gaussian process baseline, fitted with :class:`TypeII` through ``bnn_zoo.fit``.

    Args:
        kernel: ``"rbf"``, ``"matern52"`` (both scaled, ARD by default) or ``"nngp"`` (the infinite-width
            ReLU MLP's kernel).
        likelihood: a bnn-zoo ``Gaussian`` (default; its noise is learned whatever scale it carries),
            ``Bernoulli`` or ``Categorical``.
        num_classes: latent functions of a ``Categorical`` GP.
        num_inducing: inducing points of a classification GP.
        depth: hidden layers of the MLP whose limit the nngp kernel is.
        prior: a ``FanInNormal`` giving the nngp kernel's initial weight and bias variances (type II tunes them).
        ard: one length-scale per input column.
    """

    @checked
    def __init__(
        self,
        kernel: Literal["rbf", "matern52", "nngp"] = "rbf",
        likelihood: likelihoods.Likelihood | None = None,
        num_classes: int | None = None,
        num_inducing: int = 128,
        depth: int = 1,
        prior: priors.FanInNormal | None = None,
        ard: bool = True,
    ):
        self.kernel, self.ard, self.depth, self.num_inducing = kernel, ard, depth, num_inducing
        self.likelihood = likelihood if likelihood is not None else likelihoods.Gaussian.learned()
        supported = (likelihoods.Gaussian, likelihoods.Bernoulli, likelihoods.Categorical)
        if isinstance(self.likelihood, likelihoods.Tokens) or not isinstance(self.likelihood, supported):
            raise BnnZooError(f"a GP takes a Gaussian, Bernoulli or Categorical likelihood, got {self.likelihood!r}")
        if isinstance(self.likelihood, likelihoods.Categorical) and not (
            isinstance(num_classes, int) and num_classes >= 2
        ):
            raise BnnZooError("a Categorical GP needs num_classes >= 2 (one latent function per class)")
        self.num_classes = num_classes if isinstance(self.likelihood, likelihoods.Categorical) else None
        self.prior = prior if prior is not None else priors.FanInNormal()
        if kernel == "nngp" and not isinstance(self.prior, priors.FanInNormal):
            raise BnnZooError(
                "the nngp kernel is the limit of a fan-in prior; pass prior=bnn_zoo.priors.FanInNormal(gain, "
                "bias_scale)"
            )
        if not (isinstance(depth, int) and depth >= 0 and isinstance(num_inducing, int) and num_inducing >= 1):
            raise BnnZooError(f"GP needs an integer depth >= 0 and num_inducing >= 1, got {depth}, {num_inducing}")

    in_features = None  # any number of input columns

    @property
    def out_features(self) -> int:
        return self.num_classes or 1

    @property
    def task(self) -> str:
        return self.likelihood.task

    def describe(self) -> dict[str, str]:
        kernel = (
            f"nngp, depth={self.depth}, {self.prior!r}"
            if self.kernel == "nngp"
            else f"{self.kernel}{', ard' if self.ard else ''}"
        )
        return {
            "model": f"GP({kernel})",
            "prior": "GP",
            "likelihood": repr(self.likelihood) if self.task == "classification" else "Gaussian(learned)",
        }

    def covariance(self, d: int, batch_shape: torch.Size | None = None):
        """The kernel for d input columns (a batch of ``batch_shape`` independent ones for several classes)."""
        batch_shape = batch_shape or torch.Size()
        if self.kernel == "nngp":  # its weight and bias variances already scale the output
            return NNGPKernel(self.depth, self.prior.gain**2, self.prior.bias_scale**2, batch_shape=batch_shape)
        ard = d if self.ard else None
        base = (
            gpytorch.kernels.RBFKernel(ard_num_dims=ard, batch_shape=batch_shape)
            if self.kernel == "rbf"
            else gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=ard, batch_shape=batch_shape)
        )
        return gpytorch.kernels.ScaleKernel(base, batch_shape=batch_shape)

    def build(self, x, y):
        """The GPyTorch model and likelihood for this data (float64)."""
        if self.task == "regression":
            if len(x) > MAX_EXACT:
                raise BnnZooError(
                    f"an exact GP on {len(x)} points needs an O(N^3) Cholesky; subsample to at most {MAX_EXACT} points"
                )
            lik = gpytorch.likelihoods.GaussianLikelihood()
            return _ExactGP(x, y[:, 0], lik, self.covariance(x.shape[1])).double(), lik.double()
        g = torch.Generator().manual_seed(0)
        inducing = x[torch.randperm(len(x), generator=g)[: self.num_inducing]].clone()
        if self.num_classes is None:
            return _VariationalGP(
                inducing, self.covariance(x.shape[1]), None
            ).double(), gpytorch.likelihoods.BernoulliLikelihood().double()
        c = self.num_classes
        module = _VariationalGP(
            inducing.expand(c, *inducing.shape).clone(), self.covariance(x.shape[1], torch.Size([c])), c
        )
        return module.double(), gpytorch.likelihoods.SoftmaxLikelihood(num_classes=c, mixing_weights=False).double()


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, covariance):
        super().__init__(x, y, likelihood)
        self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), covariance

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class _VariationalGP(gpytorch.models.ApproximateGP):
    """One latent function, or ``num_classes`` independent ones (a batch of GPs presented as tasks)."""

    def __init__(self, inducing, covariance, num_classes):
        batch = torch.Size([num_classes]) if num_classes else torch.Size()
        q = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[-2], batch_shape=batch)
        strategy = gpytorch.variational.VariationalStrategy(self, inducing, q, learn_inducing_locations=True)
        if num_classes:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(strategy, num_tasks=num_classes)
        super().__init__(strategy)
        self.mean_module, self.covar_module = gpytorch.means.ConstantMean(batch_shape=batch), covariance

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@register
@dataclass
class TypeII:
    """Type-II maximum likelihood: Adam on the negative log marginal likelihood (regression; Rasmussen &
    Williams 2006, eq. 5.8) or the negative variational ELBO (classification; Hensman et al. 2015).

    Args:
        steps: full-batch Adam steps.
        lr: Adam's learning rate.
        seed: seeds torch before the GP is built.
        progress: show a progress bar.
    """

    steps: int = 300
    lr: float = 0.05
    seed: int = 0
    progress: bool = True

    name = "gp"
    family = Family.GAUSSIAN
    stores = "draws"
    evidence = ("log_marginal_likelihood", "elbo")
    reference = False
    copies = None
    draws = (1000,)
    fits = "gp"
    quick = {"steps": 30}  # seconds on a small table (the conformance suite)

    def __post_init__(self):
        check_field_types(self)
        if not (isinstance(self.steps, int) and self.steps > 0 and self.lr > 0):
            raise BnnZooError(f"TypeII needs a positive integer steps and lr > 0, got {self.steps}, {self.lr}")

    def settings(self) -> dict:
        return {"method": self.name, "steps": self.steps, "lr": self.lr, "seed": self.seed}

    def run(self, gp, x, y) -> GPPosterior:
        if not isinstance(gp, GP):
            raise BnnZooError("TypeII fits a bnn_zoo.baselines.GP; fit BNNs with SVI, NUTS or HMC")
        start = time.perf_counter()
        torch.manual_seed(self.seed)
        xd, yd = x.double(), y.double() if gp.task == "regression" else y.long()
        module, lik = gp.build(xd, yd)
        module.train(), lik.train()
        objective = (
            gpytorch.mlls.ExactMarginalLogLikelihood(lik, module)
            if gp.task == "regression"
            else gpytorch.mlls.VariationalELBO(lik, module, num_data=len(x))
        )
        target = yd[:, 0] if gp.task == "regression" else (yd.double() if gp.num_classes is None else yd)
        params = list({id(p): p for p in [*module.parameters(), *lik.parameters()]}.values())
        optim = torch.optim.Adam(params, lr=self.lr)
        losses, stop_reason = [], ""
        with _exact(), warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
            for step in tqdm(range(self.steps), desc=f"GP {gp.kernel} type-II", disable=bar_disabled(self.progress)):
                optim.zero_grad()
                loss = -objective(module(xd), target) * len(x)  # GPyTorch divides by N
                if not torch.isfinite(loss):
                    stop_reason = f"loss became {loss.item()} at step {step}"
                    break
                loss.backward()
                optim.step()
                losses.append(loss.item())
        if stop_reason:
            warnings.warn(f"GP type-II stopped early: {stop_reason}; lower the learning rate", stacklevel=2)
        module.eval(), lik.eval()
        return GPPosterior(
            gp,
            module,
            lik,
            x,
            y,
            {**self.settings(), "kernel": gp.kernel},
            torch.tensor(losses),
            time.perf_counter() - start,
            {"stop_reason": stop_reason},
        )


def _exact():
    """Cholesky for every solve and log-determinant: GPyTorch switches to CG/Lanczos above 800 points."""
    return gpytorch.settings.max_cholesky_size(MAX_EXACT + 1)


class GPPosterior(InDataUnits):
    """A fitted GP with the Posterior interface: ``predict`` gives draws of the latent function (and, for
    a Bernoulli, its probit link rewritten as logits), so every metric and plot applies unchanged. Fitted
    on standardised data (``scaling``), it takes and gives the data's units as a BNN's Posterior does."""

    method = "gp"
    guide = None
    num_chains = 1

    def __init__(self, gp, module, gp_likelihood, x, y, settings, losses, runtime_s, info):
        self.model, self.module, self.gp_likelihood = gp, module, gp_likelihood
        self.x, self.y, self.settings, self.runtime_s, self.info = x, y, settings, runtime_s, info
        self.sample_stats = {"loss": losses}
        if gp.task == "regression":
            self.noise_scale = float(gp_likelihood.noise.detach().sqrt())
            self.likelihood = likelihoods.Gaussian(self.noise_scale)
        else:
            self.likelihood = likelihoods.Categorical() if gp.num_classes else likelihoods.Bernoulli()

    def hyperparameters(self) -> dict[str, list]:
        """Every fitted hyperparameter in its natural (constrained) units, by GPyTorch's name."""
        out, seen = {}, set()
        for part in (self.module, self.gp_likelihood):  # an exact GP holds its likelihood: skip what was seen
            raw = dict(part.named_parameters())
            for name, _, constraint in part.named_parameters_and_constraints():
                if id(raw[name]) in seen or "variational" in name or "inducing" in name:
                    continue
                seen.add(id(raw[name]))
                value = constraint.transform(raw[name]) if constraint is not None else raw[name]
                out[name.replace("raw_", "")] = value.detach().reshape(-1).tolist()
        return out

    def latent(self, x):
        """Posterior marginals of the latent function at x: mean and variance, each (N, outputs), float64."""
        return self._latent(self._inputs(x))

    def _latent(self, x):
        with torch.no_grad(), _exact(), warnings.catch_warnings():
            # predicting at the training inputs is intended
            warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
            f = self.module(x.double())
        mean, var = f.mean, f.variance
        return (mean[:, None], var[:, None]) if mean.dim() == 1 else (mean, var)

    @checked
    def predict(self, x, num_samples: int | None = None, at_mean: bool = False) -> Prediction:
        """``num_samples`` (default 1000) draws of the latent function at each x from its posterior
        marginal (seeded: the same call gives the same draws); ``at_mean=True`` is one draw at the mean."""
        return Prediction(self._draws(self._inputs(x), num_samples, at_mean), {}, self.likelihood, self.scaling)

    def _draws(self, x, num_samples: int | None = None, at_mean: bool = False) -> torch.Tensor:
        """Latent draws at inputs as the GP sees them (standardised when the fit was)."""
        mean, var = self._latent(x)
        if at_mean:
            f = mean[None]
        else:
            g = torch.Generator().manual_seed(int(self.settings.get("seed", 0)))
            f = mean + var.sqrt() * torch.randn(num_samples or 1000, *mean.shape, generator=g, dtype=mean.dtype)
        if isinstance(
            self.likelihood, likelihoods.Bernoulli
        ):  # probit link: p = Phi(f) = sigmoid(log Phi(f) - log Phi(-f))
            f = torch.special.log_ndtr(f) - torch.special.log_ndtr(-f)
        return f.to(self.x.dtype)

    def predictive_mean(self, x, num_samples: int | None = None):
        return self.predict(x, num_samples).mean

    def own_evidence(self, num_samples: int = 1000) -> dict[str, float]:
        """A regression's exact ``log_marginal_likelihood``; a classifier's ``elbo`` and ``elbo_se``."""
        if self.model.task == "regression":
            return {"log_marginal_likelihood": self.log_marginal_likelihood()}
        return dict(zip(("elbo", "elbo_se"), self.elbo(num_samples=num_samples)))

    def noise_and_bound(self) -> tuple[float, float]:
        """(the fitted noise variance, its constraint's lower bound: GPyTorch's ``GreaterThan(1e-4)``), on the
        targets as the GP was fitted (standardised by default); regression only
        (:class:`~bnn_zoo.protocols.BoundsNoise`)."""
        constraint = self.gp_likelihood.noise_covar.raw_noise_constraint
        return float(self.gp_likelihood.noise.detach().max()), float(constraint.lower_bound)

    def log_marginal_likelihood(self) -> float:
        """Exact log p(y | X, hyperparameters) of the training targets (regression only), in nats, in the
        data's units."""
        if self.model.task != "regression":
            raise BnnZooError("a classification GP has no closed-form marginal likelihood; its evidence is elbo()")
        self.module.train(), self.gp_likelihood.train()
        try:
            with torch.no_grad(), _exact():
                mll = gpytorch.mlls.ExactMarginalLogLikelihood(self.gp_likelihood, self.module)
                total = float(mll(self.module(self.x.double()), self.y[:, 0].double())) * len(self.x)
                return self.to_data_units(total, len(self.x))
        finally:
            self.module.eval(), self.gp_likelihood.eval()

    def elbo(self, x=None, y=None, num_samples: int = 1000) -> tuple[float, float]:
        """Variational GP classification: the ELBO on the training data, sum_n E_q(f_n)[log p(y_n | f_n)]
        - KL(q(u) || p(u)), a lower bound on its evidence, with the Monte Carlo SE of the expectation
        over ``num_samples`` draws of f (the KL is closed form)."""
        if self.model.task == "regression":
            raise BnnZooError("an exact GP has no ELBO; its evidence is log_marginal_likelihood()")
        totals = self.log_likelihood(num_samples=num_samples)[0].double().sum(-1)  # (draws,)
        with torch.no_grad():
            kl = self.module.variational_strategy.kl_divergence().sum().item()
        return totals.mean().item() - kl, (totals.std() / math.sqrt(num_samples)).item()

    def log_likelihood(self, x=None, y=None, num_samples: int = 1000) -> torch.Tensor:
        """Pointwise log p(y_n | f_n) for latent draws: (1, draws, N), training data by default; in the
        data's units."""
        x, y = self.data(x, y)
        log_lik = self.likelihood.distribution(self._draws(x, num_samples), {}).log_prob(y)[None]
        return log_lik if self.scaling is None else log_lik + self.scaling.log_jacobian

    def to_inference_data(self, num_samples: int = 1000):
        """The installed ArviZ's posterior object (InferenceData or DataTree): posterior (latent f at the
        training inputs), posterior_predictive, log_likelihood (for LOO/WAIC), observed and constant data,
        the type-II loss and, in attrs, the hyperparameters."""
        f = self._draws(self.x, num_samples)
        with torch.random.fork_rng(device_type="cuda"):
            torch.manual_seed(int(self.settings.get("seed", 0)))
            y_rep = self.likelihood.distribution(f, {}).sample()
        log_lik = self.log_likelihood(num_samples=num_samples)[0]
        draws = np.arange(num_samples)
        posterior = xr.Dataset(
            {"f": (("chain", "draw", "obs", "f_dim"), f[None].numpy())}, coords={"chain": [0], "draw": draws}
        )
        attrs = {**self.attrs(), "draws_posterior": num_samples, "draws_function_space": num_samples}
        x, y, y_rep = self._function_space_in_units(y_rep, attrs)
        return function_space_inference_data(
            posterior, y_rep[None], log_lik[None], draws, x, y, self.sample_stats, attrs
        )

    def save(self, path, idata=None) -> Path:
        """Save to folder ``path``: the GP's description, the fitted GPyTorch state, the training data and
        the InferenceData; ``bnn_zoo.load(path)`` predicts exactly what this posterior does."""
        state = {
            "x": self.x,
            "y": self.y,
            "module": self.module.state_dict(),
            "likelihood": self.gp_likelihood.state_dict(),
            "losses": self.sample_stats["loss"],
            **self._units_state(),
        }
        header = {
            "model": saving.describe(self.model),
            "settings": self.settings,
            "info": self.info,
            "runtime_s": self.runtime_s,
        }
        return saving.write(path, "gp", header, state, self.to_inference_data() if idata is None else idata)

    def attrs(self) -> dict:
        return {
            **self.model.describe(),
            **self.units_attrs(),
            **common_attrs(self.settings, self.runtime_s),
            "inference_library": "gpytorch",
            "inference_library_version": gpytorch.__version__,
            "hyperparameters": json.dumps(self.hyperparameters()),
            **{k: str(v) for k, v in self.info.items()},
        }


@saving.register_loader("gp")
def _load(header: dict, state: dict, model=None, guide=None) -> GPPosterior:
    gp = saving.rebuild_model(header, model)
    x, y = state["x"], state["y"]
    module, lik = gp.build(x.double(), y.double() if gp.task == "regression" else y.long())
    module.load_state_dict(state["module"])
    lik.load_state_dict(state["likelihood"])
    module.eval(), lik.eval()
    return GPPosterior(
        gp, module, lik, x, y, header["settings"], state["losses"], header.get("runtime_s", 0.0), header.get("info", {})
    )._restore_units(state)
