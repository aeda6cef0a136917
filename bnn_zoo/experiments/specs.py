"""Command-line specs (``name[:key=value;key=value]``) for models, priors and likelihoods."""

from __future__ import annotations

from bnn_zoo import likelihoods, priors
from bnn_zoo.errors import BnnZooError
from bnn_zoo.models import MLP, LeNet, TextRNN

MODELS = {
    "mlp": "MLP; options hidden=50,50 and activation=tanh|relu|sigmoid|elu|gelu",
    "linear": "linear model (Bayesian linear regression with a Gaussian likelihood)",
    "cnn": "LeNet on images (digits); options channels=16,32, kernel=3, pool=2, dense=64, dropout=all (lenet-all) | dense (lenet-ip)",
    "lstm-tied": "embedding + LSTM with one (4K, D+K) gate matrix + head; options embed=32, hidden=64",
    "lstm-untied": "as lstm-tied with separate W_g, U_g per gate (independent dropout masks per gate)",
    "embedding-rnn": "lstm-untied whose embedding also takes word-type dropout; option gates=tied|untied",
}
PRIORS = {
    "fanin": "N(0, gain^2/fan_in) weights, N(0, bias_scale^2) biases; options gain, bias_scale (default)",
    "normal": "N(0, scale^2) on every weight (Gal: scale = 1/length-scale); option scale",
}
INFERENCE = {
    "svi": "stochastic VI with a guide (--guide)",
    "nuts": "No-U-Turn sampler (Pyro)",
    "hmc": "Hamiltonian Monte Carlo (Pyro)",
    "gp": "GPyTorch GP baseline by type-II ML; options kernel=rbf|matern52|nngp (default rbf), inducing=128 (classification)",
    "sgld": "stochastic-gradient Langevin dynamics (minibatch MCMC; --lr is the step size)",
    "sghmc": "stochastic-gradient HMC with friction (Chen et al. 2014)",
    "cyclical": "cyclical SGLD (Zhang et al. 2020): cosine step-size cycles, draws in each cycle's second half",
    "laplace": "Laplace at the MAP with MacKay's evidence; options subset=all|last_layer, hessian=full|diag|kron, "
    "optimize_prior=true|false (type-II prior precision)",
}
LIKELIHOODS = {
    "gaussian": "Gaussian, noise learned under HalfNormal(1), or fixed with scale=S (standardised units)",
    "bernoulli": "binary labels 0/1",
    "categorical": "class labels 0..C-1",
    "tokens": "next-token labels for language models (the default on text corpora)",
}


def parse(spec: str, known: dict) -> tuple[str, dict[str, str]]:
    name, _, rest = spec.partition(":")
    if name not in known:
        raise BnnZooError(f"unknown name {name!r} in {spec!r}; choose one of: {', '.join(known)}")
    options = {}
    for item in filter(None, rest.split(";")):
        key, eq, value = item.partition("=")
        if not eq:
            raise BnnZooError(f"bad option {item!r} in {spec!r}; write key=value, options separated by ';'")
        options[key.strip()] = value.strip()
    return name, options


def _take(options, key, convert, default, spec):
    if key not in options:
        return default
    try:
        return convert(options.pop(key))
    except ValueError:
        raise BnnZooError(f"bad value for {key!r} in {spec!r}") from None


def _done(options, spec):
    if options:
        raise BnnZooError(f"unknown option(s) {', '.join(options)} in {spec!r}; run `bnn-zoo list` for what each takes")


def _ints(value):
    return [int(h) for h in value.split(",") if h]


