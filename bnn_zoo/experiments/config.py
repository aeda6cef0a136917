"""A run as data: one tree of dataclasses (data, model, prior, likelihood, inference, guide, evaluation,
seed) that is built in Python, read from YAML and set from the command line with dotted overrides.

jsonargparse generates the command line and reads and checks YAML from these type hints (see
docs/guide/configs.md for why jsonargparse and not Hydra). Every kind (data, model, prior, likelihood,
guide, inference) is a base class whose registered subclasses are its choices: a field typed by the
base takes any of them (``--guide dropout --guide.p 0.05``), a ``class_path``/``init_args`` node in
YAML. A user's own network is any ``torch.nn.Module`` whose constructor takes ``in_features`` and
``out_features`` first (filled from the data) and its own options after them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Union

import torch

from bnn_zoo import baselines, guides, inference, likelihoods, methods, models, priors
from bnn_zoo.data import digits, load_uci, tables, text, toy_cubic
from bnn_zoo.errors import BnnZooError, check_seed, first_line, positive
from bnn_zoo.experiments.options import options
from bnn_zoo.guides.dropout import default_options
from bnn_zoo.inference import defaults as inference_defaults
from bnn_zoo.inference import lockstep
from bnn_zoo.methods import Family

REGISTRY: dict[str, dict[str, type]] = {}  # kind -> {command-line name -> config class}


def register(name: str):
    """Make a config class a named choice of its kind (its kind is the base class's ``category``)."""

    def decorate(cls):
        REGISTRY.setdefault(cls.category, {})[name] = cls
        cls.registered_name = name
        return cls

    return decorate


def describe(cls) -> str:
    """The first paragraph of a config class's docstring: what ``bnn-zoo list`` shows."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


# ---------------------------------------------------------------------------- data


class DataConfig:
    """Where the data comes from; ``load(seed)`` gives a Dataset standardised with training statistics."""

    category = "data"

    def load(self, seed: int):
        raise NotImplementedError


@register("toy-cubic")
@dataclass
@options(toy_cubic)
class ToyCubic(DataConfig):
    """Heek's cubic toy regression, y = x^3 + N(0, 3^2), x ~ U[-4, 4] (embedded; drawn from the run's seed)."""

    def load(self, seed):
        return toy_cubic(**dataclasses.asdict(self), seed=seed)


@register("digits")
@dataclass
@options(digits)
class Digits(DataConfig):
    """scikit-learn's 8x8 digits, 10 classes, a fixed stratified split."""

    def load(self, seed):
        return digits(self.classes)


@register("toy-text")
@dataclass
@options(text.load_toy_text)
class ToyText(DataConfig):
    """Generated sentiment sentences, 2 classes, word level (embedded; drawn from the run's seed)."""

    def load(self, seed):
        return text.load_toy_text(**dataclasses.asdict(self), seed=seed)


class _FromPath(DataConfig):
    """Data read from a path the user gives: ``reader`` of the fields; refused without a path, with an
    example of one."""

    def load(self, seed):
        if not self.path:
            raise BnnZooError(f"the {self.registered_name} data needs {self.example}")
        return self.reader(**dataclasses.asdict(self))


@register("uci")
@dataclass
@options(load_uci, required=("path",))
class UCI(_FromPath):
    """A UCI regression folder in the standard format (data.txt, index_train_K.txt, ...) at one split."""

    reader = staticmethod(load_uci)
    example = "a folder: --data uci --data.path data/uci/yacht (bnn-zoo data uci yacht fetches it)"


@register("csv")
@dataclass
@options(tables.load_table, required=("path",))
class CSV(_FromPath):
    """Your own table: a CSV file (or .npz of x and y), one target column, regression or classification."""

    reader = staticmethod(tables.load_table)
    example = "a file: --data csv --data.path table.csv --data.target COLUMN"


@register("text")
@dataclass
@options(text.load_text, required=("path",))
class Text(_FromPath):
    """A text corpus as next-token windows (first 90% train, last 10% test)."""

    reader, example = staticmethod(text.load_text), "a file: --data text --data.path corpus.txt"


# ---------------------------------------------------------------------------- models


class ModelConfig:
    """An architecture; ``build(dataset, out_features)`` sizes it for the data."""

    category = "model"
    text = False  # recurrent models take token ids

    def build(self, dataset, out_features: int) -> torch.nn.Module:
        raise NotImplementedError


@register("mlp")
@dataclass
@options(models.MLP, skip=("out_features",), types={"hidden": list[int]})
class MLP(ModelConfig):
    """Multilayer perceptron: dense layers of ``hidden`` units with one activation."""

    def build(self, dataset, out_features):
        return models.MLP(dataset.in_features, list(self.hidden), out_features, self.activation)


@register("linear")
@dataclass
class Linear(ModelConfig):
    """A linear model (Bayesian linear regression with a Gaussian likelihood)."""

    def build(self, dataset, out_features):
        return models.MLP(dataset.in_features, [], out_features)


@register("cnn")
@dataclass
@options(models.LeNet, skip=("image_shape", "out_features"), types={"channels": list[int]})
class CNN(ModelConfig):
    """LeNet on images; dropout=all (lenet-all) or dense (lenet-ip) says which weights take dropout."""

    def build(self, dataset, out_features):
        shape = dataset.info.get("image_shape")
        if shape is None:
            raise BnnZooError(f"the cnn model needs image data (digits); {dataset.name} has no image shape")
        return models.LeNet(shape, list(self.channels), self.kernel, self.pool, self.dense, out_features, self.dropout)


