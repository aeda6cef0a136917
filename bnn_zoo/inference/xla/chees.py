"""BlackJAX's ChEES adaptation and jittered dynamic HMC on a :class:`~bnn_zoo.inference.xla.tracing.JaxTarget`:
one run's chains, checkpointed after warm-up and every ``checkpoint_every`` draws, or many cells in one program."""

from __future__ import annotations

import math

import numpy as np
import torch

from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.boundary import say_saved
from bnn_zoo.inference.budget import TimeLimitExceeded
from bnn_zoo.inference.driver import Checkpoint
from bnn_zoo.inference.xla import devices
from bnn_zoo.inference.xla.devices import collecting, in_rounds, on_target_device
from bnn_zoo.inference.xla.supervision import Watch
from bnn_zoo.inference.xla.tracing import JaxTarget, padded
from bnn_zoo.io import bar_disabled

LENGTH_FLOOR_MAX_DIM = 4096  # BlackJAX's slow-direction length floor keeps a d x d covariance
INITIAL_STEP_SIZE = 0.01  # BlackJAX's ChEES adapted from here on Boston 13-50-1, not from larger steps


@on_target_device
def run_chees(target: JaxTarget, q0: torch.Tensor, method, identity: str) -> tuple[dict, dict, dict]:
    """BlackJAX's ChEES adaptation and jittered dynamic HMC, every chain in one vmapped program, from
    starts q0 (C, d), watched (:class:`Watch`): (site draws (C, S, ...), sample stats (C, S), the adapted
    step size and trajectory length).

    With ``method.checkpoint``, the chains and the adapted kernel are saved at the end of warm-up and
    every ``checkpoint_every`` kept draws after it; an existing checkpoint with this ``identity``
    resumes there. Warm-up is one compiled program: stopped, it starts again."""
    import jax
    import jax.numpy as jnp

    chains = q0.shape[0]
    warmup_steps, total = method.num_warmup, method.num_warmup + method.num_samples
    key_warmup, key_sample = jax.random.split(jax.random.PRNGKey(method.seed))
    run = {}  # the chains' states, the adapted kernel and the draws kept so far: what a checkpoint holds
    checkpoint = Checkpoint.at(method.checkpoint, identity, "ChEES", method.checkpoint_every, _holding(run))
    saved = _loaded(checkpoint)
    done = saved.pop("iteration") if saved else 0
    if saved:
        checkpoint.resumed(done, total, method.progress)
    # BlackJAX's diagonal mass matrix engages half-way through warm-up; the pace before overstates the rest's
    watch = Watch("ChEES", total, method.max_hours, not bar_disabled(method.progress), done, warmup_steps // 2)
    with watch.running():
        if saved:
            run.update(saved, states=_chees_state(saved["states"]))
        else:
            q0 = jnp.asarray(q0.cpu().numpy())
            states, parameters = _chees_warmup(target.logdensity, q0, method, key_warmup, watch)
            run.update(states=states, parameters=parameters, kept=None)
            done = warmup_steps
            if checkpoint is not None:
                checkpoint.save(done)
        sample = _sampling(target.logdensity, run["parameters"], total, chains, watch)
        keys = jax.random.split(key_sample, method.num_samples)
        every = method.num_samples if checkpoint is None else method.checkpoint_every
        try:
            for a in range(done - warmup_steps, method.num_samples, every):
                run["states"], out = sample(run["states"], keys[a : a + every], warmup_steps + a)
                chunk = {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in zip(_CHEES_COLUMNS, out, strict=True)}
                kept = run["kept"]
                run["kept"] = chunk if kept is None else {k: np.concatenate([kept[k], chunk[k]], axis=1) for k in kept}
                if checkpoint is not None and a + every < method.num_samples:
                    done = warmup_steps + a + every
                    checkpoint.save(done)
        except (KeyboardInterrupt, TimeLimitExceeded) as stop:
            if checkpoint is not None:
                say_saved(stop, f"checkpoint at iteration {done} of {total} saved to {checkpoint.path}")
            raise
    if checkpoint is not None:
        checkpoint.discard()
    return _chees_result(target, run["kept"], run["parameters"])


def _sampling(logdensity, parameters: dict, total: int, chains: int, watch: Watch):
    """The compiled sampling program: (states, keys (n, 2), first iteration) -> (states, columns of n draws)."""
    import jax
    import jax.numpy as jnp

    kernel = _chees_kernel(logdensity, parameters, total)

    @jax.jit
    def sample(states, keys, first):
        def one(states, key_and_i):
            key, i = key_and_i
            states, info = jax.vmap(kernel.step)(jax.random.split(key, chains), states)
            watch.hook(i)
            return states, (states.position, states.logdensity, *_chees_info(info))

        return jax.lax.scan(one, states, (keys, first + 1 + jnp.arange(keys.shape[0])))

    return sample


@on_target_device
def run_chees_cells(
    target: JaxTarget, data: list, q0s: list, seeds: list[int], method, progress: bool, finished=None
) -> list:
    """ChEES on K cells in one XLA program: cell k's chains start at q0s[k] (C, d) on its training data
    data[k] = (x, y) (:func:`padded`), seeded by seeds[k], every cell with the model and settings of
    ``method``. Each cell adapts its own step size, trajectory length and mass matrix with the keys of
    its run alone, so its draws equal that run's up to float rounding. On a GPU the cells advance in
    lockstep (an iteration costs the longest of their trajectories); on the CPU side by side on the
    cores, a round of one cell per core at a time (:func:`in_rounds`).
    Returns (site draws (C, S, ...), sample stats (C, S), the adapted step size and trajectory length)
    per cell; ``finished(k, result)`` is called with each cell's as soon as it is done (on a GPU, at the end)."""
    import jax
    import jax.numpy as jnp

    chains, count = q0s[0].shape[0], len(data)
    warmup_steps, total = method.num_warmup, method.num_warmup + method.num_samples
    keys = jnp.stack([jax.random.split(jax.random.PRNGKey(seed)) for seed in seeds])  # (K, 2: warm-up, sampling)
    cells, q0 = padded(data), jnp.asarray(torch.stack(q0s).cpu().numpy())
    lockstep = devices.in_lockstep(target)
    lanes = 1 if lockstep else devices.cpu_lanes(target, count)
    name = "ChEES" + (f" x{count} cells" if count > 1 else "")
    rounds = 1 if lockstep else -(-count // lanes)
    # max_hours bounds each cell's own time: its round's on the CPU, the whole program's in lockstep
    watch = Watch(name, total * lanes * rounds, method.max_hours, progress, 0, warmup_steps // 2, turns=rounds)

    def cell_program(item, _, lane, r):
        (key_warmup, key_sample), q, cell = item
        logdensity = lambda p: target.data_logdensity(p, *cell)  # noqa: E731
        # under vmap a callback takes no cond: every iteration calls back
        offset_watch = _Offset(watch, r * total, lane, every=1 if lockstep else 5)
        states, parameters = _chees_warmup(logdensity, q, method, key_warmup, offset_watch)
        kernel = _chees_kernel(logdensity, parameters, total)

        def one(states, key_and_i):
            key, i = key_and_i
            states, info = jax.vmap(kernel.step)(jax.random.split(key, chains), states)
            offset_watch.hook(i)
            return states, (states.position, states.logdensity, *_chees_info(info))

        sampling = (jax.random.split(key_sample, method.num_samples), warmup_steps + 1 + jnp.arange(method.num_samples))
        return parameters, jax.lax.scan(one, states, sampling)[1]

    def every_cell_at_once():
        yield 0, jax.jit(jax.vmap(lambda item: cell_program(item, None, 0, 0)))((keys, q0, cells))

    rounds = every_cell_at_once() if lockstep else in_rounds(cell_program, (keys, q0, cells), None, lanes, watch)
    results, finished = [], collecting(finished)
    with watch.running():  # blocks until XLA is done: its callbacks read the watch's pipe
        for first, (parameters, out) in rounds:
            for j in range(out[0].shape[0]):
                kept = {k: np.swapaxes(np.asarray(v[j]), 0, 1) for k, v in zip(_CHEES_COLUMNS, out, strict=True)}
                adapted = {k: np.asarray(v[j]) for k, v in parameters.items()}
                results.append(finished(first + j, _chees_result(target, kept, adapted)))
    return results


class _Offset:
    """A :class:`Watch` seen from one cell of a batch: its iterations counted after ``offset`` others."""

    def __init__(self, watch: Watch, offset, lane, every: int):
        self.watch, self.offset, self.lane, self.every = watch, offset, lane, every

    def hook(self, i) -> None:
        self.watch.hook(self.offset + i, every=self.every, lane=self.lane)


def _chees_kernel(logdensity, parameters: dict, total: int):
    """BlackJAX's jittered dynamic HMC with ChEES's adapted step size, mass matrix and trajectory length."""
    import blackjax
    import jax.numpy as jnp

    return blackjax.dynamic_hmc(
        logdensity,
        step_size=parameters["step_size"],
        inverse_mass_matrix=jnp.asarray(parameters["inverse_mass_matrix"]),
        next_random_arg_fn=lambda i: i + 1,  # as in warm-up: the Halton sequence's index
        integration_steps_fn=lambda i, n: jnp.asarray(jnp.ceil(_halton(i, total) * n), dtype=int),
        integration_steps_params=(parameters["steps"],),
    )


def _chees_info(info) -> tuple:
    return info.is_divergent, info.num_integration_steps, info.energy, info.acceptance_rate


def _chees_result(target: JaxTarget, kept: dict, parameters: dict) -> tuple[dict, dict, dict]:
    """One run's draws, stats (the torch ChEES's names) and adapted kernel from arrays (C, S, ...)."""
    column = {k: torch.from_numpy(np.array(v)) for k, v in kept.items()}
    step_size, steps = float(parameters["step_size"]), column["n_steps"].long()
    stats = {
        "acceptance_rate": column["acceptance_rate"].double(),
        "diverging": column["diverging"].bool(),
        "energy": column["energy"].double(),
        "lp": column["lp"].double(),
        "step_size": torch.full(steps.shape, step_size, dtype=torch.float64),
        "n_steps": steps,
        "trajectory_length": steps.double() * step_size,
    }
    info = {"step_size": step_size, "trajectory_length": float(parameters["steps"]) * step_size}
    return target.to_torch(column["draws"]), stats, info


_CHEES_COLUMNS = ("draws", "lp", "diverging", "n_steps", "energy", "acceptance_rate")


def _halton(i, total: int):
    """BlackJAX's jitter of ChEES's trajectory lengths: the i-th point of the base-2 Halton sequence."""
    from blackjax.mcmc.dynamic_hmc import halton_sequence

    return halton_sequence(i, math.ceil(math.log2(total)))


def _chees_warmup(logdensity, q0, method, key, watch: Watch):
    """BlackJAX's ChEES adaptation of chains from q0 (C, d): (their states, the adapted kernel's parameters)."""
    import blackjax
    import optax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    keep_nothing = get_filter_adapt_info_fn()

    def info(state, step_info, adaptation):
        watch.hook(adaptation.step)
        return keep_nothing(state, step_info, adaptation)

    chains, dim = q0.shape
    warmup = blackjax.chees_adaptation(
        logdensity,
        chains,
        target_acceptance_rate=method.target_accept,
        max_leapfrog_steps=method.max_leapfrog,
        adaptation_info_fn=info,
        mass_matrix_estimation="diagonal",  # pooled over chains, as the torch sampler's "pooled"
        _length_floor=dim <= LENGTH_FLOOR_MAX_DIM,
    )
    (states, parameters), _ = warmup.run(
        key,
        q0,
        step_size=INITIAL_STEP_SIZE,
        optim=optax.adam(method.trajectory_lr),
        num_steps=method.num_warmup,
        max_sampling_steps=method.num_samples,
    )
    steps = parameters["integration_steps_params"][0]
    return states, {
        "step_size": parameters["step_size"],
        "inverse_mass_matrix": parameters["inverse_mass_matrix"],
        "steps": steps,
    }


_STATE_FIELDS = ("position", "logdensity", "logdensity_grad", "random_generator_arg")


def _holding(run: dict):
    """A :class:`~bnn_zoo.inference.driver.Checkpoint`'s state: the run at iteration ``done`` (warm-up done)."""

    def tensor(a):
        return torch.from_numpy(np.array(a))

    def state(done: int) -> dict:
        kept = run["kept"]
        return {
            "iteration": done,
            "states": {k: tensor(getattr(run["states"], k)) for k in _STATE_FIELDS},
            "parameters": {k: tensor(v) for k, v in run["parameters"].items()},
            "kept": None if kept is None else {k: tensor(v) for k, v in kept.items()},
        }

    return state


def _loaded(checkpoint: Checkpoint | None) -> dict | None:
    """The state :func:`_holding` saved, as numpy arrays; None where there is none."""
    saved = None if checkpoint is None else checkpoint.load()
    if saved is None:
        return None
    try:
        return {
            "iteration": int(saved["iteration"]),
            "states": {k: saved["states"][k].numpy() for k in _STATE_FIELDS},
            "parameters": {k: v.numpy() for k, v in saved["parameters"].items()},
            "kept": None if saved["kept"] is None else {k: saved["kept"][k].numpy() for k in _CHEES_COLUMNS},
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise BnnZooError(
            f"checkpoint {checkpoint.path} is not a ChEES checkpoint of the jax backend ({exc}); delete it or point "
            "ChEES(checkpoint=...) elsewhere"
        ) from None


def _chees_state(states: dict):
    import jax.numpy as jnp
    from blackjax.mcmc.dynamic_hmc import DynamicHMCState

    return DynamicHMCState(*(jnp.asarray(states[k]) for k in _STATE_FIELDS))
