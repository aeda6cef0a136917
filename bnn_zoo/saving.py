"""Saved posteriors: ``posterior.save(DIR)`` and ``bnn_zoo.load(DIR)``.

A posterior folder holds three files, each written atomically:

- ``posterior.json``: what the posterior is: its kind (``bnn``, ``gp``), the resolved description of
  the model (classes and constructor arguments, nested), the method's settings and the fit's info;
- ``state.pt``: tensors only (training data, stored draws, sample stats, the guide's or GP's
  state_dict, point estimates), read back with ``torch.load(weights_only=True)``: never unpickled;
- ``posterior.nc``: the ArviZ InferenceData.

Descriptions name classes as ``module:QualName`` with the constructor arguments read back from the
object's attributes of the same name (the convention every bnn-zoo class follows). Loading rebuilds
only the classes of :func:`constructible` (an explicit allow-list: bnn-zoo's models, priors,
likelihoods, BNN and GP, plain torch layers, Pyro's distributions and autoguides), looked up by name
without importing anything the file names; anything else (a user's own network) is passed in:
``bnn_zoo.load(DIR, model=BNN(MyNet(...), ...))``. Pickle would restore any object, but loading a
pickle runs arbitrary code, which a result folder from someone else must never do.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bnn_zoo.errors import BnnZooError
from bnn_zoo.io import atomic_torch_save, read_json_mapping, safe_torch_load, save_inference_data, write_json
from bnn_zoo.version import __version__

FORMAT = "bnn-zoo-posterior"
VERSION = 1
HEADER, STATE, IDATA = "posterior.json", "state.pt", "posterior.nc"

Loader = Callable[..., Any]
_LOADERS: dict[str, Loader] = {}
# the module whose import registers each kind's loader: `import bnn_zoo` is lazy, so a fresh process
# that only calls bnn_zoo.load has imported none of them yet
_LOADER_HOMES = {"bnn": "bnn_zoo.posterior", "laplace": "bnn_zoo.inference.laplace", "gp": "bnn_zoo.baselines.gp"}


class NotDescribable(Exception):
    """An object whose constructor arguments cannot be read back from its attributes."""


def register_loader(kind: str) -> Callable[[Loader], Loader]:
    """Register ``loader(header, state, model=..., guide=...)`` for posterior folders of ``kind``."""

    def decorate(loader: Loader) -> Loader:
        _LOADERS[kind] = loader
        return loader

    return decorate


def describe(obj: Any) -> Any:
    """A JSON description of ``obj``: plain values as they are, tensors as nested lists, and objects as
    ``{"class": "module:QualName", "args": {...}}`` from the attributes named like the constructor's
    arguments (optional arguments without such an attribute keep their defaults). A parameter-valued
    attribute (``nn.Linear.bias``) is recorded as present (``True``): its value lives in the state.
    Raises :class:`NotDescribable` when a required argument has no attribute."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple, torch.Size)):
        return [describe(v) for v in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise NotDescribable(f"a dict with non-string keys: {list(obj)}")
        return {"dict": {k: describe(v) for k, v in obj.items()}}
    if isinstance(obj, torch.nn.Parameter):
        return True
    if isinstance(obj, torch.Tensor):
        return {"tensor": obj.tolist(), "dtype": str(obj.dtype).removeprefix("torch.")}
    cls = type(obj)
    args = {}
    for name, p in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or name == "validate_args":
            continue
        if hasattr(obj, name):
            args[name] = describe(getattr(obj, name))
        elif p.default is p.empty:
            raise NotDescribable(f"{cls.__qualname__} keeps no attribute for its argument {name!r}")
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "args": args}


