import contextlib
import importlib.util
import os
import sys
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", category=FutureWarning)
# torch threads per test process: BNN_ZOO_TEST_THREADS=N; by default one per worker (there is a worker per
# core: pytest_cmdline_main below) and torch's own (one per core) without workers, which CI runs too
THREADS = os.environ.get("BNN_ZOO_TEST_THREADS") or ("1" if os.environ.get("PYTEST_XDIST_WORKER") else "")
if THREADS:  # a test worker's share of the cores: its torch threads and its forked MCMC chains
    torch.set_num_threads(int(THREADS))
    os.environ.setdefault("BNN_ZOO_CORES", THREADS)

if importlib.util.find_spec("jax"):  # two JAX CPU devices on any machine: chains and cells split over both
    import jax

    jax.config.update("jax_num_cpu_devices", 2)

import arviz as az  # noqa: E402

import bnn_zoo as bz  # noqa: E402
from bnn_zoo.evaluation.exact import linear_regression  # noqa: E402

NOISE = 0.5


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """One worker per core (at most 4) where pytest-xdist is on and no -n was given, so that
    ``python -m pytest -p no:xdist`` runs the suite in one process; loadscope keeps a module's tests,
    and so its shared fitted fixtures, on one worker."""
    controller = config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")  # not a worker
    if controller and config.option.numprocesses is None:
        config.option.numprocesses, config.option.maxprocesses = "auto", 4
        config.option.dist = "loadscope" if config.option.dist == "no" else config.option.dist


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's thread count set to n for the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def blr_data():
    """30 points, 3 inputs with two strongly correlated (so mean-field variances differ from the marginals)."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(30, 3, generator=g)
    x = z.clone()
    x[:, 1] = 0.9 * z[:, 0] + 0.44 * z[:, 1]
    y = x @ torch.tensor([1.0, -0.5, 0.3]) + 0.2 + NOISE * torch.randn(30, generator=g)
    return x, y


@pytest.fixture(scope="session")
def blr_model():
    return bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(NOISE))


@pytest.fixture(scope="session")
def blr_exact(blr_data):
    return linear_regression(*blr_data, weight_scale=1.0, bias_scale=1.0, noise_scale=NOISE)


def flat(sites: dict) -> torch.Tensor:
    """Weights then bias, matching the exact posterior's ordering."""
    return torch.cat(
        [sites["layers.0.weight"].reshape(*sites["layers.0.weight"].shape[:-2], -1), sites["layers.0.bias"]], -1
    )


def assert_matches_exact_posterior_within_4_mcse(fit, blr_exact):
    """Every weight's posterior mean and sd within 4 Monte Carlo standard errors (ArviZ's) of the exact ones."""
    idata = fit.to_inference_data()
    draws = flat({k: v.double() for k, v in fit.samples.items()}).reshape(-1, 4)
    mcse_mean = flat({k: torch.as_tensor(az.mcse(idata, method="mean")[k].values) for k in fit.samples}).reshape(-1)
    mcse_sd = flat({k: torch.as_tensor(az.mcse(idata, method="sd")[k].values) for k in fit.samples}).reshape(-1)
    exact_sd = blr_exact.cov.diagonal().sqrt()
    assert torch.all((draws.mean(0) - blr_exact.mean).abs() < 4 * mcse_mean.double()), (
        draws.mean(0),
        blr_exact.mean,
        mcse_mean,
    )
    assert torch.all((draws.std(0) - exact_sd).abs() < 4 * mcse_sd.double()), (draws.std(0), exact_sd, mcse_sd)


class InterruptingMLP(bz.models.MLP):
    """An MLP that raises KeyboardInterrupt (Ctrl-C) at its ``at``-th forward call, counted in ``calls``:
    for tests that interrupt a checkpointed run and resume it."""

    calls, at = 0, 0

    def _count(self):
        type(self).calls += 1
        if type(self).calls == type(self).at:
            raise KeyboardInterrupt

    def forward(self, x):
        self._count()
        return super().forward(x)

    def forward_draws(self, weights, x, input_masks=None):  # batched evaluations (ChEES, AIS) count too
        self._count()
        return super().forward_draws(weights, x, input_masks)

    def forward_draws_vjp(self, weights, x):  # and ChEES's gradients
        self._count()
        return super().forward_draws_vjp(weights, x)


@pytest.fixture
def interrupting_mlp():
    """A fresh subclass of :class:`InterruptingMLP` per test, so the counters never leak between tests."""
    return type("Interrupting", (InterruptingMLP,), {"calls": 0, "at": 0})


@pytest.fixture(autouse=True)
def _forget_modules_loaded_from_tmp_paths(request):
    """A user's network loaded from a test's temporary folder (--model file.py:Class) leaves the module
    in sys.modules; forget it, so that another test's file or package of the same name is its own."""
    yield
    base = str(request.config._tmp_path_factory.getbasetemp())
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(base):
            del sys.modules[name]
