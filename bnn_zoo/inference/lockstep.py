"""Many fits in lockstep: K independent fits of one architecture as one batched computation.

NUTS and ChEES on the XLA backend: K cells (splits, seeds) of one model and one sampler's settings
run as one compiled XLA program (:func:`~bnn_zoo.inference.xla.run_nuts_cells`,
:func:`~bnn_zoo.inference.xla.run_chees_cells`: on a GPU every chain of every cell in lockstep, on
the CPU in rounds of one per core); cells with fewer training rows are padded and masked.

SVI:

Each fit keeps its own model (prior scales, noise scale), data (equal sizes), seed, learning rate and
guide options (dropout's p, say); their parameters are stacked along a leading axis of K, the network
runs once per step under ``torch.func.vmap`` over (weights, minibatch), and one Adam update with a
learning rate per fit moves them all. The ELBO is written out directly for the guides whose structure
is known, with exactly the terms Pyro's ``TraceMeanField_ELBO`` computes (tested against it):

    loss_k = -(N / M) sum_{n in batch_k} log p(y_n | x_n, w_k) + kl_weight_k KL(q_k || p_k),

- dropout guide: w = M diag(z) with z ~ Bernoulli(1 - p) per input unit (one mask per step, or one per
  example on dense layers); Gal's KL sum (1-p) M^2 / (2 s^2) on weights and the point masses'
  -log N(b; 0, s^2) on biases (Gal's thesis eq. 3.11);
- mean-field guide: w = mu + sigma eps; KL(N(mu, sigma^2) || N(0, s^2)) per weight, in closed form.

Every fit draws its own minibatches, masks and noise from its own random stream (:class:`Stream`)
seeded by its ``SVI.seed``, so a fit's trajectory does not depend on which other fits share its batch:
run alone or among K others, on the CPU or a GPU, the same seed gives the same draws. They differ from
a sequential Pyro fit's (another random stream), so the two agree in distribution, not draw by draw.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyro
import torch
from torch import nn
from torch.distributions import biject_to
from torch.func import functional_call, vmap

from bnn_zoo import local_noise
from bnn_zoo.bnn import BNN
from bnn_zoo.data.validation import check_data
from bnn_zoo.errors import BnnZooError, check_device, check_field_types
from bnn_zoo.guides.dropout import DropoutGuide, default_options
from bnn_zoo.guides.mean_field import MeanField
from bnn_zoo.inference import health, xla
from bnn_zoo.inference.budget import TimeLimit
from bnn_zoo.inference.chees import ChEES
from bnn_zoo.inference.driver import Checkpoint, run_steps
from bnn_zoo.inference.mcmc import NUTS
from bnn_zoo.inference.potential import chain_starts
from bnn_zoo.inference.svi import SVI, posterior_from
from bnn_zoo.io import fingerprint
from bnn_zoo.likelihoods import Gaussian
from bnn_zoo.models import architecture
from bnn_zoo.posterior import Posterior
from bnn_zoo.protocols import ForwardsDraws
from bnn_zoo.scaling import Scaling, in_fit_units, scaling_for

BLOCK = 16  # steps of randomness drawn per fit at once (fewer calls per step; masks kept as booleans)
STATE_FORMAT = "pcg64-streams, flat parameters"  # what a checkpoint's state means; part of its identity
CELLS_FORMAT = "finished cells: draws, stats, adapted kernel"  # a sampler batch's checkpoint
# the method's options that may differ between the fits of one batch (each fit's own in the batched step)
PER_FIT = ("seed", "lr", "lr_decay", "kl_weight", "kl_warmup", "guide_options")
CHECKPOINT_SECONDS = 60.0  # a checkpointed batch saves at the first block boundary after this long


@dataclass
class Job:
    """One fit of a lockstep batch: ``bz.fit(model, x, y, method, standardize=standardize)`` as it would
    run alone, on the data in their own units."""

    model: BNN
    x: torch.Tensor
    y: torch.Tensor
    method: SVI | NUTS | ChEES
    standardize: bool = True

    def __post_init__(self):
        check_field_types(self)
        if isinstance(self.method, SVI | NUTS | ChEES):
            self.method = self.method.resolved(self.model, self.x.shape[0])


SAMPLERS = (NUTS, ChEES)  # the samplers whose cells run as one XLA program


@dataclass(frozen=True)
class FitShape:
    """What lockstep asks of a fit besides its method, all known before its data are read (so a sweep
    decides from its configs, by the same rule): the network's architecture
    (:func:`~bnn_zoo.models.architecture`), whether every parameter sits in a dense layer, the task,
    whether the likelihood is a Gaussian of one fixed scale, whether every parameter is Bayesian, and
    whether the data are on the CPU."""

    architecture: str
    dense_layers: bool
    task: str
    fixed_noise: bool
    all_bayesian: bool = True
    on_cpu: bool = True

    @classmethod
    def of(cls, job: Job) -> FitShape:
        model, likelihood = job.model, job.model.likelihood
        return cls(
            architecture=architecture(model.net),
            dense_layers=all(isinstance(_owner(model.net, k), nn.Linear) for k in model.params),
            task=likelihood.task,
            fixed_noise=isinstance(likelihood, Gaussian) and isinstance(likelihood.fixed_sigma, float),
            all_bayesian=not model.fixed,
            on_cpu=job.x.device.type == "cpu",
        )


def why_not(job: Job) -> str | None:
    """Why a fit cannot run in lockstep (None: it can): :func:`why_not_for` its method and shape."""
    return why_not_for(job.method, FitShape.of(job))


def why_not_for(m, fit: FitShape) -> str | None:
    """Why a fit of method ``m`` and shape ``fit`` cannot run in lockstep (None: it can). NUTS and ChEES:
    on XLA, on dense layers, from the network's initialisation or the prior. SVI: the direct ELBO covers
    the dropout and the mean-field guide (no local reparameterisation) on a BNN of dense layers with a
    fixed-noise Gaussian likelihood, one particle, the ELBO objective and no early stopping. (A batch
    checkpoints as a whole, through ``fit_lockstep(checkpoint=...)``; each fit's own ``checkpoint`` is
    ignored.)"""
    if isinstance(m, SAMPLERS):
        checks = [
            (m.backend == "torch", "backend='torch' samples one cell at a time; batched cells run on XLA"),
            (not xla.available(), f"the XLA backend cannot run here ({xla.unsupported_torch() or 'jax is missing'})"),
            (fit.architecture != "dense", "batched cells take networks of dense layers"),
            (
                m.init not in (None, "network", "prior"),
                "batched cells start at the network's initialisation or the prior",
            ),
            (getattr(m, "mass_matrix", "pooled") != "pooled", "BlackJAX's ChEES pools the mass matrix over chains"),
            (not fit.on_cpu, "batched cells are given on the CPU (XLA places them)"),
        ]
        return next((reason for failed, reason in checks if failed), None)
    svi = isinstance(m, SVI)
    checks = [
        (not svi, "only SVI, NUTS and ChEES fits run in lockstep"),
        (
            svi and m.guide not in ("dropout", "mean-field"),
            "the lockstep ELBO covers the dropout and mean-field guides",
        ),
        (svi and bool(m.guide_options.get("local_reparam")), "local reparameterisation is not in the lockstep ELBO"),
        (svi and m.guide == "dropout" and _learns_p(m, fit.task), "a learned p is not in the lockstep ELBO"),
        (svi and (m.num_particles != 1 or m.objective != "elbo"), "lockstep fits take one particle and the ELBO"),
        (svi and bool(m.validation), "lockstep fits have no early stopping"),
        (svi and not m.direct, "direct=False asks for Pyro's own TraceMeanField_ELBO"),
        (not fit.fixed_noise, "lockstep fits need a Gaussian likelihood with one fixed scale"),
        (not fit.all_bayesian, "lockstep fits need every parameter Bayesian (no point estimates)"),
        (not fit.dense_layers, "lockstep fits take networks of dense layers"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def _learns_p(method: SVI, task: str) -> bool:
    options = method.guide_options
    return default_options(task, options.get("p"), learn_p=options.get("learn_p"))[2]


def signature(job: Job) -> tuple:
    """Fits with equal signatures can share a lockstep batch: the same architecture (the network's repr
    and parameter shapes: the batch runs the first fit's module) and the method's settings but for
    :data:`PER_FIT`. SVI fits may differ in their data, prior and noise scale, and share their data's
    shape and the guide's masks; sampled cells share one traced log density, so their prior and
    likelihood too, and may differ in their rows."""
    m, described = job.method, job.model.describe()
    shapes = tuple((k, tuple(v.shape)) for k, v in job.model.params.items())
    settings = json.dumps({k: v for k, v in m.settings().items() if k not in PER_FIT}, sort_keys=True, default=str)
    shared = (repr(job.model.net), shapes, settings)
    if isinstance(m, SAMPLERS):
        return (*shared, described["prior"], described["likelihood"], tuple(job.x.shape[1:]), tuple(job.y.shape[1:]))
    task, masks = job.model.likelihood.task, m.guide_options.get("masks")
    masks = default_options(task, masks=masks)[1] if m.guide == "dropout" else None
    return (*shared, masks, tuple(job.x.shape), tuple(job.y.shape))


def fit_lockstep(
    jobs: list[Job],
    progress: bool = False,
    device: str | torch.device | None = None,
    checkpoint: str | Path | None = None,
) -> list[Posterior]:
    """Fit every job at once and return one Posterior per job, in order (as ``bz.fit`` would), on the CPU.

    Args:
        jobs: the fits; they must share a ``signature``.
        progress: a progress bar over the steps.
        device: where the batch is stepped (default: the CPU). SVI's draws are made on the CPU either way
            (a block of steps at a time), so a GPU gives the same draws as the CPU for the same seeds; NUTS and
            ChEES run their XLA program there, with JAX's own random streams.
        checkpoint: a file for the batch's state, resumed exactly. SVI: written at a block boundary once a
            minute has passed since the last, so a killed batch loses at most that minute. NUTS and ChEES:
            every cell's draws, written as the cell finishes (on the CPU, rounds of one cell or chain per
            core), so a killed batch loses the cells it was running; on a GPU the cells advance together and
            finish at the end. It holds the fingerprint of every fit's data, model and settings and refuses
            another batch. The caller removes it once the results are safe.
    """
    if not jobs:
        return []
    jobs, scalings = zip(*(_in_fit_units(job) for job in jobs))
    for job in jobs:
        reason = why_not(job)
        if reason:
            raise BnnZooError(f"cannot fit in lockstep: {reason}")
    if len({signature(j) for j in jobs}) > 1:
        raise BnnZooError("lockstep fits must share the architecture and the method's settings (see signature)")
    if isinstance(jobs[0].method, SAMPLERS):
        posteriors = _sample_cells(list(jobs), progress, device, None if checkpoint is None else Path(checkpoint))
        return [p.fitted_in(s) for p, s in zip(posteriors, scalings)]
    start = time.perf_counter()
    batch = _Batch(jobs, check_device(device or "cpu"))
    path = None if checkpoint is None else Path(checkpoint)
    kept = Checkpoint.at(path, batch.identity, "fit_lockstep", BLOCK, None)
    # no time limit of its own: a sweep's cells have theirs
    name, no_limit = f"lockstep SVI x{len(jobs)}", lambda first: TimeLimit("lockstep SVI", None, batch.steps)  # noqa: E731
    postfix = lambda: {"loss": f"{batch.losses[:, batch.done - 1].nanmean().item():.4g}"}  # noqa: E731
    run_steps(batch, batch.steps, name, progress, no_limit, kept, postfix=postfix, keep=True)  # the caller removes it
    runtime = (batch.elapsed + time.perf_counter() - start) / len(jobs)
    posteriors = [batch.posterior(k, runtime).fitted_in(s) for k, s in zip(range(len(jobs)), scalings)]
    for posterior in posteriors:
        health.check(posterior)
    return posteriors


def _in_fit_units(job: Job) -> tuple[Job, Scaling | None]:
    """The job as bz.fit would fit it: its data checked (targets (N, out): (N,) targets would broadcast
    against (N, 1) outputs) and standardised (:func:`bnn_zoo.scaling.in_fit_units`),
    with the scaling that maps its posterior back to the data's units."""
    job = _checked(job)
    scaling = scaling_for(job.model, job.x, job.y, job.standardize)
    model, x, y = in_fit_units(job.model, job.x, job.y, scaling)
    return dataclasses.replace(job, model=model, x=x, y=y, standardize=False), scaling


