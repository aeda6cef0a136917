"""The BNN model: sites, minibatch scaling, vectorised evaluation, priors, predictions on a hand case."""

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from torch.distributions import biject_to

import bnn_zoo as bz
from bnn_zoo.likelihoods import Gaussian


def _mlp_model(**kw):
    return bz.BNN(bz.models.MLP(2, [4, 3], 1, activation="relu"), **{"likelihood": bz.likelihoods.Gaussian(1.0), **kw})


def test_sites_are_named_after_parameters_and_minibatch_scales_only_the_likelihood():
    model = _mlp_model()
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    tr = poutine.trace(model).get_trace(x, y, batch_size=4)
    # data: the subsample
    latent = [n for n, s in tr.nodes.items() if s["type"] == "sample" and not s["is_observed"] and n != "data"]
    assert latent == [n for n, _ in model.net.named_parameters()]
    assert tr.nodes["layers.0.weight"]["value"].shape == (4, 2)
    assert tr.nodes["y"]["scale"] == pytest.approx(10 / 4)
    assert tr.nodes["y"]["value"].shape == (4, 1)
    assert tr.nodes["layers.0.weight"]["scale"] == 1.0


# the MLP's forward_draws: matrix and one-output layers
@pytest.mark.parametrize("hidden, out", [([4], 1), ([], 1), ([4, 3], 2)])
def test_vectorised_forward_equals_a_loop_over_draws(hidden, out):
    model = bz.BNN(bz.models.MLP(2, hidden, out, "tanh"), bz.priors.Normal(1.0), Gaussian(0.1))
    x = torch.randn(7, 2)
    draws = {k: torch.randn(2, 3, *p.shape) for k, p in model.params.items()}
    batched = model.forward(draws, x)
    looped = torch.stack(
        [torch.stack([model.forward({k: v[i, j] for k, v in draws.items()}, x) for j in range(3)]) for i in range(2)]
    )
    assert batched.shape == (2, 3, 7, out)
    torch.testing.assert_close(batched, looped)
    # per-draw inputs with per-example masks, as lockstep gives them
    masks = {"layers.0.weight": torch.rand(6, 7, 2) < 0.5}
    xs = torch.randn(6, 7, 2)
    flat = {k: v.reshape(6, *v.shape[2:]) for k, v in draws.items()}
    masked = torch.stack(
        [model.forward({k: v[s] for k, v in flat.items()}, xs[s] * masks["layers.0.weight"][s]) for s in range(6)]
    )
    torch.testing.assert_close(model.net.forward_draws(flat, xs, masks), masked)


def _lenet_draw(net, weights, x, masks):
    """One draw of the LeNet by its own forward, each mask multiplying its layer's input (as lockstep's hooks)."""
    hooks = [
        net.get_submodule(name.rpartition(".")[0]).register_forward_pre_hook(lambda m, args, mask=mask: args[0] * mask)
        for name, mask in masks.items()
    ]
    try:
        return torch.func.functional_call(net, weights, (x,))
    finally:
        for h in hooks:
            h.remove()


@pytest.mark.parametrize("inputs", ["shared", "per-draw", "per-draw masked", "shared masked"])
def test_the_lenets_forward_draws_equal_its_forward_draw_by_draw(inputs):
    """Outputs and weight gradients, to float32 rounding; the masks of a convolution (C, H, W) and of
    dense layers (in,) per example, as lockstep draws them; a masked shared input becomes per draw."""
    net = bz.models.LeNet(channels=(4, 6), dense=8, out_features=3)
    g = torch.Generator().manual_seed(0)
    draws, rows = 3, 5
    weights = {k: (0.5 * torch.randn(draws, *p.shape, generator=g)).requires_grad_() for k, p in net.named_parameters()}
    x = torch.rand(rows, 64, generator=g) if inputs.startswith("shared") else torch.rand(draws, rows, 64, generator=g)
    masks = {}
    if inputs.endswith("masked"):
        masks = {
            "features.4.weight": torch.rand(draws, rows, 4, 4, 4, generator=g) < 0.7,
            "hidden.weight": torch.rand(draws, rows, 24, generator=g) < 0.7,
            "out.weight": torch.rand(draws, rows, 8, generator=g) < 0.7,
        }
    batched = net.forward_draws(weights, x, masks)
    looped = torch.stack(
        [
            _lenet_draw(
                net,
                {k: v[s] for k, v in weights.items()},
                x if x.dim() == 2 else x[s],
                {k: m[s] for k, m in masks.items()},
            )
            for s in range(draws)
        ]
    )
    assert batched.shape == (draws, rows, 3)
    torch.testing.assert_close(batched, looped)
    ours = torch.autograd.grad(batched.square().sum(), list(weights.values()))
    theirs = torch.autograd.grad(looped.square().sum(), list(weights.values()))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_model_runs_under_vectorised_particles():
    model = _mlp_model(likelihood=Gaussian.learned())
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    with pyro.plate("particles", 3, dim=-2):
        tr = poutine.trace(model).get_trace(x, y)
    tr.compute_log_prob()
    assert tr.nodes["y"]["log_prob"].shape == (3, 10)
    assert tr.nodes["noise_scale"]["value"].shape == (3, 1)


