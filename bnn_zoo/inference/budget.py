"""A time limit for full-batch MCMC, checked as the run goes.

NUTS, HMC and ChEES evaluate the log posterior and its gradient on every training row at every
leapfrog step. On a small BNN that is minutes; on the digits CNN or a text LSTM a gradient takes 40-70 ms
and a NUTS iteration hundreds of them, so the command line's 2 x 1,000 iterations take 3-18 hours
(docs/guide/defaults.md). A run with ``max_hours`` projects its duration from its own pace once it
has run ``GRACE_S`` seconds, and stops with one clear error, rather than leaving a newcomer at an
hours-long progress bar. The pace is the run's own, not a model of it: NUTS's first iterations (the
step-size search) are its slowest, so the projection errs long; ChEES's trajectories grow through
warm-up, so its check keeps running to the last iteration.
"""

from __future__ import annotations

import math
import time

from bnn_zoo.errors import BnnZooError

GRACE_S = 60.0


class TimeLimitExceeded(BnnZooError):
    """A run projected past its ``max_hours``: a BnnZooError, so the command line prints it as one line."""


def check_max_hours(name: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise BnnZooError(f"{name} max_hours must be a positive number of hours or None (no limit), got {value!r}")


class TimeLimit:
    """Raises :class:`TimeLimitExceeded` when ``done`` of ``total`` iterations, after ``GRACE_S``
    seconds, project past ``max_hours`` (``rounds``: how many times the run repeats this pace, e.g.
    chains run one after another)."""

    def __init__(self, method: str, max_hours: float | None, total: int, rounds: int = 1):
        self.method, self.max_hours, self.total, self.rounds = method, max_hours, total, rounds
        self.start = time.perf_counter()

    def check(self, done: int) -> None:
        if self.max_hours is None or done <= 0:
            return
        elapsed = time.perf_counter() - self.start
        if elapsed < GRACE_S:
            return
        projected = elapsed / done * self.total * self.rounds
        if projected > 3600 * self.max_hours:
            raise TimeLimitExceeded(
                f"{self.method} would take about {projected / 3600:.1f} hours at its pace so far ({done} of {self.total} iterations in "
                f"{elapsed:.0f} s{f', {self.rounds} rounds of chains' if self.rounds > 1 else ''}), more than max_hours={self.max_hours:g}; "
                "fit it by minibatch MCMC (sghmc) or SVI, give fewer warm-up and kept draws, or raise max_hours"
            )
