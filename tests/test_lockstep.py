"""Lockstep fits: the direct ELBO is Pyro's TraceMeanField_ELBO (value and gradient) for the same draws;
a fit's parameters do not depend on the fits beside it; lockstep and sequential fits agree in
distribution; what cannot run in lockstep says why."""

import math

import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

import bnn_zoo as bz
from bnn_zoo.inference import lockstep
from bnn_zoo.inference.lockstep import Job, _Batch, fit_lockstep, why_not

torch.manual_seed(0)
X = torch.randn(48, 3)
Y = X @ torch.tensor([1.0, -0.5, 0.3]) + 0.2 * torch.randn(48)


def _job(seed=0, guide="dropout", options=None, steps=40, batch_size=16, lr=0.01, prior_scale=2.0, noise=0.3):
    model = bz.BNN(bz.models.MLP(3, [8], 1, "relu"), bz.priors.Normal(prior_scale), bz.likelihoods.Gaussian(noise))
    fixed_p = {"p": 0.01} if guide == "dropout" else {}  # a p left to its default is learned, which lockstep refuses
    method = bz.SVI(
        guide=guide,
        guide_options=fixed_p if options is None else options,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seed=seed,
        progress=False,
        num_draws=10,
    )
    return Job(model, X, Y, method, standardize=False)  # the tests compare with Pyro on X, Y as given


@pytest.mark.parametrize("guide, options", [("mean-field", {}), ("dropout", {"p": 0.3, "masks": "step"})])
def test_the_direct_elbo_is_pyros_trace_mean_field_elbo_for_the_same_draws(guide, options):
    job = _job(guide=guide, options=options, batch_size=None)
    batch = _Batch([job])
    draws = batch._draws(0)
    loss = batch.loss(draws, 0)
    loss.sum().backward()
    weights, _ = batch._weights_and_kl({k: v for k, v in draws.items() if k != "idx"})
    guide_module = batch.guides[0]
    trace = poutine.trace(guide_module).get_trace(X, Y[:, None])
    for name in job.model.params:  # the same draw, written in the guide's own parameters so gradients flow
        loc = guide_module.loc(name) if guide == "dropout" else guide_module.loc_and_scale(name)[0]
        if guide == "dropout":
            kept = (weights[name][0] != 0) | (batch.leaves[f"locs.{name.replace('.', '__')}_unconstrained"][0] == 0)
            value = loc * kept.to(loc.dtype) if name in batch.keep else loc
        else:
            sigma = guide_module.loc_and_scale(name)[1]
            value = loc + sigma * draws[name][0]
        trace.nodes[name]["value"] = value
    pyro_loss = TraceMeanField_ELBO().differentiable_loss(
        job.model, poutine.replay(guide_module, trace=trace), X, Y[:, None]
    )
    torch.testing.assert_close(loss[0], pyro_loss, rtol=1e-5, atol=1e-4)
    guide_module.zero_grad()
    pyro_loss.backward()
    ours = {k: v[0] for k, v in batch.unflatten(batch.flat.grad).items()}
    for k, p in guide_module.named_parameters():
        torch.testing.assert_close(ours[k], p.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "guide, options, batch_size",  # batches of 16 of 48 rows take the O(n) subsets, of 4 the O(m) ones
    [
        ("mean-field", {}, 16),
        ("dropout", {"p": 0.2, "masks": "step"}, 16),
        ("dropout", {"p": 0.2, "masks": "example"}, 4),
    ],
)
def test_a_fits_parameters_do_not_depend_on_the_fits_beside_it(guide, options, batch_size):
    alone = fit_lockstep([_job(1, guide, options, batch_size=batch_size)])[0]
    others = [
        _job(s, guide, options, batch_size=batch_size, **kw)
        for s, kw in enumerate([{"lr": 0.02, "prior_scale": 1.0}, {}, {"noise": 0.5}])
    ]
    together = fit_lockstep(others)
    a, b = alone.guide.state_dict(), together[1].guide.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    assert together[1].info["lockstep"] == 3 and together[1].settings == alone.settings
    assert not torch.equal(together[0].guide.state_dict()[k], b[k])  # its neighbours did fit their own settings