def build_net(spec: str, dataset, out_features: int):
    """The network a model spec names, sized for ``dataset`` (its features, image shape or vocabulary)."""
    name, opts = parse(spec, MODELS)
    text_task = dataset.task == "language-model" or "vocab" in dataset.info
    if (name in ("lstm-tied", "lstm-untied", "embedding-rnn")) != text_task:
        raise BnnZooError(
            f"model {name!r} does not fit {dataset.name}: recurrent models take text data (toy-text, text:PATH), the others take feature vectors or images"
        )
    if name == "linear":
        _done(opts, spec)
        return MLP(dataset.in_features, [], out_features)
    if name == "mlp":
        hidden, activation = _take(opts, "hidden", _ints, [50], spec), _take(opts, "activation", str, "tanh", spec)
        _done(opts, spec)
        return MLP(dataset.in_features, hidden, out_features, activation)
    if name == "cnn":
        shape = dataset.info.get("image_shape")
        if shape is None:
            raise BnnZooError(f"the cnn model needs image data (digits); {dataset.name} has no image shape")
        net = LeNet(
            shape,
            _take(opts, "channels", _ints, [16, 32], spec),
            _take(opts, "kernel", int, 3, spec),
            _take(opts, "pool", int, 2, spec),
            _take(opts, "dense", int, 64, spec),
            out_features,
            _take(opts, "dropout", str, "all", spec),
        )
        _done(opts, spec)
        return net
    gates = "tied" if name == "lstm-tied" else _take(opts, "gates", str, "untied", spec)
    embed, hidden = _take(opts, "embed", int, 32, spec), _take(opts, "hidden", int, 64, spec)
    _done(opts, spec)
    head = "lm" if dataset.task == "language-model" else "classify"
    return TextRNN(len(dataset.info["vocab"]), embed, hidden, gates, head, out_features, embedding_dropout=name == "embedding-rnn")


def build_prior(spec: str):
    name, opts = parse(spec, PRIORS)
    if name == "normal":
        prior = priors.Normal(_take(opts, "scale", float, 1.0, spec))
    else:
        prior = priors.FanInNormal(_take(opts, "gain", float, 1.0, spec), _take(opts, "bias_scale", float, 1.0, spec))
    _done(opts, spec)
    return prior


def guide_options(spec: str) -> tuple[str, dict]:
    """``name[:key=value;...]`` for a registered guide; values become int, float or str."""
    from bnn_zoo import guides

    name, opts = parse(spec, guides.DESCRIPTIONS)
    return name, {k: _number(v) for k, v in opts.items()}


def _number(value: str):
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def default_likelihood(task: str) -> str:
    return {"regression": "gaussian", "classification": "categorical", "language-model": "tokens"}[task]


def build_likelihood(spec: str):
    name, opts = parse(spec, LIKELIHOODS)
    if name == "gaussian":
        scale = _take(opts, "scale", float, None, spec)
        lik = likelihoods.Gaussian(scale) if scale is not None else likelihoods.Gaussian.learned()
    else:
        lik = {"bernoulli": likelihoods.Bernoulli, "categorical": likelihoods.Categorical, "tokens": likelihoods.Tokens}[name]()
    _done(opts, spec)
    return lik


def build_gp(spec: str, opts: dict, net_spec: str, prior, likelihood, classes: int, dataset):
    """The GP baseline a ``--inference gp[:...]`` spec names. kernel=nngp is the twin of ``net_spec``: an
    MLP with relu units, whose depth (hidden layers) and fan-in prior it takes."""
    from bnn_zoo.baselines import GP

    kernel, inducing = _take(opts, "kernel", str, "rbf", spec), _take(opts, "inducing", int, 128, spec)
    _done(opts, spec)
    if dataset.task == "language-model" or "vocab" in dataset.info:
        raise BnnZooError("the GP baseline takes feature vectors or images, not text")
    if isinstance(likelihood, likelihoods.Gaussian) and likelihood.scale is not None:
        raise BnnZooError("a GP learns its noise by type II; drop the scale from --likelihood")
    depth = 1
    if kernel == "nngp":
        name, net_opts = parse(net_spec, MODELS)
        hidden, activation = _take(net_opts, "hidden", _ints, [50], net_spec), _take(net_opts, "activation", str, "tanh", net_spec)
        if name != "mlp" or activation != "relu":
            raise BnnZooError("kernel=nngp is the infinite-width limit of a relu MLP; pass --model mlp:activation=relu[;hidden=...]")
        if not isinstance(prior, priors.FanInNormal):
            raise BnnZooError("kernel=nngp needs --prior fanin (the infinite-width limit of a fan-in prior)")
        depth = len(hidden)
    num_classes = classes if isinstance(likelihood, likelihoods.Categorical) else None
    return GP(kernel, likelihood, num_classes=num_classes, num_inducing=inducing, depth=depth, prior=prior if kernel == "nngp" else None)


def laplace_options(spec: str, opts: dict) -> dict:
    """The Laplace options a ``--inference laplace[:subset=...;hessian=...;optimize_prior=...]`` spec names."""
    from bnn_zoo.guides import flag

    out = {
        "subset": _take(opts, "subset", str, "all", spec),
        "hessian": _take(opts, "hessian", str, "full", spec),
        "optimize_prior": flag(_take(opts, "optimize_prior", str, "true", spec)),
    }
    _done(opts, spec)
    return out
