"""Stochastic-gradient MCMC on the BNN model, for data too large for full-batch NUTS: minibatch
Langevin dynamics (SGLD; Welling & Teh 2011), SGHMC with friction (Chen et al. 2014, the variant
Heek's thesis uses) and cyclical SGLD (Zhang et al. 2020).

The update rules are the ``posteriors`` package's (``posteriors.sgmcmc.sgld`` and ``.sghmc``, written
on torch.func); bnn-zoo gives them the model's minibatch log posterior, the step-size and temperature
schedules, the thinning, the draws' bookkeeping and checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyro
import torch

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.inference import defaults
from bnn_zoo.inference.budget import STEPS_FIX, TimeLimit, check_max_hours
from bnn_zoo.inference.driver import Checkpoint, run_steps
from bnn_zoo.inference.potential import LogPosterior
from bnn_zoo.io import fingerprint
from bnn_zoo.methods import Chains, register
from bnn_zoo.posterior import Posterior
from bnn_zoo.priors import Normal

DENSE_MAX = (
    1000  # weights up to which the preconditioner is a full covariance (a d x d factor per step), diagonal above
)
# burn-in fractions where the preconditioner is re-estimated: doubling windows, as Stan's
WINDOWS = (
    0.15,
    0.25,
    0.45,
    0.85,
)
CYCLICAL_PEAK = 2  # the cyclical schedule's peak in SCALED_STEPs: its sampling half starts at one
SCALED_STEP = 0.2  # eps * lambda_max in whitened coordinates: Langevin's variance bias there is eps lambda / 2 = 10%


@register
@dataclass
class SGMCMC(Chains):
    """Minibatch MCMC: every step follows a stochastic gradient of log p(w) + (N / M) sum_batch log p(y | x, w).

    - ``"sgld"``: w <- w + eps grad + N(0, 2 eps) (Langevin dynamics discretised by Euler-Maruyama;
      Welling & Teh 2011 eq. 4 with eps = their epsilon / 2). Its stationary law is biased by O(eps):
      for a Gaussian target of precision P it is N(mu, (P - eps P^2 / 2)^-1).
    - ``"sghmc"``: w <- w + eps m, m <- m + eps grad - eps alpha m + N(0, 2 alpha eps) (Chen et al. 2014
      eq. 15 with unit mass; ``friction`` is alpha).
    - ``"cyclical"``: SGLD whose step size follows cosine cycles, eps_k = eps / 2 (cos(pi (k mod L) / L) + 1)
      (Zhang et al. 2020 eq. 1); the first ``exploration`` of each cycle runs without noise
      (optimisation) and draws are taken in the rest.

    With ``step_size=None`` (the default) nothing needs tuning: the chain runs in whitened coordinates
    u, w = a + L u, where L L^T is the covariance of the chain's own iterates, re-estimated over doubling
    windows of the burn-in (dense up to ``DENSE_MAX`` weights, diagonal above; Stan's windowed mass
    matrix adaptation, which for SG-MCMC is the preconditioned Langevin dynamics of Girolami &
    Calderhead 2011 with a constant metric). After each window the largest curvature lambda of -log p in
    u is found by power iteration on Hessian-vector products (differences of gradients), and eps = 0.2 / lambda (SGLD;
    the cyclical
    peak is twice that) or eps = 0.2 / sqrt(lambda) with alpha = friction sqrt(lambda) (SGHMC): the
    stiffest direction's variance is then 11% (SGLD) or 12% (SGHMC at friction 2, critical damping) too
    wide, the O(eps) bias above, and every direction mixes in about 5 steps once L is right. With
    minibatches eps is also capped where the gradient noise adds 5% to a step's variance. Burn-in runs
    Langevin dynamics whatever the kind (they explore from the first step); cyclical SGLD adapts over
    ``burn_in`` steps before its cycles. A number for ``step_size`` runs the plain dynamics above in the
    weights' own coordinates at that fixed step.

    Args:
        kind: ``"sgld"``, ``"sghmc"`` or ``"cyclical"``.
        step_size: None (adapted, see above) or a fixed eps (the peak of the cyclical schedule).
        batch_size: minibatch size M (None: full batch up to 1,000 training rows, 128 above; at least N:
            full batch).
        num_samples: draws kept per chain.
        thinning: steps between kept draws.
        burn_in: steps before the first kept draw (the adaptation, with ``step_size=None``).
        friction: SGHMC's alpha (in units of sqrt(lambda) when adapted: 2 is critical damping).
        cycles: cyclical SGLD's number of cycles.
        exploration: cyclical SGLD's fraction of each cycle without noise.
        num_chains: chains, run one after another (each from the network's own initialisation).
        seed: chain c is seeded with ``seed + c``.
        checkpoint: a path written every ``checkpoint_every`` steps and on Ctrl-C; an existing one is resumed.
        checkpoint_every: steps between checkpoints.
        max_hours: stop with a clear error once the chains, projected from their pace after a minute, would
            take longer (:mod:`bnn_zoo.inference.budget`; a checkpoint is saved first); None: no limit.
        progress: show a progress bar.
    """

    # a recurrent network's prior at this method's defaults (bnn_zoo.priors.default_prior):
    # the adapted step resolves the largest curvature, which a mixture's narrow component sets: every
    # kind then predicts the majority class
    recurrent_prior = Normal(1.0)

    kind: Literal["sgld", "sghmc", "cyclical"] = "sghmc"
    step_size: float | None = None
    batch_size: int | None = None
    num_samples: int = 500
    thinning: int = 10
    burn_in: int = 5000
    friction: float = 2.0
    cycles: int = 4
    exploration: float = 0.25
    num_chains: int = 2
    seed: int = 0
    checkpoint: str | Path | None = None
    checkpoint_every: int = 1000
    max_hours: float | None = 2.0
    progress: bool = True

    name = "sgmcmc"
    # when its chains fail their check; a lower friction is no remedy (benchmarks/sgmcmc_real_tables.py)
    remedy = "use NUTS or ChEES where the data fit in one batch, or run longer (burn_in, num_samples)"
    reference = False  # minibatch gradients bias the draws at any finite step size
    quick = {"num_samples": 50, "burn_in": 150, "thinning": 2}  # seconds on a small table (the conformance suite)

    def __post_init__(self):
        check_field_types(self)
        for name in ("num_samples", "thinning", "num_chains", "cycles", "checkpoint_every"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise BnnZooError(f"SGMCMC {name} must be a positive integer, got {getattr(self, name)!r}")
        check_max_hours("SGMCMC", self.max_hours)
        if not (isinstance(self.burn_in, int) and self.burn_in >= 0):
            raise BnnZooError(f"SGMCMC burn_in must be an integer >= 0, got {self.burn_in!r}")
        step_ok = self.step_size is None or (self.step_size > 0 and math.isfinite(self.step_size))
        if not (step_ok and self.friction > 0 and 0 <= self.exploration < 1):
            raise BnnZooError("SGMCMC needs step_size > 0 (or None: adapted), friction > 0 and 0 <= exploration < 1")
        if self.step_size is None and self.burn_in < 100:
            raise BnnZooError(
                f"SGMCMC adapts its step size over burn_in, which needs at least 100 steps, got {self.burn_in}; or "
                "give step_size"
            )
        if self.batch_size is not None and not (isinstance(self.batch_size, int) and self.batch_size > 0):
            raise BnnZooError(f"{type(self).__name__} batch_size must be a positive integer, got {self.batch_size!r}")

    def settings(self) -> dict:
        return {
            "method": self.name,
            **{
                k: getattr(self, k)
                for k in self.__dataclass_fields__
                if k not in ("checkpoint", "progress", "max_hours")
            },
        }

    @property
    def adapted(self) -> bool:
        return self.step_size is None

    @property
    def total_steps(self) -> int:
        if self.kind == "cyclical":
            return (self.burn_in if self.adapted else 0) + self.cycles * self._cycle_length
        return self.burn_in + self.num_samples * self.thinning

    @property
    def _cycle_length(self) -> int:
        per_cycle = math.ceil(self.num_samples / self.cycles)
        return math.ceil(per_cycle * self.thinning / (1 - self.exploration))

    def _schedule(self, step: int) -> tuple[float, float, bool]:
        """(step size as a fraction of eps, temperature, keep a draw after this step) at ``step`` (0-based)."""
        if self.kind != "cyclical":
            kept = step >= self.burn_in and (step - self.burn_in + 1) % self.thinning == 0
            return 1.0, 1.0, kept
        if self.adapted and step < self.burn_in:
            return 1.0, 1.0, False
        step -= self.burn_in if self.adapted else 0
        length = self._cycle_length
        phase = (step % length) / length
        sampling = phase >= self.exploration
        sampled_steps = step % length - math.ceil(self.exploration * length)
        return (
            (math.cos(math.pi * phase) + 1) / 2,
            (1.0 if sampling else 0.0),
            sampling and (sampled_steps + 1) % self.thinning == 0,
        )

    def _adapts_after(self, step: int) -> bool:
        """Whether the preconditioner is re-estimated after ``step`` (0-based)."""
        return self.adapted and any(step + 1 == math.floor(f * self.burn_in) for f in WINDOWS)

    def resolved(self, model: BNN, n: int) -> SGMCMC:
        """This sampler with its minibatch size for n training rows filled in
        (:func:`~bnn_zoo.inference.defaults.batch_size`)."""
        size = defaults.batch_size(self.batch_size, n)
        return self if size == self.batch_size else dataclasses.replace(self, batch_size=size)

    def run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        if (method := self.resolved(model, x.shape[0])) is not self:
            return method.run(model, x, y)
        with warnings.catch_warnings():  # tensordict announces a change of TensorClass defaults on import
            warnings.simplefilter("ignore", FutureWarning)
            import posteriors  # imported when SG-MCMC runs: `import bnn_zoo` stays lean

        start = time.perf_counter()
        with pyro.validation_enabled(False):  # the data were checked at the boundary; per-step checks only cost time
            return self._run(posteriors, model, x, y, start)

    def _run(self, posteriors, model, x, y, start) -> Posterior:
        identity = fingerprint(self.settings(), model.describe(), x, y)
        checkpoint = Checkpoint.at(self.checkpoint, identity, "SGMCMC", self.checkpoint_every, None)
        chains = _Chains(self, posteriors, model, x, y)
        total = self.num_chains * self.total_steps
        limit = lambda first: TimeLimit("SG-MCMC", self.max_hours, total - first, fix=STEPS_FIX)  # noqa: E731
        name = f"{self.kind} x{self.num_chains} chains"
        run_steps(chains, total, name, self.progress, limit, checkpoint)
        done = chains.done
        samples = {k: torch.stack([ch["draws"][k] for ch in done]) for k in done[0]["draws"]}
        stats = {k: torch.stack([ch["stats"][k] for ch in done]) for k in done[0]["stats"]}
        return Posterior(
            model, x, y, samples, self.settings(), sample_stats=stats, runtime_s=time.perf_counter() - start
        )

    def _check_finite(self, state, step: int) -> None:
        if not torch.isfinite(state.log_posterior):
            hint = (
                "give a smaller fixed step_size, or check the prior and data scales"
                if self.adapted
                else "lower step_size"
            )
            raise BnnZooError(f"SG-MCMC diverged at step {step} (log posterior {float(state.log_posterior)}); {hint}")


class _Chains:
    """SG-MCMC's chains one after another as the driver's steps (:class:`~bnn_zoo.inference.driver.Stepper`):
    step i is step i mod T of chain i // T, T = ``total_steps``. Its state is the finished chains' draws
    and the chain under way: its sampler state, frame, draws and statistics."""

    def __init__(self, method: SGMCMC, posteriors, model: BNN, x, y):
        self.method, self.posteriors, self.model = method, posteriors, model
        self.target = LogPosterior(model, x.shape[0])
        batch = method.batch_size if method.batch_size and method.batch_size < x.shape[0] else None
        self.draw = (lambda: (x, y)) if batch is None else (lambda: _batch(x, y, batch))  # noqa: E731
        self.minibatch = batch is not None
        self.done: list[dict] = []  # the finished chains: {"draws": {site: (S, ...)}, "stats": {name: (S,)}}
        self.frame = self.sampler = None  # the chain under way, from its first step to its last
        self.draws, self.stats = [], []

    def step(self, i: int) -> None:
        method, frame = self.method, self.frame
        chain, j = divmod(i, method.total_steps)
        if j == 0:
            frame = self._begin(chain)
        fraction, temperature, keep = method._schedule(j)
        adapting = method.adapted and j < method.burn_in
        kind = "sgld" if adapting else method.kind  # Langevin dynamics learn the frame: they explore it at once
        log_posterior = frame.log_posterior(self.target)
        eps = frame.eps * fraction
        args = (self.draw(), log_posterior, eps, temperature, frame, method.friction)
        self.sampler, log_lik = _update(self.posteriors, kind, self.sampler, *args)
        method._check_finite(self.sampler, j)
        weights = frame.weights(self.sampler.params)
        if adapting:
            frame.record(weights)
        if method._adapts_after(j):
            frame.adapt(weights)
            frame.set_step(self.target, "sgld", self.draw, self.minibatch)
            self.sampler = _init(self.posteriors, "sgld", frame.start)
        if adapting and j + 1 == method.burn_in:  # the kind's own dynamics from here, in the learned frame
            frame.set_step(self.target, method.kind, self.draw, self.minibatch)
            self.sampler = _init(self.posteriors, method.kind, self.sampler.params)
        if keep and len(self.draws) < method.num_samples:
            self.draws.append(self.target.constrained(frame.unflat(weights)))
            stats = {"step_size": eps, "log_posterior": float(self.sampler.log_posterior)}
            self.stats.append(stats | {"minibatch_log_likelihood": float(log_lik)})
        if j + 1 == method.total_steps:
            self._finish()

    def _begin(self, chain: int) -> _Frame:
        """Chain ``chain``'s frame and sampler, fresh from the network's initialisation."""
        method = self.method
        torch.manual_seed(method.seed + chain)
        self.frame = frame = _Frame(self.target.initial(self.model.network_init(method.seed + chain)), method.adapted)
        if method.adapted:
            frame.set_step(self.target, "sgld", self.draw, self.minibatch)
        else:
            frame.eps = method.step_size
        self.sampler = _init(self.posteriors, "sgld" if method.adapted and method.burn_in else method.kind, frame.start)
        return frame

    def _finish(self) -> None:
        draws, stats = self.draws, self.stats
        self.done.append(
            {
                "draws": {k: torch.stack([d[k] for d in draws]) for k in draws[0]},
                "stats": {k: torch.tensor([s[k] for s in stats]) for k in stats[0]},
            }
        )
        self.frame = self.sampler = None
        self.draws, self.stats = [], []

    def state(self) -> dict:
        if self.frame is None:  # between chains
            return {"chains": self.done}
        sampler = self.sampler
        return {
            "chains": self.done,
            "params": sampler.params,
            "momenta": getattr(sampler, "momenta", None),
            "log_posterior": sampler.log_posterior,
            "sampler_step": sampler.step,
            "frame": self.frame.state(),
            "draws": self.draws,
            "stats": self.stats,
        }

    def load(self, state: dict) -> None:
        keys = {"chains"} if "frame" not in state else {"chains", "params", "log_posterior", "sampler_step", "draws"}
        if not keys <= set(state):
            raise BnnZooError(
                f"checkpoint {self.method.checkpoint} is not an SG-MCMC checkpoint; delete it or point "
                "SGMCMC(checkpoint=...) elsewhere"
            )
        self.done = state["chains"]
        if "frame" in state:
            self.frame, self.sampler = _Frame.restore(state["frame"]), _restore(self.posteriors, state)
            self.draws, self.stats = state["draws"], state["stats"]


def _batch(x, y, size: int):
    index = torch.randint(x.shape[0], (size,))
    return x[index], y[index]


def _init(posteriors, kind: str, u: torch.Tensor):
    return posteriors.sgmcmc.sghmc.init(u) if kind == "sghmc" else posteriors.sgmcmc.sgld.init(u)


def _update(posteriors, kind, state, data, log_posterior, eps, temperature, frame, friction):
    if kind == "sghmc":
        return posteriors.sgmcmc.sghmc.update(
            state, data, log_posterior, lr=eps, alpha=friction * frame.friction_unit, temperature=temperature
        )
    return posteriors.sgmcmc.sgld.update(state, data, log_posterior, lr=eps, temperature=temperature)


class _Frame:
    """The chain's coordinates u, with weights w = anchor + L u (L a Cholesky factor, or a vector of
    sds when diagonal), the step size in them, and the running moments of the current adaptation
    window's iterates (Welford's: a window of a large network's iterates would not fit in memory)."""

    def __init__(self, params: dict, dense: bool):
        self.shapes = {k: v.shape for k, v in params.items()}
        self.dtypes = {k: v.dtype for k, v in params.items()}  # a learned noise may be float64 beside float32 weights
        w = self.flat(params)
        self.dense = dense and w.numel() <= DENSE_MAX
        self.anchor, self.scale = w.clone(), torch.ones_like(w)
        if self.dense:
            self.scale = torch.eye(w.numel(), dtype=w.dtype)
        self.start = torch.zeros_like(w)  # u of the chain's position when the frame last changed
        self.eps, self.friction_unit = 0.0, 1.0
        self._reset_window(w)

    def flat(self, params: dict) -> torch.Tensor:
        return torch.cat([params[k].reshape(-1) for k in self.shapes])

    def unflat(self, w: torch.Tensor) -> dict:
        out, i = {}, 0
        for k, shape in self.shapes.items():
            size = math.prod(shape)
            out[k] = w[i : i + size].reshape(shape).to(self.dtypes[k])
            i += size
        return out

    def weights(self, u: torch.Tensor) -> torch.Tensor:
        return self.anchor + (self.scale @ u if self.dense else self.scale * u)

    def log_posterior(self, target):
        return lambda u, batch: target(self.unflat(self.weights(u)), batch)

    def _reset_window(self, w: torch.Tensor) -> None:
        self.count, self.mean = 0, torch.zeros_like(w)
        self.m2 = torch.zeros(w.numel(), w.numel(), dtype=w.dtype) if self.dense else torch.zeros_like(w)

    def record(self, w: torch.Tensor) -> None:
        w = w.detach()
        self.count += 1
        delta = w - self.mean
        self.mean = self.mean + delta / self.count
        self.m2 = self.m2 + (torch.outer(delta, w - self.mean) if self.dense else delta * (w - self.mean))

    def adapt(self, w: torch.Tensor) -> None:
        """L from the window's iterates, regularised towards a small multiple of the identity as Stan's
        (n / (n + 5) S + 1e-3 * 5 / (n + 5) I); the chain continues from where it is (w)."""
        n = self.count
        cov = n / (n + 5) * self.m2 / max(n - 1, 1)
        if self.dense:
            self.scale = torch.linalg.cholesky(cov + 1e-3 * 5 / (n + 5) * torch.eye(cov.shape[0], dtype=cov.dtype))
        else:
            self.scale = (cov + 1e-3 * 5 / (n + 5)).sqrt()
        self.anchor, self.start = w.detach().clone(), torch.zeros_like(w)
        self._reset_window(w)

    def set_step(self, target, kind: str, draw, minibatch: bool) -> None:
        """eps from the largest curvature lambda of -log p in u (power iteration on Hessian-vector
        products, by differences of gradients) and, with minibatches, from the gradient noise: its variance b (the 99th
        percentile
        over coordinates, from 16 minibatches) adds eps b / 2 to Langevin's per-step variance of 1 (SGLD)
        and eps b / (2 alpha) to SGHMC's, so eps is capped where that is 5%."""
        log_posterior = self.log_posterior(target)
        lam = _largest_curvature(log_posterior, self.start, draw())
        self.friction_unit = math.sqrt(lam) if kind == "sghmc" else 1.0
        self.eps = (
            SCALED_STEP / (math.sqrt(lam) if kind == "sghmc" else lam) * (CYCLICAL_PEAK if kind == "cyclical" else 1)
        )
        noise = _gradient_noise(log_posterior, self.start, draw) if minibatch else 0.0
        if noise > 0:
            self.eps = min(self.eps, 0.1 * (2 * self.friction_unit if kind == "sghmc" else 1) / noise)

    def state(self) -> dict:
        keep = ("shapes", "dtypes", "dense", "anchor", "scale", "start", "eps", "friction_unit", "count", "mean", "m2")
        return {k: getattr(self, k) for k in keep}

    @classmethod
    def restore(cls, saved: dict) -> _Frame:
        frame = cls.__new__(cls)
        frame.__dict__.update(saved)
        return frame


