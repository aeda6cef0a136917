"""Ground truth in closed form: Bayesian linear regression (Bishop, PRML eqs. 3.53-3.54 and 3.86) and
GP regression (Rasmussen & Williams 2006, eqs. 2.25-2.26 and 2.30), the latter in numpy so that tests
check GPyTorch against an independent implementation.

Model: y = X w + b + e, e ~ N(0, sigma^2), w_i ~ N(0, s_w^2), b ~ N(0, s_b^2). With the design
Phi = [X, 1] and prior covariance S0 = diag(s_w^2, ..., s_b^2):
    posterior precision  Lambda = S0^{-1} + Phi^T Phi / sigma^2,   mean  mu = Lambda^{-1} Phi^T y / sigma^2,
    log evidence         log N(y; 0, sigma^2 I + Phi S0 Phi^T).
Mean-field VI on this posterior converges to means mu and variances 1 / Lambda_ii.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class LinearGaussianPosterior:
    mean: torch.Tensor  # (d + 1,): weights, then bias
    cov: torch.Tensor
    precision: torch.Tensor
    log_evidence: float

    @property
    def mean_field_variance(self) -> torch.Tensor:
        """Variances of the optimal mean-field Gaussian, 1 / Lambda_ii."""
        return 1.0 / torch.diagonal(self.precision)

    def kl_from(self, loc: torch.Tensor, scale: torch.Tensor) -> float:
        """KL(N(loc, diag(scale^2)) || posterior): the gap log evidence - ELBO of that Gaussian."""
        loc, var = loc.double(), scale.double() ** 2
        diff = self.mean - loc
        k = loc.numel()
        return 0.5 * float(
            (self.precision.diagonal() * var).sum()
            + diff @ self.precision @ diff
            - k
            + torch.logdet(self.cov)
            - var.log().sum()
        )


def linear_regression(x, y, weight_scale: float, bias_scale: float, noise_scale: float) -> LinearGaussianPosterior:
    """Exact posterior and log evidence of Bayesian linear regression with one output (float64)."""
    x, y = torch.as_tensor(x).double(), torch.as_tensor(y).double().reshape(-1)
    phi = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    prior_var = torch.tensor([weight_scale**2] * x.shape[1] + [bias_scale**2], dtype=x.dtype)
    precision = torch.diag(1 / prior_var) + phi.T @ phi / noise_scale**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y / noise_scale**2
    marginal_cov = noise_scale**2 * torch.eye(len(y), dtype=x.dtype) + phi @ torch.diag(prior_var) @ phi.T
    log_evidence = torch.distributions.MultivariateNormal(torch.zeros_like(y), marginal_cov).log_prob(y).item()
    return LinearGaussianPosterior(mean, cov, precision, log_evidence)


def gp_regression(k_train, k_cross, k_test_diag, y, noise_var: float, mean: float = 0.0):
    """Exact GP regression in float64 numpy, with K = k_train + noise_var I (R&W alg. 2.1):
    log p(y) = -1/2 (y - m)^T K^{-1} (y - m) - 1/2 log|K| - n/2 log 2 pi, and the latent predictive at
    test points, mean m + k_*^T K^{-1} (y - m) and variance k_** - k_*^T K^{-1} k_*.
    Returns (log marginal likelihood, predictive mean, predictive variance)."""
    y = np.asarray(y, dtype=np.float64) - mean
    chol = np.linalg.cholesky(np.asarray(k_train, dtype=np.float64) + noise_var * np.eye(len(y)))
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    lml = -0.5 * y @ alpha - np.log(np.diag(chol)).sum() - 0.5 * len(y) * np.log(2 * np.pi)
    v = np.linalg.solve(chol, np.asarray(k_cross, dtype=np.float64))
    return float(lml), mean + np.asarray(k_cross).T @ alpha, np.asarray(k_test_diag) - (v**2).sum(0)
