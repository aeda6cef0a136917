"""ChEES-HMC (many chains in lockstep): its potential against Pyro's, its draws against the exact
posterior of Bayesian linear regression, its adaptation on a badly scaled posterior, its stats."""

import math

import arviz as az
import pytest
import torch
from conftest import NOISE, flat, torch_threads
from pyro.infer.mcmc.util import initialize_model

import bnn_zoo as bz
from bnn_zoo.evaluation.exact import linear_regression
from bnn_zoo.inference.potential import LogPosterior


def _within_4_mcse(post, exact):
    """Means and sds of every coefficient within 4 Monte Carlo standard errors (ArviZ, across chains)."""
    idata = post.to_inference_data()
    draws = flat({k: v.double() for k, v in post.samples.items()}).reshape(-1, exact.mean.numel())
    mcse_mean = (
        flat({k: torch.as_tensor(az.mcse(idata, method="mean")[k].values) for k in post.samples}).reshape(-1).double()
    )
    mcse_sd = (
        flat({k: torch.as_tensor(az.mcse(idata, method="sd")[k].values) for k in post.samples}).reshape(-1).double()
    )
    exact_sd = exact.cov.diagonal().sqrt()
    assert torch.all((draws.mean(0) - exact.mean).abs() < 4 * mcse_mean), (draws.mean(0), exact.mean, mcse_mean)
    assert torch.all((draws.std(0) - exact_sd).abs() < 4 * mcse_sd), (draws.std(0), exact_sd, mcse_sd)


@pytest.fixture(scope="module")
def chees_fit(blr_model, blr_data):
    return bz.fit(
        blr_model,
        *blr_data,
        bz.ChEES(num_chains=16, num_warmup=150, num_samples=200, seed=0, progress=False, backend="torch"),
        standardize=False,
    )


def test_chees_matches_the_exact_blr_posterior_within_4_mcse(chees_fit, blr_exact):
    _within_4_mcse(chees_fit, blr_exact)


def test_chees_with_the_within_chain_mass_matrix_matches_the_exact_blr_posterior(blr_model, blr_data, blr_exact):
    method = bz.ChEES(
        num_chains=16, num_warmup=150, num_samples=200, seed=0, mass_matrix="within", progress=False, backend="torch"
    )
    _within_4_mcse(bz.fit(blr_model, *blr_data, method, standardize=False), blr_exact)


def test_chees_adapts_to_a_posterior_whose_scales_differ_4000_fold(blr_data):
    """Inputs scaled by 1e3 and 1e-3 give posterior sds about 4,000 apart. Without the pooled mass
    matrix (``mass_windows=()``) the step size is set by the narrowest direction, 1,000 leapfrog steps
    cannot cross the widest, and the sds come out 0.3x and 3x the exact ones."""
    x, y = blr_data
    x = x * torch.tensor([1e3, 1.0, 1e-3])
    model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(NOISE))
    exact = linear_regression(x, y, weight_scale=1.0, bias_scale=1.0, noise_scale=NOISE)
    assert exact.cov.diagonal().max() / exact.cov.diagonal().min() > 1e7
    post = bz.fit(
        model,
        x,
        y,
        bz.ChEES(num_chains=16, num_warmup=150, num_samples=150, seed=1, progress=False, backend="torch"),
        standardize=False,
    )
    _within_4_mcse(post, exact)


