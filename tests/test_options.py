"""One home per option: the command line's methods, guides, priors and dense and convolutional models are
the library's classes, and the same run from Python and from `bnn-zoo fit` gives the same numbers."""

import contextlib
import dataclasses
import inspect
import io
import json
import re

import docstring_parser
import pyro
import pytest

import bnn_zoo as bz
from bnn_zoo import baselines, data, guides, inference, likelihoods, priors
from bnn_zoo.data import tables, text
from bnn_zoo.experiments import config

LIBRARY = {  # (kind, command-line name) -> the library callables whose parameters are its options
    **{
        ("inference", name): (getattr(inference, cls),)
        for name, cls in [("svi", "SVI"), ("nuts", "NUTS"), ("hmc", "HMC"), ("chees", "ChEES")]
    },
    **{("inference", kind): (inference.SGMCMC,) for kind in ("sgld", "sghmc", "cyclical")},
    ("inference", "laplace"): (inference.Laplace,),
    ("inference", "ensemble"): (inference.Ensemble,),
    ("inference", "swag"): (inference.SWAG,),
    ("inference", "gp"): (baselines.GP, baselines.TypeII),
    **{("guide", name): (guides.GUIDES[name],) for name in ("mean-field", "matrix-normal", "flow", "dropout")},
    ("prior", "fanin"): (priors.FanInNormal,),
    ("prior", "normal"): (priors.Normal,),
    ("prior", "scale-mixture"): (priors.ScaleMixture,),
    ("prior", "gal-keras"): (priors.Normal.gal_keras,),
    ("model", "mlp"): (bz.models.MLP,),
    ("model", "cnn"): (bz.models.LeNet,),
    **{("model", name): (bz.models.TextRNN,) for name in ("lstm-tied", "lstm-untied", "embedding-rnn")},
    ("likelihood", "gaussian"): (likelihoods.Gaussian.fixed_or_learned,),
    ("likelihood", "heteroscedastic"): (likelihoods.Heteroscedastic,),
    ("data", "toy-cubic"): (data.toy_cubic,),
    ("data", "digits"): (data.digits,),
    ("data", "toy-text"): (text.load_toy_text,),
    ("data", "uci"): (data.load_uci,),
    ("data", "text"): (text.load_text,),
    ("data", "csv"): (tables.load_table,),
}


def test_every_choice_with_options_is_checked_against_the_library():
    """A new registered data set, model, prior, likelihood, guide or method cannot skip the check below."""
    with_options = {
        (k, n) for k, names in config.REGISTRY.items() for n, cls in names.items() if dataclasses.fields(cls)
    }
    assert with_options == set(LIBRARY)


def _words(text: str) -> str:
    return "".join(text.split())  # the help wraps lines, and breaks words at hyphens


def _library_docs(target) -> dict[str, str]:
    """Each parameter's help in the library's own docstrings (HMC's shared ones are NUTS's)."""
    docs = {}
    for source in [*getattr(target, "__mro__", [target]), inference.NUTS]:
        for p in docstring_parser.parse(inspect.getdoc(source) or "").params:
            docs.setdefault(p.arg_name, _words(p.description))
    return docs


def _help(kind: str, name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        config.parser().parse_args(config.resolve_names([f"--{kind}.help", name]))
    return _words(out.getvalue())


@pytest.mark.parametrize("kind, name", sorted(LIBRARY), ids=lambda v: str(v))
def test_every_option_is_a_library_parameter_with_its_default_and_help(kind, name):
    """Each `bnn-zoo fit --KIND NAME` option is a parameter of the library class, with that class's
    default and its docstring's help text, as the command line's --help shows them."""
    targets = LIBRARY[kind, name]
    params = {n: p for t in targets for n, p in inspect.signature(t).parameters.items()}
    docs = {n: d for t in targets for n, d in _library_docs(t).items()}
    help_text = _help(kind, name)
    options = dataclasses.fields(config.REGISTRY[kind][name])
    assert options, f"{kind} {name} has no options"
    for option in options:
        assert option.name in params, f"--{kind}.{option.name} is not a parameter of {targets}"
        default = option.default if option.default is not dataclasses.MISSING else option.default_factory()
        library_default = params[option.name].default
        if library_default is inspect.Parameter.empty:  # required of the user (a data path): "" until given
            library_default = ""
        same = [list(v) if isinstance(v, tuple) else v for v in (default, library_default)]
        assert same[0] == same[1], option.name  # a command line gives lists where the library has tuples
        assert docs.get(option.name), f"{targets} does not document {option.name}"
        assert docs[option.name] in help_text, f"--{kind}.{option.name}'s help is not the library's"
    assert not re.search(r"--\w+\.(?!help)\w+", help_text.replace(f"--{kind}.", "")), (
        "an option of another kind leaked in"
    )


@pytest.mark.parametrize("name", sorted(config.REGISTRY["inference"]))
def test_a_method_chosen_on_the_command_line_keeps_its_own_defaults(name):
    """jsonargparse carries the default kind's values (SVI's) to the kind chosen instead wherever a name
    matches (jsonargparse issue #460): `--inference ensemble` had SVI's validation 0 and checkpoint_every."""
    from bnn_zoo.cli import fit_parser

    parser = fit_parser()
    built = config.from_argv(parser, ["--inference", name, "--out", "-"])
    assert built.inference == config.REGISTRY["inference"][name]()
    if not hasattr(built.inference, "max_hours"):  # Laplace and the GP
        return
    chosen = config.from_argv(parser, ["--inference", name, "--inference.max_hours", "0.5", "--out", "-"])
    assert chosen.inference == dataclasses.replace(config.REGISTRY["inference"][name](), max_hours=0.5)


# the dropout guide's door is the same code path (tests/test_one_truth.py holds every number): slow lane
@pytest.mark.parametrize("guide", [None, pytest.param("dropout", marks=pytest.mark.slow)])
def test_the_same_run_from_python_and_from_the_command_line_gives_the_same_metrics(tmp_path, guide):
    """`bnn-zoo fit` with every default against bz.fit with every default on the same data and model; the
    dropout guide's too (p learned, under the fan-in prior the README's Python example uses)."""
    from bnn_zoo.cli import main

    out = tmp_path / "run"
    chosen = ["--guide", guide] if guide else []
    quiet = ["--quiet", "--evaluation.plots", "false", "--evaluation.training_evidence", "false"]
    main(["fit", "--out", str(out), *chosen, *quiet])
    cli = json.loads((out / "metrics.json").read_text())

    data = bz.data.toy_cubic(20, seed=0)
    net = bz.models.MLP(1, [50], 1, "tanh")
    model = bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Gaussian.from_precision(1 / 9))
    posterior = bz.fit(model, data.x_train, data.y_train, bz.SVI(guide=guide, progress=False))  # the data's units
    pyro.set_rng_seed(0)  # as the command line does before it scores a fit
    metrics = bz.evaluation.regression_metrics(posterior.predict(data.x_test), data.y_test[:, None])
    for key in ("rmse", "test_log_likelihood"):  # the same fit: only the units' rounding differs
        assert metrics[key] == pytest.approx(cli[key], rel=1e-5), key