class _Recurrent(ModelConfig):
    """Embedding + LSTM + head on token ids: ``models.TextRNN`` with its gates and word-type dropout fixed
    by the model's name."""

    text = True
    gates = "untied"
    embedding_dropout = False

    def build(self, dataset, out_features):
        head = "lm" if dataset.task == "language-model" else "classify"
        vocab = len(dataset.info["vocab"])
        return models.TextRNN(
            vocab, self.embed_dim, self.hidden, self.gates, head, out_features, self.embedding_dropout
        )


@register("lstm-tied")
@dataclass
@options(models.TextRNN, only=("embed_dim", "hidden"))
class LSTMTied(_Recurrent):
    """Embedding + LSTM with one (4K, D+K) gate matrix + head (one dropout mask for all gates)."""

    gates = "tied"


@register("lstm-untied")
@dataclass
@options(models.TextRNN, only=("embed_dim", "hidden"))
class LSTMUntied(_Recurrent):
    """Embedding + LSTM with separate W_g, U_g per gate (independent dropout masks per gate) + head."""


@register("embedding-rnn")
@dataclass
@options(models.TextRNN, only=("embed_dim", "hidden", "gates"))
class EmbeddingRNN(_Recurrent):
    """An LSTM whose embedding also takes word-type dropout (Gal & Ghahramani 2016b)."""

    embedding_dropout = True


UserNetwork = Callable[[int, int], torch.nn.Module]  # a torch.nn.Module class: (in_features, out_features, **options)


def build_network(model: ModelConfig | UserNetwork, dataset, out_features: int) -> torch.nn.Module:
    """The network a model config names, sized for ``dataset``; a user's class gets (in_features, out_features)."""
    text_data = dataset.task == "language-model" or "vocab" in dataset.info
    if isinstance(model, ModelConfig):
        if model.text != text_data:
            raise BnnZooError(
                f"model {model.registered_name!r} does not fit {dataset.name}: recurrent models take text data "
                "(toy-text, text), the others take feature vectors or images"
            )
        return model.build(dataset, out_features)
    in_features = len(dataset.info["vocab"]) if text_data else dataset.in_features
    try:
        return model(in_features, out_features)
    except Exception as exc:  # the user's code: show its error, not ours
        name = to_dict(model)["class_path"]
        raise BnnZooError(
            f"your network {name}(in_features={in_features}, out_features={out_features}) could not be built: "
            f"{type(exc).__name__}: {first_line(exc)}; bnn-zoo calls it with in_features, out_features and the "
            "--model.NAME options"
        ) from None


# ---------------------------------------------------------------------------- priors


class PriorConfig:
    """A prior over the network's weights: the options of a ``bnn_zoo.priors`` prior."""

    category = "prior"
    prior: ClassVar[Callable]  # the library prior whose options these are

    def build(self, dataset, likelihood, guide):
        return self.prior(**dataclasses.asdict(self))


@register("fanin")
@dataclass
@options(priors.FanInNormal)
class FanIn(PriorConfig):
    """N(0, gain^2 / fan_in) on weights, N(0, bias_scale^2) on biases: the output's prior sd stays O(1)."""

    prior = priors.FanInNormal


@register("normal")
@dataclass
@options(priors.Normal, skip=("layer_scales",))
class Normal(PriorConfig):
    """N(0, scale^2) on every weight and bias (Gal: scale = 1 / length-scale)."""

    prior = priors.Normal


@register("scale-mixture")
@dataclass
@options(priors.ScaleMixture)
class ScaleMixture(PriorConfig):
    """pi N(0, scale1^2) + (1 - pi) N(0, scale2^2) on every weight and bias (Blundell et al. 2015, eq. 7):
    the recurrent models' default under every method except the dropout guide, SG-MCMC and Laplace."""

    prior = priors.ScaleMixture


@register("gal-keras")
@dataclass
@options(priors.Normal.gal_keras)
class GalKeras(PriorConfig):
    """The Normal prior that makes the dropout ELBO equal Gal & Ghahramani's published Keras objective."""

    def build(self, dataset, likelihood, guide):
        p = getattr(guide, "p", None)
        if not isinstance(p, (int, float)):
            raise BnnZooError(
                "the gal-keras prior belongs to the dropout guide with one drop probability: --guide dropout --guide.p "
                "P"
            )
        return priors.Normal.gal_keras(p, float(dataset.y_std), self.length_scale)


def prior_config(prior) -> PriorConfig:
    """The registered config of a library prior, with its values."""
    cls = next(c for c in REGISTRY["prior"].values() if getattr(c, "prior", None) is type(prior))
    return cls(**{f.name: getattr(prior, f.name) for f in dataclasses.fields(cls)})


# ---------------------------------------------------------------------------- likelihoods


class LikelihoodConfig:
    """The observation model; the default follows the data's task."""

    category = "likelihood"

    def build(self, dataset):
        raise NotImplementedError


