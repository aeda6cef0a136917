"""The SVI loop: minibatches, a non-finite loss stops with the last finite state, checkpoints resume exactly."""

import math

import pyro
import pytest
import torch

import bnn_zoo as bz


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    return x, x.sum(1) + 0.1 * torch.randn(40, generator=g)


class Poisoned(bz.BNN):
    """Its log joint turns NaN from the ``at``-th call on (with ``gradient``: stays finite, its gradient NaN)."""

    def __init__(self, at, gradient=False):
        super().__init__(bz.models.MLP(2, [4], 1))
        self.calls, self.at, self.gradient = 0, at, gradient

    def __call__(self, *args, **kwargs):
        self.calls += 1
        out = super().__call__(*args, **kwargs)
        if self.calls >= self.at:
            # sqrt'(0) * sign(0) = inf * 0: a zero whose gradient is NaN
            pyro.factor("poison", (out * 0).abs().sqrt().sum() if self.gradient else torch.tensor(float("nan")))
        return out


def test_non_finite_loss_stops_and_keeps_the_last_finite_state():
    x, y = _data()
    # call k is step k - 1 (the mean-field guide is built without running the model): step 10 is NaN
    with pytest.warns(UserWarning, match="SVI stopped early: loss became nan at step 10; kept the last parameters"):
        stopped = bz.fit(
            Poisoned(at=11),
            x,
            y,
            bz.SVI(steps=50, lr=0.01, lr_decay=1.0, seed=0, progress=False, num_draws=10),
            standardize=False,
        )
    # the parameters that produced the last finite loss (step 9's) are those a clean 9-step fit ends at
    # a constant rate:
    clean = bz.fit(
        Poisoned(at=10**9),
        x,
        y,
        bz.SVI(steps=9, lr=0.01, lr_decay=1.0, seed=0, progress=False, num_draws=10),
        standardize=False,
    )
    # with a decay, a 9-step fit's schedule is not the first 9 steps of a 50-step one
    assert stopped.info["stop_reason"] == "loss became nan at step 10"
    assert len(stopped.sample_stats["loss"]) == 10
    for (name, a), b in zip(stopped.guide.named_parameters(), clean.guide.parameters()):
        assert torch.isfinite(a).all() and torch.equal(a, b), name


@pytest.mark.parametrize("steps", [50, 11])  # the NaN gradient mid-run, and at the last step
def test_a_non_finite_gradient_stops_and_keeps_the_parameters_of_the_last_finite_loss(steps):
    x, y = _data()
    with pytest.warns(
        UserWarning, match="SVI stopped early: gradient became non-finite at step 10; kept the last parameters"
    ):
        stopped = bz.fit(
            Poisoned(at=11, gradient=True),
            x,
            y,
            bz.SVI(steps=steps, lr=0.01, lr_decay=1.0, seed=0, progress=False, num_draws=10),
            standardize=False,
        )
    clean = bz.fit(
        Poisoned(at=10**9),
        x,
        y,
        bz.SVI(steps=10, lr=0.01, lr_decay=1.0, seed=0, progress=False, num_draws=10),
        standardize=False,
    )
    assert stopped.info["stop_reason"] == "gradient became non-finite at step 10"
    for (name, a), b in zip(stopped.guide.named_parameters(), clean.guide.parameters()):
        assert torch.isfinite(a).all() and torch.equal(a, b), name


def test_minibatch_fit_runs_and_learns():
    x, y = _data()
    model = bz.BNN(bz.models.MLP(2, [], 1), likelihood=bz.likelihoods.Gaussian(0.1))
    post = bz.fit(
        model, x, y, bz.SVI(steps=1500, lr=0.05, batch_size=8, seed=0, progress=False, num_draws=200), standardize=False
    )
    assert torch.allclose(post.samples["layers.0.weight"].mean((0, 1)), torch.ones(1, 2), atol=0.1)


