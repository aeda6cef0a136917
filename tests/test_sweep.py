"""Sweeps: cells from a grid, zip and nested selection; local and Ray execution give one table; a
killed sweep resumes without re-running finished cells; failures are recorded; the UCI protocol."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from test_bad_input import _uci_folder

import bnn_zoo as bz
from bnn_zoo.cli import main
from bnn_zoo.evaluation import reference
from bnn_zoo.experiments import config, protocols, table
from bnn_zoo.experiments.sweep import Sweep, override, run_sweep, sweep_status

# a cell of about a second: 30 SVI steps of a 1-4-1 network on the toy data, no plots
BASE = {
    "model": {"class_path": "MLP", "init_args": {"hidden": [4]}},
    "inference": {"class_path": "SVI", "init_args": {"steps": 30, "num_draws": 50}},
    "evaluation": {"elbo_samples": 50, "plots": False},
}
# lockstep fits need a fixed noise
FIXED_NOISE = {"likelihood": {"class_path": "Gaussian", "init_args": {"scale": 7.0}}}  # about 0.3 sd of y
SMALL = {"base": BASE | FIXED_NOISE, "grid": {"seed": [0, 1], "guide": ["mean-field", "matrix-normal"]}}


def test_grid_zip_and_dotted_overrides_make_the_cells():
    base = {**BASE, "guide": "mean-field"}  # a kind by its registered name
    sweep = Sweep.from_dict(
        {"base": base, "grid": {"seed": "range(3)", "guide.init_scale": [0.1, 0.2]}, "zip": {"inference.steps": [5, 6]}}
    )
    cells = [sweep.cell(o) for o in sweep.outer()]
    assert len(cells) == 3 * 2 * 2 and len({c.key for c in cells}) == 12
    assert cells[0].config["guide"] == {
        "class_path": "bnn_zoo.experiments.config.MeanField",
        "init_args": {"init_scale": 0.1},
    }
    assert cells[0].labels == {
        "dataset": "toy-cubic",
        "model": "mlp",
        "inference": "svi-mean-field(init_scale=0.1)",
        "seed": 0,
    } | {
        "guide.init_scale": 0.1,
        "inference.steps": 5,
    }
    config = {"inference": {"class_path": "SVI", "init_args": {"steps": 3}}}
    override(config, "inference", "nuts")  # a kind by name: that class with its defaults
    override(config, "inference.num_chains", 1)
    assert config["inference"] == {"class_path": "bnn_zoo.experiments.config.NUTS", "init_args": {"num_chains": 1}}


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"grid": {}}, "a mapping with a base"),
        ({"base": {}, "grids": {}}, "unknown sweep key(s) grids"),
        ({"base": {}, "zip": {"seed": [1, 2], "guide": ["dropout"]}}, "equal lengths"),
        ({"base": {}, "grid": {"seed": "range(a)"}}, "write range(N)"),
        ({"base": {}, "grid": {"seed": []}}, "non-empty list"),
        ({"base": {}, "select": {"grid": {"seed": [1]}, "mode": "best"}}, "max or min"),
        # a whole-field axis after one inside it would reset it: 20 "splits" that are all split 0
        (
            {"base": {}, "grid": {"data.split": [0, 1], "data": ["toy-cubic", "toy-sine"]}},
            "the earlier axis 'data.split' would be lost",
        ),
        ({"base": {}, "grid": {"guide.p": [0.1]}, "zip": {"guide": ["dropout"]}}, "list 'guide' first"),
    ],
)
def test_bad_sweep_files_are_refused_with_one_line(spec, message):
    with pytest.raises(bz.BnnZooError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Sweep.from_dict(spec)


def test_a_bad_axis_fails_before_any_cell_runs(tmp_path):
    sweep = Sweep.from_dict({"base": BASE, "grid": {"inference.kl_wieght": [0.5]}})
    with pytest.raises(bz.BnnZooError, match="kl_wieght"):
        run_sweep(sweep, tmp_path / "s", show_progress=False)
    assert not (tmp_path / "s" / "cells").exists()


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    summary = run_sweep(Sweep.from_dict(SMALL), out, workers=1, show_progress=False)
    return out, summary


def _table(out):
    frame = table.aggregate(table.collect(out), ["inference"])
    # the batch size is how, not what
    return frame.drop(columns=["runtime_s", "runtime_s_se", "lockstep", "lockstep_se"])


def test_a_small_sweep_runs_locally_and_on_ray_to_the_same_table(local_sweep, tmp_path):
    import ray  # in the test extra: this test must run, not skip

    out, summary = local_sweep
    assert summary == {"done": 4, "skipped": 0, "failed": []}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert (
            run_sweep(Sweep.from_dict(SMALL), tmp_path / "ray", workers=2, use_ray=True, show_progress=False)["done"]
            == 4
        )
    finally:
        ray.shutdown()
    local, remote = _table(out), _table(tmp_path / "ray")
    assert list(local["inference"]) == ["svi-matrix-normal", "svi-mean-field"] and (local["n"] == 2).all()
    pd.testing.assert_frame_equal(local, remote, rtol=1e-5)  # Ray workers run one thread, the local run two


def test_finished_cells_are_skipped_and_the_table_is_written(local_sweep, capsys):
    out, _ = local_sweep
    before = {p: p.stat().st_mtime_ns for p in out.glob("cells/*/status.json")}
    assert run_sweep(Sweep.from_dict(SMALL), out, show_progress=False) == {"done": 0, "skipped": 4, "failed": []}
    assert {p: p.stat().st_mtime_ns for p in out.glob("cells/*/status.json")} == before
    assert main(["table", str(out), "--by", "inference", "--out", str(out / "t")]) == 0
    assert "| svi-mean-field | 2 |" in capsys.readouterr().out
    csv = pd.read_csv(out / "t.csv")
    assert {"rmse", "rmse_se", "elbo", "elbo_se", "loo_elpd", "n"} <= set(csv.columns)
    frame = table.collect(out)
    lockstep = frame.set_index(
        "inference"
    ).lockstep  # the mean-field seeds shared one batch; matrix-normal fits ran alone
    assert (lockstep["svi-mean-field"] == 2).all() and lockstep["svi-matrix-normal"].isna().all()
    assert list((out / "lockstep").iterdir()) == []  # the batch's checkpoint went once its cells were saved
    mf = frame[frame.inference == "svi-mean-field"].rmse
    assert csv.set_index("inference").loc["svi-mean-field", "rmse_se"] == pytest.approx(mf.std() / 2**0.5)


def test_a_sweep_folder_refuses_another_sweep(local_sweep):
    out, _ = local_sweep
    with pytest.raises(bz.BnnZooError, match="holds a different sweep"):
        run_sweep(Sweep.from_dict({**SMALL, "grid": {"seed": [5]}}), out, show_progress=False)


@pytest.mark.parametrize(
    "grid",
    [{"seed": [1, 1]}, {"inference": ["nuts"], "inference.max_hours": [1, 2]}],
    ids=["a repeated value", "max_hours"],
)
def test_a_sweep_whose_cells_are_one_run_is_refused_before_any_runs(tmp_path, grid):
    """Two cells with one config are one folder: refused, naming them, rather than run into each other.
    max_hours is not part of a cell (a sweep run again with another limit resumes), so it is no axis."""
    with pytest.raises(bz.BnnZooError, match=r"are the same run: an axis repeats a value, or varies only max_hours"):
        run_sweep(Sweep.from_dict({"base": BASE | FIXED_NOISE, "grid": grid}), tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()  # nothing written: the fixed sweep may use the folder


@pytest.mark.parametrize(
    "stop",
    # SIGTERM's checkpoint-and-exit path is tested on a fit in tests/test_cli.py; the sweep's, slow
    [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
    ids=["kill -9", "kill"],
)
def test_a_killed_sweep_resumes_without_re_running_finished_cells(tmp_path, stop):
    CELLS = 10  # enough that two workers are still busy when the driver is killed (2-4 done by then here)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "grid": {"seed": list(range(CELLS))}}))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    # one cell at a time in each of two worker processes
    command = [
        sys.executable,
        "-m",
        "bnn_zoo.cli",
        "sweep",
        str(spec),
        "--out",
        str(out),
        "--quiet",
        "--no-lockstep",
        "--workers",
        "2",
    ]
    driver = subprocess.Popen(command, env=env)
    deadline = time.time() + 120
    while len(sweep_status(out)["done"]) < 2 if (out / "sweep.yaml").exists() else True:
        assert time.time() < deadline and driver.poll() is None, "the sweep did not get going"
        time.sleep(0.2)
    driver.send_signal(stop)
    driver.wait(timeout=10)  # SIGTERM too stops the driver at once, not after its running (or queued) cells
    deadline = time.time() + 10  # the workers notice their driver is gone and end, their cells unfinished
    while sweep_status(out)["running"] and time.time() < deadline:
        time.sleep(0.2)
    states = sweep_status(out)
    finished = {c["key"] for c in states["done"]}
    # the killed cells are pending again, no worker lives on
    assert 2 <= len(finished) < CELLS and not states["running"]
    assert len(table.collect(out)) == len(finished)  # the killed cell's half-written folder does not reach the table
    stamps = {k: (out / "cells" / k / "status.json").stat().st_mtime_ns for k in finished}
    summary = run_sweep(Sweep.from_dict(yaml.safe_load(spec.read_text())), out, show_progress=False, lockstep=False)
    assert summary["skipped"] == len(finished) and summary["done"] == CELLS - len(finished)
    assert {k: (out / "cells" / k / "status.json").stat().st_mtime_ns for k in finished} == stamps
    assert len(sweep_status(out)["done"]) == CELLS


def test_a_sweep_stopped_while_scoring_a_lockstep_batch_scores_its_saved_fits(tmp_path, monkeypatch):
    """A lockstep batch saves every fit before scoring any: a sweep stopped after the first cell's
    scoring fits nothing again on its next run, and every metric equals an uninterrupted sweep's."""
    from bnn_zoo.experiments.run import Prepared
    from bnn_zoo.inference import lockstep

    spec = {"base": BASE | FIXED_NOISE, "grid": {"seed": [0, 1]}}  # two mean-field fits, one lockstep batch
    assert run_sweep(Sweep.from_dict(spec), tmp_path / "whole", show_progress=False)["done"] == 2
    evaluate, scored = Prepared.evaluate, []

    def stop_at_the_second(run, posterior):
        scored.append(run)
        if len(scored) == 2:
            raise KeyboardInterrupt  # as Ctrl-C, or a kill, while the second cell is scored
        return evaluate(run, posterior)

    monkeypatch.setattr(Prepared, "evaluate", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(Sweep.from_dict(spec), tmp_path / "cut", show_progress=False)
    # the first cell's went once it was scored
    assert len(list((tmp_path / "cut").glob("cells/*/fitted/state.pt"))) == 1
    monkeypatch.setattr(Prepared, "evaluate", evaluate)
    monkeypatch.setattr(lockstep, "fit_lockstep", lambda *args, **kwargs: pytest.fail("a saved fit was fitted again"))
    assert run_sweep(Sweep.from_dict(spec), tmp_path / "cut", show_progress=False) == {
        "done": 1,
        "skipped": 1,
        "failed": [],
    }
    assert not list((tmp_path / "cut").glob("cells/*/fitted"))
    columns = ["seed", "rmse", "elbo", "loo_elpd", "test_log_likelihood"]
    whole, cut = (
        table.collect(tmp_path / d).sort_values("seed")[columns].reset_index(drop=True) for d in ("whole", "cut")
    )
    pd.testing.assert_frame_equal(whole, cut, check_exact=True)


def test_a_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    missing = {"class_path": "UCI", "init_args": {"path": str(tmp_path / "nowhere")}}
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "grid": {"data": ["toy-cubic", missing]}}))
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    printed = capsys.readouterr().out
    assert "1 cells run, 0 already done, 1 failed" in printed and "does not exist" in printed
    assert main(["sweep", str(tmp_path / "out"), "--status"]) == 0
    status = capsys.readouterr().out
    assert status.startswith("1 done, 0 running, 1 failed, 0 pending") and "UCI folder" in status


