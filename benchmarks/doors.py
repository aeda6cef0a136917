"""One fit through both doors on a real table: `bnn-zoo fit` on a UCI folder, then `bz.load` of its folder
and `bz.fit` of the same arrays in their own units with the same seed, scored the same way. Writes
benchmarks/results/doors.json: each door's test RMSE, test LL and ELBO, and how far `bz.load(DIR).predict`
is from the folder's own predictions.nc.

python benchmarks/doors.py --data ../shared/data/uci/bostonHousing [--out runs/doors]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pyro
import torch
import xarray as xr
from results import write

import bnn_zoo as bz
from bnn_zoo.cli import main as cli
from bnn_zoo.evaluation import regression_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a UCI folder (split 0)")
    parser.add_argument("--out", default="runs/doors", help="the command line's result folder")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    assert (
        cli(["fit", "--data", "uci", "--data.path", args.data, "--model.hidden", "[50]", "--out", str(out), "--quiet"])
        == 0
    )
    data = bz.data.load_uci(args.data)
    folder = json.loads((out / "metrics.json").read_text())
    with xr.open_dataset(out / "predictions.nc", engine="h5netcdf") as ds:
        saved = torch.as_tensor(ds["mean"].values)
    loaded = float((bz.load(out).predict(data.x_test).mean[:, 0] - saved).abs().max())
    posterior = bz.fit(bz.BNN(bz.models.MLP(data.in_features, [50])), *data.train, bz.SVI(seed=0, progress=False))
    pyro.set_rng_seed(0)  # as the command line scores
    python = regression_metrics(posterior.predict(data.x_test), data.y_test)
    python["elbo"] = posterior.elbo(num_samples=1000)[0]
    keys = ("rmse", "test_log_likelihood", "elbo")
    rows = [
        {"door": "bnn-zoo fit", **{k: folder[k] for k in keys}, "units": folder["units"]},
        {"door": "bz.fit", **{k: python[k] for k in keys}, "units": posterior.units_attrs()["units"]},
        {"door": "bz.load(DIR).predict vs predictions.nc", "max_abs_diff_mean": loaded},
    ]
    print(write("doors", rows, command=f"python benchmarks/doors.py --data {args.data}", data=data.name))


if __name__ == "__main__":
    main()
