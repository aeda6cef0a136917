"""The command line: the demo end to end at reduced size, fit on a UCI-format folder, list, --help."""

import json

import pytest
from test_bad_input import _uci_folder

from bnn_zoo.cli import main
from bnn_zoo.io import load_inference_data


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo at reduced size, once for the module: (output folder, printed table)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["demo", "--out", str(out), "--svi-steps", "200", "--num-warmup", "30", "--num-samples", "30", "--quiet"]) == 0
    return out, printed.getvalue()


def test_demo_end_to_end_at_reduced_size(demo_run):
    out, table = demo_run
    for header in ("test RMSE", "test LL", "ELBO", "LOO elpd", "time s", "max R-hat", "min bulk ESS"):
        assert header in table
    assert (out / "demo.png").stat().st_size > 10_000
    for run, method in (("svi", "svi"), ("nuts", "nuts")):
        idata = load_inference_data(out / run / "posterior.nc")
        assert idata.posterior.attrs["method"] == method
        metrics = json.loads((out / run / "metrics.json").read_text())
        assert metrics["rmse"] > 0 and metrics["runtime_s"] > 0 and "loo_elpd" in metrics and "loo_se" in metrics
    assert "elbo" in json.loads((out / "svi" / "metrics.json").read_text())
    nuts = json.loads((out / "nuts" / "metrics.json").read_text())
    assert {"max_rhat", "min_ess_bulk", "divergences"} <= set(nuts) and nuts["settings"]["init"] == "posterior"
    assert (out / "svi" / "loss.png").exists() and (out / "nuts" / "energy.png").exists()
    gp = json.loads((out / "gp" / "metrics.json").read_text())
    assert gp["settings"]["method"] == "gp" and gp["log_marginal_likelihood"] < 0 and gp["rmse"] < 10
    assert "log ML" in table


def test_compare_on_the_demo_results_prints_the_table_and_writes_the_plots(demo_run, tmp_path, capsys):
    out, _ = demo_run
    runs = [str(out / run) for run in ("svi", "nuts", "gp")]
    with pytest.warns(UserWarning, match="Pareto"):  # ArviZ's own warning: mean-field draws are too narrow for PSIS here
        assert main(["compare", *runs, "--out", str(tmp_path / "cmp")]) == 0
    table = capsys.readouterr().out
    for header in ("architecture", "inference", "ELBO", "GP log ML", "LOO elpd", "WAIC", "weight", "test RMSE", "time s"):
        assert header in table
    assert "svi (mean-field)" in table and "gp (rbf)" in table and "LOO is unreliable" in table
    for name in ("compare.png", "reliability.png", "bands.png", "evidence.png", "nuts_trace.png", "nuts_rank.png", "comparison.csv", "comparison.md"):
        assert (tmp_path / "cmp" / name).stat().st_size > 100, name
    csv = (tmp_path / "cmp" / "comparison.csv").read_text().splitlines()
    assert len(csv) == 4 and csv[0].startswith("run,data,architecture")


@pytest.mark.parametrize(
    "inference",
    [
        "svi",
        "svi:mean-field:local_reparam=true",
        "svi:matrix-normal:rank=2",
        "svi:flow:transform=spline;scope=layer",
        "svi:dropout:p=0.05,0.1;masks=example",
        "nuts",
        "hmc",
        "laplace",
        "sgld",
    ],
)
def test_fit_on_a_uci_folder_writes_results_in_original_units(tmp_path, inference):
    _uci_folder(tmp_path / "uci", rows=40)
    out = tmp_path / "out"
    inference, _, guide = inference.partition(":")
    extra = {
        "svi": ["--steps", "150", "--batch-size", "16", "--guide", guide or "mean-field"],
        "laplace": ["--steps", "150"],
        "sgld": ["--lr", "1e-3", "--batch-size", "16", "--num-warmup", "5", "--num-samples", "20", "--num-chains", "1"],
    }.get(inference, ["--num-warmup", "20", "--num-samples", "20", "--num-chains", "1"])
    argv = [
        "fit",
        "--data",
        f"uci:{tmp_path / 'uci'}:split=0",
        "--model",
        "mlp:hidden=8;activation=relu",
        "--inference",
        inference,
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("rmse", "test_log_likelihood", "loo_elpd", "loo_se", "runtime_s", "settings"):
        assert key in metrics
    assert metrics["settings"]["method"] == {"sgld": "sgmcmc"}.get(inference, inference)
    assert metrics["data"] == "uci:uci" and metrics["n_train"] == 36
    assert ("elbo" in metrics and "elbo_se" in metrics) == (inference == "svi" and not guide.startswith("dropout"))  # no density
    assert ("rmse_at_mean" in metrics) == (inference == "svi" and not guide.startswith("flow"))  # flows have no closed-form mean
    assert ("evidence_laplace" in metrics) == (inference == "laplace")
    idata = load_inference_data(out / "posterior.nc")
    assert idata.posterior["layers.0.weight"].shape[-2:] == (8, 2)
    assert not (out / "checkpoint.pt").exists()  # superseded by the result
    if guide:
        name, _, options = guide.partition(":")
        assert metrics["settings"]["guide"] == name
        assert metrics["settings"]["guide_options"] == dict(kv.split("=") for kv in options.split(";")) | ({"rank": 2} if "rank" in options else {})


def test_early_stopping_from_the_command_line(tmp_path):
    out = tmp_path / "es"
    assert (
        main(
            [
                "fit",
                "--data",
                "toy-cubic",
                "--inference",
                "svi",
                "--steps",
                "4000",
                "--lr",
                "0.05",
                "--validation",
                "0.25",
                "--eval-every",
                "20",
                "--patience",
                "2",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps_run"] == metrics["best_step"] + 40 < 4000 and (metrics["n_train"], metrics["n_validation"]) == (15, 5)
    assert metrics["settings"]["validation"] == 0.25


def test_linear_model_on_toy_data_and_epochs(tmp_path):
    out = tmp_path / "lin"
    assert (
        main(
            [
                "fit",
                "--data",
                "toy-cubic",
                "--model",
                "linear",
                "--inference",
                "svi",
                "--epochs",
                "30",
                "--batch-size",
                "5",
                "--prior",
                "normal:scale=2",
                "--likelihood",
                "gaussian:scale=0.5",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["settings"]["steps"] == 30 * 4 and "Normal(scale=2.0)" in metrics["prior"]
    assert (out / "predictive.png").exists()


def test_list_and_help(capsys):
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    for name in ("toy-cubic", "uci:PATH", "mlp", "linear", "fanin", "gaussian", "mean-field", "matrix-normal", "flow", "nuts", "hmc"):
        assert name in listing
    for command in (["--help"], ["demo", "--help"], ["fit", "--help"], ["list", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(command)
        assert exc.value.code == 0
        assert "usage: bnn-zoo" in capsys.readouterr().out