def test_priors():
    w = torch.zeros(8, 32)
    assert bz.priors.FanInNormal(gain=2.0).scale_of("l.weight", w) == pytest.approx(2 / math.sqrt(32))
    assert bz.priors.FanInNormal(bias_scale=0.3).scale_of("l.bias", torch.zeros(8)) == 0.3
    prior = bz.priors.Normal(1.0, layer_scales={"layers.1": 0.5, "layers.1.bias": 0.1})
    assert prior.scale_of("layers.1.weight", w) == 0.5
    assert prior.scale_of("layers.1.bias", w) == 0.1
    assert prior.scale_of("layers.10.weight", w) == 1.0  # prefix match is per name component
    assert bz.priors.Normal.from_length_scale(4.0).scale == 0.25  # Gal: p(w) = N(0, l^-2 I)
    d = prior("layers.1.weight", w)
    assert d.event_shape == w.shape and d.log_prob(w).item() == pytest.approx(
        256 * (math.log(2) - 0.5 * math.log(2 * math.pi))
    )


def test_scale_mixture_prior_is_blundells_density_and_refuses_bad_scales():
    w = torch.tensor([[0.0, 0.003], [-0.5, 2.0]])
    d = bz.priors.ScaleMixture(pi=0.25, scale1=1.0, scale2=0.01)("layers.0.weight", w)

    def normal(v, s):
        return math.exp(-0.5 * (v / s) ** 2) / (s * math.sqrt(2 * math.pi))

    by_hand = sum(math.log(0.25 * normal(v, 1.0) + 0.75 * normal(v, 0.01)) for v in w.flatten().tolist())
    assert d.event_shape == w.shape and d.log_prob(w).item() == pytest.approx(by_hand, abs=1e-5)
    assert torch.equal(biject_to(d.support)(w), w)  # real-valued: the flow guide maps its latents with biject_to
    for bad in ({"pi": 1.0}, {"scale2": 2.0}, {"scale2": 0.0}, {"scale1": math.inf}):
        with pytest.raises(bz.BnnZooError, match="scale mixture needs"):
            bz.priors.ScaleMixture(**bad)


def test_the_gaussian_log_likelihood_written_out_equals_its_distribution():
    g = torch.Generator().manual_seed(0)
    f, y = torch.randn(3, 5, 2, generator=g), torch.randn(5, 2, generator=g)
    fixed, learned = bz.likelihoods.Gaussian(0.3), bz.likelihoods.Gaussian.learned()
    latent = {learned.site: torch.rand(3, generator=g) + 0.1}  # one noise scale per draw
    # a learned sigma: torch's operations, to the bit; a fixed one: its terms as numbers, to float32 rounding
    assert torch.equal(learned.log_prob(f, latent, y), learned.distribution(f, latent).log_prob(y))
    torch.testing.assert_close(fixed.log_prob(f, {}, y), fixed.distribution(f, {}).log_prob(y), rtol=1e-6, atol=1e-6)
    for lik, lat in ((fixed, {}), (learned, latent)):
        assert lik.log_prob(f, lat, y).shape == (3, 5)