def test_lockstep_and_sequential_fits_agree_in_distribution():
    """Mean-field on Bayesian linear regression: 6 seeds each way; the fitted means and the final ELBO
    agree within their spread across seeds (different random streams, the same objective)."""
    x = torch.randn(60, 2)
    y = x @ torch.tensor([0.8, -1.2]) + 0.5 * torch.randn(60)

    def job(seed):
        model = bz.BNN(bz.models.MLP(2, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
        return Job(
            model,
            x,
            y,
            bz.SVI(guide="mean-field", steps=800, lr=0.05, lr_decay=0.1, seed=seed, progress=False, num_draws=10),
            standardize=False,
        )

    lock = fit_lockstep([job(s) for s in range(6)])
    seq = [bz.fit(j.model, j.x, j.y, j.method, standardize=False) for j in (job(s) for s in range(6))]

    def summary(posts):
        means = torch.stack([p.guide.loc_and_scale("layers.0.weight")[0].detach().flatten() for p in posts])
        final = torch.tensor([p.sample_stats["loss"][-200:].mean().item() for p in posts])
        return means, final

    (m1, f1), (m2, f2) = summary(lock), summary(seq)
    assert (m1.mean(0) - m2.mean(0)).abs().max() < 4 * (m1.std(0) + m2.std(0)).max() / 6**0.5 + 1e-3
    assert abs(f1.mean() - f2.mean()) < 4 * (f1.std() + f2.std()) / 6**0.5 + 0.5


def test_what_cannot_run_in_lockstep_says_why():
    assert why_not(_job()) is None
    assert "local reparameterisation" in why_not(_job(guide="mean-field", options={"local_reparam": True}))
    assert "dropout and mean-field" in why_not(_job(guide="matrix-normal"))
    assert (
        why_not(_job(options={}))
        == why_not(_job(options={"learn_p": True}))
        == "a learned p is not in the lockstep ELBO"
    )
    learned = _job()
    learned.model = bz.BNN(bz.models.MLP(3, [8], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian.learned())
    assert "fixed scale" in why_not(learned)
    with pytest.raises(bz.BnnZooError, match="must share the architecture"):
        fit_lockstep([_job(), _job(steps=41)])
    tanh = _job()
    tanh.model = bz.BNN(bz.models.MLP(3, [8], 1, "tanh"), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.3))
    with pytest.raises(bz.BnnZooError, match="must share the architecture"):  # same shapes, another activation
        fit_lockstep([_job(), tanh])


def test_a_diverging_fit_stops_alone_at_its_last_finite_state():
    with pytest.warns(UserWarning, match="lockstep fit 1 stopped early"):
        fits = fit_lockstep([_job(0), _job(1, lr=1e30)])  # its weights overflow float32 within steps
    assert fits[0].info["stop_reason"] == "" and "non-finite" in fits[1].info["stop_reason"]
    assert all(torch.isfinite(v).all() for v in fits[1].guide.state_dict().values())
    assert len(fits[0].sample_stats["loss"]) == 40 > len(fits[1].sample_stats["loss"])


def test_a_killed_batch_resumes_from_its_checkpoint_to_the_same_parameters(tmp_path, monkeypatch):
    monkeypatch.setattr(lockstep, "CHECKPOINT_SECONDS", 0.0)  # a checkpoint at every block boundary
    whole = fit_lockstep([_job(0), _job(1, lr=0.02)])
    path, step = tmp_path / "batch.pt", _Batch.step

    def killed_at_25(self, k):
        if k == 25:
            raise KeyboardInterrupt
        step(self, k)

    monkeypatch.setattr(_Batch, "step", killed_at_25)
    with pytest.raises(KeyboardInterrupt):
        fit_lockstep([_job(0), _job(1, lr=0.02)], checkpoint=path)
    assert torch.load(path, weights_only=True)["step"] == 16  # the last block boundary before the kill
    monkeypatch.setattr(_Batch, "step", step)
    resumed = fit_lockstep([_job(0), _job(1, lr=0.02)], checkpoint=path)
    for a, b in zip(whole, resumed):
        assert a.sample_stats["loss"].tolist() == b.sample_stats["loss"].tolist()
        for k, v in a.guide.state_dict().items():
            assert torch.equal(v, b.guide.state_dict()[k])
    with pytest.raises(bz.BnnZooError, match="belongs to a different fit"):
        fit_lockstep([_job(0), _job(1)], checkpoint=path)


def test_the_vmap_forward_for_other_networks_equals_the_mlps_own():
    """The MLP runs its own forward_draws (checked against Pyro above); any other dense net runs under vmap."""
    batch = _Batch([_job(s, "dropout", {"p": 0.3, "masks": "example"}, batch_size=8) for s in range(3)])
    draws = batch._draws(0)
    rows = draws["idx"] + batch.offsets
    xb = X[rows % 48]
    masks = {k: draws[f"mask:{k}"] for k in batch.mask_shapes}
    assert masks and all(m.shape[:2] == (3, 8) for m in masks.values())
    weights, _ = batch._weights_and_kl({})
    torch.testing.assert_close(batch._forward_vmap(weights, xb, masks), batch.net.forward_draws(weights, xb, masks))


def test_a_lockstep_posterior_holds_its_data_as_bz_fit_does():
    """Targets given as (N,) are stored as (N, 1), so the training log-likelihood (LOO, WAIC) is per point."""
    job = _job(guide="mean-field", steps=200)
    lock, alone = fit_lockstep([job])[0], bz.fit(job.model, X, Y, job.method, standardize=False)
    assert lock.y.shape == alone.y.shape == (48, 1)
    pointwise = lock.log_likelihood()
    assert pointwise.shape == alone.log_likelihood().shape == (1, 10, 48)
    # below the density's peak; a broadcast sum over 48 rows is hundreds of nats
    assert -3 < pointwise.mean() < -math.log(0.3 * math.sqrt(2 * math.pi))


def test_minibatches_are_uniformly_random_subsets_drawn_without_replacement():
    """The O(m) path (first distinct of draws with replacement, the O(n) redraw for short rows) against
    the law of Pyro's plate: every 2-subset of range(10) equally likely. 90,000 rows, 2,000 expected per
    subset: chi-square with 44 degrees of freedom, above 100 with probability about 1e-6."""
    stream = lockstep.Stream(0)
    draws = stream.subset_candidates(10, 2, 90_000)
    assert draws.shape == (90_000, 3)  # 1.5 m with replacement: all three equal in 1% of rows
    subsets, short = lockstep.first_distinct(draws, 2)
    assert 0.007 < short.float().mean() < 0.013
    assert torch.equal(short, (draws == draws[:, :1]).all(1))
    subsets[short] = stream.subsets(10, 2, int(short.sum()))  # the redraw _Batch makes for short rows
    low, high = subsets.min(1).values, subsets.max(1).values
    assert (low < high).all()  # no row repeats an index
    counts = torch.bincount(low * 10 + high, minlength=100).reshape(10, 10)
    counts = counts[torch.triu(torch.ones(10, 10, dtype=torch.bool), 1)].double()
    assert ((counts - 2000) ** 2 / 2000).sum() < 100


def test_dropout_masks_keep_each_unit_with_probability_keep():
    """Two 32-bit uniforms per PCG64 word, each compared with keep * 2^32: 10^6 draws at keep 0.995 drop
    Binomial(10^6, 0.005) units, 5,000 +- 71; the even and the odd halves each drop half of them."""
    masks = lockstep.Stream(0).bernoulli((1000, 1000), 0.995)
    dropped = ~masks.flatten()
    assert abs(int(dropped.sum()) - 5000) < 5 * 71
    assert abs(int(dropped[0::2].sum()) - 2500) < 5 * 50 and abs(int(dropped[1::2].sum()) - 2500) < 5 * 50
    assert lockstep.Stream(0).bernoulli((3, 5), 1.0).all() and lockstep.Stream(0).bernoulli((3, 5), 0.5).shape == (3, 5)
    again = lockstep.Stream(0)
    again.state = lockstep.Stream(0).state  # the state a checkpoint stores (JSON) restores the stream exactly
    assert torch.equal(again.bernoulli((1000, 1000), 0.995), masks)
