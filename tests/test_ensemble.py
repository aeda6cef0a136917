"""Deep ensembles, SWAG and the heteroscedastic likelihood, against hand-written loops and exact laws."""

import math

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference.ensemble import Members, Moments, member_seed
from bnn_zoo.likelihoods import Heteroscedastic


def _data(n=48, features=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = x @ torch.tensor([1.0, -0.5])[:features] + 0.3 + 0.5 * torch.randn(n, generator=g)
    return x, y


def test_the_heteroscedastic_density_is_torchs_normal_at_softplus_variance():
    f, y = torch.randn(3, 7, 4), torch.randn(3, 7, 2)
    lik = Heteroscedastic(min_variance=1e-3)
    expected = torch.distributions.Normal(f[..., :2], (torch.nn.functional.softplus(f[..., 2:]) + 1e-3).sqrt())
    assert torch.allclose(lik.log_prob(f, {}, y), expected.log_prob(y).sum(-1), atol=1e-5)
    assert torch.allclose(lik.distribution(f, {}).log_prob(y), expected.log_prob(y).sum(-1), atol=1e-5)
    assert torch.allclose(lik.noise_variance(f, {}), expected.variance)
    assert lik.outputs(2) == 4
    with pytest.raises(BnnZooError, match="2 outputs per target"):
        lik.check_targets(torch.randn(7), 3)


def test_the_heteroscedastic_fisher_is_the_expected_outer_product_of_scores():
    """E_y[grad log p grad log p^T] over 200,000 draws of y: the diagonal's Monte Carlo error is about 0.5%,
    the off-diagonal's (true value 0) about 0.002; bounds of 5 standard errors."""
    torch.manual_seed(0)
    lik, f = Heteroscedastic(), torch.tensor([[0.3, -0.4]], dtype=torch.float64)
    y = lik.distribution(f, {}).sample((200_000,))[:, 0]
    fs = f.expand(len(y), 2).clone().requires_grad_(True)
    (scores,) = torch.autograd.grad(lik.log_prob(fs, {}, y).sum(), fs)
    empirical = scores.T @ scores / len(y)
    assert torch.allclose(empirical, lik.fisher(f, {})[0], rtol=0.03, atol=0.01)


def _linear_model(scale=0.5):
    return bz.BNN(bz.models.MLP(2, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(scale))


def test_an_ensemble_of_one_is_a_hand_written_adam_map_fit():
    x, y = _data()
    model = bz.BNN(bz.models.MLP(2, [8], 1, "tanh"), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    post = bz.fit(
        model,
        x,
        y,
        bz.Ensemble(members=1, steps=300, lr=1e-2, seed=3, validation=0.0, progress=False),
        standardize=False,
    )
    net = model.network()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(model.network_init(member_seed(3, 0))[name])
    optim = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(300):
        optim.zero_grad()
        nll = 0.5 * ((net(x)[:, 0] - y) / 0.5) ** 2 + math.log(0.5 * math.sqrt(2 * math.pi))
        log_prior = sum(torch.distributions.Normal(0.0, 1.0).log_prob(p).sum() for p in net.parameters())
        (nll.mean() - log_prior / len(y)).backward()
        optim.step()
    assert post.num_chains == 1 and post.num_draws == 1
    for name, p in net.named_parameters():
        assert torch.allclose(post.samples[name][0, 0], p.detach(), atol=2e-5), name


def _tokens(n=64, vocab=9, length=5):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, vocab, (n, length), generator=g).float()
    return x, (x[:, 0] > vocab / 2).long()


NETWORKS = {  # the MLP runs its members through forward_draws; the LSTM, whose input check reads token ids, one by one
    "mlp": lambda: (
        bz.BNN(bz.models.MLP(2, [8], 2), bz.priors.Normal(1.0), bz.likelihoods.Heteroscedastic()),
        _data(64),
    ),
    "lstm": lambda: (
        bz.BNN(bz.models.TextRNN(9, 3, 4), bz.priors.Normal(1.0), bz.likelihoods.Categorical()),
        _tokens(),
    ),
}


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_an_ensemble_members_fit_does_not_depend_on_its_neighbours(network):
    model, (x, y) = NETWORKS[network]()
    steps = 200 if network == "mlp" else 20
    fits = {
        k: bz.fit(model, x, y, bz.Ensemble(members=k, steps=steps, batch_size=16, progress=False), standardize=False)
        for k in (1, 3)
    }
    for name in model.params:
        assert torch.allclose(fits[3].samples[name][:1], fits[1].samples[name], atol=1e-5)
        assert not torch.allclose(fits[3].samples[name][1], fits[3].samples[name][2])  # own starts, own batches
    assert fits[3].to_inference_data().posterior.sizes["chain"] == 3


def test_adversarial_training_changes_the_fit_and_the_ensemble_predicts_their_mixture():
    x, y = _data()
    model = bz.BNN(bz.models.MLP(2, [8], 2), bz.priors.Normal(1.0), bz.likelihoods.Heteroscedastic())
    plain, adversarial = (
        bz.fit(
            model,
            x,
            y,
            bz.Ensemble(members=2, steps=100, adversarial=eps, use_prior=False, progress=False),
            standardize=False,
        )
        for eps in (0.0, 0.01)
    )
    assert not torch.allclose(plain.samples["layers.0.weight"], adversarial.samples["layers.0.weight"])
    pred = plain.predict(x)
    mixture = torch.logsumexp(
        torch.stack([plain.model.likelihood.log_prob(pred.f[k], {}, y[:, None]) for k in range(2)]), 0
    ) - math.log(2)
    assert torch.allclose(pred.log_likelihood(y[:, None]), mixture, atol=1e-5)


def test_swags_moments_are_the_running_moments_of_the_collected_iterates(monkeypatch):
    x, y = _data()
    method = bz.SWAG(
        members=2, steps=50, snapshots=12, collect_every=3, rank=5, batch_size=16, validation=0.0, progress=False
    )
    post = bz.fit(_linear_model(), x, y, method, standardize=False)
    method = method.resolved(post.model, len(y))
    iterates, add = [], Moments.add
    monkeypatch.setattr(Moments, "add", lambda self, w: (iterates.append(w.clone()), add(self, w)))
    Members(post.model, x, y[:, None], method).fit(method)  # the same members, trained again to record every iterate
    w = torch.stack(iterates)
    assert len(w) == 12
    assert torch.allclose(post.moments.mean, w.mean(0), atol=1e-6)
    assert torch.allclose(post.moments.sq_mean, (w**2).mean(0), atol=1e-6)
    running = [w[i] - w[: i + 1].mean(0) for i in range(len(w))]
    assert torch.allclose(torch.stack(post.moments.deviations), torch.stack(running[-5:]), atol=1e-6)
    assert post.num_chains == 2 and post.num_draws == 30


def test_swag_draws_have_the_swag_covariance():
    """Eq. 1 of Maddox et al.: Cov = diag(var) / 2 + D D^T / (2 (rank - 1)), here over 40,000 draws."""
    torch.manual_seed(0)
    moments = Moments(torch.zeros(1, 3), rank=4)
    for _ in range(9):
        moments.add(torch.randn(1, 3))
    draws = moments.sample(40_000)[0]
    dev = torch.stack(moments.deviations, -1)[0]
    expected = torch.diag(moments.variance[0]) / 2 + dev @ dev.T / 6
    assert torch.allclose(draws.mean(0), moments.mean[0], atol=0.03)
    assert torch.allclose(torch.cov(draws.T), expected, atol=0.05)


def _stationary_sgd_covariance(x, y, sigma, prior_scale, lr, m):
    """The exact stationary covariance of constant-rate SGD on the zoo's MAP loss for Bayesian linear
    regression: delta' = (I - lr A - lr (S_B - S)) delta - lr xi_B, whose second moment solves
    Sigma = (I - lr A) Sigma (I - lr A)^T + lr^2 c E_n[(P_n - S) Sigma (P_n - S)^T] + lr^2 c Cov_n(h_n(theta*)),
    c = (N - M) / (M (N - 1)) for minibatches drawn without replacement."""
    n = len(y)
    xt = torch.cat([x, torch.ones(n, 1)], 1).double()
    yd = y.double()
    d = xt.shape[1]
    p = xt[:, :, None] * xt[:, None, :] / sigma**2  # P_n
    s = p.mean(0)
    a = s + torch.eye(d, dtype=torch.float64) / (prior_scale**2 * n)
    theta = torch.linalg.solve(a, xt.T @ yd / (sigma**2 * n))
    h = xt * ((xt @ theta - yd) / sigma**2)[:, None]
    c = (n - m) / (m * (n - 1))
    noise = c * torch.cov(h.T, correction=0)
    b = torch.eye(d, dtype=torch.float64) - lr * a
    k = torch.kron(b, b) + lr**2 * c * sum(torch.kron(pn - s, pn - s) for pn in p) / n
    sigma_vec = torch.linalg.solve(torch.eye(d * d, dtype=torch.float64) - k, lr**2 * noise.reshape(-1))
    return theta, sigma_vec.reshape(d, d)


def test_swags_moments_on_linear_regression_match_the_exact_stationary_law_of_sgd():
    """8 members x 500 snapshots, 20 SGD steps apart (autocorrelation 0.9^20 = 0.12 between snapshots):
    about 3,000 effective draws, so each variance is within 2.6% (one standard error) and each mean
    within 0.02 sd: the bounds are 4 standard errors."""
    x, y = _data(n=64)
    x = (x - x.mean(0)) / x.std(0)
    lr, m = 0.1, 8
    method = bz.SWAG(
        members=8,
        steps=300,
        batch_size=m,
        snapshots=500,
        collect_every=20,
        optimizer="sgd",
        swag_lr=lr,
        momentum=0.0,
        validation=0.0,
        progress=False,
    )
    post = bz.fit(_linear_model(scale=1.0), x, y, method, standardize=False)
    theta, cov = _stationary_sgd_covariance(x, y, 1.0, 1.0, lr, m)
    variance = post.moments.variance.double().mean(0)  # members: weight (2), bias (1)
    mean = post.moments.mean.double().mean(0)
    assert torch.allclose(variance, cov.diagonal(), rtol=0.1)
    assert ((mean - theta).abs() / cov.diagonal().sqrt()).max() < 4 * math.sqrt(1 / 3000)


@pytest.mark.parametrize(
    "method",
    [
        bz.SVI(steps=1500, progress=False),
        bz.Laplace(map_steps=500, progress=False),
        bz.Ensemble(members=3, steps=800, progress=False),
        bz.SWAG(steps=800, snapshots=10, progress=False),
    ],
    ids=lambda m: type(m).__name__,
)
def test_every_method_learns_a_noise_that_grows_where_the_data_are_noisier(method):
    """y = sin(2x) + N(0, (0.1 (1 + |x|))^2) on [-3, 3]: the true noise sd is 4x larger at |x| = 3 than at
    x = 0; each method's predicted noise sd must grow by more than 2x."""
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-3, 3, 300)[:, None]
    y = torch.sin(2 * x[:, 0]) + 0.1 * (1 + x[:, 0].abs()) * torch.randn(300, generator=g)
    model = bz.BNN(bz.models.MLP(1, [30], 2), bz.priors.Normal(1.0), Heteroscedastic())
    noise = (
        bz.fit(model, x, y, method, standardize=False)
        .predict(torch.tensor([[-3.0], [0.0], [3.0]]))
        .noise_variance[:, 0]
        .sqrt()
    )
    assert noise[0] > 2 * noise[1] and noise[2] > 2 * noise[1], noise


@pytest.mark.parametrize(
    "method, at",
    [
        (bz.Ensemble(members=3, steps=60, batch_size=16, checkpoint_every=20, progress=False), 45),  # mid-block
        (bz.SWAG(members=2, steps=30, batch_size=16, snapshots=6, collect_every=5, checkpoint_every=10), 52),
    ],
    ids=["ensemble", "swag-collecting"],
)
def test_an_interrupted_fit_resumes_to_the_same_members(method, at, tmp_path, interrupting_mlp):
    """Ctrl-C at the network's ``at``-th forward call (Ensemble: between checkpoints, inside a block of
    minibatches; SWAG: while collecting), then the same fit again: the uninterrupted fit's draws, bit for bit."""
    import dataclasses

    x, y = _data(64)
    model = bz.BNN(interrupting_mlp(2, [6], 2), bz.priors.Normal(1.0), bz.likelihoods.Heteroscedastic())
    method = dataclasses.replace(method, progress=False)
    full = bz.fit(model, x, y, method, standardize=False)
    checkpointed = dataclasses.replace(method, checkpoint=tmp_path / "ck.pt")
    interrupting_mlp.calls, interrupting_mlp.at = 0, at
    with pytest.raises(KeyboardInterrupt):
        bz.fit(model, x, y, checkpointed, standardize=False)
    assert (tmp_path / "ck.pt").exists()
    interrupting_mlp.at = 0
    resumed = bz.fit(model, x, y, checkpointed, standardize=False)
    assert all(torch.equal(resumed.samples[k], full.samples[k]) for k in full.samples)
    assert not (tmp_path / "ck.pt").exists()  # the result supersedes it
    with pytest.raises(KeyboardInterrupt):
        interrupting_mlp.calls, interrupting_mlp.at = 0, at
        bz.fit(model, x, y, checkpointed, standardize=False)
    with pytest.raises(BnnZooError, match="belongs to a different fit"):
        bz.fit(model, x, y, dataclasses.replace(checkpointed, lr=0.02), standardize=False)
