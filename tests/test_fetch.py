"""``bnn-zoo data uci NAME`` against a local copy of Gal's layout (a file:// URL; never the network)."""

import numpy as np
import pytest

import bnn_zoo as bz
from bnn_zoo.cli import main
from bnn_zoo.data.fetch import SETTINGS, fetch_uci
from bnn_zoo.errors import BnnZooError


@pytest.fixture
def mirror(tmp_path):
    """Gal's UCI_Datasets/yacht/data/ layout, small: 60 rows, 3 inputs, 2 splits of 48 + 12."""
    folder = tmp_path / "mirror" / "yacht" / "data"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savetxt(folder / "data.txt", np.column_stack([rng.normal(size=(60, 3)), rng.normal(size=60)]))
    settings = {"index_features": "0\n1\n2", "index_target": "3", "n_splits": "2", "n_hidden": "50",
                "n_epochs": "40", "dropout_rates": "0.005\n0.01", "tau_values": "0.25\n0.5"}  # fmt: skip
    assert set(settings) == set(SETTINGS)
    for name, text in settings.items():
        (folder / f"{name}.txt").write_text(text + "\n")
    for k in range(2):
        order = rng.permutation(60)
        np.savetxt(folder / f"index_train_{k}.txt", order[:48], fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", order[48:], fmt="%d")
    return tmp_path / "mirror"


def test_a_fetched_folder_is_the_source_and_loads_every_split(mirror, tmp_path):
    folder = fetch_uci("yacht", tmp_path / "data", source=mirror.as_uri())
    assert folder == tmp_path / "data" / "yacht"
    for k in range(2):
        split = bz.data.load_uci(folder, split=k)
        assert split.x_train.shape == (48, 3) and split.x_test.shape == (12, 3)
        x_test = np.loadtxt(mirror / "yacht/data/data.txt")[
            np.loadtxt(mirror / f"yacht/data/index_test_{k}.txt", dtype=int)
        ]
        np.testing.assert_allclose(split.x_test.numpy(), x_test[:, :3], rtol=1e-6)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["yacht"]


def test_a_bad_split_is_refused_and_nothing_is_left(mirror, tmp_path):
    (mirror / "yacht/data/index_test_1.txt").write_text("0\n1\n2\n")  # test rows that are training rows
    with pytest.raises(BnnZooError, match="test rows"):
        fetch_uci("yacht", tmp_path / "data", source=mirror.as_uri())
    assert list((tmp_path / "data").iterdir()) == []


def test_the_command_fetches_or_says_in_one_line_why_not(mirror, tmp_path, capsys):
    assert main(["data", "uci", "yacht", "--source", mirror.as_uri(), "--out", str(tmp_path / "d")]) == 0
    assert "--data uci --data.path" in capsys.readouterr().out
    for argv, says in [
        (["data", "uci", "yacht", "--source", mirror.as_uri(), "--out", str(tmp_path / "d")], "exists"),
        (["data", "uci", "mnist", "--out", str(tmp_path / "e")], "unknown UCI dataset 'mnist'; choose one of"),
        (["data", "uci", "energy", "--source", mirror.as_uri(), "--out", str(tmp_path / "e")], "could not fetch"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
