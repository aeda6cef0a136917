"""Monte Carlo estimators of d/dtheta E_{N(mu, sigma^2)}[f(x)] (Gal's thesis, sec. 3.1, eqs. 3.4-3.6).

With x = mu + sigma * eps, eps ~ N(0, 1):

=================  ==============================================  =======================
estimator          d/dmu                                           d/dsigma
=================  ==============================================  =======================
score function     f(x) (x - mu) / sigma^2                         f(x) ((x - mu)^2 / sigma^3 - 1 / sigma)
pathwise           f'(x)                                           f'(x) (x - mu) / sigma
characteristic     f'(x)                                           sigma f''(x)   (Opper & Archambeau 2009)
=================  ==============================================  =======================

All three are unbiased; their variances differ, which is what Gal's Tables 3.1-3.2 compare.
Derivatives of f come from autograd, so f is any differentiable torch function.
"""

from __future__ import annotations

import torch

ESTIMATORS = ("score", "pathwise", "characteristic")


def estimator_samples(
    f, estimator: str, wrt: str, mu: float = 0.0, sigma: float = 1.0, num_samples: int = 10**6, seed: int = 0
) -> torch.Tensor:
    """``num_samples`` independent single-sample estimates of d/d``wrt`` E[f(x)], x ~ N(mu, sigma^2) (float64)."""
    if estimator not in ESTIMATORS or wrt not in ("mu", "sigma"):
        raise ValueError(f"estimator must be one of {ESTIMATORS} and wrt 'mu' or 'sigma', got {estimator!r}, {wrt!r}")
    eps = torch.randn(num_samples, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x = (mu + sigma * eps).requires_grad_(True)
    fx = f(x)
    if estimator == "score":
        score = eps / sigma if wrt == "mu" else (eps**2 - 1) / sigma  # d/dtheta log N(x; mu, sigma^2)
        return (fx * score).detach()
    (df,) = torch.autograd.grad(fx.sum(), x, create_graph=estimator == "characteristic" and wrt == "sigma")
    if wrt == "mu":
        return df.detach()
    if estimator == "pathwise":
        return (df * eps).detach()
    (d2f,) = torch.autograd.grad(df.sum(), x)
    return sigma * d2f


def estimator_variance(f, estimator: str, wrt: str, **kwargs) -> float:
    """Variance of the single-sample estimator, estimated from ``num_samples`` draws."""
    return estimator_samples(f, estimator, wrt, **kwargs).var().item()
