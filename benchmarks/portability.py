"""What moves between CPUs, and what large data costs per step.

- ``mkl``: the demo's Laplace fit (its log evidence and standardised test RMSE) and a 512 x 512 matrix
  product, with MKL's default code path (chosen by CPU vendor and instruction set) against
  ``MKL_CBWR=COMPATIBLE`` (the same path on every x86-64 CPU, for the same thread count), each in a
  fresh process on 1 thread and on torch's default (one per core, as the demo runs).
- ``minibatch``: drawing a minibatch of 128 rows, by a permutation of all n rows (Pyro's subsampling
  plate) against ``bnn_zoo.inference.elbo.minibatch``, for n = 10^5 to 10^7.

The minibatch timings use one torch thread.

    python benchmarks/portability.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from results import best_ms, write

CHILD = """
import json, sys, time, torch, bnn_zoo as bz
from bnn_zoo.data import toy_cubic
torch.set_num_threads(int(sys.argv[1]) or torch.get_num_threads())
data = toy_cubic(seed=0)
noise = data.info["noise_scale"]  # the targets' units, which bz.fit takes a fixed noise in
model = bz.BNN(bz.models.MLP(1, [50], 1, activation="tanh"), bz.priors.FanInNormal(), bz.likelihoods.Gaussian(noise))
post = bz.fit(model, *data.train, bz.Laplace(seed=0, progress=False))
error = post.predict(data.test[0]).mean[:, 0] - data.test[1].reshape(-1)
rmse = float((error**2).mean().sqrt()) / data.y_std
a, b = torch.randn(512, 512), torch.randn(512, 512)
a @ b
start = time.perf_counter()
for _ in range(50):
    a @ b
ms = 1e3 * (time.perf_counter() - start) / 50
print(json.dumps({"threads": torch.get_num_threads(), "log_evidence": post.info["evidence_laplace"],
                  "test_rmse_standardised": rmse, "matmul_512_ms": ms}))
"""


def mkl_rows() -> list[dict]:
    rows = []
    for threads in (1, 0):  # 0: torch's default
        for mode in ("default", "COMPATIBLE"):
            env = dict(os.environ) | ({"MKL_CBWR": mode} if mode != "default" else {})
            command = [sys.executable, "-c", CHILD, str(threads)]
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            rows.append({"case": "mkl", "mkl_cbwr": mode, **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


def minibatch_rows() -> list[dict]:
    from bnn_zoo.inference.elbo import minibatch

    rows = []
    for n in (10**5, 10**6, 10**7):
        rows.append(
            {
                "case": "minibatch",
                "rows": n,
                "permutation_ms": best_ms(lambda n=n: torch.randperm(n)[:128], 3),
                "minibatch_ms": best_ms(lambda n=n: minibatch(n, 128), 3),
            }
        )
    return rows


if __name__ == "__main__":
    torch.set_num_threads(1)
    rows = mkl_rows() + minibatch_rows()
    for row in rows:
        print(row)
    print(write("portability", rows, threads=1, batch=128))