def test_nested_selection_refits_each_cell_with_its_best_inner_values(tmp_path):
    _uci_folder(tmp_path / "uci", rows=60)
    (tmp_path / "uci" / "index_train_1.txt").write_text("\n".join(map(str, range(10, 60))) + "\n")
    (tmp_path / "uci" / "index_test_1.txt").write_text("\n".join(map(str, range(10))) + "\n")
    base = {
        **BASE,
        "data": {"class_path": "UCI", "init_args": {"path": str(tmp_path / "uci")}},
        "likelihood": "gaussian",
    }
    select = {
        "grid": {"likelihood.scale": [0.05, 1.0]},
        "set": {"data.part": "validation"},
        "metric": "test_log_likelihood",
    }
    sweep = Sweep.from_dict({"base": base, "grid": {"data.split": [0, 1]}, "select": select})
    summary = run_sweep(sweep, tmp_path / "out", show_progress=False)
    assert summary == {"done": 6, "skipped": 0, "failed": []}
    frame = table.collect(tmp_path / "out", stage="select")
    assert len(frame) == 4 and set(frame["data.part"]) == {"validation"}
    final = table.collect(tmp_path / "out")
    for _, row in final.iterrows():
        cell = json.loads((tmp_path / "out" / "cells" / row["key"] / "cell.json").read_text())
        inner = frame[frame["data.split"] == row["data.split"]]
        best = inner.loc[inner.test_log_likelihood.idxmax()]
        assert (
            row["selected:likelihood.scale"] == best["likelihood.scale"]
            and row["selection_score"] == best.test_log_likelihood
        )
        assert cell["labels"]["data.split"] == row["data.split"]
        n_train = json.loads((tmp_path / "out" / "cells" / row["key"] / "metrics.json").read_text())["n_train"]
        assert n_train == (50 if row["data.split"] == 1 else 56)  # the whole training split of the refit


