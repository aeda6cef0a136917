"""NUTS's mass matrix on a BNN: BlackJAX's diagonal window adaptation against its low-rank one
(``window_adaptation_low_rank``: Seyboldt et al.'s Fisher-divergence metric, as nutpie adapts it), both
on the log density bnn-zoo traces to JAX, beside bnn-zoo's own NUTS (NumPyro's kernel, diagonal).

Problems and model as benchmarks/chees.py (the toy 1-50-1 or Boston 13-50-1, standardised, N(0, 1)
prior, fixed noise). Two chains one after the other, one thread. The measure: the minimum bulk ESS of f
at 10 test inputs per 1,000 gradients of the kept draws, and per second, warm-up and compilation
included. The question it answers:
does a low-rank metric give more effective samples per gradient than the diagonal one bnn-zoo uses?

    python benchmarks/low_rank.py [--problem boston --data ../shared/data/uci/bostonHousing] [--seeds 0 1]

Writes benchmarks/results/low-rank-PROBLEM.json (date, machine, commit).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402
import results  # noqa: E402
import torch  # noqa: E402
from chees import function_diagnostics, problem, run_nuts  # noqa: E402

import bnn_zoo as bz  # noqa: E402
from bnn_zoo.inference import xla  # noqa: E402
from bnn_zoo.inference.potential import chain_starts  # noqa: E402

torch.set_num_threads(1)


def run_blackjax(x, y, x_test, noise, draws: int, seed: int, low_rank: bool, max_rank: int) -> dict:
    """BlackJAX NUTS after its window adaptation (diagonal, or low-rank of ``max_rank``), 2 chains."""
    import blackjax
    import jax
    import jax.numpy as jnp

    model = bz.BNN(bz.models.MLP(x.shape[1], [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(noise))
    target = xla.JaxTarget(model, x, y)
    q0 = target.start(chain_starts(model, None, 2, seed, torch.Generator().manual_seed(seed)))
    start = time.perf_counter()
    positions, steps, divergences = [], [], 0
    for chain in range(2):
        key_warm, key_draw = jax.random.split(jax.random.PRNGKey(seed * 2 + chain))
        if low_rank:
            warmup = blackjax.window_adaptation_low_rank(blackjax.nuts, target.logdensity, max_rank=max_rank)
        else:
            warmup = blackjax.window_adaptation(blackjax.nuts, target.logdensity)
        (state, parameters), _ = warmup.run(key_warm, jnp.asarray(q0[chain].numpy()), num_steps=draws)
        kernel = blackjax.nuts(target.logdensity, **parameters).step

        def one(state, key, kernel=kernel):
            state, info = kernel(key, state)
            return state, (state.position, info.num_integration_steps, info.is_divergent)

        _, (q, n, diverged) = jax.lax.scan(one, state, jax.random.split(key_draw, draws))
        positions.append(np.asarray(q))
        steps.append(float(np.mean(n)))
        divergences += int(np.sum(diverged))
    wall = time.perf_counter() - start
    samples = target.unflatten(torch.as_tensor(np.stack(positions)))
    with torch.no_grad():
        f = model.forward(samples, x_test)[..., 0].numpy()
    ess, rhat = function_diagnostics(f)
    label = f"BlackJAX NUTS, low-rank mass (rank {max_rank})" if low_rank else "BlackJAX NUTS, diagonal mass"
    return {
        "sampler": label + ", 2 chains",
        "draws": f"{draws}+{draws}",
        "wall": wall,
        "steps": float(np.mean(steps)),
        "ess": ess,
        "rhat_f": rhat,
        "divergences": divergences,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", choices=("toy", "boston"), default="toy")
    parser.add_argument("--data", help="the bostonHousing folder (UCI format), for --problem boston")
    parser.add_argument("--draws", type=int, default=500, help="warm-up and kept draws per chain")
    parser.add_argument("--max-rank", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    x, y, x_test, noise = problem(args.problem, args.data)
    rows = []
    for seed in args.seeds:
        measured = [
            run_nuts(x, y, x_test, noise, args.draws, seed, "jax"),
            run_blackjax(x, y, x_test, noise, args.draws, seed, False, args.max_rank),
            run_blackjax(x, y, x_test, noise, args.draws, seed, True, args.max_rank),
        ]
        for r in measured:
            gradients = 2 * args.draws * r["steps"]  # the kept draws of 2 chains
            row = {k: v for k, v in r.items() if k not in ("f", "rhat_w")}
            rows.append(
                row | {"seed": seed, "ess_per_kgrad": 1000 * r["ess"] / gradients, "ess_per_s": r["ess"] / r["wall"]}
            )
            print(
                f"seed {seed} | {r['sampler']} | wall {r['wall']:.1f} s | steps/draw {r['steps']:.0f} | "
                f"ESS {r['ess']:.0f} | R-hat {r['rhat_f']:.3f} | ESS/kgrad {rows[-1]['ess_per_kgrad']:.2f} | "
                f"ESS/s {rows[-1]['ess_per_s']:.1f}",
                flush=True,
            )
    settings = {"problem": args.problem, "draws": args.draws, "max_rank": args.max_rank, "seeds": args.seeds}
    print(f"results: {results.write(f'low-rank-{args.problem}', rows, threads=1, **settings)}")


if __name__ == "__main__":
    main()
