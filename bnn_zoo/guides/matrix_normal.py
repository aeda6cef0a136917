"""Matrix-normal guide (Louizos & Welling 2016): one MN(M, U, V) per weight matrix, mean-field elsewhere.

A weight W of shape (n, m) = (out, in) (conv kernels flattened to (out, in*kh*kw)) has
vec(W) ~ N(vec M, V (x) U): U (n x n) couples rows (output units), V (m x m) couples columns (inputs).
We sample W = M + L_U Z L_V^T with U = L_U L_U^T, V = L_V L_V^T, Z standard normal. The factors are
full lower-Cholesky (``rank=None``) or, for large layers, diagonal plus rank k (U = diag(d) + P P^T,
L_U = [diag(sqrt d), P]). Parameters: n m + O(n^2 + m^2) (full) or n m + O((n + m) k), n m more with ``scales``, never
O((n m)^2). The KL to a diagonal Gaussian prior is closed form (registered below), so
``TraceMeanField_ELBO`` uses it:

    KL = 1/2 [ sum_ij (U_ii V_jj + (M_ij - mu_ij)^2) / s_ij^2 - n m + sum_ij log s_ij^2 - m log|U| - n log|V| ]

which for s_ij = s, mu = 0 is DESIGN.md's 1/2 [tr(U) tr(V)/s^2 + ||M||^2/s^2 - nm + nm log s^2 - m log|U| - n log|V|].
Pyro has no matrix-normal distribution, hence this one. ``local_reparam=True`` samples a dense layer's
outputs x W^T ~ N(x M^T, (x V x^T) U) per example during training (:mod:`bnn_zoo.local_noise`).

``scales=True`` gives each weight its own scale S_ij and makes U and V correlation matrices (each row
of a factor divided by its norm): W = M + S * (L_U Z L_V^T), elementwise, so vec(W) ~ N(vec M,
D (V (x) U) D) with D = diag(vec S). Var(W_ij) = S_ij^2 exactly, the correlations are Kronecker's,
and U = V = I, where the guide starts, is mean-field. The density and the KL stay closed form:
log|D (V (x) U) D| = m log|U| + n log|V| + 2 sum log S_ij. Why: in Louizos & Welling's family a
weight's sd moves with U_ii and V_jj, which whole rows and columns push the same way, and under a
scale-mixture prior on toy-text's LSTMs every weight reaches the prior's wide component within
3,000 steps and the draws predict the majority class; with its own scale a weight's sd moves at
mean-field's pace, and the fit reads the sentences as mean-field's does (docs/guide/defaults.md).
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.nn import PyroParam
from torch.distributions import register_kl

from bnn_zoo.errors import BnnZooError, positive
from bnn_zoo.guides.mean_field import MeanField
from bnn_zoo.guides.registry import flag, register
from bnn_zoo.local_noise import MatrixNormalWeights
from bnn_zoo.models import architecture
from bnn_zoo.variational import LocalParamModule, sample_sites


class MatrixNormal(TorchDistribution):
    """MN(loc, U, V) given scale factors L_U (..., n, r_u) and L_V (..., m, r_v); event shape ``shape``.
    A square factor must be lower triangular with a positive diagonal (a Cholesky factor).

    ``shape`` is the weight's own shape, whose trailing dims flatten to m = prod(shape[1:]). ``scale``
    (..., n, m), if given, multiplies the spread elementwise: W = loc + scale * (L_U Z L_V^T).
    """

    arg_constraints = {}
    has_rsample = True

    def __init__(self, loc, row_factor, col_factor, shape=None, scale=None, validate_args=None):
        shape = torch.Size(shape or loc.shape[-2:])
        self.loc, self.row_factor, self.col_factor, self.scale = loc, row_factor, col_factor, scale
        self.n, self.m = row_factor.shape[-2], col_factor.shape[-2]
        batch = torch.broadcast_shapes(loc.shape[:-2], row_factor.shape[:-2], col_factor.shape[:-2])
        self._draw = None  # (the last rsample, the noise Z that made it)
        super().__init__(batch, shape, validate_args=validate_args)

    @constraints.dependent_property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        return MatrixNormal(
            self.loc.expand(batch_shape + self.loc.shape[-2:]),
            self.row_factor.expand(batch_shape + self.row_factor.shape[-2:]),
            self.col_factor.expand(batch_shape + self.col_factor.shape[-2:]),
            self.event_shape,
            None if self.scale is None else self.scale.expand(batch_shape + self.scale.shape[-2:]),
        )

    @property
    def row_cov(self):
        return self.row_factor @ self.row_factor.transpose(-1, -2)

    @property
    def col_cov(self):
        return self.col_factor @ self.col_factor.transpose(-1, -2)

    @property
    def mean(self):
        return self.loc.expand(self.batch_shape + self.loc.shape[-2:]).reshape(self.batch_shape + self.event_shape)

    def rsample(self, sample_shape=()):
        shape = torch.Size(sample_shape) + self.batch_shape
        z = torch.randn(
            shape + (self.row_factor.shape[-1], self.col_factor.shape[-1]), dtype=self.loc.dtype, device=self.loc.device
        )
        spread = self.row_factor @ z @ self.col_factor.transpose(-1, -2)
        w = (self.loc + (spread if self.scale is None else self.scale * spread)).reshape(shape + self.event_shape)
        self._draw = (w, z)
        return w

    def log_prob(self, value):
        """log q(W). For this distribution's own last draw with square factors, ||L_U^-1 (W - M) L_V^-T||^2
        is the ||Z||^2 that made it: inverting instead loses Z in float32 once the factors are small
        beside M (W - M cancels), and SVI learns to exploit the garbage density (its loss ran to -1e27
        on an LSTM)."""
        chol_u, chol_v = _cholesky(self.row_factor), _cholesky(self.col_factor)
        if (
            self._draw is not None
            and value is self._draw[0]
            and chol_u is self.row_factor
            and chol_v is self.col_factor
        ):
            squares = self._draw[1].pow(2).sum((-1, -2))
        else:
            d = value.reshape(value.shape[: value.dim() - len(self.event_shape)] + (self.n, self.m)) - self.loc
            d = d if self.scale is None else d / self.scale
            x = torch.linalg.solve_triangular(chol_u, d, upper=False)  # L_U^-1 D
            # L_V^-1 (L_U^-1 D)^T
            squares = torch.linalg.solve_triangular(chol_v, x.transpose(-1, -2), upper=False).pow(2).sum((-1, -2))
        logdet_u, logdet_v = _logdet(chol_u), _logdet(chol_v)
        n, m = self.n, self.m
        return -0.5 * (
            n * m * math.log(2 * math.pi) + m * logdet_u + n * logdet_v + _logdet_scale(self.scale) + squares
        )


def _cholesky(factor: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor of L L^T. A square factor is one already (the full-rank guide's, kept
    lower triangular with a positive diagonal): refactoring L L^T in float32 fails once its
    eigenvalues spread over ~1e7, which SVI reaches on recurrent weights."""
    if factor.shape[-1] == factor.shape[-2]:
        return factor
    return torch.linalg.cholesky(factor @ factor.transpose(-1, -2))


