"""One loop for the iterative methods run in Python (SVI alone and in lockstep, SG-MCMC's chains, ChEES on
torch, ensembles and SWAG, AIS): the progress bar, periodic and on-stop checkpoints under the fit's
identity, resuming from one, the time limit, and Ctrl-C and ``kill`` held to a step's end
(:mod:`bnn_zoo.inference.boundary`). A method is a :class:`Stepper`: its state, which is its checkpoint,
and its step (BlackJAX's ``(init, step)``, posteriors' ``(init, update)``); :func:`run_steps` is the loop,
written once, here. So are the chains that run whole in forked processes (NUTS and HMC on torch,
:func:`run_chains`), each kept as it finishes (:class:`FinishedChains`).

The XLA samplers (:mod:`bnn_zoo.inference.xla`) keep loops of their own, inside one compiled program, and
report to the host through callbacks; they, and NUTS and HMC's finished chains, keep their checkpoints
with :class:`Checkpoint`.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Protocol

import torch
from tqdm import std as tqdm_std
from tqdm.auto import tqdm

from bnn_zoo import resources
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.boundary import held_to_step_end, pyro_stacks_restored, say_saved
from bnn_zoo.inference.budget import TimeLimit, TimeLimitExceeded
from bnn_zoo.io import atomic_torch_save, bar_disabled, check_identity, safe_torch_load, say_resumed


class Stepper(Protocol):
    """An iterative method's work as :func:`run_steps` runs it. Started fresh by its constructor (its
    ``init``), it is advanced by ``step(i)``, which returns True to end early (early stopping, a non-finite
    loss). ``state()`` is its checkpoint after the steps done: tensors, plain numbers and containers of
    them (loaded without unpickling), or None when nothing is worth keeping now; ``load(state)`` continues
    from one, raising :class:`~bnn_zoo.errors.BnnZooError` when it is not this method's. The driver keeps the
    step count and torch's random state beside it."""

    def step(self, i: int) -> bool | None: ...

    def state(self) -> dict | None: ...

    def load(self, state: dict) -> None: ...


class Checkpoint:
    """A fit's checkpoint file: what ``state(done)`` gives after ``done`` steps, written atomically with
    the fit's ``identity`` (:func:`bnn_zoo.io.fingerprint`) every ``every`` steps and when the fit is
    stopped, and read back only by the same fit (``method`` names it in the refusal). ``state`` may
    return None: nothing worth saving now (SVI's parameters went non-finite)."""

    def __init__(self, path, identity: str, method: str, every: int, state: Callable[[int], dict | None]):
        self.path, self.identity, self.method, self.every, self.state = path, identity, method, every, state

    @classmethod
    def at(cls, path, identity: str, method: str, every: int, state: Callable[[int], dict | None] | None):
        """A checkpoint at ``path``, or None where a fit keeps none (``path`` None)."""
        return None if path is None else cls(path, identity, method, every, state)

    def load(self) -> dict | None:
        """The saved state, checked to be this fit's; None when there is none."""
        if not Path(self.path).exists():
            return None
        saved = safe_torch_load(self.path)
        check_identity(saved, self.identity, self.path, self.method)
        return saved

    def save(self, done: int) -> bool:
        """Write the state after ``done`` steps; whether anything was written."""
        state = self.state(done)
        if state is not None:
            atomic_torch_save({"identity": self.identity, **state}, self.path)
        return state is not None

    def resumed(self, first: int, total: int, progress: bool) -> None:
        say_resumed(self.path, first, total, progress)

    def discard(self) -> None:
        """The fit is done: its result supersedes the checkpoint."""
        Path(self.path).unlink(missing_ok=True)


def run_steps(
    stepper: Stepper,
    total: int,
    name: str,
    progress: bool,
    limit: Callable[[int], TimeLimit],
    checkpoint: Checkpoint | None = None,
    unit: str = "step",
    postfix: Callable[[], dict] | None = None,
    keep: bool = False,
) -> int:
    """``stepper``'s steps up to ``total`` under :func:`drive`, resumed from ``checkpoint`` where it holds
    this fit's state (``limit(first)``: the time limit for the steps left). The checkpoint is removed once
    the steps are done, unless ``keep`` (a run of several parts removes it at its end). Returns the step
    the run resumed at (0: started afresh)."""
    first = 0
    if checkpoint is not None:
        checkpoint.state = lambda done: _whole(done, stepper.state())
        if (saved := checkpoint.load()) is not None:
            first = _resume(stepper, saved, checkpoint)
            checkpoint.resumed(first, total, progress)
    drive(stepper.step, first, total, name, progress, limit(first), checkpoint, unit, postfix)
    if checkpoint is not None and not keep:
        checkpoint.discard()  # the result supersedes it
    return first


