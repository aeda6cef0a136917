"""ArviZ 0.2x or 1.x: the one module that knows which is installed.

ArviZ 1.x (Python >= 3.12) holds a posterior in an ``xarray.DataTree`` where 0.2x had
``az.InferenceData``; its ``loo`` names the estimates ``elpd`` and ``p`` (0.2x: ``elpd_loo``,
``p_loo``), its ``compare`` rounds unless told not to, its diagnostics return the type they are
given, its plots return a ``PlotCollection`` rather than axes, and it has no WAIC. bnn-zoo builds,
reads, scores and plots posteriors through the functions here, so the rest of the package handles
plain xarray Datasets and gets the same numbers under either ArviZ. A user gets the installed
ArviZ's native object; the netCDF files are the same under both (a group per ArviZ group).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import arviz as az
import numpy as np
import xarray as xr

MAJOR = int(az.__version__.split(".")[0])


class Elpd(NamedTuple):
    """An expected log pointwise predictive density estimate (LOO or WAIC), in ArviZ's log scale."""

    elpd: float
    se: float
    p: float  # the effective number of parameters
    pareto_k: np.ndarray | None  # per observation (LOO only)
    warning: bool  # ArviZ's flag: some Pareto k (LOO) or pointwise variance (WAIC) is too high


def _indexed(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with a 0..n-1 coordinate on each dimension that has none, as ``az.from_dict`` gives: ArviZ 1.x's
    plots select by coordinate."""
    return ds.assign_coords({dim: np.arange(n) for dim, n in ds.sizes.items() if dim not in ds.coords})


def inference_data(groups: dict[str, xr.Dataset]):
    """The installed ArviZ's posterior object (InferenceData or DataTree) with these groups, every
    dimension indexed."""
    groups = {name: _indexed(ds) for name, ds in groups.items()}
    if MAJOR >= 1:
        return xr.DataTree.from_dict(groups)
    return az.InferenceData(**groups)


def group_names(idata) -> list[str]:
    """The ArviZ groups of ``idata`` (posterior, sample_stats, ...)."""
    return list(idata.children) if MAJOR >= 1 else list(idata.groups())


def group(idata, name: str) -> xr.Dataset | None:
    """Group ``name`` of ``idata`` as an xarray Dataset, or None where it has none."""
    if name not in group_names(idata):
        return None
    return idata[name].to_dataset() if MAJOR >= 1 else getattr(idata, name)


def read(path):
    """A netCDF file of groups, read into memory as the installed ArviZ's posterior object."""
    if MAJOR >= 1:
        with xr.open_datatree(path, engine="h5netcdf") as tree:
            tree = tree.load()
        return inference_data({name: tree[name].to_dataset() for name in tree.children})
    idata = az.from_netcdf(path, engine="h5netcdf")
    return inference_data({name: getattr(idata, name) for name in idata.groups()})


def _dataset(data) -> xr.Dataset:
    return data if isinstance(data, xr.Dataset) else group(data, "posterior")


def rhat(data) -> xr.Dataset:
    """Rank-normalised split R-hat (Vehtari et al. 2021) of a Dataset, or of a posterior's weights."""
    return az.rhat(_dataset(data))


def ess(data, method: str = "bulk") -> xr.Dataset:
    """Effective sample size (``method``: bulk, tail, mean, ...) of a Dataset, or of a posterior's weights."""
    return az.ess(_dataset(data), method=method)


def loo(idata, reff: float | None = None) -> Elpd:
    """PSIS-LOO (Vehtari, Gelman and Gabry 2017) from the ``log_likelihood`` group, ArviZ's warnings
    silenced (``warning`` says it). Where ArviZ cannot smooth the importance weights (1.x refuses a
    point whose log-likelihood is the same in every draw, and fewer than about 25 draws: its Pareto
    tail needs 5), the estimate is NaN and ``warning`` is set. ``reff``: the relative efficiency, which
    ArviZ otherwise computes from the posterior group
    (:func:`bnn_zoo.evaluation.diagnostics.loo_relative_efficiency` computes the same)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = az.loo(idata, pointwise=True, reff=reff)
        except (ValueError, IndexError):
            return Elpd(math.nan, math.nan, math.nan, None, True)
    if MAJOR >= 1:
        return Elpd(float(result.elpd), float(result.se), float(result.p), np.asarray(result.pareto_k), result.warning)
    k = np.asarray(result.pareto_k)
    return Elpd(float(result.elpd_loo), float(result.se), float(result.p_loo), k, bool(result.warning))


def waic(idata) -> Elpd:
    """WAIC (Watanabe 2010) from the ``log_likelihood`` group: ArviZ 0.2x's ``az.waic``; under 1.x,
    which dropped WAIC (PSIS-LOO has a diagnostic, WAIC none), :func:`waic_from_log_likelihood`."""
    if MAJOR >= 1:
        return waic_from_log_likelihood(group(idata, "log_likelihood")["y"].values)
    result = az.waic(idata)
    return Elpd(float(result.elpd_waic), float(result.se), float(result.p_waic), None, bool(result.warning))


def waic_from_log_likelihood(log_lik: np.ndarray) -> Elpd:
    """WAIC from pointwise log-likelihoods (chain, draw, obs), as ArviZ 0.2x computes it (Vehtari,
    Gelman and Gabry 2017, eqs. 11-13, 22-23): elpd_i = log mean_s p(y_i | theta_s) - var_s log p(y_i |
    theta_s), the variance over draws with divisor S, as ArviZ's; SE sqrt(N var_i elpd_i); the warning
    where some var_s exceeds 0.4."""
    s = np.asarray(log_lik, dtype=np.float64).reshape(-1, np.shape(log_lik)[-1])  # (draws, obs)
    top = s.max(0)
    lppd = top + np.log(np.exp(s - top).mean(0))
    p_i = s.var(0)
    elpd_i = lppd - p_i
    se = float(np.sqrt(len(elpd_i) * elpd_i.var()))
    return Elpd(float(elpd_i.sum()), se, float(p_i.sum()), None, bool((p_i > 0.4).any()))


def compare(idatas: dict):
    """``az.compare`` by PSIS-LOO (stacking weights), unrounded, ArviZ's warnings silenced; a DataFrame
    indexed by name with at least the columns rank, elpd, p, se, elpd_diff, dse and weight."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if MAJOR >= 1:
            return az.compare({name: az.loo(idata) for name, idata in idatas.items()}, round_to="none")
        return az.compare(idatas, ic="loo").rename(columns={"elpd_loo": "elpd", "p_loo": "p"})


def from_samples(posterior: dict[str, np.ndarray]):
    """A posterior object with only a posterior group, from arrays (chain, draw, ...)."""
    return inference_data({"posterior": az.convert_to_dataset(posterior)})


def _figure(plotted):
    """The matplotlib figure of an ArviZ plot: 1.x's PlotCollection or 0.2x's axes."""
    if MAJOR >= 1:
        return plotted.viz["figure"].item()
    return np.asarray(plotted).ravel()[0].figure


def plot_energy(idata):
    """ArviZ's energy plot with E-BFMI, as a matplotlib figure."""
    return _figure(az.plot_energy(idata))


def plot_trace(idata):
    """ArviZ's trace plot, one row per variable, as a matplotlib figure."""
    return _figure(az.plot_trace(idata) if MAJOR >= 1 else az.plot_trace(idata, compact=False))


def plot_rank(idata):
    """ArviZ's rank plot, as a matplotlib figure. ArviZ 1.x's default test needs two chains; one chain
    gets its envelope method."""
    if MAJOR >= 1 and group(idata, "posterior").sizes["chain"] < 2:
        return _figure(az.plot_rank(idata, method="envelope"))
    return _figure(az.plot_rank(idata))


def plot_compare(idatas: dict):
    """ArviZ's plot_compare of :func:`compare`'s ranking, as a matplotlib figure."""
    if MAJOR >= 1:
        return _figure(az.plot_compare(compare(idatas)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _figure(az.plot_compare(az.compare(idatas, ic="loo"), insample_dev=False))
