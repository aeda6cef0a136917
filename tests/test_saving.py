"""Saved posteriors: save, then load in a new process, and predict exactly what the original did; a
corrupt or foreign folder gives one clear error; folders written by `bnn-zoo fit` load too."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

import bnn_zoo as bz
from bnn_zoo.bnn import last_layer
from bnn_zoo.cli import main

X_NEW = torch.linspace(-3, 3, 11)[:, None]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """SVI (mean-field, learned noise), SVI (flow: random permutations rebuilt from the seed), SVI on a
    last-layer BNN with an AutoGuide class, NUTS and a GP, each saved: {name: (folder, predictions)}."""
    root = tmp_path_factory.mktemp("saved")
    data = bz.data.toy_cubic()
    x, y = data.train
    net = bz.models.MLP(1, [8], 1)
    learned = bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    fits = {
        "svi": bz.fit(learned, x, y, bz.SVI(steps=100, num_draws=50, progress=False)),
        "flow": bz.fit(learned, x, y, bz.SVI(guide="flow", steps=30, num_draws=20, progress=False)),
        "last-layer": bz.fit(
            bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.3), expose=[last_layer(net)]),
            x,
            y,
            bz.SVI(guide=__import__("pyro").infer.autoguide.AutoNormal, steps=50, num_draws=20, progress=False),
        ),
        "nuts": bz.fit(
            bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Gaussian(0.3)),
            x,
            y,
            bz.NUTS(num_warmup=20, num_samples=20, progress=False),
        ),
        "gp": bz.fit(bz.GP("matern52"), x, y, bz.TypeII(steps=30, progress=False)),
    }
    out = {}
    for name, post in fits.items():
        folder = post.save(root / name)
        out[name] = (folder, post.predict(X_NEW).f, post)
    return out


def test_a_loaded_posterior_predicts_exactly_the_same_in_a_new_process(saved, tmp_path):
    folders = {name: str(folder) for name, (folder, _, _) in saved.items()}
    script = (
        "import sys, json, torch, bnn_zoo as bz\nx = torch.linspace(-3, 3, 11)[:, None]\n"
        "folders = json.loads(sys.argv[1])\n"
        "torch.save({k: bz.load(v).predict(x).f for k, v in folders.items()}, sys.argv[2])\n"
    )
    subprocess.run([sys.executable, "-c", script, json.dumps(folders), str(tmp_path / "f.pt")], check=True, timeout=120)
    loaded = torch.load(tmp_path / "f.pt", weights_only=True)
    for name, (_, f, post) in saved.items():
        assert torch.equal(loaded[name], f), name
        assert isinstance(post, bz.PosteriorLike), name  # BNN and GP posteriors state one contract


def test_a_loaded_guide_is_the_fitted_guide(saved):
    for name in ("svi", "flow", "last-layer"):
        folder, _, post = saved[name]
        again = bz.load(folder)
        assert again.settings == post.settings and again.model.fixed.keys() == post.model.fixed.keys()
        # the fitted point estimates
        assert all(torch.equal(again.model.fixed[k], v) for k, v in post.model.fixed.items())
        with torch.random.fork_rng(device_type="cuda"):  # torchax, once imported, renames the default device type
            torch.manual_seed(5)
            fresh = post.predict(X_NEW, num_samples=200).f  # beyond the stored draws: new guide draws
        with torch.random.fork_rng(device_type="cuda"):  # torchax, once imported, renames the default device type
            torch.manual_seed(5)
            assert torch.equal(again.predict(X_NEW, num_samples=200).f, fresh), name
    gp_folder, _, gp = saved["gp"]
    assert bz.load(gp_folder).log_marginal_likelihood() == gp.log_marginal_likelihood()


def test_corrupt_foreign_or_missing_folders_give_one_clear_error(saved, tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    src = saved["svi"][0]
    for name in ("posterior.json", "state.pt"):
        (folder / name).write_bytes((src / name).read_bytes())
    (folder / "state.pt").write_bytes((src / "state.pt").read_bytes()[:200])  # truncated
    cases = {
        folder: "posterior state .* is unreadable",
        tmp_path: "not a saved bnn-zoo posterior",
        tmp_path / "missing": "is not a folder",
    }
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "posterior.json").write_text('{"hello": 1}')
    cases[tmp_path / "foreign"] = "not a bnn-zoo posterior header"
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "posterior.json").write_text("{not json")
    cases[tmp_path / "garbled"] = "unreadable"
    for path, message in cases.items():
        with pytest.raises(bz.BnnZooError, match=message) as err:
            bz.load(path)
        assert "\n" not in str(err.value)


def test_a_user_network_is_passed_back_in_and_checked(tmp_path):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(1, 1)

        def forward(self, x):
            return 2 * self.inner(x)

    x, y = torch.randn(10, 1), torch.randn(10)
    model = bz.BNN(Twice(), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(1.0))
    post = bz.fit(model, x, y, bz.SVI(steps=5, num_draws=5, progress=False))
    post.save(tmp_path / "p")
    with pytest.raises(bz.BnnZooError, match="cannot be rebuilt here .*pass it"):
        bz.load(tmp_path / "p")
    assert torch.equal(bz.load(tmp_path / "p", model=model).predict(x).f, post.predict(x).f)


def test_a_bnn_zoo_fit_result_folder_is_loadable_and_its_writing_is_announced(tmp_path, monkeypatch):
    from bnn_zoo.experiments import run

    said = []
    monkeypatch.setattr(run, "announce", said.append)  # what the heartbeat says while each file is written
    out = tmp_path / "run"
    assert main(["fit", "--inference.steps", "30", "--out", str(out), "--quiet"]) == 0
    files = ["posterior.nc and state.pt", "predictions.nc", "plots", "metrics.json"]
    assert said[-4:] == [f"writing {f} to {out}" for f in files]
    post = bz.load(out)
    data = bz.data.toy_cubic()
    stored = xr.open_dataset(out / "predictions.nc", engine="h5netcdf")
    mean = post.predict(data.x_test).mean[:, 0]  # the folder's units: the data's
    assert torch.allclose(mean, torch.as_tensor(stored["mean"].values), rtol=1e-5)


@pytest.mark.parametrize("major", [0, 1])
def test_a_posterior_saved_under_either_arviz_major_loads_and_predicts_the_same(major):
    """Folders written by tests/data/saved/make.py under ArviZ 0.2x (Python 3.11, torch 2.13) and 1.x
    (Python 3.12, torch 2.15): each predicts what it predicted when saved (float32 forward passes of two
    torch builds: rtol 1e-5), and its posterior.nc reads as the installed ArviZ's object, with the
    log-likelihood the loaded posterior computes."""
    from bnn_zoo import arviz_compat
    from bnn_zoo.io import load_inference_data

    root = Path(__file__).parent / "data" / "saved" / f"arviz-{major}"
    expected = json.loads((root / "predictions.json").read_text())
    assert expected["arviz"].startswith(f"{major}.")
    for name in ("nuts", "svi", "gp"):
        posterior = bz.load(root / name)
        torch.testing.assert_close(posterior.predict(X_NEW).f[:10], torch.tensor(expected[name]), rtol=1e-5, atol=1e-6)
        idata = load_inference_data(root / name / "posterior.nc")
        assert type(idata) is type(posterior.to_inference_data()), name
        log_lik = arviz_compat.group(idata, "log_likelihood")["y"]
        if name != "gp":  # the GP's log-likelihood draws are fresh function draws, not stored ones
            torch.testing.assert_close(
                torch.as_tensor(log_lik.values), posterior.log_likelihood(), rtol=1e-5, atol=1e-5
            )
        assert np.isfinite(arviz_compat.loo(idata).elpd), name
