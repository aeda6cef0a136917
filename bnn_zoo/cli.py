"""The ``bnn-zoo`` command: demo, fit, compare, list."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from pathlib import Path

from bnn_zoo.errors import BnnZooError
from bnn_zoo.version import __version__


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, naming the fix, instead of argparse's usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    parser = command_parser()
    if argv is None:  # as a command: `bnn-zoo ... | head` ends quietly, as other tools do
        # OpenMP threads spinning at barriers stall when another job holds a core (docs/benchmarks.md,
        # "Beside another job"); read when torch is first imported, which has not happened yet
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, _terminate)
        warnings.showwarning = _one_line_warning
        from bnn_zoo.memory import keep_freed_memory

        keep_freed_memory()  # this process is ours: steps reuse faulted-in pages (bnn_zoo/memory.py)
        if not sys.stderr.isatty() and "--quiet" not in sys.argv:
            from bnn_zoo.io import start_heartbeat

            start_heartbeat(float(os.environ.get("BNN_ZOO_HEARTBEAT_S", 30)))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["fit"]:  # the run's options come from its typed config (jsonargparse), not argparse
        return _guarded(_fit, argv[1:])
    args = parser.parse_args(argv)
    commands = {
        "demo": _demo,
        "compare": _compare,
        "list": _list,
        "data": _data,
        "sweep": _sweep,
        "table": _table,
        "reproduce": _reproduce,
        "reference": _reference,
    }
    return _guarded(commands[args.command], args)


def command_parser() -> _Parser:
    """Every command's options but ``fit``'s, whose come from the typed run config (:func:`fit_parser`)."""
    parser = _Parser(
        prog="bnn-zoo",
        description="Bayesian neural networks on Pyro: fit one model by SVI guides or NUTS/HMC, compare in ArviZ.",
    )
    parser.add_argument("--version", action="version", version=f"bnn-zoo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _demo_command(sub)
    sub.add_parser(
        "fit",
        add_help=False,
        help="fit one model to one dataset and write the saved posterior, metrics.json, config.yaml and plots "
        "(bnn-zoo fit --help)",
    )
    _compare_command(sub)
    _sweep_command(sub)
    _table_command(sub)
    _reproduce_command(sub)
    _reference_command(sub)
    _data_command(sub)
    sub.add_parser(
        "list",
        help="datasets, models, priors, likelihoods, guides and inference methods available",
        description="List what can be named on the command line.",
    )
    return parser


def _demo_command(sub) -> None:
    """``bnn-zoo demo``'s options."""
    p = sub.add_parser(
        "demo",
        help="toy regression by mean-field and dropout SVI, Laplace and NUTS side by side, with a GP baseline "
        "(the main job)",
        description="Heek's toy regression (N=20, y = x^3 + N(0, 3^2)), a 1-50-1 tanh BNN (fan-in prior, noise sd 3) "
        "fitted by mean-field SVI, the dropout guide (p learned), Laplace and NUTS (initialised from the SVI fit), "
        "next to a GPyTorch GP (RBF kernel, type-II ML) and the Laplace evidence of a linear model; prints one table, "
        "writes DIR/<run>/posterior.nc, metrics.json, predictions.nc and plots, and DIR/demo.png with every predictive "
        "band.",
    )
    p.add_argument("--out", default="runs/demo", help="output folder (default: %(default)s)")
    p.add_argument("--svi-steps", type=int, default=3000, help="SVI steps (default %(default)s)")
    p.add_argument("--num-warmup", type=int, default=300, help="NUTS warmup draws per chain (default %(default)s)")
    p.add_argument("--num-samples", type=int, default=300, help="NUTS kept draws per chain (default %(default)s)")
    p.add_argument(
        "--num-chains",
        type=int,
        default=4,
        help="NUTS chains (default %(default)s, what a reference needs: W2 and var ratio are marked * against fewer "
        "or an unconverged NUTS)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace the runs already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _compare_command(sub) -> None:
    """``bnn-zoo compare``'s options."""
    p = sub.add_parser(
        "compare",
        help="put result folders side by side: one table (evidence, LOO, WAIC, test metrics) and plots",
        description="Read DIR/posterior.nc, metrics.json and predictions.nc from each result folder; print one table "
        "and write OUT/comparison.csv, comparison.md and plots: compare.png (az.plot_compare), reliability.png, "
        "bands.png (1-D regression), evidence.png and trace/rank/energy plots of MCMC runs. Runs are ranked by "
        "LOO only where every run's LOO is reliable (Pareto k within ArviZ's threshold), by test log-likelihood "
        "otherwise (the ranked_by column).",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="result folders written by `bnn-zoo fit --out` or `bnn-zoo demo` (runs/demo/svi ...)",
    )
    p.add_argument("--out", default="comparison", help="folder for the table and plots (default: %(default)s)")
    p.add_argument(
        "--reference",
        metavar="DIR",
        help="a converged MCMC run of the same model and data: adds each run's distance from it (regression: w2, "
        "variance_ratio; "
        "classification: agreement, total_variation)",
    )
    p.add_argument(
        "--reference-unconverged",
        action="store_true",
        help="score against a --reference that did not converge; every row then says why in reference_unconverged",
    )


def _sweep_command(sub) -> None:
    """``bnn-zoo sweep``'s options."""
    p = sub.add_parser(
        "sweep",
        help="run every cell of a sweep file (grid, zip, nested selection) locally or on Ray; resumable",
        description="Run a sweep file: a base run config and axes over its fields (grid: every combination; zip: in "
        "step; "
        "select: a nested protocol that picks values per cell on a validation part). Each cell is a run keyed by the "
        "hash "
        "of its config, written to DIR/cells/KEY/ (result files, cell.json, status.json). Finished cells are skipped, "
        "so "
        "re-running a killed sweep loses at most the cells that were running; a failing cell records its error and the "
        "sweep goes on. bnn-zoo sweep DIR --status says what is done, running, failed and pending.",
    )
    p.add_argument("target", metavar="FILE|DIR", help="a sweep file (YAML) to run, or with --status a sweep folder")
    p.add_argument("--out", help="the sweep's folder (default: sweeps/NAME-of-the-file)")
    p.add_argument(
        "--trust",
        action="append",
        default=[],
        metavar="MODULE:CLASS",
        help="a class of your own the sweep file may name (your network); a file names only bnn-zoo's otherwise",
    )
    p.add_argument(
        "--status",
        action="store_true",
        help="say which cells of the sweep folder are done, running, failed and pending",
    )
    _execution_options(p)


def _table_command(sub) -> None:
    """``bnn-zoo table``'s options."""
    p = sub.add_parser(
        "table",
        help="a sweep's results: mean and standard error over splits and seeds of every metric, as markdown and CSV",
        description="Aggregate the finished cells of a sweep folder: for each group of --by labels, the number of "
        "cells and "
        "every metric's mean and standard error (sd / sqrt(n)); writes OUT.csv (all metrics) and OUT.md (the main "
        "ones). "
        "With --reference, published numbers side by side and the difference in published standard errors.",
    )
    p.add_argument("dirs", nargs="+", metavar="SWEEPDIR", help="sweep folders (their cells are pooled)")
    p.add_argument(
        "--by", default="dataset,inference", help="labels to group by, comma-separated (default %(default)s)"
    )
    p.add_argument(
        "--reference", help="a CSV of published numbers: dataset, metric, mean, se (or dataset, M, M_se, ...)"
    )
    p.add_argument(
        "--reference-method",
        metavar="INFERENCE",
        help="score every cell against the converged cell of this inference label with the same data, model and seed "
        "(e.g. chees): w2 and variance_ratio, or agreement and total_variation",
    )
    p.add_argument("--out", help="where to write OUT.csv and OUT.md (default: SWEEPDIR/table)")


def _reproduce_command(sub) -> None:
    """``bnn-zoo reproduce``'s options."""
    p = sub.add_parser(
        "reproduce",
        help="run a published protocol (uci-gal: Gal & Ghahramani's MC dropout on UCI; deep-ensembles: "
        "Lakshminarayanan et al.'s deep ensembles on UCI; uci-gap: Foong et al.'s gap splits, every method; "
        "digits-shift: every method under shift and OOD digits) and write its tables",
        description="deep-ensembles: per split, 5 networks of one hidden layer of n_hidden ReLU units predicting a "
        "mean and a variance, maximum likelihood by Adam (lr 0.01, batch 100, 40 epochs) with adversarial examples at "
        "0.01 x each input's range; the prediction is their mixture. uci-gap: for each input column (--splits picks "
        "columns), the rows sorted by it and the middle third held out, every method of the zoo's UCI table; "
        "DIR/table.csv overall and DIR/gaps.csv per column. digits-shift (embedded data): every method trained on "
        "the 10 digits and scored on rotated and noised test images (DIR/shift.csv, DIR/shift.png), and trained on "
        "0-4 and scored on detecting 5-9 (DIR/ood.csv). uci-gal: per split, every (p, tau) of the folder's grids "
        "trained on the first 80% of the training split and "
        "scored on the last 20%, the best refitted on the whole split and tested with T = 10,000 MC dropout passes; "
        "one hidden "
        "layer of n_hidden ReLU units, Adam 1e-3, batch 128, the Keras weight decay with l = 1e-2; tau in original "
        "units. "
        "Writes DIR/table.csv (dataset, rmse, rmse_se, test_ll, test_ll_se), DIR/table.md and every cell's folder (a "
        "re-run resumes).",
    )
    p.add_argument("protocol", choices=["uci-gal", "deep-ensembles", "uci-gap", "digits-shift"], help="the protocol")
    p.add_argument(
        "--data", help="the UCI protocols: a UCI folder (holding data.txt and the published grids) or a folder of them"
    )
    p.add_argument(
        "--epochs",
        type=_positive,
        help="training epochs (uci-gal: default 100 x n_epochs.txt, the budget that reproduces the published table; "
        f"deep-ensembles: default {PROTOCOL_DEFAULTS['deep_ensembles_epochs']})",
    )
    p.add_argument(
        "--adversarial",
        type=float,
        help="deep-ensembles: adversarial epsilon as a fraction of each input's range (default "
        f"{PROTOCOL_DEFAULTS['adversarial']}; 0: none)",
    )
    p.add_argument("--splits", help="splits to run (uci-gap: input columns), e.g. 0-19 or 0,3,5 (default all)")
    p.add_argument(
        "--mc-passes",
        type=_positive,
        help=f"uci-gal: MC dropout passes T per prediction (default {PROTOCOL_DEFAULTS['mc_passes']:,})",
    )
    p.add_argument(
        "--device", help="uci-gal: where the fits are stepped, cpu (default) or cuda (scoring stays on the CPU)"
    )
    p.add_argument("--out", required=True, help="output folder")
    _execution_options(p)


def _reference_command(sub) -> None:
    """``bnn-zoo reference``'s options."""
    p = sub.add_parser(
        "reference",
        help="reference posteriors for a UCI table: every split sampled by ChEES or NUTS on XLA, all splits as one "
        "program, each split's folder with its convergence verdict",
        description="The zoo's UCI model (one hidden layer of 50 ReLU units, fan-in prior, learned Gaussian noise) on "
        "every split of a UCI folder (or of each folder in a folder of them), sampled on XLA, every split of a "
        "dataset in one program (on a GPU all chains in lockstep, on the CPU a split per core at a time; splits with "
        "fewer rows padded and masked). Each split is scored and written to OUT/DATASET/cells/KEY/ as a sweep cell "
        "(metrics.json says whether it converged: R-hat of f below 1.01 on 4+ chains, bulk ESS of f above 400); "
        "OUT/references.csv lists the verdicts. Resumable: each split's draws are saved as it finishes, and a run "
        "again skips what is done. `bnn-zoo table SWEEPDIR "
        "--reference-method chees` scores other runs against them.",
    )
    p.add_argument("--data", required=True, help="a UCI folder (holding data.txt) or a folder of them")
    p.add_argument("--splits", help="splits to run, e.g. 0-19 or 0,3,5 (default all)")
    p.add_argument(
        "--sampler",
        default="chees",
        help="a registered reference sampler that runs on XLA: chees or nuts (default %(default)s)",
    )
    p.add_argument("--num-chains", type=_positive, default=32, help="chains per split (default %(default)s)")
    p.add_argument(
        "--num-warmup", type=_positive, default=500, help="warm-up iterations per chain (default %(default)s)"
    )
    p.add_argument("--num-samples", type=_positive, default=250, help="kept draws per chain (default %(default)s)")
    p.add_argument("--device", help="where the XLA program runs: cpu (default) or cuda (pip install -e '.[cuda]')")
    p.add_argument(
        "--max-hours",
        type=_hours,
        help="stop once a split is projected past this many hours (default: no limit; on the CPU the splits run "
        "in rounds of one per core); splits finished by then are kept, and the command run again, with any "
        "limit, goes on with the rest",
    )
    p.add_argument("--out", required=True, help="output folder")
    _execution_options(p)


def _data_command(sub) -> None:
    """``bnn-zoo data``'s options."""
    p = sub.add_parser(
        "data",
        help="fetch a benchmark dataset into a folder the other commands take (needs the internet)",
        description="Fetch one of Gal's UCI regression datasets with its 20 fixed splits (5 for protein) and the "
        "published grids into OUT/NAME, checked before it is put in place; then use --data uci --data.path "
        "OUT/NAME, or --data OUT/NAME for bnn-zoo reproduce and reference.",
    )
    p.add_argument("collection", choices=["uci"], help="the collection: uci (Gal & Ghahramani's splits)")
    p.add_argument("name", help="the dataset, e.g. yacht, bostonHousing, energy (an unknown name lists them all)")
    p.add_argument("--out", default="data/uci", help="folder that receives NAME/ (default: %(default)s)")
    p.add_argument("--source", help="where the datasets' folders are (default: Gal's repository on GitHub)")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


_positive.__name__ = "positive integer"  # what argparse names in its error


def _hours(text: str) -> float | None:
    value = None if text.lower() == "none" else float(text)
    if value is not None and not 0 < value < float("inf"):
        raise ValueError(text)
    return value


_hours.__name__ = "number of hours"


def _execution_options(p) -> None:
    """How a sweep's cells run: where, how many at once, batched or not."""
    p.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="cells run at once: local processes, or Ray CPUs (default %(default)s)",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="run the cells as Ray tasks on a local Ray (pip install -e '.[distributed]')",
    )
    p.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="run the cells on an existing Ray cluster; DIR must be on a filesystem its nodes share",
    )
    p.add_argument(
        "--no-lockstep",
        action="store_true",
        help="fit every cell on its own (default: cells that differ only in seed, split, p, tau, prior or learning "
        "rate are fitted together as one batched computation where the method allows it: SVI with the dropout or "
        "mean-field guide and a fixed noise, and NUTS and ChEES on XLA; bnn_zoo.inference.lockstep.why_not)",
    )
    p.add_argument(
        "--max-cells",
        type=_positive,
        help="refuse a sweep of more cells than this before making any (default %(default)s)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _guarded(command, args) -> int:
    from bnn_zoo.io import announce, release_folders

    try:
        return _reported(command, args)
    finally:
        announce("")  # the heartbeat stays quiet while the process exits
        release_folders()


def _reported(command, args) -> int:
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
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        print(f"bnn-zoo: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except Exception as exc:  # a failure bnn-zoo did not foresee: one line here, the traceback in a file
        import tempfile
        import traceback

        with tempfile.NamedTemporaryFile("w", prefix="bnn-zoo-traceback-", suffix=".txt", delete=False) as fh:
            fh.write(traceback.format_exc())
        first = (str(exc).splitlines() or [""])[0][:200]
        print(
            f"bnn-zoo: error: unexpected {type(exc).__name__}: {first} (a bug in bnn-zoo; the traceback is in "
            f"{fh.name})",
            file=sys.stderr,
        )
        return 1


class _Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`), raised where it lands: a fit unwinds as on Ctrl-C, saving its checkpoint and
    removing its temporary files (a SystemExit would pass the handlers that catch KeyboardInterrupt)."""


def _terminate(signum, frame):
    raise _Terminated


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """A warning on the command line reads as one line, not a source location and code excerpt."""
    print(f"bnn-zoo: warning: {message}", file=sys.stderr)


def _demo(args):
    from bnn_zoo.experiments.demo import RUNS, demo
    from bnn_zoo.io import output_folder

    for run in RUNS:  # checked before anything is fitted
        output_folder(Path(args.out) / run, overwrite=args.overwrite, resume=None)
    demo(
        args.out, args.svi_steps, args.num_warmup, args.num_samples, args.num_chains, args.seed, progress=not args.quiet
    )
    return 0


def fit_parser():
    """``bnn-zoo fit``: a RunConfig's fields as options (``--data.path``, ``--guide.p``), from YAML with
    ``--config``, plus where the result goes."""
    from jsonargparse import ActionConfigFile

    from bnn_zoo.experiments import config

    parser = config.parser()
    parser.description = (
        "Fit a BNN (or the GP baseline) and write DIR/posterior.nc (ArviZ InferenceData), DIR/posterior.json and "
        "DIR/state.pt "
        "(the saved posterior: bnn_zoo.load(DIR)), DIR/metrics.json, DIR/config.yaml (re-run it with --config) and "
        "plots. Choices of a kind are named by their registered names (bnn-zoo list): --data uci --data.path PATH, "
        "--inference nuts, "
        "--guide dropout --guide.p 0.05, --model mypkg.nets:MyNet --model.width 64 (a torch.nn.Module taking "
        "in_features, out_features first). The fit is bnn_zoo.fit's: it standardises inputs (and a regression's "
        "targets) with training statistics, and every number it writes is in the data's units."
    )
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="a run config in YAML (a result folder's config.yaml); later options override it",
    )
    parser.add_argument(
        "--out", type=str, required=True, help="output folder; bnn_zoo.load(DIR) reads the fitted posterior back"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run from DIR/checkpoint.pt (every method but Laplace and the GP; NUTS and "
        "HMC keep their finished chains) and ais_checkpoint.pt, ending as an uninterrupted run ends",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in DIR (its files are deleted first; never a file bnn-zoo did not write)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _fit(argv):
    from bnn_zoo.experiments import config
    from bnn_zoo.experiments.demo import print_table
    from bnn_zoo.experiments.run import execute
    from bnn_zoo.io import check_path, discard_if_unused, output_folder

    printing = [a for a in argv if a.startswith(("--print_config", "--print-config"))]
    if printing:  # checked and resolved like a run, then printed: never a config that fit would refuse
        argv = [a for a in argv if a not in printing] + ([] if "--out" in argv else ["--out", "-"])
    parser = fit_parser()
    args = parser.parse_args(config.resolve_names(argv))
    run_config = config.from_argv(parser, argv)
    if printing:
        return _print_config(run_config)
    if args.resume and args.overwrite:
        raise BnnZooError("--resume continues the run in DIR and --overwrite replaces it; pass one of them")
    fresh = not check_path(args.out).exists()
    out = output_folder(args.out, args.overwrite, args.resume)
    try:
        result = execute(run_config, out, progress=not args.quiet, resume=args.resume)
    except BnnZooError:
        if fresh:  # refused before anything was written: leave no trace
            discard_if_unused(out)
        raise
    print_table([result], title=f"{result.metrics['data']}: {result.name}; files in {out}")
    return 0


def _print_config(run_config) -> int:
    """The resolved config a run would record in config.yaml, after every check a fit makes before training."""
    import yaml

    from bnn_zoo.experiments.config import to_dict
    from bnn_zoo.experiments.run import prepare

    run = prepare(run_config, progress=False)
    if hasattr(run.method, "build_guide"):
        run.method.build_guide(run.model)
    print(yaml.safe_dump(to_dict(run.config), sort_keys=False), end="")
    return 0


def _compare(args):
    from bnn_zoo.evaluation.compare import report
    from bnn_zoo.experiments.demo import print_comparison
    from bnn_zoo.io import writable_folder

    table = report(
        args.dirs, writable_folder(args.out), reference=args.reference, allow_unconverged=args.reference_unconverged
    )
    print_comparison(table, title=f"{len(table)} runs; table and plots in {args.out}")
    return 0


def _sweep(args):
    from bnn_zoo.experiments.sweep import Sweep, run_sweep, sweep_status

    if args.status:
        states = sweep_status(args.target)
        print(", ".join(f"{len(cells)} {state}" for state, cells in states.items()))
        for state in ("running", "failed", "pending"):
            for cell in states[state]:
                labels = ", ".join(f"{k}={v}" for k, v in cell.get("labels", {}).items())
                print(f"{state:8} {cell['key']}  {labels}  {cell.get('error', cell.get('note', ''))}")
        return 0
    from bnn_zoo.io import writable_folder

    out = writable_folder(args.out or Path("sweeps") / Path(args.target).stem)
    sweep = Sweep.from_file(args.target, args.trust)
    summary = run_sweep(
        sweep,
        out,
        args.workers,
        args.ray,
        args.ray_address,
        show_progress=not args.quiet,
        lockstep=not args.no_lockstep,
        max_cells=args.max_cells,
    )
    return _report(summary, out)


def _report(summary, out) -> int:
    print(
        f"{summary['done']} cells run, {summary['skipped']} already done, {len(summary['failed'])} failed; results in "
        f"{out}"
    )
    for failure in summary["failed"]:
        print(f"failed: {failure}")
    return 1 if summary["failed"] else 0


def _table(args):
    import pandas as pd

    from bnn_zoo.experiments import table
    from bnn_zoo.io import writable_folder

    by = [b.strip() for b in args.by.split(",") if b.strip()]
    if not by:
        raise BnnZooError(f"--by {args.by!r} names no label; give labels like dataset,inference")
    out = args.out or Path(args.dirs[0]) / "table"
    writable_folder(Path(out).parent, "--out")
    if args.reference_method is not None and not args.reference_method.strip():
        raise BnnZooError("--reference-method '' names no method; give the reference cells' inference, e.g. nuts")
    cells = pd.concat([table.collect(d) for d in args.dirs])
    if args.reference_method:
        cells = table.with_posterior_reference(cells, args.reference_method)
    frame = table.aggregate(cells, by)
    if args.reference:
        frame = table.with_reference(frame, args.reference, by)
    csv, md = table.write(frame, by, out)
    print(md.read_text(), end="")
    print(f"written: {csv}, {md}")
    return 0


def _reproduce(args):
    import pandas as pd

    from bnn_zoo.experiments import protocols, table
    from bnn_zoo.experiments.sweep import check_resources, run_sweep
    from bnn_zoo.io import writable_folder

    _check_protocol_options(args)
    out = writable_folder(args.out)
    if args.protocol == "digits-shift":
        return _digits_shift(args, out)
    if args.data is None:
        raise BnnZooError(f"reproduce {args.protocol} needs --data: a UCI folder or a folder of them")
    splits = protocols.parse_splits(args.splits)
    folders = protocols.uci_folders(args.data)
    # all checked before any runs
    if args.protocol == "deep-ensembles":
        sweeps = [protocols.deep_ensembles(f, args.epochs, splits, adversarial=args.adversarial) for f in folders]
    elif args.protocol == "uci-gap":
        sweeps = [protocols.uci_gap(f, splits) for f in folders]
    else:
        sweeps = [protocols.uci_gal(f, args.epochs, splits, args.mc_passes, args.device) for f in folders]
    for sweep in sweeps:
        check_resources(sweep)
    summary = {"done": 0, "skipped": 0, "failed": []}
    for folder, sweep in zip(folders, sweeps):
        part = run_sweep(
            sweep,
            out / folder.name,
            args.workers,
            args.ray,
            args.ray_address,
            not args.quiet,
            lockstep=not args.no_lockstep,
            max_cells=args.max_cells,
        )
        summary = {k: summary[k] + part[k] for k in summary}
    frame = pd.concat([table.collect(out / f.name) for f in folders])
    if args.protocol == "uci-gap":
        per_column = ["dataset", "inference", "data.gap"]
        table.write(table.aggregate(frame, per_column), per_column, out / "gaps")
        _, md = table.write(table.aggregate(frame, ["dataset", "inference"]), ["dataset", "inference"], out / "table")
        print(md.read_text(), end="")
    else:
        print(table.write_uci(table.aggregate(frame, ["dataset"]), out / "table"), end="")
    return _report(summary, out)


def _reference(args):
    import pandas as pd

    from bnn_zoo.experiments import protocols
    from bnn_zoo.experiments.sweep import check_resources, run_sweep, sweep_status
    from bnn_zoo.inference.budget import TimeLimitExceeded
    from bnn_zoo.io import atomic_write, read_json_mapping, writable_folder

    out = writable_folder(args.out)
    folders, splits = protocols.uci_folders(args.data), protocols.parse_splits(args.splits)
    settings = (args.sampler, args.num_chains, args.num_warmup, args.num_samples, args.device, args.max_hours)
    sweeps = [protocols.reference(f, splits, *settings) for f in folders]  # all checked before any runs
    for sweep in sweeps:
        check_resources(sweep)
    summary = {"done": 0, "skipped": 0, "failed": []}
    for folder, sweep in zip(folders, sweeps):
        execution = (args.workers, args.ray, args.ray_address, not args.quiet)
        part = run_sweep(sweep, out / folder.name, *execution, lockstep=not args.no_lockstep, max_cells=args.max_cells)
        summary = {k: summary[k] + part[k] for k in summary}
    rows = []
    for folder in folders:
        for cell in sweep_status(out / folder.name)["done"]:
            metrics = read_json_mapping(out / folder.name / "cells" / cell["key"] / "metrics.json") or {}
            split = cell["labels"].get("data.split")
            rows.append({"dataset": folder.name, "split": split} | {k: metrics.get(k) for k in VERDICT})
    verdicts = pd.DataFrame(rows, columns=["dataset", "split", *VERDICT]).sort_values(["dataset", "split"])
    atomic_write(out / "references.csv", lambda tmp: verdicts.to_csv(tmp, index=False))
    if rows:
        print(verdicts.drop(columns="reference_note").to_string(index=False))
    code = _report(summary, out)
    if any(TimeLimitExceeded.__name__ in failure for failure in summary["failed"]):
        print("to go on: the same command with a higher --max-hours (or none); the splits already sampled are kept")
    return code


VERDICT = ("reference_converged", "max_rhat_test_f", "min_ess_bulk_test_f", "runtime_s", "reference_note")


PROTOCOL_OPTIONS = {  # the reproduce options each protocol reads; a given option it does not read is refused
    "uci-gal": {"data", "epochs", "splits", "mc_passes", "device"},
    "deep-ensembles": {"data", "epochs", "splits", "adversarial"},
    "uci-gap": {"data", "splits"},
    "digits-shift": set(),
}
# the protocols' own defaults (bnn_zoo.experiments.protocols; a test holds them equal), here so that the help
# does not import torch
PROTOCOL_DEFAULTS = {"adversarial": 0.01, "mc_passes": 10_000, "deep_ensembles_epochs": 40}
FILLED = ("adversarial", "mc_passes")  # filled in the arguments when not given


def _check_protocol_options(args) -> None:
    """Refuse an option the protocol ignores, and a bad --adversarial, before any cell runs; fill the defaults."""
    for name in sorted(set().union(*PROTOCOL_OPTIONS.values()) - PROTOCOL_OPTIONS[args.protocol]):
        if getattr(args, name) is not None:
            users = " and ".join(p for p, options in PROTOCOL_OPTIONS.items() if name in options)
            raise BnnZooError(f"--{name.replace('_', '-')} is an option of {users}, not {args.protocol}; drop it")
    for name in FILLED:
        setattr(args, name, PROTOCOL_DEFAULTS[name] if getattr(args, name) is None else getattr(args, name))
    if not 0 <= args.adversarial < 1:  # NaN fails too
        raise BnnZooError(
            f"--adversarial is a fraction of each input's range in [0, 1) (0: no adversarial training), got "
            f"{args.adversarial}"
        )


def _digits_shift(args, out):
    import pandas as pd

    from bnn_zoo.evaluation import plots
    from bnn_zoo.experiments import protocols, table
    from bnn_zoo.experiments.sweep import run_sweep
    from bnn_zoo.io import atomic_write

    execution = (args.workers, args.ray, args.ray_address, not args.quiet)
    summary = run_sweep(
        protocols.digits_shift(), out, *execution, lockstep=not args.no_lockstep, max_cells=args.max_cells
    )
    frame = table.collect(out)
    rows = protocols.shift_curves(frame)
    atomic_write(out / "shift.csv", lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))
    plots.shift_curves(rows, out / "shift.png")
    ood = table.aggregate(frame[frame["data.classes"] == 5], ["inference"])
    _, md = table.write(ood, ["inference"], out / "ood")
    print(f"written: {out / 'shift.csv'}, {out / 'shift.png'}, {md}")
    return _report(summary, out)


def _data(args):
    from bnn_zoo.data.fetch import SOURCE, fetch_uci

    folder = fetch_uci(args.name, args.out, args.source or SOURCE)
    print(f"{args.name}: {folder} (use --data uci --data.path {folder})")
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