def _whole(done: int, state: dict | None) -> dict | None:
    """A stepper's checkpoint: its state after ``done`` steps and the random state step ``done`` starts from."""
    return None if state is None else {"step": done, "rng": torch.get_rng_state(), "state": state}


def _resume(stepper: Stepper, saved: dict, checkpoint: Checkpoint) -> int:
    if not {"step", "rng", "state"} <= set(saved):
        raise BnnZooError(
            f"checkpoint {checkpoint.path} is not a {checkpoint.method} checkpoint; delete it or point "
            f"{checkpoint.method}(checkpoint=...) elsewhere"
        )
    stepper.load(saved["state"])
    torch.set_rng_state(saved["rng"])
    return int(saved["step"])


def drive(
    step: Callable[[int], bool | None],
    first: int,
    total: int,
    name: str,
    progress: bool,
    limit: TimeLimit,
    checkpoint: Checkpoint | None = None,
    unit: str = "step",
    postfix: Callable[[], dict] | None = None,
) -> int:
    """Run ``step(i)`` for i = ``first`` .. ``total`` - 1 under a progress bar named ``name``; a step that
    returns True ends the loop (early stopping, a non-finite loss). After each whole step: a periodic
    checkpoint (not after the last, which the result supersedes), a held signal delivered, the time limit
    checked. Ctrl-C, ``kill`` or the time limit save the checkpoint at the last whole step, say where
    (:func:`~bnn_zoo.inference.boundary.say_saved`) and re-raise. ``postfix()`` is shown on the bar every
    50 steps. Returns the steps done."""
    bar = tqdm(range(first, total), desc=name, disable=bar_disabled(progress), initial=first, total=total)
    done = first
    with held_to_step_end() as held, pyro_stacks_restored():
        try:
            for i in bar:
                if step(i):
                    break
                done = i + 1
                if postfix is not None and i % 50 == 0:
                    bar.set_postfix(postfix())
                if checkpoint is not None and done % checkpoint.every == 0 and done < total:
                    checkpoint.save(done)
                held.check()
                limit.tick()
        except (KeyboardInterrupt, TimeLimitExceeded) as stop:
            whole = held.whole or isinstance(stop, TimeLimitExceeded)
            if checkpoint is not None and whole and checkpoint.save(done):
                say_saved(stop, f"checkpoint at {unit} {done} of {total} saved to {checkpoint.path}")
            raise
    return done


# ---------------------------------------------------------------- chains in forked processes


def run_chains(chain: Callable[[int], dict], n: int, parallel: bool, kept: FinishedChains) -> list[dict]:
    """``chain(c)`` for c in 0..n-1 not ``kept`` already, each kept as it finishes: in forked processes,
    as many at a time as :func:`workers` allows, or one after another in this process."""
    at_once = workers(n - len(kept.chains), parallel)
    if at_once < 2:
        for c in range(n):
            if c not in kept.chains:
                with pyro_stacks_restored():
                    kept.add(c, chain(c))
        return [kept.chains[c] for c in range(n)]
    context = multiprocessing.get_context("fork")
    threads = max(1, torch.get_num_threads() // at_once)
    waiting, running = [c for c in range(n) if c not in kept.chains], {}
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                c = waiting.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_chain_process, args=(chain, c, threads, send), daemon=True)
                process.start()
                send.close()  # the child's end: EOF here once the child is gone
                running[receive] = (c, process)
            for receive in wait(list(running)):
                c, process = running.pop(receive)
                kept.add(c, _chain_result(receive, c, process))
    finally:
        for _, process in running.values():  # an error or Ctrl-C: stop the others
            process.terminate()
            process.join()
    return [kept.chains[c] for c in range(n)]


