"""Evidence estimators measured (not timed tests).

1. Bayesian linear regression (tests' fixture: 30 points, 3 correlated inputs; exact log evidence):
   the ELBO, the importance-weighted bound for K = 1..1000 and AIS for 50..1000 temperatures: error to
   the truth, standard error and seconds. Named alternative for AIS's cost: the same AIS run one particle
   at a time (as a per-chain sampler such as Pyro's HMC kernel would), as a time ratio.
2. digits (1347 train / 450 test): MLP versus LeNet, each by mean-field SVI and by MC dropout, next to a
   variational GP: evidence (ELBO, IW, AIS), LOO, WAIC and test metrics in one bnn_zoo.compare table.

    python benchmarks/evidence.py [--blr] [--digits] [--steps 3000] [--ais-steps 1000 100] [--out runs/bench-evidence]
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from pathlib import Path

import torch

warnings.simplefilter("ignore", FutureWarning)


def blr_problem():
    """The tests' correlated BLR (30 points, 3 inputs), its exact log evidence, and mean-field SVI on it."""
    import bnn_zoo as bz
    from bnn_zoo.evaluation.exact import linear_regression

    g = torch.Generator().manual_seed(1)
    z = torch.randn(30, 3, generator=g)
    x = z.clone()
    x[:, 1] = 0.9 * z[:, 0] + 0.44 * z[:, 1]
    y = x @ torch.tensor([1.0, -0.5, 0.3]) + 0.2 + 0.5 * torch.randn(30, generator=g)
    truth = linear_regression(x, y, 1.0, 1.0, 0.5).log_evidence
    model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    # as given: the exact evidence is the model's on these units, and the fit's default standardises
    svi = bz.SVI(steps=3000, lr=0.05, lr_decay=0.02, num_particles=16, progress=False)
    return model, x, y, truth, bz.fit(model, x, y, svi, standardize=False)


def blr_estimators(model, x, y, post):
    """(label, () -> (estimate, SE)) for each evidence estimator of the BLR table."""
    from bnn_zoo.evaluation import evidence

    yield "ELBO (4000 draws)", lambda: evidence.elbo(post, num_samples=4000)
    for k in (1, 10, 100, 1000):
        yield f"IW bound K={k} (x20)", lambda k=k: evidence.importance_weighted(post, k=k, num_repeats=20)
    for steps in (50, 200, 1000):
        yield (
            f"AIS {steps} steps, 4x16 particles",
            lambda steps=steps: evidence.ais(model, x, y, num_steps=steps, num_particles=16, standardize=False),
        )


def blr_table():
    from bnn_zoo.evaluation.evidence import _anneal, _Target

    model, x, y, truth, post = blr_problem()
    print(f"exact log evidence {truth:.3f}\n")
    print("| estimator | estimate | SE | estimate - truth | seconds |")
    print("|---|---|---|---|---|")
    for label, fn in blr_estimators(model, x, y, post):
        start = time.perf_counter()
        est, se = fn()
        print(
            f"| {label} | {est:.3f} | {se:.3f} | {est - truth:+.3f} | {time.perf_counter() - start:.2f} |", flush=True
        )

    target, steps = _Target(model, x, y), 200
    start = time.perf_counter()
    _anneal(target, 64, steps, 10, 0.1, 0.65, False)
    vectorised = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(64):
        _anneal(target, 1, steps, 10, 0.1, 0.65, False)
    looped = time.perf_counter() - start
    print(
        f"\nAIS, 64 particles x {steps} steps: vectorised {vectorised:.1f} s, one particle at a time {looped:.1f} s "
        f"(ratio {looped / vectorised:.1f}x)"
    )


def digits_table(steps, ais_steps, out):
    """AIS depends on the model alone (architecture, prior, likelihood), not on the guide, so it is run
    once per architecture, with a budget per architecture, and shown on both of its rows."""
    import bnn_zoo as bz
    from bnn_zoo.evaluation import evidence
    from bnn_zoo.evaluation.compare import report, to_markdown
    from bnn_zoo.experiments import config
    from bnn_zoo.experiments.run import run

    data = config.Digits().load(seed=0)
    x, y = data.train
    prior, lik = bz.priors.Normal(1.0), bz.likelihoods.Categorical()
    nets = {
        "mlp": (lambda: bz.models.MLP(64, [50], 10, activation="relu"), ais_steps["mlp"]),
        "cnn": (lambda: bz.models.LeNet(dropout="dense"), ais_steps["cnn"]),
    }
    guides = {"mean-field": {}, "dropout": {"p": 0.5, "masks": "example"}}
    results = []
    for net_name, (net, num_steps) in nets.items():
        model = bz.BNN(net(), prior, lik)
        start = time.perf_counter()
        ais = evidence.ais(model, x, y, num_steps=num_steps, num_particles=4, num_runs=4)
        print(
            f"{net_name}: AIS {num_steps} steps x 16 particles = {ais[0]:.1f} +- {ais[1]:.1f} in "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )
        for guide, options in guides.items():
            method = bz.SVI(
                guide=guide, guide_options=options, steps=steps, lr=0.005, batch_size=128, num_draws=200, progress=False
            )
            start = time.perf_counter()
            result = run(
                f"{net_name}-{guide}",
                data,
                model,
                method,
                out / f"{net_name}-{guide}",
                evidence=("iw",) if guide == "mean-field" else (),
            )
            result.metrics.update(evidence_ais=ais[0], evidence_ais_se=ais[1], ais_steps=num_steps)
            results.append(result)
            print(f"{net_name}-{guide}: {time.perf_counter() - start:.0f} s including ELBO, IW and LOO", flush=True)
    results.append(
        run("gp-rbf", data, bz.GP("rbf", lik, num_classes=10), bz.TypeII(steps=300, progress=False), out / "gp-rbf")
    )
    table = report(results, out / "comparison")
    columns = [
        "run",
        "inference",
        "elbo",
        "evidence_iw",
        "evidence_ais",
        "evidence_ais_se",
        "loo_elpd",
        "loo_se",
        "max_pareto_k",
        "waic_elpd",
        "accuracy",
        "nll",
        "brier",
        "ece",
        "expected_accuracy",
        "mutual_information",
        "runtime_s",
    ]
    print(to_markdown(table[[c for c in columns if c in table]], digits=3))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--blr", action="store_true")
    parser.add_argument("--digits", action="store_true")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument(
        "--ais-steps",
        type=int,
        nargs=2,
        default=[1000, 100],
        metavar=("MLP", "CNN"),
        help="AIS temperatures per architecture",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench-evidence"))
    args = parser.parse_args()
    print(
        f"# {time.strftime('%Y-%m-%d')} on {platform.processor() or platform.machine()}, {torch.get_num_threads()} "
        "threads\n"
    )
    if args.blr or not args.digits:
        blr_table()
    if args.digits:
        digits_table(args.steps, dict(zip(("mlp", "cnn"), args.ais_steps)), args.out)
