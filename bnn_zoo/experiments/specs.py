"""Command-line specs (``name[:key=value;key=value]``) for models, priors and likelihoods."""

from __future__ import annotations

from bnn_zoo import likelihoods, priors
from bnn_zoo.errors import BnnZooError
from bnn_zoo.models import MLP

MODELS = {"mlp": "MLP; options hidden=50,50 and activation=tanh|relu|sigmoid|elu|gelu",
          "linear": "linear model (Bayesian linear regression with a Gaussian likelihood)"}
PRIORS = {"fanin": "N(0, gain^2/fan_in) weights, N(0, bias_scale^2) biases; options gain, bias_scale (default)",
          "normal": "N(0, scale^2) on every weight (Gal: scale = 1/length-scale); option scale"}
LIKELIHOODS = {"gaussian": "Gaussian, noise learned under HalfNormal(1), or fixed with scale=S (standardised units)",
               "bernoulli": "binary labels 0/1", "categorical": "class labels 0..C-1"}


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


def build_net(spec: str, in_features: int, out_features: int):
    name, opts = parse(spec, MODELS)
    if name == "linear":
        _done(opts, spec)
        return MLP(in_features, [], out_features)
    hidden = _take(opts, "hidden", lambda v: [int(h) for h in v.split(",") if h], [50], spec)
    activation = _take(opts, "activation", str, "tanh", spec)
    _done(opts, spec)
    return MLP(in_features, hidden, out_features, activation)


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


def build_likelihood(spec: str):
    name, opts = parse(spec, LIKELIHOODS)
    if name == "gaussian":
        scale = _take(opts, "scale", float, None, spec)
        lik = likelihoods.Gaussian(scale) if scale is not None else likelihoods.Gaussian.learned()
    else:
        lik = likelihoods.Bernoulli() if name == "bernoulli" else likelihoods.Categorical()
    _done(opts, spec)
    return lik
