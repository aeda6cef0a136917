"""Matrix-normal guide: exact density and KL, covariance V (x) U, parameter count, and a tighter ELBO."""

import math

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

import bnn_zoo as bz
from bnn_zoo.guides.matrix_normal import MatrixNormal


def _random_mn(n, m, rank=None, shape=None, seed=0, scales=False):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(n, m, generator=g, dtype=torch.float64)
    if rank is None:  # lower Cholesky factors
        a = torch.randn(n, n, generator=g, dtype=torch.float64).tril()
        a.diagonal().abs_().add_(0.5)
        b = torch.randn(m, m, generator=g, dtype=torch.float64).tril()
        b.diagonal().abs_().add_(0.5)
    else:  # [diag(sqrt d), P]
        a = torch.cat(
            [
                torch.diag(torch.rand(n, generator=g, dtype=torch.float64) + 0.5),
                torch.randn(n, rank, generator=g, dtype=torch.float64),
            ],
            1,
        )
        b = torch.cat(
            [
                torch.diag(torch.rand(m, generator=g, dtype=torch.float64) + 0.5),
                torch.randn(m, rank, generator=g, dtype=torch.float64),
            ],
            1,
        )
    scale = torch.rand(n, m, generator=g, dtype=torch.float64) * 2 + 0.1 if scales else None
    return MatrixNormal(loc, a, b, shape, scale)


def _dense(q):
    """vec(W) stacks columns: vec(W) ~ N(vec M, V (x) U), or N(vec M, D (V (x) U) D) with D = diag(vec S)."""
    cov = torch.kron(q.col_cov, q.row_cov)
    if q.scale is not None:
        d = q.scale.T.reshape(-1)
        cov = d[:, None] * cov * d[None, :]
    return MultivariateNormal(q.loc.T.reshape(-1), cov)


def _vec(w, n, m):
    return w.reshape(*w.shape[: w.dim() - 2], n, m).transpose(-1, -2).reshape(*w.shape[: w.dim() - 2], n * m)


@pytest.mark.parametrize("rank", [None, 2])
@pytest.mark.parametrize("scales", [False, True])
def test_closed_form_kl_and_density_equal_the_dense_gaussian(rank, scales):
    q = _random_mn(3, 4, rank, scales=scales)
    g = torch.Generator().manual_seed(9)
    p = dist.Normal(
        0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64),
        torch.rand(3, 4, generator=g, dtype=torch.float64) + 0.5,
    ).to_event(2)
    dense_p = MultivariateNormal(p.base_dist.loc.T.reshape(-1), torch.diag(p.base_dist.scale.T.reshape(-1) ** 2))
    assert kl_divergence(q, p).item() == pytest.approx(kl_divergence(_dense(q), dense_p).item(), abs=1e-5)
    w = q.rsample((5,))
    dense = _dense(q).log_prob(_vec(w, 3, 4))
    torch.testing.assert_close(q.log_prob(w), dense, rtol=0, atol=1e-5)  # its own draw: from the noise that made it
    torch.testing.assert_close(q.log_prob(w.clone()), dense, rtol=0, atol=1e-5)  # any other value: by inversion


def test_the_density_of_a_draw_survives_float32_when_the_spread_is_tiny_beside_the_mean():
    """W - M cancels in float32 when sd << |M| eps: inverting it gave SVI a density it drove to -1e27."""
    n, m, draws = 3, 4, 4000
    q = MatrixNormal(torch.full((n, m), 1e3), 1e-3 * torch.eye(n), 1e-3 * torch.eye(m))  # sd 1e-6 beside 1e3
    log_q = torch.stack([q.log_prob(q.rsample()) for _ in range(draws)])
    # log q(W) = -(nm log 2 pi + m log|U| + n log|V| + ||Z||^2) / 2 with ||Z||^2 ~ chi^2(nm): mean nm, sd sqrt(2 nm)
    logdets = m * n * math.log(1e-6) + n * m * math.log(1e-6)
    expected = -0.5 * (n * m * math.log(2 * math.pi) + logdets + n * m)
    assert abs(log_q.double().mean().item() - expected) < 4 * 0.5 * math.sqrt(2 * n * m / draws)