def rebuild(desc: Any) -> Any:
    """The object a :func:`describe` output stands for; classes only from trusted packages."""
    if isinstance(desc, list):
        return [rebuild(v) for v in desc]
    if not isinstance(desc, dict):
        return desc
    if "tensor" in desc:
        dtype = getattr(torch, str(desc.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise NotDescribable(f"{desc.get('dtype')!r} is not a torch dtype")
        return torch.tensor(desc["tensor"], dtype=dtype)
    if "dict" in desc and isinstance(desc["dict"], dict):
        return {k: rebuild(v) for k, v in desc["dict"].items()}
    cls, args = resolve_class(desc.get("class")), desc.get("args")
    if not isinstance(args, dict):
        raise NotDescribable(f"the arguments of {desc.get('class')} are not a mapping")
    return cls(**{k: rebuild(v) for k, v in args.items()})


def resolve_class(path: str) -> type:
    """The class named ``module:QualName`` if :func:`constructible` lists it; nothing is imported by name."""
    cls = constructible().get(path) if isinstance(path, str) else None
    if cls is None:
        raise NotDescribable(
            f"{path} is not a class bnn-zoo rebuilds from a file (its models, priors, likelihoods, plain torch layers, "
            "Pyro distributions and autoguides)"
        )
    return cls


# torch.nn's parameter-free and plain layers a network description may name (bnn-zoo's own models build theirs)
PLAIN_LAYERS = (
    "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "LSTM", "GRU", "RNN", "LayerNorm",
    "BatchNorm1d", "BatchNorm2d", "Dropout", "Flatten", "Identity", "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d",
    "ReLU", "Tanh", "Sigmoid", "GELU", "SiLU", "ELU", "LeakyReLU", "Softplus", "Softmax", "LogSoftmax",
)  # fmt: skip
DISTRIBUTIONS = (
    "Normal", "HalfNormal", "LogNormal", "StudentT", "Laplace", "Cauchy", "HalfCauchy", "Gamma", "InverseGamma",
    "Exponential", "Uniform", "Beta", "Delta",
)  # fmt: skip
AUTOGUIDES = (
    "AutoNormal", "AutoDiagonalNormal", "AutoMultivariateNormal", "AutoLowRankMultivariateNormal", "AutoDelta",
    "AutoLaplaceApproximation", "AutoIAFNormal", "AutoStructured",
)  # fmt: skip


@functools.cache
def constructible() -> dict[str, type]:
    """Every class a file may make bnn-zoo construct, by ``module:QualName``: the allow-list of
    :func:`rebuild` and of a saved guide's class."""
    import pyro.distributions as dist
    import pyro.infer.autoguide as autoguide

    from bnn_zoo import likelihoods, models, priors
    from bnn_zoo.bnn import BNN
    from bnn_zoo.models.mlp import Dense

    own = [BNN, Dense, models.MLP, models.LeNet, models.LSTM, models.Embedding, models.TextRNN]
    own += [priors.Normal, priors.FanInNormal, priors.ScaleMixture, priors.PerSite]
    own += [likelihoods.Gaussian, likelihoods.Heteroscedastic, likelihoods.Bernoulli, likelihoods.Categorical]
    own += [likelihoods.Tokens]
    plain = [getattr(torch.nn, n) for n in PLAIN_LAYERS] + [getattr(dist, n) for n in DISTRIBUTIONS]
    plain += [getattr(autoguide, n) for n in AUTOGUIDES]
    return {f"{c.__module__}:{c.__qualname__}": c for c in own + plain + _ALLOWED_ABOVE}


_ALLOWED_ABOVE: list[type] = []  # classes of higher layers (the GP), added by their modules, which load() imports


def allow(cls: type) -> type:
    """Add a class of a module above this one to :func:`constructible` (called where it is defined)."""
    _ALLOWED_ABOVE.append(cls)
    constructible.cache_clear()
    return cls


def write(path: str | Path, kind: str, header: dict, state: dict, idata=None) -> Path:
    """Write a posterior folder (see the module docstring); returns its path."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BnnZooError(f"{path} is a file; give a folder to save the posterior in")
    path.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(state, path / STATE)
    if idata is not None:
        save_inference_data(idata, path / IDATA)
    write_json(
        {"format": FORMAT, "version": VERSION, "kind": kind, "bnn_zoo_version": __version__, **header}, path / HEADER
    )
    return path


def load(path: str | Path, model: Any = None, guide: Any = None):
    """Load a posterior saved by ``posterior.save(DIR)`` or written by ``bnn-zoo fit --out DIR``.

    Args:
        path: the folder.
        model: the model, when its description cannot be rebuilt (a network class from outside
            bnn-zoo); it must be built as the saved one was.
        guide: the guide, when it was an instance or function given by the user (a fresh one, built
            the same way); without it such a posterior keeps its stored draws but no guide.

    Returns:
        PosteriorLike: a posterior that predicts exactly what the saved one did.

    Raises:
        BnnZooError: the folder is missing, is not a bnn-zoo posterior, or is corrupt.
    """
    path = Path(path)
    header_file = path / HEADER
    if not path.is_dir():
        raise BnnZooError(
            f"{path} is not a folder; give a folder written by posterior.save(DIR) or bnn-zoo fit --out DIR"
        )
    if not header_file.is_file():
        raise BnnZooError(
            f"{path} has no {HEADER}: it is not a saved bnn-zoo posterior (save one with posterior.save(DIR))"
        )
    try:
        header = json.loads(header_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BnnZooError(
            f"{header_file} is unreadable ({type(exc).__name__}); the folder is corrupt, save the posterior again"
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BnnZooError(f"{header_file} is not a bnn-zoo posterior header")
    if header.get("kind") in _LOADER_HOMES:
        importlib.import_module(_LOADER_HOMES[header["kind"]])
    if header.get("version") != VERSION or header.get("kind") not in _LOADERS:
        raise BnnZooError(
            f"{path} holds a {header.get('kind')!r} posterior of format version {header.get('version')}, "
            f"which this bnn-zoo ({', '.join(sorted(_LOADER_HOMES))}, version {VERSION}) cannot read"
        )
    state = safe_torch_load(path / STATE, what="posterior state")
    _warn_if_fitted_standardised_without_its_scaling(path, state)
    try:
        return _LOADERS[header["kind"]](header, state, model=model, guide=guide)
    except NotDescribable as exc:
        raise BnnZooError(f"{path} cannot be loaded: {exc}") from None
    except BnnZooError:
        raise
    except (KeyError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
        raise BnnZooError(
            f"{path} does not match its description ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); the folder is corrupt or was saved for another model"
        ) from None


def _warn_if_fitted_standardised_without_its_scaling(path: Path, state: dict) -> None:
    """A regression folder of ``bnn-zoo fit`` from before folders stored their scaling (metrics.json says
    no units) was fitted on standardised data: say so, rather than predict in the wrong units silently."""
    metrics = read_json_mapping(path / "metrics.json")
    if state.get("scaling") is None and metrics is not None and "rmse" in metrics and "units" not in metrics:
        warnings.warn(
            f"{path} was written by bnn-zoo fit before result folders stored their scaling: the loaded posterior "
            "takes and gives standardised inputs and targets, not the data's units; re-run it with "
            f"bnn-zoo fit --config {path / 'config.yaml'}",
            stacklevel=3,
        )


def rebuild_model(header: dict, model: Any) -> Any:
    """The model from the header's description, or ``model`` when given (checked against it)."""
    if model is not None:
        given, saved = describe_or_none(model), header.get("model")
        if given not in (None, saved):
            raise BnnZooError(f"the model passed to load() is not the one that was saved: {_difference(given, saved)}")
        return model
    if header.get("model") is None:
        raise BnnZooError(
            f"this posterior's model could not be described when saved ({header.get('model_note', 'unknown')}); "
            "pass it: bnn_zoo.load(DIR, model=...) built as the saved one was"
        )
    try:
        for name in _class_names(header["model"]):  # every class checked before any is constructed
            resolve_class(name)
        return rebuild(header["model"])
    except NotDescribable as exc:
        raise BnnZooError(
            f"the saved model cannot be rebuilt here ({exc}); pass it: bnn_zoo.load(DIR, model=...)"
        ) from None


def _difference(given: Any, saved: Any, where: str = "model") -> str:
    """Where two descriptions first differ, as ``model.net.hidden: [50] given, [10] saved``."""
    if isinstance(given, dict) and isinstance(saved, dict) and given.get("class") == saved.get("class"):
        given, saved = given.get("args", given), saved.get("args", saved)
        for key in sorted(set(given) | set(saved)):
            if given.get(key) != saved.get(key):
                return _difference(given.get(key), saved.get(key), f"{where}.{key}")
    if isinstance(given, dict) and isinstance(saved, dict) and "class" in given and "class" in saved:
        return f"{where} is a {given['class']}, the saved one a {saved['class']}"
    return f"{where}: {_short(given)} given, {_short(saved)} saved"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _class_names(desc: Any):
    if isinstance(desc, list):
        for v in desc:
            yield from _class_names(v)
    elif isinstance(desc, dict):
        if "class" in desc:
            yield desc["class"]
        for v in desc.values():
            yield from _class_names(v)


def describe_or_none(obj: Any) -> Any:
    try:
        return describe(obj)
    except NotDescribable:
        return None