def _gradient_noise(log_posterior, u: torch.Tensor, draw, batches: int = 16) -> float:
    """The minibatch gradient's variance in u, its 99th percentile over coordinates."""
    grad = torch.func.grad(lambda v, b: log_posterior(v, b)[0])
    grads = torch.stack([grad(u, draw()) for _ in range(batches)])
    # quantile's size limit
    return float(torch.quantile(grads.var(0), 0.99)) if grads.shape[1] <= 2**24 else float(grads.var(0).max())


def _largest_curvature(log_posterior, u: torch.Tensor, batch, iterations: int = 20, h: float = 1e-2) -> float:
    """|lambda_max| of -log p's Hessian at u: power iteration on central differences of gradients,
    (g(u + h v) - g(u - h v)) / 2h (exact for a quadratic; forward-over-reverse jvp fails on some
    likelihoods' mixed dtypes), h in whitened units, where curvatures are about 1."""
    grad = torch.func.grad(lambda v: log_posterior(v, batch)[0])
    v = torch.randn_like(u)
    lam = 1.0
    for _ in range(iterations):
        v = v / v.norm()
        hv = -(grad(u + h * v) - grad(u - h * v)) / (2 * h)
        lam = float(v @ hv)
        v = hv
        if not math.isfinite(lam):
            raise BnnZooError(
                "SG-MCMC's curvature is not finite at the chain's start; check the prior and the data scales"
            )
    return max(abs(lam), 1e-8)


def _restore(posteriors, saved: dict):
    """The sampler state a checkpoint holds: SGHMC's where it kept momenta (SGLD's during an adapted burn-in)."""
    step = saved["sampler_step"]
    if saved.get("momenta") is not None:
        return posteriors.sgmcmc.sghmc.SGHMCState(saved["params"], saved["momenta"], saved["log_posterior"], step)
    return posteriors.sgmcmc.sgld.SGLDState(saved["params"], saved["log_posterior"], step)
