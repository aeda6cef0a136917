"""The ``bnn-zoo`` command: demo, fit, compare, list."""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from pathlib import Path

from bnn_zoo.errors import BnnZooError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, naming the fix, instead of argparse's usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    parser = _Parser(prog="bnn-zoo", description="Bayesian neural networks on Pyro: fit one model by SVI guides or NUTS/HMC, compare in ArviZ.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser(
        "demo",
        help="toy regression by mean-field SVI and NUTS side by side, with a GP baseline (the main job)",
        description="Heek's toy regression (N=20, y = x^3 + N(0, 3^2)), a 1-50-1 tanh BNN (fan-in prior, noise sd 3) fitted by mean-field SVI "
        "and by NUTS (initialised from the SVI fit), next to a GPyTorch GP (RBF kernel, type-II ML); prints one table, "
        "writes DIR/<run>/posterior.nc, metrics.json, predictions.nc and plots, and DIR/demo.png with every predictive band.",
    )
    p.add_argument("--out", default="runs/demo", help="output folder (default: runs/demo)")
    p.add_argument("--svi-steps", type=int, default=3000, help="SVI steps (default 3000)")
    p.add_argument("--num-warmup", type=int, default=300, help="NUTS warmup draws per chain (default 300)")
    p.add_argument("--num-samples", type=int, default=300, help="NUTS kept draws per chain (default 300)")
    p.add_argument("--num-chains", type=int, default=2, help="NUTS chains, run one after another (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser(
        "fit",
        help="fit one model to one dataset and write posterior.nc, metrics.json and plots",
        description="Fit a BNN and write DIR/posterior.nc (ArviZ InferenceData), DIR/posterior.json and DIR/state.pt "
        "(the saved posterior: bnn_zoo.load(DIR)), DIR/metrics.json and plots. "
        "Inputs and targets are standardised with training statistics; rmse and test_log_likelihood are "
        "reported in original units.",
    )
    p.add_argument("--data", required=True, help="toy-cubic | digits | toy-text | uci:PATH[:split=K] | text:PATH[:level=char|word;seq_len=64]")
    p.add_argument(
        "--model",
        default="mlp",
        help="mlp[:hidden=50,50;activation=relu] | linear | cnn[:dropout=all|dense] | lstm-tied | "
        "lstm-untied | embedding-rnn[:embed=32;hidden=64] (default mlp)",
    )
    p.add_argument(
        "--inference",
        required=True,
        help="svi | nuts | hmc | sgld | sghmc | cyclical (SG-MCMC: --lr is the step size, --batch-size, --num-samples draws "
        "thinned by 10, burn-in 10 x --num-warmup) | laplace[:subset=all|last_layer;hessian=full|diag|kron;optimize_prior=true] "
        "(MAP + Gaussian, MacKay's evidence) | gp[:kernel=rbf|matern52|nngp;inducing=128] (gp: a GPyTorch baseline "
        "fitted by type-II ML; nngp is the infinite-width kernel of --model mlp with relu units under --prior fanin)",
    )
    p.add_argument(
        "--guide",
        default="mean-field",
        help="variational family for svi, with options: mean-field[:local_reparam=true] | "
        "matrix-normal[:rank=K] | flow[:transform=spline;scope=layer] | dropout[:p=0.05,0.1;masks=example] (see `bnn-zoo list`)",
    )
    p.add_argument("--prior", default="fanin", help="fanin[:gain=1;bias_scale=1] | normal[:scale=1] (default fanin)")
    p.add_argument(
        "--likelihood",
        default=None,
        help="gaussian[:scale=S] (learned noise without scale) | bernoulli | categorical | tokens "
        "(default: gaussian for regression, categorical for classification, tokens for text corpora)",
    )
    p.add_argument("--steps", type=int, default=None, help="SVI steps (default 3000); Laplace MAP steps (default 2000); gp type-II steps (default 300)")
    p.add_argument("--epochs", type=int, default=None, help="SVI epochs instead of steps: steps = epochs * ceil(N / batch size)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (Adam; default 0.01 for SVI and the Laplace MAP, 0.05 for gp)")
    p.add_argument("--batch-size", type=int, default=None, help="SVI minibatch size (default: full batch)")
    p.add_argument("--num-particles", type=int, default=1, help="SVI vectorised ELBO particles (default 1)")
    p.add_argument("--kl-weight", type=float, default=1.0, help="SVI: KL discount tau, objective E[log lik] - tau KL (default 1)")
    p.add_argument("--kl-warmup", type=int, default=0, help="SVI: steps over which the KL weight rises linearly to --kl-weight (default 0)")
    p.add_argument("--objective", choices=["elbo", "renyi"], default="elbo", help="SVI objective (renyi needs --num-particles >= 2)")
    p.add_argument("--alpha", type=float, default=0.5, help="order of the Renyi bound (default 0.5)")
    p.add_argument("--validation", type=float, default=0.0, help="SVI early stopping: hold out this fraction of the training data (default 0: off)")
    p.add_argument("--eval-every", type=int, default=100, help="SVI early stopping: score the held-out data every K steps (default 100)")
    p.add_argument("--patience", type=int, default=5, help="SVI early stopping: stop after this many scores without improvement (default 5)")
    p.add_argument("--checkpoint-every", type=int, default=1000, help="SVI: write DIR/checkpoint.pt every K steps (default 1000)")
    p.add_argument(
        "--resume", action="store_true", help="continue an interrupted run from DIR/checkpoint.pt (SVI) and DIR/ais_checkpoint.pt (--evidence ais) if present"
    )
    p.add_argument("--num-warmup", type=int, default=500, help="NUTS/HMC warmup draws per chain (default 500)")
    p.add_argument("--num-samples", type=int, default=500, help="NUTS/HMC kept draws per chain (default 500)")
    p.add_argument("--num-chains", type=int, default=2, help="NUTS/HMC chains (default 2)")
    p.add_argument(
        "--init",
        choices=["network", "prior", "svi"],
        default="network",
        help="NUTS/HMC start: the network's own init, a prior draw, or a quick mean-field SVI fit",
    )
    p.add_argument(
        "--evidence",
        default="",
        help="extra log-evidence estimates on the training data, comma-separated: ais (annealed "
        "importance sampling from the prior; any inference) | iw (importance-weighted bound; svi guides with a density)",
    )
    p.add_argument("--ais-steps", type=int, default=500, help="AIS temperatures (default 500; 64 particles in 4 runs)")
    p.add_argument("--iw-k", type=int, default=100, help="guide draws K per importance-weighted bound (default 100, 10 repeats)")
    p.add_argument("--device", default=None, help="cpu (default) or cuda: where a BNN is fitted")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder; bnn_zoo.load(DIR) reads the fitted posterior back")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser(
        "compare",
        help="put result folders side by side: one table (evidence, LOO, WAIC, test metrics) and plots",
        description="Read DIR/posterior.nc, metrics.json and predictions.nc from each result folder; print one table and "
        "write OUT/comparison.csv, comparison.md and plots: compare.png (az.plot_compare), reliability.png, "
        "bands.png (1-D regression), evidence.png and trace/rank/energy plots of MCMC runs. LOO runs whose "
        "Pareto k exceed ArviZ's threshold (0.7 at most) are flagged.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="result folders written by `bnn-zoo fit --out` or `bnn-zoo demo` (runs/demo/svi ...)")
    p.add_argument("--out", default="comparison", help="folder for the table and plots (default: comparison)")

    sub.add_parser(
        "list", help="datasets, models, priors, likelihoods, guides and inference methods available", description="List what can be named on the command line."
    )

    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return {"demo": _demo, "fit": _fit, "compare": _compare, "list": _list}[args.command](args)
    except BnnZooError as exc:
        print(f"bnn-zoo: error: {exc}", file=sys.stderr)
        return 2


