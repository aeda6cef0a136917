"""Whether the XLA backend can run here, and torchax made to import beside the installed torch: the
backend's packages, the torch releases its torchax is tested with, the choice of backend, and the shim for
the operators later torch releases removed."""

from __future__ import annotations

import importlib.util
import logging
import re
import warnings
from pathlib import Path

import torch

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError
from bnn_zoo.models import architecture

PACKAGES = ("jax", "numpyro", "blackjax", "optax", "torchax")
BACKENDS = ("auto", "torch", "jax")


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


def load_torchax():
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
