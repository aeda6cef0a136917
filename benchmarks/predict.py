"""Monte Carlo prediction: ``Posterior.predict`` against a hand-batched evaluation of the same draws.

A mean-field posterior of a tanh MLP (fitted briefly: the weights' values do not change the cost)
has T draws; both sides compute the predictive mean and variance at N test inputs from exactly
those draws (checked equal before timing). ``predict`` makes the draws from the guide on every call
(they are not stored); the hand-batched side is given them ready-made, stacks them and runs each
layer as one broadcast ``torch.matmul`` over them (the fastest of matmul, einsum and baddbmm here).
One torch thread; medians of ``--repeats`` interleaved runs.

``--memory`` instead measures the peak resident memory of ``predict`` on the 13-400-400-1 net
for T = 1,000, 10,000 and 30,000 draws, each in a fresh process.

    python benchmarks/predict.py [--draws 1000] [--repeats 5]
    python benchmarks/predict.py --memory
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

import bnn_zoo as bz

# (hidden widths, N test inputs); 1000 draws x 1000 inputs x 400 units would be 1.6 GB a layer
NETS = {"13-50-1": ([50], [51, 1000]), "13-100-1": ([100], [8232]), "13-400-400-1": ([400, 400], [51])}


def posterior(hidden, draws: int):
    torch.manual_seed(0)
    x = torch.randn(455, 13)
    y = torch.tanh(x[:, :3]).sum(1)
    model = bz.BNN(bz.models.MLP(13, hidden, 1, "tanh"), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.35))
    return bz.fit(model, x, y, bz.SVI(steps=20, num_draws=draws, progress=False))


def zoo(post, x):
    pred = post.predict(x)
    return pred.mean, pred.variance


def hand(draws, layers, x, noise_var: float):
    with torch.no_grad():
        h = x
        for i, name in enumerate(layers):
            h = torch.matmul(h, draws[name + ".weight"].transpose(1, 2)) + draws[name + ".bias"][:, None]
            if i < len(layers) - 1:
                h = torch.tanh(h)
        return h.mean(0), h.var(0, unbiased=False) + noise_var


def hand_drawing(post, layers, x, noise_var: float):
    """The hand-batched evaluation with its own draws, w = mu + sigma eps, as ``predict`` makes its own."""
    with torch.no_grad():
        draws = {}
        for name in post.model.params:
            loc, scale = post.guide.loc_and_scale(name)
            draws[name] = loc + scale * torch.randn(post.num_draws, *loc.shape)
        return hand(draws, layers, x, noise_var)


def timed(fn, *args, repeats: int = 5) -> float:
    fn(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - start) / repeats


def peak_memory(draws: int) -> None:
    """In this process: the peak resident memory added by predict(x, num_samples=draws), in MB."""
    post = posterior([400, 400], 10)
    x = torch.randn(51, 13)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pred = post.predict(x, num_samples=draws)
    assert torch.isfinite(pred.mean).all()  # the moments computed, not only the draws
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)


def memory_table() -> None:
    print("| network | T draws | weights if stored MB | peak memory added by predict MB |\n|---|---|---|---|")
    for draws in (1000, 10000, 30000):
        # glibc otherwise keeps freed 20 MB blocks in its heap (its mmap threshold grows with them), and the
        # peak then measures fragmentation, which varied from 44 to 640 MB between identical runs
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        run = subprocess.run(
            [sys.executable, __file__, "--peak", str(draws)], capture_output=True, text=True, check=True, env=env
        )
        stored = draws * (13 * 400 + 400 + 400 * 400 + 400 + 401) * 4 / 2**20
        print(f"| 13-400-400-1 | {draws} | {stored:.0f} | {float(run.stdout.split()[-1]):.0f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--memory", action="store_true", help="peak memory of predict at T = 1,000, 10,000 and 30,000 instead"
    )
    parser.add_argument("--peak", type=int, help=argparse.SUPPRESS)  # one --memory measurement, in a fresh process
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.peak:
        return peak_memory(args.peak)
    if args.memory:
        return memory_table()
    print(
        "| network | T draws | N inputs | hand-batched, draws given ms | hand-batched, drawing ms | predict ms | vs "
        "draws given | vs drawing |\n|---|---|---|---|---|---|---|---|"
    )
    for net, (hidden, inputs) in NETS.items():
        post = posterior(hidden, args.draws)
        draws = post.draws()
        layers = sorted({k.rsplit(".", 1)[0] for k in draws})
        for n in inputs:
            x = torch.randn(n, 13)
            mean, var = zoo(post, x)
            ref_mean, ref_var = hand(draws, layers, x, 0.35**2)
            # the same numbers, or the timing means nothing
            torch.testing.assert_close(mean, ref_mean, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(var, ref_var, rtol=1e-4, atol=1e-5)
            times = {"hand": [], "drawing": [], "zoo": []}
            for _ in range(args.repeats):
                times["hand"].append(timed(hand, draws, layers, x, 0.35**2))
                times["drawing"].append(timed(hand_drawing, post, layers, x, 0.35**2))
                times["zoo"].append(timed(zoo, post, x))
            h, d, z = (statistics.median(times[k]) for k in ("hand", "drawing", "zoo"))
            print(
                f"| {net} | {args.draws} | {n} | {h * 1e3:.2f} | {d * 1e3:.2f} | {z * 1e3:.2f} | {z / h:.2f}x | "
                f"{z / d:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
