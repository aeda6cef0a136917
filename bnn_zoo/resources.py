"""What a fit needs before it is allocated: memory estimated from shapes alone, and the scoring's time,
against what the machine has.

The network is measured on torch's ``meta`` device: its parameters and the bytes its forward pass
makes per input row, with no memory behind them. A run whose estimate exceeds the memory available
is refused in one line (what it needs, what the machine has) instead of swapping until it is killed.
The scoring after a fit (predictions, ELBO and LOO over every draw) is timed from one forward pass
of the real network and refused above a limit, so a large corpus does not score for hours unasked.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from bnn_zoo.errors import ResourceError

FLOAT = 4  # bytes of a float32
# weight-sized tensors a fit keeps: the weights, a guide's two per weight, their gradients, Adam's two moments
WEIGHT_COPIES = 6
GRADIENT_FACTOR = 2  # a backward pass holds about as much again as the forward pass it differentiates


def available_memory() -> int:
    """Bytes this process may still allocate: the kernel's MemAvailable, or less where a cgroup limits it."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        free = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable"))) * 1024
    except (OSError, StopIteration, ValueError):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit, used = (Path("/sys/fs/cgroup", f).read_text().strip() for f in ("memory.max", "memory.current"))
        if limit != "max":
            free = min(free, int(limit) - int(used))
    except (OSError, ValueError):
        pass
    return free


CORES_VARIABLE = "BNN_ZOO_CORES"


def cores() -> int:
    """Cores this process may keep busy: its share where a sweep or test worker is given one
    (``BNN_ZOO_CORES``), else every core it may run on (its CPU affinity). Not torch's thread count:
    ``OMP_NUM_THREADS=1``, the cluster convention, sets threads per process, not processes."""
    share = os.environ.get(CORES_VARIABLE, "")
    if share.isdigit() and int(share) >= 1:
        return int(share)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Counter(TorchDispatchMode):
    """Sums the bytes of every tensor an operation returns: what a forward pass allocates."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def on_meta(build: Callable[[], torch.nn.Module]) -> torch.nn.Module | None:
    """The network ``build`` makes, on the meta device (shapes only); None where it cannot be built there."""
    try:
        with torch.device("meta"):
            return build()
    except Exception:  # a user's constructor doing real arithmetic: it is then measured by its real build
        return None


def footprint(meta: torch.nn.Module, row_shape: tuple[int, ...]) -> tuple[int, int | None]:
    """(parameters, bytes the forward pass makes per input row) of a network built on the meta device
    (None per row where its forward does not run there)."""
    params = sum(p.numel() for p in meta.parameters())
    counts = []
    try:
        for rows in (1, 2):
            with _Counter() as counter:
                meta(torch.zeros(rows, *row_shape, device="meta"))
            counts.append(counter.bytes)
    except Exception:  # an operation without a meta kernel, or a forward that reads values
        return params, None
    return params, max(counts[1] - counts[0], 0)


def check_fit_memory(
    params: int,
    per_row: int | None,
    rows_per_step: int,
    copies: int = 1,
    predictions: dict[str, int] | None = None,
    fix: str = "",
) -> None:
    """Refuse a fit whose estimated memory exceeds what is available: the weights and the method's
    copies of them, one step's forward and backward pass over ``rows_per_step`` rows for ``copies``
    draws of the weights, and the largest of ``predictions`` (named float counts held at once)."""
    parts = {"the weights and their copies": params * FLOAT * WEIGHT_COPIES}
    if per_row is not None:
        parts["one training step"] = per_row * rows_per_step * copies * GRADIENT_FACTOR
    for what, floats in (predictions or {}).items():
        parts[what] = floats * FLOAT
    need, free = sum(parts.values()), available_memory()
    if need > free:
        largest = max(parts, key=parts.get)
        raise ResourceError(
            f"this fit needs about {_size(need)} of memory ({largest}: {_size(parts[largest])}) and this machine has "
            f"{_size(free)} available; {fix or 'use less data or a smaller network'}"
        )


def seconds_per_row(net: torch.nn.Module, x: torch.Tensor, rows: int = 512) -> float | None:
    """Wall seconds one forward pass of ``net`` takes per input row, on ``rows`` rows made from x (best
    of three, after a warm-up): the scoring evaluates draws in batches of about this many rows. None
    where the forward fails (the fit's own input checks then name the problem)."""
    part = x[torch.arange(rows) % len(x)]
    times = []
    try:
        with torch.no_grad():
            for _ in range(4):
                start = time.perf_counter()
                net(part)
                times.append(time.perf_counter() - start)
    except Exception:
        return None
    return min(times[1:]) / rows


def check_scoring_time(per_row: float, passes: dict[str, int], limit_hours: float, fix: str) -> None:
    """Refuse a run whose scoring, ``passes`` (named counts of row forward passes) at ``per_row`` seconds
    each, is estimated to take longer than ``limit_hours``."""
    seconds = {what: n * per_row for what, n in passes.items()}
    need = sum(seconds.values())
    if need <= 3600 * limit_hours:
        return
    largest = max(seconds, key=seconds.get)
    raise ResourceError(
        f"scoring this fit would take about {_duration(need)} on this machine "
        f"({largest}: {_duration(seconds[largest])}), "
        f"over the limit of {limit_hours:g} h; {fix}"
    )


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.0f} min"


def _size(n: float) -> str:
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = min(int(math.log(max(n, 1), 1024)), len(units) - 1)
    return f"{n / 1024**power:,.1f} {units[power]}" if power else f"{int(n)} bytes"
