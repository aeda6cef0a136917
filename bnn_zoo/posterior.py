"""Posterior: one type for every inference method; Prediction: draws of the network output."""

from __future__ import annotations

import copy
import datetime
import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import pyro
import torch
import xarray as xr

from bnn_zoo import guides, methods, saving
from bnn_zoo.data.validation import check_data, check_inputs
from bnn_zoo.errors import BnnZooError, checked, positive
from bnn_zoo.scaling import AS_GIVEN, DATA_UNITS, Scaling, fitted_model
from bnn_zoo.variational import guide_state, log_weights, parameters, sample_guide
from bnn_zoo.version import __version__


@dataclass
class Prediction:
    """Draws ``f`` (draws, N, outputs) of the network output, with the likelihood's latent draws.

    Moments follow the law of total variance: variance = noise part E_s[Var(y|f_s)] + model part
    Var_s[E(y|f_s)], so for a Gaussian likelihood it is Gal's 1/tau + sample variance (eq. 3.17 of his
    thesis, with the noise averaged over draws when it is learned).

    With ``units`` (a fit on standardised targets) ``f`` stays the network's standardised output, and
    every y quantity (mean, variances, draws, quantiles, CDF, log-likelihood) is in the data's units:
    y = y_mean + y_std * y_z.
    """

    f: torch.Tensor
    latent: dict
    likelihood: object
    units: Scaling | None = None

    @cached_property
    def _means(self):
        return self.likelihood.mean(self.f, self.latent)

    def _y(self, y_z: torch.Tensor) -> torch.Tensor:
        return y_z if self.units is None else self.units.unscaled_targets(y_z)

    def _variance(self, v: torch.Tensor) -> torch.Tensor:
        return v if self.units is None else self.units.unscaled_variance(v)

    def _targets(self, y) -> torch.Tensor:
        """y as the likelihood reads it, (N, outputs) for real targets whether given as (N,) or (N, 1),
        standardised as the fit's targets were: a (N,) y must not broadcast against (N, 1) draws."""
        y = torch.as_tensor(y, device=self.f.device)
        if y.dim() == 0 or y.shape[0] != self.f.shape[1]:
            raise BnnZooError(
                f"y has shape {tuple(y.shape)} but the prediction is of {self.f.shape[1]} inputs; pass one target per "
                "input"
            )
        y = self.likelihood.check_targets(y, self.f.shape[-1])
        return y if self.units is None else self.units.targets(y)

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean E[y | x, D], shape (N, outputs); class probabilities for classifiers."""
        return self._y(self._means.mean(0))

    @property
    def probs(self) -> torch.Tensor:
        """Predictive class probabilities (averaged over draws), shape (N, classes)."""
        if self.likelihood.task != "classification":
            raise BnnZooError("class probabilities exist only for Bernoulli and Categorical likelihoods")
        return self.mean

    @property
    def draw_probs(self) -> torch.Tensor:
        """Class probabilities per draw, shape (draws, N, C); a Bernoulli gives the columns (1 - p, p)."""
        if self.likelihood.task != "classification":
            raise BnnZooError("class probabilities exist only for Bernoulli and Categorical likelihoods")
        p = self._means
        return torch.cat([1 - p, p], -1) if p.shape[-1] == 1 else p

    @property
    def labels(self) -> list[str] | torch.Tensor:
        """The most probable class of each input: its name where the likelihood names the classes (a
        table's class column), else its index 0..C-1 (N,)."""
        index = self.draw_probs.mean(0).argmax(-1)
        names = getattr(self.likelihood, "labels", None)
        return index if names is None else [names[i] for i in index.tolist()]

    @property
    def model_variance(self) -> torch.Tensor:
        return self._variance(self._means.var(0, unbiased=False))

    @property
    def noise_variance(self) -> torch.Tensor:
        return self._variance(self.likelihood.noise_variance(self.f, self.latent).mean(0))

    @property
    def variance(self) -> torch.Tensor:
        return self.model_variance + self.noise_variance

    def sample(self) -> torch.Tensor:
        """One y draw per posterior draw: the posterior predictive, shape (draws, N[, outputs])."""
        return self._y(self.likelihood.distribution(self.f, self.latent).sample())

    @checked
    def quantiles(self, q, include_noise: bool = True) -> torch.Tensor:
        """Quantiles over draws of y (or of the mean function E[y | f] with ``include_noise=False``): shape
        (len(q), N, outputs)."""
        if self.likelihood.task != "regression":
            raise BnnZooError("quantiles are defined for regression; use probs for classifiers")
        draws = self.sample() if include_noise else self._y(self._means)
        return torch.quantile(draws, torch.as_tensor(q, dtype=draws.dtype), dim=0)

    def cdf(self, y: torch.Tensor) -> torch.Tensor:
        """Predictive CDF at y, (1/S) sum_s P(Y <= y | f_s), shape (N, outputs): the probability integral
        transform, uniform on [0, 1] for a calibrated regressor. y lies inside the central c interval of
        the predictive exactly when |cdf - 1/2| <= c/2. y is (N,) or (N, outputs)."""
        return self.likelihood.cdf(self.f, self.latent, self._targets(y)).mean(0)

    def log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """Pointwise log predictive density log (1/S) sum_s p(y_n | f_s), shape (N,) (Gal eq. 3.18); y is
        (N,) or (N, outputs) for regression, labels (N,) for classifiers."""
        jacobian = 0.0 if self.units is None else self.units.log_jacobian
        lp = self.likelihood.distribution(self.f, self.latent).log_prob(self._targets(y))
        return torch.logsumexp(lp, 0) - math.log(lp.shape[0]) + jacobian


@runtime_checkable
class PosteriorLike(Protocol):
    """The posterior contract: what every fit returns (the BNN :class:`Posterior`, the GP baseline's
    ``GPPosterior``), so evaluation, comparison and saving never ask which method made it. Predictions are draws of the
    network output (or the GP's latent
    function) with the likelihood; log-likelihoods are pointwise per draw; the InferenceData holds
    posterior, posterior_predictive, log_likelihood, observed and constant data."""

    x: torch.Tensor
    y: torch.Tensor
    settings: dict
    runtime_s: float
    info: dict

    @property
    def method(self) -> str: ...

    def predict(self, x: torch.Tensor, num_samples: int | None = None, at_mean: bool = False) -> Prediction: ...

    def predictive_mean(self, x: torch.Tensor, num_samples: int | None = None) -> torch.Tensor: ...

    def log_likelihood(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> torch.Tensor: ...

    def elbo(
        self, x: torch.Tensor | None = None, y: torch.Tensor | None = None, num_samples: int = 1000
    ) -> tuple[float, float]: ...

    def own_evidence(self, num_samples: int = 1000) -> dict[str, float]:
        """The log-evidence estimates the fit carries by its method (its ``evidence`` trait), under
        metrics.json's names."""

    def to_inference_data(self):
        """ArviZ's posterior object: InferenceData (ArviZ 0.2x) or xarray.DataTree (1.x)."""

    def attrs(self) -> dict: ...

    def save(self, path: str | Path) -> Path: ...


def function_space_draws(y_numel: int, outputs: int, max_mb: float = 100.0) -> float:
    """Draws, over all chains, that the InferenceData's predictive and log-likelihood groups keep: about
    ``max_mb`` of y each (``y_numel`` numbers a draw), and at most 4e8 network outputs computed in all."""
    return min(max_mb * 2**20 / (8 * y_numel), 4e8 / outputs)


class InDataUnits:
    """What a posterior fitted on standardised data (``scaling``, set by :func:`bnn_zoo.fit`) needs to
    take the user's data and give back the data's units."""

    scaling: Scaling | None = None
    model: object
    x: torch.Tensor
    y: torch.Tensor

    def _inputs(self, x) -> torch.Tensor:
        """``x`` checked, and standardised as the training inputs were."""
        x = check_inputs(self.model, x)
        return x if self.scaling is None else self.scaling.inputs(x)

    def data(self, x=None, y=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y) checked and standardised as the training data were, as the model sees them; the training
        data when x is None."""
        if x is None:
            return self.x, self.y
        x, y = check_data(self.model, x, y)
        return (x, y) if self.scaling is None else (self.scaling.inputs(x), self.scaling.targets(y))

    def training_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training data in the data's units (``x``, ``y`` hold them as the model saw them)."""
        if self.scaling is None:
            return self.x, self.y
        return self.scaling.unscaled_inputs(self.x), self.scaling.unscaled_targets(self.y)

    def to_data_units(self, log_density: float, n: int) -> float:
        """A log density of ``n`` standardised targets (an ELBO, an evidence) in the data's units."""
        return log_density if self.scaling is None else log_density + n * float(self.scaling.log_jacobian)

    def fitted_in(self, scaling: Scaling | None):
        """This posterior of a fit made under ``scaling`` (:func:`bnn_zoo.scaling.in_fit_units`), answering
        in the data's units from now on; a subclass converts the numbers it keeps of the fit."""
        self.scaling = scaling
        return self

    def units_attrs(self) -> dict[str, str]:
        """What every result file says of its units: ``units``, the numbers', and ``fitted_on``, the data
        the network saw, which the prior and a learned noise's prior act on."""
        if self.scaling is None:
            return {"units": AS_GIVEN, "fitted_on": "the data as given"}
        parts = "inputs and targets" if self.scaling.scales_targets else "inputs"
        return {"units": DATA_UNITS, "fitted_on": f"standardised {parts} (the prior acts on its weights)"}

    def _units_state(self) -> dict:
        """The saved form of ``scaling``; :meth:`_restore_units` reads it back."""
        return {"scaling": None if self.scaling is None else self.scaling.state()}

    def _restore_units(self, state: dict):
        self.scaling = Scaling(**state["scaling"]) if state.get("scaling") else None
        self.model = fitted_model(self.model, self.scaling)
        return self

    def _function_space_in_units(self, y_rep: torch.Tensor, attrs: dict) -> tuple:
        """(x, y, y_rep) of the InferenceData in the data's units (``units_attrs`` says what stays standardised)."""
        if self.scaling is None:
            return self.x, self.y, y_rep
        return *self.training_data(), self.scaling.unscaled_targets(y_rep)


class Posterior(InDataUnits):
    """Posterior draws of every latent site, indexed (chain, draw), plus the guide when there is one.

    MCMC, SG-MCMC and Laplace fits store their draws, one chain per sampler chain. A variational fit
    with a torch-module guide stores none (``samples=None``): its draws are made from the guide on
    demand, in blocks of at most ``BLOCK_DRAWS`` draws and ``BLOCK_FLOATS`` numbers, each block under a seed of its own
    (the
    fit's seed and the block's number). So draw j is the same whichever call asks for it, and
    prediction, log-likelihoods and the InferenceData hold one block of weights at a time, whatever
    the number of draws T. ``settings["num_draws"]`` is the default T; ``predict(x, num_samples=...)``
    may ask for any number.
    """

    BLOCK_FLOATS, BLOCK_DRAWS = 5e6, 1000  # at most 5e6 weight numbers (20 MB in float32) and 1,000 draws a block
    # One forward call evaluates at most ROWS_PER_CALL inputs for DRAW_ROWS_PER_CALL // rows draws, so its
    # activations stay a few MB: calls that overflow the caches cost several times more per draw.
    ROWS_PER_CALL, DRAW_ROWS_PER_CALL = 512, 2**14

    def __init__(self, model, x, y, samples, settings, sample_stats=None, guide=None, runtime_s=0.0, info=None):
        self.model, self.x, self.y = model, x, y
        self.settings = settings
        self.sample_stats = sample_stats or {}
        self.guide = guide
        self.runtime_s = runtime_s
        self.info = info or {}
        if samples is None and not isinstance(guide, torch.nn.Module):
            raise BnnZooError("a posterior without stored draws needs a torch-module guide to draw from")
        self.stored = None if samples is None else {k: v.detach() for k, v in samples.items()}
        values = self.stored if self.stored is not None else self.guide.state_dict()
        bad = [k for k, v in values.items() if torch.is_floating_point(v) and not torch.isfinite(v).all()]
        if bad:
            raise BnnZooError(
                f"the fit produced non-finite draws for {bad}; lower the learning rate or step size, or use a tighter "
                "prior"
            )

    @property
    def method(self) -> str:
        return self.settings["method"]

    kind = "bnn"  # the saved folder's kind, which bnn_zoo.load dispatches on

    def _forward(self, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The network's outputs for a batch of draws (a Laplace posterior linearises it instead)."""
        return self.model.forward(weights, x)

    def to(self, device: torch.device | str) -> Posterior:
        """The same posterior on ``device`` (e.g. fitted on CUDA, evaluated and saved on the CPU)."""
        if self.guide is not None and not isinstance(self.guide, torch.nn.Module):
            raise BnnZooError(
                "a posterior whose guide is a plain function cannot change device; use a torch-module guide"
            )
        other = copy.copy(self)
        other.model, other.x, other.y = self.model.to(device), self.x.to(device), self.y.to(device)
        other.stored = None if self.stored is None else {k: v.to(device) for k, v in self.stored.items()}
        other.sample_stats = {k: v.to(device) for k, v in self.sample_stats.items()}
        other.guide = None if self.guide is None else self.guide.to(device)
        other.scaling = None if self.scaling is None else self.scaling.to(device)
        return other

    @property
    def num_chains(self) -> int:
        return 1 if self.stored is None else next(iter(self.stored.values())).shape[0]

    @property
    def num_draws(self) -> int:
        """Draws per chain: the stored ones, or a guide's default number T."""
        return int(self.settings["num_draws"]) if self.stored is None else next(iter(self.stored.values())).shape[1]

    @property
    def samples(self) -> dict[str, torch.Tensor]:
        """Every draw as (chain, draw, *shape). A guide's draws are all made here, at once: for many draws
        of a large network use ``predict`` or ``log_likelihood``, which work block by block."""
        if self.stored is not None:
            return self.stored
        return {k: v[None] for k, v in self._draws_at(torch.arange(self.num_draws)).items()}

    def draws(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """Flat draws (S, *shape): all of them, an evenly thinned subset of stored ones, or a guide's first S."""
        return self._draws_at(self._index(num_samples))

    def _index(self, num_samples: int | None) -> torch.Tensor:
        """Flat (chain-major) indices of the draws ``num_samples`` asks for."""
        total = self.num_chains * self.num_draws
        if num_samples is None:
            return torch.arange(total)
        positive("num_samples (posterior draws)", num_samples, integer=True)
        if self.stored is None:
            return torch.arange(num_samples)
        if num_samples > total:
            raise BnnZooError(f"only {total} posterior draws are stored; ask for num_samples <= {total}")
        return torch.linspace(0, total - 1, num_samples).round().long()

    def _draws_at(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """The draws at flat ``index``, as (len(index), *shape)."""
        blocks = list(self._blocks(index))
        return blocks[0] if len(blocks) == 1 else {k: torch.cat([b[k] for b in blocks]) for k in blocks[0]}

    def _blocks(self, index: torch.Tensor):
        """The draws at flat ``index`` in pieces: all at once when stored, else one guide block at a time."""
        if self.stored is not None:
            yield {k: _take(v.reshape(-1, *v.shape[2:]), index) for k, v in self.stored.items()}
            return
        size = self._block_size()
        blocks, counts = torch.unique_consecutive(index // size, return_counts=True)
        for block, part in zip(blocks.tolist(), index.split(counts.tolist())):
            draws = self._guide_block(block, size)
            yield {k: _take(v, part - block * size) for k, v in draws.items()}
            del draws  # before the next block is made

    def _block_size(self) -> int:
        """Draws per guide block: the largest divisor of BLOCK_DRAWS (the default T, so it is drawn without
        waste) whose weights fit in BLOCK_FLOATS numbers."""
        per_draw = sum(math.prod(s) for s in self.model.latent_shapes().values())
        return max(
            d
            for d in range(1, self.BLOCK_DRAWS + 1)
            if self.BLOCK_DRAWS % d == 0 and (d == 1 or d * per_draw <= self.BLOCK_FLOATS)
        )

    def _guide_block(self, block: int, size: int) -> dict[str, torch.Tensor]:
        """Guide draws block * size, ..., (block + 1) * size - 1, under their own seed (the global RNG untouched)."""
        seed = int(np.random.SeedSequence([int(self.settings.get("seed", 0)), block]).generate_state(1)[0])
        with (
            torch.no_grad(),
            torch.random.fork_rng(
                devices=[self.model.device] if self.model.device.type == "cuda" else [], device_type="cuda"
            ),
        ):
            torch.manual_seed(seed)
            return {k: v.detach() for k, v in sample_guide(self.guide, self.model, size, self.x, self.y).items()}

    def mean_weights(self) -> dict[str, torch.Tensor]:
        """Posterior mean of every latent site as a single draw (1, *shape)."""
        if self.guide is not None and hasattr(self.guide, "mean"):
            with torch.no_grad():
                return {k: v.detach()[None] for k, v in self.guide.mean().items()}
        sums, count = {}, 0
        for block in self._blocks(self._index(None)):
            sums = {k: sums.get(k, 0) + v.sum(0, keepdim=True) for k, v in block.items()}
            count += next(iter(block.values())).shape[0]
        return {k: v / count for k, v in sums.items()}

    def _split(self, draws):
        weights = {k: draws[k] for k in self.model.params}
        return weights, {k: v for k, v in draws.items() if k not in weights}

    @checked
    def predict(self, x: torch.Tensor, num_samples: int | None = None, at_mean: bool = False) -> Prediction:
        """Network outputs at ``x`` for posterior draws, vectorised over draws (for the dropout guide: MC
        dropout, Gal's thesis eq. 3.16).

        Args:
            x: inputs (N, features).
            num_samples: draws to use: all stored ones (default), an evenly thinned subset, or, for a
                guide, fresh guide draws when more are asked for than are stored.
            at_mean: one pass at the posterior mean weights instead: the guide's E_q[w] where it has one
                (for dropout, standard dropout's weight scaling), else the average of the stored draws.

        Returns:
            Draws of f (draws, N, outputs) with the likelihood, for moments, quantiles and log-likelihoods.
        """
        # Not pyro.infer.Predictive: it re-runs the whole Pyro model and returns y draws, while the moments
        # and log-likelihoods need f for every draw, which BNN.forward computes in one vmap.
        x = self._inputs(x).to(self.model.device)
        if at_mean:
            weights, latent = self._split(self.mean_weights())
            with torch.no_grad():
                return Prediction(self._forward(weights, x), latent, self.model.likelihood, self.scaling)
        parts = list(self._per_draw(x, self._index(num_samples), lambda f, latent: (f, latent)))
        latent = {k: torch.cat([lat[k] for _, lat in parts]) for k in parts[0][1]}
        return Prediction(torch.cat([f for f, _ in parts]), latent, self.model.likelihood, self.scaling)

    def predictive_mean(self, x, num_samples: int | None = None) -> torch.Tensor:
        """E[y | x, D] averaged over draws (class or token probabilities for discrete likelihoods), computed
        in chunks of draws: for outputs too large to hold every draw at once, e.g. language models."""
        index = self._index(num_samples)
        total = sum(self._per_draw(self._inputs(x), index, lambda f, lat: self.model.likelihood.mean(f, lat).sum(0)))
        return total / len(index) if self.scaling is None else self.scaling.unscaled_targets(total / len(index))

    def log_likelihood(
        self, x: torch.Tensor | None = None, y: torch.Tensor | None = None, draw_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Pointwise log p(y_n | x_n, w_s): (chain, draw, N), for every draw or the draws at ``draw_index``
        in each chain, in the data's units (a density of standardised targets times the Jacobian
        1 / prod(y_std)). Training data by default; computed in chunks of draws."""
        x, y = self.data(x, y)
        lp = torch.cat(
            list(
                self._per_draw(
                    x,
                    self._chain_index(draw_index),
                    lambda f, lat: self.model.likelihood.distribution(f, lat).log_prob(y),
                )
            )
        )
        lp = lp if self.scaling is None else lp + self.scaling.log_jacobian
        return lp.reshape(self.num_chains, -1, lp.shape[-1])

    def _chain_index(self, draw_index: torch.Tensor | None = None) -> torch.Tensor:
        """Flat indices of the draws at ``draw_index`` (default: all) of every chain, chain by chain."""
        draws = torch.arange(self.num_draws) if draw_index is None else torch.as_tensor(draw_index)
        return (torch.arange(self.num_chains)[:, None] * self.num_draws + draws).reshape(-1)

    def _per_draw(self, x, index: torch.Tensor, fn, max_floats: float = 2e7):
        """fn(f, latent) for the draws at flat ``index``, in chunks whose outputs f hold ~max_floats numbers
        and whose forward calls hold DRAW_ROWS_PER_CALL (draw, input) pairs."""
        rows = min(len(x), self.ROWS_PER_CALL)
        chunk = max(1, min(int(max_floats // self._outputs_per_draw(x)), self.DRAW_ROWS_PER_CALL // rows))
        with torch.no_grad():
            for draws in self._blocks(index):
                weights, latent = self._split(draws)
                total = next(iter(weights.values())).shape[0]
                for i in range(0, total, chunk):
                    part = {k: v[i : i + chunk] for k, v in weights.items()}
                    # rows are independent
                    f = torch.cat([self._forward(part, x[j : j + rows]) for j in range(0, len(x), rows)], dim=1)
                    yield fn(f, {k: v[i : i + chunk] for k, v in latent.items()})
                del draws, weights, latent  # before the next block is made

    def own_evidence(self, num_samples: int = 1000) -> dict[str, float]:
        """A guide's ``elbo`` and ``elbo_se`` (``num_samples`` draws), where it has a density; otherwise the
        estimates of the method's ``evidence`` trait that the fit kept in ``info`` (Laplace's
        ``evidence_laplace`` or ``evidence_laplace_type_ii``, named by its ``type_ii`` label)."""
        if self.guide is not None and getattr(self.guide, "has_density", True):
            return dict(zip(("elbo", "elbo_se"), self.elbo(num_samples=num_samples)))
        return {k: self.info[k] for k in methods.traits_of(self).evidence if k in self.info}

    def elbo(
        self, x: torch.Tensor | None = None, y: torch.Tensor | None = None, num_samples: int = 1000
    ) -> tuple[float, float]:
        """ELBO = E_q[log p(y, w | x) - log q(w)] on the full data (Gal's thesis eq. 3.7), with its Monte
        Carlo standard error.

        Args:
            x: inputs; the training data by default.
            y: targets, with ``x``.
            num_samples: guide draws averaged.

        Returns:
            (estimate, standard error), in nats, in the data's units.
        """
        if self.guide is None:
            raise BnnZooError(f"the ELBO needs a variational guide; this posterior came from {self.method.upper()}")
        if not getattr(self.guide, "has_density", True):
            raise BnnZooError(
                f"the {self.settings.get('guide')} guide has no density (a point mass as s -> 0), so its ELBO is "
                "-infinity up to a constant; compare it by test log-likelihood or LOO instead"
            )
        positive("num_samples (guide draws for the ELBO and its standard error)", num_samples, integer=True, least=2)
        x, y = self.data(x, y)
        with torch.no_grad():
            lw = log_weights(self.guide, self.model, x, y, num_samples)
        return self.to_data_units(lw.mean().item(), len(y)), (lw.std() / math.sqrt(num_samples)).item()

    def to_inference_data(self, max_mb: float = 100.0):
        """The installed ArviZ's posterior object (InferenceData under 0.2x, xarray.DataTree under 1.x):
        posterior, posterior_predictive, log_likelihood, observed_data, constant_data (x), sample_stats
        and attrs naming model, prior, likelihood, method and versions.

        Large fits are thinned to stay near ``max_mb`` per group (so posterior.nc stays under about
        3 x max_mb): each group keeps evenly spaced draws of every chain, and the function-space groups
        (predictive, log-likelihood) also stop at about 4e8 network outputs computed. The attrs
        ``draws_<group>`` say how many draws per chain each group kept.
        """
        weight_bytes = 4 * sum(math.prod(shape) for shape in self.model.latent_shapes().values())
        kept = {
            "posterior": self._keep(max_mb * 2**20 / weight_bytes),
            "function": self._keep(function_space_draws(self.y.numel(), self._outputs_per_draw(self.x), max_mb)),
        }
        draws = self._draws_at(self._chain_index(kept["posterior"]))
        fitted = self.info.get("fitted_sites", [])  # point values (a type-II noise): constant_data, not draws
        constants = {k: draws.pop(k)[0] for k in fitted if k in draws}
        posterior = xr.Dataset(
            {
                k: (("chain", "draw", *_dims(k, v.shape[1:])), v.reshape(self.num_chains, -1, *v.shape[1:]).numpy())
                for k, v in draws.items()
            },
            coords={"chain": np.arange(self.num_chains), "draw": kept["posterior"].numpy()},
        )
        with torch.random.fork_rng(device_type="cuda"):  # the same fit always writes the same file
            torch.manual_seed(int(self.settings.get("seed", 0)))
            parts = list(self._per_draw(self.x, self._chain_index(kept["function"]), self._replicate_and_score))
        y_rep, log_lik = (torch.cat(part) for part in zip(*parts))
        y_rep = y_rep.reshape(self.num_chains, len(kept["function"]), *self.y.shape)
        log_lik = log_lik.reshape(self.num_chains, -1, *log_lik.shape[1:])  # (chain, draw, N[, outputs])
        if self.scaling is not None:
            log_lik = self.scaling.value_log_jacobian(log_lik, per_output=log_lik.dim() == 4)
        attrs = {
            **self.attrs(),
            "draws_posterior": len(kept["posterior"]),
            "draws_function_space": len(kept["function"]),
        }
        x, y, y_rep = self._function_space_in_units(y_rep, attrs)
        return function_space_inference_data(
            posterior,
            y_rep,
            log_lik,
            kept["function"].numpy(),
            x,
            y,
            self.sample_stats,
            attrs,
            constants,
        )

    def _replicate_and_score(self, f, latent) -> tuple[torch.Tensor, torch.Tensor]:
        """A replicated training set and the training data's pointwise log-likelihood, from one forward pass."""
        likelihood = self.model.likelihood
        return likelihood.distribution(f, latent).sample(), likelihood.value_log_prob(f, latent, self.y)

    def _outputs_per_draw(self, x) -> int:
        """Numbers in the network's output on all of ``x`` for one draw (read off one example)."""
        with torch.no_grad():
            return self.model.forward({k: v[None] for k, v in self.model.params.items()}, x[:1]).numel() * len(x)

    def _keep(self, draws_per_chain: float) -> torch.Tensor:
        """Evenly spaced draw indices, at most ``draws_per_chain`` (at least 1) per chain."""
        count = int(min(self.num_draws, max(1, draws_per_chain / self.num_chains)))
        return torch.linspace(0, self.num_draws - 1, count).round().long()

    def save(self, path, idata=None) -> Path:
        """Save to folder ``path`` (see :mod:`bnn_zoo.saving`): the model's description, the stored draws,
        the guide's state, the training data and the InferenceData (``idata``; None: made now; False:
        none). ``bnn_zoo.load(path)`` gives back a posterior that predicts exactly what this one does."""
        state = {
            "x": self.x,
            "y": self.y,
            "samples": self.stored,  # None: a guide's draws, made again from the guide's state
            "sample_stats": self.sample_stats,
            "fixed": self.model.fixed,
            "guide": None if self.guide is None else guide_state(self.guide),
            **self._units_state(),
            **self._extra_state(),
        }
        try:
            header = {"model": saving.describe(self.model)}
        except saving.NotDescribable as exc:
            header = {"model": None, "model_note": str(exc)}
        header.update(settings=self.settings, info=self.info, runtime_s=self.runtime_s)
        return saving.write(
            path,
            self.kind,
            header,
            state,
            self.to_inference_data() if idata is None else (None if idata is False else idata),
        )

    def _extra_state(self) -> dict:
        """Tensors a subclass needs saved beyond the draws (a Laplace posterior's MAP)."""
        return {}

    def attrs(self) -> dict:
        return {
            **self.model.describe(),
            **self.units_attrs(),
            **common_attrs(self.settings, self.runtime_s),
            "inference_library": "pyro",
            "inference_library_version": pyro.__version__,
            **{k: str(v) for k, v in self.info.items()},
        }


def common_attrs(settings: dict, runtime_s: float) -> dict:
    """Attributes every result file carries: method, settings, seed, run time, creation time, versions."""
    import arviz

    return {
        "method": settings["method"],
        "settings": json.dumps(settings, sort_keys=True, default=str),
        "seed": int(settings.get("seed", 0)),
        "runtime_s": float(runtime_s),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": str(torch.__version__),
        "arviz_version": arviz.__version__,
        "bnn_zoo_version": __version__,
    }


def function_space_inference_data(
    posterior: xr.Dataset, y_rep, log_lik, draws, x, y, sample_stats: dict, attrs: dict, constants: dict | None = None
):
    """InferenceData in ArviZ's schema from a posterior group and function-space draws: y_rep (chain,
    draw, *y.shape) and pointwise log_lik (chain, draw, N), or per value (chain, draw, N, outputs) for
    several real targets, at the ``draws`` indices, observed data,
    constant data (x and ``constants``, fitted values that are not random), per-draw sample_stats, and
    a per-step optimisation trace (SVI's loss) in a group of its own, ``optimization``.

    A single-output y is stored as (obs,) in every group, as log_likelihood has it, so ArviZ's LOO-PIT
    and predictive checks pair them. Built from xarray Datasets rather than ``az.from_dict``: thinned groups keep
    the original draw indices as their ``draw`` coordinate and weights carry per-layer dimension names.
    Returned as the installed ArviZ's object: InferenceData (0.2x) or DataTree (1.x)."""
    from bnn_zoo import arviz_compat

    if y.dim() == 2 and y.shape[1] == 1:
        y, y_rep = y[:, 0], y_rep[..., 0]
    coords = {"chain": np.arange(y_rep.shape[0]), "draw": np.asarray(draws)}
    y_dims = ("obs", *(f"y_dim_{i}" for i in range(1, y.dim())))
    fitted = {k: (tuple(f"{k}_dim_{i}" for i in range(v.dim())), v.numpy()) for k, v in (constants or {}).items()}
    groups = {
        "posterior": posterior,
        "posterior_predictive": xr.Dataset({"y": (("chain", "draw", *y_dims), y_rep.numpy())}, coords=coords),
        "log_likelihood": xr.Dataset(
            {"y": (("chain", "draw", *y_dims[: log_lik.dim() - 2]), log_lik.numpy())}, coords=coords
        ),
        "observed_data": xr.Dataset({"y": (y_dims, y.numpy())}),
        "constant_data": xr.Dataset({"x": (("obs", "feature"), x.numpy()), **fitted}),
    }
    per_draw = {k: (("chain", "draw"), v.numpy()) for k, v in sample_stats.items() if v.dim() == 2}
    per_step = {k: (("step",), v.numpy()) for k, v in sample_stats.items() if v.dim() == 1}
    groups.update({"sample_stats": xr.Dataset(per_draw)} if per_draw else {})
    groups.update({"optimization": xr.Dataset(per_step)} if per_step else {})
    for ds in groups.values():
        ds.attrs.update(attrs)
    return arviz_compat.inference_data(groups)


def _take(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[index]: a view when the indices are consecutive (no copy of stored draws), else a copy."""
    if len(index) and torch.equal(index, torch.arange(int(index[0]), int(index[0]) + len(index))):
        return values[int(index[0]) : int(index[0]) + len(index)]
    return values[index]


def _dims(name: str, shape) -> tuple[str, ...]:
    """Dimension names: a layer's (out, in) for 2-D weights and out for its bias, else name_dim_i."""
    module, _, kind = name.rpartition(".")
    if module and kind == "weight" and len(shape) == 2:
        return (f"{module}.out", f"{module}.in")
    if module and kind == "bias" and len(shape) == 1:
        return (f"{module}.out",)
    return tuple(f"{name}_dim_{i}" for i in range(len(shape)))


@saving.register_loader("bnn")
def load_posterior(header: dict, state: dict, model=None, guide=None, cls: type | None = None) -> Posterior:
    """A saved BNN posterior: the model rebuilt (or given), its point estimates and, when it had one, its
    guide rebuilt exactly as SVI built it (same seed, so even random flow permutations match)."""
    settings = header["settings"]
    model = saving.rebuild_model(header, model).with_fixed(state["fixed"])
    x, y = state["x"], state["y"]
    seed = int(settings.get("seed", 0))
    rebuild = guide is None and state["guide"] is not None and settings.get("guide_source") in ("registry", "class")
    with torch.random.fork_rng(device_type="cuda"):
        pyro.set_rng_seed(seed)  # as SVI.run seeds before building: random parts (flow permutations) come out the same
        if rebuild:
            spec = (
                settings["guide"] if settings["guide_source"] == "registry" else saving.resolve_class(settings["guide"])
            )
            guide = guides.make(spec, model, model.network_init(seed), settings.get("guide_options"))
        if guide is not None:
            parameters(guide, x, y)  # creates the parameters that a guide makes on its first call
    if guide is not None and state["guide"] is not None:
        guide.load_state_dict(state["guide"])
    if isinstance(guide, torch.nn.Module):
        guide.eval()  # as a fit leaves it: per-example (local) noise is the training ELBO's, not the predictive's
    return (cls or Posterior)(
        model,
        x,
        y,
        state["samples"],
        settings,
        state["sample_stats"],
        guide,
        header.get("runtime_s", 0.0),
        header.get("info"),
    )._restore_units(state)
