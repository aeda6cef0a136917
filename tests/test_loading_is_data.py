"""A file bnn-zoo reads is data: posterior.json, a run config given to ``fit --config``, a sweep file
and state.pt may name only allow-listed classes, and one naming anything else is refused before
anything is imported or constructed, leaving every file as it was."""

import json
import sys

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.cli import main
from bnn_zoo.experiments.sweep import Sweep

# classes whose construction would act on the file system or run code, and a user's own module
OUTSIDE = [
    ("torch.package", "PackageExporter"),
    ("torch.utils.data", "DataLoader"),
    ("os", "system"),
    ("evil_user_module", "Net"),
]


@pytest.fixture
def victim(tmp_path):
    """A file of the user's that a crafted file points at; every test checks it is untouched."""
    path = tmp_path / "precious.txt"
    path.write_bytes(b"x" * 1900)
    return path


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module whose import leaves a mark: importing it at all is a failure."""
    mark = tmp_path / "imported.txt"
    (tmp_path / "evil_user_module.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('imported')\nclass Net: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield mark
    sys.modules.pop("evil_user_module", None)


def _untouched(victim, mark):
    assert victim.read_bytes() == b"x" * 1900 and not mark.exists()
    assert "evil_user_module" not in sys.modules


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    x, y = torch.randn(12, 2), torch.randn(12)
    model = bz.BNN(bz.models.MLP(2, [3], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    folder = tmp_path_factory.mktemp("saved") / "fit"
    bz.fit(model, x, y, bz.SVI(steps=2, num_draws=2, progress=False)).save(folder)
    return folder


def _crafted(saved, tmp_path, edit):
    """A copy of the saved folder whose posterior.json header ``edit`` changes in place."""
    crafted = tmp_path / "crafted"
    crafted.mkdir()
    for f in saved.iterdir():
        (crafted / f.name).write_bytes(f.read_bytes())
    header = json.loads((saved / "posterior.json").read_text())
    edit(header)
    (crafted / "posterior.json").write_text(json.dumps(header))
    return crafted


@pytest.mark.parametrize("module, name", OUTSIDE)
def test_a_posterior_naming_an_outside_class_is_refused(saved, tmp_path, victim, user_module, module, name):
    # nested deep inside the description: refused before the outer, allowed classes are built
    outside = {"class": f"{module}:{name}", "args": {"f": str(victim)}}
    crafted = _crafted(saved, tmp_path, lambda h: h["model"]["args"]["net"]["args"].update(activation=outside))
    with pytest.raises(bz.BnnZooError, match=f"{module}:{name} is not a class bnn-zoo rebuilds from a file") as info:
        bz.load(crafted)
    assert "\n" not in str(info.value)
    _untouched(victim, user_module)


def test_a_saved_guide_class_outside_the_allow_list_is_refused(saved, tmp_path, victim, user_module):
    crafted = _crafted(
        saved, tmp_path, lambda h: h["settings"].update(guide="evil_user_module:Net", guide_source="class")
    )
    with pytest.raises(bz.BnnZooError, match="evil_user_module:Net is not a class bnn-zoo rebuilds"):
        bz.load(crafted)
    _untouched(victim, user_module)


def test_a_state_file_holding_a_pickled_object_is_refused(saved, tmp_path, victim, user_module):
    crafted = _crafted(saved, tmp_path, lambda header: None)
    torch.save({"x": torch.nn.Linear(1, 1)}, crafted / "state.pt")  # a module: only a full unpickle restores it
    with pytest.raises(bz.BnnZooError, match="posterior state .* is unreadable"):
        bz.load(crafted)
    _untouched(victim, user_module)


@pytest.mark.parametrize("module, name", OUTSIDE)
def test_a_run_config_naming_an_outside_class_is_refused(tmp_path, victim, user_module, capsys, module, name):
    config = tmp_path / "config.yaml"
    config.write_text(
        f"model: {{class_path: {module}.{name}, init_args: {{f: {victim}}}}}\n"
        "inference: {class_path: SVI, init_args: {steps: 2}}\n"
    )
    assert main(["fit", "--config", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"names the class {module}.{name}, which is not one of bnn-zoo's" in err and "\n" not in err
    assert f"--model {module}:{name}" in err and not (tmp_path / "out").exists()
    _untouched(victim, user_module)


def test_a_nested_class_path_and_a_kind_given_by_path_are_refused_too(tmp_path, victim, user_module, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("inference: {class_path: SVI, init_args: {init: {class_path: os.system}}}\n")
    assert main(["fit", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "names the class os.system" in capsys.readouterr().err
    config.write_text("guide: evil_user_module:Net\n")
    assert main(["fit", "--config", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "names the class evil_user_module.Net" in capsys.readouterr().err
    _untouched(victim, user_module)


@pytest.mark.parametrize("module, name", OUTSIDE)
def test_a_sweep_file_naming_an_outside_class_is_refused(tmp_path, victim, user_module, capsys, module, name):
    base = tmp_path / "base.yaml"
    base.write_text(f"model: {{class_path: {module}.{name}, init_args: {{f: {victim}}}}}\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: base.yaml\ngrid: {seed: [0, 1]}\n")  # the class in a base file it names
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"names the class {module}.{name}" in err and f"--trust {module}:{name}" in err and "\n" not in err
    sweep.write_text(f"base: {{}}\ngrid: {{model: [mlp, {module}:{name}]}}\n")  # or in an axis
    with pytest.raises(bz.BnnZooError, match=f"names the class {module}.{name}"):
        Sweep.from_file(sweep)
    assert not (tmp_path / "out" / "cells").exists()
    _untouched(victim, user_module)


def test_your_own_network_runs_when_the_command_line_names_it(tmp_path, monkeypatch):
    """A result folder's config.yaml of a user network re-runs when --model names that class (trusted),
    keeping the file's options for it; a sweep takes it with --trust."""
    (tmp_path / "mynet.py").write_text(
        "import torch\n\n\nclass Net(torch.nn.Module):\n"
        "    def __init__(self, in_features: int, out_features: int, width: int = 3):\n        super().__init__()\n"
        "        self.layer = torch.nn.Linear(in_features, width)\n"
        "        self.out = torch.nn.Linear(width, out_features)\n\n"
        "    def forward(self, x):\n        return self.out(torch.tanh(self.layer(x)))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = ["--inference.steps", "5", "--quiet"]
    first = tmp_path / "first"
    assert main(["fit", "--model", "mynet:Net", "--model.width", "5", "--out", str(first), *steps]) == 0
    again = tmp_path / "again"
    assert main(["fit", "--config", str(first / "config.yaml"), "--model", "mynet:Net", "--out", str(again)]) == 0
    assert "width: 5" in (again / "config.yaml").read_text()
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: {model: mynet:Net, inference: {class_path: SVI, init_args: {steps: 3}}}\n")
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "s"), "--trust", "mynet:Net", "--quiet"]) == 0