class Interrupted(bz.BNN):
    """Raises KeyboardInterrupt (as Ctrl-C would) on its ``at``-th call."""

    def __init__(self, at):
        super().__init__(bz.models.MLP(2, [4], 1), likelihood=bz.likelihoods.Gaussian(0.3))
        self.calls, self.at = 0, at

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return super().__call__(*args, **kwargs)


def test_resume_after_an_interrupt_ends_where_an_uninterrupted_fit_ends(tmp_path):
    x, y = _data()
    ckpt = tmp_path / "ckpt.pt"
    settings = dict(
        steps=90,
        lr=0.02,
        lr_decay=0.1,
        seed=5,
        num_particles=2,
        batch_size=16,
        progress=False,
        num_draws=10,
        checkpoint_every=25,
    )
    full = bz.fit(Interrupted(at=0), x, y, bz.SVI(**settings), standardize=False)
    with pytest.raises(KeyboardInterrupt):  # call 61 is step 60, mid-way through the fit
        bz.fit(Interrupted(at=61), x, y, bz.SVI(checkpoint=ckpt, **settings), standardize=False)
    assert ckpt.exists()
    resumed = bz.fit(Interrupted(at=0), x, y, bz.SVI(checkpoint=ckpt, **settings), standardize=False)
    assert len(resumed.sample_stats["loss"]) == 90
    torch.testing.assert_close(resumed.sample_stats["loss"], full.sample_stats["loss"], rtol=0, atol=0)
    for a, b in zip(resumed.guide.parameters(), full.guide.parameters()):
        assert torch.equal(a, b)


def test_a_stale_checkpoint_is_refused_and_its_own_fit_resumes(tmp_path):
    """A checkpoint records what it belongs to (data, model, guide, settings): any other fit is refused
    instead of silently returning the old fit's parameters under the new settings."""
    x, y = _data()
    ckpt = tmp_path / "ckpt.pt"
    settings = dict(steps=20, checkpoint=ckpt, checkpoint_every=5, progress=False, num_draws=5)
    with pytest.raises(KeyboardInterrupt):
        bz.fit(Interrupted(at=13), x, y, bz.SVI(**settings), standardize=False)
    others = {
        "another network": (bz.BNN(bz.models.MLP(2, [7], 1)), x, y, settings),
        "other data": (Interrupted(at=0), x, y + 1, settings),
        "another learning rate": (Interrupted(at=0), x, y, {**settings, "lr": 0.5}),
        "another guide": (Interrupted(at=0), x, y, {**settings, "guide": "dropout"}),
    }
    for what, (other, xs, ys, options) in others.items():
        with pytest.raises(bz.BnnZooError, match="belongs to a different fit .* delete it"):
            bz.fit(other, xs, ys, bz.SVI(**options), standardize=False)
        assert ckpt.exists(), what  # refused, not overwritten
    resumed = bz.fit(Interrupted(at=0), x, y, bz.SVI(**settings), standardize=False)
    # an interrupt raised mid-step (not a held signal) keeps the last periodic checkpoint
    assert resumed.info["resumed_at_step"] == 10 and len(resumed.sample_stats["loss"]) == 20


def test_early_stopping_keeps_the_best_guide_and_holds_out_validation_data():
    """An over-parameterised net on 40 noisy points overfits; training stops `patience` evaluations after
    the best validation score, and the guide returned is exactly the one a fit stopped there would give."""
    x, y = _data()
    y = y + torch.randn(40, generator=torch.Generator().manual_seed(5))
    model = bz.BNN(bz.models.MLP(2, [64], 1), bz.priors.Normal(3.0), bz.likelihoods.Gaussian(0.3))
    # constant: see above
    common = dict(guide="mean-field", lr=0.03, lr_decay=1.0, validation=0.25, progress=False, num_draws=10)
    post = bz.fit(model, x, y, bz.SVI(steps=3000, eval_every=25, patience=4, **common), standardize=False)
    best, run = post.info["best_step"], post.info["steps_run"]
    assert run == best + 4 * 25 < 3000
    assert post.x.shape == (30, 2)
    again = bz.fit(model, x, y, bz.SVI(steps=best, eval_every=best, patience=1, **common), standardize=False)
    for (k, a), b in zip(post.guide.state_dict().items(), again.guide.state_dict().values()):
        assert torch.equal(a, b), k


