"""SVI's direct ELBO is Pyro's TraceMeanField_ELBO, in value and gradient, for the same draws: on
every guide that states its site distributions and every model family (dense, convolutional,
recurrent with tied and untied gates, the embedding-dropout RNN), with per-example noise, a learned
noise scale (a KL with no closed form), minibatches and vectorised particles."""

import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

import bnn_zoo as bz
from bnn_zoo import guides
from bnn_zoo.inference.elbo import DirectELBO, applies

V = 7  # vocabulary of the text models


def _mlp():
    x = torch.randn(40, 3)
    return (
        bz.BNN(bz.models.MLP(3, [6], 1, "relu"), bz.priors.Normal(1.5), bz.likelihoods.Gaussian.learned()),
        x,
        x.sum(1, keepdim=True),
    )


def _cnn():
    net = bz.models.LeNet((1, 6, 6), channels=[2], dense=4, out_features=3, dropout="all")
    return (
        bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Categorical()),
        torch.randn(20, 36),
        torch.randint(0, 3, (20,)),
    )


def _text(gates, embedding_dropout=False):
    net = bz.models.TextRNN(V, 3, 4, gates=gates, embedding_dropout=embedding_dropout)
    return (
        bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Categorical()),
        torch.randint(0, V, (20, 5)).float(),
        torch.randint(0, 2, (20,)),
    )


MODELS = {
    "mlp": _mlp,
    "cnn": _cnn,
    "lstm-tied": lambda: _text("tied"),
    "lstm-untied": lambda: _text("untied"),
    "embedding-rnn": lambda: _text("tied", True),
}
GUIDES = [
    ("mean-field", {}),
    ("mean-field", {"local_reparam": True}),
    ("matrix-normal", {"rank": 2}),
    ("matrix-normal", {"local_reparam": True}),
    ("matrix-normal", {"scales": True}),
    ("dropout", {"p": 0.3}),
    ("dropout", {"p": 0.3, "masks": "example"}),
]
SKIP = {  # combinations the library refuses anyway (local reparameterisation needs dense or conv layers)
    ("matrix-normal", True, "cnn"),
    *((g, True, m) for g in ("mean-field", "matrix-normal") for m in ("lstm-tied", "lstm-untied", "embedding-rnn")),
}


def _both_losses(model, guide, x, y, batch_size, particles, seed=0):
    """The direct loss and Pyro's for the same guide draws, minibatch and per-example noise."""
    y = model.likelihood.check_targets(y, model.net(x[:1]).shape[-1])
    direct = DirectELBO(model, particles)
    torch.manual_seed(seed)
    ours = direct.differentiable_loss(model, guide, x, y, batch_size)
    # replay the direct path's draws: the sites it sampled, in order, then the RNG state its model saw
    torch.manual_seed(seed)
    shape = torch.Size([particles]) if particles > 1 else torch.Size()
    values = {}
    for name, (q, infer) in guide.site_distributions().items():
        if "local_noise" in infer and direct._closed_form_kl(name, q) is not None:
            continue
        values[name] = q.rsample(shape)
    state = torch.get_rng_state()
    with torch.random.fork_rng(device_type="cuda"):
        trace = poutine.trace(guide).get_trace(x, y)
    for name, value in values.items():
        trace.nodes[name]["value"] = value

    def replayed(*args):
        out = poutine.replay(guide, trace=trace)(*args)
        torch.set_rng_state(state)
        return out

    assert particles == 1, "Pyro's vectorised particles draw through a plate; compared in the particles test"
    theirs = TraceMeanField_ELBO().differentiable_loss(model, replayed, x, y, batch_size)
    return ours, theirs