@register("gaussian")
@dataclass
@options(likelihoods.Gaussian.fixed_or_learned)
class Gaussian(LikelihoodConfig):
    """y ~ N(f, sigma^2): sigma learned (HalfNormal(1) prior on standardised targets), or fixed by scale or
    by precision tau = 1 / sigma^2 (Gal & Ghahramani's tau), both in the targets' units."""

    task = "regression"

    def build(self, dataset):
        return likelihoods.Gaussian.fixed_or_learned(self.scale, self.precision)


@register("heteroscedastic")
@dataclass
@options(likelihoods.Heteroscedastic)
class Heteroscedastic(LikelihoodConfig):
    """y ~ N(mu(x), sigma(x)^2): the network predicts a mean and a variance per target (deep ensembles' NLL)."""

    task = "regression"

    def build(self, dataset):
        return likelihoods.Heteroscedastic(**dataclasses.asdict(self))


@dataclass
class _Discrete(LikelihoodConfig):
    task = "classification"
    cls_name = ""

    def build(self, dataset):
        if self.task == "language-model":
            return getattr(likelihoods, self.cls_name)()
        return getattr(likelihoods, self.cls_name)(labels=dataset.info.get("labels"))


@register("bernoulli")
@dataclass
class Bernoulli(_Discrete):
    """Binary labels 0/1 with P(y = 1) = sigmoid(f)."""

    cls_name = "Bernoulli"


@register("categorical")
@dataclass
class Categorical(_Discrete):
    """Class labels 0..C-1 with probabilities softmax(f)."""

    cls_name = "Categorical"


@register("tokens")
@dataclass
class Tokens(_Discrete):
    """Next-token labels for language models (the default on text corpora)."""

    task = "language-model"
    cls_name = "Tokens"


DEFAULT_LIKELIHOOD = {"regression": Gaussian, "classification": Categorical, "language-model": Tokens}


def default_likelihood(dataset, known_noise: bool = True) -> LikelihoodConfig:
    """The library's (:func:`bnn_zoo.likelihoods.default_likelihood`) for the data's task, with the noise a
    simulated table knows (toy-cubic's) unless ``known_noise`` is off (a GP learns its own)."""
    noise = dataset.info.get("noise_scale") if known_noise and dataset.task == "regression" else None
    library = likelihoods.default_likelihood(dataset.task, noise)
    return (
        Gaussian(scale=library.scale)
        if isinstance(library, likelihoods.Gaussian)
        else DEFAULT_LIKELIHOOD[dataset.task]()
    )


# ---------------------------------------------------------------------------- guides


class GuideConfig:
    """A variational family for SVI: the options of the registered guide (``bnn_zoo.guides``)."""

    category = "guide"

    def options(self) -> dict:
        return dataclasses.asdict(self)

    def resolved(self, model) -> GuideConfig:
        """This guide with the defaults the library fills for ``model`` written out (none unless a guide says)."""
        return self


@register("mean-field")
@dataclass
@options(guides.GUIDES["mean-field"])
class MeanField(GuideConfig):
    """Diagonal Gaussian over every weight (Bayes by Backprop); local_reparam samples pre-activations."""


@register("matrix-normal")
@dataclass
@options(guides.GUIDES["matrix-normal"])
class MatrixNormal(GuideConfig):
    """Matrix-normal MN(M, U, V) per weight matrix (full Cholesky; rank=k for low rank + diagonal)."""

    def resolved(self, model):
        from bnn_zoo.guides.matrix_normal import default_scales

        return dataclasses.replace(self, scales=default_scales(model.net)) if self.scales is None else self


@register("flow")
@dataclass
@options(guides.GUIDES["flow"])
class Flow(GuideConfig):
    """A normalizing flow over all weights (scope=joint) or one per weight matrix (scope=layer)."""


@register("dropout")
@dataclass
@options(guides.GUIDES["dropout"])
class Dropout(GuideConfig):
    """Gal's dropout mixture (MC dropout as VI); p is the drop probability, one or one per weight matrix."""

    def for_task(self, task: str) -> Dropout:
        """These options with the task's defaults written out (bnn_zoo.guides.dropout.default_options)."""
        p, masks, learn_p = default_options(task, self.p, self.masks, self.learn_p)
        return dataclasses.replace(self, p=p, masks=masks, learn_p=learn_p)


# ---------------------------------------------------------------------------- inference


class InferenceConfig:
    """How the posterior is approximated: the options of the library method ``method`` configures
    (``bnn_zoo.inference``), taken from its signature; ``build`` gives the method ``bnn_zoo.fit`` takes."""

    category = "inference"
    takes_guide = False
    bnn = True  # False: the GP baseline, which replaces the BNN
    method: ClassVar[type]  # the library class whose options these are

    def options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def build(self, run: RunConfig, model, dataset, checkpoint, progress):
        runtime = {"seed": run.seed, "progress": progress, "checkpoint": checkpoint}  # those the method takes
        takes = inspect.signature(self.method).parameters
        return self.method(**self.options(), **{k: v for k, v in runtime.items() if k in takes})

    def resolved(self, model, n: int, guide: GuideConfig | None = None) -> InferenceConfig:
        """This config with the defaults the library fills for ``model``, n training rows and ``guide``
        written out (a method without ``resolved`` has none that depend on them)."""
        if not hasattr(self.method, "resolved"):
            return self
        resolved = self.library(guide).resolved(model, n)
        return dataclasses.replace(self, **{f.name: getattr(resolved, f.name) for f in dataclasses.fields(self)})

    def library(self, guide: GuideConfig | None = None):
        """The library method with these options (a run's seed and progress aside)."""
        return self.method(**self.options())


