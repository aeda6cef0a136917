"""NumPyro's NUTS on a :class:`~bnn_zoo.inference.xla.tracing.JaxTarget`: one run's chains, or many cells of
one model in one program."""

from __future__ import annotations

import numpy as np
import torch

from bnn_zoo.inference.xla import devices
from bnn_zoo.inference.xla.devices import collecting, in_rounds, on_target_device
from bnn_zoo.inference.xla.supervision import Watch
from bnn_zoo.inference.xla.tracing import JaxTarget, padded

NUTS_WATCH_EVERY = 5  # NUTS iterations between host callbacks: a callback costs about one small tree


def run_nuts(
    target: JaxTarget, q0: torch.Tensor, method, progress: bool, done: dict | None = None, on_chain=None
) -> tuple[dict, dict]:
    """NumPyro's NUTS from starts q0 (C, d) on the target's data, watched (:class:`Watch`): one cell of
    :func:`run_nuts_cells`. (site draws (C, S, ...), sample stats (C, S)) in the torch samplers' names.
    ``done`` holds the columns of chains already run ({c: columns}), which are not run again;
    ``on_chain(c, columns)`` is called as each other chain finishes. Chain c's key is the c-th of the
    run's, so its draws do not depend on which chains run beside it."""
    import jax

    chains, done = q0.shape[0], dict(done or {})
    todo = [c for c in range(chains) if c not in done]
    if todo:
        keys = jax.random.split(jax.random.PRNGKey(method.seed), chains)[np.array(todo)]

        def chain_done(j, columns):
            done[todo[j]] = columns
            if on_chain is not None:
                on_chain(todo[j], columns)

        data = [(target.x, target.y)]
        run_nuts_cells(
            target, data, [q0[todo]], [method.seed], method, progress, keys=keys[None], chain_done=chain_done
        )
    return _nuts_result(target, [np.stack(c) for c in zip(*(done[c] for c in range(chains)), strict=True)])


