"""The JAX backend of NUTS and ChEES (bnn_zoo.inference.xla): the traced log density equals torch's,
its samplers match the exact posterior of Bayesian linear regression, and what cannot be traced falls
back to torch with one warning; many cells in one program equal each cell alone. Skipped beside a torch
the XLA backend does not run with (xla.TORCHAX_TORCH)."""

import dataclasses
import json
import os
import signal
import warnings

import pytest
import torch
from conftest import assert_matches_exact_posterior_within_4_mcse

import bnn_zoo as bz
from bnn_zoo import arviz_compat
from bnn_zoo.inference import budget, xla
from bnn_zoo.io import atomic_torch_save, safe_torch_load

if not xla.available():
    why = xla.unsupported_torch() or "jax is missing"
    pytest.skip(f"the XLA backend cannot run here: {why}", allow_module_level=True)


class DataDependent(torch.nn.Module):
    """A network that reads a tensor's value in Python: fine in eager torch, untraceable under jit."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.layer = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.layer(x) / float(x.abs().max())


def _starts(model, chains=2):
    return bz.inference.potential.chain_starts(model, None, chains, 0, torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "net, likelihood, x, y",
    [
        (bz.models.MLP(3, [8], 1), bz.likelihoods.Gaussian.learned(), torch.randn(20, 3), torch.randn(20, 1)),
        (
            bz.models.MLP(3, [8, 8], 4, activation="relu"),
            bz.likelihoods.Categorical(),
            torch.randn(20, 3),
            torch.randint(0, 4, (20,)),
        ),
        # backend="auto" never traces a convolutional network (backends.json): the CNN's trace, slow lane
        pytest.param(
            bz.models.LeNet(),
            bz.likelihoods.Categorical(),
            torch.rand(12, 64),
            torch.randint(0, 10, (12,)),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["mlp-learned-noise", "mlp-classifier", "cnn"],
)
def test_traced_log_density_and_gradient_equal_torchs(net, likelihood, x, y):
    """At several points, not only the start that the run-time check uses."""
    import jax
    import jax.numpy as jnp

    model = bz.BNN(net, bz.priors.FanInNormal(), likelihood)
    target = xla.JaxTarget(model, x, y)
    q = target.start(_starts(model, 3)) + 0.3 * torch.randn(
        3, sum(target.sizes), generator=torch.Generator().manual_seed(1)
    )
    value_and_grad = jax.jit(jax.value_and_grad(target.logdensity))
    for point in q:
        target.check(point)
        leaf = point.clone().requires_grad_(True)
        value = target.torch_target(target.unflatten(leaf), (x, y))[0]
        (grad,) = torch.autograd.grad(value, leaf)
        jv, jg = value_and_grad(jnp.asarray(point.numpy()))
        assert float(jv) == pytest.approx(float(value), rel=1e-5)
        assert torch.allclose(
            torch.from_numpy(jax.device_get(jg).copy()), grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max())
        )


def test_jax_nuts_matches_the_exact_posterior(blr_model, blr_data, blr_exact):
    fit = bz.fit(
        blr_model,
        *blr_data,
        bz.NUTS(num_warmup=300, num_samples=1000, num_chains=2, seed=0, progress=False, backend="jax"),
        standardize=False,
    )
    assert fit.settings["backend"] == "jax"
    assert_matches_exact_posterior_within_4_mcse(fit, blr_exact)
    stats = fit.sample_stats
    assert stats["diverging"].shape == (2, 1000) and stats["diverging"].dtype == torch.bool
    assert torch.all(2 ** (stats["tree_depth"] - 1) <= stats["n_steps"]) and torch.all(
        stats["n_steps"] < 2 ** stats["tree_depth"]
    )
    assert len(torch.unique(stats["step_size"][0])) == 1  # adapted in warm-up, then fixed
    assert {"posterior", "sample_stats", "log_likelihood"} <= set(arviz_compat.group_names(fit.to_inference_data()))


def test_jax_chees_matches_the_exact_posterior(blr_model, blr_data, blr_exact, tmp_path):
    fit = bz.fit(
        blr_model,
        *blr_data,
        bz.ChEES(num_chains=16, num_warmup=150, num_samples=200, seed=0, progress=False, backend="jax"),
        standardize=False,
    )
    assert fit.settings["backend"] == "jax" and fit.sample_stats["n_steps"].shape == (16, 200)
    assert_matches_exact_posterior_within_4_mcse(fit, blr_exact)
    fit.save(tmp_path / "run")
    again = bz.load(tmp_path / "run")
    x = blr_data[0]
    assert torch.equal(again.predict(x).f, fit.predict(x).f)


# the resume test below ends equal to a fresh run of the same seed, warm-up included: a repeat, slow lane
@pytest.mark.slow
def test_the_same_seed_gives_the_same_draws(blr_model, blr_data):
    method = bz.ChEES(num_chains=4, num_warmup=20, num_samples=10, seed=3, progress=False, backend="jax")
    first, second = (bz.fit(blr_model, *blr_data, method, standardize=False) for _ in range(2))
    assert all(torch.equal(first.samples[k], second.samples[k]) for k in first.samples)


def _signal_at(monkeypatch, iteration: int, signum=signal.SIGINT):
    """The run sends itself ``signum`` when the compiled loop reports ``iteration`` (as Ctrl-C or
    ``kill`` would, while XLA holds the main thread); how far the loop then ran is recorded."""
    reached, sent, progress = [], [], xla.Watch._progress

    def signal_then_progress(self, done):
        reached.append(done)
        if done >= iteration and not sent:  # once: two devices' callbacks race, so the sum may skip it
            sent.append(done)
            os.kill(os.getpid(), signum)
        progress(self, done)

    monkeypatch.setattr(xla.Watch, "_progress", signal_then_progress)
    return reached


class Terminated(KeyboardInterrupt):
    """What the command line's SIGTERM handler raises."""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_jax_nuts_inside_the_compiled_loop(blr_model, blr_data, monkeypatch, signum):
    handler = signal.default_int_handler if signum == signal.SIGINT else _raise_terminated
    previous = signal.signal(signum, handler)
    try:
        reached = _signal_at(monkeypatch, 100, signum)
        method = bz.NUTS(num_warmup=2000, num_samples=2000, num_chains=2, progress=False, backend="jax")
        with pytest.raises(Terminated if signum == signal.SIGTERM else KeyboardInterrupt):
            bz.fit(blr_model, *blr_data, method, standardize=False)
    finally:
        signal.signal(signum, previous)
    # the kernel may hand the signal to the waiting main thread, whose C handler writes the pipe a few
    # milliseconds later: here up to 100 iterations of this small model (measured), not the chain's 4,000
    assert reached[-1] <= 1000


