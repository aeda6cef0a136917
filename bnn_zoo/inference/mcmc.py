"""NUTS and HMC: Pyro's kernels on the BNN model, chains run one after another, per-draw stats kept.

Pyro's MCMC keeps only divergences; ArviZ wants per-draw tree depth, step size and energy too. A
``hook_fn`` (Pyro's own per-draw callback) records them after each kept draw. Two values exist only
inside a transition, so small kernel subclasses keep them for the hook: the Hamiltonian at the
trajectory's start (the energy E-BFMI needs) and the number of leapfrog steps.
Chains run sequentially in this process: Pyro's multi-chain mode forks workers, whose kernels (and
their stats) never come back, and on 2 cores parallel chains only contend for the same threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import pyro
import pyro.infer.mcmc as pyro_mcmc
import torch
from pyro.infer.autoguide.initialization import init_to_sample, init_to_value

from bnn_zoo.errors import BnnZooError
from bnn_zoo.io import bar_disabled
from bnn_zoo.posterior import Posterior


class _TransitionValues:
    """Keeps the trajectory's starting energy and its leapfrog steps, which Pyro computes and drops."""

    def _sample_r(self, name):
        r, r_unscaled = super()._sample_r(name)
        if name.startswith("r_t="):  # the momentum of a transition (not a step-size search)
            # The Hamiltonian at the start of the trajectory: conserved along it up to integration
            # error, so it is the energy E-BFMI needs (Betancourt 2016).
            self._energy = float(self._kinetic_energy(r_unscaled) + self._potential_energy_last)
        return r, r_unscaled

    def sample(self, params):
        self._steps = 0
        return super().sample(params)


def _recorder(stats: list):
    """An MCMC ``hook_fn`` appending, for each kept draw: diverging, leapfrog steps, tree depth, step
    size, energy and log density."""

    def hook(kernel, samples, stage, i):
        if stage != "Sample":
            return
        steps = kernel._steps or kernel.num_steps
        draw = kernel._t - 1 - kernel._warmup_steps  # Pyro logs divergences by kept-draw index
        stats.append(
            {
                "diverging": bool(kernel._divergences) and kernel._divergences[-1] == draw,
                "n_steps": steps,
                "tree_depth": int(steps).bit_length(),
                "step_size": float(kernel.step_size),
                "energy": kernel._energy,
                "lp": -float(kernel._potential_energy_last),
            }
        )

    return hook


class _NUTSKernel(_TransitionValues, pyro_mcmc.NUTS):
    def _build_basetree(self, *args, **kwargs):
        self._steps += 1  # one leapfrog step per base tree
        return super()._build_basetree(*args, **kwargs)


class _HMCKernel(_TransitionValues, pyro_mcmc.HMC):
    pass


@dataclass
class _MCMC:
    """Settings shared by NUTS and HMC (documented on :class:`NUTS`)."""

    num_warmup: int = 500
    num_samples: int = 500
    num_chains: int = 1
    init: object = None
    seed: int = 0
    target_accept: float = 0.8
    dense_mass: bool = False
    jit_compile: bool = True
    progress: bool = True

    name = "mcmc"

    def __post_init__(self):
        for name, least in (("num_warmup", 0), ("num_samples", 1), ("num_chains", 1)):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= least):
                raise BnnZooError(f"{type(self).__name__} {name} must be an integer >= {least}, got {value!r}")
        if not (isinstance(self.init, (dict, Posterior)) or self.init in (None, "prior")):
            raise BnnZooError(f"init must be None, 'prior', a fitted Posterior or a dict of site values, got {self.init!r}")

    def settings(self) -> dict:
        skip = {"init", "progress"}
        out = {"method": self.name, **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}}
        out["init"] = "posterior" if isinstance(self.init, Posterior) else ("values" if isinstance(self.init, dict) else str(self.init))
        return out

    def run(self, model, x, y) -> Posterior:
        start = time.perf_counter()
        inits = self._inits(model)
        chains, stats = [], []
        for c in range(self.num_chains):
            pyro.set_rng_seed(self.seed + c)
            stats.append([])
            mcmc = pyro_mcmc.MCMC(
                self._kernel(model, inits[c]),
                num_samples=self.num_samples,
                warmup_steps=self.num_warmup,
                disable_progbar=bar_disabled(self.progress),
                hook_fn=_recorder(stats[-1]),
            )
            mcmc.run(x, y)
            chains.append(mcmc.get_samples())
        samples = {k: torch.stack([ch[k] for ch in chains]) for k in model.latent_shapes()}
        sample_stats = {k: torch.tensor([[s[k] for s in st] for st in stats]) for k in stats[0][0]}
        return Posterior(model, x, y, samples, self.settings(), sample_stats=sample_stats, runtime_s=time.perf_counter() - start)

    def _shared(self, init_strategy) -> dict:
        """Kernel arguments NUTS and HMC share."""
        return dict(
            init_strategy=init_strategy,
            target_accept_prob=self.target_accept,
            full_mass=self.dense_mass,
            jit_compile=self.jit_compile,
            ignore_jit_warnings=True,
        )

    def _inits(self, model):
        if self.init is None:
            return [init_to_value(values=model.network_init(self.seed + c)) for c in range(self.num_chains)]
        if isinstance(self.init, Posterior):
            draws = self.init.draws(self.num_chains)
            return [init_to_value(values={k: v[c] for k, v in draws.items()}) for c in range(self.num_chains)]
        if isinstance(self.init, dict):
            return [init_to_value(values=self.init)] * self.num_chains
        return [init_to_sample] * self.num_chains  # "prior"


@dataclass
class NUTS(_MCMC):
    """No-U-Turn sampler (Pyro's NUTS; Hoffman & Gelman 2014) with step size adapted by dual averaging
    and a diagonal (or dense) mass matrix from warm-up, on the same model object SVI fits.

    Args:
        num_warmup: warm-up (adaptation) iterations per chain.
        num_samples: kept draws per chain.
        num_chains: chains, run one after another in this process.
        init: where each chain starts: None, the network's own initialisation (re-drawn per chain);
            ``"prior"``, a prior draw; a fitted :class:`~bnn_zoo.Posterior` (say from SVI), one of its
            draws per chain; or a dict of site values.
        seed: chain c is seeded with ``seed + c``.
        target_accept: the acceptance probability step-size adaptation aims at.
        dense_mass: adapt a dense mass matrix instead of a diagonal one.
        jit_compile: compile the potential with ``torch.jit.trace`` (about 3x faster per gradient).
        progress: show Pyro's progress bar.
        max_tree_depth: the deepest trajectory doubling.
    """

    max_tree_depth: int = 10

    name = "nuts"

    def _kernel(self, model, init_strategy):
        return _NUTSKernel(model, max_tree_depth=self.max_tree_depth, **self._shared(init_strategy))


@dataclass
class HMC(_MCMC):
    """Hamiltonian Monte Carlo with a fixed trajectory length (Pyro's HMC; Neal 2011); the step size is
    adapted in warm-up. Arguments as :class:`NUTS`, plus:

    Args:
        trajectory_length: the integration time per transition.
        step_size: the initial step size.
    """

    trajectory_length: float = 1.0
    step_size: float = 0.01

    name = "hmc"

    def _kernel(self, model, init_strategy):
        return _HMCKernel(model, step_size=self.step_size, trajectory_length=self.trajectory_length, **self._shared(init_strategy))