def test_reference_tables_in_long_and_wide_form(tmp_path):
    ours = pd.DataFrame({"dataset": ["a", "b"], "n": [2, 2], "rmse": [1.0, 2.0], "rmse_se": [0.1, 0.2]})
    (tmp_path / "wide.csv").write_text(
        "# published\ndataset,rmse,rmse_se,test_ll,test_ll_se\na,0.8,0.1,-1,0.1\nb,2.0,0.0,-2,0.1\n"
    )
    (tmp_path / "long.csv").write_text("dataset,metric,mean,se\na,rmse,0.8,0.1\nb,rmse,2.0,0.0\n")
    for name in ("wide.csv", "long.csv"):
        merged = table.with_reference(ours, tmp_path / name, ["dataset"])
        # a zero se: no ratio
        assert merged["rmse_diff_se"].iloc[0] == pytest.approx(2.0) and pd.isna(merged["rmse_diff_se"].iloc[1])
    assert "published rmse" in table.markdown(merged, ["dataset"])
    with pytest.raises(bz.BnnZooError, match="reference table .* does not exist"):
        table.with_reference(ours, tmp_path / "nowhere.csv", ["dataset"])
    (tmp_path / "bad.csv").write_text("dataset,rmse\n")
    with pytest.raises(bz.BnnZooError, match="M, M_se"):
        table.with_reference(ours, tmp_path / "bad.csv", ["dataset"])


