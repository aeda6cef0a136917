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
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Union

import torch

from bnn_zoo.errors import BnnZooError, check_seed, first_line, positive

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
class ToyCubic(DataConfig):
    """Heek's cubic toy regression, y = x^3 + N(0, 3^2), x ~ U[-4, 4] (embedded; drawn from the run's seed)."""

    n_train: int = 20
    """training points (the test set is 200 points on U[-4, 4])"""

    def load(self, seed):
        from bnn_zoo.data import toy_cubic

        return toy_cubic(self.n_train, seed=seed)


@register("digits")
@dataclass
class Digits(DataConfig):
    """scikit-learn's 8x8 digits, 10 classes, a fixed stratified split."""

    def load(self, seed):
        from bnn_zoo.data import digits

        return digits()


@register("toy-text")
@dataclass
class ToyText(DataConfig):
    """Generated sentiment sentences, 2 classes, word level (embedded; drawn from the run's seed)."""

    def load(self, seed):
        from bnn_zoo.data import text

        return text.classification(*text.toy_text(seed=seed), name="toy-text")


@register("uci")
@dataclass
class UCI(DataConfig):
    """A UCI regression folder in the standard format (data.txt, index_train_K.txt, ...) at one split.

    ``part="validation"`` trains on the first 80% of the training split (file order) and tests on the
    last 20%, standardised with the 80% part's statistics: Gal & Ghahramani's hyper-parameter selection.
    """

    path: str = ""
    """the dataset's folder (data.txt, index_features.txt, index_target.txt, index_train_K.txt, index_test_K.txt)"""
    split: int = 0
    """which of the folder's train/test splits (K in index_train_K.txt)"""
    part: Literal["test", "validation"] = "test"
    """test: train on the split's training rows, score its test rows; validation: Gal & Ghahramani's 80/20 selection split of the training rows"""
    allow_overlap: bool = False
    """score a split whose test rows are also training rows (refused otherwise)"""

    def load(self, seed):
        from bnn_zoo.data import load_uci

        if not self.path:
            raise BnnZooError("the uci data needs a folder: --data uci --data.path ../shared/data/uci/yacht")
        data = load_uci(self.path, self.split, self.allow_overlap)
        return data.validation_part() if self.part == "validation" else data


@register("text")
@dataclass
class Text(DataConfig):
    """A text corpus as next-token windows (first 90% train, last 10% test)."""

    path: str = ""
    """a UTF-8 text file, or a folder holding input.txt"""
    level: Literal["char", "word"] = "char"
    """tokens are characters or whitespace-separated words"""
    seq_len: int = 64
    """tokens of context per window; the model predicts the next one"""
    max_vocab: int | None = None
    """keep the most frequent tokens, the rest as one unknown token (at least 3; null: all)"""

    def load(self, seed):
        from bnn_zoo.data import text

        if not self.path:
            raise BnnZooError("the text data needs a file: --data text --data.path corpus.txt")
        return text.load_text(self.path, self.level, self.seq_len, self.max_vocab)


# ---------------------------------------------------------------------------- models


class ModelConfig:
    """An architecture; ``build(dataset, out_features)`` sizes it for the data."""

    category = "model"
    text = False  # recurrent models take token ids
    short_chains = False  # True: NUTS and HMC default to 100 warm-up iterations and 100 draws (_PyroChain.resolved)

    def build(self, dataset, out_features: int) -> torch.nn.Module:
        raise NotImplementedError


@register("mlp")
@dataclass
class MLP(ModelConfig):
    """Multilayer perceptron: dense layers of ``hidden`` units with one activation."""

    hidden: list[int] = field(default_factory=lambda: [50])
    """units of each hidden layer ([] is a linear model)"""
    activation: Literal["tanh", "relu", "sigmoid", "elu", "gelu"] = "tanh"
    """the hidden layers' nonlinearity"""

    def build(self, dataset, out_features):
        from bnn_zoo import models

        return models.MLP(dataset.in_features, list(self.hidden), out_features, self.activation)


@register("linear")
@dataclass
class Linear(ModelConfig):
    """A linear model (Bayesian linear regression with a Gaussian likelihood)."""

    def build(self, dataset, out_features):
        from bnn_zoo import models

        return models.MLP(dataset.in_features, [], out_features)


@register("cnn")
@dataclass
class CNN(ModelConfig):
    """LeNet on images; dropout=all (lenet-all) or dense (lenet-ip) says which weights take dropout."""

    channels: list[int] = field(default_factory=lambda: [16, 32])
    """output channels of each convolution (each followed by max pooling)"""
    kernel: int = 3
    """convolution kernel size"""
    pool: int = 2
    """max-pooling size"""
    dense: int = 64
    """units of the dense layer before the output"""
    dropout: Literal["all", "dense"] = "all"
    """which weights the dropout guide drops: all (lenet-all) or the dense layers only (lenet-ip)"""

    short_chains = True

    def build(self, dataset, out_features):
        from bnn_zoo import models

        shape = dataset.info.get("image_shape")
        if shape is None:
            raise BnnZooError(f"the cnn model needs image data (digits); {dataset.name} has no image shape")
        return models.LeNet(shape, list(self.channels), self.kernel, self.pool, self.dense, out_features, self.dropout)


