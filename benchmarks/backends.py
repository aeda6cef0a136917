"""The log posterior's gradient per architecture: eager torch against the same torch code traced to XLA.

One full-data value and gradient of LogPosterior (one chain), the cost every NUTS/ChEES leapfrog step
pays, for the zoo's architectures at their command-line sizes: the MLP (13-50-1 on Boston's shape,
455 rows), the digits CNN (LeNet, 1,347 images), and toy-text's LSTM with tied and untied gates (the
embedding RNN is the untied LSTM under MCMC: word-type dropout acts only under the dropout guide).
Torch: autograd, argument validation off, as the samplers run it. JAX: jit(value_and_grad) of the
traced log density (bnn_zoo.inference.xla), compile time apart. One thread each; best of 5 repeats.
``auto`` is the backend NUTS/ChEES choose for the architecture.

    python benchmarks/backends.py          # needs the jax extra; writes benchmarks/results/backends.json
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import pyro  # noqa: E402
import render  # noqa: E402
import results  # noqa: E402
import torch  # noqa: E402

import bnn_zoo as bz  # noqa: E402
from bnn_zoo.data import digits  # noqa: E402
from bnn_zoo.data.text import classification, toy_text  # noqa: E402
from bnn_zoo.inference import xla  # noqa: E402
from bnn_zoo.inference.potential import chain_starts  # noqa: E402

torch.set_num_threads(1)


def cases():
    """(name, BNN, x, y) at the command line's sizes."""
    g = torch.Generator().manual_seed(0)
    text = classification(*toy_text(seed=0))
    vocab = int(text.x_train.max()) + 1
    image = digits()
    categorical = bz.likelihoods.Categorical()
    yield (
        "mlp",
        bz.BNN(bz.models.MLP(13, [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.35)),
        torch.randn(455, 13, generator=g),
        torch.randn(455, 1, generator=g),
    )
    yield "cnn", bz.BNN(bz.models.LeNet(), bz.priors.FanInNormal(), categorical), *image.train
    for gates in ("tied", "untied"):
        yield (
            f"lstm-{gates}",
            bz.BNN(bz.models.TextRNN(vocab, 32, 64, gates), bz.priors.FanInNormal(), categorical),
            *text.train,
        )


def measure(name, model, x, y) -> dict:
    import jax
    import jax.numpy as jnp

    target = xla.JaxTarget(model, x, y)
    q = target.start(chain_starts(model, None, 1, 0, torch.Generator().manual_seed(0)))[0]

    def eager():
        leaf = q.clone().requires_grad_(True)
        with pyro.validation_enabled(False):
            value = target.torch_target(target.unflatten(leaf), (x, y))[0]
        return torch.autograd.grad(value, leaf)

    torch_ms = results.best_ms(eager, calls=20)
    row = {
        "architecture": name,
        "weights": sum(target.sizes),
        "rows": len(x),
        "torch_ms": torch_ms,
        "auto": xla.resolve_backend("auto", model),
    }
    value_and_grad = jax.jit(jax.value_and_grad(target.logdensity))
    qj = jnp.asarray(q.numpy())
    start = time.perf_counter()
    try:
        jax.block_until_ready(value_and_grad(qj))
    except Exception as exc:  # what the backend's check turns into a fall-back to torch
        return row | {"jax_ms": None, "speedup": None, "jax_compile_s": None, "untraceable": xla.first_line(exc)}
    compile_s = time.perf_counter() - start
    jax_ms = results.best_ms(
        lambda: jax.block_until_ready(value_and_grad(qj)), calls=max(5, int(200 / max(torch_ms, 1)))
    )
    return row | {"jax_ms": jax_ms, "speedup": torch_ms / jax_ms, "jax_compile_s": compile_s}


def main():
    rows = []
    print("| architecture | weights | rows | torch eager ms | XLA ms | torch / XLA | XLA compile s | auto backend |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for case in cases():
        r = measure(*case)
        rows.append(r)
        print(render.backend_row(r), flush=True)
    print(f"results: {results.write('backends', rows, threads=1)}")


if __name__ == "__main__":
    main()