def _grads(loss, params):
    return torch.autograd.grad(loss, params, allow_unused=True)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize(
    "guide_name, options", GUIDES, ids=[f"{g}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for g, o in GUIDES]
)
def test_direct_elbo_equals_trace_mean_field_elbo(model_name, guide_name, options):
    if (guide_name, bool(options.get("local_reparam")), model_name) in SKIP:
        pytest.skip("local reparameterisation is refused on this architecture")
    torch.manual_seed(0)
    model, x, y = MODELS[model_name]()
    guide = guides.make(guide_name, model, model.network_init(0), options)
    guide.train()
    assert applies(model, guide)
    batch = 8 if model_name == "mlp" else None  # a minibatch: the N / M scaling and the subsample
    ours, theirs = _both_losses(model, guide, x, y, batch, 1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)
    params = [p for p in guide.parameters() if p.requires_grad]
    for a, b in zip(_grads(ours, params), _grads(theirs, params)):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_vectorised_particles_average_the_per_particle_loss():
    """With P particles the direct loss is the mean of P one-particle losses on the same draws."""
    model, x, y = _mlp()
    y = y.reshape(-1, 1)
    guide = guides.make("mean-field", model, model.network_init(0), {"init_scale": 0.2})
    torch.manual_seed(3)
    many = DirectELBO(model, 4).differentiable_loss(model, guide, x, y)
    torch.manual_seed(3)
    draws = {name: q.rsample((4,)) for name, (q, _) in guide.site_distributions().items()}
    one = DirectELBO(model, 1)
    singles = []
    for k in range(4):  # particle k's loss: its draw's KL terms and full-data log-likelihood
        values = {name: v[k] for name, v in draws.items()}
        kl = 0.0
        for name, (q, _) in guide.site_distributions().items():
            closed = one._closed_form_kl(name, q)
            kl = kl + (
                closed if closed is not None else q.log_prob(values[name]) - one.priors[name].log_prob(values[name])
            )
        weights = {n: v for n, v in values.items() if n in model.params}
        latent = {n: v for n, v in values.items() if n not in model.params}
        singles.append(-model.likelihood.distribution(model.forward(weights, x), latent).log_prob(y).sum() + kl)
    torch.testing.assert_close(many, torch.stack(singles).mean(), rtol=1e-5, atol=1e-4)


def test_svi_runs_the_direct_elbo_only_where_it_applies():
    model, x, y = _mlp()
    assert isinstance(
        bz.SVI().objective_for(model, guides.make("mean-field", model, model.network_init(0))), DirectELBO
    )
    assert not isinstance(
        bz.SVI(direct=False).objective_for(model, guides.make("mean-field", model, model.network_init(0))), DirectELBO
    )
    flow = guides.make("flow", model, model.network_init(0))
    assert not applies(model, flow)  # a joint flow has no per-site distributions: Pyro's ELBO
    assert bz.SVI(direct=False).settings()["direct"] is False and "direct" not in bz.SVI().settings()


def test_direct_and_pyro_fits_agree_in_distribution():
    """Bayesian linear regression, mean-field: the fitted means of both loops sit at the exact
    mean-field optimum (the posterior mean) within a few of their seed-to-seed spreads."""
    torch.manual_seed(0)
    x = torch.randn(50, 2)
    y = x @ torch.tensor([0.7, -1.1]) + 0.5 * torch.randn(50)
    exact = torch.linalg.solve(x.T @ x / 0.25 + torch.eye(2), x.T @ y / 0.25)

    def means(direct):
        out = []
        for seed in range(4):
            model = bz.BNN(
                bz.models.MLP(2, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5), expose=["layers.0.weight"]
            )
            post = bz.fit(
                model,
                x,
                y,
                bz.SVI(steps=600, lr=0.05, seed=seed, direct=direct, progress=False, num_draws=10),
                standardize=False,
            )
            out.append(post.guide.loc_and_scale("layers.0.weight")[0].detach().flatten())
        return torch.stack(out)

    for direct in (True, False):
        m = means(direct)
        # 4 standard errors over seeds
        assert ((m.mean(0) - exact).abs() < 4 * m.std(0) / len(m) ** 0.5 + 0.02).all(), (
            direct,
            m,
            exact,
        )
