"""Stochastic-gradient MCMC on the BNN model, for data too large for full-batch NUTS: minibatch
Langevin dynamics (SGLD; Welling & Teh 2011), SGHMC with friction (Chen et al. 2014, the variant
Heek's thesis uses) and cyclical SGLD (Zhang et al. 2020).

The update rules are the ``posteriors`` package's (``posteriors.sgmcmc.sgld`` and ``.sghmc``, written
on torch.func); bnn-zoo gives them the model's minibatch log posterior, the step-size and temperature
schedules, the thinning, the draws' bookkeeping and checkpoints.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.inference.potential import LogPosterior
from bnn_zoo.io import atomic_torch_save, bar_disabled, check_identity, fingerprint, safe_torch_load, say_resumed
from bnn_zoo.posterior import Posterior

KINDS = ("sgld", "sghmc", "cyclical")


@dataclass
class SGMCMC:
    """Minibatch MCMC: every step follows a stochastic gradient of log p(w) + (N / M) sum_batch log p(y | x, w).

    - ``"sgld"``: w <- w + eps grad + N(0, 2 eps) (Langevin dynamics discretised by Euler-Maruyama;
      Welling & Teh 2011 eq. 4 with eps = their epsilon / 2). Its stationary law is biased by O(eps):
      for a Gaussian target of precision P it is N(mu, (P - eps P^2 / 2)^-1).
    - ``"sghmc"``: w <- w + eps m, m <- m + eps grad - eps alpha m + N(0, 2 alpha eps) (Chen et al. 2014
      eq. 15 with unit mass; ``friction`` is alpha).
    - ``"cyclical"``: SGLD whose step size follows cosine cycles, eps_k = eps / 2 (cos(pi (k mod L) / L) + 1)
      (Zhang et al. 2020 eq. 1); the first ``exploration`` of each cycle runs without noise
      (optimisation) and draws are taken in the rest.

    Args:
        kind: ``"sgld"``, ``"sghmc"`` or ``"cyclical"``.
        step_size: eps (the peak of the cyclical schedule).
        batch_size: minibatch size M (default: full batch).
        num_samples: draws kept per chain.
        thinning: steps between kept draws.
        burn_in: steps before the first kept draw (sgld, sghmc).
        friction: SGHMC's alpha.
        cycles: cyclical SGLD's number of cycles.
        exploration: cyclical SGLD's fraction of each cycle without noise.
        num_chains: chains, run one after another (each from the network's own initialisation).
        seed: chain c is seeded with ``seed + c``.
        checkpoint: a path written every ``checkpoint_every`` steps and on Ctrl-C; an existing one is resumed.
        checkpoint_every: steps between checkpoints.
        progress: show a progress bar.
    """

    kind: str = "sghmc"
    step_size: float = 1e-4
    batch_size: int | None = None
    num_samples: int = 500
    thinning: int = 10
    burn_in: int = 2000
    friction: float = 0.1
    cycles: int = 4
    exploration: float = 0.5
    num_chains: int = 1
    seed: int = 0
    checkpoint: str | Path | None = None
    checkpoint_every: int = 1000
    progress: bool = True

    name = "sgmcmc"

    def __post_init__(self):
        check_field_types(self)
        if self.kind not in KINDS:
            raise BnnZooError(f"unknown SG-MCMC kind {self.kind!r}; choose one of {', '.join(KINDS)}")
        for name in ("num_samples", "thinning", "num_chains", "cycles", "checkpoint_every"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise BnnZooError(f"SGMCMC {name} must be a positive integer, got {getattr(self, name)!r}")
        if not (isinstance(self.burn_in, int) and self.burn_in >= 0):
            raise BnnZooError(f"SGMCMC burn_in must be an integer >= 0, got {self.burn_in!r}")
        if not (self.step_size > 0 and math.isfinite(self.step_size) and self.friction > 0 and 0 <= self.exploration < 1):
            raise BnnZooError("SGMCMC needs step_size > 0, friction > 0 and 0 <= exploration < 1")
        if self.batch_size is not None and not (isinstance(self.batch_size, int) and self.batch_size > 0):
            raise BnnZooError(f"batch_size must be a positive integer, got {self.batch_size!r}")

    def settings(self) -> dict:
        return {"method": self.name, **{k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("checkpoint", "progress")}}

    @property
    def total_steps(self) -> int:
        if self.kind == "cyclical":
            return self.cycles * self._cycle_length
        return self.burn_in + self.num_samples * self.thinning

    @property
    def _cycle_length(self) -> int:
        per_cycle = math.ceil(self.num_samples / self.cycles)
        return math.ceil(per_cycle * self.thinning / (1 - self.exploration))

    def _schedule(self, step: int) -> tuple[float, float, bool]:
        """(step size, temperature, keep a draw after this step) at ``step`` (0-based)."""
        if self.kind != "cyclical":
            kept = step >= self.burn_in and (step - self.burn_in + 1) % self.thinning == 0
            return self.step_size, 1.0, kept
        length = self._cycle_length
        phase = (step % length) / length
        eps = self.step_size / 2 * (math.cos(math.pi * phase) + 1)
        sampling = phase >= self.exploration
        sampled_steps = step % length - math.ceil(self.exploration * length)
        return eps, (1.0 if sampling else 0.0), sampling and (sampled_steps + 1) % self.thinning == 0

    def run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        with warnings.catch_warnings():  # tensordict announces a change of TensorClass defaults on import
            warnings.simplefilter("ignore", FutureWarning)
            import posteriors  # imported when SG-MCMC runs: `import bnn_zoo` stays lean

        start = time.perf_counter()
        target = LogPosterior(model, x.shape[0])
        identity = fingerprint(self.settings(), model.describe(), x, y)
        saved = _resume(self.checkpoint, identity) if self.checkpoint is not None and Path(self.checkpoint).exists() else None
        if saved:
            say_resumed(self.checkpoint, saved["step"], self.total_steps, self.progress)
        chains = saved["chains"] if saved else []
        for c in range(len(chains), self.num_chains):
            chains.append(self._chain(posteriors, model, target, x, y, c, saved if saved and saved["chain"] == c else None, chains, identity))
            saved = None
        samples = {k: torch.stack([ch["draws"][k] for ch in chains]) for k in chains[0]["draws"]}
        stats = {k: torch.stack([ch["stats"][k] for ch in chains]) for k in chains[0]["stats"]}
        if self.checkpoint is not None:
            Path(self.checkpoint).unlink(missing_ok=True)  # the posterior supersedes it
        return Posterior(model, x, y, samples, self.settings(), sample_stats=stats, runtime_s=time.perf_counter() - start)

    def _chain(self, posteriors, model, target, x, y, chain: int, saved: dict | None, done: list, identity: str) -> dict:
        n = x.shape[0]
        batch = self.batch_size if self.batch_size and self.batch_size < n else None
        step_size, temperature = (lambda s: self._schedule(int(s))[0]), (lambda s: self._schedule(int(s))[1])
        if self.kind == "sghmc":
            transform = posteriors.sgmcmc.sghmc.build(target, lr=step_size, alpha=self.friction, temperature=temperature)
        else:
            transform = posteriors.sgmcmc.sgld.build(target, lr=step_size, temperature=temperature)
        if saved is None:
            torch.manual_seed(self.seed + chain)
            state = transform.init(target.initial(model.network_init(self.seed + chain)))
            draws, stats, first = [], [], 0
        else:  # check_identity has made sure the checkpoint is this fit's
            state, draws, stats, first = _restore(posteriors, self.kind, saved), saved["draws"], saved["stats"], saved["step"]
            torch.set_rng_state(saved["rng"])
        bar = tqdm(
            range(first, self.total_steps), desc=f"{self.kind} chain {chain}", disable=bar_disabled(self.progress), initial=first, total=self.total_steps
        )
        try:
            for step in bar:
                rng = torch.get_rng_state()  # a checkpoint taken mid-step restarts this step exactly
                index = None if batch is None else torch.randint(n, (batch,))
                state, log_lik = transform.update(state, (x, y) if index is None else (x[index], y[index]))
                if not torch.isfinite(state.log_posterior):
                    raise BnnZooError(f"SG-MCMC diverged at step {step} (log posterior {float(state.log_posterior)}); lower step_size")
                eps, _, keep = self._schedule(step)
                if keep and len(draws) < self.num_samples:
                    draws.append(target.constrained(state.params))
                    stats.append({"step_size": eps, "log_posterior": float(state.log_posterior), "minibatch_log_likelihood": float(log_lik)})
                if self.checkpoint is not None and (step + 1) % self.checkpoint_every == 0:
                    _save(self.checkpoint, identity, chain, step + 1, state, draws, stats, torch.get_rng_state(), done)
        except KeyboardInterrupt:
            if self.checkpoint is not None:
                _save(self.checkpoint, identity, chain, step, state, draws, stats, rng, done)
                print(f"interrupted: checkpoint at step {step} of chain {chain} saved to {self.checkpoint}; run again to resume")
            raise
        return {"draws": {k: torch.stack([d[k] for d in draws]) for k in draws[0]}, "stats": {k: torch.tensor([s[k] for s in stats]) for k in stats[0]}}


def _save(path, identity, chain, step, state, draws, stats, rng, done):
    momenta = getattr(state, "momenta", None)
    atomic_torch_save(
        {
            "identity": identity,
            "chain": chain,
            "step": step,
            "params": dict(state.params),
            "momenta": None if momenta is None else dict(momenta),
            "log_posterior": state.log_posterior,
            "draws": draws,
            "stats": stats,
            "rng": rng,
            "chains": done,
        },
        path,
    )


def _resume(path, identity: str) -> dict:
    saved = safe_torch_load(path)
    check_identity(saved, identity, path, "SGMCMC")
    if not {"chain", "step", "params", "draws", "stats", "rng", "chains"} <= set(saved):
        raise BnnZooError(f"checkpoint {path} is not an SG-MCMC checkpoint; delete it or point SGMCMC(checkpoint=...) elsewhere")
    return saved


def _restore(posteriors, kind, saved):
    step = torch.tensor(saved["step"])
    if kind == "sghmc":
        return posteriors.sgmcmc.sghmc.SGHMCState(saved["params"], saved["momenta"], saved["log_posterior"], step)
    return posteriors.sgmcmc.sgld.SGLDState(saved["params"], saved["log_posterior"], step)
