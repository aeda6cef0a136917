"""Where a compiled program runs: the JAX device of a torch device, one CPU device per core, and
independent programs (chains, cells) side by side on them in rounds, or in lockstep on a GPU."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING

import numpy as np
import torch

from bnn_zoo import resources
from bnn_zoo.inference.boundary import held_to_step_end
from bnn_zoo.inference.xla.environment import FallBack

if TYPE_CHECKING:
    from bnn_zoo.inference.xla.supervision import Watch


def jax_device(device: torch.device):
    """The JAX device of a torch device: the CPU, or the GPU of that index (jax's CUDA plugin)."""
    import jax

    _use_every_core()
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    try:
        return jax.devices("gpu")[device.index or 0]
    except (RuntimeError, IndexError):
        raise FallBack(f"JAX sees no GPU {device} (pip install -e '.[cuda]')") from None


def _use_every_core() -> None:
    """One JAX CPU device per core this process may keep busy (``jax_num_cpu_devices``;
    :func:`bnn_zoo.resources.cores`, a sweep worker's share), so that independent chains and cells run
    side by side (:func:`in_rounds`): XLA runs a small network's step on one thread. Left alone where
    the user chose a count, or JAX has already started in this process."""
    import jax

    if jax.config.jax_num_cpu_devices != -1 or "xla_force_host_platform_device_count" in os.environ.get(
        "XLA_FLAGS", ""
    ):
        return
    with contextlib.suppress(RuntimeError):  # JAX's backends have started: the count is fixed
        jax.config.update("jax_num_cpu_devices", resources.cores())


def cpu_lanes(target, items: int) -> int:
    """How many CPU devices share ``items`` independent programs (chains, cells): one per item up to
    the devices JAX has (:func:`_use_every_core`); 1 where the target is on a GPU."""
    import jax

    return min(len(jax.devices("cpu")), items) if target.device.platform == "cpu" else 1


def in_rounds(program, items, shared, lanes: int, watch: Watch):
    """``program(item, shared, lane, r)`` on every item (a leading axis of n), ``lanes`` at a time side by
    side, one per CPU device (``jax.pmap``; one jitted call where ``lanes`` is 1): round r runs items
    r * lanes, ..., the last round's spare lanes a copy of the last item (dropped). Yields (first item,
    outputs (m, ...) of round r's m items) as each round ends, so that finished work can be kept before
    the rest runs. Every call runs the program compiled once, and an item's computation is the same on
    any lane, so its result does not depend on the number of lanes. Each lane's program tells ``watch``
    when it ends (:meth:`Watch.hook_end`)."""
    import jax
    import jax.numpy as jnp

    def item_program(item, shared, lane, r):
        out = program(item, shared, lane, r)
        watch.hook_end(lane, out)
        return out

    count = jax.tree.leaves(items)[0].shape[0]
    if lanes == 1:
        call = jax.jit(lambda block, shared, lane, r: _lead(item_program(_first(block), shared, lane[0], r)))
    else:
        call = jax.pmap(item_program, in_axes=(0, None, 0, None), devices=jax.devices("cpu")[:lanes])
    for r in range(-(-count // lanes)):
        first = r * lanes
        take = jnp.minimum(first + jnp.arange(lanes), count - 1)
        args = (_rows(items, take), shared, jnp.arange(lanes), r)
        # a device whose program stops stops the others at their next callback (:meth:`Watch._tick`);
        # Ctrl-C waits until the programs are dispatched, so a stopped run waits only for programs that run
        with held_to_step_end():
            watch.starting(lanes)
            out = call(*args)
        out = jax.block_until_ready(out)
        yield first, _rows(jax.tree.map(np.asarray, out), slice(count - first))


def _rows(tree, index):
    import jax

    return jax.tree.map(lambda a: a[index], tree)


def _first(tree):
    return _rows(tree, 0)


def _lead(tree):
    import jax

    return jax.tree.map(lambda a: a[None], tree)


def on_target_device(run):
    """Run ``run(target, ...)`` with its JAX arrays and programs on the target's device."""

    @functools.wraps(run)
    def placed(target, *args, **kwargs):
        with target.placed():
            return run(target, *args, **kwargs)

    return placed


def collecting(finished):
    """``finished(k, result)`` that hands the result on: the caller's, or one that only returns it."""

    def hand_on(k, result):
        if finished is not None:
            finished(k, result)
        return result

    return hand_on


def in_lockstep(target) -> bool:
    """Whether a batch of cells advances in lockstep (one vectorised step): on a GPU, yes; on the CPU,
    whose cost per chain a vectorised step does not lower, the chains and cells run side by side, in
    rounds of one per core (:func:`in_rounds`)."""
    return target.device.platform != "cpu"
