"""One loop for the iterative methods run in Python (SVI alone and in lockstep, SG-MCMC's chains, ChEES on
torch, ensembles and SWAG, AIS): the progress bar, periodic and on-stop checkpoints under the fit's
identity, the time limit, and Ctrl-C and ``kill`` held to a step's end
(:mod:`bnn_zoo.inference.boundary`). A method gives a step and the state a checkpoint holds; the loop is
written once, here.

The XLA samplers (:mod:`bnn_zoo.inference.xla`) keep loops of their own, inside one compiled program, and
report to the host through callbacks; they, and NUTS and HMC's finished chains, keep their checkpoints
with :class:`Checkpoint`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from bnn_zoo.inference.boundary import held_to_step_end, say_saved
from bnn_zoo.inference.budget import TimeLimit, TimeLimitExceeded
from bnn_zoo.io import atomic_torch_save, bar_disabled, check_identity, safe_torch_load, say_resumed


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
    with held_to_step_end() as held:
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