@dataclass
class _Recurrent(ModelConfig):
    embed: int = 32
    """embedding size"""
    hidden: int = 64
    """LSTM hidden units"""

    text = True
    short_chains = True
    gates = "untied"
    embedding_dropout = False

    def build(self, dataset, out_features):
        from bnn_zoo import models

        head = "lm" if dataset.task == "language-model" else "classify"
        vocab = len(dataset.info["vocab"])
        return models.TextRNN(vocab, self.embed, self.hidden, self.gates, head, out_features, embedding_dropout=self.embedding_dropout)


@register("lstm-tied")
@dataclass
class LSTMTied(_Recurrent):
    """Embedding + LSTM with one (4K, D+K) gate matrix + head (one dropout mask for all gates)."""

    gates = "tied"


@register("lstm-untied")
@dataclass
class LSTMUntied(_Recurrent):
    """Embedding + LSTM with separate W_g, U_g per gate (independent dropout masks per gate) + head."""


@register("embedding-rnn")
@dataclass
class EmbeddingRNN(_Recurrent):
    """An LSTM whose embedding also takes word-type dropout (Gal & Ghahramani 2016b)."""

    gates: Literal["tied", "untied"] = "untied"
    """one gate matrix with one dropout mask (tied) or one per gate (untied)"""
    embedding_dropout = True


UserNetwork = Callable[[int, int], torch.nn.Module]  # a torch.nn.Module class: (in_features, out_features, **options)


def build_network(model: ModelConfig | UserNetwork, dataset, out_features: int) -> torch.nn.Module:
    """The network a model config names, sized for ``dataset``; a user's class gets (in_features, out_features)."""
    text_data = dataset.task == "language-model" or "vocab" in dataset.info
    if isinstance(model, ModelConfig):
        if model.text != text_data:
            raise BnnZooError(
                f"model {model.registered_name!r} does not fit {dataset.name}: recurrent models take text data (toy-text, text), "
                "the others take feature vectors or images"
            )
        return model.build(dataset, out_features)
    in_features = len(dataset.info["vocab"]) if text_data else dataset.in_features
    try:
        return model(in_features, out_features)
    except Exception as exc:  # the user's code: show its error, not ours
        name = to_dict(model)["class_path"]
        raise BnnZooError(
            f"your network {name}(in_features={in_features}, out_features={out_features}) could not be built: "
            f"{type(exc).__name__}: {first_line(exc)}; bnn-zoo calls it with in_features, out_features and the --model.NAME options"
        ) from None


# ---------------------------------------------------------------------------- priors


class PriorConfig:
    """A prior over the network's weights."""

    category = "prior"

    def build(self, dataset, likelihood, guide):
        raise NotImplementedError


@register("fanin")
@dataclass
class FanIn(PriorConfig):
    """N(0, gain^2 / fan_in) on weights, N(0, bias_scale^2) on biases: the output's prior sd stays O(1)."""

    gain: float = 1.0
    """weight sd times sqrt(fan_in)"""
    bias_scale: float = 1.0
    """bias sd"""

    def build(self, dataset, likelihood, guide):
        from bnn_zoo import priors

        return priors.FanInNormal(self.gain, self.bias_scale)


@register("normal")
@dataclass
class Normal(PriorConfig):
    """N(0, scale^2) on every weight and bias (Gal: scale = 1 / length-scale)."""

    scale: float = 1.0
    """sd of every weight and bias"""

    def build(self, dataset, likelihood, guide):
        from bnn_zoo import priors

        return priors.Normal(self.scale)


@register("scale-mixture")
@dataclass
class ScaleMixture(PriorConfig):
    """pi N(0, scale1^2) + (1 - pi) N(0, scale2^2) on every weight and bias (Blundell et al. 2015, eq. 7):
    the recurrent models' default under every method except the dropout guide and Laplace; NUTS, HMC and
    ChEES take it with scale2 = 0.05 (``InferenceConfig.recurrent_prior``; docs/guide/defaults.md)."""

    pi: float = 0.5
    """weight of the wide component"""
    scale1: float = 1.0
    """sd of the wide component"""
    scale2: float = 0.0025
    """sd of the narrow component (e^-6, the largest of Blundell et al.'s narrow scales)"""

    def build(self, dataset, likelihood, guide):
        from bnn_zoo import priors

        return priors.ScaleMixture(self.pi, self.scale1, self.scale2)


@register("gal-keras")
@dataclass
class GalKeras(PriorConfig):
    """The Normal prior that makes the dropout ELBO equal Gal & Ghahramani's published Keras objective.

    Their code trains on standardised targets with MSE plus weight decay l^2 (1-p) / (2 N tau) on the
    inverted-dropout weights, tau being the original-units precision of the test likelihood. With the
    likelihood N(f, 1 / tau) in original units (sigma = 1 / (sqrt(tau) y_std) on standardised
    targets) and Gal's KL (1-p) l'^2 / 2 ||M||^2 on non-inverted weights M = W / (1-p), the negative
    ELBO is proportional to that objective exactly when l' = l (1-p) y_std / sqrt(2) (biases, which
    Keras leaves undecayed, get the same tiny decay l'^2 / 2).
    """

    length_scale: float = 1e-2
    """Gal's prior length-scale l in his Keras weight decay l^2 (1 - p) / (2 N tau)"""

    def build(self, dataset, likelihood, guide):
        from bnn_zoo import priors

        p = getattr(guide, "p", None)
        if not isinstance(p, (int, float)):
            raise BnnZooError("the gal-keras prior belongs to the dropout guide with one drop probability: --guide dropout --guide.p P")
        prime = self.length_scale * (1 - p) * float(dataset.y_std) / math.sqrt(2)
        return priors.Normal(1 / prime)


