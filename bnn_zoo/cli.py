"""The ``bnn-zoo`` command: demo, fit, compare, list."""

from __future__ import annotations

import argparse
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

    sub.add_parser(
        "fit",
        add_help=False,
        help="fit one model to one dataset and write the saved posterior, metrics.json, config.yaml and plots (bnn-zoo fit --help)",
    )

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

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["fit"]:  # the run's options come from its typed config (jsonargparse), not argparse
        return _guarded(_fit, argv[1:])
    args = parser.parse_args(argv)
    return _guarded({"demo": _demo, "compare": _compare, "list": _list}[args.command], args)


def _guarded(command, args) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return command(args)
    except BnnZooError as exc:
        print(f"bnn-zoo: error: {exc}", file=sys.stderr)
        return 2
    except argparse.ArgumentError as exc:  # jsonargparse's, from a bad option value
        from bnn_zoo.experiments.config import parse_error_message

        print(f"bnn-zoo: error: {parse_error_message(exc)} (see bnn-zoo fit --help)", file=sys.stderr)
        return 2


def _demo(args):
    from bnn_zoo.experiments.demo import demo

    demo(args.out, args.svi_steps, args.num_warmup, args.num_samples, args.num_chains, args.seed, progress=not args.quiet)
    return 0


def fit_parser():
    """``bnn-zoo fit``: a RunConfig's fields as options (``--data.path``, ``--guide.p``), from YAML with
    ``--config``, plus where the result goes."""
    from jsonargparse import ActionConfigFile

    from bnn_zoo.experiments import config

    parser = config.parser()
    parser.description = (
        "Fit a BNN (or the GP baseline) and write DIR/posterior.nc (ArviZ InferenceData), DIR/posterior.json and DIR/state.pt "
        "(the saved posterior: bnn_zoo.load(DIR)), DIR/metrics.json, DIR/config.yaml (re-run it with --config) and plots. "
        "Choices of a kind are named by their registered names (bnn-zoo list): --data uci --data.path PATH, --inference nuts, "
        "--guide dropout --guide.p 0.05, --model mypkg.nets:MyNet --model.width 64 (a torch.nn.Module taking in_features, "
        "out_features first). Inputs and targets are standardised with training statistics; rmse and test_log_likelihood "
        "are in original units."
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a run config in YAML (a result folder's config.yaml); later options override it")
    parser.add_argument("--out", type=str, required=True, help="output folder; bnn_zoo.load(DIR) reads the fitted posterior back")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run from DIR/checkpoint.pt (SVI, SG-MCMC) and ais_checkpoint.pt")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _fit(argv):
    from bnn_zoo.experiments import config
    from bnn_zoo.experiments.demo import print_table
    from bnn_zoo.experiments.run import execute

    parser = fit_parser()
    args = parser.parse_args(config.resolve_names(argv))
    run_config = config.from_namespace(parser, args)
    out = Path(args.out)
    result = execute(run_config, out, progress=not args.quiet, resume=args.resume)
    print_table([result], title=f"{result.metrics['data']}: {result.name}; files in {out}")
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

    from bnn_zoo.experiments.config import REGISTRY, describe

    table = Table(title="bnn-zoo: what can be named (options of each: bnn-zoo fit --KIND.help NAME)")
    for column in ("kind", "name", "what it is"):
        table.add_column(column)
    for kind, entries in REGISTRY.items():
        for name, cls in entries.items():
            table.add_row(kind, name, describe(cls))
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