def _checked(job: Job) -> Job:
    """The job's data in the likelihood's canonical form, as bz.fit checks it."""
    return dataclasses.replace(job, **dict(zip("xy", check_data(job.model, job.x, job.y))))


def _sample_cells(jobs: list[Job], progress: bool, device, checkpoint: Path | None) -> list[Posterior]:
    """NUTS or ChEES on every job's data in one XLA program on ``device`` (None: the CPU): each cell's
    chains start where its run alone starts (its seed), so its draws equal that run's up to float
    rounding. Where the log density cannot be traced (one warning says why), each cell runs on its own.
    With ``checkpoint``, every cell's draws are saved there as it finishes (on the CPU, a round of one
    cell or chain per core at a time), and a saved batch runs only its unfinished cells."""
    start = time.perf_counter()
    first, method = jobs[0], jobs[0].method
    starts = [
        chain_starts(
            j.model, j.method.init, method.num_chains, j.method.seed, torch.Generator().manual_seed(j.method.seed)
        )
        for j in jobs
    ]
    target = xla.jax_target(type(method).__name__, first.model, first.x, first.y, starts[0], device or "cpu")
    if target is None:
        return [j.method.run(j.model, j.x, j.y) for j in jobs]
    identity = fingerprint(
        [(j.method.settings(), j.model.describe()) for j in jobs], CELLS_FORMAT, *(t for j in jobs for t in (j.x, j.y))
    )

    def state(_) -> dict:
        return {"elapsed": elapsed + time.perf_counter() - start, "cells": [[k, *r] for k, r in sorted(done.items())]}

    kept = Checkpoint.at(checkpoint, identity, "fit_lockstep", 1, state)  # the caller removes it
    done, elapsed = _saved_cells(kept, len(jobs))
    if done and progress:
        print(f"resuming from checkpoint {checkpoint}: {len(done)} of {len(jobs)} cells sampled", file=sys.stderr)
    todo = [k for k in range(len(jobs)) if k not in done]

    def finished(i: int, result: tuple) -> None:
        done[todo[i]] = result
        if kept is not None and len(done) < len(jobs):
            kept.save(len(done))

    if todo:
        run = xla.run_nuts_cells if isinstance(method, NUTS) else xla.run_chees_cells
        data, seeds = [(jobs[k].x, jobs[k].y) for k in todo], [jobs[k].method.seed for k in todo]
        run(target, data, [target.start(starts[k]) for k in todo], seeds, method, progress, finished)
    runtime = (elapsed + time.perf_counter() - start) / len(jobs)  # each cell's share of the program
    posteriors = [
        Posterior(
            j.model,
            j.x,
            j.y,
            samples,
            j.method.settings() | {"backend": "jax"},
            sample_stats=stats,
            runtime_s=runtime,
            info={**(extra[0] if extra else {}), "cells_in_program": len(jobs)},
        )
        for j, (samples, stats, *extra) in zip(jobs, (done[k] for k in range(len(jobs))), strict=True)
    ]
    for posterior in posteriors:
        health.check(posterior)
    return posteriors