class FinishedChains:
    """The chains of a run that have finished, each saved to ``path`` (when given) as it finishes: a
    chain is one program (its warm-up and draws), so a stopped run loses the chains under way, and the
    same fit run again runs only the others. Their draws do not depend on the order chains run in (chain
    c is seeded by seed + c), so the resumed run ends as an uninterrupted one. The finished run removes
    the file; a stopped one says how many chains it kept."""

    def __init__(self, path, identity: str, count: int, progress: bool, method: str):
        self.count, self.chains = count, {}
        self.checkpoint = Checkpoint.at(path, identity, method, 1, lambda done: {"chains": self.chains})
        saved = self.checkpoint and self.checkpoint.load()
        if saved is not None:
            if not isinstance(saved.get("chains"), dict):
                raise BnnZooError(f"checkpoint {path} is not an MCMC checkpoint; delete it to start afresh")
            self.chains = saved["chains"]
            if progress:
                print(f"resuming from checkpoint {path}: {len(self.chains)} of {count} chains done", file=sys.stderr)

    def add(self, c: int, result: dict) -> None:
        self.chains[c] = result
        if self.checkpoint is not None:
            self.checkpoint.save(len(self.chains))

    def __enter__(self) -> FinishedChains:
        return self

    def __exit__(self, kind, stop, _) -> None:
        if self.checkpoint is None:
            return
        if kind is None:
            self.checkpoint.discard()  # the posterior supersedes it
        elif isinstance(stop, (KeyboardInterrupt, TimeLimitExceeded)) and self.chains:
            say_saved(stop, f"checkpoint of {len(self.chains)} of {self.count} chains saved to {self.checkpoint.path}")


def workers(n: int, parallel: bool) -> int:
    """How many of n chains run at once: in forked processes, one per core this process may use
    (:func:`bnn_zoo.resources.cores`: a sweep worker's share, whatever torch's thread count); or 1 (in
    this process)."""
    # macOS's fork is unsafe, Windows has none, and a forked child cannot use the parent's CUDA context
    if not parallel or sys.platform != "linux" or torch.cuda.is_initialized():
        return 1
    return min(n, resources.cores())


def _chain_process(chain: Callable[[int], dict], c: int, threads: int, send) -> None:
    """A forked chain: its result as torch.save bytes, or its error as JSON (never a pickled object)."""
    torch.set_num_threads(threads)  # before any op: the inherited OpenMP pool does not survive fork
    _free_tqdm_lock()
    try:
        buffer = io.BytesIO()
        torch.save(chain(c), buffer)
        send.send_bytes(b"ok" + buffer.getvalue())
    except BaseException as exc:  # Ctrl-C and kill included: the parent decides what to raise
        known = (KeyboardInterrupt, TimeLimitExceeded, BnnZooError)  # the kinds the parent raises again as they are
        kind = next((k.__name__ for k in known if isinstance(exc, k)), type(exc).__name__)
        send.send_bytes(b"er" + json.dumps([kind, str(exc)]).encode())
    finally:
        send.close()


def _free_tqdm_lock() -> None:
    """Give this forked child a tqdm lock of its own. tqdm's monitor thread takes its lock every 10 s in
    the parent; a fork at that moment copies the thread lock held, and no thread here will release it.
    Its multiprocessing lock is a semaphore shared with the parent and every sibling: a chain killed
    while holding it (Pyro makes a progress bar even when disabled) would block them all for good."""
    tqdm_std.TqdmDefaultWriteLock.mp_lock = None
    tqdm_std.TqdmDefaultWriteLock.th_lock = threading.RLock()
    tqdm_std.tqdm.set_lock(tqdm_std.TqdmDefaultWriteLock())


def _chain_result(receive, c: int, process) -> dict:
    try:
        message = receive.recv_bytes()
    except EOFError:
        message = None
    finally:
        receive.close()
        process.join()
    if message is None:
        raise BnnZooError(
            f"chain {c}'s process ended without a result (exit code {process.exitcode}; killed, or out of memory); "
            "run with chain_method='sequential' to run the chains in this process"
        )
    if message.startswith(b"er"):
        kind, text = json.loads(message[2:])
        if kind == "KeyboardInterrupt":
            raise KeyboardInterrupt
        if kind in ("BnnZooError", "TimeLimitExceeded"):
            raise (TimeLimitExceeded if kind == "TimeLimitExceeded" else BnnZooError)(text)
        raise BnnZooError(f"chain {c} failed: {kind}: {text} (chain_method='sequential' shows the traceback)")
    return torch.load(io.BytesIO(message[2:]), weights_only=True)