def test_prediction_moments_and_log_likelihood_on_a_hand_case():
    # two draws of f at one point, learned noise scales 1 and 2
    f = torch.tensor([[[1.0]], [[3.0]]])
    pred = bz.Prediction(f, {"noise_scale": torch.tensor([1.0, 2.0])}, Gaussian.learned())
    assert pred.mean.item() == pytest.approx(2.0)
    assert pred.model_variance.item() == pytest.approx(1.0)  # ((1-2)^2 + (3-2)^2) / 2
    assert pred.noise_variance.item() == pytest.approx(2.5)  # (1 + 4) / 2
    assert pred.variance.item() == pytest.approx(3.5)
    y = torch.tensor([[2.0]])
    n = lambda m, s: math.exp(-0.5 * ((2 - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))  # noqa: E731
    assert pred.log_likelihood(y).item() == pytest.approx(math.log((n(1, 1) + n(3, 2)) / 2), rel=1e-6)


def test_gal_mc_dropout_predictive_with_fixed_precision():
    # Gal eq. 3.18: logsumexp_t(-tau/2 ||y - f_t||^2) - log T - 1/2 log 2pi + 1/2 log tau, tau = 1/sigma^2
    f = torch.tensor([[[0.0]], [[1.0]], [[4.0]]])
    tau = 4.0
    pred = bz.Prediction(f, {}, Gaussian(scale=tau**-0.5))
    expected = (
        torch.logsumexp(-tau / 2 * (1.0 - f[:, 0, 0]) ** 2, 0)
        - math.log(3)
        - 0.5 * math.log(2 * math.pi)
        + 0.5 * math.log(tau)
    )
    assert pred.log_likelihood(torch.tensor([[1.0]])).item() == pytest.approx(expected.item(), rel=1e-6)
    assert pred.variance.item() == pytest.approx(1 / tau + f.var(0, unbiased=False).item())


def test_classification_fits_and_predicts_probabilities():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 2, generator=g)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # three classes
    model = bz.BNN(bz.models.MLP(2, [16], 3), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    post = bz.fit(model, x, labels, bz.SVI(steps=600, lr=0.05, progress=False, num_draws=200))
    pred = post.predict(x)
    torch.testing.assert_close(pred.probs.sum(-1), torch.ones(80))
    assert (pred.probs.argmax(-1) == labels).float().mean() > 0.85
    bern = bz.BNN(bz.models.MLP(2, [8], 1), likelihood=bz.likelihoods.Bernoulli())
    post = bz.fit(bern, x, (x[:, 0] > 0).float(), bz.SVI(steps=400, lr=0.05, progress=False, num_draws=100))
    assert ((post.predict(x).probs[:, 0] > 0.5) == (x[:, 0] > 0)).float().mean() > 0.9


def test_any_torch_module_becomes_a_bnn():
    from torch import nn

    net = nn.Sequential(nn.Linear(2, 5), nn.Tanh(), nn.Linear(5, 1))  # declares no in/out_features
    model = bz.BNN(net, bz.priors.FanInNormal(), Gaussian(0.3))
    x = torch.randn(30, 2)
    y = x[:, 0] - x[:, 1]
    post = bz.fit(model, x, y, bz.SVI(steps=300, lr=0.03, progress=False, num_draws=50))
    assert set(post.samples) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert post.to_inference_data().posterior["2.weight"].dims == ("chain", "draw", "2.out", "2.in")
    nuts = bz.fit(model, x, y, bz.NUTS(num_warmup=20, num_samples=20, num_chains=1, progress=False))
    assert nuts.predict(x[:3]).f.shape == (20, 3, 1)
    with pytest.raises(
        bz.BnnZooError, match=r"the network cannot take x of shape \(30, 3\) .* check the number of features"
    ):
        bz.fit(model, torch.randn(30, 3), y, bz.SVI(steps=1, progress=False))


@pytest.mark.parametrize(
    "make",
    [
        lambda: bz.models.MLP(3, [5], 2),
        lambda: bz.models.LeNet((1, 4, 4), channels=(2,), dense=5, out_features=3),
        lambda: bz.models.TextRNN(7, 4, 5, "tied"),
        lambda: bz.models.TextRNN(7, 4, 5, "untied", embedding_dropout=True),
    ],
    ids=["mlp", "cnn", "lstm-tied", "lstm-untied-embedding"],
)
def test_network_init_redraws_every_weight_from_the_seed_alone(make):
    """network_init(seed), where SVI's guide and every chain start, is a function of the seed: the same
    seed gives the same weights whatever the global generator did, another seed other weights, every
    one of them. (The recurrent models' LSTM and embedding had no reset_parameters, so their weights
    stayed where the network was built: SVI on toy-text reached 0.91 in one run and 0.98 in the next.)"""
    import warnings

    model = bz.BNN(make(), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = model.network_init(0)
        torch.manual_seed(123)
        again, other = model.network_init(0), model.network_init(1)
    assert set(first) == set(model.params)
    for name, value in first.items():
        assert torch.equal(value, again[name]), name
        assert not torch.equal(value, other[name]), name


def test_network_init_warns_about_weights_no_reset_parameters_redraws():
    class Bare(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 3)
            self.scale = torch.nn.Parameter(torch.randn(3))  # owned by the root: nothing re-draws it

        def forward(self, x):
            return self.inner(x) * self.scale

    model = bz.BNN(Bare(), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.1))
    with pytest.warns(UserWarning, match=r"^scale: no reset_parameters\(\) re-draws"):
        model.network_init(0)