# ---------------------------------------------------------------------------- likelihoods


class LikelihoodConfig:
    """The observation model; the default follows the data's task."""

    category = "likelihood"

    def build(self, dataset):
        raise NotImplementedError


@register("gaussian")
@dataclass
class Gaussian(LikelihoodConfig):
    """y ~ N(f, sigma^2): sigma learned (HalfNormal(1) prior), or fixed by scale (standardised units) or
    by precision tau = 1 / sigma^2 in the targets' original units (Gal & Ghahramani's tau)."""

    scale: float | None = None
    """fixed noise sd in standardised units (null: learned, unless precision is given)"""
    precision: float | None = None
    """fixed noise precision tau = 1 / sigma^2 in the targets' original units (null: learned, unless scale is given)"""

    task = "regression"

    def build(self, dataset):
        from bnn_zoo import likelihoods

        if self.scale is not None and self.precision is not None:
            raise BnnZooError("give the Gaussian likelihood a scale (standardised units) or a precision (original units), not both")
        if self.precision is not None:
            return likelihoods.Gaussian.from_precision(self.precision, y_std=float(dataset.y_std))
        return likelihoods.Gaussian(self.scale) if self.scale is not None else likelihoods.Gaussian.learned()


@dataclass
class _Discrete(LikelihoodConfig):
    task = "classification"
    cls_name = ""

    def build(self, dataset):
        from bnn_zoo import likelihoods

        return getattr(likelihoods, self.cls_name)()


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
    """The data's task decides; a simulated regression that knows its noise (toy-cubic) gets that noise.
    (With the noise learned, 20 points let SVI explain the cubic away as noise: a constant predictor,
    test RMSE 23.8; see docs/guide/defaults.md.)"""
    if known_noise and dataset.task == "regression" and "noise_scale" in dataset.info:
        return Gaussian(precision=1 / dataset.info["noise_scale"] ** 2)
    return DEFAULT_LIKELIHOOD[dataset.task]()


# ---------------------------------------------------------------------------- guides


class GuideConfig:
    """A variational family for SVI; its fields are the registered guide's options."""

    category = "guide"

    def options(self) -> dict:
        return dataclasses.asdict(self)

    def resolved(self, model: ModelConfig | UserNetwork) -> GuideConfig:
        """This guide with its architecture-dependent defaults written out (none unless a guide says)."""
        return self


@register("mean-field")
@dataclass
class MeanField(GuideConfig):
    """Diagonal Gaussian over every weight (Bayes by Backprop); local_reparam samples pre-activations."""

    init_scale: float = 1e-2
    """every weight's starting sd"""
    parametrization: Literal["softplus", "log"] = "softplus"
    """sd = softplus(rho) or exp(rho)"""
    local_reparam: bool = False
    """sample pre-activations instead of weights in training (Kingma et al. 2015; dense and conv layers)"""


@register("matrix-normal")
@dataclass
class MatrixNormal(GuideConfig):
    """Matrix-normal MN(M, U, V) per weight matrix (full Cholesky; rank=k for low rank + diagonal)."""

    init_scale: float = 1e-2
    """every weight's starting sd"""
    rank: int | None = None
    """null: full Cholesky U and V; k: diagonal plus rank k"""
    local_reparam: bool = False
    """sample a dense layer's outputs instead of its weights in training (not with scales)"""
    scales: bool | None = None
    """a scale per weight, with U and V correlation matrices; null: true on the recurrent models (docs/guide/defaults.md)"""

    def resolved(self, model):
        """Per-weight scales on the recurrent models. In Louizos & Welling's family a weight's sd moves
        with its row's and column's variances, which on toy-text's LSTMs reach the scale mixture's wide
        component within 3,000 steps: the majority class, 0.66. With a scale per weight it moves at
        mean-field's pace, and the tied LSTM reads the sentences (0.98; mean-field 0.95; docs/guide/defaults.md)."""
        return dataclasses.replace(self, scales=getattr(model, "text", False)) if self.scales is None else self


@register("flow")
@dataclass
class Flow(GuideConfig):
    """A normalizing flow over all weights (scope=joint) or one per weight matrix (scope=layer)."""

    transform: Literal["auto", "affine", "spline"] = "auto"
    """auto: affine autoregressive up to 1,024 latents, spline coupling above"""
    num_flows: int = 2
    """flow layers"""
    scope: Literal["joint", "layer"] = "joint"
    """joint: one flow over all latents; layer: one per weight matrix, mean-field elsewhere"""
    init_scale: float = 1e-2
    """every weight's starting sd"""
    hidden: Union[int, list[int], None] = None
    """coupling-net widths; null: 256 up to 4,096 latents, about 2^19 / latents above"""


