"""The help of the argparse commands shows the library's defaults: each option's default is the
library function's own (``bnn-zoo fit``'s options are checked in test_options.py)."""

import inspect
import re

import pytest

from bnn_zoo import cli
from bnn_zoo.experiments import protocols
from bnn_zoo.experiments.demo import demo


def _actions(command: str) -> dict:
    sub = next(a for a in cli.command_parser()._actions if a.dest == "command").choices[command]
    return {a.dest: a for a in sub._actions}


def _defaults(function) -> dict:
    return {k: p.default for k, p in inspect.signature(function).parameters.items()}


@pytest.mark.parametrize(
    "command, function, names",
    [
        ("demo", demo, {"out": "out_dir", "svi_steps": "svi_steps", "num_warmup": "num_warmup",
                        "num_samples": "num_samples", "num_chains": "num_chains", "seed": "seed"}),
        ("reference", protocols.reference, {"sampler": "sampler", "num_chains": "chains", "num_warmup": "warmup",
                                            "num_samples": "samples"}),
    ],
)  # fmt: skip
def test_a_commands_defaults_are_the_library_functions(command, function, names):
    actions, library = _actions(command), _defaults(function)
    assert {option: actions[option].default for option in names} == {o: library[p] for o, p in names.items()}


def test_the_protocols_defaults_in_the_help_are_the_protocols():
    assert cli.PROTOCOL_DEFAULTS == {
        "adversarial": _defaults(protocols.deep_ensembles)["adversarial"],
        "mc_passes": _defaults(protocols.uci_gal)["mc_passes"],
        "deep_ensembles_epochs": protocols.DEEP_ENSEMBLES_EPOCHS,
    }
    reproduce = next(a for a in cli.command_parser()._actions if a.dest == "command").choices["reproduce"]
    described = re.search(r"Adam \(lr ([\d.]+), batch (\d+), (\d+) epochs\)", reproduce.description)
    assert described, "reproduce --help describes deep-ensembles' optimiser"
    lr, batch, epochs = described.groups()
    assert float(lr) == _defaults(protocols.deep_ensembles)["lr"] and int(epochs) == protocols.DEEP_ENSEMBLES_EPOCHS
    assert f"batch_size={batch}" in inspect.getsource(protocols.deep_ensembles).replace(" ", "")


def test_every_help_that_names_a_default_shows_the_options_own():
    """An option whose help says "default" shows the value argparse will use (its %(default)s)."""
    for command, sub in next(a for a in cli.command_parser()._actions if a.dest == "command").choices.items():
        for action in sub._actions:
            if action.default not in (None, False, [], "==SUPPRESS==") and "default" in (action.help or ""):
                assert "%(default)s" in action.help, (command, action.dest, action.help)
