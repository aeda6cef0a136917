"""Every bad input fails before training with a one-line message naming the problem and the fix."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.cli import main
from bnn_zoo.data import load_uci
from bnn_zoo.io import load_inference_data, safe_torch_load


@pytest.fixture
def reg():
    return bz.BNN(bz.models.MLP(2, [3], 1), likelihood=bz.likelihoods.Gaussian(0.5))


QUICK = bz.SVI(steps=2, progress=False, num_draws=2)


def _fails(model, x, y, match):
    with pytest.raises(bz.BnnZooError, match=match) as info:
        bz.fit(model, x, y, QUICK)
    assert "\n" not in str(info.value)


def test_nan_and_inf(reg):
    x, y = torch.randn(5, 2), torch.randn(5)
    x[3, 1] = float("nan")
    _fails(reg, x, y, r"x contains NaN or inf \(1 value\(s\), first in row 3\); drop or impute")
    y[0] = float("inf")
    _fails(reg, torch.randn(5, 2), y, r"y contains NaN or inf .* row 0")


def test_shapes_dtypes_and_empty_data(reg):
    _fails(reg, torch.randn(5, 3), torch.randn(5), r"x has 3 feature\(s\) but the network expects 2")
    _fails(reg, torch.randn(5), torch.randn(5), r"x has shape \(5,\); expected \(N, 2\)")
    _fails(reg, torch.randn(5, 2), torch.randn(4), r"x has 5 rows but y has 4")
    _fails(reg, torch.randn(5, 2), torch.randn(5, 2), r"y has shape \(5, 2\) but the network has 1 output")
    _fails(reg, torch.randn(0, 2), torch.randn(0), r"x is empty")
    _fails(reg, np.array([["a", "b"]] * 5), torch.randn(5), r"x has non-numeric dtype")


def test_labels_out_of_range_and_fractional():
    clf = bz.BNN(bz.models.MLP(2, [3], 3), likelihood=bz.likelihoods.Categorical())
    _fails(clf, torch.randn(4, 2), torch.tensor([0, 1, 3, 2]), r"labels must lie in 0..2 for 3 classes, found 0..3")
    _fails(clf, torch.randn(4, 2), torch.tensor([0, -1, 1, 2]), r"found -1..2")
    _fails(clf, torch.randn(4, 2), torch.tensor([0.0, 0.5, 1.0, 2.0]), r"whole numbers")
    bern = bz.BNN(bz.models.MLP(2, [3], 1), likelihood=bz.likelihoods.Bernoulli())
    _fails(bern, torch.randn(3, 2), torch.tensor([0.0, 1.0, 2.0]), r"labels must lie in 0..1")
    wide = bz.BNN(bz.models.MLP(2, [3], 2), likelihood=bz.likelihoods.Bernoulli())
    _fails(wide, torch.randn(3, 2), torch.tensor([0, 1, 1]), r"Bernoulli needs a network with 1 output")


def test_bad_method_settings(reg):
    with pytest.raises(bz.BnnZooError, match="SVI steps must be a positive integer"):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), bz.SVI(steps=0))
    with pytest.raises(
        bz.BnnZooError, match="unknown guide 'low-rank'; available guides: dropout, flow, matrix-normal, mean-field"
    ):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), bz.SVI(guide="low-rank", progress=False))
    with pytest.raises(bz.BnnZooError, match="method must be an instance of a registered inference method"):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), "nuts")
    with pytest.raises(bz.BnnZooError, match="init must be 'network', 'prior', 'svi', a fitted Posterior"):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), bz.NUTS(init="posterior", progress=False))
    with pytest.raises(bz.BnnZooError, match="HMC chain_method must be one of 'parallel', 'sequential', got 'threads'"):
        bz.HMC(chain_method="threads")


def test_the_xla_backend_outside_the_torch_its_torchax_is_tested_with(monkeypatch):
    """Beside a torch outside xla.TORCHAX_TORCH: backend='jax' is one clear
    error, and 'auto' runs on torch with one warning saying why."""
    from bnn_zoo.inference import xla

    monkeypatch.setattr(xla.environment, "installed", lambda: True)
    monkeypatch.setattr(xla.environment.torch, "__version__", "2.99.0+cpu")
    refused = r"'jax': torch 2.99.0\+cpu is not a release .* \(2.11 to 2.15\); use backend='torch'"
    with pytest.raises(bz.BnnZooError, match=refused):
        bz.NUTS(backend="jax")
    with pytest.warns(UserWarning, match="NUTS and ChEES run on torch: torch 2.99.0"):
        assert xla.resolve_backend("auto", bz.BNN(bz.models.MLP(1, [2], 1))) == "torch"


def _uci_folder(root, rows=12, trailing="\n"):
    root.mkdir()
    data = np.random.default_rng(0).normal(size=(rows, 3))
    (root / "data.txt").write_text("\n".join(" ".join(f"{v:.4f}" for v in row) for row in data) + trailing)
    (root / "index_features.txt").write_text("0\n1\n")
    (root / "index_target.txt").write_text("2\n")
    (root / "index_train_0.txt").write_text("\n".join(map(str, range(rows - 4))) + "\n")
    (root / "index_test_0.txt").write_text("\n".join(map(str, range(rows - 4, rows))) + "\n")
    return data


def test_uci_folder_with_blank_trailing_line_loads(tmp_path):
    data = _uci_folder(tmp_path / "u", trailing="\n\n\n")
    ds = load_uci(tmp_path / "u", split=0)
    assert ds.x_train.shape == (8, 2) and ds.x_test.shape == (4, 2)
    np.testing.assert_allclose(ds.y_test.numpy(), data[8:, 2], atol=5e-5)  # written with 4 decimals


def test_uci_missing_truncated_and_corrupt_files(tmp_path):
    with pytest.raises(bz.BnnZooError, match="does not exist; pass the folder holding data.txt"):
        load_uci(tmp_path / "nowhere")
    _uci_folder(tmp_path / "u")
    with pytest.raises(bz.BnnZooError, match=r"split 3 not found .* available splits: \[0\]"):
        load_uci(tmp_path / "u", split=3)
    (tmp_path / "u" / "index_test_0.txt").unlink()
    with pytest.raises(bz.BnnZooError, match="missing file .*index_test_0.txt"):
        load_uci(tmp_path / "u")
    _uci_folder(tmp_path / "t")
    text = (tmp_path / "t" / "data.txt").read_text()
    half = text[: len(text) // 2]
    (tmp_path / "t" / "data.txt").write_text(half[: half.rfind(" ")])  # cut mid-row: its last value is gone
    with pytest.raises(bz.BnnZooError, match="is truncated or corrupt .* re-copy the file"):
        load_uci(tmp_path / "t")
    (tmp_path / "t" / "data.txt").write_text(text[: text.index("\n", len(text) // 2)])  # cut at a row end
    with pytest.raises(
        bz.BnnZooError, match="index_train_0.txt holds indices outside 0..5 .* data.txt may be truncated"
    ):
        load_uci(tmp_path / "t")
    _uci_folder(tmp_path / "c")
    (tmp_path / "c" / "index_train_0.txt").write_text("0\n1\n99\n")
    with pytest.raises(bz.BnnZooError, match="holds indices outside 0..11 .*re-copy it"):
        load_uci(tmp_path / "c")


def test_corrupt_and_missing_result_files(tmp_path):
    with pytest.raises(bz.BnnZooError, match="does not exist; run `bnn-zoo fit"):
        load_inference_data(tmp_path / "posterior.nc")
    (tmp_path / "posterior.nc").write_bytes(b"\x89HDF\r\n\x1a\n" + b"garbage" * 10)
    with pytest.raises(bz.BnnZooError, match="truncated or corrupt, re-run the fit"):
        load_inference_data(tmp_path / "posterior.nc")
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(bz.BnnZooError, match="checkpoint .* is unreadable"):
        safe_torch_load(tmp_path / "ckpt.pt")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fit", "--model", "transformer", "--out", "o"], "unknown model 'transformer'; choose one of: mlp,"),
        (
            ["fit", "--model", "mlp", "--model.width", "3", "--out", "o"],
            "--model.width is not an option of model mlp (its options: hidden, activation)",
        ),
        (
            ["fit", "--model", "mlp", "--model.hidden", "a", "--out", "o"],
            "--model.hidden: expected a list like [1, 2], got a",
        ),
        (["fit", "--data", "mnist", "--out", "o"], "unknown data 'mnist'"),
        (["fit", "--prior", "laplace", "--out", "o"], "unknown prior 'laplace'"),
        (["fit", "--likelihood", "poisson", "--out", "o"], "unknown likelihood 'poisson'"),
        (["fit", "--guide", "nope", "--out", "o"], "unknown guide 'nope'"),
        (
            ["fit", "--guide", "matrix-normal", "--guide.ranks", "2", "--out", "o"],
            "--guide.ranks is not an option of guide matrix-normal",
        ),
        (["fit", "--data", "uci", "--data.path", "/no/such/dir", "--out", "o"], "does not exist"),
        (["fit", "--inference", "mh", "--out", "o"], "unknown inference 'mh'"),
        (
            ["fit", "--evaluation.evidence", "[bic]", "--out", "o"],
            "--evaluation.evidence: expected one of ais, iw, got bic",
        ),
        (["fit", "--inference", "nuts", "--evaluation.evidence", "[iw]", "--out", "o"], "needs a guide with a density"),
        (
            ["fit", "--inference", "nuts", "--inference.kl_weight", "0.5", "--out", "o"],
            "--inference.kl_weight is not an option of inference nuts",
        ),
        (["fit", "--inference", "nuts", "--guide", "dropout", "--out", "o"], "a guide applies to svi, not nuts"),
        (
            ["fit", "--inference", "gp", "--inference.kernel", "periodic", "--out", "o"],
            "--inference.kernel: expected one of rbf, matern52, nngp, got periodic",
        ),
        (["fit", "--inference", "gp", "--inference.kernel", "nngp", "--out", "o"], "limit of a relu MLP"),
        (["fit", "--data", "toy-text", "--model", "lstm-tied", "--inference", "gp", "--out", "o"], "not text"),
        (["fit", "--likelihood", "categorical", "--out", "o"], "is a regression dataset; use gaussian"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_cli_rejects_unknown_names_with_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse exits on an unknown command
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def _corpus_files(root):
    """The files the bad-input corpus names, written into ``root`` (the test's working folder)."""
    (root / "afile").write_text("not a folder\n")
    (root / "ok.txt").write_text("to be or not to be, that is the question.\n" * 40)
    (root / "binary.txt").write_bytes(bytes(range(256)) * 20)
    (root / "latin1.txt").write_bytes("caf\xe9 na\xefve text\n".encode("latin-1") * 50)
    for name, edit in {
        "uci-overlap": lambda d: (d / "index_test_0.txt").write_text("0\n1\n9\n"),
        "uci-same": lambda d: (d / "index_test_0.txt").write_text((d / "index_train_0.txt").read_text()),
        "uci-repeated": lambda d: (d / "index_train_0.txt").write_text("3\n" * 30),
        "uci-one-row": lambda d: (d / "index_train_0.txt").write_text("0\n"),
        "uci-constant": lambda d: (d / "data.txt").write_text("\n".join(f"{i} {i * i} 7.0" for i in range(12)) + "\n"),
        "uci-huge": lambda d: (d / "data.txt").write_text("\n".join(f"{i}e30 1 {i}" for i in range(12)) + "\n"),
        "uci-repeated-feature": lambda d: (d / "index_features.txt").write_text("0\n0\n1\n"),
        "uci-two-rows": lambda d: (d / "index_train_0.txt").write_text("0\n1\n"),
        "uci-nan": lambda d: (d / "data.txt").write_text(
            "\n".join(f"{i} {'nan' if i == 5 else 1} {i}" for i in range(12)) + "\n"
        ),
    }.items():
        _uci_folder(root / name)
        edit(root / name)
    (root / "laughs.yaml").write_text(
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    )
    (root / "bigint.yaml").write_text(
        "inference: {class_path: SVI, init_args: {steps: 123456789012345678901234567890}}\n"
    )
    (root / "dup.yaml").write_text("seed: 1\nseed: 2\n")
    (root / "usernet.py").write_text(
        "import torch\n\n\nclass Boom(torch.nn.Module):\n    def __init__(self, in_features, out_features):\n"
        "        super().__init__()\n        raise RuntimeError('my constructor failed')\n\n\n"
        "class BadForward(torch.nn.Module):\n    def __init__(self, in_features, out_features):\n"
        "        super().__init__()\n        self.layer = torch.nn.Linear(in_features, out_features)\n\n"
        "    def forward(self, x):\n        raise ValueError('my forward failed')\n\n\n"
        "class Other(torch.nn.Module):\n    def __init__(self, depth):\n        super().__init__()\n"
    )
    (root / "usernet.py").write_text(
        (root / "usernet.py").read_text()
        + "\n\nclass NaNForward(torch.nn.Module):\n    def __init__(self, in_features, out_features):\n"
        "        super().__init__()\n        self.layer = torch.nn.Linear(in_features, out_features)\n\n"
        "    def forward(self, x):\n        return self.layer(x) * float('nan')\n"
    )
    (root / "select-typo.yaml").write_text(
        "base: {inference: {class_path: SVI, init_args: {steps: 2}}, evaluation: {plots: false}}\n"
        "select: {grid: {inference.lr: [0.01, 0.02]}, metric: test_log_likelihod}\n"
    )
    _uci_folder(root / "uci-gal-wide")
    for name, value in {"dropout_rates": "0.01", "tau_values": "0.1", "n_hidden": "1e9", "n_epochs": "1"}.items():
        (root / "uci-gal-wide" / f"{name}.txt").write_text(value + "\n")
    (root / "uci-gal-wide" / "n_splits.txt").write_text("1\n")
    (root / "sweep-junk" / "cells" / "abc").mkdir(parents=True)
    (root / "sweep-junk" / "sweep.yaml").write_text("name: junk\n")
    (root / "sweep-junk" / "cells" / "abc" / "status.json").write_text('{"state": "done", "metrics": [1]}')
    (root / "sweep-junk" / "cells" / "abc" / "cell.json").write_text("[1]")
    (root / "sweep-junk" / "cells" / "stray.txt").write_text("junk")
    (root / "sweep-junk" / "cells" / "def").mkdir()  # done, but its cell.json is gone
    (root / "sweep-junk" / "cells" / "def" / "status.json").write_text('{"state": "done", "metrics": {"rmse": 1.0}}')
    (root / "flatnet.py").write_text(
        "import torch\n\n\nclass Flat(torch.nn.Module):\n"
        "    def __init__(self, in_features, out_features):\n        super().__init__()\n        self.layer = "
        "torch.nn.Linear(in_features, 1)\n\n    def forward(self, x):\n        return self.layer(x)[:, 0]\n"
    )
    (root / "big.yaml").write_text(
        "base: {inference: {class_path: SVI, init_args: {steps: 2}}}\ngrid: {seed: range(10000)}\n"
    )
    _uci_folder(root / "uci-gal-0-epochs")
    for name, value in {
        "dropout_rates": "0.01",
        "tau_values": "0.1",
        "n_hidden": "50",
        "n_epochs": "0",
        "n_splits": "1",
    }.items():
        (root / "uci-gal-0-epochs" / f"{name}.txt").write_text(value + "\n")
    done, partial = root / "done", root / "partial"
    for finished in (done, root / "svi"):  # a finished fit, and the demo's first run
        finished.mkdir()
        (finished / "metrics.json").write_text('{"rmse": 1.0}\n')
    partial.mkdir()
    (partial / "config.yaml").write_text("seed: 0\n")
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("mine\n")
    (root / "array").mkdir()
    (root / "array" / "metrics.json").write_text("[1, 2]\n")


QUICK_FIT = ["--inference.steps", "2", "--evaluation.plots", "false", "--quiet"]


@pytest.mark.parametrize(
    "argv, message",
    [
        # option ranges: guides, priors, likelihoods, methods, evaluation, seed
        (
            ["fit", "--guide", "matrix-normal", "--guide.rank", "0"],
            "rank (None: full Cholesky factors) must be a whole number >= 1, got 0",
        ),
        (["fit", "--guide", "matrix-normal", "--guide.rank", "-2"], "must be a whole number >= 1, got -2"),
        (
            ["fit", "--guide", "matrix-normal", "--guide.scales", "true", "--guide.local_reparam", "true"],
            "local_reparam needs Kronecker-factored outputs",
        ),
        (
            ["fit", "--guide", "mean-field", "--guide.init_scale", "-1"],
            "init_scale (the starting sd of every weight) must be a finite number > 0, got -1",
        ),
        (["fit", "--guide", "flow", "--guide.num_flows", "0"], "num_flows must be a whole number >= 1, got 0"),
        (["fit", "--guide", "dropout", "--guide.p", "1.5"], "dropout probabilities must lie in [0, 1), got [1.5"),
        (["fit", "--prior", "normal", "--prior.scale", "-1"], "prior scales must be positive and finite, got [-1.0]"),
        (["fit", "--prior", "normal", "--prior.scale", "0"], "prior scales must be positive and finite, got [0.0]"),
        (
            ["fit", "--prior", "scale-mixture", "--prior.pi", "1.5"],
            "a scale mixture needs 0 < pi < 1 and 0 < scale2 < scale1 < inf, got pi=1.5",
        ),
        (
            ["fit", "--inference", "laplace", "--prior", "scale-mixture"],
            "has ScaleMixture(pi=0.5, scale1=1.0, scale2=0.0025): use --prior fanin or normal",
        ),
        (
            ["fit", "--likelihood", "gaussian", "--likelihood.scale", "-1"],
            "Gaussian noise scale must be positive and finite, got -1.0",
        ),
        (["fit", "--inference.steps", "0"], "SVI steps must be a positive integer, got 0"),
        (
            ["fit", "--inference.steps", "null", "--inference.epochs", "0"],
            "SVI epochs must be a positive integer, got 0",
        ),
        (["fit", "--inference.lr", "0"], "SVI needs a finite lr > 0"),
        (["fit", "--inference.lr", "inf"], "--inference.lr: expected a number, got inf"),
        (["fit", "--inference.batch_size", "0"], "SVI batch_size must be a positive integer, got 0"),
        (
            ["fit", "--inference.steps", "null", "--inference.epochs", "2", "--inference.batch_size", "0"],
            "SVI batch_size must be a positive integer, got 0",
        ),
        (
            ["fit", "--inference", "sgld", "--inference.batch_size", "0"],
            "SGMCMC batch_size must be a positive integer, got 0",
        ),
        (
            ["fit", "--inference", "nuts", "--inference.num_chains", "0"],
            "NUTS num_chains must be an integer >= 1, got 0",
        ),
        (
            ["fit", "--inference", "nuts", "--inference.step_size", "0.1"],
            "--inference.step_size is not an option of inference nuts",
        ),
        (
            ["fit", "--inference", "nuts", "--inference.max_tree_depth", "0"],
            "NUTS max_tree_depth must be an integer >= 1, got 0",
        ),
        (
            ["fit", "--inference", "hmc", "--inference.max_leapfrog", "0"],
            "HMC max_leapfrog must be an integer >= 1, got 0",
        ),
        (["fit", "--inference", "nuts", "--inference.chain_method", "threads"], "--inference.chain_method"),
        (
            ["fit", "--inference", "chees", "--inference.chain_method", "parallel"],
            "--inference.chain_method is not an option of inference chees",
        ),
        (["fit", "--inference", "sgld", "--inference.step_size", "0"], "SGMCMC needs step_size > 0"),
        (
            ["fit", "--inference", "chees", "--inference.num_chains", "1"],
            "ChEES num_chains must be an integer >= 2, got 1",
        ),
        (
            ["fit", "--inference", "chees", "--inference.target_accept", "1"],
            "ChEES target_accept must lie in (0, 1), got 1.0",
        ),
        (
            ["fit", "--inference", "chees", "--inference.max_hours", "0"],
            "ChEES max_hours must be a positive number of hours or None (no limit), got 0",
        ),
        (
            ["fit", "--inference", "nuts", "--inference.max_hours", "-1"],
            "NUTS max_hours must be a positive number of hours or None (no limit), got -1",
        ),
        (["fit", "--model", "mlp", "--model.hidden", "[0]"], "layer widths must be positive integers"),
        (["fit", "--seed", "-1"], "seed must be a whole number in 0..4294967295"),
        (
            ["fit", "--evaluation.predict_samples", "0"],
            "--evaluation.predict_samples must be a whole number >= 1, got 0",
        ),
        (["fit", "--evaluation.elbo_samples", "1"], "--evaluation.elbo_samples must be a whole number >= 2, got 1"),
        (
            ["fit", "--evaluation.evidence", "[ais]", "--evaluation.training_evidence", "false"],
            "which --evaluation.training_evidence false skips",
        ),
        # output folders, checked before training
        (["fit", "--out", "afile"], "--out afile is a file; give a folder path"),
        (["fit", "--out", "afile/run"], "--out afile/run is inside afile, which is a file"),
        (["fit", "--out", "/proc/bnn-zoo-run"], "cannot write to --out /proc/bnn-zoo-run"),
        (
            ["fit", "--out", "done"],
            "--out done already holds a run; pass --overwrite to replace it or --resume to continue it",
        ),
        (["fit", "--out", "done", "--resume"], "holds a finished run, so there is nothing to resume; pass --overwrite"),
        (["fit", "--out", "partial", "--resume", "--overwrite"], "pass one of them"),
        (["fit", "--out", "other"], "--out other is a folder with other files in it; give a new or empty folder"),
        (["compare", "done", "--out", "afile"], "--out afile is a file; give a folder path"),
        (["compare", "array"], "holds a JSON list, not the mapping of metrics a fit writes"),
        (["sweep", "nowhere.yaml", "--out", "afile"], "--out afile is a file"),
        (["reproduce", "uci-gal", "--data", "uci-overlap", "--out", "afile"], "--out afile is a file"),
        (
            ["reproduce", "uci-gal", "--data", "uci-overlap", "--device", "banana", "--out", "new"],
            "unknown device 'banana'; use 'cpu' or 'cuda'",
        ),
        (["demo", "--out", "afile"], "--out afile/svi is inside afile, which is a file"),
        (
            ["demo", "--out", "."],
            "--out svi already holds a run; pass --overwrite to replace it, or choose another folder",
        ),
        # text corpora
        (
            ["fit", "--data", "text", "--data.path", "ok.txt", "--data.seq_len", "0", "--model", "lstm-tied"],
            "seq_len (tokens per window) must be a whole number >= 1",
        ),
        (
            ["fit", "--data", "text", "--data.path", "ok.txt", "--data.max_vocab", "1", "--model", "lstm-tied"],
            "max_vocab (padding, unknown and at least one",
        ),
        (
            ["fit", "--data", "text", "--data.path", "binary.txt", "--model", "lstm-tied"],
            "binary.txt is a binary file (it holds NUL bytes)",
        ),
        (
            ["fit", "--data", "text", "--data.path", "latin1.txt", "--model", "lstm-tied"],
            "latin1.txt is not UTF-8 text (byte 0xe9 at offset 3); convert it",
        ),
        (
            ["fit", "--data", "text", "--data.path", "ok.txt", "--data.seq_len", "100000", "--model", "lstm-tied"],
            "too few tokens for one window",
        ),
        # UCI splits and values
        (
            ["fit", "--data", "uci", "--data.path", "afile"],
            "UCI path afile is a file; pass the folder holding data.txt",
        ),
        (
            ["fit", "--data", "uci", "--data.path", "uci-overlap"],
            "2 of the 3 test rows of split 0 are also training rows (first: row 0)",
        ),
        (["fit", "--data", "uci", "--data.path", "uci-same"], "8 of the 8 test rows of split 0 are also training rows"),
        (["fit", "--data", "uci", "--data.path", "uci-repeated"], "lists row 3 30 times"),
        (
            ["fit", "--data", "uci", "--data.path", "uci-one-row"],
            "holds 1 row(s); a split needs at least 5 training rows",
        ),
        (
            ["fit", "--data", "uci", "--data.path", "uci-constant"],
            "the target is constant (7) on the training rows of split 0",
        ),
        (
            ["fit", "--data", "uci", "--data.path", "uci-huge"],
            "features holds values up to 1.1e+31 (first in row 1), beyond 2e+18 where torch.float32 arithmetic "
            "overflows",
        ),
        (["fit", "--data", "uci", "--data.path", "uci-nan"], "contains NaN or inf (first in row 5, line 6)"),
        # a method that cannot take the network
        (
            [
                "fit",
                "--data",
                "toy-text",
                "--model",
                "lstm-tied",
                "--inference",
                "laplace",
                "--inference.map_steps",
                "2",
            ],
            "which this network does not support",
        ),
        # a user's network with the wrong output shape, or failing in its own code
        (
            ["fit", "--model", "flatnet:Flat"],
            "the network flatnet.Flat returns shape (2,) for 2 input rows; it must return (2, ",
        ),
        (
            ["fit", "--model", "usernet:Boom"],
            "your network usernet.Boom(in_features=1, out_features=1) could not be built: RuntimeError: my constructor",
        ),
        (
            ["fit", "--model", "usernet:Other"],
            "usernet.Other(in_features=1, out_features=1) could not be built: TypeError:",
        ),
        (
            ["fit", "--model", "usernet:BadForward"],
            "the network usernet.BadForward fails on the first 2 rows of x: ValueError: my forward failed",
        ),
        # untrusted config files and sizes
        (["fit", "--config", "laughs.yaml"], "laughs.yaml: it expands to more than 100,000 values through its aliases"),
        (["fit", "--config", "bigint.yaml"], "bigint.yaml: the integer on line 1 has more than 20 digits"),
        (["fit", "--config", "dup.yaml"], "dup.yaml: the key 'seed' appears twice in one mapping (line 2); keep one"),
        (
            ["fit", "--inference.steps", "123456789012345678901"],
            "--inference.steps is 123456789012345678901; bnn-zoo's counts and sizes are at most 1,000,000,000",
        ),
        (["fit", "--model.hidden", "[10000000000]"], "--model.hidden is 10000000000"),
        (["fit", "--data.n_train", "0"], "toy-cubic n_train (training points) must be a whole number >= 2, got 0"),
        (["fit", "--data.n_train", "-3"], "must be a whole number >= 2, got -3"),
        (
            ["fit", "--guide", "dropout", "--guide.p", "2", "--print-config"],
            "dropout probabilities must lie in [0, 1), got [2.0, 2.0]",
        ),
        (["fit", "--out", "x" * 300], "--out has a name of 300 bytes"),
        (
            ["fit", "--inference", "laplace", "--inference.batch_size", "0"],
            "Laplace batch_size must be a whole number >= 1 or None (full batch), got 0",
        ),
        (
            ["fit", "--data", "uci", "--data.path", "uci-repeated-feature"],
            "index_features.txt lists column 0 2 times; list each feature once",
        ),
        (
            ["fit", "--data", "uci", "--data.path", "uci-two-rows"],
            "holds 2 row(s); a split needs at least 5 training rows",
        ),
        # sweep and table folders holding junk
        (["table", "sweep-junk"], "cannot group by dataset, inference; the cells carry no labels"),
        (["table", "partial"], "partial is not a sweep folder (no sweep.yaml)"),
        (["table", "sweep-junk", "--by", ""], "--by '' names no label"),
        (["table", "sweep-junk", "--out", "afile/table"], "--out afile is a file"),
        (
            ["sweep", "big.yaml", "--ray-address", "127.0.0.1:9", "--max-cells", "10000"],
            "nothing answers at --ray-address 127.0.0.1:9",
        ),
        (
            ["sweep", "big.yaml", "--ray-address", "nowhere", "--max-cells", "10000"],
            "--ray-address 'nowhere' is not HOST:PORT",
        ),
        (
            ["sweep", "big.yaml"],
            "the sweep sweep has 10,000 cells, more than the limit of 1,000; pass --max-cells 10000 to run them all",
        ),
        # runs that would not fit in memory (this machine kind has 24 GiB), refused before anything is allocated
        (["fit", "--data.n_train", "100000000"], "this fit needs about 37.3 GiB of memory"),
        (["reproduce", "uci-gal", "--data", "uci-gal-wide", "--out", "new"], "sweep uci-gal uci-gal-wide: this fit"),
        # options that would be silently ignored, or fail only inside every cell
        (
            ["fit", "--guide", "dropout", "--guide.learn_p", "true", "--guide.p", "0"],
            "p = 0.0 leaves none above 0 to learn",
        ),
        (
            ["reproduce", "uci-gal", "--data", "uci-gal-0-epochs", "--adversarial", "0.5", "--out", "new"],
            "--adversarial is an option of deep-ensembles, not uci-gal; drop it",
        ),
        (
            ["reproduce", "digits-shift", "--data", "uci-gal-0-epochs", "--out", "new"],
            "--data is an option of uci-gal and deep-ensembles and uci-gap, not digits-shift",
        ),
        (["reproduce", "digits-shift", "--splits", "0-3", "--out", "new"], "--splits is an option of"),
        (
            ["reproduce", "deep-ensembles", "--data", "uci-gal-0-epochs", "--adversarial", "-0.5", "--out", "new"],
            "--adversarial is a fraction of each input's range in [0, 1) (0: no adversarial training), got -0.5",
        ),
        (
            ["reproduce", "deep-ensembles", "--data", "uci-gal-0-epochs", "--adversarial", "nan", "--out", "new"],
            "got nan",
        ),
        (["table", "sweep-junk", "--reference-method", ""], "--reference-method '' names no method"),
        (["sweep", "select-typo.yaml", "--out", "sel"], "select.metric 'test_log_likelihod' is not a metric"),
        (["fit", "--model", "usernet:NaNForward"], "your network usernet.NaNForward returns NaN in"),
        (["fit", "--out", "/".join(["d" * 200] * 30)], "--out is a path of"),
        (
            ["reproduce", "uci-gal", "--data", "uci-gal-0-epochs", "--out", "new"],
            "n_epochs.txt's value must be a whole number >= 1, got 0.0",
        ),
        (
            ["reproduce", "uci-gal", "--data", "uci-gal-0-epochs", "--splits", "", "--out", "new"],
            "--splits takes ranges and numbers like 0-19 or 0,3,5; got ''",
        ),
    ],
)
def test_cli_bad_input_corpus(argv, message, capsys, tmp_path, monkeypatch):
    """Each bad input: exit code 2, one line naming the problem and the fix, no traceback, no hang (a
    30 s alarm), nothing trained and no output folder left behind."""
    import signal

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _corpus_files(tmp_path)
    before = _snapshot(tmp_path)
    if argv[0] == "fit" and "--out" not in argv:
        argv = [*argv, "--out", "o"]
    argv = ["fit", *QUICK_FIT, *argv[1:]] if argv[0] == "fit" else argv  # the case's own options come last and win

    def hang(*_):
        raise TimeoutError(f"bnn-zoo {' '.join(argv)} hung")

    signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
    after = _snapshot(tmp_path)
    assert {k: after.get(k) for k in before} == before  # nothing lost or changed


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_result_files_get_normal_permissions_and_no_temporary_files_stay(tmp_path):
    import os

    from bnn_zoo.io import remove_temporaries, write_json

    write_json({"a": float("nan"), "b": [1.0, float("inf")]}, tmp_path / "m.json")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~umask
    # strict JSON
    assert (tmp_path / "m.json").read_text().split() == [
        "{",
        '"a":',
        "null,",
        '"b":',
        "[",
        "1.0,",
        "null",
        "]",
        "}",
    ]
    (tmp_path / ".posterior.nc.abc123.tmp").write_bytes(b"half")  # left by a write a kill interrupted
    remove_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_an_unforeseen_failure_is_one_line_with_the_traceback_in_a_file(monkeypatch, capsys):
    from bnn_zoo import cli

    def boom(args):
        raise RuntimeError("something bnn-zoo did not foresee\nsecond line")

    monkeypatch.setattr(cli, "_list", boom)
    assert main(["list"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "unexpected RuntimeError: something bnn-zoo did not foresee (a bug in bnn-zoo" in err
    )
    path = err.rsplit("traceback is in ", 1)[1].rstrip(")\n")
    assert "Traceback" in open(path).read()


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_deletes_only_what_bnn_zoo_wrote(tmp_path, monkeypatch, capsys):
    """--overwrite clears a folder only when bnn-zoo marked it as its own and it holds nothing else."""
    monkeypatch.chdir(tmp_path)
    fit = ["fit", *QUICK_FIT, "--out"]
    mine = tmp_path / "mine"  # a user's folder that happens to hold a config.yaml
    (mine / "src").mkdir(parents=True)
    (mine / "thesis.tex").write_text("\\chapter{Results}\n")
    (mine / "config.yaml").write_text("seed: 0\n")
    (mine / "src" / "main.py").write_text("print('hi')\n")
    before = _tree(mine)
    assert main([*fit, "mine", "--overwrite"]) == 2
    assert "has no .bnn-zoo-result file" in capsys.readouterr().err
    assert _tree(mine) == before

    assert main([*fit, "run"]) == 0  # a run's own folder is cleared and fitted again
    assert main([*fit, "run", "--overwrite"]) == 0
    capsys.readouterr()
    (tmp_path / "run" / "notes.txt").write_text("mine\n")  # then the user keeps a file in it
    (tmp_path / "run" / "figures").mkdir()
    before = _tree(tmp_path / "run")
    assert main([*fit, "run", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert (
        "holds files bnn-zoo did not write (figures, notes.txt), so --overwrite deletes nothing" in err
        and err.count("\n") == 1
    )
    assert _tree(tmp_path / "run") == before


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda m, x, y: bz.fit(m, x, y, bz.SVI), "method is the class SVI; pass an instance, e.g. bnn_zoo.SVI()"),
        (
            lambda m, x, y: bz.SVI(guide="matrix-normal", guide_options="rank=2"),
            "SVI guide_options must be a dict, got 'rank=2' (str)",
        ),
        (lambda m, x, y: bz.SVI(lr="0.01"), "SVI lr must be a number, got '0.01' (str)"),
        (lambda m, x, y: bz.SVI(steps=True), "SVI steps must be a whole number or None, got True (bool)"),
        (lambda m, x, y: bz.NUTS(num_samples=2.0), "NUTS num_samples must be a whole number or None, got 2.0 (float)"),
        (lambda m, x, y: bz.HMC(step_size=-0.1), "HMC step_size must be a finite number > 0, got -0.1"),
        (lambda m, x, y: bz.Laplace(batch_size=0), "Laplace batch_size must be a whole number >= 1 or None"),
        (lambda m, x, y: bz.fit(m, x > 0, y, QUICK), "x is boolean; pass numbers"),
        (lambda m, x, y: bz.fit(m, x, y > 0, QUICK), "y is boolean but the likelihood is for regression"),
    ],
)
def test_python_api_bad_settings_are_one_error(reg, make, message):
    with pytest.raises(bz.BnnZooError, match=re.escape(message)) as info:
        make(reg, torch.randn(6, 2), torch.randn(6))
    assert "\n" not in str(info.value)


def test_sweep_status_skips_junk_and_counts_cells(tmp_path, capsys):
    cells = tmp_path / "s" / "cells"
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.yaml").write_text("name: s\n")
    for key, status in {
        "a": '{"state": "done", "metrics": {"rmse": 1}}',
        "b": "{half",
        "c": '{"state": "exploded"}',
        "d": "[1]",
    }.items():
        (cells / key).mkdir(parents=True)
        (cells / key / "status.json").write_text(status)
    (cells / "d" / "cell.json").write_text('{"labels": 3}')
    (cells / "stray.txt").write_text("junk")
    assert main(["sweep", str(tmp_path / "s"), "--status"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1 done, 0 running, 0 failed, 3 pending"


def test_a_10000_cell_sweep_expands_by_the_quick_route_to_what_the_parser_gives(tmp_path):
    """The grid's scalar values are set on one parsed base (no parse per cell): the same configs, keys
    and labels as parsing every cell, and a bad value still fails with the field's error."""
    import signal

    from bnn_zoo.experiments.sweep import Sweep

    sweep = Sweep.from_dict(
        {
            "base": {"guide": "dropout"},
            "grid": {"seed": "range(2500)", "guide.p": [0.1, 0.2]},
            "zip": {"data.n_train": [20, 40]},
        }
    )
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("expanding 20,000 cells hung")))
    signal.alarm(120)  # a hang guard, not a timing: measured about 5 s for these 10,000 cells
    try:
        cells = [sweep.cell(o) for o in sweep.outer()]
    finally:
        signal.alarm(0)
    assert len({c.key for c in cells}) == 10_000
    parsed = Sweep.from_dict(
        {
            "base": {"guide": "dropout"},
            "grid": {"seed": "range(2500)", "guide.p": [0.1, 0.2]},
            "zip": {"data.n_train": [20, 40]},
        }
    )
    parsed._checked = lambda overrides: None  # the parser's route, cell by cell
    for i in (0, 1, 7, 9_999):
        slow = parsed.cell(sweep.outer()[i])
        assert (slow.key, slow.config, slow.labels, slow.batch) == (
            cells[i].key,
            cells[i].config,
            cells[i].labels,
            cells[i].batch,
        )
    bad = Sweep.from_dict({"base": {}, "grid": {"seed": [-1]}})
    with pytest.raises(bz.BnnZooError, match="seed must be a whole number in 0..4294967295"):
        bad.cell(bad.outer()[0])


def test_version_and_a_heartbeat_when_output_is_not_a_terminal(tmp_path):
    import subprocess
    import sys

    version = subprocess.run([sys.executable, "-m", "bnn_zoo.cli", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("bnn-zoo ")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bnn_zoo.cli",
            "fit",
            "--out",
            str(tmp_path / "r"),
            "--inference.steps",
            "300",
            "--evaluation.plots",
            "false",
            "--evaluation.training_evidence",
            "false",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "BNN_ZOO_HEARTBEAT_S": "0.2"},
    )
    assert run.returncode == 0, run.stderr
    assert "bnn-zoo: fitting svi-mean-field on toy-cubic (" in run.stderr


def test_two_writers_in_one_folder_the_second_is_refused_at_once(tmp_path, capsys):
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bnn_zoo.cli",
            "fit",
            "--inference.steps",
            "100000",
            "--inference.checkpoint_every",
            "50",
            "--out",
            str(out),
            "--quiet",
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 120
        while not (out / "checkpoint.pt").exists():  # the first is training
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.05)
        assert main(["fit", *QUICK_FIT, "--out", str(out), "--resume"]) == 2
        assert f"another bnn-zoo process is writing to --out {out}" in capsys.readouterr().err
    finally:
        first.kill()
        first.wait()
    assert main(["fit", *QUICK_FIT, "--out", str(out), "--overwrite"]) == 0  # a killed writer's lock goes with it


