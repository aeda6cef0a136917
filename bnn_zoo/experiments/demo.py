"""The main job: Heek's toy regression, one 1-50-1 tanh BNN fitted by mean-field and dropout SVI, by
Laplace and by NUTS side by side, with a GP baseline; each approximation scored against the NUTS
posterior of the same network (W2 and variance ratio), and the Laplace evidence choosing between that
network and a linear model.

NUTS fits in minutes because the fan-in scaled prior keeps the output's prior sd O(1) (N(0, 1) on every
weight makes the posterior a thin ridge) and Pyro's potential is jit-compiled
(docs/benchmarks-speed.md, benchmarks/nuts_toy.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from bnn_zoo.baselines import GP, TypeII
from bnn_zoo.bnn import BNN
from bnn_zoo.data import toy_cubic
from bnn_zoo.evaluation import plots, reference
from bnn_zoo.experiments.run import run
from bnn_zoo.inference import NUTS, SVI, Laplace
from bnn_zoo.likelihoods import Gaussian
from bnn_zoo.models import MLP
from bnn_zoo.priors import FanInNormal
from bnn_zoo.scaling import AS_GIVEN, DATA_UNITS

RUNS = ("svi", "dropout", "laplace", "nuts", "gp", "linear")  # the demo's result folders under its output folder


def demo(
    out_dir="runs/demo",
    svi_steps=3000,
    num_warmup=300,
    num_samples=300,
    num_chains=4,
    seed=0,
    progress=True,
    console=None,
):
    """Fit, score and print the demo; the Results of its runs, in RUNS's order (the linear model's last)."""
    out = Path(out_dir)
    data = toy_cubic(seed=seed)
    # The noise sd is the generating one, 3 in the data's units: with 20 points a learned noise lets
    # both SVI and NUTS explain the cubic away as noise (docs/guide/defaults.md).
    model = BNN(MLP(1, [50], 1, activation="tanh"), FanInNormal(), Gaussian(data.info["noise_scale"]))
    svi = run(
        "svi-mean-field",
        data,
        model,
        SVI(steps=svi_steps, lr=0.02, lr_decay=0.1, num_particles=4, seed=seed, progress=progress),
        out / "svi",
    )
    dropout = run(
        "svi-dropout",
        data,
        model,
        SVI(guide="dropout", steps=svi_steps, lr=0.02, seed=seed, progress=progress),
        out / "dropout",
    )
    laplace = run("laplace", data, model, Laplace(seed=seed, progress=progress), out / "laplace")
    nuts = run(
        "nuts",
        data,
        model,
        NUTS(
            num_warmup=num_warmup,
            num_samples=num_samples,
            num_chains=num_chains,
            init=svi.posterior,
            seed=seed,
            progress=progress,
        ),
        out / "nuts",
    )
    # The GP baseline learns its noise by type II (a GP with 3 hyperparameters does not explain the cubic away).
    gp = run("gp-rbf", data, GP("rbf"), TypeII(steps=300, lr=0.05, seed=seed, progress=progress), out / "gp")
    linear = run(
        "laplace-linear",
        data,
        BNN(MLP(1, [], 1), FanInNormal(), model.likelihood),
        Laplace(seed=seed, progress=progress),
        out / "linear",
    )
    results = [svi, dropout, laplace, nuts, gp]
    plots.predictive_bands([r.predictions for r in results], out / "demo.png")
    unconverged = (
        {} if nuts.metrics.get("reference_converged") else {"reference_unconverged": nuts.metrics["reference_note"]}
    )
    for r in (svi, dropout, laplace):  # how far each approximation is from the same network's NUTS posterior
        r.metrics.update(reference.scores(r.predictions, nuts.predictions), **unconverged)
    note = _split_by_training_range(results, data)
    print_table(
        results,
        console,
        title=f"{data.name}: one 1-50-1 tanh BNN by four methods, and a GP; N={data.x_train.shape[0]}; files in {out}",
    )
    say = (console or _console()).print
    say(note)
    say(_evidence_note(laplace, linear))
    _say_how_to_read(say, out, unconverged)
    return [*results, linear]


def _say_how_to_read(say, out: Path, unconverged: dict) -> None:
    """What W2 and the variance ratio mean, and the command that compares the demo's folders."""
    say(
        "W2 and var ratio: each approximation's predictive distribution against the NUTS posterior of the same "
        "network (0 and 1 are NUTS itself): what bnn-zoo measures that a test score alone cannot."
        + (
            f" NUTS is not a converged reference here ({unconverged['reference_unconverged']}): they are marked *."
            if unconverged
            else ""
        )
    )
    folders = " ".join(str(out / name) for name in RUNS[:-1])
    allow = " --reference-unconverged" if unconverged else ""
    say(f"compare them: bnn-zoo compare {folders} --reference {out / 'nuts'}{allow} --out {out / 'comparison'}")