@register("dropout")
@dataclass
class Dropout(GuideConfig):
    """Gal's dropout mixture (MC dropout as VI); p is the drop probability, one or one per weight matrix."""

    p: Union[float, list[float], None] = None
    """drop probability, one or one per weight matrix (null: 0.01 for regression, 0.1 otherwise)"""
    masks: Literal["step", "example"] | None = None
    """one mask per draw (step) or one per data point (example); null: example for regression, step otherwise"""

    def for_task(self, task: str) -> Dropout:
        """These options with the task's defaults written out (bnn_zoo.guides.dropout.default_options)."""
        from bnn_zoo.guides.dropout import default_options

        p, masks = default_options(task, self.p, self.masks)
        return dataclasses.replace(self, p=p, masks=masks)


# ---------------------------------------------------------------------------- inference


class InferenceConfig:
    """How the posterior is approximated; ``build`` gives the method ``bnn_zoo.fit`` takes."""

    category = "inference"
    takes_guide = False
    bnn = True  # False: the GP baseline, which replaces the BNN

    def build(self, run: RunConfig, model, dataset, checkpoint, progress):
        raise NotImplementedError

    def resolved(self, model: ModelConfig | UserNetwork) -> InferenceConfig:
        """This method with its architecture-dependent defaults written out (none unless a method says)."""
        return self

    def _given_or(self, **defaults) -> InferenceConfig:
        """This config with each of these fields that was not given (None) set to its default here."""
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def recurrent_prior(self) -> PriorConfig:
        """The recurrent models' prior under this method (the dropout guide aside): Blundell et al.'s scale
        mixture. Under a single Normal, mean-field SVI, SGLD and HMC on toy-text's LSTMs keep the prior
        and predict the majority class; the mixture's narrow component lets the weights the data do not
        need go quiet (docs/guide/defaults.md)."""
        return ScaleMixture()


FULL_BATCH = 1000  # SVI's and SG-MCMC's default: full batch up to this many training rows, minibatches of 128 above


def default_batch(batch_size: int | None, n: int) -> int | None:
    """The minibatch size a fit on n training rows uses, None for full batch: the one given, else full
    batch up to FULL_BATCH rows, else 128."""
    if batch_size is None:
        return None if n <= FULL_BATCH else 128
    return None if positive("--inference.batch_size", batch_size, integer=True) >= n else batch_size


@register("svi")
@dataclass
class SVI(InferenceConfig):
    """Stochastic VI with a guide (--guide): Adam on the ELBO, closed-form KL where it exists."""

    steps: int | None = None
    """optimisation steps (null: 3,000); or give epochs, not both"""
    epochs: int | None = None
    """passes over the training data (steps = epochs x batches per epoch)"""
    lr: float = 1e-2
    """Adam's learning rate"""
    lr_decay: float = 0.1
    """the rate falls geometrically to lr x lr_decay by the last step (1: constant; docs/guide/defaults.md)"""
    batch_size: int | None = None
    """minibatch size (null: full batch up to 1,000 training rows, 128 above)"""
    num_particles: int = 1
    """guide draws per step, vectorised"""
    kl_weight: float = 1.0
    """the KL discount tau: the optimum is the tempered posterior p(w) p(y | w)^(1 / tau)"""
    kl_warmup: int = 0
    """steps over which the KL weight rises linearly to kl_weight (0: none)"""
    objective: Literal["elbo", "renyi"] = "elbo"
    """the ELBO, or Li & Turner's Renyi bound of order alpha"""
    alpha: float = 0.5
    """the Renyi order (objective renyi)"""
    validation: float = 0.0
    """fraction of the training data held out for early stopping (0: none)"""
    eval_every: int = 100
    """steps between validation scores"""
    patience: int = 5
    """validation scores without improvement before stopping"""
    checkpoint_every: int = 1000
    """steps between checkpoints"""
    num_draws: int = 1000
    """guide draws kept for prediction and the InferenceData"""
    lockstep: bool = False
    """fit by the batched engine (bnn_zoo.inference.lockstep), alone or beside other fits"""
    direct: bool = True
    """the ELBO written out for bnn-zoo's guides (bnn_zoo.inference.elbo); false: Pyro's TraceMeanField_ELBO"""

    takes_guide = True

    def build(self, run, model, dataset, checkpoint, progress):
        from bnn_zoo.inference import SVI as Method

        if self.steps is not None and self.epochs is not None:
            raise BnnZooError("give svi steps or epochs, not both")
        guide = run.guide or run.default_guide()
        n = dataset.x_train.shape[0]
        batch_size = default_batch(self.batch_size, n)
        if self.epochs is not None:
            steps = positive("svi epochs", self.epochs, integer=True) * math.ceil(n / (batch_size or n))
        else:
            steps = 3000 if self.steps is None else self.steps  # SVI refuses steps below 1
        options = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("steps", "epochs", "lockstep")} | {"batch_size": batch_size}
        return Method(
            guide=guide.registered_name, guide_options=guide.options(), steps=steps, seed=run.seed, checkpoint=checkpoint, progress=progress, **options
        )