@register("svi")
@dataclass
@options(inference.SVI, skip=("guide", "guide_options"))
class SVI(InferenceConfig):
    """Stochastic VI with a guide (--guide): Adam on the ELBO, closed-form KL where it exists."""

    takes_guide = True
    method = inference.SVI

    def library(self, guide: GuideConfig | None = None):
        if guide is None:
            return super().library()
        return self.method(guide=guide.registered_name, guide_options=guide.options(), **self.options())

    def build(self, run, model, dataset, checkpoint, progress):
        guide = run.guide or run.default_guide()
        return self.method(
            guide=guide.registered_name,
            guide_options=guide.options(),
            seed=run.seed,
            checkpoint=checkpoint,
            progress=progress,
            **self.options(),
        )


_CHAIN_START = {"init": Literal["network", "prior", "svi"]}  # a fitted Posterior is Python's alone


def method_config(method: type) -> type:
    """The config class of a registered method, generated from it: its options from its signature and
    docstring (:func:`bnn_zoo.experiments.options.options`), its description the docstring's first
    paragraph, its command-line name its ``name``. It is registered, and kept in this module under the
    method's class name, where YAML's ``class_path`` finds it."""
    for what, taken in (
        ("class name", globals().get(method.__name__)),
        ("name", REGISTRY["inference"].get(method.name)),
    ):
        if not _replaceable(taken):
            raise BnnZooError(
                f"the {what} of {method.__name__} is bnn-zoo's own {taken.__name__}'s; rename your method"
            )
    summary = (inspect.getdoc(method) or method.__name__).split("\n\n")[0]  # options() appends the Args
    body = {"__doc__": summary, "__module__": __name__, "__qualname__": method.__name__, "method": method}
    cls = type(method.__name__, (InferenceConfig,), body)
    init = "init" in inspect.signature(method).parameters and method.family is Family.CHAINS
    cls = register(method.name)(dataclass(options(method, types=_CHAIN_START if init else None)(cls)))
    globals()[method.__name__] = cls
    return cls


def _replaceable(config) -> bool:
    """Whether a config class may be generated in place of ``config``: nothing, or a config of a user's
    method (its file read again)."""
    own = getattr(config, "method", None)
    return config is None or (own is not None and not own.__module__.startswith("bnn_zoo."))


_SG_KINDS = ("kind", "friction", "cycles", "exploration")  # the kind is the choice; each kind's own options below


class _SGMCMC(InferenceConfig):
    method = inference.SGMCMC

    def options(self):
        return super().options() | {"kind": self.registered_name}


@register("sgld")
@dataclass
@options(inference.SGMCMC, skip=_SG_KINDS)
class SGLD(_SGMCMC):
    """Stochastic-gradient Langevin dynamics (Welling & Teh 2011): minibatch MCMC, biased by O(step size)."""


@register("sghmc")
@dataclass
@options(inference.SGMCMC, skip=_SG_KINDS[:1] + _SG_KINDS[2:])
class SGHMC(_SGMCMC):
    """Stochastic-gradient HMC with friction (Chen et al. 2014)."""


@register("cyclical")
@dataclass
@options(inference.SGMCMC, skip=_SG_KINDS[:2])
class Cyclical(_SGMCMC):
    """Cyclical SGLD (Zhang et al. 2020): cosine step-size cycles, draws in each cycle's second half."""


_CONFIGURED = {c.method for c in REGISTRY["inference"].values()}  # by the classes above
for _method in methods.registered("bnn").values():  # bnn-zoo's others; a user's by --inference FILE:Class
    if _method.__module__.startswith("bnn_zoo.") and _method not in _CONFIGURED:
        method_config(_method)


@register("gp")
@dataclass
@options(baselines.TypeII)
@options(baselines.GP, only=("kernel", "num_inducing"))
class GP(InferenceConfig):
    """A GPyTorch GP baseline by type-II ML; nngp is the infinite-width kernel of a relu MLP under the fan-in prior."""

    bnn = False
    method = baselines.TypeII

    def options(self):
        return {"steps": self.steps, "lr": self.lr}

    def resolved(self, model, n, guide=None):
        return self

    def model(self, run: RunConfig, likelihood, classes: int, dataset):
        """The GP that replaces the BNN; kernel=nngp is the twin of the run's relu MLP and fan-in prior."""
        if dataset.task == "language-model" or "vocab" in dataset.info:
            raise BnnZooError("the GP baseline takes feature vectors or images, not text")
        if isinstance(likelihood, likelihoods.Heteroscedastic):
            raise BnnZooError("the GP baseline's noise is one Gaussian scale; use --likelihood gaussian")
        if isinstance(likelihood, likelihoods.Gaussian) and likelihood.scale is not None:
            raise BnnZooError("a GP learns its noise by type II; drop the likelihood's scale or precision")
        depth, prior = 1, None
        if self.kernel == "nngp":
            if not (isinstance(run.model, MLP) and run.model.activation == "relu"):
                raise BnnZooError(
                    "kernel=nngp is the infinite-width limit of a relu MLP; pass --model mlp --model.activation relu"
                )
            if not isinstance(run.prior, FanIn):
                raise BnnZooError("kernel=nngp needs --prior fanin (the infinite-width limit of a fan-in prior)")
            depth, prior = len(run.model.hidden), run.prior.build(dataset, likelihood, None)
        num_classes = classes if isinstance(likelihood, likelihoods.Categorical) else None
        return baselines.GP(
            self.kernel, likelihood, num_classes=num_classes, num_inducing=self.num_inducing, depth=depth, prior=prior
        )


