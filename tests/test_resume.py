"""Resume bit for bit after a stop at any moment. Each iterative method is fitted once without a stop,
then again with a real SIGINT (Ctrl-C) sent by a timer thread at seeded random moments, so that it lands
anywhere: in setup, inside a step, between a step and its bookkeeping, in the progress bar, in a
periodic checkpoint. Each run resumes from the checkpoint the last one left, and the result after tens
of stops equals the uninterrupted one exactly: draws, losses and sample statistics."""

import os
import random
import signal
import threading
import time

import pytest
import torch

import bnn_zoo as bz

STOPS = 20


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, generator=g)
    y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.2 * torch.randn(40, generator=g)
    return x, y


class _TimedMLP(bz.models.MLP):
    """An MLP that notes when a run first evaluates it: the end of the run's setup."""

    first_call = None

    def _note(self):
        if type(self).first_call is None:
            type(self).first_call = time.perf_counter()

    def forward(self, x):
        self._note()
        return super().forward(x)

    def forward_draws(self, weights, x, input_masks=None):
        self._note()
        return super().forward_draws(weights, x, input_masks)


def _fit(method):
    """The fit, the seconds it took, and the seconds of its setup (to the network's first evaluation)."""
    x, y = _data()
    _TimedMLP.first_call = None
    began = time.perf_counter()
    model = bz.BNN(_TimedMLP(2, [6], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.3))
    fit = bz.fit(model, x, y, method, standardize=False)
    return fit, time.perf_counter() - began, (_TimedMLP.first_call or began) - began


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C as in a Python program: KeyboardInterrupt (a pytest-xdist worker ignores SIGINT)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _settle() -> None:
    """A Python-level call: a signal sent just before runs its handler here, inside the caller's try."""


def _with_stops(fit, delay, stops: int, checkpoint, after_saving: bool = False):
    """``fit()`` run to its end, each of the first ``stops`` runs sent SIGINT after ``delay()`` seconds
    (``after_saving``: counted from the moment the run first writes its checkpoint). Returns the result,
    how many runs a signal stopped, and after how many of those a checkpoint stood."""
    stopped = kept = 0
    while True:
        stop = threading.Event()
        timer = threading.Thread(target=_stopper, args=(delay(), checkpoint if after_saving else None, stop))
        try:
            if stopped < stops:
                timer.start()
            result = fit()
            stop.set()
            if timer.is_alive():
                timer.join()
            _settle()
            return result, stopped, kept
        except KeyboardInterrupt:
            stopped += 1
            kept += checkpoint.exists()
        finally:
            stop.set()


def _stopper(delay: float, saved, cancelled: threading.Event) -> None:
    """SIGINT to this process ``delay`` seconds from now, or from when ``saved`` changes; not once cancelled."""
    if saved is not None:
        before = saved.stat().st_mtime_ns if saved.exists() else None
        while not cancelled.is_set() and (saved.stat().st_mtime_ns if saved.exists() else None) == before:
            time.sleep(0.005)
    if not cancelled.wait(delay):
        os.kill(os.getpid(), signal.SIGINT)


def _assert_equal(resumed, full) -> None:
    assert resumed.samples.keys() == full.samples.keys()
    for k in full.samples:
        assert torch.equal(resumed.samples[k], full.samples[k]), k
    for k, v in full.sample_stats.items():
        assert torch.equal(torch.as_tensor(resumed.sample_stats[k]), torch.as_tensor(v)), k


METHODS = {
    "svi-mean-field": lambda **c: bz.SVI(guide="mean-field", steps=150, lr=0.02, batch_size=16, num_draws=20, **c),
    "svi-dropout": lambda **c: bz.SVI(guide="dropout", steps=150, lr=0.02, batch_size=16, num_draws=20, **c),
    "sghmc": lambda **c: bz.SGMCMC(kind="sghmc", burn_in=120, num_samples=20, thinning=2, **c),
    "ensemble": lambda **c: bz.Ensemble(members=3, steps=150, batch_size=16, **c),
    "swag": lambda **c: bz.SWAG(steps=200, snapshots=20, collect_every=5, batch_size=16, **c),
    "chees-torch": lambda **c: bz.ChEES(num_chains=4, num_warmup=40, num_samples=20, backend="torch", **c),
    # a chain is one program: a stop loses the chains under way, and the rest are kept. Not jit-compiled:
    # a KeyboardInterrupt inside torch.jit.trace breaks the tracer for the rest of the process (torch's state)
    # one chain after another: with chains in parallel processes, the last ones could all finish (and the
    # checkpoint go) before a stop timed from the first save landed, on any thread count
    "nuts-torch": lambda **c: bz.NUTS(
        num_chains=4,
        num_warmup=20,
        num_samples=20,
        max_tree_depth=4,
        backend="torch",
        jit_compile=False,
        chain_method="sequential",
        **c,
    ),
}
# in the slow lane: the SG-MCMC kinds that share sghmc's loop, SVI's other guides, and XLA, which compiles
# its program again in every run (about a second each)
SLOW = {
    # SVI's loop and checkpoint whatever the guide: mean-field and dropout (local noise) stand for them
    "svi-matrix-normal": lambda **c: bz.SVI(guide="matrix-normal", steps=150, lr=0.02, num_draws=20, **c),
    "svi-flow": lambda **c: bz.SVI(guide="flow", steps=100, lr=0.01, num_draws=20, **c),
    "sgld": lambda **c: bz.SGMCMC(kind="sgld", burn_in=120, num_samples=20, thinning=2, batch_size=16, **c),
    "cyclical": lambda **c: bz.SGMCMC(kind="cyclical", burn_in=120, num_samples=20, thinning=2, cycles=2, **c),
    "chees-jax": lambda **c: bz.ChEES(num_chains=4, num_warmup=60, num_samples=40, backend="jax", **c),
    "nuts-jax": lambda **c: bz.NUTS(num_chains=8, num_warmup=40, num_samples=40, backend="jax", **c),
}
# no checkpoint_every: a checkpoint per finished chain; a stop's delay after it, as a share of a run's time
EVERY = {"nuts-torch": 0.02, "nuts-jax": 0.1}


