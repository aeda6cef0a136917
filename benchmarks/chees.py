"""Many chains in lockstep: bnn-zoo's ChEES-HMC against NumPyro's NUTS, effective samples per second.

The measure (issue "Speed"): the minimum bulk ESS of the network output f at 10 test inputs, over the
whole wall time, compile included. Problems: the toy 1-50-1 tanh BNN (N(0, 1) prior, noise 0.1 on
standardised data, N = 20) and Boston 13-50-1 (noise 0.35; needs ../shared/data/uci/bostonHousing).
One thread each. NumPyro runs its NUTS with its default settings, 2 chains one after the other.

    python benchmarks/chees.py                       # the toy problem: NumPyro's NUTS, bnn-zoo's NUTS and ChEES
                                                     # on the jax backend, ChEES on the torch backend
    python benchmarks/chees.py --problem boston --data ../shared/data/uci/bostonHousing [--mass-matrix pooled within]
    python benchmarks/chees.py --seeds 0 1 2 3 4     # a table per seed, then each sampler's median ESS/s
    python benchmarks/chees.py --backends jax --chains 16 --dense-mass [--problem boston ...]
                                                     # NUTS's diagonal against its dense mass matrix
    python benchmarks/chees.py --check               # ChEES's predictive against a long Pyro NUTS run
    python benchmarks/chees.py --gradient --problem boston --data ../shared/data/uci/bostonHousing
                                                     # one batched potential and gradient: autograd, the
                                                     # MLP's own backward, JAX's jit(vmap(value_and_grad))
    python benchmarks/chees.py --chunks [--glibc-defaults]
                                                     # the same for the digits CNN and toy-text's LSTM
                                                     # (autograd) by chunk of chains, against one batch

NumPyro and the jax backend are the optional ``bench`` extra (pip install 'bnn-zoo[bench]'). Each run writes
its rows to benchmarks/results/chees-PROBLEM.json (date, machine, commit).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import arviz as az  # noqa: E402
import numpy as np  # noqa: E402
import results  # noqa: E402
import torch  # noqa: E402

import bnn_zoo as bz  # noqa: E402
from bnn_zoo.data import load_uci, toy_cubic  # noqa: E402
from bnn_zoo.scaling import Scaling  # noqa: E402

torch.set_num_threads(1)


def problem(name: str, data_path: str | None):
    """(x, y, 10 test inputs, noise sd) standardised by the training rows' moments: every sampler here
    sees the same data (bnn-zoo's fits with ``standardize=False``)."""
    if name == "toy":
        data, noise = toy_cubic(), 0.1
    else:
        data, noise = load_uci(data_path, split=0), 0.35
    x, y = data.train
    scaling = Scaling.of(x, y)
    return scaling.inputs(x), scaling.targets(y), scaling.inputs(data.test[0][:10]), noise


def function_diagnostics(f: np.ndarray) -> tuple[float, float]:
    """(min bulk ESS, max R-hat) over the test inputs of f shaped (chain, draw, input)."""
    ds = az.convert_to_dataset({"f": f})
    return float(az.ess(ds, method="bulk")["f"].min()), float(az.rhat(ds)["f"].max())


def weight_rhat(samples: dict) -> float:
    ds = az.convert_to_dataset({k: np.asarray(v).reshape(*np.shape(v)[:2], -1) for k, v in samples.items()})
    return float(max(float(az.rhat(ds)[k].max()) for k in ds.data_vars))


def run_chees(x, y, x_test, noise, chains, warmup, samples, seed, compile=False, mass_matrix="pooled", backend="torch"):
    method = bz.ChEES(
        num_chains=chains,
        num_warmup=warmup,
        num_samples=samples,
        seed=seed,
        compile=compile,
        mass_matrix=mass_matrix,
        progress=False,
        backend=backend,
    )
    label = (
        f"bnn-zoo ChEES ({backend}), {chains} chains"
        + (", compiled" if compile else "")
        + (", within-chain mass" if mass_matrix == "within" else "")
    )
    return run_bnn_zoo(x, y, x_test, noise, method, label, f"{warmup}+{samples}")


def run_nuts(x, y, x_test, noise, draws, seed, backend, dense_mass=False):
    """bnn-zoo's NUTS with NumPyro's row's draws, 2 chains (on the jax backend one after the other)."""
    method = bz.NUTS(num_warmup=draws, num_samples=draws, num_chains=2, seed=seed, progress=False, backend=backend)
    method = dataclasses.replace(method, dense_mass=dense_mass)
    sampler = "Pyro" if backend == "torch" else "NumPyro on the traced torch model"
    label = f"bnn-zoo NUTS ({backend}: {sampler}), 2 chains" + (", dense mass" if dense_mass else "")
    return run_bnn_zoo(x, y, x_test, noise, method, label, f"{draws}+{draws}")


def run_bnn_zoo(x, y, x_test, noise, method, label, draws):
    model = bz.BNN(bz.models.MLP(x.shape[1], [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(noise))
    start = time.perf_counter()
    post = bz.fit(model, x, y, method, standardize=False)  # standardised by problem(), as NumPyro's data
    wall = time.perf_counter() - start
    assert post.settings["backend"] == method.backend, post.settings  # no silent fallback
    with torch.no_grad():
        f = model.forward({k: post.samples[k] for k in model.params}, x_test)[..., 0].numpy()
    ess, rhat = function_diagnostics(f)
    stats = post.sample_stats
    steps = float(stats["n_steps"].float().mean())
    return {
        "sampler": label,
        "draws": draws,
        "wall": wall,
        "steps": steps,
        "ess": ess,
        "rhat_f": rhat,
        "rhat_w": weight_rhat(post.samples),
        "divergences": int(stats["diverging"].sum()),
        "f": f,
    }


def run_numpyro(x, y, x_test, noise, warmup, samples, seed):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    def model(x, y=None):
        h = x.shape[1]
        w1 = numpyro.sample("w1", dist.Normal(0, 1).expand([h, 50]).to_event(2))
        b1 = numpyro.sample("b1", dist.Normal(0, 1).expand([50]).to_event(1))
        w2 = numpyro.sample("w2", dist.Normal(0, 1).expand([50, 1]).to_event(2))
        b2 = numpyro.sample("b2", dist.Normal(0, 1).expand([1]).to_event(1))
        f = (jnp.tanh(x @ w1 + b1) @ w2 + b2)[:, 0]
        numpyro.sample("y", dist.Normal(f, noise), obs=y)

    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy().reshape(-1))
    start = time.perf_counter()
    mcmc = MCMC(
        NUTS(model), num_warmup=warmup, num_samples=samples, num_chains=2, chain_method="sequential", progress_bar=False
    )
    mcmc.run(jax.random.PRNGKey(seed), xj, yj, extra_fields=("num_steps", "diverging"))
    s = mcmc.get_samples(group_by_chain=True)
    jax.block_until_ready(s["w1"])
    wall = time.perf_counter() - start
    xt = x_test.numpy()
    hidden = np.tanh(np.einsum("ni,cdih->cdnh", xt, np.asarray(s["w1"])) + np.asarray(s["b1"])[:, :, None])
    f = np.einsum("cdnh,cdho->cdno", hidden, np.asarray(s["w2"]))[..., 0] + np.asarray(s["b2"])
    ess, rhat = function_diagnostics(f)
    extra = mcmc.get_extra_fields(group_by_chain=True)
    return {
        "sampler": "NumPyro NUTS, 2 chains",
        "draws": f"{warmup}+{samples}",
        "wall": wall,
        "steps": float(np.mean(extra["num_steps"])),
        "ess": ess,
        "rhat_f": rhat,
        "rhat_w": weight_rhat({k: np.asarray(v) for k, v in s.items()}),
        "divergences": int(np.sum(extra["diverging"])),
        "f": f,
    }


def time_gradients(x, y, noise, chains: list[int], repeats: int = 5, calls: int = 100):
    """Milliseconds for one potential and gradient of C chains, best of ``repeats`` x ``calls``:
    autograd through LogPosterior.batched, LogPosterior.batched_value_and_grad (the MLP's own
    backward, what ChEES runs) and JAX's jit(vmap(value_and_grad)) of the same log posterior."""
    import jax
    import jax.numpy as jnp
    import pyro

    from bnn_zoo.inference.potential import LogPosterior

    best = lambda fn: results.best_ms(fn, calls, repeats)  # noqa: E731

    model = bz.BNN(bz.models.MLP(x.shape[1], [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(noise))
    target = LogPosterior(model, len(x))
    yy = y.reshape(-1, 1)

    def autograd(params):
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        logp = target.batched(leaves, x, yy)
        return torch.autograd.grad(logp.sum(), list(leaves.values()))

    def jax_log_posterior(p, xj, yj):
        f = (jnp.tanh(xj @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])[:, 0]
        log_lik = jax.scipy.stats.norm.logpdf(yj, f, noise).sum()
        return log_lik + sum(jax.scipy.stats.norm.logpdf(v).sum() for v in p.values())

    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy().reshape(-1))
    batched = jax.jit(jax.vmap(jax.value_and_grad(jax_log_posterior), in_axes=(0, None, None)))
    print("| chains | autograd ms | own backward ms | JAX ms | own backward us per chain | vs autograd | vs JAX |")
    print("|---|---|---|---|---|---|---|")
    for c in chains:
        g = torch.Generator().manual_seed(c)
        params = {k: 0.3 * torch.randn(c, *shape, generator=g) for k, shape in model.latent_shapes().items()}
        pj = {
            "w1": jnp.asarray(params["layers.0.weight"].transpose(1, 2).numpy()),
            "b1": jnp.asarray(params["layers.0.bias"].numpy()),
            "w2": jnp.asarray(params["layers.1.weight"].transpose(1, 2).numpy()),
            "b2": jnp.asarray(params["layers.1.bias"].numpy()),
        }
        with pyro.validation_enabled(False):  # as ChEES runs them
            t_auto = best(lambda params=params: autograd(params))
            t_own = best(lambda params=params: target.batched_value_and_grad(params, x, yy))
        t_jax = best(lambda pj=pj: jax.block_until_ready(batched(pj, xj, yj)))
        print(
            f"| {c} | {t_auto:.2f} | {t_own:.2f} | {t_jax:.2f} | {1e3 * t_own / c:.0f} | {t_auto / t_own:.2f}x | "
            f"{t_jax / t_own:.2f}x |"
        )


def time_chunks(chains: int = 16, repeats: int = 3) -> None:
    """Seconds for one potential and gradient of ``chains`` chains of the networks without their own
    backward (the digits CNN, toy-text's tied LSTM), through autograd a chunk of chains at a time, and
    with LogPosterior's own choice of chunk (what ChEES runs); best of ``repeats``."""
    from bnn_zoo.data import digits
    from bnn_zoo.data.text import classification, toy_text

    text = classification(*toy_text(seed=0))
    vocab = int(text.x_train.max()) + 1
    cases = {
        "digits CNN": (bz.models.LeNet(), bz.priors.FanInNormal(), digits()),
        "toy-text tied LSTM": (bz.models.TextRNN(vocab, 32, 64, "tied"), bz.priors.ScaleMixture(), text),
    }
    sizes = [k for k in (1, 2, 4, 8) if k < chains] + [chains]
    print(
        f"| network | saved per chain MB | {' | '.join(f'chunks of {k}' for k in sizes)} | chosen chunk | chosen s | "
        "one batch / chosen |"
    )
    print("|---|---|" + "---|" * (len(sizes) + 3))
    for name, (net, prior, data) in cases.items():
        model = bz.BNN(net, prior, bz.likelihoods.Categorical())
        inits = [model.network_init(i) for i in range(chains)]
        params = {k: torch.stack([v[k] for v in inits]) for k in inits[0]}
        times, chosen, size, per_chain = _chunk_times(model, params, *data.train, sizes, repeats)
        print(
            f"| {name} | {per_chain / 1e6:.0f} | {' | '.join(f'{t:.3f}' for t in times)} | {size} | {chosen:.3f} | "
            f"{times[-1] / chosen:.2f}x |"
        )


def _chunk_times(model, params, x, y, sizes, repeats):
    """(seconds per chunk size, seconds with LogPosterior's choice, its chunk, bytes saved per chain)."""
    import pyro

    from bnn_zoo.inference import potential

    def best(fn):
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    one_batch, chosen = potential.LogPosterior(model, len(x)), potential.LogPosterior(model, len(x))
    chains = next(iter(params.values())).shape[0]

    def in_chunks(k):
        for start in range(0, chains, k):
            one_batch.batched_value_and_grad({n: v[start : start + k] for n, v in params.items()}, x, y)

    with pyro.validation_enabled(False):  # as ChEES runs it
        limit, potential.CHUNK_BYTES = potential.CHUNK_BYTES, float("inf")  # each call one batch
        try:
            times = [best(lambda k=k: in_chunks(k)) for k in sizes]
        finally:
            potential.CHUNK_BYTES = limit
        t_chosen = best(lambda: chosen.batched_value_and_grad(params, x, y))
    return times, t_chosen, chosen.chunk_size(params, x, y), chosen._saved_bytes_per_chain(params, x, y)


def check_against_nuts(chains, warmup, samples, nuts_draws):
    """ChEES's predictive mean and 95% band on the toy problem against a long run of Pyro's NUTS
    (4 chains), on 25 inputs across the training range, in units of the two runs' combined Monte
    Carlo standard error (ArviZ's MCSE of the mean and of the 2.5% and 97.5% quantiles)."""
    x, y, _, noise = problem("toy", None)
    grid = torch.linspace(float(x.min()), float(x.max()), 25)[:, None]
    model = bz.BNN(bz.models.MLP(1, [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(noise))
    chees = bz.fit(model, x, y, bz.ChEES(num_chains=chains, num_warmup=warmup, num_samples=samples, progress=False))
    nuts = bz.fit(model, x, y, bz.NUTS(num_warmup=nuts_draws, num_samples=nuts_draws, num_chains=4, progress=False))
    runs = []
    for post in (chees, nuts):
        with torch.no_grad():
            f = model.forward({k: post.samples[k] for k in model.params}, grid)[..., 0].numpy()
        ds = az.convert_to_dataset({"f": f})
        quantiles = [
            (np.quantile(f.reshape(-1, 25), p, axis=0), az.mcse(ds, method="quantile", prob=p)["f"].values)
            for p in (0.025, 0.975)
        ]
        runs.append((f.reshape(-1, 25).mean(0), az.mcse(ds)["f"].values, quantiles, float(az.rhat(ds)["f"].max())))
    (m1, se1, q1, r1), (m2, se2, q2, r2) = runs
    z_mean = np.abs(m1 - m2) / np.sqrt(se1**2 + se2**2)
    z_band = max(float((np.abs(a - b) / np.sqrt(sa**2 + sb**2)).max()) for (a, sa), (b, sb) in zip(q1, q2, strict=True))
    print(
        f"ChEES {chains} chains x ({warmup} + {samples}), {chees.runtime_s:.0f} s; Pyro NUTS 4 x ({nuts_draws} + "
        f"{nuts_draws}), {nuts.runtime_s:.0f} s"
    )
    print(
        f"predictive mean: max |ChEES - NUTS| / combined MCSE over 25 inputs = {z_mean.max():.2f} (median "
        f"{np.median(z_mean):.2f})"
    )
    print(
        f"95% band ends: max |ChEES - NUTS| / combined MCSE = {z_band:.2f}; max R-hat of f: ChEES {r1:.3f}, NUTS "
        f"{r2:.3f}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problem", choices=("toy", "boston"), default="toy")
    parser.add_argument("--data", help="the bostonHousing folder (UCI format), for --problem boston")
    parser.add_argument("--chains", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--warmup", type=int, default=100, help="ChEES warm-up iterations")
    parser.add_argument("--samples", type=int, default=200, help="ChEES draws per chain")
    parser.add_argument("--numpyro-draws", type=int, default=1000, help="NumPyro warm-up and kept draws per chain")
    parser.add_argument(
        "--nuts-draws", type=int, default=400, help="--check: Pyro NUTS warm-up and kept draws per chain (4 chains)"
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="one table per seed, then the median ESS/s of each sampler"
    )
    parser.add_argument(
        "--mass-matrix",
        choices=("pooled", "within"),
        nargs="+",
        default=["pooled"],
        help="ChEES's mass-matrix estimate(s) to run",
    )
    parser.add_argument(
        "--dense-mass", action="store_true", help="also run bnn-zoo's NUTS on the jax backend with a dense mass matrix"
    )
    parser.add_argument(
        "--compile", action="store_true", help="also run every ChEES row with compile=True (torch.compile)"
    )
    parser.add_argument(
        "--check", action="store_true", help="compare ChEES's predictive with a long Pyro NUTS run instead"
    )
    parser.add_argument(
        "--gradient", action="store_true", help="time one batched potential and gradient per chain count instead"
    )
    parser.add_argument(
        "--chunks",
        action="store_true",
        help="time the CNN's and the LSTM's batched gradient by chunk of chains instead",
    )
    parser.add_argument(
        "--backends", choices=("jax", "torch"), nargs="+", default=["jax", "torch"], help="bnn-zoo's backends to run"
    )
    parser.add_argument(
        "--pyro-nuts",
        action="store_true",
        help="also run NUTS on the torch backend (Pyro's; 10-15x slower than NumPyro)",
    )
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave glibc's malloc as it is (a Python user's default), not bz.keep_freed_memory()",
    )
    args = parser.parse_args()
    if not args.glibc_defaults:
        bz.keep_freed_memory()  # as the command line does (bnn_zoo/memory.py); the NumPyro run shares the process
    if args.check:
        check_against_nuts(max(args.chains), args.warmup, args.samples, args.nuts_draws)
        return
    if args.chunks:
        malloc = "glibc's defaults" if args.glibc_defaults else "bz.keep_freed_memory()"
        print(
            f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, torch {torch.__version__}, 1 thread; "
            f"{max(args.chains)} chains; {malloc}"
        )
        time_chunks(max(args.chains))
        return
    x, y, x_test, noise = problem(args.problem, args.data)
    if args.gradient:
        print(
            f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, torch {torch.__version__}, 1 thread; "
            f"{args.problem}: N = {len(x)}"
        )
        time_gradients(x, y, noise, args.chains)
        return
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, torch {torch.__version__}, 1 thread; {args.problem}: N "
        f"= {len(x)}, noise {noise}"
    )
    rates, record = {}, []  # sampler -> ESS/s per seed; every row, for the results file
    for seed in args.seeds:
        rows = [run_numpyro(x, y, x_test, noise, args.numpyro_draws, args.numpyro_draws, seed)]
        if "jax" in args.backends:
            rows.append(run_nuts(x, y, x_test, noise, args.numpyro_draws, seed, "jax"))
            if args.dense_mass:
                rows.append(run_nuts(x, y, x_test, noise, args.numpyro_draws, seed, "jax", dense_mass=True))
            rows += [
                run_chees(x, y, x_test, noise, c, args.warmup, args.samples, seed, backend="jax") for c in args.chains
            ]
        if args.pyro_nuts:
            rows.append(run_nuts(x, y, x_test, noise, args.numpyro_draws, seed, "torch"))
        if "torch" in args.backends:
            for compiled in (False, True) if args.compile else (False,):
                for mass in args.mass_matrix:
                    rows += [
                        run_chees(x, y, x_test, noise, c, args.warmup, args.samples, seed, compiled, mass)
                        for c in args.chains
                    ]
        print_table(rows, f"seed {seed}")
        base = rows[0]["ess"] / rows[0]["wall"]
        for r in rows:
            record.append(
                {
                    "seed": seed,
                    **{k: v for k, v in r.items() if k != "f"},
                    "ess_per_s": r["ess"] / r["wall"],
                    "vs_numpyro": r["ess"] / r["wall"] / base,
                }
            )
        for r in rows:
            rates.setdefault(r["sampler"], []).append(r["ess"] / r["wall"])
    if len(args.seeds) > 1:
        # the ESS of f is set by the slowest direction the chains cross, and by seed it varies 10-fold for
        # NumPyro and ChEES alike on Boston (docs/benchmarks.md): compare medians over seeds
        base = float(np.median(rates["NumPyro NUTS, 2 chains"]))
        print(f"\n| sampler | ESS/s by seed {args.seeds} | median ESS/s | vs NumPyro's median |")
        print("|---|---|---|---|")
        for sampler, values in rates.items():
            print(
                f"| {sampler} | {', '.join(f'{v:.1f}' for v in values)} | {np.median(values):.1f} | "
                f"{np.median(values) / base:.2f}x |"
            )
    keys = ("problem", "chains", "warmup", "samples", "numpyro_draws", "seeds", "dense_mass")
    settings = {k: getattr(args, k) for k in keys}
    name = f"chees-{args.problem}" + ("" if set(args.backends) == {"jax", "torch"} else f"-{args.backends[0]}")
    name += "-dense" if args.dense_mass else ""
    print(f"results: {results.write(name, record, threads=1, **settings)}")


def print_table(rows: list[dict], title: str) -> None:
    base = rows[0]["ess"] / rows[0]["wall"]
    header = (
        "sampler | warm-up + draws per chain | wall s | leapfrog steps per draw | min bulk ESS of f | ESS/s | "
        "vs NumPyro | max R-hat f"
    )
    print(f"\n{title}\n\n| {header} | max R-hat weights | divergences |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rate = r["ess"] / r["wall"]
        print(
            f"| {r['sampler']} | {r['draws']} | {r['wall']:.1f} | {r['steps']:.0f} | {r['ess']:.0f} | {rate:.1f} | "
            f"{rate / base:.2f}x | {r['rhat_f']:.3f} | {r['rhat_w']:.2f} | {r['divergences']} |"
        )


if __name__ == "__main__":
    main()
