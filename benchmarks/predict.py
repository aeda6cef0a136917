"""Monte Carlo prediction: ``Posterior.predict`` against a hand-batched evaluation of the same draws.

A mean-field posterior of a tanh MLP (fitted briefly: the weights' values do not change the cost)
keeps T draws; both sides compute the predictive mean and variance at N test inputs from exactly
those draws (checked equal before timing). The hand-batched side stacks the draws and runs each
layer as one broadcast ``torch.matmul`` over them (the fastest of matmul, einsum and baddbmm here).
One torch thread; medians of ``--repeats`` interleaved runs.

    python benchmarks/predict.py [--draws 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import bnn_zoo as bz

# (hidden widths, N test inputs); 1000 draws x 1000 inputs x 400 units would be 1.6 GB a layer
NETS = {"13-50-1": ([50], [51, 1000]), "13-400-400-1": ([400, 400], [51])}


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


def timed(fn, *args, repeats: int = 5) -> float:
    fn(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| network | T draws | N inputs | hand-batched ms | predict ms | predict / hand-batched |\n|---|---|---|---|---|---|")
    for net, (hidden, inputs) in NETS.items():
        post = posterior(hidden, args.draws)
        draws = post.draws()
        layers = sorted({k.rsplit(".", 1)[0] for k in draws})
        for n in inputs:
            x = torch.randn(n, 13)
            mean, var = zoo(post, x)
            ref_mean, ref_var = hand(draws, layers, x, 0.35**2)
            torch.testing.assert_close(mean, ref_mean, rtol=1e-4, atol=1e-5)  # the same numbers, or the timing means nothing
            torch.testing.assert_close(var, ref_var, rtol=1e-4, atol=1e-5)
            times = {"hand": [], "zoo": []}
            for _ in range(args.repeats):
                times["hand"].append(timed(hand, draws, layers, x, 0.35**2))
                times["zoo"].append(timed(zoo, post, x))
            h, z = statistics.median(times["hand"]), statistics.median(times["zoo"])
            print(f"| {net} | {args.draws} | {n} | {h * 1e3:.2f} | {z * 1e3:.2f} | {z / h:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
