"""BNN(hidden=[]) with a Normal prior and known Gaussian noise is Bayesian linear regression: compare
NUTS and mean-field SVI with the closed-form posterior and evidence."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import assert_matches_exact_posterior_within_4_mcse, flat, torch_threads

import bnn_zoo as bz


@pytest.fixture(scope="module")
def nuts_fit(blr_model, blr_data):
    with torch_threads(2):  # two threads: the chains fork (where two cores are usable), as on the command line
        return bz.fit(
            blr_model,
            *blr_data,
            bz.NUTS(num_warmup=300, num_samples=1000, num_chains=2, seed=0, progress=False, backend="torch"),
            standardize=False,
        )


@pytest.fixture(scope="module", params=[False, True], ids=["weight-draws", "local-reparam"])
def svi_fit(blr_model, blr_data, request):
    """Local reparameterisation changes the gradient estimator, not the objective: same optimum."""
    method = bz.SVI(
        steps=3000,
        lr=0.05,
        lr_decay=0.02,
        num_particles=16,
        seed=0,
        progress=False,
        guide_options={"local_reparam": request.param},
    )
    return bz.fit(blr_model, *blr_data, method, standardize=False)


def test_nuts_matches_exact_posterior_within_4_mcse(nuts_fit, blr_exact):
    assert_matches_exact_posterior_within_4_mcse(nuts_fit, blr_exact)


def test_a_converged_nuts_fit_reads_its_own_diagnostics_and_does_not_warn(nuts_fit):
    from bnn_zoo.inference import health

    assert nuts_fit.info["max_rhat_function"] <= health.RHAT_MAX
    assert nuts_fit.info["min_ess_bulk_function"] >= 2 * health.ESS_MIN_PER_CHAIN
    assert nuts_fit.info["divergences"] == 0 and "convergence_warning" not in nuts_fit.info


def test_hmc_with_capped_trajectories_still_matches_the_exact_posterior(blr_model, blr_data, blr_exact):
    """max_leapfrog shortens trajectories, it does not bias them: the cap is fixed with the step size
    after warm-up, so the kept draws come from one reversible HMC kernel."""
    hmc = bz.HMC(
        num_warmup=200,
        num_samples=500,
        num_chains=2,
        trajectory_length=10.0,
        max_leapfrog=3,
        seed=0,
        chain_method="sequential",
        progress=False,
    )
    fit = bz.fit(blr_model, *blr_data, hmc, standardize=False)
    uncapped = 10.0 / fit.sample_stats["step_size"]  # trajectory_length / step size: what Pyro alone would take
    assert torch.all(uncapped > 3) and torch.all(fit.sample_stats["n_steps"] == 3)
    assert_matches_exact_posterior_within_4_mcse(fit, blr_exact)


def test_nuts_sample_stats_are_consistent(nuts_fit):
    stats = nuts_fit.sample_stats
    assert stats["diverging"].shape == (2, 1000) and stats["diverging"].dtype == torch.bool
    # tree depth is the number of doublings: n_steps in [2^(d-1), 2^d - 1]
    assert torch.all(2 ** (stats["tree_depth"] - 1) <= stats["n_steps"]) and torch.all(
        stats["n_steps"] < 2 ** stats["tree_depth"]
    )
    # energy is H = U + K at the start of each trajectory, i.e. at the previous draw, and K >= 0
    assert torch.all(stats["energy"][:, 1:] >= -stats["lp"][:, :-1])
    assert len(torch.unique(stats["step_size"][0])) == 1  # adapted in warmup, then fixed


def _mean_field(svi_fit):
    pairs = [svi_fit.guide.loc_and_scale(k) for k in ("layers.0.weight", "layers.0.bias")]
    return flat({"layers.0.weight": pairs[0][0], "layers.0.bias": pairs[1][0]}).detach().double(), flat(
        {"layers.0.weight": pairs[0][1], "layers.0.bias": pairs[1][1]}
    ).detach().double()


def test_mean_field_converges_to_the_exact_mean_field_solution(svi_fit, blr_exact):
    loc, scale = _mean_field(svi_fit)
    exact_sd = blr_exact.cov.diagonal().sqrt()
    assert torch.all((loc - blr_exact.mean).abs() < 0.1 * exact_sd), (loc, blr_exact.mean)
    ratio = scale**2 / blr_exact.mean_field_variance
    assert torch.all((ratio - 1).abs() < 0.10), ratio
    # and not to the true marginals, which the correlated inputs make ~5x larger for two weights
    assert torch.all(blr_exact.mean_field_variance[:2] < 0.3 * blr_exact.cov.diagonal()[:2])


def test_elbo_is_below_the_evidence_and_equals_its_closed_form(svi_fit, blr_exact):
    elbo, se = svi_fit.elbo(num_samples=4000)
    loc, scale = _mean_field(svi_fit)
    exact_elbo = blr_exact.log_evidence - blr_exact.kl_from(loc, scale)
    assert 0 < se < 0.05
    assert abs(elbo - exact_elbo) < 4 * se, (elbo, exact_elbo, se)
    assert elbo + 4 * se < blr_exact.log_evidence


def test_prediction_matches_exact_predictive(nuts_fit, blr_exact):
    x_new = torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0]])
    pred = nuts_fit.predict(x_new)
    phi = torch.cat([x_new.double(), torch.ones(2, 1, dtype=torch.float64)], 1)
    exact_mean = phi @ blr_exact.mean
    exact_model_var = torch.einsum("ni,ij,nj->n", phi, blr_exact.cov, phi)
    assert pred.f.shape == (2000, 2, 1)
    np.testing.assert_allclose(pred.mean[:, 0], exact_mean, atol=4 * float(exact_model_var.max().sqrt()) / np.sqrt(200))
    np.testing.assert_allclose(pred.noise_variance[:, 0], 0.25, rtol=1e-6)
    np.testing.assert_allclose(pred.variance[:, 0], exact_model_var + 0.25, rtol=0.15)


class _FailsInChild(torch.nn.Module):
    """A linear net that raises (or dies) when evaluated in a process other than the test's own."""

    def __init__(self, how: str):
        super().__init__()
        self.layer, self.how, self.parent = torch.nn.Linear(3, 1), how, os.getpid()

    def forward(self, x):
        if os.getpid() != self.parent:
            if self.how == "killed":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("weights out of range")
        return self.layer(x)