def test_a_full_disk_leaves_no_result_that_compare_or_table_accepts(tmp_path, monkeypatch, capsys):
    import errno

    from bnn_zoo import io

    real_replace = os.replace

    def full(src, dst):
        if str(dst).endswith("metrics.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(io.os, "replace", full)
    assert main(["fit", *QUICK_FIT, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.json: no space left on the disk that holds" in err
    monkeypatch.setattr(io.os, "replace", real_replace)
    assert not (tmp_path / "run" / "metrics.json").exists() and not list((tmp_path / "run").glob(".*.tmp"))
    assert main(["compare", str(tmp_path / "run"), "--out", str(tmp_path / "cmp")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_file_size_limit_ends_in_one_line_not_a_segfault_and_the_run_resumes(tmp_path):
    """Under ulimit -f the netCDF writer (HDF5) crashed the process (exit 139); the file is now made in memory."""
    import resource
    import subprocess
    import sys

    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"y" * 100_000)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "bnn_zoo.cli", "fit", *QUICK_FIT, "--out", str(out), "--quiet"]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # noqa: E731
    limited = subprocess.run(command, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    # one error line (a two-step fit's band is also warned of, in a line of its own)
    errors = [line for line in limited.stderr.splitlines() if not line.startswith("bnn-zoo: warning:")]
    assert limited.returncode == 2 and len(errors) == 1, limited.stderr
    assert "the file size limit (ulimit -f) is reached on the disk that holds" in limited.stderr
    assert precious.read_bytes() == b"y" * 100_000 and not (out / "metrics.json").exists()
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0 and (out / "metrics.json").is_file() and (out / "posterior.nc").is_file()


def test_an_out_folder_without_write_permission_is_one_line(tmp_path, monkeypatch, capsys):
    """Root may write anywhere, so where the tests run as root the kernel's refusal is stood in for at the
    probe every result folder passes (a temporary file); as another user the folder is made read-only."""
    import errno
    import tempfile

    from bnn_zoo import io

    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() == 0:
        real = tempfile.TemporaryFile

        def refuse(*args, dir=None, **kwargs):
            if dir is not None and locked in (Path(dir), *Path(dir).parents):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(io.tempfile, "TemporaryFile", refuse)
    else:
        locked.chmod(0o500)
    code = main(["fit", *QUICK_FIT, "--out", str(locked / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert f"cannot write to --out {locked / 'run'} (Permission denied); choose a folder you can write to" in err
    assert not any(locked.rglob("*.json"))


def test_python_api_cases_that_raised_internal_errors_now_say_what_is_wrong(reg, tmp_path):
    x, y = torch.randn(12, 2), torch.randn(12)
    _fails(reg, torch.randn(12, 0), y, r"x has shape \(12, 0\): its rows hold no values")

    class Foreign:
        def run(self, *args, **kwargs):
            return "whatever"

    with pytest.raises(bz.BnnZooError, match="method must be an instance of a registered inference method"):
        bz.fit(reg, x, y, Foreign())
    post = bz.fit(reg, x, y, QUICK)
    with pytest.raises(bz.BnnZooError, match=r"no test predictions .* pass test=\(x_test, y_test\)"):
        bz.compare([post], reference=post)
    with pytest.raises(bz.BnnZooError, match="compare takes posteriors from bnn_zoo.fit, result folders"):
        bz.compare([object()])
    gp = tmp_path / "gp"
    bz.fit(bz.GP("rbf"), x, y, bz.TypeII()).save(gp)
    with pytest.raises(bz.BnnZooError, match="model is a bnn_zoo.bnn:BNN, the saved one a bnn_zoo.baselines.gp:GP"):
        bz.load(gp, model=reg)
    post.save(tmp_path / "bnn")
    other = bz.BNN(bz.models.MLP(2, [4], 1), likelihood=bz.likelihoods.Gaussian(0.5))
    with pytest.raises(bz.BnnZooError, match=r"model.net.hidden: \[4\] given, \[3\] saved"):
        bz.load(tmp_path / "bnn", model=other)


def test_nuts_with_a_single_draw_scores_without_loo(tmp_path, capsys):
    """One chain of one draw: PSIS-LOO has nothing to importance-sample (it raised IndexError)."""
    argv = ["fit", "--inference", "nuts", "--inference.num_samples", "1", "--inference.num_warmup", "10"]
    out = tmp_path / "one"
    assert main([*argv, "--inference.num_chains", "1", *QUICK_FIT[2:], "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "loo_elpd" not in metrics and np.isfinite(metrics["rmse"])


def test_a_corpus_that_would_score_for_hours_is_refused_before_the_fit(capsys, tmp_path):
    """A 47 MB text without line breaks: its 73,000 test windows over 1,000 dropout draws would score for
    hours (about 100 microseconds a window here); the timed estimate refuses it in seconds, untouched."""
    import time

    corpus = tmp_path / "big.txt"
    corpus.write_text("the king and the queen of the sea sing a song in the storm " * 800_000)  # 47 MB
    before = corpus.read_bytes()
    start = time.perf_counter()
    code = main(
        ["fit", "--data", "text", "--data.path", str(corpus), "--model", "lstm-tied", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "scoring this fit would take about" in err and err.count("\n") == 1, err
    assert "raise --evaluation.max_scoring_hours" in err
    assert time.perf_counter() - start < 60
    assert corpus.read_bytes() == before and not (tmp_path / "o").exists()