@dataclass
class _Chain(InferenceConfig):
    num_warmup: int = 500
    """warm-up iterations per chain"""
    num_samples: int = 500
    """draws kept per chain"""
    num_chains: int = 2
    """chains"""
    init: Literal["network", "prior", "svi"] = "network"
    """where each chain starts: the network's own initialisation, a prior draw, or an SVI fit"""
    max_hours: float | None = 2.0
    """stop with the fixes once the pace projects past it (the digits CNN's NUTS: 4 hours); null: no limit"""

    def build(self, run, model, dataset, checkpoint, progress):
        from bnn_zoo import inference

        init = None if self.init == "network" else self.init
        if init == "svi":  # a quick mean-field fit to start every chain from one of its draws
            quick = inference.SVI(steps=2000, lr=0.02, lr_decay=0.1, num_particles=4, seed=run.seed, progress=progress)
            init = inference.fit(model, *dataset.train, quick)
        method = inference.METHODS[self.registered_name]
        resumable = {"checkpoint": checkpoint} if self.registered_name == "chees" else {}  # Pyro's NUTS/HMC have no resumable state
        return method(**(dataclasses.asdict(self) | {"init": init} | resumable), seed=run.seed, progress=progress)

    def recurrent_prior(self):
        """The scale mixture with a narrow sd of 0.05, not 0.0025: a leapfrog step must resolve the narrow
        component and the steep bend between the two, so at 0.0025 HMC's step size on the tied LSTM fell
        to 1e-4 and its acceptance to 1e-9 at 1.3e-3; at 0.05 it settles at 2e-3-4e-3, as under a single
        Normal, and HMC's predictions read the sentences (test accuracy 1.0, against 0.66 under the fan-in
        Normal; docs/guide/defaults.md)."""
        return ScaleMixture(scale2=0.05)


@dataclass
class _PyroChain(_Chain):
    num_warmup: int | None = None
    """warm-up iterations per chain (null: 500; 100 on the cnn and the recurrent models)"""
    num_samples: int | None = None
    """draws kept per chain (null: 500; 100 on the cnn and the recurrent models)"""
    chain_method: Literal["parallel", "sequential"] = "parallel"
    """parallel: a forked process per chain, as many as cores; sequential: one after another"""

    def resolved(self, model):
        """500 warm-up iterations and 500 draws per chain; 100 and 100 on the models whose config sets
        ``short_chains`` (the CNN, the recurrent models). Every leapfrog step there is a pass of a
        13,770-26,000-weight network over all the training data, and Pyro's NUTS keeps building trees of
        511 steps after its mass matrix adapts (11-12 s an iteration on the digits CNN, 2026-11-24): 1,000
        iterations take 3.2 hours, 200 took 74 minutes, inside the 2-hour ``max_hours``, at test accuracy
        0.978 (2026-11-25; docs/guide/defaults.md)."""
        default = 100 if getattr(model, "short_chains", False) else 500
        return self._given_or(num_warmup=default, num_samples=default)


@register("nuts")
@dataclass
class NUTS(_PyroChain):
    """The No-U-Turn sampler (Pyro's), step size by dual averaging, diagonal mass matrix."""

    max_tree_depth: int | None = None
    """trees of at most 2^depth - 1 leapfrog steps (null: 10; 8 on the recurrent models)"""
    backend: Literal["auto", "torch", "jax"] = "auto"
    """jax: NumPyro's NUTS on the model traced to XLA (pip install 'bnn-zoo[jax]'); auto: jax where installed, except convolutional and recurrent models"""

    def resolved(self, model):
        """Trees of at most 2^10 - 1 leapfrog steps; 2^8 - 1 on the recurrent models, whose trees reach the
        cap at every draw (tied LSTM, 2026-11-25: 1,023 steps in all 200 kept draws). There a depth-10
        iteration of the untied LSTM took 37-65 s, so 200 of them ran past the 2-hour ``max_hours``;
        at depth 8 one takes 5-13 s, and NUTS reaches test accuracy 1.0 on all three in 20-33 minutes (docs/guide/defaults.md)."""
        return super().resolved(model)._given_or(max_tree_depth=8 if getattr(model, "text", False) else 10)


@register("hmc")
@dataclass
class HMC(_PyroChain):
    """Hamiltonian Monte Carlo with a fixed trajectory length (Pyro's), at most max_leapfrog steps a transition."""

    max_leapfrog: int | None = None
    """leapfrog steps per trajectory at most (null: 1,000; 255 on the cnn and the recurrent models)"""

    def resolved(self, model):
        """Trajectories of at most 1,000 leapfrog steps; 255 (NUTS's at depth 8) on the models with short
        chains, where each step is a pass of a 13,770-26,000-weight network over all the training data.
        Uncapped, dual averaging cut the digits CNN's step size 140x in three iterations, the fourth took
        2,995 steps and the time limit stopped the run (2026-11-25; docs/guide/defaults.md)."""
        return super().resolved(model)._given_or(max_leapfrog=255 if getattr(model, "short_chains", False) else 1000)