# ---------------------------------------------------------------------------- evaluation and the run


@dataclass
class Evaluation:
    """What is computed after the fit, on the test split and the training data."""

    elbo_samples: int = 1000
    """guide draws for the ELBO and its standard error"""
    predict_samples: int | None = None
    """posterior draws per test prediction (null: every stored draw)"""
    evidence: list[Literal["ais", "iw"]] = field(default_factory=list)
    """extra log-evidence estimates: ais (annealed importance sampling), iw (importance-weighted bound)"""
    ais_steps: int = 500
    """annealing steps of AIS"""
    iw_k: int = 100
    """importance samples of the IW bound"""
    plots: bool = True
    """diagnostic plots in the result folder (sweeps of many cells may skip them)"""
    training_evidence: bool = True
    """ELBO, PSIS-LOO and evidence on the training data (selection runs may skip them)"""
    shift: bool = False
    """image classifiers: score the test images rotated (15-90 degrees) and noised (pixel sd 1-8)"""
    max_scoring_hours: float | None = 1.0
    """refuse, before the fit, a run whose scoring is estimated to take longer (null: no limit)"""
    calibrate: float = 0.0
    """hold this fraction of the training rows out of the fit to calibrate on: temperature scaling (classifiers)
    or split-conformal 90% intervals (regression), scored beside the raw predictive"""


@dataclass
class RunConfig:
    """One fit: what is fitted to what, how, and what is measured."""

    data: DataConfig = field(default_factory=ToyCubic)
    """what is fitted"""
    model: Union[ModelConfig, UserNetwork] = field(default_factory=MLP)
    """the network: a registered model or your own torch.nn.Module class"""
    prior: PriorConfig | None = None
    """null: bnn_zoo.priors.DEFAULT_RULE (docs/guide/defaults.md)"""
    likelihood: LikelihoodConfig | None = None
    """null: the data's task decides"""
    inference: InferenceConfig = field(default_factory=SVI)
    """how the posterior is approximated"""
    guide: GuideConfig | None = None
    """svi only; null: bnn_zoo.inference.defaults.GUIDE_RULE"""
    evaluation: Evaluation = field(default_factory=Evaluation)
    """what is measured"""
    seed: int = 0
    """seeds the embedded datasets' draw (toy-cubic, toy-text), the network's start and every random draw of the fit"""
    device: str | None = None
    """cpu (default) or cuda: where a BNN is fitted"""

    def resolved(self, dataset) -> RunConfig:
        """This config with its data-dependent defaults written out (the likelihood, SVI's guide, the prior);
        the method's own are written out once the model is built (``InferenceConfig.resolved``)."""
        # a GP learns its noise
        likelihood = self.likelihood or default_likelihood(dataset, known_noise=self.inference.bnn)
        guide = self.guide or (self.default_guide() if self.inference.takes_guide else None)
        guide = guide.for_task(dataset.task) if isinstance(guide, Dropout) else guide
        prior = self.prior or self.default_prior(guide, dataset.task)
        return dataclasses.replace(self, likelihood=likelihood, guide=guide, prior=prior)

    def for_model(self, model, n: int) -> RunConfig:
        """This config with the defaults the library fills for the built ``model`` and n training rows
        written out (the method's and the guide's), so that ``config.yaml`` re-runs exactly."""
        guide = self.guide and self.guide.resolved(model)
        return dataclasses.replace(self, guide=guide, inference=self.inference.resolved(model, n, guide))

    def default_prior(self, guide: GuideConfig | None, task: str) -> PriorConfig:
        """The library's default (:func:`bnn_zoo.priors.default_prior`) for this model, task, guide and method."""
        recurrent = getattr(self.inference.method, "recurrent_prior", None)
        return prior_config(priors.default_prior(self.architecture, task, isinstance(guide, Dropout), recurrent))

    def default_guide(self) -> GuideConfig:
        """The library's (:func:`bnn_zoo.inference.defaults.guide`) for this model."""
        return REGISTRY["guide"][inference_defaults.guide(self.architecture)]()

    @property
    def architecture(self) -> str:
        """The model's, as the library's defaults read it (a convolutional network's defaults are dense's)."""
        return "recurrent" if getattr(self.model, "text", False) else "dense"

    def lockstep_ready(self) -> bool:
        """Whether the lockstep engine can fit this run: its rule (``lockstep.why_not_for``) on what the
        config says, before any data are read."""
        lik, dense = self.likelihood, isinstance(self.model, MLP | Linear)
        fit = lockstep.FitShape(
            architecture="dense" if dense else "other",
            dense_layers=dense,
            task="regression" if isinstance(lik, Gaussian) else "classification",
            fixed_noise=isinstance(lik, Gaussian) and (lik.scale is not None or lik.precision is not None),
        )
        return lockstep.why_not_for(self.inference.library(self.guide or self.default_guide()), fit) is None

    def check(self) -> RunConfig:
        """Refuse combinations that cannot mean what they say, before anything is read or trained."""
        check_seed(self.seed)
        for name, value in _whole_numbers(dataclasses.replace(self, seed=0)):
            if abs(value) > MAX_WHOLE:
                raise BnnZooError(f"--{name} is {value}; bnn-zoo's counts and sizes are at most {MAX_WHOLE:,}")
        ev = self.evaluation
        positive("--evaluation.elbo_samples", ev.elbo_samples, integer=True, least=2)  # its standard error needs two
        for name in ("ais_steps", "iw_k") + (("predict_samples",) if ev.predict_samples is not None else ()):
            positive(f"--evaluation.{name}", getattr(ev, name), integer=True)
        if ev.max_scoring_hours is not None:
            positive("--evaluation.max_scoring_hours", ev.max_scoring_hours)
        if self.guide is not None and not self.inference.takes_guide:
            raise BnnZooError(f"a guide applies to svi, not {self.inference.registered_name}; drop --guide")
        if self.evaluation.evidence and not self.evaluation.training_evidence:
            raise BnnZooError(
                "--evaluation.evidence estimates the training data's evidence, which --evaluation.training_evidence "
                "false skips; drop one"
            )
        if self.evaluation.evidence and isinstance(self.inference, GP):
            raise BnnZooError(
                "a GP's evidence is its own (log marginal likelihood or ELBO); drop --evaluation.evidence"
            )
        if "iw" in self.evaluation.evidence and (not self.inference.takes_guide or isinstance(self.guide, Dropout)):
            raise BnnZooError(
                "--evaluation.evidence iw needs a guide with a density (svi, not the dropout guide); use ais"
            )
        return self


