"""The XLA backend of NUTS and ChEES: the BNN's own torch log density, run under JAX.

torchax traces :class:`~bnn_zoo.inference.potential.LogPosterior` (the network, its prior and the
likelihood, as written in torch: no network is written again in JAX) into a JAX function of the flat
unconstrained coordinates q. NumPyro's NUTS and BlackJAX's ChEES sample it, compiled by XLA, where a
small network's gradient costs a fraction of eager PyTorch's (docs/benchmarks.md).

Before a run the traced log density and its gradient are compared with the torch potential at the
first chain's start; a network that cannot be traced, or a mismatch, falls back to the torch
samplers with one warning saying why. JAX runs on the CPU, or on a GPU where the data is on one
(``--device cuda``; ``pip install -e '.[cuda]'`` adds jax's CUDA plugin).

Many cells of one model (the splits of a UCI table, seeds) run as one program: :func:`run_nuts_cells`
and :func:`run_chees_cells` take every cell's data padded to the longest (:func:`padded`), and the
traced log density takes the data as arguments, masking the padding out.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import math
import os
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import pyro
import torch

from bnn_zoo import resources
from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.boundary import held_to_step_end
from bnn_zoo.inference.budget import TimeLimit, TimeLimitExceeded
from bnn_zoo.inference.potential import LogPosterior
from bnn_zoo.io import atomic_torch_save, bar_disabled, check_identity, safe_torch_load, say_resumed
from bnn_zoo.models import architecture

PACKAGES = ("jax", "numpyro", "blackjax", "optax", "torchax")
BACKENDS = ("auto", "torch", "jax")
VALUE_RTOL, GRADIENT_RTOL = 1e-4, 1e-3  # float32 sums of N terms: agreement measured at 1e-7 (value), 3e-7 (gradient)
LENGTH_FLOOR_MAX_DIM = 4096  # BlackJAX's slow-direction length floor keeps a d x d covariance
INITIAL_STEP_SIZE = 0.01  # BlackJAX's ChEES adapted from here on Boston 13-50-1, not from larger steps
ABANDON_WAIT_S = 600.0  # a stopped run waits this long at most for each device's program to call back
NUTS_WATCH_EVERY = 5  # NUTS iterations between host callbacks: a callback costs about one small tree
# torch releases (first, last) beside which torchax 0.0.13, the newest, runs with the shim of _torchax: 2.13 and
# 2.15 pass the whole suite (benchmarks/results/torchax-torch.json); 2.11, a GPU machine's, traced and sampled
# the UCI MLP on an H200.
TORCHAX_TORCH = ((2, 11), (2, 15))


def installed() -> bool:
    """Whether the XLA backend's packages are installed (bnn-zoo's dependencies, unless removed)."""
    return all(importlib.util.find_spec(name) is not None for name in PACKAGES)


def unsupported_torch() -> str | None:
    """Why the installed torch cannot run the XLA backend, or None where it can (:data:`TORCHAX_TORCH`)."""
    (low, high), version = TORCHAX_TORCH, tuple(int(v) for v in re.findall(r"\d+", torch.__version__)[:2])
    if low <= version <= high:
        return None
    tested = "{}.{}".format(*low) + ("" if low == high else " to {}.{}".format(*high))
    return f"torch {torch.__version__} is not a release the XLA backend's torchax is tested with ({tested})"


def available() -> bool:
    """Whether the XLA backend can run: its packages are installed beside a torch its torchax supports."""
    return installed() and unsupported_torch() is None


def check_backend(method: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise BnnZooError(f"{method} backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "jax" and not installed():
        raise BnnZooError(
            f"{method} backend='jax' needs jax, numpyro, blackjax, optax and torchax, which bnn-zoo depends on: "
            "reinstall bnn-zoo (pip install -e . in its checkout), or use backend='torch'"
        )
    if backend == "jax" and unsupported_torch():
        raise BnnZooError(f"{method} backend='jax': {unsupported_torch()}; use backend='torch'")


def resolve_backend(backend: str, model: BNN) -> str:
    """``"auto"``: JAX where it is installed beside a supported torch (else one warning says
    why not) and the network has no convolution or recurrent layer; torch otherwise. Measured per
    architecture (benchmarks/backends.py): the MLP's traced gradient is several times cheaper than
    eager torch's, the digits CNN's dearer, and bnn-zoo's LSTMs do not trace (their input check
    reads a value)."""
    if backend != "auto":
        return backend
    if architecture(model.net) != "dense":
        return "torch"
    if installed() and unsupported_torch():
        warnings.warn(f"NUTS and ChEES run on torch: {unsupported_torch()}", stacklevel=3)
    return "jax" if available() else "torch"


RENAMED = {"cholesky": "linalg_cholesky", "qr": "linalg_qr"}  # operators torch 2.15 removed -> their successors


class FallBack(Exception):
    """The JAX backend cannot run this model; the message says why."""


def _torchax():
    """torchax, imported only here: at import it renames torch's PrivateUse1 backend to "jax".

    torchax 0.0.13 names operators that later torch releases removed, and fails at import:
    named-tensor overloads (``aten.prod.dim_Dimname``, ...; gone in torch 2.13), ``aten.cholesky`` and
    ``aten.qr`` (gone in 2.15). Before the import, each missing operator is aliased to its successor
    (:data:`RENAMED`, as upstream torchax does in google/torchax#99) and each missing overload to one its
    packet still has (#102), so the installed package is left as it is. Named tensors are never traced
    here, and the first trace of every run is checked against the torch potential. After it, torch is told
    that torchax's "jax" device is not an accelerator it can use (torch tensors never go there)."""
    import sys

    if "torchax" in sys.modules:
        return sys.modules["torchax"]
    root = Path(importlib.util.find_spec("torchax").origin).parent
    source = "\n".join(path.read_text() for path in root.rglob("*.py"))
    for op in set(re.findall(r"torch\.ops\.aten\.(\w+)", source)) & set(RENAMED):
        if not hasattr(torch.ops.aten, op):
            setattr(torch.ops.aten, op, getattr(torch.ops.aten, RENAMED[op]))
    for op, overload in set(re.findall(r"torch\.ops\.aten\.(\w+)\.(\w+)", source)):
        packet = getattr(torch.ops.aten, op, None)
        if packet is not None and overload not in packet.overloads():
            setattr(packet, overload, getattr(packet, packet.overloads()[0]))

    def successor_registered_twice(record) -> bool:  # torchax's own lowering, registered last, wins
        return not record.getMessage().startswith("Duplicate op registration for aten.linalg_")

    logging.getLogger().addFilter(successor_registered_twice)
    try:
        import torchax

        torchax.default_env()  # torchax's own check that its environment builds beside this torch
        # torchax makes its "jax" device torch's accelerator and calls it available; no torch tensor is put
        # there, and torch 2.15's Adam would ask that device for a stream torch cannot make
        torchax.device_module.is_available = lambda: False
    finally:
        logging.getLogger().removeFilter(successor_registered_twice)
    return torchax


class JaxTarget:
    """The log posterior on flat unconstrained coordinates q (d,), as a JAX function (``logdensity``).

    Args:
        model: the BNN; its network, prior and likelihood are traced as torch code.
        x: the training inputs (every leapfrog step sees all of them).
        y: the training targets.
    """

    def __init__(self, model: BNN, x: torch.Tensor, y: torch.Tensor, device: torch.device | str | None = None):
        self.torch_target = LogPosterior(model, x.shape[0])
        self.shapes = model.latent_shapes()
        self.sizes = [math.prod(s) for s in self.shapes.values()]
        self.x, self.y = x, y
        self.torch_device = torch.device(device or x.device)
        self.device = _jax_device(self.torch_device)
        try:
            self.data_logdensity = self._trace(model.to("cpu"))
        except Exception as exc:  # torchax raises many types for an op it cannot lower
            raise FallBack(f"the log density could not be traced to JAX ({_first_line(exc)})") from None
        with self.placed():
            self.data = tuple(a[0] for a in padded([(x, y)]))

    def placed(self):
        """A context in which new JAX arrays, and the programs that take them, live on this target's device."""
        import jax

        return jax.default_device(self.device)

    def logdensity(self, q):
        """The log posterior at q (d,) on this target's training data."""
        return self.data_logdensity(q, *self.data)

    def _trace(self, model: BNN):
        """The log posterior as a JAX function of (q, x, y, mask): the data are arguments, so one traced
        function serves every cell of a batch (:func:`padded`)."""
        torchax = _torchax()
        env = torchax.default_env()
        with env, pyro.validation_enabled(False):  # argument checks have no JAX lowering (aten::_is_all_true)
            on_jax = LogPosterior(model.to("jax"), 0)
        view = torchax.interop.jax_view(lambda q, x, y, mask: on_jax(self.unflatten(q), (x, y, mask))[0])

        def logdensity(q, x, y, mask):
            with env, pyro.validation_enabled(False), warnings.catch_warnings():
                # labels as int32: exact below 2^31
                warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")
                return view(q, x, y, mask)

        return logdensity

    def start(self, values: dict) -> torch.Tensor:
        """Site values (C, *site shape) as flat unconstrained starts (C, d)."""
        return self.flatten(self.torch_target.initial(values))

    def flatten(self, values: dict) -> torch.Tensor:
        """Site values with a leading chain dimension C as (C, d)."""
        c = next(iter(values.values())).shape[0]
        return torch.cat([values[k].reshape(c, -1) for k in self.shapes], dim=1)

    def unflatten(self, q) -> dict:
        """(..., d) as site values shaped (..., *site shape)."""
        parts = q.split(self.sizes, -1)
        return {k: v.reshape((*q.shape[:-1], *s)) for (k, s), v in zip(self.shapes.items(), parts, strict=True)}

    def check(self, q: torch.Tensor) -> None:
        """Raise :class:`FallBack` unless the traced log density and its gradient at ``q`` (d,) equal the
        torch potential's to float32 rounding (``VALUE_RTOL``, ``GRADIENT_RTOL`` relative)."""
        import jax
        import jax.numpy as jnp

        leaf = q.detach().clone().requires_grad_(True)
        with pyro.validation_enabled(False), torch.enable_grad():
            value = self.torch_target(self.unflatten(leaf), (self.x, self.y))[0]
            (grad,) = torch.autograd.grad(value, leaf)
        value = float(value.detach())
        try:
            with self.placed():
                jv, jg = jax.jit(jax.value_and_grad(self.logdensity))(jnp.asarray(q.detach().cpu().numpy()))
        except Exception as exc:
            raise FallBack(f"the log density could not be traced to JAX ({_first_line(exc)})") from None
        value_error = abs(float(jv) - value) / max(1.0, abs(value))
        grad_error = float(torch.linalg.vector_norm(torch.from_numpy(jax.device_get(jg).copy()) - grad.cpu())) / max(
            float(torch.linalg.vector_norm(grad)), 1e-12
        )
        if not (value_error <= VALUE_RTOL and grad_error <= GRADIENT_RTOL):
            raise FallBack(
                f"the traced log density differs from torch's at the start (value {value_error:.1e}, gradient "
                f"{grad_error:.1e} relative)"
            )

    def to_torch(self, draws) -> dict:
        """Draws (C, S, d) from JAX (or torch) as constrained site values (C, S, *site shape)."""
        import jax

        flat = draws if isinstance(draws, torch.Tensor) else torch.from_numpy(np.array(jax.device_get(draws)))
        return self.torch_target.constrained(self.unflatten(flat.to(self.x.device)))


def _jax_device(device: torch.device):
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
    side by side (:func:`_in_rounds`): XLA runs a small network's step on one thread. Left alone where
    the user chose a count, or JAX has already started in this process."""
    import jax

    if jax.config.jax_num_cpu_devices != -1 or "xla_force_host_platform_device_count" in os.environ.get(
        "XLA_FLAGS", ""
    ):
        return
    with contextlib.suppress(RuntimeError):  # JAX's backends have started: the count is fixed
        jax.config.update("jax_num_cpu_devices", resources.cores())


def cpu_lanes(target: JaxTarget, items: int) -> int:
    """How many CPU devices share ``items`` independent programs (chains, cells): one per item up to
    the devices JAX has (:func:`_use_every_core`); 1 where the target is on a GPU."""
    import jax

    return min(len(jax.devices("cpu")), items) if target.device.platform == "cpu" else 1


def _in_rounds(program, items, shared, lanes: int, watch: Watch):
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


def padded(data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple:
    """K cells' training data (x, y) as JAX arrays (K, N, ...) with a row mask (K, N), N the most rows
    of any cell: a shorter cell repeats its first row, masked out, so every padded term is finite and
    adds exactly 0 to the log-likelihood (:meth:`LogPosterior.__call__`)."""
    import jax.numpy as jnp

    n = max(x.shape[0] for x, _ in data)

    def pad(a):
        return torch.cat([a, a[:1].expand(n - a.shape[0], *a.shape[1:])]).cpu().numpy()

    x, y = (jnp.stack([jnp.asarray(pad(part[i])) for part in data]) for i in (0, 1))
    mask = jnp.stack([jnp.asarray(np.arange(n) < a.shape[0], dtype=x.dtype) for a, _ in data])
    return x, y, mask


def jax_target(method: str, model: BNN, x, y, starts: dict, device=None) -> JaxTarget | None:
    """The model's :class:`JaxTarget` on ``device`` (default: the data's), checked at the first chain's
    start (``starts``: site values (C, *site shape)); or None, after one warning saying why the run
    falls back to torch."""
    try:
        target = JaxTarget(model, x, y, device)
        target.check(target.start(starts)[0])
        return target
    except FallBack as reason:
        warnings.warn(f"{method} backend='jax' falls back to torch: {reason}", stacklevel=3)
        return None


class Watch:
    """The host's view of a compiled run: progress, ``max_hours`` and Ctrl-C/``kill`` while XLA runs.

    A compiled loop returns to Python only when it ends, and Python runs signal handlers only then. So
    the loop calls :meth:`hook` each iteration; every ``every`` iterations it calls back to the host
    (``io_callback``), which moves the progress bar, checks the time limit and reads a pipe the C-level
    signal handler writes to (``signal.set_wakeup_fd``). To stop, the callback raises: XLA abandons the
    program, and :meth:`running` raises what stopped it (TimeLimitExceeded; on Ctrl-C or ``kill``, what
    the signal's Python handler raises, KeyboardInterrupt by default).
    """

    def __init__(
        self, method: str, total: int, max_hours, progress: bool, done: int = 0, settle: int = 0, turns: int = 1
    ):
        from tqdm.auto import tqdm

        self.first, self.stop, self._wake, self.lanes = done, None, None, {0: done}
        self.limit = TimeLimit(method, max_hours, total - done, settle=max(settle - done, 0), turns=turns)
        self.bar = tqdm(total=total, initial=done, desc=method.lower(), disable=not progress)
        self._running, self._ended = set(), threading.Condition()  # lanes whose program may still call back

    def hook(self, i, every: int = 1, lane=0) -> None:
        """In the compiled loop: iteration ``i`` (a traced integer) of those run on CPU device ``lane``
        (:func:`_in_rounds`) has finished."""
        import jax
        from jax.experimental import io_callback

        tick = lambda: io_callback(self._tick, None, i, lane, ordered=False)  # noqa: E731
        if every == 1:  # no cond: under vmap (a batch of cells' warm-ups) a cond cannot hold a callback
            tick()
        else:
            jax.lax.cond(i % every == 0, tick, lambda: None)

    def hook_end(self, lane, outputs) -> None:
        """In the compiled program of CPU device ``lane``, once all its ``outputs`` are computed (an
        element of each passed on, so XLA calls back after them): the lane calls back no more."""
        import jax
        import jax.numpy as jnp
        from jax.experimental import io_callback

        io_callback(self._end, None, lane, [jnp.ravel(a)[:1] for a in jax.tree.leaves(outputs)], ordered=False)

    def _end(self, lane, _=None) -> None:
        with self._ended:
            self._running.discard(int(lane))
            self._ended.notify_all()

    def starting(self, lanes: int) -> None:
        """Programs on ``lanes`` CPU devices start (:func:`_in_rounds`); each calls back as it ends."""
        self._running = set(range(lanes))

    def _wait_for_other_devices(self) -> None:
        """Until every device's program of the round has ended (at its next callback, which raises, or at
        its end): the first device's error returns while the others still run, and a callback of theirs after
        Python has begun to exit aborts the process (it makes JAX's CPU client again). Bounded by
        ``ABANDON_WAIT_S``, a safety net."""
        with self._ended:
            self._ended.wait_for(lambda: not self._running, timeout=ABANDON_WAIT_S)

    def _tick(self, i, lane=0) -> None:
        if self.stop is not None:  # another device's program stopped the run: end this one too
            self._end(lane)
            raise _Abandoned
        try:
            self.lanes[int(lane)] = int(i)
            self._progress(sum(self.lanes.values()))
            if self._signalled():  # its handler raises on the main thread once XLA returns
                raise _Signalled
        except BaseException as exc:  # or the handler raised here: XLA may call back on the main thread
            self.stop = exc
            self._end(lane)
            raise

    def _progress(self, done: int) -> None:
        self.bar.update(done - self.bar.n)
        self.limit.check(done - self.first)

    def _signalled(self) -> bool:
        wake = self._wake
        if wake is None:  # not on the main thread, or the watch has ended: signals are not ours to watch
            return False
        try:
            return bool(os.read(wake, 64))
        except OSError:  # nothing written (BlockingIOError), or the watch ended as XLA called back
            return False

    @contextlib.contextmanager
    def running(self):
        """Watch the compiled calls inside: a signal or the time limit stops them."""
        import logging
        import signal
        import threading

        self._wake, write = os.pipe() if threading.current_thread() is threading.main_thread() else (None, None)
        previous = None
        if write is not None:
            os.set_blocking(self._wake, False)
            os.set_blocking(write, False)
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        quiet, callbacks = _QuietStop(), logging.getLogger("jax._src.callback")
        callbacks.addFilter(quiet)
        callbacks.addFilter(_QUIET_ABANDONED)  # kept: a late device's callback may stop it after this watch
        finished = False
        try:
            yield
            finished = True
        except Exception:  # XLA's error for an abandoned program
            if isinstance(self.stop, _Signalled):
                _run_signal_handlers()  # raises what the handler raises
                raise KeyboardInterrupt from None  # a handler that did not raise
            if self.stop is None:
                raise
            raise self.stop from None
        finally:
            if not finished:  # here, not in the except clause: a signal's handler may raise before that clause runs
                self.stop = self.stop or _Abandoned()  # whatever stopped it: the other devices' callbacks raise
                self._wait_for_other_devices()
                _end_abandoned_programs()
            callbacks.removeFilter(quiet)
            if write is not None:
                signal.set_wakeup_fd(previous)
                wake, self._wake = self._wake, None  # a late callback finds no pipe rather than a closed one
                os.close(write)
                os.close(wake)
            self.bar.close()


def _end_abandoned_programs() -> None:
    """Wait on the runtime tokens of the programs still running on other devices (:func:`_in_rounds`;
    :meth:`Watch._wait_for_other_devices` waits until they end), then drop them: JAX keeps them and at
    exit would wait on them again and print the callback's error (or, without them, tear XLA down under a
    running program). JAX has no public call for this."""
    with contextlib.suppress(ImportError, AttributeError):
        from jax._src import dispatch

        tokens = dispatch.runtime_tokens
        for token in [*tokens.current_tokens.values(), *tokens.output_runtime_tokens.values()]:
            with contextlib.suppress(Exception):  # the error of the callback that stopped it
                token.block_until_ready()
        tokens.clear()


class _Signalled(Exception):
    """A signal arrived while XLA ran; its Python handler is pending on the main thread."""


class _Abandoned(Exception):
    """The program on another device stopped the run."""


def _run_signal_handlers() -> None:
    """Nothing: entering a Python function is where the main thread runs pending signal handlers."""


class _QuietStop:
    """Drops JAX's logged traceback of a callback that stopped a run on purpose."""

    def __init__(self, *kinds):
        self.kinds = kinds or (_Signalled, _Abandoned, KeyboardInterrupt, TimeLimitExceeded)

    def filter(self, record) -> bool:
        return not isinstance(record.exc_info[1] if record.exc_info else None, self.kinds)


_QUIET_ABANDONED = _QuietStop(_Abandoned)


def _on_target_device(run):
    """Run ``run(target, ...)`` with its JAX arrays and programs on the target's device."""

    @functools.wraps(run)
    def placed(target: JaxTarget, *args, **kwargs):
        with target.placed():
            return run(target, *args, **kwargs)

    return placed


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


@_on_target_device
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
    cores, a round of one chain per core at a time (:func:`_in_rounds`; in lockstep each iteration
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
    results, finished = [], _collecting(finished)
    if in_lockstep(target):
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
    lanes, alone = cpu_lanes(target, items), cpu_lanes(target, chains)
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
        return _finished_cells(_in_rounds(chain, flat, cells, lanes, watch), chains, target, finished, chain_done)


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


def _collecting(finished):
    """``finished(k, result)`` that hands the result on: the caller's, or one that only returns it."""

    def hand_on(k, result):
        if finished is not None:
            finished(k, result)
        return result

    return hand_on


def in_lockstep(target: JaxTarget) -> bool:
    """Whether a batch of cells advances in lockstep (one vectorised step): on a GPU, yes; on the CPU,
    whose cost per chain a vectorised step does not lower, the chains and cells run side by side, in
    rounds of one per core (:func:`_in_rounds`)."""
    return target.device.platform != "cpu"


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


@_on_target_device
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
    saved = _resume_chees(method.checkpoint, identity)
    done = saved["iteration"] if saved else 0
    if saved:
        say_resumed(method.checkpoint, done, total, method.progress)
    # BlackJAX's diagonal mass matrix engages half-way through warm-up; the pace before overstates the rest's
    watch = Watch("ChEES", total, method.max_hours, not bar_disabled(method.progress), done, warmup_steps // 2)
    with watch.running():
        if saved:
            states, parameters = _chees_state(saved["states"]), saved["parameters"]
            kept = saved["kept"]
        else:
            q0 = jnp.asarray(q0.cpu().numpy())
            states, parameters = _chees_warmup(target.logdensity, q0, method, key_warmup, watch)
            kept, done = None, warmup_steps
            if method.checkpoint is not None:
                _save_chees(method.checkpoint, identity, warmup_steps, states, parameters, kept)
        kernel = _chees_kernel(target.logdensity, parameters, total)

        @jax.jit
        def sample(states, keys, first):
            def one(states, key_and_i):
                key, i = key_and_i
                states, info = jax.vmap(kernel.step)(jax.random.split(key, chains), states)
                watch.hook(i)
                return states, (states.position, states.logdensity, *_chees_info(info))

            return jax.lax.scan(one, states, (keys, first + 1 + jnp.arange(keys.shape[0])))

        keys = jax.random.split(key_sample, method.num_samples)
        every = method.num_samples if method.checkpoint is None else method.checkpoint_every
        saved_at = done
        try:
            for a in range(done - warmup_steps, method.num_samples, every):
                states, out = sample(states, keys[a : a + every], warmup_steps + a)
                chunk = {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in zip(_CHEES_COLUMNS, out, strict=True)}
                kept = chunk if kept is None else {k: np.concatenate([kept[k], chunk[k]], axis=1) for k in kept}
                if method.checkpoint is not None and a + every < method.num_samples:
                    saved_at = warmup_steps + a + every
                    _save_chees(method.checkpoint, identity, saved_at, states, parameters, kept)
        except (KeyboardInterrupt, TimeLimitExceeded) as stop:
            if method.checkpoint is not None:  # say where the saved run resumes, as the torch sampler does
                where = f"checkpoint at iteration {saved_at} of {total} saved to {method.checkpoint}"
                if isinstance(stop, KeyboardInterrupt):
                    print(f"interrupted: {where}; run again to resume")
                else:
                    stop.args = (f"{stop} ({where}: the same fit resumes it; bnn-zoo fit: add --resume)",)
            raise
    if method.checkpoint is not None:
        Path(method.checkpoint).unlink(missing_ok=True)  # the posterior supersedes it
    return _chees_result(target, kept, parameters)


@_on_target_device
def run_chees_cells(
    target: JaxTarget, data: list, q0s: list, seeds: list[int], method, progress: bool, finished=None
) -> list:
    """ChEES on K cells in one XLA program: cell k's chains start at q0s[k] (C, d) on its training data
    data[k] = (x, y) (:func:`padded`), seeded by seeds[k], every cell with the model and settings of
    ``method``. Each cell adapts its own step size, trajectory length and mass matrix with the keys of
    its run alone, so its draws equal that run's up to float rounding. On a GPU the cells advance in
    lockstep (an iteration costs the longest of their trajectories); on the CPU side by side on the
    cores, a round of one cell per core at a time (:func:`_in_rounds`).
    Returns (site draws (C, S, ...), sample stats (C, S), the adapted step size and trajectory length)
    per cell; ``finished(k, result)`` is called with each cell's as soon as it is done (on a GPU, at the end)."""
    import jax
    import jax.numpy as jnp

    chains, count = q0s[0].shape[0], len(data)
    warmup_steps, total = method.num_warmup, method.num_warmup + method.num_samples
    keys = jnp.stack([jax.random.split(jax.random.PRNGKey(seed)) for seed in seeds])  # (K, 2: warm-up, sampling)
    cells, q0 = padded(data), jnp.asarray(torch.stack(q0s).cpu().numpy())
    lockstep = in_lockstep(target)
    lanes = 1 if lockstep else cpu_lanes(target, count)
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

    rounds = every_cell_at_once() if lockstep else _in_rounds(cell_program, (keys, q0, cells), None, lanes, watch)
    results, finished = [], _collecting(finished)
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


def _save_chees(path, identity: str, iteration: int, states, parameters: dict, kept: dict | None) -> None:
    """The run at ``iteration`` (warm-up done): the chains' states, the kernel and the draws so far."""

    def tensor(a):
        return torch.from_numpy(np.array(a))

    atomic_torch_save(
        {
            "identity": identity,
            "iteration": iteration,
            "states": {k: tensor(getattr(states, k)) for k in _STATE_FIELDS},
            "parameters": {k: tensor(v) for k, v in parameters.items()},
            "kept": None if kept is None else {k: tensor(v) for k, v in kept.items()},
        },
        path,
    )


def _resume_chees(path, identity: str) -> dict | None:
    """A checkpoint of :func:`_save_chees` at ``path`` as numpy arrays, or None where there is none."""
    if path is None or not Path(path).exists():
        return None
    saved = safe_torch_load(path)
    check_identity(saved, identity, path, "ChEES")
    try:
        return {
            "iteration": int(saved["iteration"]),
            "states": {k: saved["states"][k].numpy() for k in _STATE_FIELDS},
            "parameters": {k: v.numpy() for k, v in saved["parameters"].items()},
            "kept": None if saved["kept"] is None else {k: saved["kept"][k].numpy() for k in _CHEES_COLUMNS},
        }
    except (KeyError, TypeError, AttributeError) as exc:
        raise BnnZooError(
            f"checkpoint {path} is not a ChEES checkpoint of the jax backend ({exc}); delete it or point "
            "ChEES(checkpoint=...) elsewhere"
        ) from None


def _chees_state(states: dict):
    import jax.numpy as jnp
    from blackjax.mcmc.dynamic_hmc import DynamicHMCState

    return DynamicHMCState(*(jnp.asarray(states[k]) for k in _STATE_FIELDS))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