STOPPED_ON_TWO_DEVICES = """
import os, signal, time, torch, jax
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's children start with it ignored
jax.config.update("jax_num_cpu_devices", 2)
import bnn_zoo as bz
from bnn_zoo.inference import xla
progress, sent = xla.Watch._progress, []
def signal_at_100(self, done):  # the two devices' callbacks race: the sum may pass 100 without equalling it
    if done >= 100 and not sent:
        sent.append(done)
        os.kill(os.getpid(), signal.SIGINT)
    progress(self, done)
xla.Watch._progress = signal_at_100
x = torch.randn(30, 3)
model = bz.BNN(bz.models.MLP(3, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
method = bz.NUTS(num_warmup=10**9, num_samples=10, num_chains=2, progress=False, backend="jax", max_hours=None)
try:  # two chains, one per device, each hours long
    bz.fit(model, x, x.sum(1), method)
except KeyboardInterrupt:
    print("stopped")
"""


def test_a_run_stopped_on_two_devices_ends_both_and_exits_cleanly():
    """Ctrl-C reaches the program of one device; the other's ends at its next callback, so the process
    exits at once, with no error of JAX's at exit (it would wait on the other program, or tear XLA
    down under it)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STOPPED_ON_TWO_DEVICES], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr
    for trace in ("Traceback", "Exception ignored", "terminate called"):
        assert trace not in done.stderr, done.stderr


def test_a_callback_after_the_watch_has_ended_reads_no_closed_pipe():
    """XLA may call back after the watch has closed its signal pipe: that call reads no closed descriptor
    and stops nothing."""
    watch = xla.Watch("NUTS", 10, None, progress=False)
    with watch.running():
        assert not watch._signalled()
    watch._tick(5)
    assert watch.stop is None


def _raise_terminated(signum, frame):
    raise Terminated


def test_jax_chees_resumes_its_checkpoint_and_ends_as_an_uninterrupted_run(
    blr_model, blr_data, monkeypatch, tmp_path, capsys
):
    def method(**kw):
        return bz.ChEES(num_chains=4, num_warmup=30, num_samples=40, seed=1, progress=False, backend="jax", **kw)

    whole = bz.fit(blr_model, *blr_data, method(), standardize=False)
    checkpoint = tmp_path / "chees.pt"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _signal_at(monkeypatch, 30 + 25)  # in the third chunk of 10 kept draws
        with pytest.raises(KeyboardInterrupt):
            bz.fit(blr_model, *blr_data, method(checkpoint=checkpoint, checkpoint_every=10), standardize=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert safe_torch_load(checkpoint)["iteration"] == 30 + 20
    assert f"interrupted: checkpoint at iteration 50 of 70 saved to {checkpoint}" in capsys.readouterr().out
    monkeypatch.undo()
    resumed = bz.fit(blr_model, *blr_data, method(checkpoint=checkpoint, checkpoint_every=10), standardize=False)
    assert not checkpoint.exists()
    assert all(torch.equal(resumed.samples[k], whole.samples[k]) for k in whole.samples)
    assert all(torch.equal(resumed.sample_stats[k], whole.sample_stats[k]) for k in whole.sample_stats)
    with pytest.raises(bz.BnnZooError, match="belongs to a different fit"):
        atomic_torch_save({"identity": "another"}, checkpoint)
        bz.fit(blr_model, *blr_data, method(checkpoint=checkpoint), standardize=False)


def test_an_untraceable_network_falls_back_to_torch_with_one_warning(blr_data):
    model = bz.BNN(DataDependent(3, 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    with pytest.warns(
        UserWarning, match=r"NUTS backend='jax' falls back to torch: the log density could not be traced to JAX"
    ) as caught:
        fit = bz.fit(
            model,
            *blr_data,
            bz.NUTS(num_warmup=20, num_samples=20, num_chains=1, progress=False, backend="jax"),
            standardize=False,
        )
    assert len([w for w in caught if "falls back" in str(w.message)]) == 1
    assert fit.settings["backend"] == "torch" and fit.samples["layer.weight"].shape == (1, 20, 1, 3)


def test_a_mismatch_at_the_start_falls_back_to_torch(blr_model, blr_data, monkeypatch):
    trace = xla.JaxTarget._trace
    monkeypatch.setattr(
        xla.JaxTarget, "_trace", lambda self, *args: (lambda f: lambda q, *data: f(q, *data) + 1.0)(trace(self, *args))
    )
    method = bz.ChEES(num_chains=2, num_warmup=5, num_samples=5, progress=False, backend="jax")
    with pytest.warns(
        UserWarning,
        match=r"ChEES backend='jax' falls back to torch: the traced log density differs from torch's at the start",
    ):
        fit = bz.fit(blr_model, *blr_data, method, standardize=False)
    assert fit.settings["backend"] == "torch"


def test_auto_takes_jax_except_where_the_traced_gradient_is_slower(blr_model):
    """benchmarks/backends.py: the MLP's traced gradient is cheaper than eager torch's, the CNN's and LSTMs' not."""
    assert xla.resolve_backend("auto", blr_model) == "jax"
    lstm = bz.BNN(bz.models.TextRNN(20, 4, 4, "tied"), likelihood=bz.likelihoods.Categorical())
    cnn = bz.BNN(bz.models.LeNet(), likelihood=bz.likelihoods.Categorical())
    assert xla.resolve_backend("auto", lstm) == xla.resolve_backend("auto", cnn) == "torch"
    assert xla.resolve_backend("jax", lstm) == "jax"  # asked for: tried, and checked


def test_torch_optimisers_step_after_torchax_has_loaded():
    """torchax names its "jax" device torch's accelerator; torch 2.15's Adam asked it for a stream and
    failed ("not linked with support for jax devices"). Once torchax is loaded, no accelerator is one."""
    xla.load_torchax()
    assert torch.accelerator.current_accelerator(check_available=True) is None or torch.cuda.is_available()
    weight = torch.nn.Parameter(torch.zeros(3))
    optimiser = torch.optim.Adam([weight], lr=0.1)
    weight.sum().backward()
    optimiser.step()
    assert torch.allclose(weight, torch.full((3,), -0.1))


def test_bad_backend_settings_are_one_clear_error(monkeypatch):
    with pytest.raises(bz.BnnZooError, match="NUTS backend must be one of 'auto', 'torch', 'jax', got 'xla'"):
        bz.NUTS(backend="xla")
    with pytest.raises(bz.BnnZooError, match="mass_matrix='within' exists only with backend='torch'"):
        bz.ChEES(backend="jax", mass_matrix="within")
    monkeypatch.setattr(xla.environment, "installed", lambda: False)
    with pytest.raises(bz.BnnZooError, match=r"needs jax, numpyro, blackjax, optax and torchax.*reinstall bnn-zoo"):
        bz.ChEES(backend="jax")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xla.resolve_backend("auto", bz.BNN(bz.models.MLP(1, [2], 1))) == "torch"


def _cells(rows=(30, 17)):
    """Training sets of one regression with different row counts (padding in a batch)."""
    out = []
    for k, n in enumerate(rows):
        g = torch.Generator().manual_seed(k)
        x = torch.randn(n, 2, generator=g)
        out.append((x, (torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(n, 1, generator=g))))
    return out


def _short_jobs(sampler: str, cells: list, chees_chains: int) -> list:
    """A few iterations of NUTS or ChEES on XLA per cell, one seed per cell, as the sweep batches them."""
    model = bz.BNN(bz.models.MLP(2, [8], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    if sampler == "nuts":
        method = bz.NUTS(num_warmup=3, num_samples=3, num_chains=3, max_tree_depth=6, backend="jax", progress=False)
    else:
        method = bz.ChEES(
            num_warmup=3, num_samples=3, num_chains=chees_chains, max_leapfrog=20, backend="jax", progress=False
        )
    return [
        bz.inference.lockstep.Job(model, x, y, dataclasses.replace(method, seed=seed), standardize=False)
        for seed, (x, y) in enumerate(cells)  # as given: the tests compare with method.run on the same data
    ]


def test_a_padded_cell_has_its_own_log_density():
    """The mask: a cell padded to a longer one's rows has the log density of its own rows, at many points."""
    import jax
    import jax.numpy as jnp

    model = bz.BNN(bz.models.MLP(2, [8], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    cells = _cells()
    target = xla.JaxTarget(model, *cells[1])
    x, y, mask = xla.padded(cells)
    q = jnp.asarray(target.start(_starts(model, 5)).numpy())
    q = q + 0.3 * jax.random.normal(jax.random.PRNGKey(0), q.shape)
    alone = jax.vmap(target.logdensity)(q)
    padded = jax.vmap(lambda p: target.data_logdensity(p, x[1], y[1], mask[1]))(q)
    assert float(mask[1].sum()) == 17 and x.shape[1] == 30
    assert jnp.allclose(alone, padded, rtol=1e-6), (alone, padded)


@pytest.mark.filterwarnings("ignore:this .* fit collapsed")  # a few iterations: only the draws' equality counts
@pytest.mark.parametrize(
    "lockstep", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["one-after-another", "lockstep"]
)
# ChEES's cells share NUTS's masked log density (test_a_padded_cell_has_its_own_log_density): slow lane
@pytest.mark.parametrize("sampler", ["nuts", pytest.param("chees", marks=pytest.mark.slow)])
def test_cells_in_one_program_equal_each_cell_run_alone(sampler, lockstep, monkeypatch):
    """Same keys, same kernel, the cell's own rows: draws equal to float rounding over a short run (over
    hundreds of iterations rounding differences grow, as between any two machines, so the two runs then
    agree in distribution only). Both layouts: the CPU's, and a GPU's lockstep run here on the CPU (slow
    lane: the CPU never runs it)."""
    monkeypatch.setattr(xla.devices, "in_lockstep", lambda target: lockstep)
    jobs = _short_jobs(sampler, _cells(), chees_chains=4)
    together = bz.inference.lockstep.fit_lockstep(jobs)
    for job, posterior in zip(jobs, together):
        alone = job.method.run(job.model, job.x, job.y)
        assert posterior.info["cells_in_program"] == 2 and posterior.settings == alone.settings
        for site, draws in alone.samples.items():
            torch.testing.assert_close(posterior.samples[site], draws, rtol=1e-4, atol=1e-4)
        for stat in ("n_steps", "diverging"):
            assert torch.equal(posterior.sample_stats[stat], alone.sample_stats[stat])


@pytest.mark.filterwarnings("ignore:this .* fit collapsed")
# one program per item whichever the sampler: NUTS's chains here, ChEES's cells in the slow lane
@pytest.mark.parametrize("sampler", ["nuts", pytest.param("chees", marks=pytest.mark.slow)])
def test_draws_do_not_depend_on_how_many_cores_run_them(sampler, monkeypatch):
    """Chains (NUTS) and cells (ChEES) split over the two CPU devices conftest gives JAX, the last
    device's share filled with a copy, equal the same run on one device to float rounding: each item runs
    the same program, compiled for one device or for two."""
    import jax

    jobs = _short_jobs(sampler, _cells((30, 17, 24)), chees_chains=2)
    assert len(jax.devices("cpu")) == 2
    two = bz.inference.lockstep.fit_lockstep(jobs)
    monkeypatch.setattr(xla.devices, "cpu_lanes", lambda target, items: 1)
    one = bz.inference.lockstep.fit_lockstep(jobs)
    for a, b in zip(two, one, strict=True):
        for site, draws in a.samples.items():
            torch.testing.assert_close(draws, b.samples[site], rtol=1e-4, atol=1e-4)
        assert torch.equal(a.sample_stats["n_steps"], b.sample_stats["n_steps"])


@pytest.mark.filterwarnings("ignore:this .* fit collapsed")
# the batch's checkpoint is the same for both samplers: ChEES's cells here, NUTS's in the slow lane
@pytest.mark.parametrize("sampler", [pytest.param("nuts", marks=pytest.mark.slow), "chees"])
def test_a_killed_batch_of_cells_resumes_with_its_unfinished_cells(sampler, tmp_path, monkeypatch):
    """Each cell's draws are saved as it finishes; killed after the first save, the batch runs again only
    the cells not saved, and every cell's draws equal the uninterrupted batch's to float rounding."""
    from bnn_zoo.inference import driver, lockstep

    jobs = _short_jobs(sampler, _cells((30, 17, 24)), chees_chains=2)
    whole = lockstep.fit_lockstep(jobs)
    path, save = tmp_path / "batch.pt", driver.atomic_torch_save

    def saved_then_killed(obj, where):
        save(obj, where)
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "atomic_torch_save", saved_then_killed)
    with pytest.raises(KeyboardInterrupt):
        lockstep.fit_lockstep(jobs, checkpoint=path)
    finished = [k for k, *_ in safe_torch_load(path)["cells"]]
    assert finished == [0]  # the first save: NUTS's after two rounds of two chains, ChEES's after one of two cells
    monkeypatch.setattr(driver, "atomic_torch_save", save)
    ran, name = [], f"run_{sampler}_cells"
    run = getattr(xla, name)
    monkeypatch.setattr(xla, name, lambda target, data, *rest: ran.append(len(data)) or run(target, data, *rest))
    resumed = lockstep.fit_lockstep(jobs, checkpoint=path)
    assert ran == [2]
    for a, b in zip(whole, resumed, strict=True):
        for site, draws in a.samples.items():
            torch.testing.assert_close(b.samples[site], draws, rtol=1e-4, atol=1e-4)
        assert torch.equal(a.sample_stats["n_steps"], b.sample_stats["n_steps"])
    with pytest.raises(bz.BnnZooError, match="belongs to a different fit"):
        lockstep.fit_lockstep(jobs[:2], checkpoint=path)


@pytest.mark.filterwarnings("ignore:this .* fit collapsed")
def test_reference_command_runs_every_split_in_one_program(tmp_path, capsys):
    """Each split's folder, verdict and posterior, the posterior equal (over a short run, to float rounding)
    to the same cell fitted alone from its config.yaml: targets shaped as bz.fit shapes them, seeds as alone."""
    from test_bad_input import _uci_folder

    from bnn_zoo.cli import main

    _uci_folder(tmp_path / "tiny", rows=40)
    (tmp_path / "tiny" / "index_train_1.txt").write_text("\n".join(map(str, range(10, 40))) + "\n")  # 30 rows, not 36
    (tmp_path / "tiny" / "index_test_1.txt").write_text("\n".join(map(str, range(10))) + "\n")
    argv = ["reference", "--data", str(tmp_path / "tiny"), "--num-chains", "4", "--num-warmup", "3"]
    assert main([*argv, "--num-samples", "4", "--out", str(tmp_path / "out"), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2 cells run, 0 already done, 0 failed" in printed
    rows = (tmp_path / "out" / "references.csv").read_text().splitlines()
    assert rows[0].startswith("dataset,split,reference_converged") and len(rows) == 3
    cells = sorted((tmp_path / "out" / "tiny" / "cells").iterdir())
    for cell in cells:
        metrics = json.loads((cell / "metrics.json").read_text())
        assert metrics["cells_in_program"] == 2 and metrics["settings"]["backend"] == "jax"
        assert metrics["reference_converged"] is False and "bulk ESS of f" in metrics["reference_note"]
        assert (cell / "posterior.nc").is_file() and metrics["settings"]["num_chains"] == 4
    padded = next(c for c in cells if json.loads((c / "metrics.json").read_text())["n_train"] == 30)
    assert main(["fit", "--config", str(padded / "config.yaml"), "--out", str(tmp_path / "alone"), "--quiet"]) == 0
    together, alone = bz.load(padded), bz.load(tmp_path / "alone")
    assert together.y.shape == alone.y.shape == (30, 1)
    for site, draws in alone.samples.items():
        torch.testing.assert_close(together.samples[site], draws, rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore:this .* fit collapsed")
def test_a_reference_stopped_by_its_time_limit_keeps_its_finished_splits(tmp_path, monkeypatch, capsys):
    """A batch stopped by --max-hours keeps the splits it finished; the command says how to go on, and run
    again with another limit (the same sweep: the limit is not part of a cell) samples only the rest."""
    from test_bad_input import _uci_folder

    from bnn_zoo.cli import main
    from bnn_zoo.inference import driver

    _uci_folder(tmp_path / "tiny", rows=40)
    (tmp_path / "tiny" / "index_train_1.txt").write_text("\n".join(map(str, range(10, 40))) + "\n")
    (tmp_path / "tiny" / "index_test_1.txt").write_text("\n".join(map(str, range(10))) + "\n")
    argv = ["reference", "--data", str(tmp_path / "tiny"), "--num-chains", "4", "--num-warmup", "3"]
    argv += ["--num-samples", "4", "--out", str(tmp_path / "out"), "--quiet"]
    save = driver.atomic_torch_save

    def saved_then_stopped(obj, where):
        save(obj, where)
        raise budget.TimeLimitExceeded("ChEES x2 cells would take about 3 hours, more than max_hours=0.5")

    monkeypatch.setattr(driver, "atomic_torch_save", saved_then_stopped)
    assert main([*argv, "--max-hours", "0.5"]) == 1
    printed = capsys.readouterr().out
    assert "0 cells run, 0 already done, 2 failed" in printed and "higher --max-hours (or none)" in printed
    assert len(list((tmp_path / "out" / "tiny" / "lockstep").glob("*.pt"))) == 1  # the first split's draws
    monkeypatch.setattr(driver, "atomic_torch_save", save)
    ran, run = [], xla.run_chees_cells
    monkeypatch.setattr(
        xla, "run_chees_cells", lambda target, data, *rest: ran.append(len(data)) or run(target, data, *rest)
    )
    assert main([*argv, "--max-hours", "none"]) == 0
    assert ran == [1] and "2 cells run, 0 already done, 0 failed" in capsys.readouterr().out
    assert len((tmp_path / "out" / "references.csv").read_text().splitlines()) == 3


class _Built(Exception):
    pass


@pytest.mark.parametrize("sampler", ["nuts", "chees"])
def test_a_batch_holds_each_cell_to_its_max_hours(sampler, monkeypatch):
    """In a batch max_hours bounds each cell's own time, as when it runs alone: three cells on the CPU's two
    devices take two rounds (ChEES: a cell per core; NUTS: 9 chains where a cell alone takes 2 rounds of its
    3), so the batch may take two cells' limits. A run that projects past that stops; one short of it runs."""
    from test_chees import _replay

    made = []

    def built(*args, **kwargs):
        made.append(kwargs.get("turns"))
        raise _Built

    monkeypatch.setattr(xla.supervision, "TimeLimit", built)
    with pytest.raises(_Built):
        bz.inference.lockstep.fit_lockstep(_short_jobs(sampler, _cells((30, 17, 24)), chees_chains=2))
    assert made == [2]
    hours = [3600 / 1000] * 1000  # an hour in all
    assert _replay({"max_hours": 0.55, "turns": 2}, hours, monkeypatch) is None
    assert _replay({"max_hours": 0.45, "turns": 2}, hours, monkeypatch) is not None
