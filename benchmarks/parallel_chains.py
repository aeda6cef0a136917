"""NUTS chains under OMP_NUM_THREADS=1 (every cluster job's setting): two chains against one, wall time,
each run in a fresh process. Chains run a forked process per core whatever torch's thread count, so
two chains on two cores should take about one chain's time (target: under 1.5x).

With --backend jax: four chains of NUTS on XLA, a 13-50-1 MLP on 455 rows (a Boston split's shape,
synthetic), with one JAX CPU device per core (BNN_ZOO_CORES unset) against one device
(BNN_ZOO_CORES=1): the fit's own runtime, compilation included.

python benchmarks/parallel_chains.py [--backend jax]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from results import write

RUN = """
import torch, bnn_zoo as bz
data = bz.data.toy_cubic(seed=0)
model = bz.BNN(bz.models.MLP(1, [50], 1, "tanh"), bz.priors.FanInNormal(), bz.likelihoods.Gaussian(0.5))
bz.fit(model, *data.train, bz.NUTS(num_warmup=200, num_samples=200, num_chains={chains}, backend="torch",
       progress=False), standardize=False)
"""
XLA_RUN = """
import torch, bnn_zoo as bz
g = torch.Generator().manual_seed(0)
x = torch.randn(455, 13, generator=g)
y = torch.tanh(x @ torch.randn(13, 1, generator=g)) + 0.3 * torch.randn(455, 1, generator=g)
model = bz.BNN(bz.models.MLP(13, [50], 1, "relu"), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
post = bz.fit(model, x, y, bz.NUTS(num_warmup=150, num_samples=150, num_chains={chains}, backend="jax",
              progress=False))
print("runtime_s", post.runtime_s)
"""


def wall_s(chains: int, cores: str | None = None, backend: str = "torch") -> float:
    """The wall time of a fresh process's fit (torch), or the fit's own runtime (jax)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("BNN_ZOO_CORES", None)
    env.update({"BNN_ZOO_CORES": cores} if cores else {})
    start = time.perf_counter()
    run = (RUN if backend == "torch" else XLA_RUN).format(chains=chains)
    printed = subprocess.run([sys.executable, "-c", run], env=env, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    return wall if backend == "torch" else float(printed.split("runtime_s")[-1])


def xla() -> None:
    one, every = wall_s(4, cores="1", backend="jax"), wall_s(4, backend="jax")
    cores = len(os.sched_getaffinity(0))
    rows = [
        {"chains": 4, "JAX CPU devices": 1, "runtime_s": round(one, 1), "ratio_to_one_device": 1.0},
        {
            "chains": 4,
            "JAX CPU devices": cores,
            "runtime_s": round(every, 1),
            "ratio_to_one_device": round(every / one, 2),
        },
    ]
    print(write("parallel-chains-xla", rows, command="python benchmarks/parallel_chains.py --backend jax"))


def main() -> None:
    if sys.argv[1:] == ["--backend", "jax"]:
        return xla()
    one, two, serial = wall_s(1), wall_s(2), wall_s(2, cores="1")
    rows = [
        {"chains": 1, "processes": 1, "wall_s": one, "ratio_to_one_chain": 1.0},
        {"chains": 2, "processes": 2, "wall_s": two, "ratio_to_one_chain": two / one},
        {
            "chains": 2,
            "processes": "1 (BNN_ZOO_CORES=1: as every OMP_NUM_THREADS=1 run was)",
            "wall_s": serial,
            "ratio_to_one_chain": serial / one,
        },
    ]
    print(write("parallel-chains", rows, command="python benchmarks/parallel_chains.py", omp_num_threads=1))
    print(f"1 chain {one:.1f} s, 2 chains {two:.1f} s: {two / one:.2f}x")


if __name__ == "__main__":
    main()
