"""Extension points: Pyro AutoGuides and plain guide functions through bz.fit, a prior per site, and
hide/expose (a last-layer BNN), each checked against a closed form where one exists."""

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from conftest import NOISE, flat
from pyro.distributions.transforms import Permute
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal
from torch.distributions import MultivariateNormal, kl_divergence

import bnn_zoo as bz
from bnn_zoo.bnn import last_layer
from bnn_zoo.evaluation.exact import linear_regression
from bnn_zoo.scaling import Scaling
from bnn_zoo.variational import parameters

FAST = dict(steps=1500, lr=0.05, lr_decay=0.05, num_particles=8, seed=0, progress=False)


def _exact_elbo(exact, loc, cov):
    """ELBO = log Z - KL(q || p(w | D)) for a Gaussian q (weights then bias)."""
    q = MultivariateNormal(loc.double(), cov.double())
    return exact.log_evidence - kl_divergence(q, MultivariateNormal(exact.mean, exact.cov)).item()


# an instance goes the class's way through bz.fit, with a denser guide: slow lane
@pytest.mark.parametrize(
    "kind", ["AutoNormal class", pytest.param("AutoLowRankMultivariateNormal instance", marks=pytest.mark.slow)]
)
def test_pyro_autoguides_fit_through_bz_fit_with_elbo_below_the_evidence(kind, blr_model, blr_data, blr_exact):
    if kind == "AutoNormal class":
        guide = AutoNormal  # bnn-zoo builds it on the model, started at the network's initialisation
    else:
        with pyro.settings.context(module_local_params=True):
            guide = AutoLowRankMultivariateNormal(blr_model, rank=2, init_scale=0.05)
    post = bz.fit(blr_model, *blr_data, bz.SVI(guide=guide, **FAST), standardize=False)
    assert post.settings["guide"].startswith("pyro.infer.autoguide.guides:Auto")
    if kind == "AutoNormal class":
        loc_scale = {k: post.guide._get_loc_and_scale(k) for k in ("layers.0.weight", "layers.0.bias")}
        loc = flat({k: v[0] for k, v in loc_scale.items()}).detach()
        cov = torch.diag(flat({k: v[1] for k, v in loc_scale.items()}).detach() ** 2)
    else:
        # over the packed latent: the weight (1, 3), then the bias, as `flat` orders them
        q = post.guide.get_posterior()
        loc, cov = q.loc.detach(), q.covariance_matrix.detach()
    exact_elbo = _exact_elbo(blr_exact, loc, cov)
    estimate, se = post.elbo(num_samples=4000)
    assert exact_elbo < blr_exact.log_evidence
    assert abs(estimate - exact_elbo) < 4 * se + 1e-3, (estimate, se, exact_elbo)
    assert estimate < blr_exact.log_evidence + 3 * se
    assert blr_exact.log_evidence - exact_elbo < 1.0  # the fit converged near the optimum of the family
    assert pyro.settings.get("module_local_params") is False  # bnn-zoo's scoping leaked nothing


def test_a_plain_guide_function_fits_and_its_elbo_is_a_lower_bound(blr_model, blr_data, blr_exact):
    pyro.clear_param_store()

    def guide(x, y=None, batch_size=None):
        for name, shape in blr_model.latent_shapes().items():
            loc = pyro.param(f"my.{name}.loc", torch.zeros(shape))
            scale = pyro.param(f"my.{name}.scale", 0.1 * torch.ones(shape), constraint=dist.constraints.positive)
            pyro.sample(name, dist.Normal(loc, scale).to_event(len(shape)))

    post = bz.fit(blr_model, *blr_data, bz.SVI(guide=guide, **FAST), standardize=False)
    estimate, se = post.elbo(num_samples=4000)
    loc = flat({k: pyro.param(f"my.{k}.loc").detach() for k in blr_model.params})
    scale = flat({k: pyro.param(f"my.{k}.scale").detach() for k in blr_model.params})
    assert abs(estimate - _exact_elbo(blr_exact, loc, torch.diag(scale**2))) < 4 * se + 1e-3
    with pytest.raises(bz.BnnZooError, match="guide_options apply"):
        bz.SVI(guide=guide, guide_options={"rank": 2})


