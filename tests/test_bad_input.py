"""Every bad input fails before training with a one-line message naming the problem and the fix."""

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
    with pytest.raises(bz.BnnZooError, match="unknown guide 'low-rank'; available guides: dropout, flow, matrix-normal, mean-field"):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), bz.SVI(guide="low-rank", progress=False))
    with pytest.raises(bz.BnnZooError, match="method must be bnn_zoo.SVI"):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), "nuts")
    with pytest.raises(bz.BnnZooError, match="init must be None, 'prior'"):
        bz.fit(reg, torch.randn(5, 2), torch.randn(5), bz.NUTS(init="svi", progress=False))


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
    with pytest.raises(bz.BnnZooError, match="index_train_0.txt holds indices outside 0..5 .* data.txt may be truncated"):
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
        (["fit", "--model", "mlp", "--model.width", "3", "--out", "o"], "Option 'width' is not accepted"),
        (["fit", "--model", "mlp", "--model.hidden", "a", "--out", "o"], "Parser key \"hidden\": Expected a <class 'list'>"),
        (["fit", "--data", "mnist", "--out", "o"], "unknown data 'mnist'"),
        (["fit", "--prior", "laplace", "--out", "o"], "unknown prior 'laplace'"),
        (["fit", "--likelihood", "poisson", "--out", "o"], "unknown likelihood 'poisson'"),
        (["fit", "--guide", "nope", "--out", "o"], "unknown guide 'nope'"),
        (["fit", "--guide", "matrix-normal", "--guide.ranks", "2", "--out", "o"], "Option 'ranks' is not accepted"),
        (["fit", "--data", "uci", "--data.path", "/no/such/dir", "--out", "o"], "does not exist"),
        (["fit", "--inference", "mh", "--out", "o"], "unknown inference 'mh'"),
        (["fit", "--evaluation.evidence", "[bic]", "--out", "o"], "Got value: bic"),
        (["fit", "--inference", "nuts", "--evaluation.evidence", "[iw]", "--out", "o"], "needs a guide with a density"),
        (["fit", "--inference", "nuts", "--inference.kl_weight", "0.5", "--out", "o"], "Option 'kl_weight' is not accepted"),
        (["fit", "--inference", "nuts", "--guide", "dropout", "--out", "o"], "a guide applies to svi, not nuts"),
        (["fit", "--inference", "gp", "--inference.kernel", "periodic", "--out", "o"], "Got value: periodic"),
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
