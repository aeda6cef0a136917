"""Your own table from the command line: bnn-zoo fit --data csv fits a classifier or a regression from
a CSV with a header (or an .npz), and a bad table is refused in one line naming its row or column."""

import codecs
import json

import numpy as np
import pytest
import torch
import xarray as xr

import bnn_zoo as bz
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


def test_a_classifier_fits_from_a_csv_with_a_header_and_answers_in_its_label_names(tmp_path):
    table = _iris_like(tmp_path / "iris.csv")
    argv = ["fit", "--data", "csv", "--data.path", str(table), "--data.target", "species"]
    assert main([*argv, "--data.task", "classification", *QUICK, "--out", str(tmp_path / "run")]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.8 and metrics["n_test"] == 18 and metrics["data"] == "table:iris"
    names = ["setosa", "versicolor", "virginica"]
    stored = xr.open_dataset(tmp_path / "run" / "predictions.nc")
    assert stored["class"].values.tolist() == names
    test = load_table(table, target="species", task="classification")
    labels = bz.load(tmp_path / "run").predict(test.x_test).labels
    truth = [names[i] for i in test.y_test.tolist()]
    assert sum(a == b for a, b in zip(labels, truth, strict=True)) / len(truth) == pytest.approx(metrics["accuracy"])
    assert labels == [names[i] for i in stored["probs"].values.argmax(-1).tolist()]


def test_word_labels_without_a_header_and_npz_tables_read_the_same_rows(tmp_path):
    named = load_table(_iris_like(tmp_path / "a.csv"), target="species", task="classification")
    bare = load_table(_iris_like(tmp_path / "b.csv", header=False), target="-1", task="classification")
    assert torch.equal(named.x_train, bare.x_train) and named.info["labels"] == ["setosa", "versicolor", "virginica"]
    np.savez(tmp_path / "t.npz", x=bare.x_train.numpy(), y=bare.y_train.numpy())
    arrays = load_table(tmp_path / "t.npz", task="classification", test_fraction=0.5)
    assert len(arrays.x_train) + len(arrays.x_test) == len(bare.x_train)


@pytest.mark.parametrize(
    "content, options, message",
    [
        (
            "a,b,y\n1,2,3\n4,5,6\n",
            ["--data.target", "z"],
            "has no column 'z'; its columns (cells separated by ','): a, b, y",
        ),
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


def _body(n=60):
    g = np.random.default_rng(0)
    x = g.normal(size=(n, 3)).round(3)
    return x, (x @ [1.0, 2.0, 3.0] + 0.1 * g.normal(size=n)).round(3)


def _table(separator=",", decimal="."):
    x, y = _body()
    rows = [separator.join(f"{v:.3f}".replace(".", decimal) for v in [*r, t]) for r, t in zip(x, y, strict=True)]
    return "\n".join([separator.join(["a", "b", "c", "price"]), *rows]) + "\n"


@pytest.mark.parametrize(
    "name, content",
    [
        ("utf-8 with a byte-order mark", codecs.BOM_UTF8 + _table().encode()),
        ("utf-16", _table().encode("utf-16")),
        ("';' and decimal commas", _table(";", ",").encode()),
        ("tabs", _table("\t").encode()),
        ("';' and decimal points", _table(";").encode()),
    ],
)
def test_what_a_spreadsheet_writes_reads_as_the_plain_csv(tmp_path, name, content):
    plain = load_table(_write(tmp_path / "plain.csv", _table().encode()), target="price")
    other = load_table(_write(tmp_path / "other.csv", content), target="price")
    assert torch.equal(other.x_train, plain.x_train) and torch.equal(other.y_test, plain.y_test), name


def _write(path, content: bytes):
    path.write_bytes(content)
    return path


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_an_npz_of_columns_takes_its_target_by_name_as_a_csv_does(tmp_path):
    x, y = _body()
    csv = load_table(_write(tmp_path / "t.csv", _table().encode()), target="b")
    columns = load_table(_npz(tmp_path / "c.npz", a=x[:, 0], b=x[:, 1], c=x[:, 2], price=y), target="b")
    assert torch.equal(columns.y_train, csv.y_train) and torch.equal(columns.x_test, csv.x_test)
    default = load_table(_npz(tmp_path / "xy.npz", x=x, y=y))
    assert torch.equal(default.y_train, load_table(_npz(tmp_path / "xy2.npz", x=x, y=y), target="y").y_train)


CASES = {
    "a repeated column name": (
        "t.csv",
        b"price,b,c,price\n1,2,3,4\n5,6,7,8\n9,1,2,3\n",
        ["--data.target", "price"],
        "column names repeat ('price' is columns 0, 3)",
    ),
    "a binary file": ("t.csv", bytes(range(256)) * 8, [], "is not a text table (it holds NUL bytes"),
    "a file of NULs": ("t.csv", b"\0" * 4096, [], "is not a text table (it holds NUL bytes"),
    "latin-1 text": ("t.csv", "größe,y\n1,2\n3,4\n5,6\n".encode("latin-1"), [], "is not UTF-8 text (byte 2"),
    "a file that is no .npz": ("t.npz", b"not a zip", [], "is not an .npz file (a zip of arrays)"),
    "';' cells and a missing column": (
        "t.csv",
        b"a;b;y\n1;2;3\n4;5;6\n",
        ["--data.target", "price"],
        "has no column 'price'; its columns (cells separated by ';'): a, b, y",
    ),
    "a quantity taken for classes": (
        "t.csv",
        _table().encode(),
        ["--data.target", "price", "--data.task", "classification"],
        "holds fractional numbers",
    ),
    "a class per row": (
        "t.csv",
        ("a,y\n" + "".join(f"{i / 7:.3f},{i}\n" for i in range(30))).encode(),
        ["--data.task", "classification"],
        "has 30 classes in 30 rows, fewer than 3 rows a class",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_file_that_is_not_a_table_is_refused_in_one_line(tmp_path, capsys, case):
    name, content, options, message = CASES[case]
    table = _write(tmp_path / name, content)
    code = main(["fit", "--data", "csv", "--data.path", str(table), *options, *QUICK, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_npz_of_objects_or_a_named_target_beside_x_and_y_is_refused_in_one_line(tmp_path, capsys):
    x, y = _body()
    cases = {
        _npz(tmp_path / "o.npz", x=np.array([[1, "a"]], dtype=object), y=np.ones(1)): "holds Python objects",
        _npz(tmp_path / "xy.npz", x=x, y=y): "holds x and y, so y is its target; --data.target price names",
    }
    for path, message in cases.items():
        argv = ["fit", "--data", "csv", "--data.path", str(path), "--data.target", "price", *QUICK, "--out", "o"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_table_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from bnn_zoo.data import tables

    monkeypatch.setattr(tables, "MAX_CSV_BYTES", 2**20)
    big = _write(tmp_path / "big.csv", b"0," * 2**20)
    monkeypatch.setattr(tables.Path, "read_bytes", lambda self: pytest.fail("read before the size check"))
    with pytest.raises(bz.BnnZooError, match=r"is 2 MiB, over the 1 MiB a CSV may be; save a larger table as an .npz"):
        load_table(big)


HALF = """

class Half(Residual):
    def __init__(self, in_features, out_features, width=8):
        super().__init__(in_features, out_features, width)
        self.in_features, self.out_features = in_features, out_features  # declared widths are checked too

    def forward(self, x):
        return super().forward(x)[: len(x) // 2]
"""


def test_your_network_from_a_path_with_spaces_and_one_of_the_wrong_shape_refused_before_scoring(tmp_path, capsys):
    folder = tmp_path / "my nets"
    folder.mkdir()
    (folder / "my net.py").write_text(NET + HALF)
    assert main(["fit", "--model", f"{folder / 'my net.py'}:Residual", *QUICK, "--out", str(tmp_path / "r")]) == 0
    assert main(["fit", "--model", f"{folder / 'my net.py'}:Half", *QUICK, "--out", str(tmp_path / "h")]) == 2
    err = capsys.readouterr().err
    assert "the network my_net.Half returns shape (1, 1) for 2 input rows; it must return (2, 1)" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "h" / "metrics.json").exists()


@pytest.mark.parametrize("seed", range(8))
def test_held_out_variants_read_as_the_plain_table_or_are_refused_in_one_line(tmp_path, seed):
    """Variants no test above writes by hand, drawn by seed: separator, decimal mark, encoding and quoted
    header cells; a repeated name (spaces around it ignored) at random columns; a NUL at a random place."""
    import random

    rng = random.Random(seed)
    separator = rng.choice([",", ";", "\t"])
    decimal = "," if separator == ";" and rng.random() < 0.5 else "."
    names = [f'"{n}"' if rng.random() < 0.5 else n for n in ("a", "b", "c", "price")]
    x, y = _body()
    rows = [separator.join(f"{v:.3f}".replace(".", decimal) for v in [*r, t]) for r, t in zip(x, y, strict=True)]
    text = "\n".join([separator.join(names), *rows]) + "\n"
    bom, encoding = rng.choice([(b"", "utf-8"), (codecs.BOM_UTF8, "utf-8"), (b"", "utf-16")])
    plain = load_table(_write(tmp_path / "plain.csv", _table().encode()), target="price")
    variant = load_table(_write(tmp_path / "v.csv", bom + text.encode(encoding)), target="price")
    assert torch.equal(variant.x_train, plain.x_train) and torch.equal(variant.y_test, plain.y_test)
    i, j = rng.sample(range(4), 2)
    repeated = [" b " if k in (i, j) else n for k, n in enumerate(["a", "c", "d", "price"])]
    header = separator.join(repeated)
    with pytest.raises(bz.BnnZooError, match=rf"column names repeat \('b' is columns {min(i, j)}, {max(i, j)}\)"):
        load_table(_write(tmp_path / "d.csv", "\n".join([header, *rows]).encode(encoding)), target="-1")
    data = bytearray(_table().encode())
    data[rng.randrange(len(data))] = 0
    with pytest.raises(bz.BnnZooError, match="is not a text table"):
        load_table(_write(tmp_path / "b.csv", bytes(data)))
