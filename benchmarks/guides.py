"""The guide library side by side.

1. ELBO gap to the exact log evidence on Bayesian linear regression with correlated inputs (the
   test fixture: 30 points, 3 inputs, corr(x1, x2) = 0.9): gap = log p(D) - ELBO, with its MC error.
   The dropout guide has no density (its ELBO is -infinity as s -> 0), so it has no gap.
2. Time per SVI step and process peak memory on one MLP (6-50-50-1, 300 points, full batch, one
   particle, lr 3e-3), each guide in a fresh process so that peak RSS is its own. Ratios are against mean-field.
3. Gradient variance of the per-example noise (local reparameterisation, per-example dropout masks)
   against one shared draw per minibatch, at the same guide parameters: the ratio is the point of it.

    python benchmarks/guides.py
"""

from __future__ import annotations

import multiprocessing as mp
import platform
import resource
import time
import warnings

warnings.simplefilter("ignore", FutureWarning)
# structured guides order sites differently; KLs stay exact
warnings.filterwarnings("ignore", message="Failed to verify mean field")

GUIDES = [
    ("mean-field", {}),
    ("matrix-normal", {}),
    ("matrix-normal", {"rank": 2}),
    ("flow", {"transform": "affine"}),
    ("flow", {"transform": "spline"}),
    ("flow", {"transform": "affine", "scope": "layer"}),
    ("flow", {"transform": "spline", "scope": "layer"}),
    ("mean-field", {"local_reparam": True}),
    ("matrix-normal", {"local_reparam": True}),
    ("dropout", {"p": 0.1}),
    ("dropout", {"p": 0.1, "masks": "example"}),
]
# per-example noise on / off, by the guide attribute that switches it
SHARED_VS_LOCAL = [
    ("mean-field", {"local_reparam": True, "init_scale": 0.1}, "local", set()),
    ("matrix-normal", {"local_reparam": True, "init_scale": 0.1}, "local_reparam", False),
    ("dropout", {"p": 0.1, "masks": "example"}, "masks", "step"),
]
# An affine autoregressive flow over d latents needs a MADE at least d wide (O(d^2) memory): over the
# MLP's 2951 weights (or its 2500-weight layer) the library refuses it, so it is not timed there.
TOO_BIG_FOR_MLP = {("flow", "affine")}


def label(guide, options):
    return guide + "".join(f" {k}={v}" for k, v in options.items())


def blr_gap(guide, options):
    import torch

    import bnn_zoo as bz
    from bnn_zoo.evaluation.exact import linear_regression

    g = torch.Generator().manual_seed(1)
    z = torch.randn(30, 3, generator=g)
    x = z.clone()
    x[:, 1] = 0.9 * z[:, 0] + 0.44 * z[:, 1]
    y = x @ torch.tensor([1.0, -0.5, 0.3]) + 0.2 + 0.5 * torch.randn(30, generator=g)
    exact = linear_regression(x, y, 1.0, 1.0, 0.5)
    model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    if guide == "dropout":
        return None, None
    lr = 0.02 if guide == "flow" else 0.05
    post = bz.fit(
        model,
        x,
        y,
        bz.SVI(guide=guide, guide_options=options, steps=3000, lr=lr, lr_decay=0.05, num_particles=8, progress=False),
        standardize=False,  # the exact evidence is the model's on these units
    )
    elbo, se = post.elbo(num_samples=10000)
    return exact.log_evidence - elbo, se


def mlp_problem():
    import torch

    import bnn_zoo as bz

    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 6, generator=g)
    y = x.sum(1).sin() + 0.1 * torch.randn(300, generator=g)
    return bz.BNN(bz.models.MLP(6, [50, 50], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned()), x, y


def mlp_cost(guide, options, queue, steps=100):
    import bnn_zoo as bz

    model, x, y = mlp_problem()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # lr 3e-3: at 1e-2 the spline flows' conditioner nets blow up within 5 steps on this MLP (NaN, measured)
    method = dict(guide=guide, guide_options=options, lr=3e-3, progress=False, num_draws=10)
    bz.fit(model, x, y, bz.SVI(steps=5, **method))  # warm up
    start = time.perf_counter()
    post = bz.fit(model, x, y, bz.SVI(steps=steps, **method))
    if post.info["stop_reason"]:
        raise RuntimeError(post.info["stop_reason"])
    per_step = (time.perf_counter() - start) / steps
    queue.put((per_step, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, base))


def gradient_variance(guide, options, switch, shared, repeats=200, batch=32):
    """Total variance (summed over parameters) of the minibatch loss gradient, per-example noise vs shared,
    at the parameters of a 500-step fit."""
    import pyro
    import torch
    from pyro.infer import TraceMeanField_ELBO

    import bnn_zoo as bz

    model, x, y = mlp_problem()
    post = bz.fit(
        model,
        x,
        y,
        bz.SVI(guide=guide, guide_options=options, steps=500, lr=0.01, batch_size=batch, progress=False, num_draws=10),
    )
    g, elbo, out = post.guide, TraceMeanField_ELBO(), []
    local = getattr(g, switch)
    g.train()
    for value in (local, shared):
        setattr(g, switch, value)
        pyro.set_rng_seed(0)
        grads = []
        for _ in range(repeats):
            g.zero_grad()
            elbo.differentiable_loss(model, g, x, y, batch).backward()
            grads.append(torch.cat([p.grad.flatten() for p in g.parameters() if p.grad is not None]))
        out.append(torch.stack(grads).var(0).sum().item())
    return out


def main():
    import torch

    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
        "threads"
    )
    ctx = mp.get_context("spawn")
    print(
        "| guide | BLR gap log p(D) - ELBO (nats) | MC SE | MLP ms/step | vs mean-field | MLP peak RSS MiB | vs "
        "mean-field |",
        flush=True,
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    ref = None
    for guide, options in GUIDES:
        gap, se = blr_gap(guide, options)
        cost = "| refused: O(d^2) memory | | |"
        if (guide, options.get("transform")) not in TOO_BIG_FOR_MLP:
            queue = ctx.Queue()
            proc = ctx.Process(target=mlp_cost, args=(guide, options, queue))
            proc.start()
            proc.join(timeout=900)
            if proc.exitcode == 0:
                per_step, peak_kb, _ = queue.get()
                ref = ref or (per_step, peak_kb)
                cost = (
                    f"| {1000 * per_step:.1f} | {per_step / ref[0]:.2f}x | {peak_kb / 1024:.0f} | "
                    f"{peak_kb / ref[1]:.2f}x |"
                )
            else:
                proc.kill()
                cost = f"| failed (exit code {proc.exitcode}) | | | |"
        gap_cells = "| - (no density) | -" if gap is None else f"| {gap:.3f} | {se:.3f}"
        print(f"| {label(guide, options)} {gap_cells} {cost}", flush=True)
    print("\n| guide | per-example noise: grad variance | one shared draw: grad variance | shared / per-example |")
    print("|---|---|---|---|")
    for guide, options, switch, shared in SHARED_VS_LOCAL:
        local_var, shared_var = gradient_variance(guide, options, switch, shared)
        print(
            f"| {label(guide, options)} | {local_var:.4g} | {shared_var:.4g} | {shared_var / local_var:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