def _saved_cells(checkpoint: Checkpoint | None, count: int) -> tuple[dict, float]:
    """The finished cells a checkpoint of :func:`_sample_cells` holds ({k: (draws, stats, ...)}) and the
    batch's time so far; none where there is no checkpoint."""
    saved = checkpoint and checkpoint.load()
    if saved is None:
        return {}, 0.0
    try:
        cells = {int(k): tuple(result) for k, *result in saved["cells"]}
        if not all(0 <= k < count and isinstance(r[0], dict) and isinstance(r[1], dict) for k, r in cells.items()):
            raise TypeError("a cell out of range, or its draws not a dict")
        return cells, float(saved["elapsed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BnnZooError(
            f"checkpoint {checkpoint.path} is not a batch of sampled cells ({exc}); delete it to start afresh"
        ) from None


# checkpoint key -> (K, P) tensor
_SAVED = {
    "leaves": "flat",
    "exp_avg": "exp_avg",
    "exp_avg_sq": "exp_avg_sq",
    "previous": "previous",
}


def _loc_key(name: str) -> str:
    """The guide parameter holding a weight's location (Pyro's name for the PyroParam ``locs.<name>``)."""
    return f"locs.{name.replace('.', '__')}_unconstrained"


def _owner(net: nn.Module, name: str) -> nn.Module:
    return local_noise.submodule(net, name.rpartition(".")[0])


class _Batch:
    """The stacked state of K fits: parameters, Adam moments, random streams, losses."""

    def __init__(self, jobs: list[Job], device: torch.device | None = None):
        jobs = [_checked(job) for job in jobs]
        device = self.device = device or torch.device("cpu")
        self.jobs, self.K = jobs, len(jobs)
        first = jobs[0]
        self.net, self.names = first.model.net, list(first.model.params)
        self.steps, self.n = first.method.steps, first.x.shape[0]
        self.m = first.method.batch_size if first.method.batch_size and first.method.batch_size < self.n else self.n
        self.guides = []
        for job in jobs:  # each guide built exactly as SVI.run builds it: the same initial values
            pyro.set_rng_seed(job.method.seed)
            guide = job.method.build_guide(job.model)
            guide(job.x, job.y)
            self.guides.append(guide)
        self.dropout = isinstance(self.guides[0], DropoutGuide)
        self.per_example = self.dropout and self.guides[0].masks == "example"
        params = [dict(g.named_parameters()) for g in self.guides]
        self.shapes = {k: tuple(v.shape) for k, v in params[0].items()}
        # every fit's parameters in one row of a (K, P) tensor: Adam, the NaN guard and the KL of the
        # dropout guide are a few operations on it, not a few per parameter (a fifth of a step on protein)
        self.flat = (
            torch.stack([torch.cat([p[k].detach().flatten() for k in self.shapes]) for p in params])
            .to(device)
            .requires_grad_()
        )
        self.transforms = _transforms(self.guides[0])
        self.x, self.y = torch.stack([j.x for j in jobs]).to(device), torch.stack([j.y for j in jobs]).to(device)
        self.offsets = torch.arange(self.K)[:, None] * self.n
        self.scale = self._per_fit(lambda j: j.model.likelihood.fixed_sigma)
        self.prior_scale = {k: torch.stack([_prior_scale(j.model, k) for j in jobs]).to(device) for k in self.names}
        dropped = [k for k in self.names if self.dropout and k in self.guides[0].p]
        self.keep = {k: torch.tensor([1 - g.p[k] for g in self.guides], device=device) for k in dropped}
        if self.dropout:
            self.kl_coef, self.kl_const = self._dropout_kl()
        self.lr0 = self._per_fit(lambda j: j.method.lr)
        self.gamma = self._per_fit(lambda j: j.method.lr_decay ** (1.0 / j.method.steps))
        self.kl_weight = self._per_fit(lambda j: j.method.kl_weight)
        self.warmup = [j.method.kl_warmup for j in jobs]
        self.streams = [Stream(j.method.seed) for j in jobs]
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        self.alive = torch.ones(self.K, dtype=torch.bool, device=device)
        self.previous = self.flat.detach().clone()
        self.stop = [""] * self.K
        self.losses = torch.full((self.K, self.steps), float("nan"), device=device)
        self.mask_shapes = self._input_shapes() if self.per_example else {}
        self.done, self.elapsed = 0, 0.0  # steps done, and the time a resumed batch had already taken
        self.started = self.saved_at = time.perf_counter()

    def _per_fit(self, value) -> torch.Tensor:
        return torch.tensor([float(value(j)) for j in self.jobs], device=self.device)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The guide's parameters (or their gradients, moments) as views of a (K, P) tensor: name -> (K, *shape)."""
        parts = flat.split([math.prod(shape) for shape in self.shapes.values()], 1)
        return {k: part.view(self.K, *shape) for (k, shape), part in zip(self.shapes.items(), parts)}

    @property
    def leaves(self) -> dict[str, torch.Tensor]:
        return self.unflatten(self.flat)

    def _dropout_kl(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The dropout guide's KL as sum(coef * flat^2) + const, (K, P) and (K,): Gal's (1-p) M^2 / (2 s^2)
        for dropped weights (thesis eq. 3.11) and -log N(b; 0, s^2) = b^2 / (2 s^2) + log s + log(2 pi) / 2
        for the point masses."""
        coef, const = {}, torch.zeros(self.K, device=self.device)
        for name in self.names:
            s, key = self.prior_scale[name], _loc_key(name)
            if name in self.keep:
                coef[key] = self.keep[name].reshape(-1, *[1] * (s.dim() - 1)) / (2 * s.pow(2))
            else:
                coef[key] = 1 / (2 * s.pow(2))
                const = const + (s.log() + 0.5 * math.log(2 * math.pi)).flatten(1).sum(1)
        return torch.cat([coef[k].flatten(1) for k in self.shapes], 1), const

    def _input_shapes(self) -> dict[str, tuple]:
        """The input shape of every dropped layer for a minibatch (one dry forward pass)."""
        shapes, handles = {}, []
        for name in self.keep:
            handles.append(
                _owner(self.net, name).register_forward_pre_hook(
                    lambda m, args, name=name: shapes.__setitem__(name, tuple(args[0].shape))
                )
            )
        try:
            with torch.no_grad():
                self.net(self.jobs[0].x[: self.m])
        finally:
            for h in handles:
                h.remove()
        return shapes

    # ---------------------------------------------------------------- checkpoints

    @cached_property
    def identity(self) -> str:
        """What the batch's trajectory depends on: every fit's settings, model and data, and the device."""
        fits = [
            ({k: v for k, v in j.method.settings().items() if k != "num_draws"}, j.model.describe()) for j in self.jobs
        ]
        # STATE_FORMAT: a checkpoint of the torch.Generator days is refused as another fit's, with its fix
        return fingerprint(fits, str(self.device.type), STATE_FORMAT, self.x, self.y)

    def state(self) -> dict | None:
        """Everything the remaining steps depend on (:class:`~bnn_zoo.inference.driver.Stepper`), at a block
        boundary a minute after the last save (the next block is drawn afresh); None elsewhere."""
        now = time.perf_counter()
        if self.done % BLOCK or now - self.saved_at <= CHECKPOINT_SECONDS:
            return None
        self.saved_at = now
        return {
            "elapsed": self.elapsed + now - self.started,
            **{
                name: {k: v.detach().cpu() for k, v in self.unflatten(getattr(self, attr)).items()}
                for name, attr in _SAVED.items()
            },
            "alive": self.alive.cpu(),
            "losses": self.losses.cpu(),
            "stop": list(self.stop),
            "streams": [stream.state for stream in self.streams],
        }

    def load(self, saved: dict) -> None:
        """The state :meth:`state` saved (its identity checked by the checkpoint)."""
        with torch.no_grad():
            for name, attr in _SAVED.items():
                for k, v in self.unflatten(getattr(self, attr)).items():
                    v.copy_(saved[name][k])
        self.alive.copy_(saved["alive"])
        self.losses.copy_(saved["losses"])
        self.stop = list(saved["stop"])
        for stream, state in zip(self.streams, saved["streams"]):
            stream.state = state
        self.elapsed = float(saved["elapsed"])

    # ---------------------------------------------------------------- one step

    def step(self, step: int) -> None:
        loss = self.loss(self._draws(step), step)
        self.flat.grad = None
        loss.sum().backward()  # the fits are independent: each fit's gradient is its own loss's
        grad = self.flat.grad
        finite = torch.isfinite(loss.detach()) & torch.isfinite(grad).all(1)
        for k in (
            torch.nonzero(self.alive & ~finite).flatten().tolist()
        ):  # the NaN guard: that fit stops at its last finite state
            self.stop[k] = f"loss or gradient became non-finite at step {step}"
            warnings.warn(
                f"lockstep fit {k} stopped early: {self.stop[k]}; kept the last parameters with a finite loss",
                stacklevel=3,
            )
            with torch.no_grad():
                self.flat[k] = self.previous[k]
        self.alive &= finite
        self.losses[:, step] = torch.where(self.alive, loss.detach(), float("nan"))
        self.previous.copy_(self.flat.detach())  # the state whose loss was just found finite
        self._adam(grad, step)
        self.done = step + 1

    def loss(self, draws: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        """Every fit's negative ELBO for one step's draws: shape (K,)."""
        draws = dict(draws)
        rows = draws.pop("idx") + self.offsets  # rows of the fits' data stacked end to end
        xb, yb = (
            data.flatten(0, 1).index_select(0, rows.flatten()).reshape(*rows.shape, -1) for data in (self.x, self.y)
        )
        masks = {k: draws.pop(f"mask:{k}") for k in self.mask_shapes}
        weights, kl = self._weights_and_kl(draws)
        f = self._forward(weights, xb, masks)
        sigma = self.scale[:, None, None]
        loglik = (-0.5 * ((yb - f) / sigma) ** 2 - sigma.log() - 0.5 * math.log(2 * math.pi)).sum((1, 2))
        weight = self.kl_weight
        if any(self.warmup):
            weight = weight * torch.tensor(
                [min(1.0, (step + 1) / u) if u else 1.0 for u in self.warmup], device=self.device
            )
        return -(self.n / self.m) * loglik + weight * kl

    def _draws(self, step: int) -> dict[str, torch.Tensor]:
        """This step's randomness for every fit, (K, ...): minibatch rows, dropout masks (as keep
        indicators) or Gaussian noise. Drawn BLOCK steps at a time per fit, from the fit's stream."""
        if step % BLOCK == 0:
            count = min(BLOCK, self.steps - step)
            blocks = [self._draw_block(stream, k, count) for k, stream in enumerate(self.streams)]
            self.block = {name: torch.stack([b[name] for b in blocks], 1) for name in blocks[0]}  # (count, K, ...)
            if self.block["idx"].shape[-1] > self.m:
                self.block["idx"], short = first_distinct(self.block["idx"], self.m)
                for s, k in torch.nonzero(short).tolist():  # rare: the fit's own stream draws that row the O(n) way
                    self.block["idx"][s, k] = self.streams[k].subsets(self.n, self.m, 1)[0]
            self.block = {name: v.to(self.device) for name, v in self.block.items()}
        return {name: v[step % BLOCK] for name, v in self.block.items()}

    def _draw_block(self, stream: Stream, k: int, count: int) -> dict[str, torch.Tensor]:
        out = {"idx": stream.subset_candidates(self.n, self.m, count)}
        for name in self.names:
            shape = self.jobs[0].model.params[name].shape
            if not self.dropout:
                out[name] = stream.normal((count, *shape))
            elif name in self.keep and not self.per_example:  # one mask per input column
                out[name] = stream.bernoulli((count, 1, *shape[1:]), 1 - self.guides[k].p[name])
        for name, shape in self.mask_shapes.items():
            out[f"mask:{name}"] = stream.bernoulli((count, *shape), 1 - self.guides[k].p[name])
        return out

    def _weights_and_kl(self, noise: dict[str, torch.Tensor]) -> tuple[dict, torch.Tensor]:
        leaves = self.leaves
        if self.dropout:  # Gal's dropout mixture: the weights the masks multiply, and its KL (_dropout_kl)
            kl = (self.kl_coef * self.flat.pow(2)).sum(1) + self.kl_const
            column_masks = not self.per_example
            return {
                n: leaves[_loc_key(n)] * noise[n].to(self.flat.dtype)
                if column_masks and n in self.keep
                else leaves[_loc_key(n)]
                for n in self.names
            }, kl
        kl = torch.zeros(self.K, device=self.device)
        weights = {}
        for name in self.names:  # mean field: mu + sigma eps and the Normal-Normal KL
            s, loc, scale_key = (
                self.prior_scale[name],
                leaves[_loc_key(name)],
                _loc_key(name).replace("locs.", "scales.", 1),
            )
            sigma = self.transforms[scale_key](leaves[scale_key])
            weights[name] = loc + sigma * noise[name]
            kl = kl + ((s / sigma).log() + (sigma.pow(2) + loc.pow(2)) / (2 * s.pow(2)) - 0.5).flatten(1).sum(1)
        return weights, kl

    def _forward(self, weights: dict, xb: torch.Tensor, masks: dict) -> torch.Tensor:
        """The K networks on their minibatches, (K, M, out): by the network's own ``forward_draws``
        (:class:`~bnn_zoo.protocols.ForwardsDraws`; bnn_zoo's MLP and LeNet) where it has one, else under vmap."""
        if isinstance(self.net, ForwardsDraws):
            return self.net.forward_draws(weights, xb, masks)
        return self._forward_vmap(weights, xb, masks)

    def _forward_vmap(self, weights: dict, xb: torch.Tensor, masks: dict) -> torch.Tensor:
        net = self.net

        def one(w, x, kept):
            noise = {name: _PresetMask(w[name], kept[name].to(x.dtype)) for name in kept}
            with local_noise.hooks(net, noise):
                return functional_call(net, w, (x,))

        return vmap(one)(weights, xb, masks)

    def _adam(self, grad: torch.Tensor, step: int, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        """torch.optim.Adam's update (as SVI uses it), with a learning rate per fit; stopped fits stay put."""
        t = step + 1
        step_size = (self.lr0 * self.gamma**step / (1 - betas[0] ** t))[:, None]
        correction = math.sqrt(1 - betas[1] ** t)
        everyone = bool(self.alive.all())
        p, m, v = self.flat, self.exp_avg, self.exp_avg_sq
        with torch.no_grad():
            before = None if everyone else (m.clone(), v.clone(), p.clone())
            m.lerp_(grad, 1 - betas[0])
            v.mul_(betas[1]).addcmul_(grad, grad, value=1 - betas[1])
            p.sub_(step_size * m / (v.sqrt() / correction + eps))
            if before is not None:  # stopped fits keep their state exactly
                for new, old in zip((m, v, p), before):
                    new.copy_(torch.where(self.alive[:, None], new, old))

    # ---------------------------------------------------------------- results

    def posterior(self, k: int, runtime_s: float) -> Posterior:
        job, guide = self.jobs[k], self.guides[k]
        with torch.no_grad():
            for name, p in guide.named_parameters():
                p.copy_(self.leaves[name][k].detach())
        losses = self.losses[k].cpu()
        losses = losses[: int(torch.isfinite(losses).sum())]
        pyro.set_rng_seed(job.method.seed)
        info = {"stop_reason": self.stop[k], "lockstep": self.K}
        return posterior_from(job.method, job.model, guide, job.x, job.y, losses.tolist(), runtime_s, info)


class Stream:
    """One fit's random numbers: NumPy's PCG64 seeded by the fit's seed, returned as CPU tensors.

    Why not ``torch.Generator``: a per-example dropout mask is one Bernoulli draw per example and unit,
    and torch's CPU generator (``torch.rand``) made them at about 8 ns each, a third of a lockstep step
    on the UCI protocol's protein network; PCG64's raw 64-bit words, split into two 32-bit uniforms
    each and compared with keep * 2^32, cost under half of that (docs/benchmarks.md). Drawn on the CPU
    for any device, a seed gives the same draws on a GPU.
    """

    def __init__(self, seed: int):
        self.bits = np.random.PCG64(seed)
        self.rng = np.random.Generator(self.bits)

    @property
    def state(self) -> str:
        """The generator's state as JSON (a checkpoint holds no pickled objects)."""
        return json.dumps(self.bits.state)

    @state.setter
    def state(self, value: str) -> None:
        self.bits.state = json.loads(value)

    def bernoulli(self, shape: tuple, keep: float) -> torch.Tensor:
        """True with probability ``keep`` (to 2^-32), as a bool tensor of ``shape``."""
        size = math.prod(shape)
        threshold = round(keep * 2**32)
        if threshold >= 2**32:
            return torch.ones(shape, dtype=torch.bool)
        uniforms = self.bits.random_raw((size + 1) // 2).view(np.uint32)[:size]
        return torch.from_numpy(uniforms < np.uint32(threshold)).reshape(shape)

    def normal(self, shape: tuple) -> torch.Tensor:
        return torch.from_numpy(self.rng.standard_normal(shape, dtype=np.float32))

    def subset_candidates(self, n: int, m: int, count: int) -> torch.Tensor:
        """Draws from which ``first_distinct`` makes ``count`` uniformly random m-subsets of range(n):
        minibatches drawn without replacement, as Pyro's plate draws them. Where m is small against n,
        1.5 m indices drawn with replacement (O(m)); otherwise an m-subset already, the m largest of n
        uniforms (O(n): on a 8,592-row split that was 40% of a lockstep step)."""
        if 4 * m > n:
            return self.subsets(n, m, count)
        return torch.from_numpy(self.rng.integers(n, size=(count, m + m // 2)))

    def subsets(self, n: int, m: int, count: int) -> torch.Tensor:
        """``count`` uniformly random m-subsets of range(n), (count, m), in O(n): the m largest of n uniforms."""
        return torch.from_numpy(self.rng.random((count, n), dtype=np.float32)).topk(m, -1, sorted=False).indices


def first_distinct(draws: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first m distinct values of every row of ``draws`` (..., c), and which rows have fewer.

    The first m distinct values of a sequence of uniform draws with replacement are a uniform m-subset
    (each new value is uniform over those not yet seen). Short rows (more than c - m repeats: rare
    unless m is not small against n; 128 of 8,592 rows repeat about 2 of 192 draws) hold garbage.
    """
    flat = draws.reshape(-1, draws.shape[-1])
    ordered, order = flat.sort(dim=-1, stable=True)  # stable: among equal values the earliest draw comes first
    new = torch.ones_like(flat, dtype=torch.bool)
    new[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first = torch.empty_like(new).scatter_(1, order, new)  # draw i is the first draw of its value
    kept = first & (first.cumsum(-1) <= m)
    short = kept.sum(-1) < m
    kept[short, :] = False
    kept[short, :m] = True
    return flat[kept].reshape(*draws.shape[:-1], m), short.reshape(draws.shape[:-1])


class _PresetMask(local_noise.LocalNoise):
    """Per-example input dropout with the mask given (drawn from the fit's own stream)."""

    def __init__(self, centre, mask):
        super().__init__(centre)
        self.mask = mask

    def inputs(self, module, x):
        return x * self.mask


def _transforms(guide) -> dict:
    """The constraint transform of every unconstrained parameter (mean field's scales: softplus or exp)."""
    if not isinstance(guide, MeanField):
        return {}
    out = {}
    for key, (constraint, _) in guide.scales._pyro_params.items():
        out[f"scales.{key}_unconstrained"] = biject_to(constraint)
    return out


def _prior_scale(model: BNN, name: str) -> torch.Tensor:
    prior = model.site_prior(name)
    base = getattr(prior, "base_dist", prior)
    if not isinstance(base, torch.distributions.Normal) or (base.loc != 0).any():
        raise BnnZooError(f"lockstep fits need zero-mean Normal priors; {name} has {prior}")
    return base.scale.expand(model.params[name].shape).detach().clone()