@pytest.mark.parametrize("name", [*METHODS, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW)])
def test_tens_of_random_stops_resume_to_the_uninterrupted_result(name, tmp_path):
    make = (METHODS | SLOW)[name]
    _fit(make(seed=2, progress=False))  # warm: the timings below are a steady run's
    # the faster of two runs: a spike of load elsewhere lengthens a run, and stops timed by it land too late
    runs = [_fit(make(seed=2, progress=False)) for _ in range(2)]
    full, seconds, setup = runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs)
    checkpoint, rng = tmp_path / "checkpoint.pt", random.Random(name)
    if name in EVERY:  # a checkpoint per finished chain: each run stopped at a random moment after it saved one
        method = make(seed=2, progress=False, checkpoint=checkpoint)
        resumed, stopped, kept = _with_stops(
            lambda: _fit(method)[0], lambda: rng.uniform(0, seconds * EVERY[name]), 10, checkpoint, after_saving=True
        )
        assert stopped >= 1 and kept == stopped, (stopped, kept)  # as many stops as the chains allow
    else:  # one in five stops during the setup, the rest while it steps, each allowed a share of the work
        share = 0.8 * (seconds - setup) / STOPS  # stops over the first ~40% of the work: most land before the end

        def delay():
            return rng.uniform(0.0, setup) if rng.random() < 0.2 else setup + rng.uniform(0.0, share)

        method = make(seed=2, progress=False, checkpoint=checkpoint, checkpoint_every=7)
        resumed, stopped, _ = _with_stops(lambda: _fit(method)[0], delay, STOPS, checkpoint)
        assert stopped >= STOPS // 4, f"only {stopped} of {STOPS} stops landed before the fit ended"
    _assert_equal(resumed, full)


def test_a_wide_table_under_quiet_is_refused_in_one_line_not_fitted_in_silence(tmp_path, capsys, monkeypatch):
    """A header of 20,000 columns over 12 rows, --quiet: no progress bar, so the projection speaks. (The
    grace period is 0 s here, a minute by default.)"""
    from bnn_zoo.cli import main
    from bnn_zoo.inference import budget

    monkeypatch.setattr(budget, "GRACE_S", 0.0)
    table = tmp_path / "wide.csv"
    columns = 20_000
    table.write_text("\n".join([",".join(f"c{i}" for i in range(columns))] + [",".join(["1.5"] * columns)] * 12))
    argv = ["fit", "--data", "csv", "--data.path", str(table), "--inference.max_hours", "1e-6", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bnn-zoo: error: SVI would take about") and err.count("\n") == 1, err


def test_ais_stopped_by_ctrl_c_resumes_to_the_uninterrupted_estimate(tmp_path, monkeypatch):
    """AIS through the one loop (bnn_zoo.inference.driver): a real SIGINT in the middle of a temperature is
    held to its end, the checkpoint holds that temperature, and the run again ends with the same estimate."""
    from bnn_zoo.evaluation import evidence

    x, y = _data()
    model = bz.BNN(bz.models.MLP(2, [4], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.3))
    options = dict(num_steps=60, num_particles=4, num_runs=2, seed=1, progress=False)
    full = evidence.ais(model, x, y, **options)
    move, calls = evidence._hmc_move, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 40:  # inside the 40th temperature: held to its end, then raised
            os.kill(os.getpid(), signal.SIGINT)
        return move(*args)

    checkpoint = tmp_path / "ais.pt"
    monkeypatch.setattr(evidence, "_hmc_move", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evidence.ais(model, x, y, checkpoint=checkpoint, **options)
    assert checkpoint.exists() and torch.load(checkpoint, weights_only=True)["step"] == 40
    monkeypatch.setattr(evidence, "_hmc_move", move)
    assert evidence.ais(model, x, y, checkpoint=checkpoint, **options) == full
    assert not checkpoint.exists()


def test_a_stop_inside_a_plates_entry_leaves_pyro_usable(monkeypatch):
    """Ctrl-C between a plate's dimension allocation and its handler's push (its __exit__ never runs)
    must not leave the plate allocated: the next fit in the process would fail with "duplicate plate"."""
    from pyro.poutine import runtime

    x, y = _data()
    allocate = runtime._DIM_ALLOCATOR.allocate
    before = list(runtime._DIM_ALLOCATOR._stack), list(runtime._PYRO_STACK)  # another test may have left some

    def interrupted(name, dim):
        allocate(name, dim)  # allocated, then the signal lands
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime._DIM_ALLOCATOR, "allocate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nuts = bz.NUTS(num_warmup=2, num_samples=2, num_chains=1, backend="torch", progress=False)
        bz.fit(bz.BNN(bz.models.MLP(2, [4])), x, y, nuts)
    monkeypatch.undo()
    assert (runtime._DIM_ALLOCATOR._stack, runtime._PYRO_STACK) == before  # "data" is free again