def test_uci_gal_protocol_on_a_folder_writes_its_table(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    _uci_folder(tmp_path / "data" / "tiny", rows=80)
    folder = tmp_path / "data" / "tiny"
    (folder / "index_train_0.txt").write_text("\n".join(map(str, range(60))) + "\n")
    (folder / "index_test_0.txt").write_text("\n".join(map(str, range(60, 80))) + "\n")
    for name, text in {
        "dropout_rates": "0.05\n0.1\n",
        "tau_values": "0.5\n1.0\n",
        "n_hidden": "8\n",
        "n_epochs": "1\n",
        "n_splits": "1\n",
    }.items():
        (folder / f"{name}.txt").write_text(text)
    sweep = protocols.uci_gal(folder)
    assert sweep.base["inference"]["init_args"]["epochs"] == 100 and len(sweep.inner({"data.split": 0})) == 4
    argv = [
        "reproduce",
        "uci-gal",
        "--data",
        str(tmp_path / "data"),
        "--epochs",
        "3",
        "--mc-passes",
        "100",
        "--out",
        str(tmp_path / "out"),
        "--quiet",
    ]
    assert main(argv) == 0
    assert "| tiny | 1 |" in capsys.readouterr().out
    csv = pd.read_csv(tmp_path / "out" / "table.csv")
    assert list(csv.columns[:5]) == ["dataset", "rmse", "rmse_se", "test_ll", "test_ll_se"] and csv.dataset[0] == "tiny"
    final = table.collect(tmp_path / "out" / "tiny")
    metrics = json.loads((tmp_path / "out" / "tiny" / "cells" / final.key[0] / "metrics.json").read_text())
    tau = final["selected:likelihood.precision"][0]
    assert metrics["likelihood"] == f"Gaussian(scale={1 / tau**0.5})"  # tau and sigma in the targets' units
    # 60 rows: one batch of 128 per epoch
    assert metrics["settings"]["steps"] == 3 * 1 and metrics["settings"]["lr"] == 1e-3
    scored = [json.loads(p.read_text()) for p in (tmp_path / "out" / "tiny" / "cells").glob("*/metrics.json")]
    # the 4 selection runs skip it
    assert len(scored) == 5 and sum("loo_elpd" in m for m in scored) == 1 and "loo_elpd" in metrics
    with pytest.raises(bz.BnnZooError, match="asked for"):
        protocols.uci_gal(folder, splits=[3])


def _tiny_uci(root, rows=60):
    (root / "data").mkdir()
    folder = root / "data" / "tiny"
    _uci_folder(folder, rows=rows)
    (folder / "index_train_0.txt").write_text("\n".join(map(str, range(rows - 15))) + "\n")
    (folder / "index_test_0.txt").write_text("\n".join(map(str, range(rows - 15, rows))) + "\n")
    (folder / "n_hidden.txt").write_text("8\n")
    (folder / "n_splits.txt").write_text("1\n")
    return folder


def test_deep_ensembles_protocol_writes_the_uci_table_with_the_papers_settings(tmp_path, capsys):
    folder = _tiny_uci(tmp_path)
    argv = ["reproduce", "deep-ensembles", "--data", str(folder), "--epochs", "2", "--out", str(tmp_path / "out")]
    assert main([*argv, "--quiet"]) == 0
    csv = pd.read_csv(tmp_path / "out" / "table.csv")
    assert list(csv.columns[:5]) == ["dataset", "rmse", "rmse_se", "test_ll", "test_ll_se"] and csv.dataset[0] == "tiny"
    final = table.collect(tmp_path / "out" / "tiny")
    metrics = json.loads((tmp_path / "out" / "tiny" / "cells" / final.key[0] / "metrics.json").read_text())
    settings = metrics["settings"]
    assert (settings["method"], settings["members"], settings["batch_size"], settings["steps"]) == (
        "ensemble",
        5,
        None,
        2,
    )
    assert settings["adversarial"] == 0.01 and settings["use_prior"] is False
    assert metrics["likelihood"].startswith("Heteroscedastic") and metrics["model"].startswith("MLP(in_features=2")


def test_a_gap_split_holds_out_the_middle_third_of_a_column(tmp_path):
    folder = _tiny_uci(tmp_path)
    data = bz.data.load_uci(folder, gap=1)
    lo, hi, train = data.x_test[:, 1].min(), data.x_test[:, 1].max(), data.x_train[:, 1]
    assert len(data.x_test) == 20 and (train < lo).sum() == 20 and (train > hi).sum() == 20
    with pytest.raises(bz.BnnZooError, match="gap 2 is not one of them"):
        bz.data.load_uci(folder, gap=2)
    sweep = protocols.uci_gap(folder)
    assert sweep.grid == {"data.gap": [0, 1]} and len(sweep.zip["inference"]) == len(protocols.ZOO_METHODS)


def test_execution_options_refuse_nonsense(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "whatever.yaml", "--workers", "0"])
    with pytest.raises(SystemExit):
        main(["reproduce", "uci-gal", "--data", ".", "--epochs", "-1", "--out", "o"])
    assert "invalid positive integer value: '-1'" in capsys.readouterr().err