def test_per_site_prior_gives_each_parameter_its_distribution():
    net = bz.models.MLP(3, [4], 2)
    student = dist.StudentT(3.0, 0.0, 2.0)
    prior = bz.priors.PerSite(
        {net.layers[1]: student, "layers.0.bias": bz.priors.Normal(0.5)}, default=bz.priors.FanInNormal()
    )
    model = bz.BNN(net, prior, bz.likelihoods.Gaussian(1.0))
    tr = pyro.poutine.trace(model).get_trace(torch.randn(5, 3))
    for name in ("layers.1.weight", "layers.1.bias"):
        value = tr.nodes[name]["value"]
        assert torch.allclose(tr.nodes[name]["fn"].log_prob(value), student.log_prob(value).sum())
    bias = tr.nodes["layers.0.bias"]["value"]
    assert torch.allclose(tr.nodes["layers.0.bias"]["fn"].log_prob(bias), dist.Normal(0.0, 0.5).log_prob(bias).sum())
    weight = tr.nodes["layers.0.weight"]["value"]  # the default: N(0, 1 / fan_in) with fan_in = 3
    assert torch.allclose(
        tr.nodes["layers.0.weight"]["fn"].log_prob(weight), dist.Normal(0.0, 3**-0.5).log_prob(weight).sum()
    )
    with pytest.raises(bz.BnnZooError, match="batch shape"):
        bz.BNN(net, bz.priors.PerSite({"layers.1.weight": dist.Normal(torch.zeros(7), 1.0)}))(torch.randn(5, 3))
    with pytest.raises(bz.BnnZooError, match="prior must be"):
        bz.BNN(net, prior="normal")
    with pytest.raises(bz.BnnZooError, match="likelihood must be"):
        bz.BNN(net, likelihood="gaussian")


def test_hide_and_expose_select_the_bayesian_parameters():
    net = bz.models.MLP(2, [8, 8], 1)
    assert last_layer(net) == "layers.2"
    exposed = bz.BNN(net, expose=[last_layer(net)])
    hidden = bz.BNN(net, hide=["layers.0", net.layers[1]])
    assert list(exposed.params) == list(hidden.params) == ["layers.2.weight", "layers.2.bias"]
    assert set(exposed.fixed) == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}
    assert list(bz.BNN(net, expose=["*.bias"]).params) == ["layers.0.bias", "layers.1.bias", "layers.2.bias"]
    with pytest.raises(bz.BnnZooError, match="matches no parameter"):
        bz.BNN(net, expose=["head"])
    with pytest.raises(bz.BnnZooError, match="not both"):
        bz.BNN(net, expose=["layers.2"], hide=["layers.0"])


def test_last_layer_bnn_is_exact_bayesian_linear_regression_on_the_features():
    """With the feature layers held fixed, the last layer's posterior is BLR on the features: NUTS on the
    last-layer BNN matches the closed form within Monte Carlo error."""
    torch.manual_seed(3)
    x = torch.linspace(-2, 2, 25)[:, None]
    y = torch.sin(2 * x[:, 0]) + NOISE * torch.randn(25)
    net = bz.models.MLP(1, [3], 1, activation="tanh")
    model = bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Gaussian(NOISE), expose=[last_layer(net)])
    post = bz.fit(
        model, x, y, bz.NUTS(num_warmup=200, num_samples=400, num_chains=2, seed=0, progress=False), standardize=False
    )
    with torch.no_grad():
        features = torch.tanh(net.layers[0](x))
    exact = linear_regression(features, y, weight_scale=1.0, bias_scale=1.0, noise_scale=NOISE)
    draws = torch.cat([post.samples["layers.1.weight"].reshape(2, 400, -1), post.samples["layers.1.bias"]], -1).double()
    idata = post.to_inference_data()
    mcse = torch.cat(
        [
            torch.as_tensor(az.mcse(idata, method="mean")[k].values).reshape(-1)
            for k in ("layers.1.weight", "layers.1.bias")
        ]
    )
    assert torch.all((draws.reshape(-1, 4).mean(0) - exact.mean).abs() < 4 * mcse.double() + 1e-3)
    # sd's MC error ~4% at 800 draws
    assert torch.allclose(draws.reshape(-1, 4).std(0), exact.cov.diagonal().sqrt(), rtol=0.15)


