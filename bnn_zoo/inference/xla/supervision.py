"""The host's watch over a compiled run: progress, the time limit, and Ctrl-C or ``kill`` while XLA runs,
through callbacks from inside the program; and the stop of the programs still running on other devices."""

from __future__ import annotations

import contextlib
import os
import threading

from bnn_zoo.inference.budget import TimeLimit, TimeLimitExceeded

ABANDON_WAIT_S = 600.0  # a stopped run waits this long at most for each device's program to call back


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
        (:func:`in_rounds`) has finished."""
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
        """Programs on ``lanes`` CPU devices start (:func:`in_rounds`); each calls back as it ends."""
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
    """Wait on the runtime tokens of the programs still running on other devices (:func:`in_rounds`;
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