def test_table_scores_each_cell_against_its_reference_cell(tmp_path, capsys):
    """Each seed's SVI cell is scored against the ChEES cell of its own seed, which matches nothing else;
    the references are a sweep of their own, as examples/sweeps/uci-reference.yaml runs them. The model
    is linear (a Gaussian posterior) and each chain 2,000 draws long, so the largest R-hat of f over the
    test points (1.001-1.002 over four seeds) sits far below the 1.01 a reference must pass; R-hat - 1
    of mixed chains shrinks as 1 / draws, and at 250 draws on an MLP it reaches the threshold."""
    chees = {
        "class_path": "ChEES",
        "init_args": {"num_chains": 8, "num_warmup": 100, "num_samples": 2000, "backend": "torch"},
    }
    linear = BASE | FIXED_NOISE | {"model": {"class_path": "Linear"}}
    folders = [str(tmp_path / name) for name in ("guides", "reference")]
    for inference, folder in zip((BASE["inference"], chees), folders):
        spec = {"base": linear | {"inference": inference}, "grid": {"seed": [0, 1]}}
        run_sweep(Sweep.from_dict(spec), folder, workers=1, show_progress=False)
    cells = table.with_posterior_reference(pd.concat([table.collect(f) for f in folders]), "chees")
    assert cells["reference_converged"].sum() == 2
    for _, svi in cells[cells.inference == "svi-mean-field"].iterrows():
        truth = cells[(cells.inference == "chees") & (cells.seed == svi.seed)].folder.item()
        expected = reference.scores(*(table_predictions(f) for f in (svi.folder, truth)))
        assert svi.w2 == pytest.approx(expected["w2"]) and svi.variance_ratio == pytest.approx(
            expected["variance_ratio"]
        )
    assert (cells[cells.inference == "chees"].w2 == 0).all()
    assert (
        main(["table", *folders, "--by", "inference", "--reference-method", "chees", "--out", str(tmp_path / "t")]) == 0
    )
    assert "w2" in capsys.readouterr().out
    assert main(["table", *folders, "--reference-method", "nuts"]) == 2
    assert (
        "no finished cell has inference 'nuts'; the cells' inference labels are chees, svi-mean-field"
        in capsys.readouterr().err
    )


