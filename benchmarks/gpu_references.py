"""The zoo's reference posteriors on one GPU: every split of every UCI folder under --uci by
`bnn-zoo reference --device cuda` (each dataset's splits as one XLA program), then the digits CNN by
ChEES on XLA, on the GPU. Writes benchmarks/results/NAME.json after each step (the device, the wall
time per dataset, every split's convergence verdict; the CNN's R-hat and ESS of f, sampling and
scoring time), and a copy to $OUT when that is set. Needs the cuda extra (jax's CUDA plugin).

python benchmarks/gpu_references.py --uci ../shared/data/uci    # one command; its time on a GPU is not yet measured
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from results import write

DATASETS = ("yacht", "bostonHousing", "energy", "wine-quality-red")  # the zoo's UCI table, smallest first


def bnn_zoo(*args: str) -> subprocess.Popen:
    """The bnn-zoo command line in a child process (its output in a file beside it)."""
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    child = subprocess.Popen([sys.executable, "-m", "bnn_zoo.cli", *args], stdout=log, stderr=subprocess.STDOUT)
    child.log = log.name
    return child


def finished(child: subprocess.Popen, start: float) -> float:
    """Wait for a child; its wall time (its output's tail printed)."""
    child.wait()
    wall = time.perf_counter() - start
    print(Path(child.log).read_text()[-1500:], flush=True)
    if child.returncode not in (0, 1):  # 1: some cells failed, recorded per cell
        raise SystemExit(f"{' '.join(child.args[2:5])} failed ({child.returncode})")
    return wall


def uci(args, out: Path) -> Iterator[tuple[dict, list[dict]]]:
    """Each dataset's splits by `bnn-zoo reference`, one after another: a row per dataset, and its splits'."""
    for name in args.datasets.split(","):
        settings = ["--sampler", "chees", "--num-chains", str(args.chains)]
        settings += ["--num-warmup", str(args.warmup), "--num-samples", str(args.samples)]
        settings += ["--splits", args.splits] if args.splits else []
        start = time.perf_counter()
        wall = finished(bnn_zoo(
            "reference", "--data", str(Path(args.uci) / name), *settings, "--device", args.device,
            "--workers", str(args.workers), "--out", str(out / name), "--quiet",
        ), start)  # fmt: skip
        with open(out / name / "references.csv") as fh:
            cells = list(csv.DictReader(fh))
        converged = sum(c["reference_converged"] == "True" for c in cells)
        print(f"{name}: {converged} of {len(cells)} splits converged in {wall:.0f} s", flush=True)
        yield {"dataset": name, "cells": len(cells), "converged": converged, "wall_s": round(wall, 1)}, cells


def digits_cnn(args, out: Path) -> subprocess.Popen:
    options = ["--inference", "chees", "--inference.backend", "jax", "--inference.num_chains", str(args.cnn_chains)]
    options += ["--inference.num_warmup", str(args.cnn_warmup), "--inference.num_samples", str(args.cnn_samples)]
    options += ["--inference.max_leapfrog", str(args.cnn_max_leapfrog)]
    return bnn_zoo(
        "fit", "--data", "digits", "--model", "cnn", *options, "--device", args.device,
        "--evaluation.plots", "false", "--out", str(out / "digits-cnn"), "--quiet",
    )  # fmt: skip


def digits_row(out: Path, wall: float) -> dict:
    if not (out / "digits-cnn" / "metrics.json").is_file():
        return {"dataset": "digits-cnn", "wall_s": round(wall, 1), "reference_note": "failed: see the log"}
    metrics = json.loads((out / "digits-cnn" / "metrics.json").read_text())
    keys = ("reference_converged", "max_rhat_test_f", "min_ess_bulk_test_f", "reference_note", "accuracy", "nll")
    sampling = metrics["runtime_s"]
    return {"dataset": "digits-cnn", "wall_s": round(wall, 1), "sampling_s": round(sampling, 1)} | {
        k: metrics.get(k) for k in keys
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uci", required=True, help="a folder holding the UCI folders " + ", ".join(DATASETS))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--splits", help="e.g. 0-3 (default: all)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu tries the script out on a machine without one")
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--samples", type=int, default=250)
    parser.add_argument("--workers", type=int, default=2, help="processes sharing the GPU (their scoring in parallel)")
    parser.add_argument("--cnn-chains", type=int, default=16, help="0: no digits CNN")
    parser.add_argument("--cnn-warmup", type=int, default=200)
    parser.add_argument("--cnn-samples", type=int, default=100)
    parser.add_argument("--cnn-max-leapfrog", type=int, default=64)
    parser.add_argument("--name", default="gpu-references")
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the workers share the GPU's memory
    import torch

    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    command = "python benchmarks/gpu_references.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "name" and v is not None
    )

    def record(name, rows):
        path = write(name, rows, command=command, device=device, torch=torch.__version__)
        if os.environ.get("OUT"):
            shutil.copy(path, os.environ["OUT"])

    with tempfile.TemporaryDirectory() as out:
        out, rows = Path(out), []
        start = time.perf_counter()
        cnn = digits_cnn(args, out) if args.cnn_chains else None  # beside the UCI column: the GPU has room for both
        splits = []
        for row, cells in uci(args, out):
            rows.append(row)
            splits += [{"dataset": row["dataset"]} | c for c in cells]
            record(args.name, rows)
            record(f"{args.name}-splits", splits)
        if cnn is not None:
            record(args.name, rows + [digits_row(out, finished(cnn, start))])


if __name__ == "__main__":
    main()