def test_design_formula_for_an_isotropic_prior_and_conv_shaped_weights():
    q = _random_mn(2, 6, shape=(2, 3, 2))  # a conv kernel (out=2, in=3, k=2) flattened to (2, 6)
    s = 0.7
    p = dist.Normal(torch.zeros(2, 3, 2, dtype=torch.float64), s).to_event(3)
    u, v = q.row_cov, q.col_cov
    n, m = 2, 6
    design = 0.5 * (
        torch.trace(u) * torch.trace(v) / s**2
        + q.loc.pow(2).sum() / s**2
        - n * m
        + n * m * math.log(s**2)
        - m * torch.logdet(u)
        - n * torch.logdet(v)
    )
    assert kl_divergence(q, p).item() == pytest.approx(design.item(), abs=1e-5)
    assert q.rsample((4,)).shape == (4, 2, 3, 2)


@pytest.mark.parametrize("scales", [False, True])
def test_sample_covariance_of_vec_w_matches_v_kron_u(scales):
    q = _random_mn(2, 3, rank=1, scales=scales)
    num = 200_000
    draws = _vec(q.rsample((num,)), 2, 3)
    cov = torch.cov(draws.T)
    truth = _dense(q).covariance_matrix
    # standard error of a sample covariance: sqrt((S_ii S_jj + S_ij^2) / num)
    se = ((truth.diagonal()[:, None] * truth.diagonal()[None, :] + truth**2) / num).sqrt()
    assert torch.all((cov - truth).abs() < 5 * se), ((cov - truth) / se).abs().max()
    torch.testing.assert_close(
        draws.mean(0), q.loc.T.reshape(-1), rtol=0, atol=5 * float(truth.diagonal().max().sqrt()) / num**0.5
    )


@pytest.mark.parametrize("rank", [None, 4])
def test_a_1000_by_1000_layer_holds_order_n2_plus_m2_numbers(rank):
    model = bz.BNN(bz.models.MLP(1000, [], 1000), likelihood=bz.likelihoods.Gaussian(1.0))
    guide = bz.guides.build("matrix-normal", model, model.network_init(0), rank=rank)
    n = m = 1000
    count = sum(p.numel() for p in guide.parameters())
    bias = 2 * 1000  # the mean-field part: a loc and a scale per bias
    factors = n * n + m * m if rank is None else (n + m) * (rank + 1)
    # the mean M, two factors (a full n x n parameter each, or diag + rank), biases
    assert count == n * m + factors + bias
    assert count <= n * m + n**2 + m**2 + 2 * 1000 and count < 1e-5 * (n * m) ** 2


@pytest.mark.parametrize("rank", [None, 2])
def test_per_weight_scales_carry_every_weights_variance_and_start_at_mean_fields_start(rank):
    """With scales=true U and V are correlation matrices: Var(W_ij) = S_ij^2 exactly, at the start
    (init_scale^2, mean-field's start, no correlation) and after the factors have moved."""
    model = bz.BNN(bz.models.MLP(3, [5], 2))
    guide = bz.guides.build("matrix-normal", model, model.network_init(0), rank=rank, scales=True, init_scale=0.05)
    for name in guide.shapes:
        q = guide.distribution(name)
        torch.testing.assert_close(
            _dense(q).covariance_matrix,
            torch.diag(torch.full((q.n * q.m,), 0.05**2)),
            rtol=1e-5,
            atol=1e-4 if rank else 0,
        )
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3 * torch.randn_like(p))
    for name in guide.shapes:
        q = guide.distribution(name)
        for cov in (q.row_cov, q.col_cov):
            torch.testing.assert_close(cov.diagonal(), torch.ones(cov.shape[0]))
        assert (cov - torch.diag(cov.diagonal())).abs().max() > 0.01  # correlated now
        torch.testing.assert_close(_dense(q).covariance_matrix.diagonal(), q.scale.T.reshape(-1) ** 2)