def _evidence_note(network, linear) -> str:
    """One line: the Laplace (MacKay) log evidence of the network against a linear model, each under its
    declared fan-in prior, and which the data prefer."""
    a, b = network.metrics["evidence_laplace"], linear.metrics["evidence_laplace"]
    better = "the 1-50-1 tanh network" if a > b else "the linear model"
    return (
        f"Evidence (Laplace, under the declared fan-in priors): 1-50-1 tanh {a:.1f}, linear {b:.1f} nats: the data "
        f"prefer {better} by {abs(a - b):.1f} nats."
    )


def _split_by_training_range(results, data) -> str:
    """Test RMSE inside the training inputs' range and beyond it (added to each run's metrics as
    rmse_in_range and rmse_beyond), and a sentence on what the overall RMSE is made of: on the toy,
    the few test inputs beyond the 20 training inputs, where y = x^3 is steepest, dominate it."""
    lo, hi = float(data.x_train.min()), float(data.x_train.max())
    x = data.x_test[:, 0]
    inside = (x >= lo) & (x <= hi)
    shares = []
    for r in results:
        err = torch.as_tensor(r.predictions["mean"].values - r.predictions["y"].values) ** 2
        r.metrics.update(rmse_in_range=err[inside].mean().sqrt().item(), rmse_beyond=err[~inside].mean().sqrt().item())
        shares.append(f"{r.name} {err[~inside].sum() / err.sum():.0%}")
    return (
        f"{int((~inside).sum())} of {len(x)} test inputs lie beyond the training inputs [{lo:.1f}, {hi:.1f}], where "
        f"y = x^3 is steepest; their share of the squared test error: {', '.join(shares)}. Beyond the data the tanh "
        "network's mean flattens (its units saturate); Laplace's linearised band and the GP's widen there, the "
        "others' barely (demo.png)."
    )