MAX_WHOLE = 10**9  # steps, draws, widths or rows past this never finish, or overflow torch's sizes


def _whole_numbers(value, name: str = ""):
    """Every (dotted name, int) in a config, lists included."""
    if isinstance(value, int) and not isinstance(value, bool):
        yield name, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _whole_numbers(getattr(value, f.name), f"{name}.{f.name}".lstrip("."))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _whole_numbers(item, name)


# ---------------------------------------------------------------------------- to and from plain data


def to_dict(value):
    """The YAML/JSON form jsonargparse reads back: dataclasses as mappings, each choice of a kind as
    ``{class_path, init_args}``, a user's network class with the options it was given."""
    if isinstance(value, RunConfig | Evaluation):
        return {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if dataclasses.is_dataclass(value):
        args = {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": args}
    if isinstance(value, functools.partial):  # a user's network class with its options
        cls = value.func if isinstance(value.func, type) else next(a for a in value.args if isinstance(a, type))
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": dict(value.keywords)}
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        return {"class_path": f"{value.__module__}.{value.__qualname__}"}
    if isinstance(value, list | tuple):
        return [to_dict(v) for v in value]
    return value


def node(cls: type, **init_args) -> dict:
    """The plain form of one choice of a kind: ``{class_path, init_args}``."""
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init_args}


WALL_TIME_ONLY = frozenset({"max_hours"})  # bounds how long a run may take, not what it computes


def config_hash(config: RunConfig) -> str:
    """A short stable key of a config (sweep cells are named by it). Fields at their defaults are left
    out, so a field added later with a default that keeps the old behaviour does not change old keys,
    and so are WALL_TIME_ONLY's: a sweep run again with another time limit finds its cells."""
    payload = json.dumps(_non_default(config), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _non_default(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _non_default(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) != _default(f) and f.name not in WALL_TIME_ONLY
        }
        return (
            fields
            if isinstance(value, RunConfig | Evaluation)
            else {"class_path": to_dict(value)["class_path"], "init_args": fields}
        )
    return to_dict(value)


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def parser():
    """The jsonargparse parser of a RunConfig (its fields as ``--data.path``-style options)."""
    from jsonargparse import ArgumentParser, DefaultHelpFormatter, set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # each option's help is its field's docstring

    class Help(DefaultHelpFormatter):
        def _get_help_string(self, action):  # a kind's registered names, not every importable subclass
            if action.dest not in REGISTRY:
                return super()._get_help_string(action)
            default = to_dict(action.default)
            name = next(
                (
                    n
                    for n, c in REGISTRY[action.dest].items()
                    if isinstance(default, dict) and default["class_path"].endswith(f".{c.__name__}")
                ),
                None,
            )
            options = f"; its options: --{action.dest}.help NAME"
            name = name or {
                "likelihood": "the data's task decides",
                "guide": f"{inference_defaults.GUIDE_RULE}; svi only",
                "prior": priors.DEFAULT_RULE,
            }.get(action.dest)
            return f"{' | '.join(REGISTRY[action.dest])} (default: {name}){options}"

    p = ArgumentParser(prog="bnn-zoo fit", formatter_class=Help, exit_on_error=False)
    p.add_class_arguments(RunConfig, None, fail_untyped=True, sub_configs=True)
    return p


def named_choice(kind: str, name: str) -> dict:
    """``{class_path, init_args}`` of a kind's registered name (``dropout``) or class (``Dropout``, ``pkg.mod:Cls``)."""
    names = REGISTRY[kind]
    if name in names:
        return node(names[name])
    if "." in name or ":" in name or name in {c.__name__ for c in names.values()}:
        return {"class_path": name.replace(":", "."), "init_args": {}}
    hint = " or a torch.nn.Module class as package.module:Class" if kind == "model" else ""
    raise BnnZooError(f"unknown {kind} {name!r}; choose one of: {', '.join(names)}{hint}")


def with_names_resolved(data: dict) -> dict:
    """A config in plain form whose kinds may be given by name (``guide: dropout``), with those expanded."""
    if not isinstance(data, dict):
        raise BnnZooError(f"a run config is a mapping of fields (data, model, ...), got {type(data).__name__}")
    return {k: named_choice(k, v) if k in REGISTRY and isinstance(v, str) else v for k, v in data.items()}


@functools.cache
def _object_parser():
    """One parser for every ``from_dict`` (building it is half the cost of reading a config, which a
    sweep does per cell); the command line builds its own, as it adds options."""
    return parser()


def from_dict(data: dict) -> RunConfig:
    """A RunConfig from its YAML/JSON form (``to_dict``'s inverse; kinds may be given by name), checked by
    the same parser as the command line."""
    p = _object_parser()
    data = with_names_resolved(data)
    try:
        namespace = p.parse_object(data)
    except Exception as exc:  # jsonargparse reports bad configs as ArgumentError or TypeError
        raise BnnZooError(f"bad run config: {exc}") from None
    return from_namespace(p, namespace, p.parse_object(data, defaults=False))


def from_argv(p, argv: list[str]) -> RunConfig:
    """The RunConfig a command line describes to parser ``p`` (``--inference nuts``, ``--data.path``)."""
    argv = resolve_names(argv)
    return from_namespace(p, p.parse_args(argv), p.parse_args(argv, defaults=False))


def from_namespace(p, namespace, given) -> RunConfig:
    """The RunConfig a parsed namespace describes (its classes instantiated), checked. ``given``: the
    same parse without defaults (``defaults=False``), what the user set."""
    built = p.instantiate(namespace)
    return RunConfig(
        **{f.name: _own_defaults(built[f.name], given.get(f.name)) for f in dataclasses.fields(RunConfig)}
    ).check()


def _own_defaults(option, given):
    """A kind chosen in place of the default one, with its own defaults where the user set nothing:
    jsonargparse carries the default kind's values over wherever a name matches (jsonargparse issue
    #460), which gave ``--inference ensemble`` SVI's validation and checkpoint_every."""
    if not dataclasses.is_dataclass(option) or given is None or "class_path" not in given:
        return option
    init_args = given.get("init_args")
    return type(option)(**{k: getattr(option, k) for k in (vars(init_args) if init_args is not None else {})})


def user_network(spec: str) -> str:
    """The class path of ``--model``'s own network, imported now so a bad one fails in one line (see
    :func:`user_class`)."""
    cls = user_class(spec, "--model")
    return f"{cls.__module__}.{cls.__qualname__}"


def user_method(spec: str) -> str:
    """The class path of the config generated for ``--inference``'s own method (:func:`method_config`),
    imported now so a bad one fails in one line (see :func:`user_class`). Importing its file registers
    it (``@bnn_zoo.methods.register``)."""
    cls = user_class(spec, "--inference")
    if methods.REGISTRY.get(getattr(cls, "name", None)) is not cls:
        raise BnnZooError(
            f"--inference {spec}: {cls.__name__} is not a registered inference method; decorate it with "
            "@bnn_zoo.methods.register (docs/extending.md)"
        )
    if cls.fits != "bnn":
        raise BnnZooError(f"--inference {spec}: {cls.__name__} fits a {cls.fits.upper()}; the command line fits BNNs")
    config = method_config(cls)
    return f"{config.__module__}.{config.__qualname__}"


def user_class(spec: str, flag: str) -> type:
    """A user's class named on the command line: ``path/to/file.py:Class`` (the file loaded as module
    ``file``) or ``module:Class`` / ``package.module:Class``, found from the working directory as
    ``python -m`` would."""
    target, _, name = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise BnnZooError(f"{flag} {spec}: there is no file {target}")
        name_of_module = _module_name(path)
        module_spec = importlib.util.spec_from_file_location(name_of_module, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name_of_module] = module  # where jsonargparse and bz.load look the class up
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name_of_module]
            raise BnnZooError(f"{flag} {spec}: importing {target} failed: {type(exc).__name__}: {exc}") from None
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise BnnZooError(
                f"{flag} {spec}: cannot import {target} ({type(exc).__name__}: {exc}); run bnn-zoo from the folder "
                f"that holds it, or name its file: {flag} path/to/{target.rpartition('.')[2]}.py:{name}"
            ) from None
    if not isinstance(getattr(module, name, None), type):
        raise BnnZooError(f"{flag} {spec}: {target} has no class {name}")
    return getattr(module, name)


def _module_name(path: Path) -> str:
    """The module name a network's file is loaded as: its name made an identifier (``my net.py``:
    ``my_net``), and kept clear of a module already imported from elsewhere (``json.py``)."""
    name = re.sub(r"\W", "_", path.stem)
    name = f"_{name}" if name[:1].isdigit() else name
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) != str(path):
        name = f"bnn_zoo_user_{name}"
    return name