@register("chees")
@dataclass
class ChEES(_Chain):
    """Many HMC chains in lockstep, trajectory length by the ChEES criterion, jittered (Hoffman et al. 2021)."""

    num_warmup: int | None = None
    """warm-up iterations (null: 500; 200 on the recurrent models)"""
    num_samples: int | None = None
    """draws kept per chain (null: 250; 100 on the recurrent models)"""
    num_chains: int | None = None
    """chains run in lockstep (null: 16; 4 on the recurrent models)"""
    target_accept: float = 0.651
    """the mean acceptance rate dual averaging aims the step size at"""
    max_leapfrog: int | None = None
    """leapfrog steps per trajectory at most (null: 1,000; 255 on the recurrent models)"""
    mass_matrix: Literal["pooled", "within"] = "pooled"
    """pooled: the variance of all chains' draws; within: each chain's own, averaged (BNN modes; docs/guide/inference.md)"""
    compile: bool = False
    """torch.compile the potential: seconds to compile, each step 2.5-4x cheaper"""
    backend: Literal["auto", "torch", "jax"] = "auto"
    """jax: BlackJAX's ChEES on the model traced to XLA (pip install 'bnn-zoo[jax]'); auto: jax where installed, except convolutional and recurrent models"""

    def resolved(self, model):
        """16 chains of 500 warm-up iterations and 250 draws, trajectories of at most 1,000 steps; on the
        recurrent models 4 chains of 200 + 100 and at most 255 steps. A lockstep gradient there costs about
        0.011 s a chain (tied LSTM, 2 threads, 2026-11-25), and at the general defaults the time limit
        stopped every run (3 hours projected); with these ChEES finishes in 4-6 minutes at test accuracy
        0.93-0.97, its chains not mixed (docs/guide/defaults.md)."""
        if getattr(model, "text", False):
            return self._given_or(num_warmup=200, num_samples=100, num_chains=4, max_leapfrog=255)
        return self._given_or(num_warmup=500, num_samples=250, num_chains=16, max_leapfrog=1000)


@dataclass
class _SGMCMC(InferenceConfig):
    step_size: float | None = None
    """null: adapted in burn-in (a preconditioner from the chain's iterates, eps from the curvature); a number: that fixed step (the cyclical peak)"""
    batch_size: int | None = None
    """minibatch size (null: full batch up to 1,000 training rows, 128 above, as SVI)"""
    num_samples: int = 500
    """draws kept per chain"""
    thinning: int = 10
    """steps between kept draws"""
    burn_in: int = 5000
    """steps before the first kept draw; the adaptation with step_size null (cyclical: before its cycles)"""
    num_chains: int = 2
    """chains"""

    def build(self, run, model, dataset, checkpoint, progress):
        from bnn_zoo.inference import SGMCMC as Method

        options = dataclasses.asdict(self) | {"batch_size": default_batch(self.batch_size, dataset.x_train.shape[0])}
        return Method(kind=self.registered_name, seed=run.seed, checkpoint=checkpoint, progress=progress, **options)


@register("sgld")
@dataclass
class SGLD(_SGMCMC):
    """Stochastic-gradient Langevin dynamics (Welling & Teh 2011): minibatch MCMC, biased by O(step size)."""


@register("sghmc")
@dataclass
class SGHMC(_SGMCMC):
    """Stochastic-gradient HMC with friction (Chen et al. 2014)."""

    friction: float = 2.0
    """the momentum's friction (with step_size null, in units of the square root of the largest curvature: 2 damps critically)"""


@register("cyclical")
@dataclass
class Cyclical(_SGMCMC):
    """Cyclical SGLD (Zhang et al. 2020): cosine step-size cycles, draws in each cycle's second half."""

    cycles: int = 4
    """cosine step-size cycles"""
    exploration: float = 0.25
    """fraction of each cycle spent exploring (without noise) before draws are kept"""


@register("laplace")
@dataclass
class Laplace(InferenceConfig):
    """Laplace at the MAP (GGN full, diag or kron) with MacKay's evidence and type-II prior precision."""

    subset: Literal["all", "last_layer"] = "all"
    """all weights, or the last layer's only"""
    hessian: Literal["auto", "full", "diag", "kron"] = "auto"
    """the GGN's form; auto: full up to 5,000 weights, diag above"""
    optimize_prior: bool = True
    """choose the prior precision by MacKay's evidence (type II)"""
    map_steps: int = 2000
    """Adam steps to the MAP"""
    lr: float = 1e-2
    """Adam's learning rate for the MAP"""
    batch_size: int | None = None
    """Adam's minibatch size for the MAP (null: full batch)"""

    def recurrent_prior(self):
        """The fan-in Normal: Laplace's prior precision is a Normal's."""
        return FanIn()

    def build(self, run, model, dataset, checkpoint, progress):
        from bnn_zoo.inference import Laplace as Method

        return Method(seed=run.seed, progress=progress, **dataclasses.asdict(self))


