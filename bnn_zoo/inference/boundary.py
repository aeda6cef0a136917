"""Ctrl-C and ``kill`` held to the end of a step, so that a checkpoint always holds whole steps.

Python runs a signal's handler between any two bytecodes: inside an optimiser's update, between the
update and the step counter, or in the progress bar between two steps. A checkpoint written there pairs
one step's parameters with another's counter or random state, and the resumed fit drifts from the
uninterrupted one. Inside :func:`held_to_step_end` SIGINT and SIGTERM are only noted; the loop calls
:meth:`Held.check` once a step and its bookkeeping are done, which runs the signal's own handler there
(KeyboardInterrupt on Ctrl-C, the command line's termination on SIGTERM) with :attr:`Held.whole` set, the
cue to save. A second signal runs the handler at once, so a step that hangs still stops (unsaved: the last
periodic checkpoint stands).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)


class Held:
    """The signal noted during a step, if any; :meth:`check` delivers it at the step's end."""

    def __init__(self):
        self.handlers: dict[int, object] = {}  # the handlers in place before, by signal
        self.pending: tuple | None = None
        self.whole = False  # True once a held signal was delivered at a step's end: the state is whole

    def _note(self, signum, frame) -> None:
        if self.pending is not None:  # the second signal: stop now, mid-step
            self._deliver(signum, frame)
        self.pending = (signum, frame)

    def check(self) -> None:
        """Call after a step's bookkeeping: a signal noted during the step runs its handler here."""
        if self.pending is not None:
            signum, frame = self.pending
            self.pending, self.whole = None, True
            self._deliver(signum, frame)

    def _deliver(self, signum, frame) -> None:
        self.handlers[signum](signum, frame)  # raises (KeyboardInterrupt; the CLI's termination)


@contextlib.contextmanager
def held_to_step_end() -> Iterator[Held]:
    """SIGINT and SIGTERM held to :meth:`Held.check` inside (on the main thread, for signals whose handler
    is Python's: elsewhere they act as before). A signal still held when the block ends runs then."""
    held = Held()
    if threading.current_thread() is threading.main_thread():
        for signum in HELD:
            handler = signal.getsignal(signum)
            if callable(handler):
                held.handlers[signum] = handler
                signal.signal(signum, held._note)
    try:
        yield held
    finally:
        for signum, handler in held.handlers.items():
            signal.signal(signum, handler)
    if held.pending is not None:  # noted in the last step, after its check: stop now, unsaved
        held._deliver(*held.pending)


@contextlib.contextmanager
def pyro_stacks_restored() -> Iterator[None]:
    """Pyro's global handler and plate stacks as they were, after a stop inside: a Ctrl-C that lands in a
    plate's ``__enter__`` leaves its name allocated (its ``__exit__`` never runs), and every later model in
    the process then fails with "duplicate plate 'data'" (a resumed fit in a notebook, say)."""
    from pyro.poutine import runtime

    handlers, plates = list(runtime._PYRO_STACK), list(runtime._DIM_ALLOCATOR._stack)
    try:
        yield
    except BaseException:
        runtime._PYRO_STACK[:], runtime._DIM_ALLOCATOR._stack[:] = handlers, plates
        raise


def say_saved(stop: BaseException, saved: str) -> None:
    """Say where a stopped run's checkpoint (``saved``: "checkpoint at step N saved to PATH") is: printed on
    Ctrl-C or kill, added to a time limit's error (which the command line prints)."""
    if isinstance(stop, KeyboardInterrupt):
        print(f"interrupted: {saved}; run again to resume")
    else:
        stop.args = (f"{stop} ({saved}: the same fit resumes it; bnn-zoo fit: add --resume)",)