COLUMNS = [
    ("test RMSE", "rmse", "{:.3f}"),
    ("RMSE in range", "rmse_in_range", "{:.3f}"),
    ("RMSE beyond", "rmse_beyond", "{:.3f}"),
    ("test LL", "test_log_likelihood", "{:.3f}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("NLL", "nll", "{:.3f}"),
    ("ECE", "ece", "{:.3f}"),
    ("perplexity", "perplexity", "{:.2f}"),
    ("ELBO", "elbo", "{:.2f}"),
    ("IW bound", "evidence_iw", "{:.2f}"),
    ("AIS", "evidence_ais", "{:.2f}"),
    ("AIS SE", "evidence_ais_se", "{:.2f}"),
    ("Laplace", "evidence_laplace", "{:.2f}"),
    ("Laplace type-II", "evidence_laplace_type_ii", "{:.2f}"),
    ("log ML", "log_marginal_likelihood", "{:.2f}"),
    ("W2 to NUTS", "w2", "{:.3f}"),
    ("var ratio", "variance_ratio", "{:.2f}"),
    ("time s", "runtime_s", "{:.1f}"),
    ("max R-hat", "max_rhat", "{:.3f}"),
    ("min bulk ESS", "min_ess_bulk", "{:.0f}"),
    ("divergences", "divergences", "{}"),
]


def _console():
    return Console(width=max(230, Console().width))  # wide enough for the table when output is piped


def _cell(metrics: dict, key: str, fmt: str) -> str:
    """A metric as the table shows it ("-" where the run has none)."""
    if key not in metrics:
        return "-"
    mark = "*" if key in REFERENCE_KEYS and "reference_unconverged" in metrics else ""  # against an unconverged NUTS
    return fmt.format(metrics[key]) + mark


def units_note(names_and_units: list[tuple[str, str]]) -> str:
    """One line on what a regression table's numbers are in: the data's units (test LL per test point,
    evidence and LOO of all training targets), naming any run whose evidence is of standardised targets."""
    old = [name for name, units in names_and_units if units not in (DATA_UNITS, AS_GIVEN)]
    line = "every number in the data's units (test LL per test point; evidence and LOO of all the training targets)"
    return line + (f"; but the evidence and LOO of {', '.join(old)} are of standardised targets" if old else "") + "."


REFERENCE_KEYS = ("w2", "variance_ratio")


def loo_note(names_and_k: list[tuple[str, float]]) -> str | None:
    """One line for the runs whose LOO ArviZ flags (k NaN: it computed none), saying what ranks them."""
    if not names_and_k:
        return None
    runs = ", ".join(f"{name} {k:.1f}" if k == k else f"{name} (no estimate)" for name, k in names_and_k)
    return (
        f"LOO unreliable (worst Pareto k: {runs}): each training point moves these posteriors too far for "
        "importance sampling to leave it out, so they get no LOO rank or weight (see ranked by: test LL ranks every "
        "run where each has test data)"
    )


def print_table(results, console=None, title=None):
    table = Table(title=title)
    table.add_column("run")
    shown = [c for c in COLUMNS if any(c[1] in r.metrics for r in results)]
    for header, _, _ in shown:
        table.add_column(header, justify="right")
    for r in results:
        table.add_row(r.name, *(_cell(r.metrics, key, fmt) for _, key, fmt in shown))
    (console or _console()).print(table)
    notes = [f"{r.name}: stopped early ({r.metrics['stop_reason']})" for r in results if "stop_reason" in r.metrics]
    notes += [
        f"{r.name}: early stopping kept step {r.metrics['best_step']} of {r.metrics['steps_run']} run"
        for r in results
        if "best_step" in r.metrics
    ]
    for note in filter(None, notes):
        (console or _console()).print(f"[yellow]note[/yellow] {note}")
    if any("rmse" in r.metrics for r in results):
        (console or _console()).print(units_note([(r.name, r.metrics.get("units")) for r in results]))


# (header, value key, SE key or None, format): the terminal shows a subset; comparison.csv has every column.
COMPARE_COLUMNS = [
    ("run", "run", None, "{}"),
    ("architecture", "architecture", None, "{}"),
    ("inference", "inference", None, "{}"),
    ("rank", "rank", None, "{:.0f}"),
    ("ranked by", "ranked_by", None, "{}"),
    ("ELBO", "elbo", "elbo_se", "{:.2f}"),
    ("IW bound", "evidence_iw", "evidence_iw_se", "{:.2f}"),
    ("AIS", "evidence_ais", "evidence_ais_se", "{:.2f}"),
    ("Laplace", "evidence_laplace", None, "{:.2f}"),
    ("Laplace type-II", "evidence_laplace_type_ii", None, "{:.2f}"),
    ("type-II prior", "type_ii", None, "{}"),
    ("GP log ML", "log_marginal_likelihood", None, "{:.2f}"),
    ("LOO elpd", "loo_elpd", "loo_se", "{:.1f}"),
    ("max k", "max_pareto_k", None, "{:.2f}"),
    ("weight", "weight", None, "{:.2f}"),
    ("WAIC", "waic_elpd", None, "{:.1f}"),
    *[(h, k, None, f) for h, k, f in COLUMNS if k in ("rmse", "test_log_likelihood", "accuracy", "nll", "ece")],
    ("W2 to ref", "w2", None, "{:.3f}"),
    ("var / ref var", "variance_ratio", None, "{:.2f}"),
    ("agreement", "agreement", None, "{:.3f}"),
    ("TV to ref", "total_variation", None, "{:.3f}"),
    ("time s", "runtime_s", None, "{:.1f}"),
]


def print_comparison(table, console=None, title=None):
    """The comparison table (bnn_zoo.compare's DataFrame), in the terminal."""
    import pandas as pd

    console = console or Console(width=max(200, Console().width))
    out = Table(title=title)
    flagged = (
        table["loo_warning"].fillna(False).astype(bool)
        if "loo_warning" in table
        else pd.Series(False, index=table.index)
    )
    shown = [
        c
        for c in COMPARE_COLUMNS
        if c[1] in table and (c[1] not in ("loo_elpd", "max_pareto_k", "weight") or not flagged.all())
    ]
    for header, *_ in shown:
        out.add_column(
            header, justify="left" if header in ("run", "architecture", "inference") else "right", no_wrap=True
        )

    def cell(row, key, se, fmt):
        if pd.isna(row[key]) or (key == "loo_elpd" and row.get("loo_warning")):
            return "-"
        return fmt.format(row[key]) + (f" ± {fmt.format(row[se])}" if se in row and not pd.isna(row[se]) else "")

    for row in table.to_dict("records"):
        out.add_row(*(cell(row, *c[1:]) for c in shown))
    console.print(out)
    note = loo_note([(row["run"], row["max_pareto_k"]) for row in table.to_dict("records") if row.get("loo_warning")])
    if note:
        console.print(f"[yellow]note[/yellow] {note}")
    if "rmse" in table:
        console.print(units_note(list(zip(table["run"], table["units"]))))