def _logdet(chol: torch.Tensor) -> torch.Tensor:
    return 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)


def _logdet_scale(scale: torch.Tensor | None) -> torch.Tensor | float:
    """log|D^2| = 2 sum log S_ij, the per-weight scales' share of log|D (V (x) U) D| (0 without them)."""
    return 0.0 if scale is None else 2 * scale.log().sum((-1, -2))


@register_kl(MatrixNormal, dist.Independent)
def _kl_matrix_normal_diagonal_normal(q, p):
    if not isinstance(p.base_dist, dist.Normal) or p.event_shape != q.event_shape:
        raise NotImplementedError
    shape = p.base_dist.loc.shape[: p.base_dist.loc.dim() - len(p.event_shape)] + (q.n, q.m)
    mu, s2 = p.base_dist.loc.reshape(shape), p.base_dist.scale.pow(2).reshape(shape)
    # diag(V (x) U) as (n, m): U_ii is the squared norm of L_U's row i, so U itself is never formed
    var = q.row_factor.pow(2).sum(-1)[..., :, None] * q.col_factor.pow(2).sum(-1)[..., None, :]
    var = var if q.scale is None else var * q.scale.pow(2)
    logdet_q = q.m * _logdet(_cholesky(q.row_factor)) + q.n * _logdet(_cholesky(q.col_factor)) + _logdet_scale(q.scale)
    return 0.5 * (((var + (q.loc - mu) ** 2) / s2).sum((-1, -2)) - q.n * q.m + s2.log().sum((-1, -2)) - logdet_q)


class _Factor(LocalParamModule):
    """A covariance factor L with L L^T = U: lower Cholesky (rank None) or [diag(sqrt d), P] (rank k).
    With ``unit_rows`` each row is divided by its norm, so U is a correlation matrix (U_ii = 1)."""

    def __init__(self, size: int, variance: float, rank: int | None, device: torch.device, unit_rows: bool = False):
        super().__init__()
        self.rank, self.unit_rows = rank, unit_rows
        if rank is None:
            self.tril = PyroParam(math.sqrt(variance) * torch.eye(size, device=device), constraints.lower_cholesky)
        else:
            self.diag = PyroParam(torch.full((size,), variance, device=device), constraints.softplus_positive)
            # P starts small and random: at P = 0 the gradient of P P^T with respect to P vanishes
            # the CPU stream: a seed gives one guide anywhere
            self.low_rank = PyroParam(1e-3 * torch.randn(size, rank).to(device))

    def forward(self):
        factor = self.tril if self.rank is None else torch.cat([torch.diag_embed(self.diag.sqrt()), self.low_rank], -1)
        return factor / factor.norm(dim=-1, keepdim=True) if self.unit_rows else factor