_USER_CLASSES = {"--model": user_network, "--inference": user_method}


def resolve_names(argv: list[str]) -> list[str]:
    """Command-line shorthand: ``--guide dropout`` for the registered class, ``--model pkg.mod:Class`` for
    ``pkg.mod.Class``, and the same names inside a ``--config`` file. (jsonargparse names a choice by its
    class; the zoo's names are lower-case.) An unknown name is refused here, with the choices; a
    ``--config`` file may name only the zoo's classes and the network class the command line names."""
    from bnn_zoo.io import read_yaml

    out = list(argv)
    for i, arg in enumerate(out[:-1]):  # a network or method of the user's: imported first, by its file or module
        flag = arg.removesuffix(".help")  # --inference.help file.py:Class lists its options
        if flag in _USER_CLASSES and ":" in out[i + 1] and not out[i + 1].startswith(("{", "-")):
            out[i + 1] = _USER_CLASSES[flag](out[i + 1])
    trusted = {v for a, v in zip(out, out[1:]) if a == "--model" and not v.startswith(("{", "-"))}
    for i, arg in enumerate(out[:-1]):
        if arg == "--config":  # jsonargparse takes the config's content as well as its path
            data = with_names_resolved(read_yaml(out[i + 1], "run config"))
            check_classes(data, trusted, f"run config {out[i + 1]}", "name it on the command line: --model {}")
            out[i + 1] = json.dumps(data)
            continue
        kind = arg[2:].removesuffix(".help") if arg.startswith("--") else None
        if kind in REGISTRY and not out[i + 1].startswith(("{", "[", "-")):
            out[i + 1] = named_choice(kind, out[i + 1])["class_path"]
    return out


