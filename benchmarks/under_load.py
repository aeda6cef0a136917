"""A lockstep step beside another CPU-bound job: how far each torch thread count degrades.

The workload is `bnn-zoo reproduce uci-gal`'s: 9 dropout fits (a 3 x 3 grid of p and tau) of a
1-50-1 ReLU network on 1,030 rows of 8 features, batch 128, stepped in lockstep. Each thread count
is timed alone and beside a second process that keeps every core busy (a torch matrix-product loop
at torch's defaults, as another user's job would), with OpenMP's default wait policy (its threads
spin at barriers) and with OMP_WAIT_POLICY=PASSIVE, which the bnn-zoo command sets. Writes
benchmarks/results/under-load.json.

    python benchmarks/under_load.py   (about 2 minutes; run it on an otherwise idle machine)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

STEPS = 300


def _ms_per_step(threads: int) -> float:
    import torch

    import bnn_zoo as bz
    from bnn_zoo.inference import lockstep

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1030, 8, generator=g), torch.randn(1030, generator=g)
    jobs = [
        lockstep.Job(
            bz.BNN(
                bz.models.MLP(8, [50], 1, activation="relu"),
                bz.priors.Normal(1.0),
                bz.likelihoods.Gaussian.from_precision(tau),
            ),
            x,
            y,
            bz.SVI(
                guide="dropout",
                guide_options={"p": p, "masks": "example"},
                steps=STEPS,
                batch_size=128,
                lr=1e-3,
                progress=False,
            ),
            standardize=False,  # the data are standard normal already
        )
        for p in (0.005, 0.01, 0.05)
        for tau in (0.1, 1.0, 10.0)
    ]
    start = time.perf_counter()
    lockstep.fit_lockstep(jobs)
    return 1e3 * (time.perf_counter() - start) / STEPS


def _competitor() -> subprocess.Popen:
    """Another user's CPU-bound job: a torch matrix-product loop at torch's defaults (its own environment)."""
    code = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def _timed(threads: int, policy: str | None, loaded: bool) -> float:
    """ms per step in a fresh process with OpenMP's wait policy ``policy`` (None: the runtime's default)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | (
        {"OMP_WAIT_POLICY": policy} if policy else {}
    )
    busy = _competitor() if loaded else None
    try:
        if busy:
            time.sleep(3)  # its threads are running
        out = subprocess.run(
            [sys.executable, __file__, "--measure", str(threads)], env=env, capture_output=True, text=True, check=True
        )
        return float(out.stdout.split()[-1])
    finally:
        if busy:
            busy.kill()
            busy.wait()


def main() -> None:
    if sys.argv[1:2] == ["--measure"]:
        print(_ms_per_step(int(sys.argv[2])))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    import results

    rows = []
    for threads, policy in ((2, None), (1, None), (2, "PASSIVE")):
        quiet, loaded = _timed(threads, policy, False), _timed(threads, policy, True)
        rows.append(
            {
                "torch_threads": threads,
                "omp_wait_policy": policy or "default",
                "ms_per_step_quiet": quiet,
                "ms_per_step_loaded": loaded,
            }
        )
        rows[-1]["slowdown"] = loaded / quiet
        print(rows[-1], flush=True)
    print(
        results.write(
            "under-load",
            rows,
            steps=STEPS,
            fits=9,
            data_rows=1030,
            competitor="torch 512x512 matmul loop at torch's default threads and wait policy",
        )
    )


if __name__ == "__main__":
    main()
