"""Your own table from the command line: bnn-zoo fit --data csv fits a classifier or a regression from
a CSV with a header (or an .npz), and a bad table is refused in one line naming its row or column."""

import json

import numpy as np
import pytest
import torch

from bnn_zoo.cli import main
from bnn_zoo.data.tables import load_table

QUICK = ["--inference.steps", "300", "--evaluation.plots", "false", "--quiet"]


def _iris_like(path, n=90, header=True, labels=("setosa", "versicolor", "virginica")):
    g = torch.Generator().manual_seed(0)
    k = torch.randint(len(labels), (n,), generator=g)
    x = torch.stack([k * 1.5, k * 2.0], 1) + 0.4 * torch.randn(n, 2, generator=g)
    lines = (["length,width,species"] if header else []) + [
        f"{a:.3f},{b:.3f},{labels[c]}" for (a, b), c in zip(x.tolist(), k.tolist(), strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_classifier_fits_from_a_csv_with_a_header(tmp_path):
    table = _iris_like(tmp_path / "iris.csv")
    argv = ["fit", "--data", "csv", "--data.path", str(table), "--data.target", "species"]
    assert main([*argv, "--data.task", "classification", *QUICK, "--out", str(tmp_path / "run")]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.8 and metrics["n_test"] == 18 and metrics["data"] == "table:iris"


def test_word_labels_without_a_header_and_npz_tables_read_the_same_rows(tmp_path):
    named = load_table(_iris_like(tmp_path / "a.csv"), target="species", task="classification")
    bare = load_table(_iris_like(tmp_path / "b.csv", header=False), target="-1", task="classification")
    assert torch.equal(named.x_train, bare.x_train) and named.info["classes"] == ["setosa", "versicolor", "virginica"]
    np.savez(tmp_path / "t.npz", x=bare.x_train.numpy(), y=bare.y_train.numpy())
    arrays = load_table(tmp_path / "t.npz", task="classification", test_fraction=0.5)
    assert len(arrays.x_train) + len(arrays.x_test) == len(bare.x_train)


@pytest.mark.parametrize(
    "content, options, message",
    [
        ("a,b,y\n1,2,3\n4,5,6\n", ["--data.target", "z"], "has no column 'z'; its columns: a, b, y"),
        ("a,b,y\n1,2,3\n4,x,6\n", [], "line 3, column 'b': 'x' is not a finite number"),
        ("a,b,y\n1,2,3\n4,5,nan\n", [], "line 3, target 'y': 'nan' is not a finite number"),
        ("a,b,y\n1,2,0\n4,5,0\n7,8,0\n", ["--data.task", "classification"], "every row has the class '0'"),
        ("a,b,y\n1,2,0\n4,5,\n7,8,1\n", ["--data.task", "classification"], "data row 1 has no class label"),
        ("a,b,y\n1,2,3\n4,5\n", [], "line 3 has 2 cells, the first row 3"),
    ],
)
def test_a_bad_table_is_refused_in_one_line_naming_its_row_or_column(tmp_path, capsys, content, options, message):
    table = tmp_path / "t.csv"
    table.write_text(content)
    code = main(["fit", "--data", "csv", "--data.path", str(table), *options, *QUICK, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert table.read_text() == content and not (tmp_path / "o").exists()


NET = """import torch


class Residual(torch.nn.Module):
    def __init__(self, in_features, out_features, width=8):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(in_features, width), torch.nn.Linear(width, out_features)

    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)))
"""


def test_your_network_from_a_file_or_a_module_in_the_working_directory(tmp_path, monkeypatch, capsys):
    """No PYTHONPATH: --model file.py:Class loads the file, --model module:Class finds it from the
    working directory; one that cannot be imported is one line saying how to name it."""
    (tmp_path / "mynets.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    for i, spec in enumerate(("mynets.py:Residual", "mynets:Residual")):
        assert main(["fit", "--model", spec, "--model.width", "4", *QUICK, "--out", f"run{i}"]) == 0
    assert main(["fit", "--model", "nowhere:Net", *QUICK, "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert "cannot import nowhere" in err and "--model path/to/nowhere.py:Net" in err and err.count("\n") == 1