def test_bad_validation_settings_are_refused():
    with pytest.raises(bz.BnnZooError, match="held-out fraction"):
        bz.SVI(validation=1.5)
    x, y = _data()
    with pytest.raises(bz.BnnZooError, match="leaves no training or no validation"):
        bz.fit(
            bz.BNN(bz.models.MLP(2, [4], 1)),
            x[:3],
            y[:3],
            bz.SVI(validation=0.1, steps=2, progress=False),
            standardize=False,
        )


def test_guide_draws_are_made_on_demand_one_block_at_a_time(monkeypatch):
    """A registered guide's posterior stores no draws. predict(T) makes them from the guide a block at a
    time (weight memory independent of T), each forward call on a few draws and rows; draw j is the
    same whichever call makes it; each block has its own seed; the global RNG is left as it was; and
    the draws follow q."""
    x, y = _data()
    post = bz.fit(
        bz.BNN(bz.models.MLP(2, [4], 1), likelihood=bz.likelihoods.Gaussian(1.0)),
        x,
        y,
        bz.SVI(steps=20, seed=0, progress=False, num_draws=30),
        standardize=False,
    )
    assert post.stored is None and post.num_draws == 30 and post.samples["layers.0.weight"].shape == (1, 30, 4, 2)
    post.BLOCK_FLOATS = 8 * sum(v.numel() for v in post.model.params.values())  # blocks of 8 draws
    post.ROWS_PER_CALL, post.DRAW_ROWS_PER_CALL = 16, 48  # forward calls of 3 draws x 16 of the 40 rows, joined
    made, make = [], post._guide_block
    monkeypatch.setattr(post, "_guide_block", lambda block, size: made.append((block, size)) or make(block, size))
    rng = torch.get_rng_state()
    f = post.predict(x, num_samples=100).f
    assert made == [(b, 8) for b in range(13)]  # ceil(100 / 8) blocks, one at a time
    assert torch.equal(torch.get_rng_state(), rng)
    draws = post.draws(100)
    assert torch.allclose(f, post.model.forward({k: draws[k] for k in post.model.params}, x), atol=1e-6)
    assert torch.equal(post.draws(5)["layers.0.weight"], draws["layers.0.weight"][:5])
    assert torch.equal(post.log_likelihood(draw_index=torch.tensor([3, 17]))[0], post.log_likelihood()[0, [3, 17]])
    assert not torch.equal(draws["layers.0.weight"][:8], draws["layers.0.weight"][8:16])
    # 4,000 draws against the guide's own mean and sd: every weight within 4.5 standard errors
    w = post.draws(4000)["layers.0.weight"]
    loc, scale = (t.detach() for t in post.guide.loc_and_scale("layers.0.weight"))
    assert ((w.mean(0) - loc) / (scale / 4000**0.5)).abs().max() < 4.5
    assert ((w.std(0) / scale - 1) / (1 / (2 * 3999) ** 0.5)).abs().max() < 4.5


def test_minibatches_of_a_large_dataset_are_distinct_uniform_rows_drawn_in_o_of_the_batch():
    """Past 2^20 rows a permutation per step would cost more than the step; the indices drawn instead
    are distinct, in range, and uniform: their mean over 200 batches of 64 is n/2 within 4 standard errors."""
    from bnn_zoo.inference.elbo import LARGE, minibatch

    torch.manual_seed(0)
    n = 4 * LARGE
    batches = torch.stack([minibatch(n, 64) for _ in range(200)])
    assert all(len(torch.unique(b)) == 64 for b in batches) and batches.min() >= 0 and batches.max() < n
    se = n / math.sqrt(12) / math.sqrt(batches.numel())
    assert abs(batches.double().mean() - n / 2) < 4 * se
