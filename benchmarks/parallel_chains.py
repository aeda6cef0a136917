"""NUTS chains under OMP_NUM_THREADS=1 (every cluster job's setting): two chains against one, wall time,
each run in a fresh process. Chains run a forked process per core whatever torch's thread count, so
two chains on two cores should take about one chain's time (target: under 1.5x).

python benchmarks/parallel_chains.py
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


def wall_s(chains: int, cores: str | None = None) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("BNN_ZOO_CORES", None)
    env.update({"BNN_ZOO_CORES": cores} if cores else {})
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN.format(chains=chains)], env=env, check=True)
    return time.perf_counter() - start


def main() -> None:
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
