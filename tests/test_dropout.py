"""The dropout guide against Gal's thesis: eq. 3.14 (gradient relation), eq. 3.18 (predictive), eqs. 3.13/3.17."""

import math
from unittest import mock

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

import bnn_zoo as bz
from bnn_zoo import local_noise
from bnn_zoo.guides import dropout
from bnn_zoo.local_noise import InputDropout
from bnn_zoo.scaling import Scaling, in_fit_units

N, TAU, L = 40, 4.0, 2.0  # data size, model precision (noise sd 1/2), prior length-scale
P = [0.2, 0.4]  # drop probability of the inputs, and of the hidden units


def _setup(masks):
    torch.manual_seed(0)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    model = bz.BNN(
        bz.models.MLP(3, [16], 1), bz.priors.Normal.from_length_scale(L), bz.likelihoods.Gaussian(1 / math.sqrt(TAU))
    )
    guide = bz.guides.build("dropout", model, model.network_init(0), p=P, masks=masks)
    guide(x, y)
    return x, y, model, guide


def _standard_dropout_loss(guide, x, y, e1, e2):
    """Gal's eq. 3.11: (1/N) sum 1/2 ||y - f||^2 with inputs and hidden units masked (no rescaling), plus weight
    decay."""
    m1, b1, m2, b2 = (guide.loc(k) for k in ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"))
    out = (torch.tanh((x * e1) @ m1.T + b1) * e2) @ m2.T + b2
    lam1, lam2 = (dropout.weight_decay(p, L, TAU, N) for p in P)
    lam_bias = dropout.weight_decay(0.0, L, TAU, N)
    return (
        0.5 * (y - out).pow(2).sum(-1).mean()
        + lam1 * m1.pow(2).sum()
        + lam2 * m2.pow(2).sum()
        + lam_bias * (b1.pow(2).sum() + b2.pow(2).sum())
    )


def _grads(loss, guide):
    guide.zero_grad()
    loss.backward()
    return {k: p.grad.clone() for k, p in guide.locs.named_parameters()}


def _check_relation(ours, theirs):
    """d(our negative ELBO) / (N tau) == d(standard dropout loss), parameter by parameter."""
    assert ours.keys() == theirs.keys() and len(ours) == 4
    for k in ours:
        assert torch.allclose(ours[k] / (N * TAU), theirs[k], rtol=1e-4, atol=1e-7), k


def test_shared_masks_gradient_is_standard_dropout_with_weight_decay_eq_3_14():
    x, y, model, guide = _setup("step")
    spy = poutine.trace(guide)
    ours = _grads(TraceMeanField_ELBO().differentiable_loss(model, spy, x, y), guide)
    # the guide's draw is M with whole input columns zeroed: read the masks back from it
    e1, e2 = ((spy.trace.nodes[k]["value"].abs().amax(0) > 0).float() for k in ("layers.0.weight", "layers.1.weight"))
    assert 0 < e1.sum() < 3 or 0 < e2.sum() < 16, "the draw dropped nothing: the test would not test masking"
    _check_relation(ours, _grads(_standard_dropout_loss(guide, x, y, e1, e2), guide))


def test_per_example_masks_gradient_is_ordinary_dropout_eq_3_9():
    x, y, model, guide = _setup("example")
    masks, original = [], InputDropout.inputs

    def recording(self, module, h):
        out = original(self, module, h)
        masks.append((out != 0).float())  # inputs here are never exactly 0
        return out

    with mock.patch.object(InputDropout, "inputs", recording):
        ours = _grads(TraceMeanField_ELBO().differentiable_loss(model, guide, x, y), guide)
    e1, e2 = masks
    assert e1.shape == (N, 3) and e2.shape == (N, 16)
    assert len({tuple(r) for r in e2.tolist()}) > N // 2, "per-example masks must differ between data points"
    _check_relation(ours, _grads(_standard_dropout_loss(guide, x, y, e1, e2), guide))


def test_a_learned_p_follows_concrete_dropouts_objective():
    """Gal, Hron & Kendall (2017), eqs. 3-5: with p learned, the negative ELBO / (N tau) is the dropout loss of
    eq. 3.11 with relaxed masks z = 1 - sigmoid((logit p + logit u) / t), plus (1-p) weight decay on M and
    -K H(p) / (N tau) per weight matrix (K its input units); the gradients in M and in logit p agree."""
    torch.manual_seed(0)
    x, y = torch.randn(N, 3), torch.randn(N, 1)
    model = bz.BNN(
        bz.models.MLP(3, [16], 1), bz.priors.Normal.from_length_scale(L), bz.likelihoods.Gaussian(1 / math.sqrt(TAU))
    )
    guide = bz.guides.build("dropout", model, model.network_init(0), p=P, masks="example", learn_p=True)
    guide(x, y)
    uniforms, original = [], local_noise.relaxed_keep_mask

    def recording(shape, keep, temperature, like):  # the uniforms the mask was drawn from, drawn again
        state = torch.get_rng_state()
        mask = original(shape, keep, temperature, like)
        after = torch.get_rng_state()
        torch.set_rng_state(state)
        uniforms.append(torch.rand(shape, dtype=like.dtype).clamp(1e-7, 1 - 1e-7))
        torch.set_rng_state(after)
        return mask

    with mock.patch.object(local_noise, "relaxed_keep_mask", recording):
        loss = TraceMeanField_ELBO().differentiable_loss(model, guide, x, y) / (N * TAU)
    params = [guide.loc("layers.0.weight"), guide.loc("layers.1.weight"), *guide.logits.parameters()]
    ours = torch.autograd.grad(loss, params)

    p1, p2 = (guide.rate(k) for k in ("layers.0.weight", "layers.1.weight"))
    z1, z2 = (
        1 - torch.sigmoid((p.log() - torch.log1p(-p) + u.log() - torch.log1p(-u)) / dropout.TEMPERATURE)
        for p, u in zip((p1, p2), uniforms)
    )
    m1, b1, m2, b2 = (guide.loc(k) for k in ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"))
    out = (torch.tanh((x * z1) @ m1.T + b1) * z2) @ m2.T + b2
    entropy = lambda p: -(p * p.log() + (1 - p) * torch.log1p(-p))  # noqa: E731
    theirs = (
        0.5 * (y - out).pow(2).sum(-1).mean()
        + (1 - p1) * L**2 / (2 * N * TAU) * m1.pow(2).sum()
        + (1 - p2) * L**2 / (2 * N * TAU) * m2.pow(2).sum()
        + dropout.weight_decay(0.0, L, TAU, N) * (b1.pow(2).sum() + b2.pow(2).sum())
        - (3 * entropy(p1) + 16 * entropy(p2)) / (N * TAU)
    )
    assert [u.shape for u in uniforms] == [(N, 3), (N, 16)]
    for a, b in zip(ours, torch.autograd.grad(theirs, params)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7)
    assert all(g.abs() > 0 for g in ours[2:])


def test_a_relaxed_mask_keeps_a_unit_above_one_half_with_probability_keep():
    """P(z > 1/2) = P(logit u < logit(1 - p)) = 1 - p at any temperature; 40,000 draws: 4 se = 0.006."""
    keep = torch.tensor(0.7, requires_grad=True)
    z = local_noise.relaxed_keep_mask((40_000,), keep, 0.1, torch.zeros(()))
    assert float((z > 0.5).float().mean()) == pytest.approx(0.7, abs=0.006)
    assert float(((z < 0.01) | (z > 0.99)).float().mean()) > 0.8  # near Bernoulli at t = 0.1
    z.sum().backward()
    assert keep.grad > 0


def test_a_learned_p_is_fitted_reported_and_saved(tmp_path):
    """The fitted p lands in metrics and the saved folder; a fit with learned p runs alone, not in lockstep."""
    torch.manual_seed(0)
    x = torch.randn(100, 2)
    y = x[:, :1] + 0.1 * torch.randn(100, 1)
    model = bz.BNN(bz.models.MLP(2, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.1))
    svi = bz.SVI(guide="dropout", guide_options={"learn_p": True}, steps=200, progress=False)
    post = bz.fit(model, x, y, svi)
    rates = post.info["dropout_p"]
    assert set(rates) == {"layers.0.weight", "layers.1.weight"} and all(0 < r < 1 and r != 0.01 for r in rates.values())
    assert post.guide.rates() == rates and post.guide.mean()["layers.0.weight"].equal(
        (1 - rates["layers.0.weight"]) * post.guide.loc("layers.0.weight")
    )
    post.save(tmp_path / "run")
    loaded = bz.load(tmp_path / "run")
    assert loaded.guide.rates() == rates
    from bnn_zoo.inference import lockstep

    assert lockstep.why_not(lockstep.Job(model, x, y, svi)) == "a learned p is not in the lockstep ELBO"
    with pytest.raises(bz.BnnZooError, match="learn_p is true or false"):
        bz.guides.build("dropout", model, model.network_init(0), learn_p="yes")


def test_masks_are_shared_per_draw_or_drawn_per_example():
    x = torch.ones(200, 3)
    for masks, distinct in (("step", 1), ("example", 10)):
        _, _, model, guide = _setup(masks)
        guide.train()
        with pyro.plate("particles", 2, dim=-2):
            tr = poutine.trace(guide).get_trace(x, None)
            f = poutine.replay(model, trace=tr)(x)
        for particle in f:
            assert len(torch.unique(particle)) >= distinct if masks == "example" else len(torch.unique(particle)) == 1


def test_mc_dropout_predictive_and_test_log_likelihood_eq_3_18_on_a_hand_case():
    """Linear net y = w . x + b, M = (1, 2), b = 0.5, p = 0.5, tau = 4, x* = (1, 1): the four masks give
    f = 3.5, 1.5, 2.5, 0.5. By hand: mean 2, variance 1/4 + (12.25 + 2.25 + 6.25 + 0.25)/4 - 4 = 1.5,
    and at y* = 2: log(2 e^-0.5 + 2 e^-4.5) - log 4 - log(2 pi)/2 + log(4)/2."""
    model = bz.BNN(bz.models.MLP(2, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    x, y = torch.zeros(3, 2), torch.zeros(3)
    guide = bz.guides.build(
        "dropout", model, {"layers.0.weight": torch.tensor([[1.0, 2.0]]), "layers.0.bias": torch.tensor([0.5])}, p=0.5
    )
    with pyro.plate("draws", 4000, dim=-2):
        draws = poutine.trace(guide).get_trace(x, y).nodes["layers.0.weight"]["value"].reshape(4000, 1, 2)
    patterns = {tuple(w.flatten().tolist()) for w in draws}
    assert patterns == {(1.0, 2.0), (1.0, 0.0), (0.0, 2.0), (0.0, 0.0)}
    assert abs((draws[:, 0, 1] == 0).float().mean() - 0.5) < 4 * math.sqrt(0.25 / 4000)
    samples = {
        "layers.0.weight": torch.tensor([[[[1.0, 2.0]], [[1.0, 0.0]], [[0.0, 2.0]], [[0.0, 0.0]]]]),
        "layers.0.bias": torch.full((1, 4, 1), 0.5),
    }
    post = bz.Posterior(model, x, y, samples, {"method": "svi", "guide": "dropout"}, guide=guide)
    pred = post.predict(torch.ones(1, 2))
    assert pred.f.flatten().tolist() == [3.5, 1.5, 2.5, 0.5]
    assert pred.mean.item() == pytest.approx(2.0, abs=1e-6)
    assert pred.variance.item() == pytest.approx(1.5, abs=1e-6)
    hand = (
        math.log(2 * math.exp(-0.5) + 2 * math.exp(-4.5))
        - math.log(4)
        - 0.5 * math.log(2 * math.pi)
        + 0.5 * math.log(4)
    )
    assert pred.log_likelihood(torch.tensor([2.0])).item() == pytest.approx(hand, abs=1e-6)
    standard = post.predict(torch.ones(1, 2), at_mean=True)  # weight scaling: (1 - p) M . x + b = 0.5 * 3 + 0.5
    assert standard.f.flatten().tolist() == [2.0] and standard.variance.item() == pytest.approx(0.25)


def test_weight_decay_helpers_invert_each_other_under_both_conventions():
    p, lam = 0.3, dropout.weight_decay(0.3, L, TAU, N)
    assert lam == pytest.approx(L**2 * 0.7 / (2 * N * TAU))
    assert dropout.length_scale(p, lam, TAU, N) == pytest.approx(L)
    assert dropout.precision(p, L, lam, N) == pytest.approx(TAU)
    lam_inv = dropout.weight_decay(p, L, TAU, N, inverted=True)
    m = torch.randn(5, 4)  # inverted dropout trains W = (1 - p) M: the same penalty on the same function
    assert (lam_inv * ((1 - p) * m).pow(2).sum()).item() == pytest.approx((lam * m.pow(2).sum()).item(), rel=1e-6)
    assert dropout.length_scale(p, lam_inv, TAU, N, inverted=True) == pytest.approx(L)
    assert dropout.precision(p, L, lam_inv, N, inverted=True) == pytest.approx(TAU)


def test_dropout_has_no_elbo_and_refuses_renyi():
    x, y, model, _ = _setup("step")
    post = bz.fit(model, x, y, bz.SVI(guide="dropout", steps=5, progress=False, num_draws=10))
    with pytest.raises(bz.BnnZooError, match="no density"):
        post.elbo()
    with pytest.raises(bz.BnnZooError, match="Renyi objective needs log q"):
        bz.fit(model, x, y, bz.SVI(guide="dropout", objective="renyi", num_particles=2, steps=5, progress=False))
    with pytest.raises(bz.BnnZooError, match="2 weight matrices take dropout"):
        bz.fit(model, x, y, bz.SVI(guide="dropout", guide_options={"p": [0.1, 0.2, 0.3]}, steps=5, progress=False))


def test_gal_keras_prior_makes_the_elbo_the_published_keras_objective():
    """Gal & Ghahramani's code: MSE on standardised targets + l^2 (1-p) / (2 N tau) ||W_keras||^2 with
    inverted dropout (W_keras = (1-p) M) and tau in original units. With the gal-keras prior and a
    Gaussian of precision tau in original units, our negative ELBO's weight gradient is that loss's
    times N tau y_std^2 / 2 (the biases' tiny decay l'^2 / 2 is the one difference: Keras has none)."""
    from bnn_zoo.experiments import config

    p, tau, length, y_std = 0.2, 2.5, 1e-2, 7.0
    data = bz.data.Dataset("d", torch.randn(N, 3), y_std * torch.randn(N), torch.randn(5, 3), torch.randn(5))
    guide_config = config.Dropout(p=p, masks="step")
    likelihood = config.Gaussian(precision=tau).build(data)
    prior = config.GalKeras(length).build(data, likelihood, guide_config)
    # the model and data as bz.fit fits them: standardised, the noise 1 / sqrt(tau) over y_std
    x, y = data.x_train, data.y_train[:, None]
    model, x, y = in_fit_units(bz.BNN(bz.models.MLP(3, [16], 1), prior, likelihood), x, y, Scaling.of(x, y))
    guide = bz.guides.build("dropout", model, model.network_init(0), p=p, masks="step")
    spy = poutine.trace(guide)
    ours = _grads(TraceMeanField_ELBO().differentiable_loss(model, spy, x, y), guide)
    e1, e2 = ((spy.trace.nodes[k]["value"].abs().amax(0) > 0).float() for k in ("layers.0.weight", "layers.1.weight"))
    m1, b1, m2, b2 = (guide.loc(k) for k in ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"))
    out = (torch.tanh((x * e1) @ m1.T + b1) * e2) @ m2.T + b2
    decay = length**2 * (1 - p) / (2 * N * tau)  # Keras' on W_keras = (1-p) M
    keras = (y - out).pow(2).mean() + decay * (1 - p) ** 2 * (m1.pow(2).sum() + m2.pow(2).sum())
    theirs = _grads(keras, guide)
    scale = N * tau * float(data.y_std) ** 2 / 2
    for k in ours:  # guide.locs' parameters: M1, b1, M2, b2
        exact = "weight" in k
        torch.testing.assert_close(
            ours[k] / scale, theirs[k], rtol=1e-4 if exact else 1e-3, atol=1e-8 if exact else 1e-6
        )


def test_the_defaults_follow_the_task_alike_from_python_and_the_command_line():
    """Regression: p learned from 0.01 with a mask per data point, under the fan-in prior on the command
    line; a given p stays fixed. Classification: p = 0.1 fixed, one mask per draw, under N(0, 1). The
    command line resolves the same values into its config.yaml, so both routes fit the same guide."""
    from bnn_zoo.data import digits, toy_cubic
    from bnn_zoo.experiments import config as cfg

    reg = bz.BNN(bz.models.MLP(1, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    clf = bz.BNN(bz.models.MLP(64, [8], 10), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    for model, p, masks, learned in ((reg, 0.01, "example", 2), (clf, 0.1, "step", 0)):
        guide = bz.guides.build("dropout", model, model.network_init(0))
        assert set(guide.p.values()) == {p} and guide.masks == masks and len(guide.learned) == learned
    fixed = bz.guides.build("dropout", reg, reg.network_init(0), p=0.05)
    assert fixed.learned == [] and set(fixed.rates().values()) == {0.05}
    for dataset, p, masks, learn_p, prior in (
        (toy_cubic(), 0.01, "example", True, cfg.FanIn),
        (digits(), 0.1, "step", False, cfg.Normal),
    ):
        run = cfg.RunConfig(guide=cfg.Dropout()).resolved(dataset)
        assert (run.guide.p, run.guide.masks, run.guide.learn_p) == (p, masks, learn_p)
        assert isinstance(run.prior, prior)
    explicit = cfg.RunConfig(guide=cfg.Dropout(p=0.2, masks="step")).resolved(toy_cubic())
    assert (explicit.guide.p, explicit.guide.masks, explicit.guide.learn_p) == (0.2, "step", False)