def _demo(args):
    from bnn_zoo.experiments.demo import demo

    demo(args.out, args.svi_steps, args.num_warmup, args.num_samples, args.num_chains, args.seed, progress=not args.quiet)
    return 0


def _fit(args):
    from bnn_zoo import data, likelihoods
    from bnn_zoo.baselines import TypeII
    from bnn_zoo.bnn import BNN
    from bnn_zoo.experiments import specs
    from bnn_zoo.experiments.demo import print_table
    from bnn_zoo.experiments.run import run
    from bnn_zoo.inference import HMC, NUTS, SGMCMC, SVI, Laplace, fit

    # Everything named on the command line is resolved before the data is read or anything trains.
    net_spec, prior = args.model, specs.build_prior(args.prior)
    likelihood = specs.build_likelihood(args.likelihood) if args.likelihood else None
    guide, guide_options = specs.guide_options(args.guide)
    specs.parse(net_spec, specs.MODELS)
    if args.steps is not None and args.epochs is not None:
        raise BnnZooError("give --steps or --epochs, not both")
    evidence = [e for e in args.evidence.split(",") if e]
    if set(evidence) - {"ais", "iw"}:
        raise BnnZooError(f"--evidence takes ais and/or iw, got {args.evidence!r}")
    inference, inference_options = specs.parse(args.inference, specs.INFERENCE)
    if inference not in ("gp", "laplace") and inference_options:
        raise BnnZooError(f"--inference {inference} takes no options; set them with their own flags (see bnn-zoo fit --help)")
    if "iw" in evidence and (inference != "svi" or guide == "dropout"):
        raise BnnZooError("--evidence iw needs a guide with a density (svi, not the dropout guide); use --evidence ais")
    if evidence and inference == "gp":
        raise BnnZooError("a GP's evidence is its own: log_marginal_likelihood (regression) or its ELBO (classification); drop --evidence")
    dataset = data.load(args.data, seed=args.seed)
    if likelihood is None:
        args.likelihood = specs.default_likelihood(dataset.task)
        likelihood = specs.build_likelihood(args.likelihood)
    if likelihood.task != dataset.task:
        raise BnnZooError(
            f"--likelihood {args.likelihood} is for {likelihood.task} but {dataset.name} is a {dataset.task} dataset; "
            f"use {specs.default_likelihood(dataset.task)}"
        )
    classes = len(dataset.info["vocab"]) if dataset.task == "language-model" else int(dataset.y_train.max()) + 1
    out_features = classes if isinstance(likelihood, likelihoods.Categorical) else 1
    out = Path(args.out)
    progress = not args.quiet
    if not args.resume:  # a fresh run must not pick up an old run's state
        for stale in (out / "checkpoint.pt", out / "ais_checkpoint.pt"):
            stale.unlink(missing_ok=True)
    if inference == "gp":
        model = specs.build_gp(args.inference, inference_options, net_spec, prior, likelihood, classes, dataset)
        method = TypeII(steps=args.steps or 300, lr=args.lr or 0.05, seed=args.seed, progress=progress)
    else:
        model = BNN(specs.build_net(net_spec, dataset, out_features), prior, likelihood)
    if inference == "svi":
        n, batch = dataset.x_train.shape[0], args.batch_size or dataset.x_train.shape[0]
        steps = args.epochs * math.ceil(n / batch) if args.epochs is not None else (args.steps or 3000)
        checkpoint = out / "checkpoint.pt"
        method = SVI(
            guide=guide,
            guide_options=guide_options,
            steps=steps,
            lr=args.lr or 0.01,
            batch_size=args.batch_size,
            num_particles=args.num_particles,
            seed=args.seed,
            checkpoint=checkpoint,
            checkpoint_every=args.checkpoint_every,
            kl_weight=args.kl_weight,
            kl_warmup=args.kl_warmup,
            objective=args.objective,
            alpha=args.alpha,
            validation=args.validation,
            eval_every=args.eval_every,
            patience=args.patience,
            progress=progress,
        )
    elif inference in ("sgld", "sghmc", "cyclical"):
        method = SGMCMC(
            kind=inference,
            step_size=args.lr or 1e-4,
            batch_size=args.batch_size,
            num_samples=args.num_samples,
            burn_in=args.num_warmup * 10,
            num_chains=args.num_chains,
            seed=args.seed,
            progress=progress,
        )
    elif inference == "laplace":
        method = Laplace(
            **specs.laplace_options(args.inference, inference_options),
            map_steps=args.steps or 2000,
            lr=args.lr or 0.01,
            batch_size=args.batch_size,
            seed=args.seed,
            progress=progress,
        )
    elif inference in ("nuts", "hmc"):
        init = None if args.init == "network" else args.init
        if init == "svi":
            x, y = dataset.train
            init = fit(model, x, y, SVI(steps=2000, lr=0.02, lr_decay=0.1, num_particles=4, seed=args.seed, progress=progress))
        kind = NUTS if inference == "nuts" else HMC
        method = kind(num_warmup=args.num_warmup, num_samples=args.num_samples, num_chains=args.num_chains, init=init, seed=args.seed, progress=progress)
    result = run(inference, dataset, model, method, out, evidence=evidence, ais_steps=args.ais_steps, iw_k=args.iw_k, device=args.device)
    if inference == "svi" and (out / "checkpoint.pt").exists():
        (out / "checkpoint.pt").unlink()  # the finished result supersedes it
    print_table([result], title=f"{dataset.name}: {args.model} by {args.inference}; files in {out}")
    return 0


def _compare(args):
    from bnn_zoo.evaluation.compare import report
    from bnn_zoo.experiments.demo import print_comparison

    table = report(args.dirs, args.out)
    print_comparison(table, title=f"{len(table)} runs; table and plots in {args.out}")
    return 0


def _list(args):
    from rich.console import Console
    from rich.table import Table

    from bnn_zoo import guides
    from bnn_zoo.data import DATASETS
    from bnn_zoo.experiments import specs

    table = Table(title="bnn-zoo: what can be named")
    table.add_column("kind")
    table.add_column("name")
    table.add_column("what it is")
    sections = [
        ("dataset", DATASETS),
        ("model", specs.MODELS),
        ("prior", specs.PRIORS),
        ("likelihood", specs.LIKELIHOODS),
        ("guide", guides.DESCRIPTIONS),
        ("inference", specs.INFERENCE),
    ]
    for kind, entries in sections:
        for name, text in entries.items():
            table.add_row(kind, name, text)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
