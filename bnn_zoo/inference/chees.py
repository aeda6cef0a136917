"""ChEES-HMC: many HMC chains in lockstep, their trajectory length adapted by the ChEES criterion
(Hoffman, Radul & Sountsov 2021).

Every chain takes the same number of leapfrog steps in an iteration, so all C chains advance through
one batched potential and gradient: the network is evaluated once per leapfrog step on a (C, d) stack
of weights (``BNN.forward`` vmaps over it). What the chains share is tuned from all of them at once:

- trajectory length T: gradient ascent (Adam, beta1 = 0) on log T of the ChEES criterion
  E[(||q' - E q'||^2 - ||q - E q||^2)^2] / 4, whose per-chain gradient estimate is
  h T (||q' - qbar'||^2 - ||q - qbar||^2) (q' - qbar') . p' (paper eq. 5; q' the proposal, p' its
  momentum, h the jitter), averaged over chains with their acceptance probabilities as weights;
- jitter: each iteration integrates for h_n T, h_n the base-2 Halton sequence (paper section 3.2);
- step size: dual averaging (Hoffman & Gelman 2014, algorithm 5) on the harmonic mean of the
  chains' acceptance probabilities, aiming at 0.651 (Beskos et al. 2013's optimum);
- diagonal mass matrix: the variance of a warm-up window's draws, pooled over chains (or within
  each chain, averaged: ``mass_matrix="within"``), shrunk towards 1e-3 as Stan does.

No library serves this in PyTorch: BlackJAX and TFP implement ChEES on JAX/TensorFlow, Pyro and
``posteriors`` have no ensemble HMC. Pyro's NUTS stays the reference sampler.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import pyro
import torch

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.inference import defaults, xla
from bnn_zoo.inference.budget import TimeLimit, check_max_hours
from bnn_zoo.inference.driver import Checkpoint, run_steps
from bnn_zoo.inference.potential import LogPosterior, chain_starts, check_init
from bnn_zoo.inference.svi import svi_start
from bnn_zoo.io import fingerprint
from bnn_zoo.methods import FullBatchChains, register
from bnn_zoo.models import architecture
from bnn_zoo.posterior import Posterior
from bnn_zoo.priors import ScaleMixture

MAX_ENERGY_ERROR = 1000.0  # a trajectory whose energy error passes this diverged (Stan's and Pyro's value)
LOG_T_CLIP = 0.35  # the largest change of log T per iteration (about log 2 / 2, as TFP)


@register
@dataclass
class ChEES(FullBatchChains):
    """Ensemble HMC with ChEES-adapted, jittered trajectory lengths: ``num_chains`` chains in lockstep.

    Args:
        num_warmup: adaptation iterations (step size, trajectory length, mass matrix); their draws
            are discarded (None: 500; 200 on recurrent networks).
        num_samples: kept draws per chain (None: 250; 100 on recurrent networks).
        num_chains: chains advanced together; the adaptation pools them, so use many (None: 16; 4 on
            recurrent networks, where a lockstep gradient costs most).
        init: where each chain starts: ``"network"``, the network's own initialisation (re-drawn per
            chain); ``"prior"``, a prior draw; ``"svi"``, a draw of a quick mean-field fit; a fitted
            :class:`~bnn_zoo.Posterior`, one of its draws per chain; or a dict of site values.
        seed: seeds the momenta, the accept/reject draws and the initialisation.
        target_accept: the harmonic-mean acceptance probability dual averaging aims at.
        max_leapfrog: the most leapfrog steps in one trajectory, capping T / step size (None: 1,000; 255
            on recurrent networks).
        trajectory_lr: Adam's learning rate on log T.
        mass_windows: fractions of warm-up at whose end the diagonal mass matrix is re-estimated
            from the window's draws (the first window's first half is discarded as burn-in).
        mass_matrix: ``"pooled"``: the variance of all chains' draws together, whose spread from their
            starts stands for scales the chains have not yet crossed. ``"within"``: the mean of each
            chain's variance about its own mean, so chains in different modes of a BNN's posterior
            (hidden units permuted, signs flipped) do not add the distance between modes; it cannot see a
            scale the chains have not crossed (docs/benchmarks-speed.md).
        compile: compile the potential and its gradient with ``torch.compile`` (needs a C++ compiler on
            the CPU): the first step pays the compile, each leapfrog step is then cheaper (benchmarks/chees.py).
            Not in a process where the XLA backend has run: torchax's "jax" device breaks torch.compile.
        checkpoint: a path written every ``checkpoint_every`` iterations and on Ctrl-C (the chains, the
            adaptation's state, the random generator and the draws so far); an existing one is resumed,
            and the run ends exactly where an uninterrupted one ends.
        checkpoint_every: iterations between checkpoints.
        max_hours: stop with a clear error (after saving the checkpoint, if there is one) once the run,
            projected from its pace after a minute, would take longer (:mod:`bnn_zoo.inference.budget`);
            None: no limit.
        progress: show a progress bar.
        backend: ``"torch"``: this module's sampler; ``"jax"``: BlackJAX's ChEES (diagonal mass matrix
            pooled over chains) on the model's log density traced to JAX
            (:mod:`bnn_zoo.inference.xla`), checkpointed from the end
            of warm-up on; ``"auto"``: JAX where the extra is installed, the network has no convolution
            or recurrent layer and ``mass_matrix`` is ``"pooled"``, torch otherwise.
        lockstep: in a sweep (or ``bnn-zoo reference``), run this cell with the others that differ from it
            only in split or seed as one XLA program (:mod:`bnn_zoo.inference.lockstep`); alone, no effect.
    """

    # a recurrent network's prior at this method's defaults (bnn_zoo.priors.default_prior):
    # as NUTS: a leapfrog step must resolve the narrow component
    recurrent_prior = ScaleMixture(scale2=0.05)

    num_warmup: int | None = None
    num_samples: int | None = None
    num_chains: int | None = None
    init: object = "network"
    seed: int = 0
    target_accept: float = 0.651
    max_leapfrog: int | None = None
    trajectory_lr: float = 0.025
    mass_windows: tuple[float, ...] = (0.25, 0.5)
    mass_matrix: Literal["pooled", "within"] = "pooled"
    compile: bool = False
    checkpoint: str | Path | None = None
    checkpoint_every: int = 100
    max_hours: float | None = 2.0
    progress: bool = True
    backend: Literal["auto", "torch", "jax"] = "auto"
    lockstep: bool = False

    name = "chees"
    quick = {
        "num_warmup": 40,
        "num_samples": 40,
        "num_chains": 4,
        "backend": "torch",
    }  # seconds on a small table (the conformance suite)

    def __post_init__(self):
        check_field_types(self)
        for name, least in (
            ("num_warmup", 0),
            ("num_samples", 1),
            ("num_chains", 2),
            ("max_leapfrog", 1),
            ("checkpoint_every", 1),
        ):
            value = getattr(self, name)
            if not (value is None or (isinstance(value, int) and value >= least)):
                raise BnnZooError(f"ChEES {name} must be an integer >= {least}, got {value!r}")
        if not 0 < self.target_accept < 1:
            raise BnnZooError(f"ChEES target_accept must lie in (0, 1), got {self.target_accept}")
        if not (self.trajectory_lr > 0 and math.isfinite(self.trajectory_lr)):
            raise BnnZooError(f"ChEES trajectory_lr must be positive and finite, got {self.trajectory_lr}")
        if not all(0 < w < 1 for w in self.mass_windows) or list(self.mass_windows) != sorted(self.mass_windows):
            raise BnnZooError(f"ChEES mass_windows must be increasing fractions in (0, 1), got {self.mass_windows}")
        check_max_hours("ChEES", self.max_hours)
        check_init(self.init)
        xla.check_backend("ChEES", self.backend)
        if self.backend == "jax" and self.mass_matrix == "within":
            raise BnnZooError(
                "ChEES mass_matrix='within' exists only with backend='torch'; BlackJAX pools the mass matrix over "
                "chains"
            )

    def settings(self) -> dict:
        skip = ("init", "progress", "checkpoint", "checkpoint_every", "max_hours", "lockstep")
        out = {"method": self.name, **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}}
        out["mass_windows"] = list(self.mass_windows)
        out["init"] = (
            "posterior"
            if isinstance(self.init, Posterior)
            else ("values" if isinstance(self.init, dict) else str(self.init))
        )
        return out

    def resolved(self, model: BNN, n: int) -> ChEES:
        """This sampler with its defaults for ``model`` filled in (:mod:`~bnn_zoo.inference.defaults`): 16
        chains of 500 + 250 iterations and trajectories of at most 1,000 steps; 4 chains of 200 + 100 and
        at most 255 steps on recurrent networks."""
        if architecture(model.net) == "recurrent":
            return defaults.unset(self, num_warmup=200, num_samples=100, num_chains=4, max_leapfrog=255)
        return defaults.unset(self, num_warmup=500, num_samples=250, num_chains=16, max_leapfrog=1000)

    def run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        if (method := self.resolved(model, x.shape[0])) is not self:
            return method.run(model, x, y)
        if self.init == "svi":
            return dataclasses.replace(self, init=svi_start(model, x, y, self.seed, self.progress)).run(model, x, y)
        start = time.perf_counter()
        generator = torch.Generator(device=model.device).manual_seed(self.seed)
        starts = chain_starts(model, self.init, self.num_chains, self.seed, generator)
        jax_target = self._jax_target(model, x, y, starts)
        if jax_target is not None:
            settings = self.settings() | {"backend": "jax"}
            identity = fingerprint(settings, model.describe(), x, y)
            samples, sample_stats, info = xla.run_chees(jax_target, jax_target.start(starts), self, identity)
            return Posterior(
                model,
                x,
                y,
                samples,
                settings,
                sample_stats=sample_stats,
                runtime_s=time.perf_counter() - start,
                info=info,
            )
        target = _Target(LogPosterior(model, x.shape[0]), x, y, model.latent_shapes(), compile=self.compile)
        q = target.flatten(target.log_posterior.initial(starts))
        run = _Iterations(_Sampler(target, q, self, generator))
        total = self.num_warmup + self.num_samples
        identity = fingerprint(self.settings(), model.describe(), x, y)
        checkpoint = Checkpoint.at(self.checkpoint, identity, "ChEES", self.checkpoint_every, None)

        def limit(first: int) -> TimeLimit:
            # the pace before the first mass-matrix window (unwhitened, tiny steps) overstates the rest's
            settle = max(run.sampler.next_mass_update - first, 0)
            return TimeLimit("ChEES", self.max_hours, total - first, settle=settle)

        run_steps(run, total, "chees", self.progress, limit, checkpoint, unit="iteration")
        sampler, draws, stats = run.sampler, run.draws, run.stats
        flat = torch.stack(draws, dim=1)  # (chain, draw, d)
        samples = target.log_posterior.constrained(target.unflatten(flat))
        sample_stats = {k: torch.stack([s[k] for s in stats], dim=1) for k in stats[0]}
        info = {"trajectory_length": sampler.trajectory, "step_size": sampler.step_size}
        settings = self.settings() | {"backend": "torch"}
        return Posterior(
            model, x, y, samples, settings, sample_stats=sample_stats, runtime_s=time.perf_counter() - start, info=info
        )

    def _jax_target(self, model: BNN, x, y, starts: dict):
        """The JAX backend's target when this run uses it (None: the torch sampler runs)."""
        if self.mass_matrix == "within" or xla.resolve_backend(self.backend, model) != "jax":
            return None
        return xla.jax_target("ChEES", model, x, y, starts)


class _Target:
    """The log posterior on flat (C, d) coordinates, with its gradient."""

    def __init__(self, log_posterior: LogPosterior, x, y, shapes: dict, compile: bool = False):
        self.log_posterior, self.x, self.y = log_posterior, x, y
        self.shapes = shapes
        self.sizes = [math.prod(s) for s in shapes.values()]
        # compiled: autograd through LogPosterior.batched under torch.compile; eager: the network's own
        # backward where it has one (LogPosterior.batched_value_and_grad; the MLP: 2.2x autograd)
        if compile and "torchax" in sys.modules:
            raise BnnZooError(
                "ChEES compile=True cannot run in a process where the XLA backend has run: torchax registers a "
                "'jax' device that torch.compile then fails on; run it in a new process, or with compile=False"
            )
        self._compiled = torch.compile(self._log_density, dynamic=False) if compile else None

    def flatten(self, values: dict) -> torch.Tensor:
        c = next(iter(values.values())).shape[0]
        return torch.cat([values[k].reshape(c, -1) for k in self.shapes], dim=1).detach()

    def unflatten(self, flat: torch.Tensor) -> dict:
        lead = flat.shape[:-1]
        parts = torch.split(flat, self.sizes, dim=-1)
        return {k: p.reshape(*lead, *shape) for (k, shape), p in zip(self.shapes.items(), parts, strict=True)}

    def _log_density(self, q: torch.Tensor) -> torch.Tensor:
        return self.log_posterior.batched(self.unflatten(q), self.x, self.y)

    def __call__(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log posterior (C,), its gradient (C, d)) at q; non-finite values where a chain has left
        the support or overflowed (they are rejected, never propagated)."""
        # validation off: a chain far out in the tails (or diverged) must give a non-finite value to
        # reject, not an exception; the data were validated once, at the boundary
        if self._compiled is None:
            with pyro.validation_enabled(False):
                logp, grads = self.log_posterior.batched_value_and_grad(self.unflatten(q.detach()), self.x, self.y)
            return logp, self.flatten(grads)
        q = q.detach().requires_grad_(True)
        with torch.enable_grad(), pyro.validation_enabled(False):
            try:
                logp = self._compiled(q)
            except torch._dynamo.exc.BackendCompilerFailed as exc:
                raise BnnZooError(
                    f"torch.compile could not compile this network's potential ({type(exc.inner_exception).__name__}); "
                    "run ChEES with compile=False"
                ) from None
            (grad,) = torch.autograd.grad(logp.sum(), q)
        return logp.detach(), grad


class _Iterations:
    """ChEES's warm-up and sampling iterations as the driver's steps
    (:class:`~bnn_zoo.inference.driver.Stepper`); its state is the sampler's and the draws so far."""

    def __init__(self, sampler: _Sampler):
        self.sampler, self.draws, self.stats = sampler, [], []

    def step(self, i: int) -> None:
        sampler, warmup = self.sampler, self.sampler.settings.num_warmup
        if i < warmup:
            sampler.warmup_step(i)
            return
        if i == warmup:
            sampler.finish_warmup()
        self.stats.append(sampler.step(i))
        self.draws.append(sampler.q.clone())

    def state(self) -> dict:
        stats = self.stats
        return {
            "sampler": self.sampler.state(),
            "draws": torch.stack(self.draws, 1) if self.draws else None,  # (chain, draw, d)
            "stats": {k: torch.stack([s[k] for s in stats], 1) for k in stats[0]} if stats else None,
        }

    def load(self, state: dict) -> None:
        try:
            self.sampler.load_state(state["sampler"])
            device = self.sampler.q.device
            self.draws = [] if state["draws"] is None else [d.to(device) for d in state["draws"].unbind(1)]
            columns = {} if state["stats"] is None else {k: v.to(device).unbind(1) for k, v in state["stats"].items()}
            self.stats = [dict(zip(columns, row)) for row in zip(*columns.values())]
        except (KeyError, TypeError, RuntimeError) as exc:
            raise BnnZooError(
                f"checkpoint {self.sampler.settings.checkpoint} is not a ChEES checkpoint ({exc}); delete it or point "
                "ChEES(checkpoint=...) elsewhere"
            ) from None


class _Sampler:
    """The chains' state and the shared adaptation."""

    def __init__(self, target: _Target, q: torch.Tensor, settings: ChEES, generator: torch.Generator):
        self.target, self.settings, self.generator = target, settings, generator
        self.q = q
        self.logp, self.grad = target(q)
        if not torch.isfinite(self.logp).all():
            bad = torch.nonzero(~torch.isfinite(self.logp)).flatten().tolist()
            raise BnnZooError(
                f"the log posterior is not finite at the initial values of chains {bad}; give init='prior' or a "
                "Posterior"
            )
        self.inv_mass = torch.ones_like(q[0])
        self.step_size = self._initial_step_size()
        self.trajectory = self.step_size
        self._restart_adaptation()
        # mass-matrix windows (begin, end) in warm-up iterations; the first starts half-way to its end,
        # leaving the chains' approach to the typical set out of the estimate
        ends = sorted({int(w * settings.num_warmup) for w in settings.mass_windows} - {0})
        self._windows = list(zip([ends[0] // 2, *ends[:-1]], ends, strict=True)) if ends else []
        self._pooled = None

    @property
    def next_mass_update(self) -> int:
        """The iteration at which the next mass-matrix window ends (0 once none is left)."""
        return self._windows[0][1] if self._windows else 0

    # --- checkpoints ------------------------------------------------------------------------------

    _SCALARS = ("step_size", "trajectory", "_mu", "_t", "_h_bar", "_log_eps_bar", "_log_t_bar", "_adam_v", "_adam_t")

    def state(self) -> dict:
        """Everything the next iteration depends on, as tensors and plain containers (weights_only loads it)."""
        return {
            "q": self.q,
            "logp": self.logp,
            "grad": self.grad,
            "inv_mass": self.inv_mass,
            "scalars": {k: getattr(self, k) for k in self._SCALARS},
            "windows": [list(w) for w in self._windows],
            "pooled": None
            if self._pooled is None
            else [self._pooled[0], self._pooled[1].clone(), self._pooled[2].clone()],
            "generator": self.generator.get_state(),
        }

    def load_state(self, state: dict) -> None:
        device = self.q.device
        self.q, self.logp, self.grad, self.inv_mass = (state[k].to(device) for k in ("q", "logp", "grad", "inv_mass"))
        for k, v in state["scalars"].items():
            setattr(self, k, v)
        self._windows = [tuple(w) for w in state["windows"]]
        pooled = state["pooled"]
        self._pooled = None if pooled is None else [pooled[0], pooled[1].to(device), pooled[2].to(device)]
        self.generator.set_state(state["generator"])

    # --- one transition -------------------------------------------------------------------------

    def _uniform(self, *shape) -> torch.Tensor:
        return torch.rand(*shape, generator=self.generator, device=self.q.device)

    def _leapfrog(self, q, p, grad, step_size: float, steps: int):
        p = p + 0.5 * step_size * grad
        for s in range(steps):
            q = q + step_size * self.inv_mass * p
            logp, grad = self.target(q)
            p = p + (step_size if s < steps - 1 else 0.5 * step_size) * grad
        return q, p, logp, grad

    def _hamiltonian(self, logp: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """H = U(q) + K(p) per chain, K = p^T M^-1 p / 2 with the diagonal inverse mass."""
        return -logp + 0.5 * (p**2 * self.inv_mass).sum(-1)

    def _transition(self, step_size: float, steps: int) -> dict:
        """One HMC transition of every chain; returns the proposal and per-chain statistics."""
        c, d = self.q.shape
        p0 = torch.randn(c, d, generator=self.generator, device=self.q.device) / self.inv_mass.sqrt()
        energy = self._hamiltonian(self.logp, p0)
        q1, p1, logp1, grad1 = self._leapfrog(self.q, p0, self.grad, step_size, steps)
        error = self._hamiltonian(logp1, p1) - energy
        finite = torch.isfinite(error) & torch.isfinite(grad1).all(-1)
        diverging = ~finite | (error > MAX_ENERGY_ERROR)
        accept_prob = torch.where(finite, torch.exp(torch.clamp(-error, max=0.0)), torch.zeros_like(error))
        accept = self._uniform(c) < accept_prob
        start = self.q
        self.q = torch.where(accept[:, None], q1, self.q)
        self.logp = torch.where(accept, logp1, self.logp)
        self.grad = torch.where(accept[:, None], grad1, self.grad)
        return {
            "start": start,
            "proposal": q1,
            "momentum": p1,
            "accept_prob": accept_prob,
            "diverging": diverging,
            "energy": energy,
        }

    def _jittered_steps(self, iteration: int) -> tuple[float, int]:
        length = _halton(iteration + 1) * self.trajectory
        return length, max(1, min(self.settings.max_leapfrog, math.ceil(length / self.step_size)))

    # --- warm-up --------------------------------------------------------------------------------

    def warmup_step(self, iteration: int) -> None:
        length, steps = self._jittered_steps(iteration)
        out = self._transition(self.step_size, steps)
        # a diverged chain already has acceptance probability 0 (non-finite) or below exp(-1000)
        self._adapt_step_size(out["accept_prob"])
        self._adapt_trajectory(out, out["accept_prob"], length / self.trajectory)
        self._collect_for_mass(iteration)

    def _restart_adaptation(self) -> None:
        """Dual averaging from the current step size; Adam's state on log T from scratch."""
        self._mu = math.log(10 * self.step_size)
        self._t, self._h_bar, self._log_eps_bar = 0, 0.0, math.log(self.step_size)
        self._log_t_bar, self._adam_v, self._adam_t = math.log(self.trajectory), 0.0, 0

    def _adapt_step_size(self, alpha: torch.Tensor) -> None:
        # Dual averaging (Hoffman & Gelman 2014, eq. 6 and algorithm 5: gamma 0.05, t0 10, kappa 0.75)
        # on the harmonic mean of the acceptance probabilities: one stuck chain pulls it to 0.
        harmonic = float(1.0 / (1.0 / alpha.clamp_min(1e-10)).mean())
        self._t += 1
        t = self._t
        self._h_bar = (1 - 1 / (t + 10)) * self._h_bar + (self.settings.target_accept - harmonic) / (t + 10)
        log_eps = self._mu - math.sqrt(t) / 0.05 * self._h_bar
        weight = t**-0.75
        self._log_eps_bar = weight * log_eps + (1 - weight) * self._log_eps_bar
        self.step_size = math.exp(log_eps)

    def _adapt_trajectory(self, out: dict, alpha: torch.Tensor, jitter: float) -> None:
        start = out["start"]
        # a chain that diverged (acceptance 0) may hold inf, NaN or 1e30 in its proposal, and 0 x inf is NaN:
        # it takes no part. (Before, one such chain made the gradient NaN, Adam's state stayed NaN until the
        # next restart, and T grew by the clip at every iteration up to max_leapfrog.)
        usable = (alpha > 0) & torch.isfinite(out["proposal"]).all(-1) & torch.isfinite(out["momentum"]).all(-1)
        if not bool(usable.any()):
            self.trajectory = max(self.step_size, min(self.trajectory, self.settings.max_leapfrog * self.step_size))
            return
        weights = torch.where(usable, alpha, 0.0)
        weights = weights / weights.sum()
        proposal = torch.where(usable[:, None], out["proposal"], start)
        momentum = torch.where(usable[:, None], out["momentum"], 0.0)
        scale = self.inv_mass.sqrt()  # the criterion lives in whitened coordinates q / sqrt(inv mass)
        centred_start = (start - start.mean(0)) / scale
        centred_proposal = proposal - (weights[:, None] * proposal).sum(0)
        change = (centred_proposal / scale).pow(2).sum(-1) - centred_start.pow(2).sum(-1)
        per_chain = jitter * self.trajectory * change * (centred_proposal * momentum).sum(-1)
        gradient = float((weights * per_chain).sum())
        if not math.isfinite(gradient):  # overflow in float32 at an extreme proposal: skip this estimate
            return
        # Adam with beta1 = 0, beta2 = 0.95 (the paper's choice), as ascent on log T, each update clipped.
        self._adam_t += 1
        self._adam_v = 0.95 * self._adam_v + 0.05 * gradient**2
        v_hat = self._adam_v / (1 - 0.95**self._adam_t)
        update = self.settings.trajectory_lr * gradient / (math.sqrt(v_hat) + 1e-8)
        log_t = math.log(self.trajectory) + max(-LOG_T_CLIP, min(LOG_T_CLIP, update))
        log_t = min(log_t, math.log(self.settings.max_leapfrog * self.step_size))
        self.trajectory = math.exp(max(log_t, math.log(self.step_size)))
        weight = self._adam_t**-0.75
        self._log_t_bar = weight * math.log(self.trajectory) + (1 - weight) * self._log_t_bar

    def _collect_for_mass(self, iteration: int) -> None:
        """Pool the window's draws; at a window's end, set the inverse mass to their variance."""
        if not self._windows or iteration < self._windows[0][0]:
            return
        q = self.q.double()
        if self._pooled is None:  # iterations, each chain's sum, the squares summed over chains
            self._pooled = [0, torch.zeros_like(q), torch.zeros_like(q[0])]
        self._pooled[0] += 1
        self._pooled[1] += q
        self._pooled[2] += (q**2).sum(0)
        if iteration + 1 == self._windows[0][1]:
            t, sums, squares = self._pooled
            n = sums.shape[0] * t
            if self.settings.mass_matrix == "within":  # each chain about its own mean, averaged over chains
                variance = (squares - (sums**2).sum(0) / t) / max(n - sums.shape[0], 1)
            else:  # all draws about their common mean
                variance = (squares - sums.sum(0) ** 2 / n) / max(n - 1, 1)
            # Stan's regularisation: shrink towards 1e-3 while few draws are pooled
            self.inv_mass = ((n / (n + 5.0)) * variance + 1e-3 * (5.0 / (n + 5.0))).to(self.q.dtype).clamp_min(1e-10)
            self._pooled = None
            self._windows.pop(0)
            self.step_size = self._initial_step_size()
            self._restart_adaptation()

    def _initial_step_size(self) -> float:
        """Hoffman & Gelman's heuristic (algorithm 4) on all chains: double or halve the step size until
        one leapfrog step's mean acceptance probability crosses 1/2."""
        step_size, direction = 0.1, None
        for _ in range(60):
            c, d = self.q.shape
            p0 = torch.randn(c, d, generator=self.generator, device=self.q.device) / self.inv_mass.sqrt()
            _, p1, logp1, _ = self._leapfrog(self.q, p0, self.grad, step_size, 1)
            error = torch.nan_to_num(self._hamiltonian(logp1, p1) - self._hamiltonian(self.logp, p0), nan=math.inf)
            accept = float(torch.exp(torch.clamp(-error, max=0.0)).mean())
            up = accept > 0.5
            if direction is not None and up != direction:
                break
            direction = up
            step_size = step_size * 2 if up else step_size / 2
        return step_size

    def finish_warmup(self) -> None:
        """Fix the averaged step size and trajectory length for sampling."""
        if self.settings.num_warmup:
            self.step_size = math.exp(self._log_eps_bar)
            self.trajectory = max(self.step_size, math.exp(self._log_t_bar))

    # --- sampling ---------------------------------------------------------------------------------

    def step(self, iteration: int) -> dict:
        length, steps = self._jittered_steps(iteration)
        out = self._transition(self.step_size, steps)
        c = self.q.shape[0]
        full = torch.full((c,), 1.0, device=self.q.device)
        return {
            "acceptance_rate": out["accept_prob"],
            "diverging": out["diverging"],
            "energy": out["energy"],
            "lp": self.logp.clone(),
            "step_size": full * self.step_size,
            "n_steps": full * steps,
            "trajectory_length": full * length,
        }


def _halton(index: int, base: int = 2) -> float:
    """The index-th element of the van der Corput (base-2 Halton) sequence, in (0, 1)."""
    result, fraction = 0.0, 1.0 / base
    while index > 0:
        result += fraction * (index % base)
        index //= base
        fraction /= base
    return result