def test_a_diverged_chain_leaves_the_trajectory_adaptation_finite(blr_model, blr_data, blr_exact):
    """A chain whose proposal overflowed (1e30, acceptance 0) took part in the ChEES gradient as 0 x inf:
    the gradient, and with it Adam's state, became NaN, and T then grew by the clip at every warm-up
    iteration up to max_leapfrog (seen on Boston: 1,000-step trajectories from iteration 40 on)."""
    from bnn_zoo.inference.chees import LOG_T_CLIP, _Sampler, _Target

    x, y = blr_data
    settings = bz.ChEES(num_chains=4, seed=0, progress=False, backend="torch").resolved(blr_model, len(x))
    generator = torch.Generator().manual_seed(0)
    target = _Target(LogPosterior(blr_model, len(x)), x, y.reshape(-1, 1), blr_model.latent_shapes())
    start = blr_exact.mean.float() + 0.01 * torch.randn(4, 4, generator=generator)  # (weights, bias) per chain
    sampler = _Sampler(target, start, settings, generator)
    before = sampler.trajectory
    for _ in range(3):
        out = sampler._transition(0.01, 3)
        assert (out["accept_prob"][1:] > 0).all()
        out["proposal"][0] = 1e30
        alpha = out["accept_prob"].clone()
        alpha[0] = 0.0
        sampler._adapt_trajectory(out, alpha, 0.5)
    assert math.isfinite(sampler._adam_v) and sampler._adam_v > 0
    assert abs(math.log(sampler.trajectory / before)) < 3 * LOG_T_CLIP