@register("gp")
@dataclass
class GP(InferenceConfig):
    """A GPyTorch GP baseline by type-II ML; nngp is the infinite-width kernel of a relu MLP under the fan-in prior."""

    kernel: Literal["rbf", "matern52", "nngp"] = "rbf"
    """rbf, matern52, or nngp (the infinite-width kernel of a relu MLP under the fan-in prior)"""
    inducing: int = 128
    """inducing points of a classification GP"""
    steps: int = 300
    """Adam steps of type-II maximum likelihood"""
    lr: float = 0.05
    """Adam's learning rate"""

    bnn = False

    def build(self, run, model, dataset, checkpoint, progress):
        from bnn_zoo.baselines import TypeII

        return TypeII(steps=self.steps, lr=self.lr, seed=run.seed, progress=progress)

    def model(self, run: RunConfig, likelihood, classes: int, dataset):
        """The GP that replaces the BNN; kernel=nngp is the twin of the run's relu MLP and fan-in prior."""
        from bnn_zoo import likelihoods
        from bnn_zoo.baselines import GP as Model

        if dataset.task == "language-model" or "vocab" in dataset.info:
            raise BnnZooError("the GP baseline takes feature vectors or images, not text")
        if isinstance(likelihood, likelihoods.Gaussian) and likelihood.scale is not None:
            raise BnnZooError("a GP learns its noise by type II; drop the likelihood's scale or precision")
        depth, prior = 1, None
        if self.kernel == "nngp":
            if not (isinstance(run.model, MLP) and run.model.activation == "relu"):
                raise BnnZooError("kernel=nngp is the infinite-width limit of a relu MLP; pass --model mlp --model.activation relu")
            if not isinstance(run.prior, FanIn):
                raise BnnZooError("kernel=nngp needs --prior fanin (the infinite-width limit of a fan-in prior)")
            depth, prior = len(run.model.hidden), run.prior.build(dataset, likelihood, None)
        num_classes = classes if isinstance(likelihood, likelihoods.Categorical) else None
        return Model(self.kernel, likelihood, num_classes=num_classes, num_inducing=self.inducing, depth=depth, prior=prior)


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


@dataclass
class RunConfig:
    """One fit: what is fitted to what, how, and what is measured."""

    data: DataConfig = field(default_factory=ToyCubic)
    """what is fitted"""
    model: Union[ModelConfig, UserNetwork] = field(default_factory=MLP)
    """the network: a registered model or your own torch.nn.Module class"""
    prior: PriorConfig | None = None
    """null: normal for the dropout guide, the scale mixture on the recurrent models, fanin otherwise (docs/guide/defaults.md)"""
    likelihood: LikelihoodConfig | None = None
    """null: the data's task decides"""
    inference: InferenceConfig = field(default_factory=SVI)
    """how the posterior is approximated"""
    guide: GuideConfig | None = None
    """svi only; null: dropout for the recurrent models, mean-field otherwise"""
    evaluation: Evaluation = field(default_factory=Evaluation)
    """what is measured"""
    seed: int = 0
    """seeds the embedded datasets' draw (toy-cubic, toy-text), the network's start and every random draw of the fit"""
    device: str | None = None
    """cpu (default) or cuda: where a BNN is fitted"""

    def resolved(self, dataset) -> RunConfig:
        """This config with its data-dependent defaults written out (the likelihood, SVI's guide, the prior)."""
        likelihood = self.likelihood or default_likelihood(dataset, known_noise=self.inference.bnn)  # a GP learns its noise
        guide = self.guide or (self.default_guide() if self.inference.takes_guide else None)
        guide = guide and guide.resolved(self.model)
        guide = guide.for_task(dataset.task) if isinstance(guide, Dropout) else guide
        prior = self.prior or self.default_prior(guide)
        return dataclasses.replace(self, likelihood=likelihood, guide=guide, prior=prior, inference=self.inference.resolved(self.model))

    def default_prior(self, guide: GuideConfig | None) -> PriorConfig:
        """Normal for the dropout guide: Gal's KL is a weight decay (1 - p) / (2 N s^2) per weight, which
        under the fan-in prior (s^2 = 1 / fan_in) is hundreds of times the usual and collapses a CNN to
        chance. For the recurrent models the method's ``recurrent_prior`` (a scale mixture but for Laplace).
        The fan-in Normal elsewhere (docs/guide/defaults.md)."""
        if isinstance(guide, Dropout):
            return Normal()
        return self.inference.recurrent_prior() if getattr(self.model, "text", False) else FanIn()

    def default_guide(self) -> GuideConfig:
        """Gal's dropout for the recurrent models (his variational RNN); mean-field for the rest. Mean-field
        on toy-text's LSTMs keeps the prior: 0.66 accuracy, the majority class (docs/guide/defaults.md)."""
        return Dropout() if getattr(self.model, "text", False) else MeanField()

    def lockstep_ready(self) -> bool:
        """Whether the lockstep engine can fit this run (its own check, ``lockstep.why_not``, is final):
        SVI with the dropout or mean-field guide on dense layers, a fixed Gaussian noise, one particle,
        the ELBO and no early stopping."""
        inf, guide, lik = self.inference, self.guide or self.default_guide(), self.likelihood
        return (
            isinstance(inf, SVI)
            and isinstance(self.model, MLP | Linear)
            and (isinstance(guide, Dropout) or (isinstance(guide, MeanField) and not guide.local_reparam))
            and isinstance(lik, Gaussian)
            and (lik.scale is not None or lik.precision is not None)
            and inf.num_particles == 1
            and inf.objective == "elbo"
            and inf.validation == 0
        )

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
        if self.guide is not None and not self.inference.takes_guide:
            raise BnnZooError(f"a guide applies to svi, not {self.inference.registered_name}; drop --guide")
        if self.evaluation.evidence and not self.evaluation.training_evidence:
            raise BnnZooError("--evaluation.evidence estimates the training data's evidence, which --evaluation.training_evidence false skips; drop one")
        if self.evaluation.evidence and isinstance(self.inference, GP):
            raise BnnZooError("a GP's evidence is its own (log marginal likelihood or ELBO); drop --evaluation.evidence")
        if "iw" in self.evaluation.evidence and (not self.inference.takes_guide or isinstance(self.guide, Dropout)):
            raise BnnZooError("--evaluation.evidence iw needs a guide with a density (svi, not the dropout guide); use ais")
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