def table_predictions(folder):
    from bnn_zoo.evaluation.compare import load_predictions

    return load_predictions(os.path.join(folder, "predictions.nc"))


def test_digits_shift_protocol_writes_curves_and_ood_scores(tmp_path, monkeypatch, capsys):
    quick = [
        (config.node(config.Ensemble, members=2, steps=30), None),
        (config.node(config.SWAG, steps=30, snapshots=2, collect_every=2), None),
    ]
    monkeypatch.setattr(protocols, "ZOO_METHODS", quick)
    assert main(["reproduce", "digits-shift", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    curves = pd.read_csv(tmp_path / "out" / "shift.csv")
    assert set(curves.inference) == {"ensemble", "swag"} and set(curves["transform"]) == {"rotate", "noise"}
    assert curves[curves["transform"] == "rotate"].intensity.tolist()[:3] == [0, 15, 30]
    ood = pd.read_csv(tmp_path / "out" / "ood.csv")
    assert ood.ood_auroc_entropy.between(0, 1).all() and (tmp_path / "out" / "shift.png").stat().st_size > 0


def test_the_heartbeat_counts_the_cells_a_resumed_sweep_skips(tmp_path, monkeypatch):
    """With the bar hidden (output not a terminal), the line every half minute still counts done cells."""
    from bnn_zoo.experiments import sweep as sweep_module

    lines = []
    monkeypatch.setattr(sweep_module, "announce", lines.append)
    spec = {"base": BASE | FIXED_NOISE, "grid": {"seed": [0, 1]}}
    run_sweep(Sweep.from_dict(spec), tmp_path, workers=1, show_progress=False)
    assert lines[-1] == "running sweep cells: 2 of 2 done"
    run_sweep(Sweep.from_dict(spec), tmp_path, workers=1, show_progress=False)
    assert lines[-1] == "running sweep cells: 2 of 2 done"


def test_the_standard_error_over_cells_is_not_overwritten_by_a_fits_own_monte_carlo_error():
    cells = pd.DataFrame({"inference": ["svi"] * 3, "elbo": [-10.0, -20.0, -30.0], "elbo_se": [0.5, 0.5, 0.5]})
    row = table.aggregate(cells, ["inference"]).iloc[0]
    # the ELBO's spread over the three cells: sd 10, so se 10 / sqrt(3); not the fits' 0.5
    assert row["elbo"] == -20.0 and row["elbo_se"] == pytest.approx(10 / 3**0.5)