@on_target_device
def run_nuts_cells(
    target: JaxTarget,
    data: list,
    q0s: list,
    seeds: list[int],
    method,
    progress: bool,
    finished=None,
    keys=None,
    chain_done=None,
) -> list:
    """NUTS on K cells in one XLA program: cell k's chains start at q0s[k] (C, d) on its training data
    data[k] = (x, y) (:func:`padded`), seeded by seeds[k]; every cell has the model and the settings of
    ``method``. On a GPU every chain of every cell advances in lockstep, one vectorised step; on the
    CPU, which a vectorised step does not make cheaper per chain, the chains run side by side on the
    cores, a round of one chain per core at a time (:func:`in_rounds`; in lockstep each iteration
    would cost the longest of the chains' trees). A cell's chain gets the same key and the same kernel
    either way, so its draws equal the cell's run alone up to float rounding.
    Returns (site draws (C, S, ...), sample stats (C, S)) per cell; ``finished(k, result)`` is called
    with each cell's as soon as its chains are done (on a GPU, at the end), and ``chain_done(j, columns)``
    with each chain's raw columns (j counts the cells' chains in order). ``keys`` (K, C, 2) replaces the
    chains' keys drawn from ``seeds``."""
    import jax
    import jax.numpy as jnp

    init, step = _nuts_kernel(target, method)
    cells, count = padded(data), len(data)
    chains, length = q0s[0].shape[0], method.num_warmup + method.num_samples
    if keys is None:
        keys = jnp.stack([jax.random.split(jax.random.PRNGKey(seed), chains) for seed in seeds])
    q0 = jnp.asarray(torch.stack(q0s).cpu().numpy())
    name = "NUTS" + (f" x{count} cells" if count > 1 else "")
    iterations = method.num_warmup + jnp.arange(method.num_samples)
    results, finished = [], collecting(finished)
    if devices.in_lockstep(target):
        watch = Watch(name, length, method.max_hours, progress)
        vectorised = jax.vmap(jax.vmap(step, in_axes=(0, None)))  # over cells, then over a cell's chains

        @jax.jit
        def lockstep(q0, keys, cells):
            def advance(i, states):
                states = vectorised(states, cells)
                watch.hook(i + 1, every=NUTS_WATCH_EVERY)
                return states

            states = jax.vmap(jax.vmap(init, in_axes=(0, 0, None)))(q0, keys, cells)
            states = jax.lax.fori_loop(0, method.num_warmup, advance, states)
            return [jnp.moveaxis(c, 0, 2) for c in jax.lax.scan(_keeping(advance), states, iterations)[1]]

        with watch.running():  # blocks until XLA is done: its callbacks read the watch's pipe
            columns = [np.asarray(c) for c in jax.block_until_ready(lockstep(q0, keys, cells))]  # (K, C, S, ...)
        for j in range(count * chains) if chain_done is not None else ():
            chain_done(j, [c[j // chains][j % chains] for c in columns])
        for k in range(count):
            results.append(finished(k, _nuts_result(target, [c[k] for c in columns])))
        return results
    items = count * chains
    lanes, alone = devices.cpu_lanes(target, items), devices.cpu_lanes(target, chains)
    rounds = -(-items // lanes)
    # max_hours bounds each cell's own time, its rounds': the batch takes `turns` cells' times
    turns = max(rounds // -(-chains // alone), 1)
    watch = Watch(name, lanes * rounds * length, method.max_hours, progress, turns=turns)

    def chain(item, cells, lane, r):
        q, key, k = item
        cell = jax.tree.map(lambda a: a[k], cells)

        def advance(i, state):
            state = step(state, cell)
            watch.hook(r * length + i + 1, every=NUTS_WATCH_EVERY, lane=lane)
            return state

        state = jax.lax.fori_loop(0, method.num_warmup, advance, init(q, key, cell))
        return jax.lax.scan(_keeping(advance), state, iterations)[1]

    with watch.running():
        flat = (q0.reshape(items, -1), keys.reshape(items, -1), jnp.arange(items) // chains)
        return _finished_cells(in_rounds(chain, flat, cells, lanes, watch), chains, target, finished, chain_done)


def _finished_cells(rounds, chains: int, target: JaxTarget, finished, chain_done) -> list:
    """Each cell's NUTS result, handed to ``finished`` as soon as its chains have come out of ``rounds`` (the
    chains in order, ``chains`` a cell); each chain's columns to ``chain_done`` as it comes."""
    done, results = [], []  # the finished chains' columns, in order
    for _, out in rounds:
        for j in range(out[0].shape[0]):
            done.append([c[j] for c in out])
            if chain_done is not None:
                chain_done(len(done) - 1, done[-1])
        while len(results) < len(done) // chains:
            k = len(results)
            cell = [np.stack(c) for c in zip(*done[k * chains : (k + 1) * chains], strict=True)]
            results.append(finished(k, _nuts_result(target, cell)))
    return results


def _nuts_kernel(target: JaxTarget, method):
    """NumPyro's NUTS (dual averaging, windowed mass matrix) as functions of the data: init(q, key, data)
    and step(state, data), data = (x, y, mask) of one cell."""
    from numpyro.infer.hmc import hmc

    init_kernel, sample_kernel = hmc(
        potential_fn_gen=lambda *data: lambda q: -target.data_logdensity(q, *data), algo="NUTS"
    )

    def init(q, key, data):
        return init_kernel(
            q,
            method.num_warmup,
            dense_mass=method.dense_mass,
            target_accept_prob=method.target_accept,
            max_tree_depth=method.max_tree_depth,
            model_args=data,
            rng_key=key,
        )

    return init, lambda state, data: sample_kernel(state, model_args=data)


def _keeping(advance):
    """A scan body: advance the state at iteration i and keep its draw and stats."""

    def keep(state, i):
        state = advance(i, state)
        return state, _nuts_columns(state)

    return keep


def _nuts_columns(state) -> tuple:
    return (
        state.z,
        state.diverging,
        state.num_steps,
        state.energy,
        state.potential_energy,
        state.accept_prob,
        state.adapt_state.step_size,
    )


def _nuts_result(target: JaxTarget, columns: list) -> tuple[dict, dict]:
    """One cell's draws and stats (the torch NUTS's names) from its columns (C, S, ...)."""
    columns = [torch.from_numpy(np.array(c)) for c in columns]
    draws, diverging, steps, energy, potential, accept, step_size = columns
    steps = steps.long()
    stats = {
        "diverging": diverging.bool(),
        "n_steps": steps,
        "tree_depth": torch.floor(torch.log2(steps.clamp(min=1).double())).long() + 1,
        "step_size": step_size.double(),
        "energy": energy.double(),
        "lp": -potential.double(),
        "acceptance_rate": accept.double(),
    }
    return target.to_torch(draws), stats