def config_hash(config: RunConfig) -> str:
    """A short stable key of a config (sweep cells are named by it). Fields at their defaults are left
    out, so a field added later with a default that keeps the old behaviour does not change old keys."""
    text = json.dumps(_non_default(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _non_default(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _non_default(getattr(value, f.name)) for f in dataclasses.fields(value) if getattr(value, f.name) != _default(f)}
        return fields if isinstance(value, RunConfig | Evaluation) else {"class_path": to_dict(value)["class_path"], "init_args": fields}
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
            name = next((n for n, c in REGISTRY[action.dest].items() if isinstance(default, dict) and default["class_path"].endswith(f".{c.__name__}")), None)
            options = f"; its options: --{action.dest}.help NAME"
            name = name or {
                "likelihood": "the data's task decides",
                "guide": "dropout for the recurrent models, mean-field otherwise; svi only",
                "prior": "normal with the dropout guide, the scale mixture on the recurrent models, fanin otherwise",
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
    """One parser for every ``from_dict`` (building it is half the cost of reading a config: 560 sweep
    cells took 114 s to check with a parser each); the command line builds its own, as it adds options."""
    return parser()


def from_dict(data: dict) -> RunConfig:
    """A RunConfig from its YAML/JSON form (``to_dict``'s inverse; kinds may be given by name), checked by
    the same parser as the command line."""
    p = _object_parser()
    try:
        namespace = p.parse_object(with_names_resolved(data))
    except Exception as exc:  # jsonargparse reports bad configs as ArgumentError or TypeError
        raise BnnZooError(f"bad run config: {exc}") from None
    return from_namespace(p, namespace)


def from_namespace(p, namespace) -> RunConfig:
    """The RunConfig a parsed namespace describes (its classes instantiated), checked."""
    built = p.instantiate(namespace)
    return RunConfig(**{f.name: built[f.name] for f in dataclasses.fields(RunConfig)}).check()


def resolve_names(argv: list[str]) -> list[str]:
    """Command-line shorthand: ``--guide dropout`` for the registered class, ``--model pkg.mod:Class`` for
    ``pkg.mod.Class``, and the same names inside a ``--config`` file. (jsonargparse names a choice by its
    class; the zoo's names are lower-case.) An unknown name is refused here, with the choices."""
    from bnn_zoo.io import read_yaml

    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--config":  # jsonargparse takes the config's content as well as its path
            out[i + 1] = json.dumps(with_names_resolved(read_yaml(out[i + 1], "run config")))
            continue
        kind = arg[2:].removesuffix(".help") if arg.startswith("--") else None
        if kind in REGISTRY and not out[i + 1].startswith(("{", "[", "-")):
            out[i + 1] = named_choice(kind, out[i + 1])["class_path"]
    return out


def parse_error_message(exc: Exception) -> str:
    """jsonargparse's error for a bad option as one line in the command line's own terms:
    ``--inference.lr: expected a float, got inf``; ``--inference.step_size is not an option of nuts
    (its options: ...)``. Anything else is jsonargparse's message folded onto one line."""
    text = str(exc)
    keys = re.findall(r'Parser key "([^"]+)"', text)
    chosen = re.search(r"class_path '[\w.]+\.(\w+)'", text)
    cls = next((c for c in REGISTRY.get(keys[0] if keys else "", {}).values() if chosen and c.__name__ == chosen[1]), None)
    unknown = re.search(r"Option '(\w+)' is not accepted", text)
    if unknown and cls is not None:
        options = ", ".join(f.name for f in dataclasses.fields(cls)) or "none"
        return f"--{keys[0]}.{unknown[1]} is not an option of {keys[0]} {cls.registered_name} (its options: {options})"
    expected = [_type_name(t) for t in re.findall(r"Expected an? (<class '\w+'>|typing\.Literal\[[^]]*\])", text) if "NoneType" not in t]
    given = re.search(r"(?:Got|Given) value: (.*)", text)
    if keys and expected and given:
        return f"--{'.'.join(keys)}: expected {' or '.join(dict.fromkeys(expected))}, got {given[1].strip()}"
    lines = [line.strip(" -") for line in text.splitlines()]
    return "; ".join(line for line in lines if line and not line.startswith(("Subtypes:", "Errors:", "Given value"))).replace(":;", ":")


def _type_name(hint: str) -> str:
    """``<class 'float'>`` -> a float; ``typing.Literal['ais', 'iw']`` -> one of ais, iw."""
    if hint.startswith("typing.Literal"):
        return "one of " + ", ".join(re.findall(r"'([^']*)'", hint))
    name = hint.split("'")[1]
    return {"int": "a whole number", "float": "a number", "list": "a list like [1, 2]", "bool": "true or false", "str": "a string"}.get(name, name)