class MatrixNormalGuide(LocalParamModule):
    """MN over every weight with 2 or more dims; the mean-field guide over the other sites (biases, noise).

    The marginal variance of W_ij is U_ii V_jj; every weight starts at sd ``init_scale``, both factors
    at sqrt(init_scale) I. With ``scales`` U and V are correlation matrices, so the variance is S_ij^2
    alone, and the guide starts where mean-field does: S at init_scale, U = V = I."""

    def __init__(
        self,
        model,
        init_values,
        init_scale: float = 1e-2,
        rank: int | None = None,
        local_reparam: bool = False,
        scales: bool = False,
    ):
        super().__init__()
        self.local_reparam = local_reparam
        self.shapes = {k: p.shape for k, p in model.params.items() if p.dim() >= 2}
        self.locs = LocalParamModule()
        self.rows, self.cols = LocalParamModule(), LocalParamModule()
        self.scales = LocalParamModule() if scales else None
        for name, shape in self.shapes.items():
            key = name.replace(".", "__")
            n, m = shape[0], math.prod(shape[1:])
            setattr(self.locs, key, PyroParam(init_values[name].detach().reshape(n, m).clone()))
            setattr(self.rows, key, _Factor(n, 1.0 if scales else init_scale, rank, model.device, unit_rows=scales))
            setattr(self.cols, key, _Factor(m, 1.0 if scales else init_scale, rank, model.device, unit_rows=scales))
            if scales:
                setattr(
                    self.scales,
                    key,
                    PyroParam(torch.full((n, m), init_scale, device=model.device), constraints.softplus_positive),
                )
        self.rest = MeanField(
            model,
            init_values,
            init_scale,
            sites=[k for k in model.latent_shapes() if k not in self.shapes],
            local_reparam=local_reparam,
        )

    def distribution(self, name: str) -> MatrixNormal:
        key = name.replace(".", "__")
        scale = None if self.scales is None else getattr(self.scales, key)
        return MatrixNormal(
            getattr(self.locs, key), getattr(self.rows, key)(), getattr(self.cols, key)(), self.shapes[name], scale
        )

    def site_distributions(self) -> dict[str, tuple[dist.Distribution, dict]]:
        sites = {}
        for name in self.shapes:
            q = self.distribution(name)
            local = self.local_reparam and self.training
            sites[name] = (
                q,
                {"local_noise": MatrixNormalWeights(q.loc.reshape(q.event_shape), q.row_factor, q.col_factor)}
                if local
                else {},
            )
        return sites | self.rest.site_distributions()

    def forward(self, *args, **kwargs):
        return sample_sites(self.site_distributions())

    def mean(self) -> dict[str, torch.Tensor]:
        return {**{name: self.distribution(name).mean for name in self.shapes}, **self.rest.mean()}


def default_scales(net) -> bool:
    """``scales`` left None: per-weight scales on recurrent networks."""
    return architecture(net) == "recurrent"


@register(
    "matrix-normal",
    "matrix-normal MN(M, U, V) per weight matrix (full Cholesky; rank=k for low-rank + diagonal); scales=true adds a "
    "per-weight scale; "
    "local_reparam=true|false (dense layers)",
)
def matrix_normal(
    model,
    init_values,
    init_scale: float = 1e-2,
    rank: int | None = None,
    local_reparam: bool = False,
    scales: bool | None = None,
):
    """A matrix normal MN(M, U, V) per weight matrix (Louizos & Welling 2016), mean-field elsewhere.

    Args:
        init_scale: every weight's starting sd.
        rank: None: full Cholesky factors of U and V; k: diagonal plus rank k.
        local_reparam: sample a dense layer's outputs instead of its weights in training (not with scales).
        scales: a scale per weight, with U and V correlation matrices (None: on recurrent networks, where
            without them a weight's sd moves with its row's and column's and the fit keeps the prior).
    """
    scales = default_scales(model.net) if scales is None else scales
    init_scale = positive("the matrix-normal guide's init_scale", init_scale)
    rank = (
        None
        if rank is None
        else positive("the matrix-normal guide's rank (None: full Cholesky factors)", rank, integer=True)
    )
    local_reparam, scales = flag(local_reparam), flag(scales)
    if local_reparam and scales:
        raise BnnZooError(
            "the matrix-normal guide's local_reparam needs Kronecker-factored outputs, which per-weight scales break; "
            "set scales=false or local_reparam=false"
        )
    return MatrixNormalGuide(
        model, init_values, init_scale=init_scale, rank=rank, local_reparam=local_reparam, scales=scales
    )
