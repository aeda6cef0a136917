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

One concern a module: :mod:`~bnn_zoo.inference.xla.environment` (whether the backend can run, the torchax
shim), :mod:`~bnn_zoo.inference.xla.tracing` (the traced log density), :mod:`~bnn_zoo.inference.xla.devices`
(devices and rounds of programs), :mod:`~bnn_zoo.inference.xla.supervision` (the host's watch over a compiled
run), and the samplers, :mod:`~bnn_zoo.inference.xla.nuts` and :mod:`~bnn_zoo.inference.xla.chees`.
"""

from bnn_zoo.inference.xla.chees import run_chees, run_chees_cells
from bnn_zoo.inference.xla.devices import cpu_lanes, in_lockstep
from bnn_zoo.inference.xla.environment import (
    BACKENDS,
    PACKAGES,
    TORCHAX_TORCH,
    FallBack,
    available,
    check_backend,
    installed,
    load_torchax,
    resolve_backend,
    unsupported_torch,
)
from bnn_zoo.inference.xla.nuts import run_nuts, run_nuts_cells
from bnn_zoo.inference.xla.supervision import Watch
from bnn_zoo.inference.xla.tracing import JaxTarget, first_line, jax_target, padded

__all__ = [
    "BACKENDS",
    "PACKAGES",
    "TORCHAX_TORCH",
    "FallBack",
    "JaxTarget",
    "Watch",
    "available",
    "check_backend",
    "cpu_lanes",
    "first_line",
    "in_lockstep",
    "installed",
    "jax_target",
    "load_torchax",
    "padded",
    "resolve_backend",
    "run_chees",
    "run_chees_cells",
    "run_nuts",
    "run_nuts_cells",
    "unsupported_torch",
]