def test_parallel_chains_give_the_sequential_draws(blr_model, blr_data):
    """Chain c is seeded with seed + c in its own process: forking changes the wall time, not one draw."""
    settings = dict(num_warmup=60, num_samples=60, num_chains=2, seed=0, progress=False, backend="torch")
    with torch_threads(2):  # two threads: the chains fork
        parallel = bz.fit(blr_model, *blr_data, bz.NUTS(chain_method="parallel", **settings), standardize=False)
    sequential = bz.fit(blr_model, *blr_data, bz.NUTS(chain_method="sequential", **settings), standardize=False)
    assert parallel.settings == sequential.settings  # chain_method is not a setting of the result
    for name in parallel.samples:
        assert torch.equal(parallel.samples[name], sequential.samples[name]), name
    for name in parallel.sample_stats:
        assert torch.equal(parallel.sample_stats[name], sequential.sample_stats[name]), name


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="chains fork only where two cores are usable")
@pytest.mark.parametrize(
    "how, message",
    [
        ("raises", r"chain \d failed: ValueError: weights out of range"),
        ("killed", r"chain \d.s process ended without a result"),
    ],
)
def test_a_failed_chain_process_is_one_clear_error(blr_data, how, message, monkeypatch):
    model = bz.BNN(_FailsInChild(how), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    monkeypatch.setenv("BNN_ZOO_CORES", "2")  # forked chains, even inside a test worker's share
    with pytest.raises(bz.BnnZooError, match=message):
        bz.fit(
            model,
            *blr_data,
            bz.HMC(num_warmup=5, num_samples=5, num_chains=2, jit_compile=False, progress=False),
            standardize=False,
        )


_FORK_WHILE_TQDM_LOCKED = """
import threading, torch
from tqdm import std
import bnn_zoo as bz

std.tqdm.get_lock()
held, done = threading.Event(), threading.Event()
def monitor():  # as tqdm's monitor thread does every 10 s: hold both locks while the chains fork
    with std.tqdm.get_lock():
        held.set()
        done.wait()
threading.Thread(target=monitor, daemon=True).start()
held.wait()
torch.set_num_threads(2)
x = torch.randn(20, 3)
model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
fit = bz.fit(model, x, x.sum(1), bz.HMC(num_warmup=3, num_samples=3, num_chains=2, jit_compile=False, progress=False))
done.set()
print(fit.sample_stats["n_steps"].shape[0])
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="chains fork only where two cores are usable")
def test_chains_forked_while_another_thread_holds_tqdms_lock_do_not_hang():
    """A lock held by another thread at a fork stays held in the child, where no thread releases it;
    tqdm's monitor thread takes tqdm's lock every 10 s, and a chain's first progress bar waited on it
    forever (a CI run, 2026-11-25). Here the lock is held for the whole fork, so the hang is certain."""
    env = {**os.environ, "BNN_ZOO_CORES": "2"}  # forked chains, even from a test worker
    done = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_TQDM_LOCKED], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr[-2000:]


def test_chains_run_one_per_core_whatever_the_thread_count_and_within_a_workers_share(monkeypatch):
    """OMP_NUM_THREADS=1 (every cluster job's setting) sets threads per process, so chains still run a
    process per core; a sweep worker given a share of the cores (BNN_ZOO_CORES) forks no more chains."""
    from bnn_zoo.inference.driver import workers

    monkeypatch.delenv("BNN_ZOO_CORES", raising=False)
    cores = len(os.sched_getaffinity(0))
    with torch_threads(1):
        assert workers(4, parallel=True) == min(4, cores)
        assert workers(4, parallel=False) == 1
    monkeypatch.setenv("BNN_ZOO_CORES", "1")
    assert workers(4, parallel=True) == 1
