"""NUTS and HMC: Pyro's kernels on the BNN model, chains in parallel processes, per-draw stats kept.

Pyro's MCMC keeps only divergences; ArviZ wants per-draw tree depth, step size and energy too. A
``hook_fn`` (Pyro's own per-draw callback) records them after each kept draw. Two values exist only
inside a transition, so small kernel subclasses keep them for the hook: the Hamiltonian at the
trajectory's start (the energy E-BFMI needs) and the number of leapfrog steps.
Each chain is one single-chain Pyro MCMC run, in a forked process of its own (``chain_method="parallel"``)
or one after another here. Pyro's own multi-chain mode is not used: its workers' kernels, and so the
stats above, never come back. Forked workers need nothing pickled, so any network class works; a
chain's draws and stats come back through ``torch.save`` and a ``weights_only`` load. On 2 cores two
chains of one thread each take the time of one (the demo's 1-50-1 NUTS: 97 and 120 s alone, 97 and
120 s side by side; docs/benchmarks.md): a small BNN's gradient is too small for a second thread.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np
import pyro
import pyro.infer.mcmc as pyro_mcmc
import torch
from pyro.infer.autoguide.initialization import init_to_sample, init_to_value

from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.inference import defaults, xla
from bnn_zoo.inference.budget import TimeLimit, check_max_hours
from bnn_zoo.inference.driver import FinishedChains, run_chains, workers
from bnn_zoo.inference.potential import chain_starts, check_init
from bnn_zoo.inference.svi import svi_start
from bnn_zoo.io import bar_disabled, fingerprint
from bnn_zoo.methods import FullBatchChains, register
from bnn_zoo.models import architecture
from bnn_zoo.posterior import Posterior
from bnn_zoo.priors import ScaleMixture


class _TransitionValues:
    """Keeps the trajectory's starting energy, its leapfrog steps and its acceptance probability, which
    Pyro computes and drops."""

    @property
    def _mean_accept_prob(self) -> float:
        return self.__dict__.get("_running_accept", 0.0)

    @_mean_accept_prob.setter
    def _mean_accept_prob(self, value: float) -> None:
        # Pyro keeps only a running mean over n iterations (n restarts after warm-up): the last
        # transition's probability is what moved it, p = m_old + n (m_new - m_old).
        old, t, warmup = self._mean_accept_prob, getattr(self, "_t", 0) or 0, getattr(self, "_warmup_steps", 0) or 0
        n = t - warmup if t > warmup else t
        self.accept_prob = old + n * (value - old) if n >= 1 else float("nan")
        self.__dict__["_running_accept"] = value

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


def _first_mass_update(adapter) -> int:
    """The iteration after which Pyro first sets the mass matrix from warm-up draws (0: it never does).

    Its schedule is Stan's: a step-size-only buffer, then slow windows each ending in a mass-matrix
    update (the first at iteration 100 of a 500-iteration warm-up), then a step-size-only end."""
    windows = adapter.adaptation_schedule
    return windows[1].end + 1 if adapter.adapt_mass_matrix and len(windows) > 2 else 0


def _recorder(stats: list, limit: TimeLimit):
    """An MCMC ``hook_fn`` appending, for each kept draw: diverging, leapfrog steps, tree depth, step
    size, energy, log density and acceptance probability (ArviZ's names); and checking the run's time
    limit after every iteration."""

    def hook(kernel, samples, stage, i):
        if kernel._t == 1 and kernel.cheaper_after_mass_update:  # the schedule exists once the kernel is set up
            limit.settle_at(_first_mass_update(kernel._adapter))
        limit.check(kernel._t)
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
                "acceptance_rate": kernel.accept_prob,
            }
        )

    return hook


class _NUTSKernel(_TransitionValues, pyro_mcmc.NUTS):
    # Its trees grow until they turn back, so a larger step size buys longer moves, not cheaper
    # iterations (docs/benchmarks-defaults.md, "MCMC time limit").
    cheaper_after_mass_update = False

    def _build_basetree(self, *args, **kwargs):
        self._steps += 1  # one leapfrog step per base tree
        return super()._build_basetree(*args, **kwargs)


class _HMCKernel(_TransitionValues, pyro_mcmc.HMC):
    # A fixed trajectory length takes trajectory_length / step_size leapfrog steps, so an iteration
    # costs less once the first mass matrix lifts the step size.
    cheaper_after_mass_update = True

    def __init__(self, model, max_leapfrog: int, **kwargs):
        super().__init__(model, **kwargs)
        self.max_leapfrog = max_leapfrog

    @property
    def num_steps(self) -> int:
        # Capped as ChEES's trajectories are: early dual averaging can cut the step size 100-fold in a
        # few iterations, and a fixed length then costs thousands of full-data gradients an iteration.
        # The cap is fixed once warm-up ends, as the step size is, so the kept draws' kernel is still
        # one reversible HMC kernel.
        return min(super().num_steps, self.max_leapfrog)


@dataclass
class _MCMC(FullBatchChains):
    """Settings shared by NUTS and HMC (documented on :class:`NUTS`)."""

    # a recurrent network's prior at this method's defaults (bnn_zoo.priors.default_prior):
    # a leapfrog step must resolve the narrow component: at 0.0025 the step size on the tied LSTM collapses
    recurrent_prior = ScaleMixture(scale2=0.05)

    num_warmup: int | None = None
    num_samples: int | None = None
    num_chains: int = 2
    init: object = "network"
    seed: int = 0
    target_accept: float = 0.8
    dense_mass: bool = False
    jit_compile: bool = True
    chain_method: Literal["parallel", "sequential"] = "parallel"
    max_hours: float | None = 2.0
    progress: bool = True
    checkpoint: str | Path | None = None

    name = "mcmc"
    counts = {"num_warmup": 0, "num_samples": 1, "num_chains": 1}  # integer settings and their least values

    def __post_init__(self):
        check_field_types(self)
        for name, least in self.counts.items():
            value = getattr(self, name)
            if not (value is None or (isinstance(value, int) and value >= least)):
                raise BnnZooError(f"{type(self).__name__} {name} must be an integer >= {least}, got {value!r}")
        check_init(self.init)
        check_max_hours(type(self).__name__, self.max_hours)

    def settings(self) -> dict:
        skip = {
            "init",
            "progress",
            "chain_method",
            "max_hours",
            "lockstep",
            "checkpoint",
        }  # the wall time, not the draws
        out = {"method": self.name, **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}}
        out["init"] = (
            "posterior"
            if isinstance(self.init, Posterior)
            else ("values" if isinstance(self.init, dict) else str(self.init))
        )
        return out

    def resolved(self, model, n: int) -> _MCMC:
        """This sampler with its defaults for ``model`` filled in (:mod:`~bnn_zoo.inference.defaults`)."""
        length = defaults.chain_length(architecture(model.net))
        return defaults.unset(self, num_warmup=length, num_samples=length)

    def run(self, model, x, y) -> Posterior:
        if (method := self.resolved(model, x.shape[0])) is not self:
            return method.run(model, x, y)
        if self.init == "svi":
            return dataclasses.replace(self, init=svi_start(model, x, y, self.seed, self.progress)).run(model, x, y)
        start = time.perf_counter()
        inits = self._inits(model)

        parallel = self.chain_method == "parallel"
        rounds = math.ceil(self.num_chains / workers(self.num_chains, parallel))

        def chain(c: int) -> dict:
            pyro.set_rng_seed(self.seed + c)
            stats = []
            limit = TimeLimit(type(self).__name__, self.max_hours, self.num_warmup + self.num_samples, rounds)
            mcmc = pyro_mcmc.MCMC(
                self._kernel(model, inits[c]),
                num_samples=self.num_samples,
                warmup_steps=self.num_warmup,
                disable_progbar=bar_disabled(self.progress and c == 0),  # in parallel, chain 0's bar speaks for all
                hook_fn=_recorder(stats, limit),
            )
            mcmc.run(x, y)
            return {"samples": mcmc.get_samples(), "stats": {k: torch.tensor([s[k] for s in stats]) for k in stats[0]}}

        identity = fingerprint(self.settings() | self.ran_on("torch"), model.describe(), x, y)
        with FinishedChains(self.checkpoint, identity, self.num_chains, self.progress, type(self).__name__) as kept:
            chains = run_chains(chain, self.num_chains, parallel=parallel, kept=kept)
        samples = {k: torch.stack([ch["samples"][k] for ch in chains]) for k in model.latent_shapes()}
        sample_stats = {k: torch.stack([ch["stats"][k] for ch in chains]) for k in chains[0]["stats"]}
        return Posterior(
            model,
            x,
            y,
            samples,
            self.settings() | self.ran_on("torch"),
            sample_stats=sample_stats,
            runtime_s=time.perf_counter() - start,
        )

    def ran_on(self, backend: str) -> dict:
        """The backend a run used, for its settings (HMC has only torch's)."""
        return {"backend": backend} if hasattr(self, "backend") else {}

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
        if self.init in (None, "network"):
            return [init_to_value(values=model.network_init(self.seed + c)) for c in range(self.num_chains)]
        if isinstance(self.init, Posterior):
            draws = self.init.draws(self.num_chains)
            return [init_to_value(values={k: v[c] for k, v in draws.items()}) for c in range(self.num_chains)]
        if isinstance(self.init, dict):
            return [init_to_value(values=self.init)] * self.num_chains
        return [init_to_sample] * self.num_chains  # "prior"


@register
@dataclass
class NUTS(_MCMC):
    """No-U-Turn sampler (Pyro's NUTS; Hoffman & Gelman 2014) with step size adapted by dual averaging
    and a diagonal (or dense) mass matrix from warm-up, on the same model object SVI fits.

    Args:
        num_warmup: warm-up (adaptation) iterations per chain (None: 500; 100 on convolutional and
            recurrent networks, where every leapfrog step is a pass of the whole network over all the data).
        num_samples: kept draws per chain (None: as ``num_warmup``).
        num_chains: chains (see ``chain_method``).
        init: where each chain starts: ``"network"``, the network's own initialisation (re-drawn per
            chain); ``"prior"``, a prior draw; ``"svi"``, a draw of a quick mean-field fit (2,000 steps);
            a fitted :class:`~bnn_zoo.Posterior`, one of its draws per chain; or a dict of site values.
        seed: chain c is seeded with ``seed + c``, so its draws do not depend on ``chain_method``.
        target_accept: the acceptance probability step-size adaptation aims at.
        dense_mass: adapt a dense mass matrix instead of a diagonal one; on a network it costs more per
            step and gave fewer effective samples per gradient (docs/guide/inference.md).
        jit_compile: compile the potential with ``torch.jit.trace`` (cheaper per gradient on small networks).
        chain_method: ``"parallel"``: each chain in a forked process, as many at once as this process may
            use cores (a sweep worker's share; ``OMP_NUM_THREADS=1`` does not make them sequential), torch's
            threads shared among them, at least one each (on Linux; where ``fork`` is not
            available or safe, as on macOS and Windows, or once CUDA is in use, chains run one after
            another); ``"sequential"``: one after another in this process, where a chain's error keeps
            its full traceback.
        max_hours: stop with a clear error once the run, projected from its pace after a minute, would
            take longer (:mod:`bnn_zoo.inference.budget`; before HMC's first mass-matrix update only a run
            too slow even if the rest ran 10x faster); None: no limit.
        progress: show Pyro's progress bar (in parallel, chain 0's).
        checkpoint: a path where each chain is saved as it finishes (:class:`FinishedChains`); an existing
            one of this fit is resumed, running only the chains it lacks.
        max_tree_depth: the deepest trajectory doubling (None: 10; 8 on recurrent networks, whose trees
            reach the cap at every draw).
        backend: ``"torch"``: Pyro's NUTS; ``"jax"``: NumPyro's NUTS (same adaptation: dual averaging,
            windowed mass matrix) on the model's log density traced to JAX
            (:mod:`bnn_zoo.inference.xla`), its chains in rounds of one per CPU core in this process; ``"auto"``: JAX
            where it runs beside the installed torch and the network has no convolution or recurrent layer
            (:func:`~bnn_zoo.inference.xla.resolve_backend`), torch otherwise.
        lockstep: in a sweep (or ``bnn-zoo reference``), run this cell with the others that differ from it
            only in split or seed as one XLA program (:mod:`bnn_zoo.inference.lockstep`); alone, no effect.
    """

    max_tree_depth: int | None = None
    backend: Literal["auto", "torch", "jax"] = "auto"
    lockstep: bool = False

    name = "nuts"
    quick = {"num_warmup": 40, "num_samples": 40, "num_chains": 2, "max_tree_depth": 5}  # seconds on a small table
    counts = _MCMC.counts | {"max_tree_depth": 1}

    def __post_init__(self):
        super().__post_init__()
        xla.check_backend("NUTS", self.backend)

    def resolved(self, model, n: int) -> NUTS:
        return defaults.unset(
            super().resolved(model, n), max_tree_depth=8 if architecture(model.net) == "recurrent" else 10
        )

    def run(self, model, x, y) -> Posterior:
        if self.resolved(model, x.shape[0]) is not self or self.init == "svi":
            return super().run(model, x, y)
        if xla.resolve_backend(self.backend, model) == "jax":
            start = time.perf_counter()
            starts = chain_starts(
                model, self.init, self.num_chains, self.seed, torch.Generator().manual_seed(self.seed)
            )
            target = xla.jax_target("NUTS", model, x, y, starts)
            if target is not None:
                identity = fingerprint(self.settings() | self.ran_on("jax"), model.describe(), x, y)
                with FinishedChains(
                    self.checkpoint, identity, self.num_chains, self.progress, type(self).__name__
                ) as kept:
                    samples, stats = xla.run_nuts(
                        target,
                        target.start(starts),
                        self,
                        progress=not bar_disabled(self.progress),
                        done={c: [t.numpy() for t in columns] for c, columns in kept.chains.items()},
                        on_chain=lambda c, columns: kept.add(c, [torch.tensor(np.asarray(a)) for a in columns]),
                    )
                return Posterior(
                    model,
                    x,
                    y,
                    samples,
                    self.settings() | self.ran_on("jax"),
                    sample_stats=stats,
                    runtime_s=time.perf_counter() - start,
                )
        return super().run(model, x, y)

    def _kernel(self, model, init_strategy):
        return _NUTSKernel(model, max_tree_depth=self.max_tree_depth, **self._shared(init_strategy))


@register
@dataclass
class HMC(_MCMC):
    """Hamiltonian Monte Carlo with a fixed trajectory length (Pyro's HMC; Neal 2011); the step size is
    adapted in warm-up.

    Arguments as :class:`NUTS`, plus:

    Args:
        trajectory_length: the integration time per transition.
        step_size: the initial step size.
        max_leapfrog: the most leapfrog steps in one trajectory (caps trajectory_length / step_size, as
            :class:`ChEES` does): a transition costs at most this many gradients, however small warm-up
            makes the step size (None: 1,000; 255 on convolutional and recurrent networks).
    """

    trajectory_length: float = 1.0
    step_size: float = 0.01
    max_leapfrog: int | None = None

    name = "hmc"
    quick = {"num_warmup": 40, "num_samples": 40, "num_chains": 2}
    args_documented_by = NUTS  # the arguments HMC shares with NUTS
    counts = _MCMC.counts | {"max_leapfrog": 1}

    def __post_init__(self):
        super().__post_init__()
        for name in ("trajectory_length", "step_size"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):
                raise BnnZooError(f"HMC {name} must be a finite number > 0, got {getattr(self, name)!r}")

    def resolved(self, model, n: int) -> HMC:
        return defaults.unset(
            super().resolved(model, n), max_leapfrog=1000 if architecture(model.net) == "dense" else 255
        )

    def _kernel(self, model, init_strategy):
        return _HMCKernel(
            model,
            max_leapfrog=self.max_leapfrog,
            step_size=self.step_size,
            trajectory_length=self.trajectory_length,
            **self._shared(init_strategy),
        )
