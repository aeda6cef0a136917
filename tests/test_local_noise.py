"""Local reparameterisation: per-example pre-activations with the exact distribution weight sampling implies."""

import pyro.poutine as poutine
import pytest
import torch
from torch import nn

import bnn_zoo as bz
from bnn_zoo.local_noise import GaussianWeights

S = 20000  # replicated rows: each gets its own noise, so moments over rows have SE ~ sd / sqrt(S)


def _outputs(model, guide, x):
    """One training-mode pass: the guide attaches its local noise, the model's forward applies it."""
    guide.train()
    tr = poutine.trace(guide).get_trace(x, None)
    return poutine.replay(model, trace=tr)(x)


def _within(sample_mean, sample_var, mean, var, n):
    """Means within 5 SE, variances within 5 SE of a Gaussian sample variance (sqrt(2/n) var)."""
    assert ((sample_mean - mean).abs() <= 5 * (var / n).sqrt()).all()
    assert ((sample_var - var).abs() <= 5 * (2 / n) ** 0.5 * var).all()


def test_mean_field_dense_pre_activations_are_n_of_x_mu_and_x2_sigma2():
    torch.manual_seed(0)
    model = bz.BNN(nn.Linear(3, 2, bias=False), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(1.0))
    guide = bz.guides.build("mean-field", model, {"weight": torch.randn(2, 3)}, init_scale=0.3, local_reparam=True)
    x = torch.tensor([1.0, -2.0, 0.5]).expand(S, 3)
    f = _outputs(model, guide, x)
    mu, sigma = guide.loc_and_scale("weight")
    _within(f.mean(0), f.var(0), (x[0] @ mu.T).detach(), (x[0] ** 2 @ sigma.T**2).detach(), S)
    assert torch.corrcoef(f.T)[0, 1].abs() < 5 / S**0.5  # outputs are independent under a diagonal guide


def test_mean_field_conv_pre_activations_match_the_conv_of_squares():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv1d(2, 3, 3, bias=False), nn.Flatten())
    loc, scale = torch.randn(3, 2, 3), 0.2 + torch.rand(3, 2, 3)
    x = torch.randn(1, 2, 5).expand(S, 2, 5)
    model = bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Gaussian(1.0))
    f = model.forward({"0.weight": loc}, x, {"0.weight": GaussianWeights(loc, scale)})
    mean = nn.functional.conv1d(x[:1], loc).flatten()
    var = nn.functional.conv1d(x[:1] ** 2, scale**2).flatten()
    _within(f.mean(0), f.var(0), mean, var, S)


def test_matrix_normal_outputs_have_covariance_x_v_x_times_u():
    torch.manual_seed(2)
    model = bz.BNN(nn.Linear(3, 2, bias=False), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(1.0))
    guide = bz.guides.build("matrix-normal", model, {"weight": torch.randn(2, 3)}, init_scale=0.5, local_reparam=True)
    with torch.no_grad():  # make U and V far from diagonal so the test sees the coupling
        guide.rows.weight.tril.copy_(torch.tensor([[1.0, 0.0], [0.8, 0.5]]))
        guide.cols.weight.tril.copy_(torch.tensor([[0.7, 0.0, 0.0], [0.3, 0.4, 0.0], [-0.2, 0.1, 0.6]]))
    q = guide.distribution("weight")
    x = torch.tensor([1.0, -0.5, 2.0]).expand(S, 3)
    f = _outputs(model, guide, x).detach()
    cov = ((x[0] @ q.col_cov @ x[0]) * q.row_cov).detach()
    _within(f.mean(0), f.var(0), (x[0] @ q.loc.T).detach(), cov.diagonal(), S)
    corr = cov[0, 1] / cov.diagonal().prod().sqrt()
    assert abs(torch.corrcoef(f.T)[0, 1] - corr) < 5 * (1 - corr**2) / S**0.5


@pytest.mark.parametrize(
    "guide, options",
    [
        ("mean-field", {"local_reparam": True}),
        ("matrix-normal", {"local_reparam": True}),
        ("dropout", {"masks": "example"}),
    ],
)
def test_local_noise_only_in_training_and_fits_run_with_particles(guide, options):
    torch.manual_seed(3)
    x = torch.randn(40, 2)
    y = x[:, :1] * 2 + 0.1 * torch.randn(40, 1)
    model = bz.BNN(bz.models.MLP(2, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.1))
    post = bz.fit(
        model,
        x,
        y,
        bz.SVI(guide=guide, guide_options=options, steps=400, lr=0.03, num_particles=2, progress=False, num_draws=50),
    )
    assert not post.guide.training  # evaluation (ELBO, importance weights) sees plain weight draws
    tr = poutine.trace(post.guide).get_trace(x, y)
    assert not any("local_noise" in site.get("infer", {}) for site in tr.nodes.values())
    assert ((post.predict(x).mean - y) ** 2).mean() < 0.5 * y.var()


def test_local_reparam_refuses_layers_it_cannot_handle():
    net = nn.Sequential(nn.Unflatten(1, (1, 3)), nn.Conv1d(1, 2, 2), nn.Flatten())
    model = bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Gaussian(1.0))
    x, y = torch.randn(4, 3), torch.randn(4, 4)
    with pytest.raises(bz.BnnZooError, match="dense layers only"):
        bz.fit(
            model, x, y, bz.SVI(guide="matrix-normal", guide_options={"local_reparam": True}, steps=1, progress=False)
        )
    with pytest.raises(bz.BnnZooError, match="expected true or false"):
        bz.guides.build("mean-field", model, model.network_init(0), local_reparam="maybe")
    post = bz.fit(
        model,
        x,
        y,
        bz.SVI(guide="mean-field", guide_options={"local_reparam": True}, steps=2, progress=False, num_draws=5),
    )
    assert post.predict(x).f.shape == (5, 4, 4)  # mean-field handles the convolution