def known_classes() -> set[str]:
    """What a config file may name as a class: every registered choice by its name, class name or path."""
    return {
        name
        for choices in REGISTRY.values()
        for registered, cls in choices.items()
        for name in (registered, cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
    }


def check_classes(data, trusted: set[str], where: str, fix: str) -> None:
    """Refuse plain config data (a file's) that names a class outside :func:`known_classes` and ``trusted``
    (paths ``pkg.mod.Class``), before jsonargparse imports anything: a file is data and may not make
    bnn-zoo import or construct code. ``fix`` says how to trust the class, with ``{}`` for its name."""
    allowed = known_classes() | trusted

    def named(value, key=None):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from named(v, k)
        elif isinstance(value, list):
            for v in value:
                yield from named(v, key)
        elif isinstance(value, str) and (key == "class_path" or key in REGISTRY):
            yield value

    outside = next((name for name in named(data) if name.replace(":", ".") not in allowed), None)
    if outside is not None:
        shown = outside.replace(":", ".")
        module, _, cls = shown.rpartition(".")
        if module == __name__:  # the config generated for a user's method (method_config)
            fix, module = "name its file on the command line: --inference path/to/{}", "file.py"
        raise BnnZooError(
            f"{where} names the class {shown}, which is not one of bnn-zoo's: a file may not make bnn-zoo import "
            f"code; to run your own class, {fix.format(f'{module}:{cls}' if module else cls)}"
        )


def parse_error_message(exc: Exception) -> str:
    """jsonargparse's error for a bad option as one line in the command line's own terms:
    ``--inference.lr: expected a float, got inf``; ``--inference.step_size is not an option of nuts
    (its options: ...)``. Anything else is jsonargparse's message folded onto one line."""
    text = str(exc)
    keys = re.findall(r'Parser key "([^"]+)"', text)
    chosen = re.search(r"class_path '[\w.]+\.(\w+)'", text)
    cls = next(
        (c for c in REGISTRY.get(keys[0] if keys else "", {}).values() if chosen and c.__name__ == chosen[1]), None
    )
    unknown = re.search(r"Option '(\w+)' is not accepted", text)
    if unknown and cls is not None:
        options = ", ".join(f.name for f in dataclasses.fields(cls)) or "none"
        return f"--{keys[0]}.{unknown[1]} is not an option of {keys[0]} {cls.registered_name} (its options: {options})"
    expected = [
        _type_name(t)
        for t in re.findall(r"Expected an? (<class '\w+'>|typing\.Literal\[[^]]*\])", text)
        if "NoneType" not in t
    ]
    given = re.search(r"(?:Got|Given) value: (.*)", text)
    if keys and expected and given:
        return f"--{'.'.join(keys)}: expected {' or '.join(dict.fromkeys(expected))}, got {given[1].strip()}"
    lines = [line.strip(" -") for line in text.splitlines()]
    return "; ".join(
        line for line in lines if line and not line.startswith(("Subtypes:", "Errors:", "Given value"))
    ).replace(":;", ":")


def _type_name(hint: str) -> str:
    """``<class 'float'>`` -> a float; ``typing.Literal['ais', 'iw']`` -> one of ais, iw."""
    if hint.startswith("typing.Literal"):
        return "one of " + ", ".join(re.findall(r"'([^']*)'", hint))
    name = hint.split("'")[1]
    return {
        "int": "a whole number",
        "float": "a number",
        "list": "a list like [1, 2]",
        "bool": "true or false",
        "str": "a string",
    }.get(name, name)