def test_last_layer_bnn_on_the_toy_regression_fits_features_and_widens_its_band():
    data = bz.data.toy_cubic()
    net = bz.models.MLP(1, [50], 1)
    model = bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned(), expose=[last_layer(net)])
    before = {k: v.clone() for k, v in model.fixed.items()}
    scaling = Scaling.of(*data.train)
    x, y = scaling.inputs(data.x_train), scaling.targets(data.y_train)  # standardised by hand
    post = bz.fit(
        model,
        x,
        y,
        bz.SVI(steps=1500, lr=0.02, lr_decay=0.1, num_particles=4, progress=False),
        standardize=False,
    )
    assert all(torch.equal(model.fixed[k], v) for k, v in before.items())  # the user's model is not mutated
    assert not torch.equal(post.model.fixed["layers.0.weight"], before["layers.0.weight"])  # features were fitted
    train_rmse = (post.predict(x).mean - y[:, None]).pow(2).mean().sqrt()
    assert train_rmse < 0.5  # standardised units (a constant predictor scores 1): the cubic is fitted
    # the model's band (f, without the noise that dilutes it) is wider away from the data (inputs in -1.6..1.8):
    # 1.75-2.6x at x = 6 over four SVI seeds and both thread counts, where 1.3x would be a failure
    sd = post.predict(torch.tensor([[0.0], [6.0]])).f.std(0)[:, 0]
    assert sd[1] > 1.3 * sd[0]
    # the Laplace-ready hook: a plain module at given weights, gradients only for the Bayesian ones
    mean = {k: v.mean(0) for k, v in post.draws().items() if k in post.model.params}
    module = post.model.network(mean)
    grid = torch.linspace(-2, 2, 9)[:, None]
    assert torch.allclose(module(grid), post.model.forward(mean, grid), atol=1e-6)
    assert [n for n, p in module.named_parameters() if p.requires_grad] == ["layers.1.weight", "layers.1.bias"]


def test_device_is_chosen_at_fit_and_checked(blr_model, blr_data):
    method = bz.SVI(steps=20, num_draws=10, progress=False)
    on_cpu = bz.fit(blr_model, *blr_data, method, device="cpu", standardize=False)
    assert on_cpu.model.device.type == "cpu" and torch.equal(
        on_cpu.samples["layers.0.weight"],
        bz.fit(blr_model, *blr_data, method, standardize=False).samples["layers.0.weight"],
    )
    assert torch.equal(on_cpu.to("cpu").predict(blr_data[0]).f, on_cpu.predict(blr_data[0]).f)
    if not torch.cuda.is_available():
        with pytest.raises(bz.BnnZooError, match="no CUDA device"):
            bz.fit(blr_model, *blr_data, method, device="cuda", standardize=False)
    with pytest.raises(bz.BnnZooError, match="unknown device"):
        bz.fit(blr_model, *blr_data, method, device="banana", standardize=False)


GUIDES_AND_OPTIONS = [
    ("mean-field", {}),
    ("matrix-normal", {}),
    ("matrix-normal", {"rank": 2}),
    ("flow", {}),
    ("flow", {"scope": "layer"}),
]


@pytest.mark.parametrize("guide, options", GUIDES_AND_OPTIONS)
def test_a_guide_is_built_where_its_model_lives(guide, options):
    """Shape-only 'meta' tensors stand in for a GPU, which CI lacks: a guide built for a model moved there
    makes every parameter there. One made on the CPU is the mixed-device error a CUDA fit raised
    (the mean-field scales did, on an H100, 2026-11-23)."""
    x, y = torch.randn(20, 1, device="meta"), torch.randn(20, 1, device="meta")
    model = bz.BNN(bz.models.MLP(1, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned()).to("meta")
    with pyro.validation_enabled(False):  # argument checks read values, which meta tensors do not have
        params = parameters(bz.SVI(guide=guide, guide_options=options, progress=False).build_guide(model), x, y)
    assert params and {p.device.type for p in params} == {"meta"}


@pytest.mark.parametrize("options", [{"transform": "affine"}, {"transform": "spline"}, {"scope": "layer"}])
def test_the_flows_permutations_follow_it_through_to(options):
    """The permutations between flow layers are Transforms, not modules, so .to() passed them by:
    posterior.to("cpu") after a CUDA fit left them on the GPU and scoring failed (H100, 2026-11-24)."""
    model = bz.BNN(bz.models.MLP(1, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned())
    guide = bz.SVI(guide="flow", guide_options=options, progress=False).build_guide(model)
    parameters(guide, torch.randn(20, 1), torch.randn(20, 1))
    guide.to("meta")
    perms = [t.permutation for m in guide.modules() for t in getattr(m, "_layers", []) if isinstance(t, Permute)]
    assert perms and {p.device.type for p in perms} == {"meta"}


def test_the_dropout_guides_cached_sites_follow_it_through_to():
    """.to() moves the locs in place, but a cached point mass holds its own log-density tensor: the sites
    must be rebuilt (a dtype here; on a GPU, posterior.to("cpu") kept it on CUDA)."""
    model = bz.BNN(bz.models.MLP(1, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.1))
    guide = bz.SVI(guide="dropout", progress=False).build_guide(model)
    parameters(guide, torch.randn(5, 1), torch.randn(5, 1))
    guide.site_distributions()  # cached
    guide.to(torch.float64)
    q, _ = guide.site_distributions()["layers.0.bias"]
    assert q.log_density.dtype == torch.float64
