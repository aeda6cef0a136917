"""A time limit for a fit, checked as the run goes: full-batch MCMC, and the step loops of SVI, SG-MCMC
and ensembles, whose cost on a wide table or a large network a newcomer cannot guess.

NUTS, HMC and ChEES evaluate the log posterior and its gradient on every training row at every
leapfrog step. On a small BNN that is minutes; on the digits CNN or a text LSTM it can be hours
(docs/benchmarks-defaults.md). A run with ``max_hours`` projects its duration from its own pace once it
has run ``GRACE_S`` seconds, and stops with one clear error, rather than leaving a newcomer at an
hours-long progress bar. The pace is the run's own, not a model of it; ChEES's trajectories grow
through warm-up, so its check keeps running to the last iteration.

A run whose early iterations are dearer than the rest names the iteration where that ends
(``settle``): the first mass-matrix update, for ChEES and Pyro's HMC (Stan's schedule: iteration 100
of a 500-iteration warm-up). Before it the chains move in unwhitened coordinates at small step sizes,
and both spend a trajectory of fixed length in steps of that size, so those iterations can be several
times dearer than the rest (docs/benchmarks-defaults.md, "MCMC time limit"). Until ``settle`` the projection therefore
assumes the rest may run up to ``SETTLED_SPEEDUP`` times faster, which stops only runs too slow even
then; after it, the pace since ``settle`` is projected. NUTS projects from its start: its trees grow
until they turn back, so the same update barely makes its iterations cheaper.
"""

from __future__ import annotations

import math
import time

from bnn_zoo.errors import BnnZooError

GRACE_S = 60.0
SETTLED_SPEEDUP = 10.0  # how much cheaper an iteration after `settle` may be (docs/benchmarks-defaults.md)
MCMC_FIX = "fit it by minibatch MCMC (sghmc) or SVI, give fewer warm-up and kept draws, or raise max_hours"
STEPS_FIX = "give fewer steps, minibatches (batch_size), a smaller network or less data, or raise max_hours"


class TimeLimitExceeded(BnnZooError):
    """A run projected past its ``max_hours``: a BnnZooError, so the command line prints it as one line."""


def check_max_hours(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise BnnZooError(f"{name} max_hours must be a positive number of hours or None (no limit), got {value!r}")


class TimeLimit:
    """Raises :class:`TimeLimitExceeded` when ``done`` of ``total`` iterations, after ``GRACE_S``
    seconds, project past ``max_hours`` (``rounds``: how many times the run repeats this pace, e.g.
    chains run one after another; ``settle``: the iteration from which the pace is representative).
    ``turns``: a batch of fits whose time is that many fits' one after another (cells in rounds on the
    CPU's cores), each fit allowed ``max_hours``."""

    def __init__(
        self,
        method: str,
        max_hours: float | None,
        total: int,
        rounds: int = 1,
        settle: int = 0,
        turns: int = 1,
        fix: str = MCMC_FIX,
    ):
        self.method, self.max_hours, self.total, self.rounds, self.turns = method, max_hours, total, rounds, turns
        self.start, self.fix, self.done = time.perf_counter(), fix, 0
        self.settle_at(settle)

    def tick(self) -> None:
        """One more iteration done: :meth:`check` the projection."""
        self.done += 1
        self.check(self.done)

    def settle_at(self, iteration: int) -> None:
        """Name the iteration from which the pace is representative (0: from the start); for samplers
        that learn it only once they are set up, before the first check."""
        self.settle = iteration
        self._settled = self.start if iteration <= 0 else None  # when iteration `settle` began

    def check(self, done: int) -> None:
        if self.max_hours is None or done <= 0:
            return
        now = time.perf_counter()
        if self._settled is None and done >= self.settle:
            self._settled = now
        elapsed = now - self.start
        if elapsed < GRACE_S:
            return
        if self.settle <= 0 or (self._settled is not None and now - self._settled >= GRACE_S and done > self.settle):
            pace = (now - self._settled) / (done - max(self.settle, 0))
            projected = (elapsed + pace * (self.total - done)) * self.rounds
            how = f"about {_in_hours(projected)} hours at its pace so far"
        else:  # still adapting or just settled: a lower bound, the rest up to SETTLED_SPEEDUP times cheaper
            pace = elapsed / min(done, self.settle)
            projected = (
                elapsed
                + pace * max(self.settle - done, 0)
                + pace / SETTLED_SPEEDUP * (self.total - max(done, self.settle))
            ) * self.rounds
            how = (
                f"at least {_in_hours(projected)} hours, even if its iterations after iteration {self.settle} ran "
                f"{SETTLED_SPEEDUP:g}x faster than so far"
            )
        if projected > 3600 * self.max_hours * self.turns:
            each = (
                f" per cell ({self.max_hours * self.turns:g} hours for its {self.turns} rounds of cells)"
                if self.turns > 1
                else ""
            )
            raise TimeLimitExceeded(
                f"{self.method} would take {how} ({done} of {self.total} iterations in "
                f"{elapsed:.0f} s{f', {self.rounds} rounds of chains' if self.rounds > 1 else ''}), more than "
                f"max_hours={self.max_hours:g}{each}; {self.fix}"
            )


def _in_hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.1f}" if hours >= 0.1 else f"{hours:.2g}"  # a short test limit still reads as a number