def test_batched_potential_equals_pyros_per_chain_with_a_learned_noise():
    """LogPosterior.batched on 3 parameter sets at once against Pyro's own potential (log joint in
    unconstrained coordinates, the noise scale's log-Jacobian included), one set at a time."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 2, generator=g), torch.randn(12, generator=g)
    model = bz.BNN(bz.models.MLP(2, [4], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    _, potential_fn, _, _ = initialize_model(model, model_args=(x, y))
    target = LogPosterior(model, len(x))
    params = {k: torch.randn(3, *shape, generator=g) for k, shape in model.latent_shapes().items()}
    batched = target.batched(params, x, y)
    for c in range(3):
        expected = -potential_fn({k: v[c] for k, v in params.items()})
        assert batched[c].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("activation", ["tanh", "relu", "sigmoid", "elu", "gelu"])
@pytest.mark.parametrize(
    ("hidden", "likelihood", "prior"),
    [
        ([7], "fixed", "fanin"),
        ([6, 5], "fixed", "mixture"),
        ([1, 4], "fixed", "fanin"),
        ([6, 5], "learned", "fanin"),
        ([], "learned", "fanin"),
        ([6, 5], "categorical", "fanin"),
    ],
)
def test_the_networks_own_backward_gives_autograds_potential_and_gradient(activation, hidden, likelihood, prior):
    """LogPosterior.batched_value_and_grad (the MLP's hand-derived backward, its tanh through sigmoid; the
    Normal priors and fixed-noise Gaussian likelihood written out, autograd for the rest) against
    autograd through LogPosterior.batched: float32 rounding apart, for every activation, depth, output
    width (a one-unit hidden layer included), likelihood and prior family."""
    g = torch.Generator().manual_seed(0)
    classes = likelihood == "categorical"
    out = 3 if classes else 2
    x = torch.randn(30, 4, generator=g)
    y = torch.randint(out, (30,), generator=g) if classes else torch.randn(30, out, generator=g)
    lik = {
        "fixed": bz.likelihoods.Gaussian(0.3),
        "learned": bz.likelihoods.Gaussian.learned(),
        "categorical": bz.likelihoods.Categorical(),
    }[likelihood]
    weight_prior = bz.priors.FanInNormal() if prior == "fanin" else bz.priors.ScaleMixture()
    model = bz.BNN(bz.models.MLP(4, hidden, out, activation=activation), weight_prior, lik)
    target = LogPosterior(model, len(x))
    params = {k: torch.randn(5, *shape, generator=g) for k, shape in model.latent_shapes().items()}
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    expected = target.batched(leaves, x, y)
    expected_grads = torch.autograd.grad(expected.sum(), list(leaves.values()))
    value, grads = target.batched_value_and_grad(params, x, y)
    assert torch.allclose(value, expected.detach(), rtol=1e-5, atol=1e-4)
    for k, e in zip(leaves, expected_grads, strict=True):
        assert grads[k].shape == e.shape
        assert torch.allclose(grads[k], e, rtol=1e-4, atol=1e-4 * float(e.abs().max())), (k, (grads[k] - e).abs().max())


def test_autograd_in_chunks_of_chains_gives_the_one_batch_potential_and_gradient(monkeypatch):
    """A network without its own backward (a small LeNet) goes through autograd a few chains at a time
    (potential.CHUNK_BYTES): chunks of one chain give what one batch of all five gives."""
    from bnn_zoo.inference import potential

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 16, generator=g), torch.randint(3, (12,), generator=g)
    model = bz.BNN(
        bz.models.LeNet((1, 4, 4), channels=(2,), dense=5, out_features=3),
        bz.priors.FanInNormal(),
        bz.likelihoods.Categorical(),
    )
    params = {k: torch.randn(5, *shape, generator=g) for k, shape in model.latent_shapes().items()}
    calls = []
    batched = LogPosterior.batched
    monkeypatch.setattr(
        LogPosterior,
        "batched",
        lambda self, p, *a: calls.append(next(iter(p.values())).shape[0]) or batched(self, p, *a),
    )
    monkeypatch.setattr(potential, "CHUNK_BYTES", 1e12)
    whole, whole_grads = LogPosterior(model, len(x)).batched_value_and_grad(params, x, y)
    assert calls[1:] == [5]  # after the one-chain measurement of what autograd saves
    calls.clear()
    monkeypatch.setattr(potential, "CHUNK_BYTES", 1.0)
    value, grads = LogPosterior(model, len(x)).batched_value_and_grad(params, x, y)
    assert calls[1:] == [1] * 5
    assert torch.allclose(value, whole, rtol=1e-5)
    for k, e in whole_grads.items():
        assert grads[k].shape == e.shape and torch.allclose(grads[k], e, rtol=1e-4, atol=1e-6), k


def test_chees_sample_stats_describe_each_draw(chees_fit):
    stats = chees_fit.sample_stats
    assert set(stats) == {"acceptance_rate", "diverging", "energy", "lp", "step_size", "n_steps", "trajectory_length"}
    assert all(v.shape == (16, 200) for v in stats.values())
    assert stats["diverging"].dtype == torch.bool and not stats["diverging"].any()
    assert torch.all((stats["acceptance_rate"] >= 0) & (stats["acceptance_rate"] <= 1))
    # every chain takes the same jittered number of steps: n_steps = ceil(jittered length / step size)
    assert torch.all(stats["n_steps"] == stats["n_steps"][:1])
    expected = torch.ceil(stats["trajectory_length"] / stats["step_size"]).clamp(1, 1000)
    assert torch.allclose(stats["n_steps"], expected)
    # dual averaging aims the harmonic mean of acceptance at 0.651: the arithmetic mean sits above it
    assert 0.6 < float(stats["acceptance_rate"].mean()) < 0.98
    # lp is the log density of the kept draw: the chains' energies are at least -lp (K >= 0)
    assert torch.all(stats["energy"][:, 1:] >= -stats["lp"][:, :-1] - 1e-3)


def test_chees_is_reproducible_checks_its_settings_and_runs_a_recurrent_model(blr_model, blr_data):
    short = bz.ChEES(num_chains=4, num_warmup=10, num_samples=5, seed=3, progress=False, backend="torch")
    a, b = (
        bz.fit(blr_model, *blr_data, short, standardize=False),
        bz.fit(blr_model, *blr_data, short, standardize=False),
    )
    assert all(torch.equal(a.samples[k], b.samples[k]) for k in a.samples)
    with pytest.raises(bz.BnnZooError, match="num_chains must be an integer >= 2"):
        bz.ChEES(num_chains=1)
    with pytest.raises(bz.BnnZooError, match="target_accept"):
        bz.ChEES(target_accept=1.5)
    text = bz.BNN(
        bz.models.TextRNN(vocab_size=10, embed_dim=4, hidden=4), bz.priors.Normal(1.0), bz.likelihoods.Categorical()
    )
    post = bz.fit(text, torch.randint(10, (6, 3)), torch.randint(2, (6,)), short, standardize=False)
    assert all(v.shape[:2] == (4, 5) and torch.isfinite(v).all() for v in post.samples.values())


def test_the_compiled_potential_and_gradient_equal_the_eager_ones(blr_data):
    """ChEES(compile=True) runs the same log posterior through torch.compile: same values and gradients. In a
    process where the XLA backend has run (torchax imported, as an earlier test may have), one clear error."""
    import sys

    from bnn_zoo.inference.chees import _Target

    model = bz.BNN(bz.models.MLP(3, [5], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned())
    x, y = blr_data
    y = y[:, None]
    eager = _Target(LogPosterior(model, len(x)), x, y, model.latent_shapes())
    if "torchax" in sys.modules:
        with pytest.raises(bz.BnnZooError, match="compile=True cannot run in a process where the XLA backend has run"):
            _Target(LogPosterior(model, len(x)), x, y, model.latent_shapes(), compile=True)
        return
    compiled = _Target(LogPosterior(model, len(x)), x, y, model.latent_shapes(), compile=True)
    q = torch.randn(4, sum(eager.sizes), generator=torch.Generator().manual_seed(0))
    (v1, g1), (v2, g2) = eager(q), compiled(q)
    assert torch.allclose(v1, v2, rtol=1e-5) and torch.allclose(g1, g2, rtol=1e-4, atol=1e-4)


def test_an_interrupted_chees_run_resumes_to_the_same_draws(blr_data, tmp_path, interrupting_mlp):
    Interrupting = interrupting_mlp
    model = bz.BNN(Interrupting(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    settings = dict(
        num_chains=4, num_warmup=40, num_samples=30, seed=1, checkpoint_every=7, progress=False, backend="torch"
    )
    full = bz.fit(model, *blr_data, bz.ChEES(**settings), standardize=False)
    total_calls = Interrupting.calls
    ck = tmp_path / "ck.pt"
    for fraction in (0.15, 0.8):  # in the first mass-matrix window of warm-up, then among the kept draws
        Interrupting.calls, Interrupting.at = 0, int(fraction * total_calls)
        with pytest.raises(KeyboardInterrupt):
            bz.fit(model, *blr_data, bz.ChEES(checkpoint=ck, **settings), standardize=False)
        assert ck.exists()
        Interrupting.at = 0
        resumed = bz.fit(model, *blr_data, bz.ChEES(checkpoint=ck, **settings), standardize=False)
        assert Interrupting.calls < 1.1 * total_calls  # it resumed rather than starting again
        for k in full.samples:
            assert torch.equal(resumed.samples[k], full.samples[k]), (fraction, k)
        for k in full.sample_stats:
            assert torch.equal(resumed.sample_stats[k], full.sample_stats[k]), (fraction, k)
        assert not ck.exists()  # the posterior supersedes it
    Interrupting.calls, Interrupting.at = 0, total_calls // 2
    with pytest.raises(KeyboardInterrupt):
        bz.fit(model, *blr_data, bz.ChEES(checkpoint=ck, **settings), standardize=False)
    with pytest.raises(bz.BnnZooError, match="belongs to a different fit"):  # other settings: refused, not resumed
        bz.fit(model, *blr_data, bz.ChEES(checkpoint=ck, **(settings | {"seed": 2})), standardize=False)


def _replay(limit_kwargs, seconds_per_iteration, monkeypatch):
    """Run a TimeLimit over iterations of the given durations on a fake clock; the iteration it stopped at, or None."""
    from bnn_zoo.inference import budget

    clock = [0.0]
    monkeypatch.setattr(budget.time, "perf_counter", lambda: clock[0])
    limit = budget.TimeLimit("ChEES", total=len(seconds_per_iteration), **limit_kwargs)
    for done, seconds in enumerate(seconds_per_iteration):
        try:
            limit.check(done)
        except budget.TimeLimitExceeded:
            return done
        clock[0] += seconds
    return None


def test_the_time_limit_waits_out_chees_dear_first_iterations(monkeypatch):
    """ChEES on the digits CNN (2026-11-24): 125 iterations at 10.6 s before its first mass-matrix
    window, then about 1.5 s: 38 minutes in all. Projected from the start (the old rule) that read as
    over 2 hours and a 2-hour limit stopped it; projected with ``settle`` it runs. A run too slow even at 10x
    cheaper later iterations (HMC on the CNN: 65 s an iteration) still stops at the first check."""
    cnn = [10.6] * 125 + [1.5] * 625
    assert _replay({"max_hours": 2}, cnn, monkeypatch) is not None  # the old rule: stopped
    assert _replay({"max_hours": 2, "settle": 125}, cnn, monkeypatch) is None
    assert _replay({"max_hours": 2, "settle": 125}, [65.0] * 750, monkeypatch) == 1
    # after settling, its own pace decides: iterations that grow dear again stop the run
    assert _replay({"max_hours": 2, "settle": 125}, [10.6] * 125 + [20.0] * 625, monkeypatch) in range(126, 140)


def test_a_run_projected_past_max_hours_stops_with_the_fix_and_resumes(blr_model, blr_data, tmp_path, monkeypatch):
    """bnn_zoo.inference.budget: once past its grace period (here 0 s), a run whose pace projects past
    max_hours stops with one line naming the projection and the fixes. ChEES first saves its
    checkpoint, and the same fit without the limit resumes it to the uninterrupted run's draws;
    NUTS's chains stop in their forked processes, and the parent raises the same message."""
    from bnn_zoo.inference import budget

    monkeypatch.setattr(budget, "GRACE_S", 0.0)
    settings = dict(num_chains=4, num_warmup=20, num_samples=10, seed=2, progress=False, backend="torch")
    full = bz.fit(blr_model, *blr_data, bz.ChEES(**settings), standardize=False)
    ck = tmp_path / "ck.pt"
    message = (
        r"ChEES would take at least .* hours, even if its iterations after iteration 5 ran 10x faster .*\(1 of "
        r"30 iterations"
    )
    with pytest.raises(budget.TimeLimitExceeded, match=message) as info:
        bz.fit(blr_model, *blr_data, bz.ChEES(checkpoint=ck, max_hours=1e-9, **settings), standardize=False)
    assert (
        "\n" not in str(info.value)
        and "raise max_hours" in str(info.value)
        and "the same fit resumes it" in str(info.value)
    )
    resumed = bz.fit(blr_model, *blr_data, bz.ChEES(checkpoint=ck, **settings), standardize=False)
    assert all(torch.equal(resumed.samples[k], full.samples[k]) for k in full.samples)
    for chain_method in ("sequential", "parallel"):
        nuts = bz.NUTS(
            num_warmup=5,
            num_samples=5,
            num_chains=2,
            max_hours=1e-9,
            chain_method=chain_method,
            progress=False,
            backend="torch",
        )
        message = r"^NUTS would take about .* hours at its pace so far \(1 of 10 iterations.*raise max_hours$"
        with torch_threads(2), pytest.raises(bz.BnnZooError, match=message):  # two threads: the parallel chains fork
            bz.fit(blr_model, *blr_data, nuts, standardize=False)


def test_hmc_settles_at_pyros_first_mass_matrix_update_and_nuts_does_not(blr_model, blr_data, monkeypatch):
    """Pyro's warm-up (Stan's schedule) first sets the mass matrix at iteration 100 of 500; until then
    the limit stops HMC only if even 10x cheaper later iterations would not do. NUTS, whose iterations
    cost as much after it, and a run with no mass-matrix window (fewer than 20 warm-up iterations; the
    test above) project the pace so far."""
    from bnn_zoo.inference import budget

    monkeypatch.setattr(budget, "GRACE_S", 0.0)
    for method, how in (
        ("HMC", "at least .* even if its iterations after iteration 100 ran 10x faster than so far"),
        ("NUTS", "about .* at its pace so far"),
    ):
        backend = {"backend": "torch"} if method == "NUTS" else {}  # the time limit is the torch samplers'
        sampler = getattr(bz, method)(
            num_warmup=500, num_samples=1, max_hours=1e-9, chain_method="sequential", progress=False, **backend
        )
        with pytest.raises(budget.TimeLimitExceeded, match=rf"^{method} would take {how} \(1 of 501 iterations"):
            bz.fit(blr_model, *blr_data, sampler, standardize=False)
