"""Where NUTS time goes on the demo's 1-50-1 tanh BNN (toy-cubic, N=20), one chain per configuration.

Baseline = the configuration measured in the spine issue: N(0, 1) prior on every weight, chain started
at the network's own initialisation, jit-compiled potential. Each row changes one thing or combines the
winners; "ratio" is baseline seconds per effective sample over the row's (higher = faster).

    python benchmarks/nuts_toy.py [--warmup 300 --samples 300]
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

warnings.simplefilter("ignore", FutureWarning)

import arviz as az  # noqa: E402
import torch  # noqa: E402
from pyro.infer.autoguide.initialization import init_to_value  # noqa: E402
from pyro.ops.integrator import potential_grad  # noqa: E402

import bnn_zoo as bz  # noqa: E402
from bnn_zoo.data import toy_cubic  # noqa: E402
from bnn_zoo.inference.mcmc import _NUTSKernel  # noqa: E402

CONFIGS = [  # name, prior, init, jit
    ("baseline: N(0,1) prior, net init, jit", "normal", "network", True),
    ("fan-in prior, net init, jit", "fanin", "network", True),
    ("fan-in prior, SVI init, jit", "fanin", "svi", True),
    ("fan-in prior, SVI init, no jit", "fanin", "svi", False),
]


def model_for(data, prior):
    noise = data.info["noise_scale"]  # the targets' units, which bz.fit takes a fixed noise in
    return bz.BNN(
        bz.models.MLP(1, [50], 1),
        bz.priors.FanInNormal() if prior == "fanin" else bz.priors.Normal(1.0),
        bz.likelihoods.Gaussian(noise),
    )


def potential_cost(model, x, y, jit, repeats=300):
    kernel = _NUTSKernel(
        model, init_strategy=init_to_value(values=model.network_init(0)), jit_compile=jit, ignore_jit_warnings=True
    )
    kernel.setup(0, x, y)
    z = kernel.initial_params
    for _ in range(20):
        potential_grad(kernel.potential_fn, z)
    start = time.perf_counter()
    for _ in range(repeats):
        potential_grad(kernel.potential_fn, z)
    return 1000 * (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    data = toy_cubic()
    x, y = data.train
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; {args.warmup} warmup + {args.samples} draws, 1 chain"
    )
    for jit in (True, False):
        print(f"potential + gradient, jit={jit}: {potential_cost(model_for(data, 'fanin'), x, y, jit):.3f} ms")
    rows = []
    for name, prior, init, jit in CONFIGS:
        model = model_for(data, prior)
        start = time.perf_counter()
        init_value = None
        if init == "svi":
            init_value = bz.fit(model, x, y, bz.SVI(steps=3000, lr=0.02, lr_decay=0.1, num_particles=4, progress=False))
        svi_s = time.perf_counter() - start
        post = bz.fit(
            model,
            x,
            y,
            bz.NUTS(
                num_warmup=args.warmup,
                num_samples=args.samples,
                num_chains=1,
                init=init_value,
                jit_compile=jit,
                progress=False,
            ),
        )
        total = time.perf_counter() - start
        stats = post.sample_stats
        ess = az.ess(post.to_inference_data(), method="bulk")
        min_ess = min(float(ess[v].min()) for v in ess.data_vars)
        rows.append(
            (
                name,
                total,
                svi_s,
                float(stats["tree_depth"].float().mean()),
                float(stats["n_steps"].float().mean()),
                float(stats["step_size"][0, 0]),
                int(stats["diverging"].sum()),
                min_ess,
                total / max(min_ess, 1e-9),
            )
        )
    base = rows[0][-1]
    print(
        "| configuration | total s | of which SVI s | mean tree depth | leapfrog steps/draw | step size | divergences "
        "| min bulk ESS | s per ESS | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.0f} | {r[5]:.4f} | {r[6]} | {r[7]:.0f} | "
            f"{r[8]:.3f} | {base / r[8]:.1f}x |"
        )


if __name__ == "__main__":
    main()
